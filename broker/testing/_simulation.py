"""A seeded simulation of the broker service, checked against a model of what it promised.

Theory of operation
-------------------
`run_simulation(SimulationConfig(seed=S, steps=N))` drives one `BrokerService` in process,
on one asyncio event loop, with a `random.Random(S)` choosing every operation:

* producers publish keyed single messages, key-based batches (one key per batch, as
  Key_Shared needs), delayed messages (one per entry, as clients send them) and bursts of
  concurrent publishes; on the topics with deduplication they sometimes resend an entry
  they sent before (the same bytes and sequence ids);
* consumers join and leave the four subscriptions of every topic (Exclusive, Shared,
  Failover without failover delay, Key_Shared), grant permits, acknowledge individually,
  by batch index, cumulatively (Exclusive and Failover; on Shared too, where it must be
  ignored), and ask for redelivery (negative acks, redeliver-all);
* the broker restarts: cleanly (service and storage closed, then reopened), killed
  (`Storage.abandon`, what `kill -9` leaves), or by a power loss (the storage runs on a
  `storage.testing.simfs.SimFileSystem`, stopped at a step or at a file operation it picked, whose
  unsynced writes are then dropped, torn or corrupted); a kill or power loss may cut
  publishes and acks short;
* every `drain_every_steps` steps and at the end, every subscription is drained: it gets a
  consumer and permits, and its consumers acknowledge what they hold until everything
  published is acknowledged.

The model knows every entry sent (its messages, and its position once the publish returned
or a delivery showed it), per subscription the acks that returned (and those under way,
which a crash leaves undecided until the cursor is read back), and per consumer the
messages it holds: delivered, not acknowledged, not given back. Invariants:

1. each published message reaches each subscription until acknowledged: a drain ends with
   every published message acknowledged and the broker's backlog at 0;
2. a message whose ack returned is never delivered again, and a delivery's ack set skips
   only acknowledged messages;
3. Shared and Key_Shared: a message is held by one consumer at most and is not delivered to
   it twice without a redelivery; Exclusive and Failover: only the active consumer receives;
4. Key_Shared: a key is never unacknowledged in two consumers at once;
5. per-key order (Key_Shared, Exclusive, Failover): within a window, which every restart
   and drain starts afresh, a message is delivered for the first time only after every
   earlier unacknowledged message with its key; a Key_Shared key leaves the window when it
   is negatively acknowledged (upstream lets a redelivered message be overtaken then);
6. Shared and Key_Shared deliver a delayed message at most one tick early;
7. one producer's publishes return in the order they were sent (a client expects its send
   receipts in order), and a new entry is never answered as a duplicate;
8. after a restart: every entry whose publish returned is in the log with its bytes (unless
   its ledger was trimmed, and only consumed ledgers may be), no entry is stored twice, and
   on deduplicated topics no producer sequence id is stored twice; every cursor
   acknowledges exactly what the model says; the dedup state's last sequence id per
   producer is the highest stored; after a clean restart the cursors and the dedup state
   are exactly as before. Delayed messages stay delayed through restarts (invariant 6).

A violation names the seed, the step, the topic, the subscription and the message id; the
run stops at the step that found the first one.

Determinism: by default the storage runs without background threads (a task on the loop
pumps its journal and takes checkpoints), and the loop runs on virtual time that the
broker also uses as its clock (`_VirtualTimeLoop`), so a run is single-threaded and a seed
replays the same operations and outcomes, delayed deliveries included. With
`storage_threads=True` the storage's own journal and checkpoint threads run, as in the
real broker, on the wall clock: group commits and timers interleave differently on every
run, and the seed only picks the operations.

Power loss: the storage is killed first, then the file system stops and loses its
unsynced writes, so no storage thread sees the stop. Without storage threads every
journal write is synced in the same pump, so a power loss at a step loses little; the
crash points (a file operation picked ahead, which can fall between a write and its sync
or inside a checkpoint) are what tear journals and entry logs.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from magnetar.codec import (
    BROKER_ENTRY_METADATA_BYTES_MAX,
    FRAME_PADDING_BYTES,
    SingleMessage,
    build_batch,
    build_message,
    encode_entry,
    parse_entry,
    pb,
    unpack_messages,
)
from magnetar.storage import (
    FileSystem,
    OsFileSystem,
    Storage,
    StorageClosedError,
    StorageConfig,
    StorageError,
    StorageFailedError,
)
from magnetar.storage.testing.simfs import SimFileSystem

from .._config import BrokerConfig
from .._errors import BrokerError, ConsumerBusyError, PersistenceError
from ..dispatch._consumer import Consumer, Delivery, SubscribeSpec
from ..dispatch._subscription import ACK_CUMULATIVE, ACK_INDIVIDUAL, Subscription
from ..ledger._loader import EntryLoader
from ..ledger._position import Position, int_to_ack_set
from ..topics._dedup import DEDUP_UNKNOWN_MESSAGE
from ..topics._service import BrokerService
from ..topics._topic import PersistentTopic, Producer, ProducerSpec

__all__ = ["SimulationConfig", "SimulationReport", "Violation", "run_simulation"]

log = logging.getLogger(__name__)

T = TypeVar("T")

SUB_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
SINGLE_ACTIVE = ("Exclusive", "Failover")
MULTI_CONSUMER = ("Shared", "Key_Shared")
ORDERED = ("Exclusive", "Failover", "Key_Shared")
KEYS = tuple(f"k{i}" for i in range(6))
CONSUMER_NAMES = ("c0", "c1", "c2")
PRODUCERS_PER_TOPIC = 2
PAYLOAD_PREFIX = b"sim-"
PAYLOAD_PAD = b"." * 24
WHOLE_ENTRY = 1 << 30  # the batch index of a cumulative ack of a whole entry
BATCH_MESSAGES_MAX = 8
BURST_PUBLISHES_MAX = 6
PERMITS_GRANT_MAX = 40
DRAIN_PERMITS = 100_000
SETTLE_YIELDS = 8
DRAIN_POLL_S = 0.002
CHECKPOINT_PUMPS = 64
SIM_ENTRY_BYTES_MAX = 64 * 1024  # the simulated storage's largest entry
LOOP_TICK_S = 0.0001  # virtual time per event-loop iteration
VIOLATIONS_PER_DRAIN_MAX = 4
MAX_UNACKED_LIMITED_TOPIC = 1  # this topic caps unacked messages per consumer
MAX_UNACKED_PER_CONSUMER_LIMIT = 6
CRASH_OPS_AHEAD_MIN = 10  # file operations before an armed crash point (pumped mode)
CRASH_OPS_AHEAD_MAX = 400

# Relative weights of the operations of one step.
OPERATION_WEIGHTS = {
    "publish": 26, "publish_batch": 8, "publish_delayed": 4, "publish_burst": 4,
    "resend": 4, "flow": 12, "ack": 20, "nack": 6, "shared_cumulative": 1, "join": 6,
    "leave": 5, "concurrent": 6, "restart": 2, "maintenance": 2,
}
# What an operation may raise when the storage stopped (anything else is a violation).
OPERATION_ERRORS = (BrokerError, StorageError, OSError, TimeoutError)
# The operations `_op_concurrent` may run at the same time.
CONCURRENT_OPERATIONS = ("publish", "publish_batch", "resend", "flow", "ack", "nack", "join",
                         "leave")
CONCURRENT_OPERATIONS_MAX = 3


# -- configuration and report -------------------------------------------------------------

@dataclass(frozen=True)
class SimulationConfig:
    """What one simulation run does.

    Attributes:
        seed: drives every choice; printed so that a failure can be replayed.
        steps: operations to run (drains come on top).
        topics: persistent topics, each with one subscription of every type; the even ones
            deduplicate, topic 1 caps unacknowledged messages per consumer, and from topic 2
            on the names are partition names (Failover picks by partition index).
        data_dir: where the storage lives; a temporary directory (removed) when None.
        storage_threads: run the storage's background threads instead of pumping its
            journal from the event loop (see the module comment on determinism).
        drain_every_steps: a drain every this many steps.
        delay_ms_max: the longest delivery delay of a delayed message.
        tick_ms: the delayed-delivery tick.
        power_loss_chance: the chance that a storage incarnation runs on a SimFileSystem.
        crash_point_chance: the chance that such an incarnation also picks a file operation
            to stop at (only without storage threads, where operation counts replay).
        op_timeout_s: an operation that takes longer hangs (a violation).
        drain_timeout_s: how long a drain may take after the last delay expired.
        progress: called with a line after each drain and restart (the CLI's --verbose).
    """

    seed: int
    steps: int = 300
    topics: int = 3
    data_dir: str | None = None
    storage_threads: bool = False
    drain_every_steps: int = 75
    delay_ms_max: int = 150
    tick_ms: int = 10
    power_loss_chance: float = 0.5
    crash_point_chance: float = 0.3
    op_timeout_s: float = 30.0
    drain_timeout_s: float = 15.0
    progress: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        assert self.steps >= 0
        assert self.topics >= 2, "topic 0 deduplicates, topic 1 limits unacked messages"
        assert self.drain_every_steps >= 1
        assert self.delay_ms_max >= 1
        assert self.tick_ms >= 1


@dataclass(frozen=True)
class Violation:
    """An invariant the broker broke."""

    seed: int
    step: int
    topic: str
    subscription: str
    message_id: str
    what: str

    def __str__(self) -> str:
        return (f"seed {self.seed} step {self.step}: topic {self.topic} subscription "
                f"{self.subscription} message {self.message_id}: {self.what}")


@dataclass
class SimulationReport:
    """What a run did, and the violations it found (it stops at the first step with any)."""

    seed: int
    steps_planned: int
    steps_run: int = 0
    seconds: float = 0.0
    counts: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        """One paragraph: the counts, then OK or the violations."""
        c = self.counts
        parts = [
            f"{c['entries_published']} entries ({c['messages_published']} messages) "
            f"published, {c['delayed']} delayed, {c['resends']} resends "
            f"({c['duplicates_answered']} answered as duplicates)",
            f"{c['deliveries']} messages delivered, {c['acks']} acks "
            f"({c['batch_index_acks']} batch-index, {c['cumulative_acks']} cumulative), "
            f"{c['nacks']} nacks",
            f"{c['joins']} consumers joined, {c['leaves']} left",
            f"restarts: {c['restarts_clean']} clean, {c['restarts_kill']} kill, "
            f"{c['restarts_power']} power loss ({c['crash_points']} at a crash point), "
            f"{c['uncertain_publishes']} publishes and {c['uncertain_acks']} acks cut short",
            f"{c['drains']} drains",
        ]
        verdict = "OK" if self.ok else f"{len(self.violations)} VIOLATION(S):\n" + "\n".join(
            f"  {v}" for v in self.violations)
        return (f"sim: seed {self.seed}: {self.steps_run}/{self.steps_planned} steps in "
                f"{self.seconds:.1f} s; " + "; ".join(parts) + f"; {verdict}")


def run_simulation(config: SimulationConfig) -> SimulationReport:
    """Run one simulation in a new event loop; see the module comment."""
    started = time.perf_counter()
    with _data_dir(config.data_dir) as directory:
        simulation = _Simulation(config, directory)
        if config.storage_threads:
            factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
        else:
            factory = functools.partial(_VirtualTimeLoop, time.time())
        with asyncio.Runner(loop_factory=factory) as runner:
            report = runner.run(simulation.run())
    report.seconds = time.perf_counter() - started
    return report


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only with the loop: `LOOP_TICK_S` per iteration,
    or straight to the next timer when nothing is ready. The clock reads as epoch
    seconds (it starts at `start_s`), and the simulation gives it to the broker as its
    clock, so delayed delivery falls due at the same iteration on every run. Only for a
    loop that never waits for other threads: it never blocks in `select`."""

    def __init__(self, start_s: float) -> None:
        super().__init__()
        self._virtual_s = start_s

    def time(self) -> float:
        return self._virtual_s

    def _run_once(self) -> None:
        ready: Any = self._ready  # type: ignore[attr-defined]
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if not ready and scheduled:
            self._virtual_s = max(self._virtual_s, scheduled[0].when())
        else:
            self._virtual_s += LOOP_TICK_S
        super()._run_once()  # type: ignore[misc]


@contextlib.contextmanager
def _data_dir(given: str | None) -> Iterator[str]:
    if given is not None:
        os.makedirs(given, exist_ok=True)
        yield given
        return
    path = tempfile.mkdtemp(prefix="magnetar-sim-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- the model ----------------------------------------------------------------------------

@dataclass(eq=False)
class _Message:
    uid: int
    entry: _Entry
    index: int  # the batch index; -1 when the entry is not a batch
    key: str

    @property
    def message_id(self) -> tuple[int, int, int]:
        position = self.entry.position
        assert position is not None
        return position[0], position[1], self.index

    def label(self) -> str:
        position = self.entry.position
        if position is None:
            return f"(uid {self.uid}, not stored)"
        return f"{position[0]}:{position[1]}:{self.index}"


@dataclass(eq=False)
class _Entry:
    topic: _TopicModel
    producer: str
    sequence_id: int
    highest_sequence_id: int
    data: bytes
    metadata: pb.MessageMetadata
    deliver_at: int | None
    messages: list[_Message] = field(default_factory=list)
    position: tuple[int, int] | None = None
    cut_short: bool = False  # an attempt to store it was cut short: stored or not, unknown
    step: int = 0

    @property
    def batched(self) -> bool:
        return self.metadata.HasField("num_messages_in_batch")


@dataclass(eq=False)
class _ConsumerModel:
    sub: _SubModel
    name: str
    consumer: Consumer | None = None
    holding: dict[int, _Message] = field(default_factory=dict)
    keys: Counter[str] = field(default_factory=Counter)

    @property
    def tag(self) -> str:
        """The name and the broker's serial (names repeat)."""
        serial = self.consumer.consumer_serial if self.consumer is not None else "?"
        return f"{self.name}#{serial}"

    def hold(self, message: _Message) -> None:
        assert message.uid not in self.holding
        self.holding[message.uid] = message
        self.keys[message.key] += 1

    def release(self, uid: int) -> _Message | None:
        message = self.holding.pop(uid, None)
        if message is not None:
            self.keys[message.key] -= 1
            if self.keys[message.key] <= 0:
                del self.keys[message.key]
        return message

    def release_all(self) -> list[_Message]:
        released = list(self.holding.values())
        self.holding.clear()
        self.keys.clear()
        return released


@dataclass(eq=False)
class _SubModel:
    topic: _TopicModel
    name: str
    sub_type: str
    acked: set[int] = field(default_factory=set)
    acks_under_way: Counter[int] = field(default_factory=Counter)
    cumulative: tuple[int, int, int] | None = None  # the highest returned cumulative ack
    consumers: dict[int, _ConsumerModel] = field(default_factory=dict)
    active: _ConsumerModel | None = None
    window: set[int] = field(default_factory=set)
    frontier: dict[str, int] = field(default_factory=dict)
    tainted: set[str] = field(default_factory=set)
    # Shared and Key_Shared: negative acks per entry (the redelivery count the broker must
    # send), and the entries whose count a race made unknown.
    redeliveries: Counter[tuple[int, int]] = field(default_factory=Counter)
    redeliveries_unknown: set[tuple[int, int]] = field(default_factory=set)

    def is_acked(self, message: _Message) -> bool:
        if message.uid in self.acked:
            return True
        bound = self.cumulative
        if bound is None or message.entry.position is None:
            return False
        return _within(message.message_id, bound)

    def holders(self, uid: int) -> list[_ConsumerModel]:
        return [c for c in self.consumers.values() if uid in c.holding]

    def release_everywhere(self, uid: int) -> None:
        for consumer in self.consumers.values():
            consumer.release(uid)

    def reset_window(self) -> None:
        self.window.clear()
        self.frontier.clear()
        self.tainted.clear()

    def reset_redeliveries(self) -> None:
        """The broker forgets redelivery counts when the last consumer leaves (not when it
        restarts: the cursor persists them)."""
        self.redeliveries.clear()
        self.redeliveries_unknown.clear()


@dataclass(eq=False)
class _ProducerModel:
    name: str
    next_sequence_id: int = 0
    producer: Producer | None = None
    returned_sequence_id: int = -1  # the highest sequence id whose publish returned


@dataclass(eq=False)
class _TopicModel:
    index: int
    name: str
    dedup: bool
    subs: dict[str, _SubModel] = field(default_factory=dict)
    producers: dict[str, _ProducerModel] = field(default_factory=dict)
    entries: list[_Entry] = field(default_factory=list)
    by_position: dict[tuple[int, int], _Entry] = field(default_factory=dict)
    by_key: dict[str, list[_Message]] = field(default_factory=dict)

    def stored(self) -> list[_Entry]:
        return [e for e in self.entries if e.position is not None]

    def place(self, entry: _Entry, position: tuple[int, int]) -> None:
        """Record where an entry is stored; its messages join the per-key order lists."""
        assert entry.position is None
        assert position not in self.by_position
        entry.position = position
        self.by_position[position] = entry
        if entry.deliver_at is not None:
            return  # delayed messages have keys of their own: no order to check
        for message in entry.messages:
            items = self.by_key.setdefault(message.key, [])
            at = bisect.bisect_left(items, message.message_id, key=lambda m: m.message_id)
            items.insert(at, message)
            for sub in self.subs.values():
                if sub.frontier.get(message.key, 0) > at:
                    sub.frontier[message.key] = at


def _sub_name(sub_type: str) -> str:
    return f"sub-{sub_type.lower().replace('_', '-')}"


def _within(message_id: tuple[int, int, int], bound: tuple[int, int, int]) -> bool:
    """Whether a cumulative ack up to `bound` (ledger, entry, last acknowledged batch index,
    WHOLE_ENTRY for all of it) covers a message."""
    return message_id[:2] < bound[:2] or (message_id[:2] == bound[:2]
                                          and message_id[2] <= bound[2])


def _words_bit(words: list[int], index: int) -> bool:
    word = index // 64
    return word < len(words) and (words[word] >> (index % 64)) & 1 == 1


def _mask_words(size: int, cleared: set[int]) -> list[int]:
    """Ack-set words of a batch of `size` with the `cleared` indexes acknowledged."""
    assert all(0 <= i < size for i in cleared)
    mask = (1 << size) - 1
    for index in cleared:
        mask &= ~(1 << index)
    return int_to_ack_set(mask)


# -- one incarnation of the broker --------------------------------------------------------

class _Node:
    """The storage (and the file system it runs on), the service, and without storage
    threads the task that pumps the journal."""

    def __init__(self, directory: str, storage_config: StorageConfig, fs: FileSystem,
                 broker_config: BrokerConfig, clock: Callable[[], float]):
        self.fs = fs
        self.storage = Storage.open(directory, storage_config, fs=fs)
        # Pumped (replayable) runs load cold reads in later loop callbacks, not in threads.
        loader = None if storage_config.background_threads else EntryLoader(on_loop=True)
        self.service = BrokerService(self.storage, broker_config, clock=clock, loader=loader)
        self.pump_error: BaseException | None = None
        self._pumping = not storage_config.background_threads
        self._pump_task: asyncio.Task[None] | None = None
        if self._pumping:
            self._pump_task = asyncio.ensure_future(self._pump())

    @property
    def failed(self) -> bool:
        """The storage stopped (a crash point, a disk error): only a restart helps."""
        crashed = isinstance(self.fs, SimFileSystem) and self.fs.crashed
        return crashed or self.storage.failed is not None or self.pump_error is not None

    async def _pump(self) -> None:
        pumps = 0
        storage = self.storage
        while self._pumping:
            journal = storage.journal
            try:
                if journal is not None and journal.pending() and storage.pump():
                    pumps += 1
                    if pumps % CHECKPOINT_PUMPS == 0:
                        storage.checkpoint()
            except Exception as error:  # a failed storage stays failed: stop pumping
                self.pump_error = error
                return
            await asyncio.sleep(0)

    def checkpoint(self) -> None:
        """Checkpoint and collect garbage now (pumped mode; the threads do it otherwise)."""
        if self._pump_task is None or self.failed:
            return
        try:
            self.storage.checkpoint()
            self.storage.gc()
        except StorageError as error:
            self.pump_error = error

    async def stop_pumping(self) -> None:
        self._pumping = False
        if self._pump_task is not None:
            await self._pump_task
            self._pump_task = None

    async def close(self) -> None:
        """A clean shutdown: the service, then the storage."""
        await self.service.close()
        await self.stop_pumping()
        self.storage.close()

    async def kill(self) -> None:
        """What `kill -9` leaves: no more I/O from the broker or the storage."""
        _silence_service(self.service)
        await self.stop_pumping()
        self.storage.abandon()


def _silence_service(service: BrokerService) -> None:
    """Stop every dispatcher and background task of a service without any I/O."""
    service.closed = True
    for topic in service.topics.values():
        topic.fenced = True
        if not isinstance(topic, PersistentTopic):
            continue
        for subscription in topic.all_subscriptions():
            subscription.close()
        for task in list(topic._background):
            task.cancel()


# -- the sink the broker delivers to ------------------------------------------------------

class _Sink:
    """One consumer's transport: hands every broker call to the simulation's checks."""

    def __init__(self, simulation: _Simulation, model: _ConsumerModel):
        self._simulation = simulation
        self._model = model

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        self._simulation.guarded(self._simulation.on_deliveries, self._model, deliveries)

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        self._simulation.guarded(self._simulation.on_active_change, self._model, is_active)

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        self._simulation.guarded(self._simulation.on_closed_by_broker, self._model, reason)


# -- the simulation -----------------------------------------------------------------------

class _Simulation:
    def __init__(self, config: SimulationConfig, directory: str):
        self.config = config
        self.directory = directory
        self.rng = random.Random(config.seed)
        self.report = SimulationReport(config.seed, config.steps)
        self.counts = self.report.counts
        self.step = 0
        self.topics: list[_TopicModel] = []
        self.messages: dict[int, _Message] = {}
        self.node: _Node | None = None
        self._next_uid = 0
        self._quiet = False  # errors are expected: the storage stopped, or it is being killed
        self.broker_config = BrokerConfig(
            active_consumer_failover_delay_ms=0,
            managed_ledger_max_entries_per_ledger=20,
            managed_ledger_min_ledger_rollover_time_s=0,
            broker_deduplication_entries_interval=25,
            delayed_delivery_tick_time_ms=config.tick_ms,
            key_shared_unblocking_interval_ms=0,  # a timer would make runs depend on timing
            dispatcher_max_read_batch_size=25,
            # The largest message the small storage below can hold (checked at start).
            max_message_size_bytes=SIM_ENTRY_BYTES_MAX - FRAME_PADDING_BYTES
            - BROKER_ENTRY_METADATA_BYTES_MAX,
        )
        self.storage_config = StorageConfig(
            background_threads=config.storage_threads,
            entry_size_bytes_max=SIM_ENTRY_BYTES_MAX,
            journal_record_bytes_max=128 * 1024,
            journal_prealloc_bytes=64 * 1024,
            journal_segment_bytes_max=512 * 1024,
            entry_log_bytes_max=256 * 1024,
            write_cache_bytes_max=4 * 1024 * 1024,
            lmdb_map_bytes=256 * 1024 * 1024,
        )

    # -- plumbing --------------------------------------------------------------------------

    def clock(self) -> float:
        """Seconds: the loop's virtual clock when pumping, else the wall clock."""
        if self.config.storage_threads:
            return time.time()
        return asyncio.get_running_loop().time()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def service(self) -> BrokerService:
        assert self.node is not None
        return self.node.service

    def violation(self, topic: _TopicModel | None, sub: _SubModel | str | None,
                  message: _Message | str | None, what: str) -> None:
        sub_name = sub.name if isinstance(sub, _SubModel) else (sub or "-")
        label = message.label() if isinstance(message, _Message) else (message or "-")
        found = Violation(self.config.seed, self.step, topic.name if topic else "-",
                          sub_name, label, what)
        log.error("%s", found)
        self.report.violations.append(found)

    def trace(self, sub: _SubModel, what: str) -> None:
        """A debug line per operation and delivery (the CLI's --trace)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("step %d %s/%s: %s", self.step, sub.topic.name, sub.name, what)

    def guarded(self, check: Callable[..., None], *args: Any) -> None:
        """Run a check from a broker callback: a bug in the model must not look like one
        in the broker's dispatcher."""
        try:
            check(*args)
        except Exception as error:
            self.violation(None, None, None, f"simulation check crashed: {error!r}")

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop,
                           context: dict[str, Any]) -> None:
        error = context.get("exception")
        if self._quiet or (self.node is not None and self.node.failed) or \
                isinstance(error, (StorageClosedError, StorageFailedError)):
            return  # a stopped (or an earlier, killed) storage failing what was under way
        source = context.get("task") or context.get("future") or context.get("handle")
        self.violation(None, None, None, f"unhandled error in the event loop: "
                       f"{context.get('message')} {error!r} ({source!r:.300})")

    async def timed(self, work: Awaitable[T]) -> T:
        return await asyncio.wait_for(work, self.config.op_timeout_s)

    def broker_topic(self, topic: _TopicModel) -> PersistentTopic:
        found = self.service.topics.get(f"persistent://public/default/{topic.name}")
        assert isinstance(found, PersistentTopic), topic.name
        return found

    def broker_sub(self, sub: _SubModel) -> Subscription:
        return self.broker_topic(sub.topic).subscriptions[sub.name]

    def _storage_stopped(self) -> bool:
        """Whether the storage stopped (its crash point) and the broker must restart; a
        pump error without a crash is a violation."""
        node = self.node
        assert node is not None
        if not node.failed:
            return False
        self.counts["crash_points"] += 1
        crashed = isinstance(node.fs, SimFileSystem) and node.fs.crashed
        if node.pump_error is not None and not crashed:
            self.violation(None, None, None, f"the storage failed: {node.pump_error!r}")
        return True

    def _expected_failure(self, error: BaseException) -> bool:
        """Whether an operation's error is explained by a stopped storage."""
        return self.node is not None and self.node.failed and isinstance(error,
                                                                         OPERATION_ERRORS)

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> SimulationReport:
        asyncio.get_running_loop().set_exception_handler(self._on_loop_exception)
        try:
            await self._open()
            await self._set_up()
            self._arm_crash_point()
            await self._steps()
            if self.report.ok:
                await self._drain()
        except Exception as error:
            log.exception("simulation stopped")
            self.violation(None, None, None, f"operation failed: {error!r}")
        finally:
            await self._shut_down()
        return self.report

    async def _steps(self) -> None:
        operations = list(OPERATION_WEIGHTS)
        weights = [OPERATION_WEIGHTS[name] for name in operations]
        for step in range(1, self.config.steps + 1):
            self.step = step
            name = self.rng.choices(operations, weights)[0]
            try:
                await getattr(self, f"_op_{name}")()
            except OPERATION_ERRORS as error:
                if not self._expected_failure(error):
                    self.violation(None, None, None, f"{name} failed: {error!r}")
            await self._settle()
            if self.report.ok and self._storage_stopped():
                await self._restart("power")
            if self.report.ok and step % self.config.drain_every_steps == 0:
                await self._drain()
            self.report.steps_run = step
            if not self.report.ok:
                return

    async def _settle(self) -> None:
        for _ in range(SETTLE_YIELDS):
            await asyncio.sleep(0)

    async def _shut_down(self) -> None:
        if self.node is None:
            return
        self._quiet = True
        try:
            if self.node.failed:
                await self.node.kill()
            else:
                await asyncio.wait_for(self.node.close(), self.config.op_timeout_s)
        except Exception as error:
            if self.report.ok and not self.node.failed:  # not a crash point reached meanwhile
                self.violation(None, None, None, f"clean shutdown failed: {error!r}")
            with contextlib.suppress(Exception):
                await self.node.kill()
        self.node = None

    # -- opening and setting up ------------------------------------------------------------

    def _new_fs(self) -> FileSystem:
        if self.rng.random() < self.config.power_loss_chance:
            return SimFileSystem(self.rng.getrandbits(32))
        return OsFileSystem()

    async def _open(self) -> None:
        assert self.node is None
        fs = self._new_fs()
        self.node = _Node(self.directory, self.storage_config, fs, self.broker_config,
                          self.clock)
        await self.timed(self.node.service.start(maintenance=False))
        self._quiet = False

    async def _set_up(self) -> None:
        namespaces = self.service.namespaces
        for index in range(self.config.topics):
            # From the third topic on, a partition's name: Failover then picks the active
            # consumer by partition index instead of the hash ring.
            name = f"sim-{index}" if index < 2 else f"sim-{index}-partition-{index}"
            topic = _TopicModel(index, name, dedup=index % 2 == 0)
            full = f"persistent://public/default/{topic.name}"
            if topic.dedup:
                namespaces.set_topic_policy(full, "deduplicationEnabled", True)
            if index == MAX_UNACKED_LIMITED_TOPIC:
                namespaces.set_topic_policy(full, "max_unacked_messages_per_consumer",
                                            MAX_UNACKED_PER_CONSUMER_LIMIT)
            loaded = await self.timed(self.service.get_topic(full))
            assert isinstance(loaded, PersistentTopic)
            for sub_type in SUB_TYPES:
                name = _sub_name(sub_type)
                await self.timed(loaded.create_subscription(name, "earliest"))
                topic.subs[name] = _SubModel(topic, name, sub_type)
            for number in range(PRODUCERS_PER_TOPIC):
                producer = _ProducerModel(f"p{index}-{number}")
                topic.producers[producer.name] = producer
            self.topics.append(topic)
        await self._connect_producers()

    async def _connect_producers(self) -> None:
        for topic in self.topics:
            for producer in topic.producers.values():
                _, created = await self.timed(self.service.create_producer(
                    f"persistent://public/default/{topic.name}", ProducerSpec(producer.name)))
                producer.producer = created

    # -- publishing ------------------------------------------------------------------------

    def _new_entry(self, topic: _TopicModel, producer: _ProducerModel, keys: list[str],
                   deliver_at: int | None) -> _Entry:
        first = producer.next_sequence_id
        producer.next_sequence_id += len(keys)
        uids = list(range(self._next_uid, self._next_uid + len(keys)))
        self._next_uid += len(keys)
        now_ms = self.now_ms()
        singles = [SingleMessage(PAYLOAD_PREFIX + str(uid).encode() + PAYLOAD_PAD,
                                 partition_key=key, sequence_id=first + offset)
                   for offset, (uid, key) in enumerate(zip(uids, keys, strict=True))]
        if len(singles) == 1:
            metadata, payload = build_message(singles[0], producer_name=producer.name,
                                              publish_time=now_ms)
        else:
            metadata, payload = build_batch(singles, producer_name=producer.name,
                                            publish_time=now_ms)
            metadata.highest_sequence_id = first + len(keys) - 1
        if deliver_at is not None:
            metadata.deliver_at_time = deliver_at
        entry = _Entry(topic, producer.name, first, first + len(keys) - 1,
                       encode_entry(metadata, payload), metadata, deliver_at, step=self.step)
        for offset, (uid, key) in enumerate(zip(uids, keys, strict=True)):
            message = _Message(uid, entry, offset if len(keys) > 1 else -1, key)
            entry.messages.append(message)
            self.messages[uid] = message
        topic.entries.append(entry)
        return entry

    def _pick_producer(self) -> tuple[_TopicModel, _ProducerModel]:
        topic = self.rng.choice(self.topics)
        return topic, self.rng.choice(list(topic.producers.values()))

    def _fresh_entry(self, kind: str) -> _Entry:
        topic, producer = self._pick_producer()
        if kind == "batch":
            count = self.rng.randint(2, BATCH_MESSAGES_MAX)
            return self._new_entry(topic, producer, [self.rng.choice(KEYS)] * count, None)
        if kind == "delayed":
            self.counts["delayed"] += 1
            deliver_at = self.now_ms() + self.rng.randint(1, self.config.delay_ms_max)
            return self._new_entry(topic, producer, [f"d{self._next_uid}"], deliver_at)
        return self._new_entry(topic, producer, [self.rng.choice(KEYS)], None)

    async def _op_publish(self) -> None:
        await self._publish(self._fresh_entry("single"))

    async def _op_publish_batch(self) -> None:
        await self._publish(self._fresh_entry("batch"))

    async def _op_publish_delayed(self) -> None:
        await self._publish(self._fresh_entry("delayed"))

    async def _op_publish_burst(self) -> None:
        work = []
        for _ in range(self.rng.randint(2, BURST_PUBLISHES_MAX)):
            resend = self._resend_candidate() if self.rng.random() < 0.2 else None
            if resend is not None:
                work.append(self._publish(resend, resend=True))
            else:
                work.append(self._publish(self._fresh_entry(
                    self.rng.choice(("single", "single", "batch")))))
        await asyncio.gather(*work)

    def _resend_candidate(self) -> _Entry | None:
        sent = [e for t in self.topics if t.dedup for e in t.entries[-40:]
                if e.position is not None]
        return self.rng.choice(sent) if sent else None

    async def _op_resend(self) -> None:
        entry = self._resend_candidate()
        if entry is not None:
            await self._publish(entry, resend=True)

    async def _publish(self, entry: _Entry, *, resend: bool = False) -> None:
        topic = entry.topic
        producer = topic.producers[entry.producer].producer
        assert producer is not None
        self.counts["resends" if resend else "entries_published"] += 1
        stored_before = entry.position is not None
        try:
            result = await self.timed(self.broker_topic(topic).publish(
                producer, entry.data, entry.sequence_id, entry.highest_sequence_id,
                entry.metadata))
        except asyncio.CancelledError:
            entry.cut_short = True  # a crash: stored or not, the restart finds out
            self.counts["uncertain_publishes"] += 1
            raise
        except PersistenceError as error:
            if not (str(error) == DEDUP_UNKNOWN_MESSAGE and topic.dedup and resend):
                self._publish_failed(entry, error)
            return  # refused as possibly in flight: nothing stored
        except OPERATION_ERRORS as error:
            self._publish_failed(entry, error)
            return
        if result.duplicate:
            self._publish_duplicate(entry, resend, stored_before)
            return
        self._publish_stored(entry, (result.ledger_id, result.entry_id), resend, stored_before)

    def _publish_failed(self, entry: _Entry, error: BaseException) -> None:
        if not self._expected_failure(error):
            self.violation(entry.topic, None, entry.messages[0], f"publish failed: {error!r}")
            return
        entry.cut_short = True
        self.counts["uncertain_publishes"] += 1

    def _publish_duplicate(self, entry: _Entry, resend: bool, stored_before: bool) -> None:
        self.counts["duplicates_answered"] += 1
        if not entry.topic.dedup:
            self.violation(entry.topic, None, entry.messages[0],
                           "answered as a duplicate on a topic without deduplication")
        elif not resend:
            self.violation(entry.topic, None, entry.messages[0],
                           f"a new entry (producer {entry.producer}, sequence id "
                           f"{entry.sequence_id}) was answered as a duplicate")
        elif not stored_before and entry.position is None and not entry.cut_short:
            self.violation(entry.topic, None, entry.messages[0],
                           "a resend of an entry that is not stored was answered as a "
                           "duplicate")

    def _publish_stored(self, entry: _Entry, position: tuple[int, int], resend: bool,
                        stored_before: bool) -> None:
        topic = entry.topic
        if resend and stored_before:
            self.violation(topic, None, entry.messages[0],
                           f"deduplication stored a resent entry again at {position} "
                           f"(producer {entry.producer}, sequence id {entry.sequence_id})")
            return
        producer = topic.producers[entry.producer]
        if not resend and entry.sequence_id < producer.returned_sequence_id:
            self.violation(topic, None, entry.messages[0],
                           f"publishes of producer {entry.producer} returned out of order: "
                           f"sequence id {entry.sequence_id} after "
                           f"{producer.returned_sequence_id}")
        producer.returned_sequence_id = max(producer.returned_sequence_id,
                                            entry.highest_sequence_id)
        if entry.position is None:
            topic.place(entry, position)
            self.counts["messages_published"] += len(entry.messages)
        elif entry.position != position:
            self.violation(topic, None, entry.messages[0],
                           f"stored twice: at {entry.position} and at {position}")

    # -- consumers -------------------------------------------------------------------------

    def _all_subs(self) -> list[_SubModel]:
        return [s for t in self.topics for s in t.subs.values()]

    def _connected(self) -> list[_ConsumerModel]:
        return [c for s in self._all_subs() for c in s.consumers.values()]

    async def _op_join(self) -> None:
        await self._join(self.rng.choice(self._all_subs()))

    async def _join(self, sub: _SubModel) -> _ConsumerModel | None:
        if len(sub.consumers) >= len(CONSUMER_NAMES):
            return None
        model = _ConsumerModel(sub, self.rng.choice(CONSUMER_NAMES))
        spec = SubscribeSpec(sub.name, sub.sub_type, model.name, initial_position="earliest")
        full = f"persistent://public/default/{sub.topic.name}"
        exclusive = sub.sub_type == "Exclusive"
        try:
            _, consumer = await self.timed(self.service.subscribe(full, spec,
                                                                  _Sink(self, model)))
        except ConsumerBusyError:
            # Judged by the broker's state now: concurrent joins and leaves race this one.
            if not exclusive or not self.broker_sub(sub).consumers:
                self.violation(sub.topic, sub, None, "subscribe refused (ConsumerBusy) with "
                               "no other Exclusive consumer connected")
            return None
        if exclusive and len(self.broker_sub(sub).consumers) > 1:
            self.violation(sub.topic, sub, None, "a second Exclusive consumer was admitted")
        # Registered after `subscribe` returns; the consumer has no permits before the flow
        # below, so nothing can be delivered to it meanwhile.
        model.consumer = consumer
        sub.consumers[consumer.consumer_serial] = model
        self.trace(sub, f"{model.tag} joined")
        if sub.sub_type == "Exclusive":
            sub.active = model
        self.counts["joins"] += 1
        self.broker_sub(sub).flow(consumer, self.rng.randint(0, PERMITS_GRANT_MAX))
        return model

    async def _op_leave(self) -> None:
        connected = self._connected()
        if not connected:
            return
        model = self.rng.choice(connected)
        sub = model.sub
        assert model.consumer is not None
        self.broker_topic(sub.topic).consumer_closed(self.broker_sub(sub), model.consumer)
        self.trace(sub, f"{model.tag} left holding "
                   f"{sorted(m.label() for m in model.holding.values())}")
        self._forget_consumer(model)
        self.counts["leaves"] += 1

    def _forget_consumer(self, model: _ConsumerModel) -> None:
        sub = model.sub
        model.release_all()
        assert model.consumer is not None
        sub.consumers.pop(model.consumer.consumer_serial, None)
        if sub.active is model:
            sub.active = None
        if not sub.consumers and self.node is not None:
            if not self.broker_sub(sub).consumers:
                sub.reset_redeliveries()
            else:  # a consumer still joining: the broker keeps its counts
                sub.redeliveries_unknown.update(sub.redeliveries)

    async def _op_flow(self) -> None:
        connected = self._connected()
        if connected:
            model = self.rng.choice(connected)
            assert model.consumer is not None
            permits = self.rng.randint(1, PERMITS_GRANT_MAX)
            self.broker_sub(model.sub).flow(model.consumer, permits)
            self.trace(model.sub, f"{model.tag} +{permits} "
                       "permits")
            self.counts["flows"] += 1

    def on_active_change(self, model: _ConsumerModel, is_active: bool) -> None:
        sub = model.sub
        if sub.sub_type != "Failover":
            self.violation(sub.topic, sub, None, "active-consumer change on a "
                           f"{sub.sub_type} subscription")
        if is_active:
            sub.active = model
            model.release_all()  # the cursor rewound: it receives everything unacked again
        elif sub.active is model:
            sub.active = None

    def on_closed_by_broker(self, model: _ConsumerModel, reason: str) -> None:
        self.violation(model.sub.topic, model.sub, None,
                       f"the broker closed consumer {model.tag}: {reason}")
        if model.consumer is not None:
            self._forget_consumer(model)

    # -- deliveries ------------------------------------------------------------------------

    def on_deliveries(self, model: _ConsumerModel, deliveries: list[Delivery]) -> None:
        sub = model.sub
        if sub.sub_type in SINGLE_ACTIVE and sub.active is not model:
            self.violation(sub.topic, sub, None,
                           f"delivered to {model.tag}, which is not the active consumer")
        for delivery in deliveries:
            entry = self._entry_of(sub, delivery)
            if entry is None:
                continue
            self._check_redelivery_count(sub, entry, delivery.redelivery_count)
            for message, wanted in self._delivered_messages(sub, entry, delivery.ack_set):
                if wanted:
                    self.trace(sub, f"deliver {message.label()} key {message.key} to "
                               f"{model.tag}")
                    self._check_delivery(model, message)
                    self.counts["deliveries"] += 1
                elif not sub.is_acked(message) and not sub.acks_under_way[message.uid]:
                    self.violation(sub.topic, sub, message,
                                   "the delivery's ack set skips an unacknowledged message")

    def _entry_of(self, sub: _SubModel, delivery: Delivery) -> _Entry | None:
        """The model's entry for a delivery, checked against the delivered bytes."""
        topic = sub.topic
        position = (delivery.ledger_id, delivery.entry_id)
        uids = _uids_of(delivery.entry)
        first = self.messages.get(uids[0]) if uids else None
        if first is None or first.entry.topic is not topic:
            self.violation(topic, sub, f"{position[0]}:{position[1]}",
                           f"delivered an entry the producers never sent (uids {uids[:3]})")
            return None
        entry = first.entry
        if entry.data != delivery.entry or [m.uid for m in entry.messages] != uids:
            self.violation(topic, sub, first, "delivered bytes differ from the entry sent")
            return None
        if entry.position is None:
            topic.place(entry, position)  # a publish still under way (or cut short)
            self.counts["messages_published"] += len(entry.messages)
        elif entry.position != position:
            self.violation(topic, sub, first,
                           f"the same entry is also stored at {position[0]}:{position[1]}")
            return None
        return entry

    def _check_redelivery_count(self, sub: _SubModel, entry: _Entry, count: int) -> None:
        """Shared and Key_Shared count negative acks per entry; a consumer leaving does
        not count."""
        position = entry.position
        assert position is not None
        if sub.sub_type not in MULTI_CONSUMER or position in sub.redeliveries_unknown:
            return
        expected = sub.redeliveries[position]
        if count != expected:
            self.violation(sub.topic, sub, entry.messages[0],
                           f"redelivery count {count}, but it was negatively acknowledged "
                           f"{expected} times")

    def _delivered_messages(self, sub: _SubModel, entry: _Entry, ack_set: list[int] | None,
                            ) -> list[tuple[_Message, bool]]:
        """(message, delivered) for each message of an entry: the client skips the indexes
        that the ack set marks as acknowledged."""
        if not entry.batched or ack_set is None:
            return [(m, True) for m in entry.messages]
        return [(m, _words_bit(ack_set, m.index)) for m in entry.messages]

    def _check_delivery(self, model: _ConsumerModel, message: _Message) -> None:
        sub = model.sub
        if sub.is_acked(message) and not sub.acks_under_way[message.uid]:
            self.violation(sub.topic, sub, message,
                           f"acknowledged (the ack returned) but delivered again to "
                           f"{model.tag}")
        self._check_delay(sub, message)
        self._check_holders(model, message)
        if sub.sub_type in ORDERED and message.entry.deliver_at is None and \
                message.key not in sub.tainted and message.uid not in sub.window:
            self._check_order(sub, message)
            sub.window.add(message.uid)
        if message.uid not in model.holding:
            model.hold(message)

    def _check_delay(self, sub: _SubModel, message: _Message) -> None:
        deliver_at = message.entry.deliver_at
        if deliver_at is None or sub.sub_type not in MULTI_CONSUMER:
            return
        early_ms = deliver_at - self.config.tick_ms - self.now_ms()
        if early_ms > 0:
            self.violation(sub.topic, sub, message,
                           f"delayed message delivered {early_ms:.0f} ms before its time "
                           f"(deliver at {deliver_at}, tick {self.config.tick_ms} ms)")

    def _check_holders(self, model: _ConsumerModel, message: _Message) -> None:
        sub = model.sub
        holders = sub.holders(message.uid)
        if model in holders:
            self.violation(sub.topic, sub, message,
                           f"delivered twice to {model.tag} without a redelivery")
        if sub.sub_type not in MULTI_CONSUMER:
            return
        others = [c for c in holders if c is not model]
        if others:
            self.violation(sub.topic, sub, message,
                           f"delivered to {model.tag} while {others[0].tag} holds it")
        if sub.sub_type != "Key_Shared":
            return
        for other in sub.consumers.values():
            if other is model or other.keys.get(message.key, 0) == 0:
                continue
            # An ack under way may already have released the key in the broker.
            held = [m for m in other.holding.values()
                    if m.key == message.key and not sub.acks_under_way[m.uid]]
            if held:
                self.violation(sub.topic, sub, message,
                               f"key {message.key} delivered to {model.tag} while "
                               f"{other.tag} holds {held[0].label()} unacknowledged")
                return

    def _check_order(self, sub: _SubModel, message: _Message) -> None:
        """Nothing earlier with the key may still wait for its first delivery in this
        window (see the module comment)."""
        items = sub.topic.by_key.get(message.key, [])
        at = sub.frontier.get(message.key, 0)
        while at < len(items) and (items[at].uid in sub.window or sub.is_acked(items[at])
                                   or sub.acks_under_way[items[at].uid]):
            at += 1
        sub.frontier[message.key] = at
        if at < len(items) and items[at] is not message and \
                items[at].message_id < message.message_id:
            self.violation(sub.topic, sub, message,
                           f"key {message.key} out of order: delivered before "
                           f"{items[at].label()}, which is older and still unacknowledged")

    # -- acknowledgements ------------------------------------------------------------------

    def _holding_consumers(self, types: tuple[str, ...] = SUB_TYPES) -> list[_ConsumerModel]:
        return [c for c in self._connected() if c.holding and c.sub.sub_type in types]

    async def _op_ack(self) -> None:
        candidates = self._holding_consumers()
        if not candidates:
            await self._op_flow()
            return
        model = self.rng.choice(candidates)
        held = sorted(model.holding.values(), key=lambda m: m.message_id)
        chosen = self.rng.sample(held, self.rng.randint(1, min(5, len(held))))
        if model.sub.sub_type in SINGLE_ACTIVE and self.rng.random() < 0.3:
            await self._ack_cumulative(model, max(chosen, key=lambda m: m.message_id))
        else:
            await self._ack_individual(model, chosen)

    def _individual_acks(self, chosen: list[_Message]
                         ) -> tuple[list[tuple[int, int, list[int] | None]], list[_Message]]:
        """The ack list for some held messages, and every message it acknowledges: a whole
        entry, or (batches, by chance) just the chosen indexes."""
        by_entry: dict[tuple[int, int], list[_Message]] = {}
        for message in chosen:
            position = message.entry.position
            assert position is not None
            by_entry.setdefault(position, []).append(message)
        acks: list[tuple[int, int, list[int] | None]] = []
        covered: list[_Message] = []
        for (ledger_id, entry_id), messages in sorted(by_entry.items()):
            entry = messages[0].entry
            if entry.batched and self.rng.random() < 0.5:
                indexes = {m.index for m in messages}
                acks.append((ledger_id, entry_id, _mask_words(len(entry.messages), indexes)))
                covered.extend(messages)
                self.counts["batch_index_acks"] += 1
            else:
                acks.append((ledger_id, entry_id, None))
                covered.extend(entry.messages)
        return acks, covered

    async def _ack_individual(self, model: _ConsumerModel, chosen: list[_Message]) -> None:
        acks, covered = self._individual_acks(chosen)
        await self._acknowledge(model, ACK_INDIVIDUAL, acks, covered)

    async def _ack_cumulative(self, model: _ConsumerModel, last: _Message) -> None:
        entry = last.entry
        ledger_id, entry_id, index = last.message_id
        bound = (ledger_id, entry_id, WHOLE_ENTRY)
        ack_set: list[int] | None = None
        if entry.batched and index < len(entry.messages) - 1 and self.rng.random() < 0.5:
            ack_set = _mask_words(len(entry.messages), set(range(index + 1)))
            bound = (ledger_id, entry_id, index)
        self.counts["cumulative_acks"] += 1
        covered = [m for e in model.sub.topic.stored() for m in e.messages
                   if _within(m.message_id, bound)]
        await self._acknowledge(model, ACK_CUMULATIVE, [(ledger_id, entry_id, ack_set)],
                                covered, bound)

    async def _acknowledge(self, model: _ConsumerModel, ack_type: int,
                           acks: list[tuple[int, int, list[int] | None]],
                           covered: list[_Message],
                           bound: tuple[int, int, int] | None = None) -> None:
        sub = model.sub
        assert model.consumer is not None
        for message in covered:
            sub.acks_under_way[message.uid] += 1
        try:
            await self.timed(self.broker_sub(sub).acknowledge(model.consumer, ack_type, acks))
        except OPERATION_ERRORS as error:
            if not self._expected_failure(error):
                self.violation(sub.topic, sub, covered[0] if covered else None,
                               f"acknowledgement {acks[:3]} failed: {error!r}")
            self.counts["uncertain_acks"] += 1
            return  # under way until a restart reads the cursor back
        self.counts["acks"] += 1
        self.trace(sub, f"{model.tag} acked {acks} "
                   f"(type {ack_type})")
        for message in covered:
            sub.acks_under_way[message.uid] -= 1
            if sub.acks_under_way[message.uid] <= 0:
                del sub.acks_under_way[message.uid]
            sub.acked.add(message.uid)
            sub.release_everywhere(message.uid)
        if bound is not None and (sub.cumulative is None or bound > sub.cumulative):
            sub.cumulative = bound

    async def _op_shared_cumulative(self) -> None:
        """A cumulative ack on Shared or Key_Shared: the broker must ignore it."""
        candidates = self._holding_consumers(MULTI_CONSUMER)
        if not candidates:
            return
        model = self.rng.choice(candidates)
        last = max(model.holding.values(), key=lambda m: m.message_id)
        ledger_id, entry_id, _ = last.message_id
        assert model.consumer is not None
        try:
            await self.timed(self.broker_sub(model.sub).acknowledge(
                model.consumer, ACK_CUMULATIVE, [(ledger_id, entry_id, None)]))
        except OPERATION_ERRORS as error:
            if not self._expected_failure(error):
                self.violation(model.sub.topic, model.sub, last,
                               f"ignored cumulative ack failed: {error!r}")

    async def _op_nack(self) -> None:
        candidates = self._holding_consumers()
        if not candidates:
            return
        model = self.rng.choice(candidates)
        sub = model.sub
        assert model.consumer is not None
        positions = sorted({m.entry.position for m in model.holding.values()
                            if m.entry.position is not None})
        chosen: list[tuple[int, int]] | None = None
        if self.rng.random() < 0.75:
            chosen = self.rng.sample(positions, self.rng.randint(1, min(3, len(positions))))
        self.broker_sub(sub).redeliver(model.consumer, chosen)
        self.counts["nacks"] += 1
        self.trace(sub, f"{model.tag} nacked {chosen}")
        if sub.sub_type in SINGLE_ACTIVE:
            if sub.active is model:
                model.release_all()  # the cursor rewinds to the first unacknowledged entry
            return
        wanted = None if chosen is None else set(chosen)
        counted: set[tuple[int, int]] = set()
        for message in list(model.holding.values()):
            position = message.entry.position
            if wanted is None or position in wanted:
                model.release(message.uid)
                if sub.sub_type == "Key_Shared":
                    sub.tainted.add(message.key)
                assert position is not None
                if sub.acks_under_way[message.uid]:
                    sub.redeliveries_unknown.add(position)  # the broker may have it acked
                elif position not in counted:
                    counted.add(position)
                    sub.redeliveries[position] += 1

    # -- maintenance and restarts ----------------------------------------------------------

    async def _op_concurrent(self) -> None:
        """Two or three operations at once: acks racing negative acks, consumers leaving
        while their acks are under way, publishes racing both."""
        names = [self.rng.choice(CONCURRENT_OPERATIONS)
                 for _ in range(self.rng.randint(2, CONCURRENT_OPERATIONS_MAX))]
        outcomes = await asyncio.gather(*(getattr(self, f"_op_{name}")() for name in names),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _op_maintenance(self) -> None:
        assert self.node is not None
        await self.timed(self.service.run_maintenance(force=True))
        self.node.checkpoint()
        self.counts["maintenance"] += 1

    async def _op_restart(self) -> None:
        assert self.node is not None
        kinds = ["clean", "kill"]
        if isinstance(self.node.fs, SimFileSystem):
            kinds.append("power")
        await self._restart(self.rng.choice(kinds))

    async def _restart(self, kind: str) -> None:
        """Stop the broker (see `_close_cleanly` and `_crash`), start it again, and check
        what it recovered against the model."""
        assert self.node is not None
        assert kind in ("clean", "kill", "power")
        before: dict[str, Any] | None = None
        if kind == "clean":
            before = self._capture()
            kind = await self._close_cleanly()
            before = before if kind == "clean" else None
        else:
            await self._crash(kind)
        self.node = None
        self.counts[f"restarts_{kind}"] += 1
        for sub in self._all_subs():
            for model in list(sub.consumers.values()):
                self._forget_consumer(model)
            sub.reset_window()
            if kind != "clean":  # a crash may lose increments not yet written
                sub.redeliveries_unknown.update(sub.redeliveries)
        await self._open()
        lost: list[_Entry] = []
        for topic in self.topics:
            lost.extend(await self._verify_topic(topic, before))
        await self._connect_producers()
        self._verify_last_sequence_ids()
        for entry in lost:
            await self._resend_lost(entry)
        self._arm_crash_point()
        self._progress(f"restart ({kind})")

    async def _close_cleanly(self) -> str:
        """Close service and storage; "power" when the storage stopped at its crash point
        meanwhile (the file system then loses what was not synced)."""
        node = self.node
        assert node is not None
        try:
            await self.timed(node.close())
        except Exception as error:
            if not node.failed:
                raise
            log.info("the storage stopped while closing: %r", error)
            self._quiet = True
            with contextlib.suppress(Exception):
                await node.kill()
        if not node.failed:
            return "clean"
        self.counts["crash_points"] += 1
        if isinstance(node.fs, SimFileSystem):
            node.fs.power_loss()
        return "power"

    async def _crash(self, kind: str) -> None:
        """Kill the broker, maybe with publishes and acks under way; a power loss also
        drops, tears or corrupts what the disk had not synced."""
        node = self.node
        assert node is not None
        in_flight = [asyncio.ensure_future(self._in_flight_work())
                     for _ in range(self.rng.randint(0, 3))]
        for _ in range(self.rng.randint(0, 6)):
            await asyncio.sleep(0)
        self._quiet = True
        await node.kill()  # first: no storage thread may see the file system stop
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        self.counts["uncertain_acks"] += sum(len(s.acks_under_way) for s in self._all_subs())
        if kind == "power" and isinstance(node.fs, SimFileSystem):
            node.fs.crash("simulated power loss")
            log.debug("power loss: %s", node.fs.power_loss())

    async def _in_flight_work(self) -> None:
        holding = self._holding_consumers()
        if self.rng.random() < 0.5 or not holding:
            await self._publish(self._fresh_entry(self.rng.choice(("single", "batch"))))
        else:
            model = self.rng.choice(holding)
            await self._ack_individual(model, list(model.holding.values())[:3])

    def _arm_crash_point(self) -> None:
        """Maybe stop the storage at a file operation a little ahead (pumped mode only,
        where operation counts replay)."""
        assert self.node is not None
        fs = self.node.fs
        if isinstance(fs, SimFileSystem) and not self.config.storage_threads and \
                self.rng.random() < self.config.crash_point_chance:
            fs.crash_at_op = fs.ops + self.rng.randint(CRASH_OPS_AHEAD_MIN, CRASH_OPS_AHEAD_MAX)

    def _capture(self) -> dict[str, Any]:
        """The broker state a clean restart must keep: per subscription what its cursor
        says of each stored entry, and per topic the dedup state."""
        captured: dict[str, Any] = {}
        for topic in self.topics:
            broker = self.broker_topic(topic)
            positions = _valid_positions(broker)
            for sub in topic.subs.values():
                cursor = broker.subscriptions[sub.name].cursor
                captured[f"{topic.name}/{sub.name}"] = {
                    position: (cursor.is_acked(Position(*position)),
                               cursor.get_ack_set(Position(*position)))
                    for position in positions}
            if broker.dedup is not None:
                captured[f"{topic.name}/dedup"] = {
                    name: broker.dedup.highest_persisted(name) for name in topic.producers}
        return captured

    def _progress(self, what: str) -> None:
        if self.config.progress is not None:
            c = self.counts
            self.config.progress(f"step {self.step}: {what}; {c['messages_published']} "
                                 f"messages published, {c['acks']} acks")

    # -- checks after a restart ------------------------------------------------------------

    async def _verify_topic(self, topic: _TopicModel, before: dict[str, Any] | None,
                            ) -> list[_Entry]:
        """Check one topic after a restart; returns the entries a crash cut short that are
        not stored (to send again)."""
        broker = await self.timed(self.service.get_topic(
            f"persistent://public/default/{topic.name}", create=False))
        assert isinstance(broker, PersistentTopic)
        missing = [name for name in topic.subs if name not in broker.subscriptions]
        for name in missing:
            self.violation(topic, name, None, "the subscription is gone after the restart")
        lost = self._verify_log(topic, broker)
        for sub in topic.subs.values():
            if sub.name not in missing:
                self._verify_cursor(sub, broker)
        if before is not None:
            self._verify_unchanged(topic, broker, before)
        return lost

    def _verify_log(self, topic: _TopicModel, broker: PersistentTopic) -> list[_Entry]:
        """Every stored entry is where the model has it (unless trimmed), none is stored
        twice, no producer sequence id twice with deduplication; entries cut short are
        found, or returned as lost."""
        found: dict[int, list[tuple[int, int]]] = {}
        sequences: dict[tuple[str, int], tuple[int, int]] = {}
        for position, data in _scan(broker):
            uids = _uids_of(data)
            message = self.messages.get(uids[0]) if uids else None
            if message is None or message.entry.topic is not topic or \
                    message.entry.data != data:
                self.violation(topic, None, f"{position[0]}:{position[1]}",
                               "the log holds an entry the producers never sent")
                continue
            entry = message.entry
            found.setdefault(message.uid, []).append(position)
            if not topic.dedup:
                continue
            for sequence_id in range(entry.sequence_id, entry.highest_sequence_id + 1):
                other = sequences.setdefault((entry.producer, sequence_id), position)
                if other != position:
                    self.violation(topic, None, message,
                                   f"deduplication stored producer {entry.producer} "
                                   f"sequence id {sequence_id} twice (also at {other})")
        return [entry for entry in topic.entries
                if self._reconcile_entry(topic, broker, entry,
                                         found.get(entry.messages[0].uid, []))]

    def _reconcile_entry(self, topic: _TopicModel, broker: PersistentTopic, entry: _Entry,
                         positions: list[tuple[int, int]]) -> bool:
        """Check one entry against where the log holds it; True when a crash cut its
        publish short and it is not stored."""
        first = entry.messages[0]
        cut_short, entry.cut_short = entry.cut_short, False
        if len(positions) > 1:
            self.violation(topic, None, first, f"stored {len(positions)} times: {positions}")
        if entry.position is not None:
            ledger_exists = broker.managed_ledger.has_ledger(entry.position[0])
            if ledger_exists and entry.position not in positions:
                self.violation(topic, None, first, "a publish that returned is lost")
            elif not ledger_exists:
                self._check_trimmed(topic, entry)
            return False
        if positions:
            if not cut_short:
                self.violation(topic, None, first, "stored, but its publish failed")
            topic.place(entry, positions[0])
            self.counts["messages_published"] += len(entry.messages)
            return False
        if cut_short:
            self.counts["lost_publishes"] += 1
        return cut_short

    def _check_trimmed(self, topic: _TopicModel, entry: _Entry) -> None:
        for sub in topic.subs.values():
            for message in entry.messages:
                if not sub.is_acked(message) and not sub.acks_under_way[message.uid]:
                    self.violation(topic, sub, message,
                                   "its ledger was trimmed while it was unacknowledged")
                    return

    def _verify_cursor(self, sub: _SubModel, broker: PersistentTopic) -> None:
        """The cursor acknowledges exactly what the model says; acks under way at a crash
        are decided by what the cursor says."""
        cursor = broker.subscriptions[sub.name].cursor
        ml = broker.managed_ledger
        for entry in sub.topic.stored():
            assert entry.position is not None
            position = Position(*entry.position)
            if not ml.is_valid_position(position):
                continue  # trimmed: see _check_trimmed
            whole = cursor.is_acked(position)
            words = cursor.get_ack_set(position)
            for message in entry.messages:
                stored = whole or (words is not None and not _words_bit(words, message.index))
                if sub.acks_under_way[message.uid]:
                    if stored:
                        sub.acked.add(message.uid)
                    continue
                if stored != sub.is_acked(message):
                    what = ("acknowledged in the cursor but never by a consumer" if stored
                            else "acknowledged (the ack returned) but not in the cursor")
                    self.violation(sub.topic, sub, message, f"after the restart: {what}")
        sub.acks_under_way.clear()

    def _verify_unchanged(self, topic: _TopicModel, broker: PersistentTopic,
                          before: dict[str, Any]) -> None:
        for sub in topic.subs.values():
            cursor = broker.subscriptions[sub.name].cursor
            for position, was in before[f"{topic.name}/{sub.name}"].items():
                now = (cursor.is_acked(Position(*position)),
                       cursor.get_ack_set(Position(*position)))
                if now != was:
                    self.violation(topic, sub, f"{position[0]}:{position[1]}",
                                   f"a clean restart changed the cursor: {was} -> {now}")
        dedup_before = before.get(f"{topic.name}/dedup")
        if dedup_before is None or broker.dedup is None:
            return
        for name, persisted in dedup_before.items():
            recovered = broker.dedup.highest_persisted(name)
            if recovered != persisted:
                self.violation(topic, None, None, f"a clean restart changed the dedup state "
                               f"of producer {name}: {persisted} -> {recovered}")

    def _verify_last_sequence_ids(self) -> None:
        """With deduplication, each producer's last sequence id is the highest stored."""
        for topic in (t for t in self.topics if t.dedup):
            broker = self.broker_topic(topic)
            for model in topic.producers.values():
                expected = max((e.highest_sequence_id for e in topic.entries
                                if e.producer == model.name and e.position is not None),
                               default=-1)
                assert model.producer is not None
                actual = broker.last_sequence_id(model.producer)
                if actual != expected:
                    self.violation(topic, None, None,
                                   f"producer {model.name}: last sequence id {actual} after "
                                   f"the restart, but the highest stored is {expected}")

    async def _resend_lost(self, entry: _Entry) -> None:
        """A client sends again what a crash cut short. With deduplication it must be
        stored now (its sequence id is above everything stored)."""
        if not entry.topic.dedup or not self.report.ok:
            return
        await self._publish(entry, resend=True)
        if entry.position is None and not entry.cut_short and self.report.ok:
            self.violation(entry.topic, None, entry.messages[0],
                           "cut short by a crash and not stored, yet not stored when sent "
                           "again")

    # -- drains ----------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Acknowledge everything: each subscription gets a consumer and permits, and its
        consumers acknowledge what they hold until every stored message is acknowledged."""
        self.counts["drains"] += 1
        for sub in self._all_subs():
            if not sub.consumers:
                await self._join(sub)
            for model in sub.consumers.values():
                assert model.consumer is not None
                self.broker_sub(sub).flow(model.consumer, DRAIN_PERMITS)
        latest_s = max((e.deliver_at for t in self.topics for e in t.entries
                        if e.deliver_at is not None), default=0) / 1000
        deadline = max(self.clock(), latest_s) + self.config.drain_timeout_s
        while self.report.ok:
            await self._ack_everything_held()
            if self._storage_stopped():
                await self._restart("power")
                return
            if self._everything_acked():
                break
            if self.clock() > deadline:
                self._report_undelivered()
                return
            await asyncio.sleep(DRAIN_POLL_S)
        self._after_drain()

    async def _ack_everything_held(self) -> None:
        for model in self._holding_consumers():
            entries = {m.message_id[:2]: m.entry for m in model.holding.values()}
            acks: list[tuple[int, int, list[int] | None]] = [
                (ledger_id, entry_id, None) for ledger_id, entry_id in sorted(entries)]
            covered = [m for e in entries.values() for m in e.messages]
            await self._acknowledge(model, ACK_INDIVIDUAL, acks, covered)

    def _everything_acked(self) -> bool:
        return all(sub.is_acked(m) for t in self.topics for e in t.stored()
                   for m in e.messages for sub in t.subs.values())

    def _report_undelivered(self) -> None:
        reported = 0
        for topic in self.topics:
            for sub in topic.subs.values():
                waiting = [m for e in topic.stored() for m in e.messages if not sub.is_acked(m)]
                if waiting and reported < VIOLATIONS_PER_DRAIN_MAX:
                    reported += 1
                    self.violation(topic, sub, waiting[0],
                                   f"never reached the subscription ({len(waiting)} messages "
                                   f"waiting; published at step {waiting[0].entry.step}; "
                                   f"{len(sub.consumers)} consumers connected)")

    def _after_drain(self) -> None:
        for topic in self.topics:
            broker = self.broker_topic(topic)
            for sub in topic.subs.values():
                backlog = broker.subscriptions[sub.name].backlog()
                if backlog != 0:
                    self.violation(topic, sub, None,
                                   f"backlog is {backlog} entries after everything was "
                                   "acknowledged")
                sub.reset_window()
        self._progress("drained")


def _uids_of(data: bytes) -> list[int]:
    """The uids in an entry's payloads (the simulation writes them there)."""
    entry = parse_entry(data)
    uids = []
    for message in unpack_messages(entry.metadata, entry.payload):
        payload = message.payload or b""
        assert payload.startswith(PAYLOAD_PREFIX), payload[:16]
        uids.append(int(payload[len(PAYLOAD_PREFIX):].split(b".", 1)[0]))
    return uids


def _scan(broker: PersistentTopic) -> Iterator[tuple[tuple[int, int], bytes]]:
    """Every entry of a topic's managed ledger, oldest first."""
    ml = broker.managed_ledger
    at = ml.first_position()
    for _ in range(ml.number_of_entries + 1):  # bound: at least one entry per read
        batch = ml.read_entries(at, 64, 4 * 1024 * 1024)
        if not batch:
            return
        for position, data in batch:
            yield (position.ledger_id, position.entry_id), data
        at = ml.next_position(batch[-1][0])


def _valid_positions(broker: PersistentTopic) -> list[tuple[int, int]]:
    return [position for position, _ in _scan(broker)]
