"""`BrokerService`: the broker as the TCP server and the embedded client both call it.

Theory of operation
-------------------
One service owns one `Storage` and runs on one asyncio event loop. Topics are loaded on
first use (`get_topic`) and stay loaded until the service closes; loading a persistent
topic opens its managed ledger (closing the previous run's last ledger and starting a new
one), recovers its cursors and its dedup state. Concurrent first uses share one load. Nothing
is loaded at start, and a load reads only its own topic's records and ledgers, so loading or
creating a topic costs the same however many exist (tests/broker/test_many_topics.py counts
it). `close` closes the loaded topics `TOPICS_CLOSING_MAX` at a time and journals their
managed-ledger records together (`RECORDS_WRITE_BYTES_MAX` per write).

Topic existence: a persistent topic exists when its managed-ledger record exists in the
metadata store; partitioned topics are a separate metadata record (`NamespaceRegistry`),
and each partition is an ordinary topic. Automatic creation follows the namespace override
or the broker configuration.

Topic events: `add_topic_listener` registers a callable told `(name, created)` whenever a
persistent topic is created (its managed ledger did not exist before) or deleted; topic-list
watchers (`_topic_watchers.py`) use it. At most `TOPIC_LISTENERS_MAX` listeners; a listener
that raises is logged and stays registered.

Maintenance (`run_maintenance`, every second from `start`): `_maintenance.py`.

Start-up check: the largest entry the broker may store -- `max_message_size_bytes` plus the
frame padding a message may use for its metadata (`codec.FRAME_PADDING_BYTES`) plus a broker
entry metadata block (`codec.BROKER_ENTRY_METADATA_BYTES_MAX`) -- must fit the storage's
`entry_size_bytes_max`; otherwise the service is not built (`check_entry_fits_storage`), rather
than refusing the largest messages one by one after accepting them from the wire.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from urllib.parse import unquote_plus  # Java's URLEncoder writes ' ' as '+'

from magnetar.codec import BROKER_ENTRY_METADATA_BYTES_MAX, FRAME_PADDING_BYTES
from magnetar.storage import LedgerStorage

from .._config import BrokerConfig
from .._errors import (
    ConfigurationError,
    InvalidTopicNameError,
    MetadataError,
    NotAllowedError,
    TopicNotFoundError,
)
from .._names import TopicName, matches_topics_pattern
from .._namespaces import NamespaceRegistry
from .._tasks import log_task_failure
from ..dispatch._consumer import Consumer, ConsumerSink, SubscribeSpec
from ..ledger._loader import EntryLoader
from ..ledger._managed_ledger import ml_key
from ..schemas._schemas import SchemaRegistry
from ._maintenance import Maintenance
from ._nonpersistent_topic import NonPersistentTopic
from ._producer import Producer, ProducerSpec
from ._stats_interval import StatsInterval
from ._topic import PersistentTopic

__all__ = ["TOPIC_LISTENERS_MAX", "BrokerService", "ConnectionCounters", "Topic", "TopicListener",
           "check_entry_fits_storage"]

log = logging.getLogger(__name__)

Topic = PersistentTopic | NonPersistentTopic
TopicListener = Callable[[str, bool], None]  # (complete topic name, created: else deleted)
TOPICS_CLOSING_MAX = 256  # topics closed at once when the service closes
RECORDS_WRITE_BYTES_MAX = 1024 * 1024  # their ML records go to the journal in writes this big
TOPIC_LISTENERS_MAX = 10_000  # topic-list watchers of every connection together


def _listable(name: str, include_system: bool) -> bool:
    """Whether `list_topics` shows a stored topic: system topics only when asked, and never one
    whose name no longer parses (stored by an earlier build before names were limited), which
    is logged instead, since no client could use it."""
    try:
        topic = TopicName.parse(name)
    except InvalidTopicNameError as exc:
        log.warning("not listing stored topic %.80r: %s", name, exc)
        return False
    return include_system or not topic.is_system_topic


def check_entry_fits_storage(config: BrokerConfig, entry_size_bytes_max: int) -> None:
    """Check that the broker's largest stored entry fits the storage's (module comment).

    Raises:
        ConfigurationError: it does not; the message names both settings.
    """
    needed = config.max_message_size_bytes + FRAME_PADDING_BYTES + \
        BROKER_ENTRY_METADATA_BYTES_MAX
    if needed > entry_size_bytes_max:
        raise ConfigurationError(
            f"max_message_size_bytes ({config.max_message_size_bytes}) plus "
            f"{FRAME_PADDING_BYTES + BROKER_ENTRY_METADATA_BYTES_MAX} bytes of frame padding "
            f"and broker entry metadata exceeds the storage's entry_size_bytes_max "
            f"({entry_size_bytes_max}): max_message_size_bytes may be at most "
            f"{entry_size_bytes_max - FRAME_PADDING_BYTES - BROKER_ENTRY_METADATA_BYTES_MAX}")


@dataclass
class ConnectionCounters:
    """The binary protocol server's counters (`wire/_server.py` keeps them on the
    service; `/metrics` shows them).

    Attributes:
        active: open connections.
        refused: connections refused for a connection limit, since start.
        closed_for_incomplete_frames: connections closed for `max_incomplete_frames_bytes`.
        incomplete_frames_bytes: bytes of frames not yet complete, over all connections.
    """

    active: int = 0
    refused: int = 0
    closed_for_incomplete_frames: int = 0
    incomplete_frames_bytes: int = 0

    def any(self) -> bool:
        """Whether a counter is not zero."""
        return any(getattr(self, each.name) for each in fields(self))


class BrokerService(Maintenance):
    """The broker: topics, producers, consumers and their policies over one storage.

    Raises:
        ConfigurationError: the config's largest message does not fit the storage's largest
            entry (`check_entry_fits_storage`); nothing is loaded.
    """

    def __init__(self, storage: LedgerStorage, config: BrokerConfig | None = None,
                 clock: Callable[[], float] = time.time, loader: EntryLoader | None = None):
        """`loader`: the worker for reads that need the disk (default: one built from the
        config's `managed_ledger_read_*_max` limits)."""
        self.config = config or BrokerConfig()
        check_entry_fits_storage(self.config, storage.config.entry_size_bytes_max)
        self.storage = storage
        self.clock = clock
        self.loader = loader or EntryLoader(
            self.config.managed_ledger_read_loads_in_flight_max,
            self.config.managed_ledger_read_loaded_bytes_max,
            read_ahead_bytes_max=self.config.managed_ledger_read_ahead_bytes_max)
        self.namespaces = NamespaceRegistry(storage.metadata, self.config)
        self.schemas = SchemaRegistry(storage.metadata, self.namespaces, clock)
        self.topics: dict[str, Topic] = {}
        self._loading: dict[str, asyncio.Future[Topic]] = {}
        self._maintenance: asyncio.Task[None] | None = None
        self._last_run: dict[str, float] = {}
        self._topic_listeners: list[TopicListener] = []
        self.stats_interval = StatsInterval()  # the topics the stats interval walks
        self.closed = False
        self.stopping = False  # set by the server's shutdown: clients leave, state stays
        self.connections = ConnectionCounters()  # kept by the binary protocol server

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, *, maintenance: bool = True) -> None:
        self.namespaces.bootstrap()
        if maintenance:
            self._maintenance = asyncio.ensure_future(self._maintenance_loop())
            self._maintenance.add_done_callback(
                lambda task: log_task_failure(task, "broker maintenance"))

    async def close(self) -> None:
        """Close every loaded topic (managed ledgers closed, dedup snapshotted), up to
        `TOPICS_CLOSING_MAX` at once, so that their journal writes share syncs; their
        managed-ledger records are journaled together at the end (one transaction each took a
        sync: 10,000 idle topics took a minute to close). A failure is
        logged: the next open of a topic recovers from the record it finds.

        The cyclic GC is off meanwhile (as it was before, after): every full collection walks
        every loaded topic's objects, millions at 100,000 topics, and the close's allocations
        set off several -- one took 3 s of the 7.6 s 20,000 topics took to close, and
        100,000 topics took over 30 s (a SIGKILL for a supervisor that waits 30 s)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            await self._close()
        finally:
            if collecting:
                gc.enable()

    async def _close(self) -> None:
        self.closed = True
        self.stopping = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            try:
                await self._maintenance
            except asyncio.CancelledError:
                pass
        topics = list(self.topics.values())
        records: dict[bytes, bytes] = {}
        for topic in topics:
            if isinstance(topic, PersistentTopic):
                topic.managed_ledger.record_sink = records.__setitem__
        for first in range(0, len(topics), TOPICS_CLOSING_MAX):
            await asyncio.gather(*(self._close_topic(topic)
                                   for topic in topics[first:first + TOPICS_CLOSING_MAX]))
        try:  # through the journal, as the MLs write them (no disk on the loop)
            batch: list[tuple[bytes, bytes | None]] = []
            size = 0
            for key, value in records.items():
                batch.append((key, value))
                size += len(key) + len(value)
                if size >= RECORDS_WRITE_BYTES_MAX:
                    await self.storage.metadata.apply_journaled(batch)
                    batch, size = [], 0
            if batch:
                await self.storage.metadata.apply_journaled(batch)
        except Exception as exc:
            log.error("recording %d closed managed ledgers failed: %s", len(records), exc)
        self.topics.clear()
        self.loader.close()

    @staticmethod
    async def _close_topic(topic: Topic) -> None:
        try:
            await topic.close()
        except Exception as exc:  # keep closing the others
            log.error("closing %s failed: %s", topic.name, exc)

    # -- topics ----------------------------------------------------------------------------

    @staticmethod
    def parse_topic(name: str | TopicName) -> TopicName:
        return name if isinstance(name, TopicName) else TopicName.parse(name)

    def persistent_topic_exists(self, name: TopicName) -> bool:
        return (str(name) in self.topics
                or self.storage.metadata.get(ml_key(name.persistence_name)) is not None)

    def topic_exists(self, name: str | TopicName) -> bool:
        topic = self.parse_topic(name)
        if not topic.is_persistent:
            return str(topic) in self.topics
        return self.persistent_topic_exists(topic)

    async def get_topic(self, name: str | TopicName, *, create: bool = True,
                        explicit: bool = False) -> Topic:
        """The loaded topic, loading (and, when allowed, creating) it on first use.
        `explicit` (an admin's create) creates it whatever automatic creation says.

        Raises:
            InvalidTopicNameError: the name does not parse.
            TopicNotFoundError: missing and not to be created, or its namespace is missing.
            NotAllowedError: the name is the base of a partitioned topic.
        """
        topic_name = self.parse_topic(name)
        key = str(topic_name)
        loaded = self.topics.get(key)
        if loaded is not None:
            return loaded
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Topic] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            topic = await self._load(topic_name, create, explicit)
            self.topics[key] = topic
            self.stats_interval.touch(topic)
            future.set_result(topic)
            return topic
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._loading[key]

    # -- topic events ----------------------------------------------------------------------

    def add_topic_listener(self, listener: TopicListener) -> None:
        """Tell `listener(name, created)` about persistent topics created and deleted.

        Raises:
            NotAllowedError: `TOPIC_LISTENERS_MAX` listeners are registered already; nothing
                was added.
        """
        if len(self._topic_listeners) >= TOPIC_LISTENERS_MAX:
            raise NotAllowedError(f"more than {TOPIC_LISTENERS_MAX} topic listeners")
        self._topic_listeners.append(listener)

    def remove_topic_listener(self, listener: TopicListener) -> None:
        """Forget a listener (nothing happens when it is not registered)."""
        if listener in self._topic_listeners:
            self._topic_listeners.remove(listener)

    def _topic_event(self, name: TopicName, created: bool) -> None:
        if name.is_system_topic:
            return
        for listener in list(self._topic_listeners):
            try:
                listener(str(name), created)
            except Exception:
                log.exception("a topic listener failed on %s", name)

    async def _load(self, name: TopicName, create: bool, explicit: bool = False) -> Topic:
        namespace = name.namespace_name
        if not self.namespaces.namespace_exists(namespace):
            raise TopicNotFoundError(f"Namespace {namespace} does not exist")
        if self.namespaces.partitions(str(name)) > 0:
            raise NotAllowedError(f"{name} is a partitioned topic: use its partitions")
        if not name.is_persistent:
            return NonPersistentTopic(self, name)
        created = not self.persistent_topic_exists(name)
        if created:
            allowed = explicit or self._may_create(name)
            if not create or not allowed:
                raise TopicNotFoundError(f"Topic {name} does not exist")
        topic = await PersistentTopic.load(self, name)
        log.info("topic %s %s", name, "created" if created else "loaded")
        if created:
            self._topic_event(name, True)
        return topic

    def _may_create(self, name: TopicName) -> bool:
        if name.partition_index >= 0:
            base = str(name.partitioned_base)
            partitions = self.namespaces.partitions(base)
            if partitions > 0:
                return name.partition_index < partitions
        allowed, _, _ = self.namespaces.auto_topic_creation(name.namespace_name)
        return allowed

    async def partitioned_metadata(self, name: str | TopicName) -> int:
        """Partitions of a topic for a client's lookup (0: not partitioned), creating a
        partitioned topic when auto-creation says so."""
        topic_name = self.parse_topic(name)
        if topic_name.partition_index >= 0:
            return 0
        partitions = self.namespaces.partitions(str(topic_name))
        if partitions > 0:
            return partitions
        allowed, kind, default = self.namespaces.auto_topic_creation(topic_name.namespace_name)
        if (allowed and kind == "partitioned" and topic_name.is_persistent
                and not self.topic_exists(topic_name)
                and self.namespaces.namespace_exists(topic_name.namespace_name)):
            self.namespaces.set_partitions(str(topic_name), default, create=True)
            return default
        return 0

    async def create_partitioned_topic(self, name: str | TopicName, partitions: int) -> None:
        """Create the metadata and, like upstream's admin, the partitions (so listings and
        regex subscriptions see them). Raises MetadataError when it exists (partitioned or
        not)."""
        topic_name = self.parse_topic(name)
        if partitions < 1:
            raise NotAllowedError("The number of partitions must be at least 1")
        if not self.namespaces.namespace_exists(topic_name.namespace_name):
            raise TopicNotFoundError(f"Namespace {topic_name.namespace_name} does not exist")
        if self.topic_exists(topic_name):
            raise MetadataError(f"Topic {topic_name} already exists as a non-partitioned topic")
        self.namespaces.set_partitions(str(topic_name), partitions, create=True)
        await self._create_partitions(topic_name, 0, partitions)

    async def _create_partitions(self, name: TopicName, first: int, end: int) -> None:
        if name.is_persistent:
            for index in range(first, end):
                await self.get_topic(name.partition(index), create=True)

    async def update_partitioned_topic(self, name: str | TopicName, partitions: int) -> None:
        topic_name = self.parse_topic(name)
        current = self.namespaces.partitions(str(topic_name))
        if current == 0:
            raise TopicNotFoundError(f"Partitioned topic {topic_name} does not exist")
        if partitions <= current:
            raise NotAllowedError("The number of partitions can only grow")
        self.namespaces.set_partitions(str(topic_name), partitions, create=False)
        await self._create_partitions(topic_name, current, partitions)

    async def create_topic(self, name: str | TopicName) -> Topic:
        topic_name = self.parse_topic(name)
        if self.topic_exists(topic_name) or self.namespaces.partitions(str(topic_name)):
            raise MetadataError(f"Topic {topic_name} already exists")
        return await self.get_topic(topic_name, create=True, explicit=True)

    async def delete_topic(self, name: str | TopicName, *, force: bool = False) -> None:
        topic_name = self.parse_topic(name)
        topic = await self.get_topic(topic_name, create=False)
        await topic.delete(force=force)
        self.topics.pop(str(topic_name), None)
        if not topic_name.is_partitioned:  # a partition's schemas are its base's
            self.schemas.delete_all(topic_name)
        self.namespaces.delete_topic_policies(str(topic_name))
        if topic_name.is_persistent:
            self._topic_event(topic_name, False)

    async def unload_topic(self, name: str | TopicName) -> bool:
        """Unload a loaded topic (its clients reconnect and load it again); False when it
        was not loaded. A non-persistent topic loses what it held in memory."""
        topic_name = self.parse_topic(name)
        topic = self.topics.get(str(topic_name))
        if topic is None:
            return False
        try:
            if isinstance(topic, PersistentTopic):
                await topic.unload()
            else:
                await topic.delete(force=True)
        finally:
            if self.topics.get(str(topic_name)) is topic:
                del self.topics[str(topic_name)]
        log.info("topic %s unloaded", topic_name)
        return True

    async def terminate_topic(self, name: str | TopicName) -> tuple[int, int]:
        """Terminate a persistent topic; returns the (ledger id, entry id) of its last
        message.

        Raises:
            NotAllowedError: not a persistent topic.
            TopicNotFoundError: no such topic.
        """
        topic_name = self.parse_topic(name)
        if not topic_name.is_persistent:
            raise NotAllowedError("Termination of a non-persistent topic is not allowed")
        topic = await self.get_topic(topic_name, create=False)
        assert isinstance(topic, PersistentTopic)
        position = await topic.terminate()
        return position.ledger_id, position.entry_id

    async def delete_partitioned_topic(self, name: str | TopicName, *, force: bool = False,
                                       ) -> None:
        topic_name = self.parse_topic(name)
        partitions = self.namespaces.partitions(str(topic_name))
        if partitions == 0:
            raise TopicNotFoundError(f"Partitioned topic {topic_name} does not exist")
        for index in range(partitions):
            partition = topic_name.partition(index)
            if self.topic_exists(partition):
                await self.delete_topic(partition, force=force)
        self.namespaces.set_partitions(str(topic_name), 0, create=False)
        self.schemas.delete_all(topic_name)
        self.namespaces.delete_topic_policies(str(topic_name))

    def list_topics(self, namespace: str, mode: str = "PERSISTENT",
                    include_system: bool = False) -> list[str]:
        """Topics of a namespace (partitions listed, not partitioned bases), sorted."""
        found: set[str] = set()
        if mode in ("PERSISTENT", "ALL"):
            prefix = f"ml/{namespace}/persistent/".encode()
            for key, _ in self.storage.metadata.scan(prefix):
                local = key.decode()[len(prefix):]
                found.add(f"persistent://{namespace}/{unquote_plus(local)}")
        for name, topic in self.topics.items():
            if topic.name.namespace_name != namespace:
                continue
            if (topic.name.is_persistent and mode in ("PERSISTENT", "ALL")) or \
                    (not topic.name.is_persistent and mode in ("NON_PERSISTENT", "ALL")):
                found.add(name)
        return [name for name in sorted(found) if _listable(name, include_system)]

    def list_topics_matching(self, namespace: str, pattern: str, mode: str = "PERSISTENT",
                             ) -> list[str]:
        return [t for t in self.list_topics(namespace, mode)
                if matches_topics_pattern(pattern, t)]

    # -- producers and consumers -----------------------------------------------------------

    async def create_producer(self, name: str | TopicName, spec: ProducerSpec,
                              ) -> tuple[Topic, Producer]:
        topic = await self.get_topic(name, create=True)
        producer = topic.add_producer(spec)
        if producer.topic_epoch is not None:  # granted exclusive access: the epoch is stored
            try:                              # before the producer is told it
                await topic.epoch_durable()
            except BaseException:
                topic.remove_producer(producer)
                raise
        initial = spec.initial_subscription_name
        if initial and isinstance(topic, PersistentTopic) and initial not in topic.subscriptions:
            if not self.config.allow_auto_subscription_creation:
                topic.remove_producer(producer)
                raise NotAllowedError("Could not create the initial subscription: "
                                      "auto subscription creation is disabled")
            try:
                await topic.create_subscription(initial, "earliest")
            except BaseException:
                topic.remove_producer(producer)  # a failed creation leaves no producer behind
                raise
        return topic, producer

    async def subscribe(self, name: str | TopicName, spec: SubscribeSpec,
                        sink: ConsumerSink) -> tuple[Topic, Consumer]:
        topic = await self.get_topic(name, create=True)
        consumer = await topic.subscribe(spec, sink)
        return topic, consumer

    # -- policies --------------------------------------------------------------------------

    async def policies_changed(self, namespace: str | None = None) -> None:
        """Re-apply effective policies to loaded topics (of one namespace, or all)."""
        for topic in list(self.topics.values()):
            if namespace is not None and topic.name.namespace_name != namespace:
                continue
            if isinstance(topic, PersistentTopic):
                was = topic.dedup is not None
                topic.apply_policies()
                if topic.dedup_enabled() != was:
                    await topic._recover_dedup()
            else:
                topic.policies = self.namespaces.effective_policies(
                    str(topic.name), topic.name.namespace_name)
