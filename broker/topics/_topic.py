"""Persistent topics: a managed ledger, producers, subscriptions, deduplication. (Producers
and their admission: `_producer.py`; non-persistent topics: `_nonpersistent_topic.py`.)

Theory of operation
-------------------
Publishing to a persistent topic (`PersistentTopic.publish`):

1. checks: topic not fenced or terminated, message size, the delayed-delivery maximum;
2. deduplication (when enabled, never for system topics; broker reference §5), with the
   entry's highest sequence id from `highest_sequence_id_of` when the SEND states none: DUP
   answers with message id (-1, -1) and writes nothing; UNKNOWN (the same sequence id may
   still be in flight) fails with PersistenceError so the client resends;
3. the entry (the producer's metadata and payload, checksum included, as sent) is appended
   to the managed ledger, and the publish completes only when it is durable;
4. dedup records the persisted (highest) sequence id, and every 1000 entries snapshots the
   per-producer state into the `pulsar.dedup` cursor's properties (its mark-delete is the
   snapshot position). On load, the state is the snapshot plus a replay of every entry
   after it, so a restart or a crash loses nothing.
5. subscriptions are woken through the managed ledger's entries-added hook.

Producers: names are unique per topic (ProducerBusy); the access modes (Shared, Exclusive,
ExclusiveWithFencing, WaitForExclusive) and the topic epoch are `_access_modes.ExclusiveAccess`'s
business: a WaitForExclusive producer that must wait is returned with its `waiter` set and
is registered in `producers` only once promoted. The backlog quota is checked at creation
(broker reference §7.3).

A full disk: a publish that fails with StorageFullError closes its producer (CLOSE_PRODUCER:
a SEND_ERROR would make the official client drop the connection and resend in a loop), and
while the disk is full producers are refused with DiskFullError (ProducerBlockedQuota-
ExceededException on the wire), which the client reports to the pending sends' callers
before it retries with backoff; the service resumes writes once there is room.

Closing (`fenced`): while a topic closes, unloads or is deleted, new producers and consumers
get ServiceNotReady (the client retries and lands on the reloaded topic). A broker-side close
of a producer or consumer goes through `Producer.disconnect` / the consumer's sink, which the
connection turns into CLOSE_PRODUCER / CLOSE_CONSUMER (the client reconnects).

Termination (`terminate`): the managed ledger records its last position and takes no more
entries; producers are disconnected and refused with TopicTerminatedError from then on;
consumers read up to the last entry and then get nothing more (no REACHED_END_OF_TOPIC: the
C++ client cannot handle it, wire reference §10.5).

Read failure (`read_failed`): when a dispatcher finds stored entries it can never read (a
corrupt entry log or index: `CorruptionError`, `NoSuchEntryError`), the topic logs the error
(it names the file and offset), records it in `failure` (stats: `storageFailure`, metrics:
`pulsar_topic_storage_failed`), closes every consumer with CLOSE_CONSUMER and refuses new
subscriptions with NotAllowedError naming the failure: the official client then reports the
error instead of waiting for messages that never come. Producers and other topics are not
affected; unloading the topic (or a restart) clears the mark.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from .._errors import (
    ConsumerBusyError,
    DiskFullError,
    NotAllowedError,
    ProducerBusyError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicTerminatedError,
)
from .._names import TopicName
from .._namespaces import EffectivePolicies
from .._rates import NO_ADDS, AddInterval, RateMeter
from .._tasks import spawn
from ..dispatch._consumer import Consumer, ConsumerSink, SubscribeSpec
from ..dispatch._subscription import Subscription
from ..ledger._compacted import COMPACTION_CURSOR_NAME, CompactedLedger
from ..ledger._cursor import ManagedCursor
from ..ledger._managed_ledger import ManagedLedger, ManagedLedgerConfig
from ..ledger._position import Position
from ._access_modes import TOPIC_EPOCH_PROPERTY, ExclusiveAccess
from ._backlog import BacklogQuotas
from ._compaction import TopicCompaction
from ._dedup import (
    DEDUP_CURSOR_NAME,
    DeduplicationState,
)
from ._dedup_cursor import recover_dedup, write_dedup_snapshot
from ._entry_metadata import EntryMetadataAppender, interceptors_of
from ._producer import (
    Producer,
    ProducerSpec,
    PublishResult,
    _ProducerHost,
    generated_producer_name,
)
from ._publishing import Publisher, Send

if TYPE_CHECKING:
    from .._config import BrokerConfig
    from ._service import BrokerService

# Producer, ProducerSpec and PublishResult are `_producer`'s; listed here too, as this module
# is where users of a topic find them.
__all__ = ["PersistentTopic", "Producer", "ProducerSpec", "PublishResult", "Send"]

log = logging.getLogger(__name__)

RESERVED_SUBSCRIPTION_PREFIXES = ("pulsar.repl",)
SYSTEM_CURSOR_NAMES = (DEDUP_CURSOR_NAME, COMPACTION_CURSOR_NAME)  # not subscriptions


_SHARED_CONFIGS_MAX = 256  # distinct managed-ledger configs kept for sharing
_shared_configs: dict[ManagedLedgerConfig, ManagedLedgerConfig] = {}


def _shared(config: ManagedLedgerConfig) -> ManagedLedgerConfig:
    """One object per distinct (immutable) config, shared by the topics that use it."""
    shared = _shared_configs.get(config)
    if shared is None:
        if len(_shared_configs) >= _SHARED_CONFIGS_MAX:
            _shared_configs.clear()
        shared = _shared_configs[config] = config
    return shared


def _now_ms() -> float:
    """Wall-clock ms: the unit of `DeduplicationState`'s times."""
    return time.time() * 1000


class PersistentTopic(BacklogQuotas, _ProducerHost, Publisher):
    """A persistent topic (or one partition of a partitioned topic)."""

    __slots__ = ("_access", "_background", "_compaction", "add_interval",
                 "bytes_out_counter", "dedup", "entry_metadata", "failure", "fenced",
                 "managed_ledger", "msg_out_counter", "name", "policies",
                 "producers", "rate_in", "rate_out", "readers", "service", "subscriptions")

    def __init__(self, service: BrokerService, name: TopicName, ml: ManagedLedger):
        self.service = service
        self.name = name
        self.managed_ledger = ml
        self.subscriptions: dict[str, Subscription] = {}
        self.readers: dict[str, Subscription] = {}  # non-durable subscriptions
        self.producers: dict[str, Producer] = {}
        self.policies: EffectivePolicies = service.namespaces.effective_policies(
            str(name), name.namespace_name)
        self.dedup: DeduplicationState | None = None
        interceptors = interceptors_of(service.config.broker_entry_metadata_interceptors)
        self.entry_metadata = EntryMetadataAppender.open(
            interceptors, ml, lambda: int(service.clock() * 1000)) if interceptors else None
        self._dedup_recorded = ml.last_confirmed_position  # see _take_dedup_snapshot
        self._publishes_queued = 0
        self.fenced = False
        self.failure: str | None = None  # why the topic's entries cannot be read (read_failed)
        self._access: ExclusiveAccess | None = None  # made at the first use
        self.msg_in_counter = 0
        self.bytes_in_counter = 0
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.rate_in = RateMeter(time.monotonic())
        self.rate_out = RateMeter(time.monotonic())
        # The managed ledger's add latency and entry sizes over the last stats interval.
        self.add_interval: AddInterval = NO_ADDS
        self._background: set[asyncio.Task[Any]] | None = None  # made at the first task
        self._compaction: TopicCompaction | None = None  # made at the first use
        ml.on_entries_added += (self._entries_added,)

    @property
    def config(self) -> BrokerConfig:
        return self.service.config

    @property
    def access(self) -> ExclusiveAccess:
        """The access modes' state; made at the first use, dropped when the topic is found
        idle with it at rest (`idle`): its epoch is in the ML's properties."""
        if self._access is None:
            self._access = ExclusiveAccess(
                ExclusiveAccess.restored_epoch(self.managed_ledger.properties),
                self._persist_epoch)
        return self._access

    @access.setter
    def access(self, access: ExclusiveAccess) -> None:
        self._access = access

    def _persist_epoch(self, epoch: int) -> None:
        self.managed_ledger.set_property(TOPIC_EPOCH_PROPERTY, str(epoch))

    def idle(self) -> None:
        """The stats interval found the topic idle (no producer, no consumer): drop what the
        next producer would make again."""
        access = self._access
        if access is not None and not self.producers and access.holder is None and \
                not access.waiters and access.epoch == ExclusiveAccess.restored_epoch(
                    self.managed_ledger.properties):
            self._access = None

    @classmethod
    async def load(cls, service: BrokerService, name: TopicName) -> PersistentTopic:
        ml_config = ManagedLedgerConfig.from_broker_config(service.config)
        ml = await ManagedLedger.open(service.storage, name.persistence_name, ml_config,
                                      loader=service.loader)
        topic = cls(service, name, ml)
        topic.apply_policies()
        for cursor_name, cursor in ml.cursors.items():
            if cursor_name not in SYSTEM_CURSOR_NAMES:
                topic.subscriptions[cursor_name] = Subscription(topic, cursor_name, cursor)
        compaction = await TopicCompaction.load(topic)
        topic._compaction = compaction if compaction.view is not None else None
        await topic._recover_dedup()
        return topic

    def apply_policies(self) -> None:
        """Re-read the effective policies (after a namespace or topic policy change)."""
        self.policies = self.service.namespaces.effective_policies(
            str(self.name), self.name.namespace_name)
        self.managed_ledger.config = _shared(dataclasses.replace(
            self.managed_ledger.config,
            retention_time_minutes=self.policies.retention_time_minutes,
            retention_size_mb=self.policies.retention_size_mb))

    # -- deduplication ---------------------------------------------------------------------

    def dedup_enabled(self) -> bool:
        return self.policies.deduplication_enabled and not self.name.is_system_topic

    async def _recover_dedup(self) -> None:
        """Rebuild the dedup state from its cursor (`_dedup_cursor.recover_dedup`), or drop
        the cursor when deduplication is off."""
        ml = self.managed_ledger
        if not self.dedup_enabled():
            if DEDUP_CURSOR_NAME in ml.cursors:
                await ml.delete_cursor(DEDUP_CURSOR_NAME)
            self.dedup = None
            return
        state, cursor, last, replayed = await recover_dedup(ml, self.config, _now_ms())
        self.dedup = state
        self._dedup_recorded = last
        if replayed >= self.config.broker_deduplication_entries_interval:
            await self._take_dedup_snapshot(cursor)
        log.info("dedup state of %s recovered (%d entries replayed)", self.name, replayed)

    async def _take_dedup_snapshot(self, cursor: ManagedCursor | None = None) -> None:
        state = self.dedup
        cursor = cursor or self.managed_ledger.cursors.get(DEDUP_CURSOR_NAME)
        if state is None or cursor is None or state.snapshot_running:
            return
        # The last entry whose sequence ids are in the state (see `write_dedup_snapshot`).
        await write_dedup_snapshot(state, cursor, self._dedup_recorded, _now_ms)

    # -- producers -------------------------------------------------------------------------

    @property
    def terminated(self) -> bool:
        return self.managed_ledger.terminated_position is not None

    def add_producer(self, spec: ProducerSpec) -> Producer:
        """Admit a producer. A WaitForExclusive producer that has to wait comes back with
        its `waiter` set and is not yet in `producers`.

        Raises:
            ProducerBusyError: the name is taken, an exclusive producer excludes it, or the
                producer limit is reached.
            ProducerFencedError: its topic epoch is older than the topic's.
            ServiceNotReadyError: the topic is closing, or too many producers wait.
            TopicTerminatedError: the topic is terminated.
            ProducerBlockedQuotaExceededError/Exception: the backlog quota is exceeded.
        Nothing is left behind on failure (but an ExclusiveWithFencing producer has evicted
        the others even when it then fails).
        """
        if self.fenced:
            raise ServiceNotReadyError(f"Topic {self.name} is temporarily unavailable")
        if self.terminated:
            raise TopicTerminatedError(f"Topic {self.name} is terminated")
        self.service.stats_interval.touch(self)
        name = spec.producer_name or self._generated_name()
        if self._name_taken(name):
            raise ProducerBusyError(
                f"Producer with name '{name}' is already connected to topic '{self.name}'")
        limit = self.policies.max_producers_per_topic
        if limit > 0 and len(self.producers) >= limit:
            raise ProducerBusyError("Topic reached max producers limit")
        self._check_backlog_quota()
        if self.service.storage_full:
            raise DiskFullError(f"Cannot publish to {self.name}: the broker's disk is full "
                                f"({self.service.storage.failed})")
        return self._admit(Producer(self, spec, name, bool(spec.producer_name)))

    async def epoch_durable(self) -> None:
        await self.managed_ledger.record_durable()

    def _register(self, producer: Producer) -> None:
        super()._register(producer)
        if self.dedup is not None:
            self.dedup.producer_connected(producer.name)

    def _unregistered(self, producer: Producer) -> None:
        if self.dedup is not None:
            self.dedup.producer_disconnected(producer.name, _now_ms())

    def _generated_name(self) -> str:
        while True:
            name = generated_producer_name(self.config.cluster_name)
            if name not in self.producers:
                return name

    def last_sequence_id(self, producer: Producer) -> int:
        return self.dedup.last_sequence_id(producer.name) if self.dedup is not None else -1

    def _entries_added(self, position: Position) -> None:
        for subscription in self.subscriptions.values():
            subscription.kick()
        if self.readers:
            for subscription in self._non_durable_subscriptions():
                subscription.kick()

    def messages_out(self, messages: int, size: int) -> None:
        self.msg_out_counter += messages
        self.bytes_out_counter += size

    def acks_changed(self) -> None:
        """A cursor moved; trimming is the managed ledger's business."""

    def _spawn(self, work: Any) -> None:
        spawn(work, self.background, f"topic {self.name}")

    @property
    def background(self) -> set[asyncio.Task[Any]]:
        """The topic's background tasks (cancelled when it closes). Made at the first use:
        most topics have none, and an empty set takes 216 bytes."""
        if self._background is None:
            self._background = set()
        return self._background

    @property
    def compaction(self) -> TopicCompaction:
        """The compaction state; made at the first use, as most topics are never compacted
        (loading one with a compacted view makes it at once)."""
        if self._compaction is None:
            self._compaction = TopicCompaction(self, None)
        return self._compaction

    @property
    def compacted_view(self) -> CompactedLedger | None:
        return None if self._compaction is None else self._compaction.view

    # -- subscriptions ---------------------------------------------------------------------

    def _non_durable_subscriptions(self) -> list[Subscription]:
        return list(self.readers.values())

    async def subscribe(self, spec: SubscribeSpec, sink: ConsumerSink) -> Consumer:
        """Attach a consumer, creating the subscription when needed.

        Raises:
            NotAllowedError, ConsumerBusyError, ConsumerAssignError: as Pulsar answers.
        """
        if self.fenced:
            raise ServiceNotReadyError(f"Topic {self.name} is temporarily unavailable")
        if self.failure is not None:
            raise NotAllowedError(f"Topic {self.name} cannot be read: {self.failure}")
        self.service.stats_interval.touch(self)
        if not spec.subscription:
            raise NotAllowedError("Empty subscription name")
        if spec.subscription in SYSTEM_CURSOR_NAMES or \
                spec.subscription.startswith(RESERVED_SUBSCRIPTION_PREFIXES):
            raise NotAllowedError("Subscription with reserved subscription name attempted")
        limit = self.policies.max_consumers_per_topic
        if limit > 0 and self.consumer_count() >= limit:
            raise ConsumerBusyError("Topic reached max consumers limit")
        subscription = await self._subscription_for(spec)
        await subscription.wait_reset()
        consumer = Consumer(spec, sink, partition=self.name.partition_index)
        try:
            subscription.add_consumer(consumer)
        except BaseException:
            if not subscription.durable and not subscription.consumers:
                self._drop_reader(subscription)
            raise
        return consumer

    async def _subscription_for(self, spec: SubscribeSpec) -> Subscription:
        if not spec.durable:
            if spec.subscription in self.subscriptions:
                raise NotAllowedError("Durable subscription with the same name already exists.")
            return self._new_reader(spec)
        if spec.subscription in self.readers:
            raise NotAllowedError("NonDurable subscription with the same name already exists.")
        existing = self.subscriptions.get(spec.subscription)
        if existing is not None:
            return existing
        if not self.config.allow_auto_subscription_creation:
            raise SubscriptionNotFoundError(f"Subscription {spec.subscription} not found")
        return await self.create_subscription(spec.subscription, spec.initial_position,
                                              spec.subscription_properties,
                                              spec.start_message_rollback_duration_s)

    async def create_subscription(self, name: str, initial_position: str = "latest",
                                  properties: dict[str, str] | None = None,
                                  rollback_s: int = 0) -> Subscription:
        existing = self.subscriptions.get(name)
        if existing is not None:
            return existing
        if name in SYSTEM_CURSOR_NAMES:
            raise NotAllowedError("Subscription with reserved subscription name attempted")
        created = name not in self.managed_ledger.cursors
        cursor = await self.managed_ledger.open_cursor(
            name, "earliest" if initial_position == "earliest" else "latest")
        if properties:
            try:
                await cursor.set_cursor_properties(dict(properties))
            except BaseException:
                if created and name not in self.subscriptions:  # leave no cursor behind
                    await self.managed_ledger.delete_cursor(name)
                raise
        existing = self.subscriptions.get(name)
        if existing is not None:  # a concurrent subscribe created it while we awaited
            return existing
        subscription = Subscription(self, name, cursor)
        self.subscriptions[name] = subscription
        if rollback_s > 0:
            await subscription.reset_cursor_by_time(int(time.time() * 1000) - rollback_s * 1000)
        return subscription

    def _new_reader(self, spec: SubscribeSpec) -> Subscription:
        existing = self.readers.get(spec.subscription)
        if existing is not None:
            return existing
        start = None
        if spec.start_message_id is not None:
            ledger_id, entry_id, _ = spec.start_message_id
            start = Position(ledger_id, entry_id)
        cursor = self.managed_ledger.new_non_durable_cursor(
            start, "earliest" if spec.initial_position == "earliest" else "latest",
            name=spec.subscription)
        subscription = Subscription(self, spec.subscription, cursor)
        self.readers[spec.subscription] = subscription
        return subscription

    def _drop_reader(self, subscription: Subscription) -> None:
        if self.readers.get(subscription.name) is subscription:
            del self.readers[subscription.name]
            subscription.close()
            self.managed_ledger.release_non_durable_cursor(subscription.cursor)

    def consumer_closed(self, subscription: Subscription, consumer: Consumer) -> None:
        subscription.remove_consumer(consumer)
        if not subscription.durable and not subscription.consumers:
            self._drop_reader(subscription)

    def consumer_count(self) -> int:
        return sum(len(s.consumers) for s in self.all_subscriptions())

    def all_subscriptions(self) -> list[Subscription]:
        return list(self.subscriptions.values()) + self._non_durable_subscriptions()

    async def unsubscribe(self, name: str, consumer: Consumer | None = None,
                          force: bool = False) -> None:
        """Delete a subscription.

        Raises:
            SubscriptionNotFoundError: no such subscription.
            BrokerError (MetadataError): other consumers are connected and not forced.
        """
        subscription = self.subscriptions.get(name)
        if subscription is None:
            raise SubscriptionNotFoundError(f"Subscription {name} not found")
        others = [c for c in subscription.consumers if c is not consumer]
        if others and not force:
            from .._errors import MetadataError

            raise MetadataError("Unconnected or shared consumer attempting to unsubscribe")
        for other in subscription.consumers:
            subscription.remove_consumer(other)
            if other is not consumer:
                other.sink.close_consumer(other, "subscription deleted")
        subscription.close()
        del self.subscriptions[name]
        await self.managed_ledger.delete_cursor(name)

    # -- lifecycle -------------------------------------------------------------------------

    async def close(self) -> None:
        self.fenced = True
        for subscription in self.all_subscriptions():
            subscription.close()
        for task in list(self._background or ()):
            task.cancel()
        if self.dedup is not None and not self.managed_ledger.closed:
            try:
                await self._take_dedup_snapshot()
            except Exception as exc:  # closing anyway; replay covers what is missing
                log.warning("final dedup snapshot of %s failed: %s", self.name, exc)
        await self.managed_ledger.close()

    async def terminate(self) -> Position:
        """Terminate the topic: no more messages (see the module docstring). Returns the
        last message's position. Idempotent.

        Raises:
            ServiceNotReadyError: the topic is closing.
            BrokerError: the managed ledger failed (see `ManagedLedger.terminate`).
        """
        if self.fenced:
            raise ServiceNotReadyError(f"Topic {self.name} is temporarily unavailable")
        position = await self.managed_ledger.terminate()
        self.disconnect_producers("topic terminated")
        return position

    def read_failed(self, error: BaseException, subscription: Subscription) -> None:
        """A dispatcher cannot read the topic's entries, for good (see the module comment).
        Every consumer is closed; the topic stays loaded, marked failed, until unloaded."""
        if self.failure is None:
            self.failure = f"{type(error).__name__}: {error}"
            log.error("topic %s failed: subscription %s cannot read its entries: %s; closing "
                      "its consumers and refusing new ones until it is unloaded", self.name,
                      subscription.name, self.failure)
        reason = f"topic cannot be read: {self.failure}"
        for sub in self.all_subscriptions():
            for consumer in list(sub.consumers):
                sub.remove_consumer(consumer)
                consumer.sink.close_consumer(consumer, reason)

    def _disconnect_all(self, reason: str) -> None:
        self.disconnect_producers(reason)
        for subscription in self.all_subscriptions():
            for consumer in list(subscription.consumers):
                subscription.remove_consumer(consumer)
                consumer.sink.close_consumer(consumer, reason)

    async def unload(self) -> None:
        """Close the topic with every producer and consumer told to reconnect (they come
        back to the topic reloaded). What is durable stays; the caller forgets the topic."""
        self.fenced = True
        self._disconnect_all("topic unloaded")
        await self.close()

    async def delete(self, force: bool = False) -> None:
        """Delete the topic; with clients connected only when forced (each is told, with
        CLOSE_PRODUCER / CLOSE_CONSUMER, and reconnects: to a new topic when automatic
        creation is on).

        Raises:
            NotAllowedError: clients are connected and not forced; nothing changed.
        """
        if (self.producers or self.consumer_count()) and not force:
            raise NotAllowedError(f"Topic {self.name} has active producers or consumers")
        self.fenced = True
        self._disconnect_all("topic deleted")
        for subscription in self.all_subscriptions():
            subscription.close()
        for task in list(self._background or ()):
            task.cancel()
        await self.compaction.delete()
        await self.managed_ledger.delete()
