"""The seeded broker simulation's settings, report and model (see `_simulation` for the theory
of operation): the constants that shape a run, `SimulationConfig`, `Violation` and
`SimulationReport`, and the model of what the broker must hold and deliver -- messages,
entries, topics, subscriptions, consumers and producers as the simulation expects them.
"""


from __future__ import annotations

import bisect
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from magnetar.codec import parse_entry, pb, unpack_messages
from magnetar.storage import StorageError

from .._errors import BrokerError
from ..dispatch._consumer import Consumer
from ..ledger._position import int_to_ack_set
from ..topics._topic import PersistentTopic, Producer

__all__ = ["SimulationConfig", "SimulationReport", "Violation"]

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
    # send), the entries whose count a race made unknown, and those whose count the broker
    # cleared when the last consumer left (a background write that a crash may undo).
    redeliveries: Counter[tuple[int, int]] = field(default_factory=Counter)
    redeliveries_unknown: set[tuple[int, int]] = field(default_factory=set)
    redeliveries_cleared: set[tuple[int, int]] = field(default_factory=set)

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
        restarts: the cursor persists them). It writes the cleared counts in the background
        like any count change, so until a clean restart a crash may bring them back."""
        self.redeliveries_cleared.update(self.redeliveries)
        self.redeliveries_cleared.update(self.redeliveries_unknown)
        self.redeliveries.clear()
        self.redeliveries_unknown.clear()

    def after_restart(self, clean: bool) -> None:
        """A clean stop writes every count; a crash may lose the count changes not yet
        durable: increments, and the clearing of counts (which then come back)."""
        if not clean:
            self.redeliveries_unknown.update(self.redeliveries)
            self.redeliveries_unknown.update(self.redeliveries_cleared)
        self.redeliveries_cleared.clear()


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
