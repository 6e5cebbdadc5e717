"""The seeded broker simulation's engine, part 1 (see `_simulation` for the theory of
operation): one incarnation of the broker (`_Node`), the sink consumers deliver to, and
`_SimulationCore`: plumbing (clock, violations, guarded checks), opening and setting up the
broker, publishing (single, batched, delayed, bursts, resends) and consumers joining, leaving
and asking for messages. `_sim_traffic` adds deliveries and acknowledgements, `_simulation`
the run, restarts, crashes and the checks after them.
"""


from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from magnetar.codec import (
    BROKER_ENTRY_METADATA_BYTES_MAX,
    FRAME_PADDING_BYTES,
    SingleMessage,
    build_batch,
    build_message,
    encode_entry,
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
from .._errors import ConsumerBusyError, PersistenceError
from ..dispatch._consumer import Consumer, Delivery, SubscribeSpec
from ..dispatch._subscription import Subscription
from ..ledger._loader import EntryLoader
from ..topics._dedup import DEDUP_UNKNOWN_MESSAGE
from ..topics._service import BrokerService
from ..topics._topic import PersistentTopic, ProducerSpec
from ._sim_model import (
    BATCH_MESSAGES_MAX,
    BURST_PUBLISHES_MAX,
    CHECKPOINT_PUMPS,
    CONSUMER_NAMES,
    KEYS,
    MAX_UNACKED_LIMITED_TOPIC,
    MAX_UNACKED_PER_CONSUMER_LIMIT,
    OPERATION_ERRORS,
    PAYLOAD_PAD,
    PAYLOAD_PREFIX,
    PERMITS_GRANT_MAX,
    PRODUCERS_PER_TOPIC,
    SIM_ENTRY_BYTES_MAX,
    SUB_TYPES,
    SimulationConfig,
    SimulationReport,
    T,
    Violation,
    _ConsumerModel,
    _Entry,
    _Message,
    _ProducerModel,
    _sub_name,
    _SubModel,
    _TopicModel,
)

__all__: list[str] = []

log = logging.getLogger(__name__)

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
        for task in list(topic.background):
            task.cancel()


# -- the sink the broker delivers to ------------------------------------------------------

class _Sink:
    """One consumer's transport: hands every broker call to the simulation's checks."""

    def __init__(self, simulation: _SimulationCore, model: _ConsumerModel):
        self._simulation = simulation
        self._model = model

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        self._simulation.guarded(self._simulation.on_deliveries, self._model, deliveries)

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        self._simulation.guarded(self._simulation.on_active_change, self._model, is_active)

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        self._simulation.guarded(self._simulation.on_closed_by_broker, self._model, reason)


# -- the simulation -----------------------------------------------------------------------

class _SimulationCore:
    """State and the operations on producers and consumers; see the module comment."""

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

    def on_deliveries(self, model: _ConsumerModel, deliveries: list[Delivery]) -> None:
        """Check and take a delivery: `_sim_traffic._SimulationTraffic` does."""
        raise NotImplementedError

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
