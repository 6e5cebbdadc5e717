"""A subscription: a cursor, a dispatcher, and what sits between them.

Theory of operation
-------------------
The cursor (`_cursor.py`) is the subscription's durable state: what is acknowledged, where
reading continues. The dispatcher (`_dispatcher.py` and its subclasses) decides which
consumer receives which entry. The subscription glues them and adds:

* the subscription-type rules of broker reference §3.1 (a type is fixed while consumers are
  connected; Exclusive admits one consumer; the dispatcher is replaced when the type or the
  Key_Shared policy changes while nobody is connected);
* tag filtering (TDMQ): a subscription whose properties name tags receives only messages
  carrying one of those tags (message properties whose value is "TAGS") plus every untagged
  message; a message it does not want is acknowledged on its behalf;
* delayed delivery for Shared and Key_Shared: an entry whose `deliver_at_time` is beyond the
  tracker's cut-off is held by the `InMemoryDelayedDeliveryTracker` and handed back to the
  dispatcher's replay queue when due. The tracker holds positions only; the entries stay in
  the ledger, and after a restart the tracker is rebuilt by re-reading from the
  mark-delete position;
* redelivery counts, per entry, cleared on ack and on a seek; they live in the cursor
  (`_redelivery.py`), which persists them. Pulsar drops them when the last consumer of a
  Shared/Key_Shared subscription leaves; here they are kept when that happens because the
  broker stops or the topic unloads (the consumers did not choose to leave), so a restart
  keeps counting towards the client's dead-letter limit;
* acknowledgements: individual, cumulative, and batch-index ack sets, applied to the cursor
  and then reported to the dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .._errors import ConsumerBusyError, NotAllowedError, SubscriptionBusyError
from .._rates import RateMeter
from .._tasks import spawn
from ..ledger._cursor import ManagedCursor
from ..ledger._position import (
    Position,
    ack_set_to_int,
    ack_set_words_max,
    int_to_ack_set,
    unacked_in_ack_set,
)
from ._compacted_read import CompactedReads
from ._consumer import Consumer, SubscribeSpec
from ._delayed import DelayedAdd, InMemoryDelayedDeliveryTracker
from ._dispatch_key_shared import KeySharedDispatcher
from ._dispatch_shared import SharedDispatcher
from ._dispatcher import Dispatcher, SingleActiveConsumerDispatcher
from ._entry import EntryInfo
from ._reads import SubscriptionReads

if TYPE_CHECKING:
    from .._config import BrokerConfig
    from ._parent import SubscriptionParent

__all__ = ["Subscription"]

log = logging.getLogger(__name__)

ACK_INDIVIDUAL = 0
ACK_CUMULATIVE = 1


class Subscription:
    """One subscription of a persistent topic."""

    __slots__ = ("_background", "_compacted", "_partition", "_reset_done", "bytes_out_counter",
                 "cursor", "delayed", "dispatcher", "last_consumed_flow_timestamp",
                 "last_expire_timestamp", "msg_out_counter", "name", "rate_out", "reads", "topic",
                 "total_msg_expired")

    def __init__(self, topic: SubscriptionParent, name: str, cursor: ManagedCursor):
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.dispatcher: Dispatcher | None = None
        self.reads = SubscriptionReads(cursor, self.kick)
        self.delayed: InMemoryDelayedDeliveryTracker | None = None
        self._background: set[asyncio.Task[Any]] | None = None  # made at the first task
        self._reset_done: asyncio.Event | None = None  # set while a reset runs
        self.last_expire_timestamp = 0
        self.total_msg_expired = 0
        self.last_consumed_flow_timestamp = 0
        self.msg_out_counter = 0  # messages dispatched by this subscription, ever
        self.bytes_out_counter = 0
        self.rate_out = RateMeter(time.monotonic())  # msgRateOut, msgThroughputOut
        self._compacted: CompactedReads | None = None  # made at the first read_compacted
        self._partition: int | None = None  # the topic's partition index, once asked

    # -- what the dispatcher asks ----------------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        return self.topic.config

    @property
    def partition(self) -> int:
        if self._partition is None:  # a topic's name never changes: parsed once
            self._partition = self.topic.name.partition_index
        return self._partition

    @property
    def topic_name(self) -> str:
        return str(self.topic.name)

    @property
    def durable(self) -> bool:
        return self.cursor.durable

    @property
    def consumers(self) -> list[Consumer]:
        return list(self.dispatcher.consumers) if self.dispatcher is not None else []

    @property
    def tags(self) -> frozenset[str]:
        return frozenset(self.cursor.cursor_properties)

    def max_unacked_per_consumer(self) -> int:
        return self.topic.policies.max_unacked_messages_per_consumer if self.durable else 0

    def max_unacked_per_subscription(self) -> int:
        return self.topic.policies.max_unacked_messages_per_subscription if self.durable else 0

    def now_ms(self) -> int:
        """The service's clock in ms: delayed delivery and TTL follow it, so a test or the
        simulation can run them on virtual time."""
        return int(self.topic.service.clock() * 1000)

    def mark_delete_position(self) -> Position:
        return self.cursor.mark_delete_position

    def is_acked(self, position: Position) -> bool:
        return self.cursor.is_acked(position)

    def ack_set_for(self, position: Position) -> list[int] | None:
        words = self.cursor.get_ack_set(position)
        compacted = self._compacted  # a compacted batch: dropped messages count as acked
        live = None if compacted is None else compacted.masks.get(position)
        if live is None:
            return words
        return int_to_ack_set(live if words is None else live & ack_set_to_int(words))

    @property
    def compacted(self) -> CompactedReads:
        """The read_compacted consumers' reads (made at the first use: most have none)."""
        if self._compacted is None:
            self._compacted = CompactedReads(self)
        return self._compacted

    def _restart_compacted(self) -> None:
        if self._compacted is not None:
            self._compacted.restart()

    def rewind(self) -> None:
        self._restart_compacted()
        self.cursor.rewind()

    def redelivery_count(self, position: Position) -> int:
        return self.cursor.redelivery.get(position)

    def increment_redelivery_count(self, position: Position) -> None:
        if self.config.subscription_redelivery_tracker_enabled:
            self.cursor.count_redelivery(position)

    def clear_redelivery_counts(self) -> None:
        """The last consumer left: forget the counts, unless the broker is stopping or the
        topic is closing (see the module docstring)."""
        if self.topic.fenced or self.topic.service.stopping:
            return
        self.cursor.clear_redelivery_counts()

    def clear_delayed(self) -> None:
        if self.delayed is not None:
            self.delayed.clear()

    def due_delayed(self, max_messages: int) -> list[Position]:
        if self.delayed is None or not self.delayed.has_message_available():
            self._arm_delayed_timer()
            return []
        due = [Position(*p) for p in self.delayed.get_scheduled_messages(max_messages)]
        self._arm_delayed_timer()
        return due

    def _arm_delayed_timer(self) -> None:
        if self.delayed is None or self.dispatcher is None:
            return
        at = self.delayed.next_delivery_time()
        if at is not None:
            self.dispatcher.kick_later(max(0.0, (at - self.now_ms()) / 1000.0))

    def messages_dispatched(self, consumer: Consumer, messages: int, deliveries: list[Any]) -> None:
        size = sum(len(d.entry) for d in deliveries)
        self.msg_out_counter += messages
        self.bytes_out_counter += size
        self.topic.messages_out(messages, size)

    # -- reading ---------------------------------------------------------------------------

    def read_new(self, max_entries: int, *, honour_delay: bool) -> tuple[list[EntryInfo], bool]:
        """Read entries past the cursor's read position; returns (entries to dispatch,
        whether anything was read at all).

        Raises:
            ReadPending: the read went to the loader (see `_reads.py`); nothing changed.
        """
        if self.delayed is not None and self.delayed.should_pause_all_deliveries():
            return [], False
        raw = None if self._compacted is None else self._compacted.read(max_entries)
        if raw == []:
            return [], False  # a compacted read is under way; it kicks when it lands
        if raw is None:
            raw = self.reads.read_new(max_entries, self.config.dispatcher_max_read_size_bytes)
        entries = [EntryInfo(position, data) for position, data in raw]
        return self._filter(entries, honour_delay), bool(raw)

    def read_positions(self, positions: list[Position]) -> tuple[list[EntryInfo],
                                                                 list[Position]]:
        """Read specific entries (replay), skipping acknowledged ones: (entries to dispatch,
        the positions dealt with, which leave the replay queue; the others stay).

        Raises:
            ReadPending: the read went to the loader (see `_reads.py`); nothing changed.
        """
        raw, done = self.reads.read_positions(positions,
                                              self.config.dispatcher_max_read_size_bytes)
        entries = [EntryInfo(position, data) for position, data in raw]
        return self._filter(entries, honour_delay=False), done

    def _filter(self, entries: list[EntryInfo], honour_delay: bool) -> list[EntryInfo]:
        tags = self.tags
        delayed = self.delayed if honour_delay else None
        if not tags and delayed is None:
            return entries  # nothing to filter out
        out: list[EntryInfo] = []
        rejected: list[Position] = []
        for index, entry in enumerate(entries):
            if tags:
                entry_tags = entry.tags()
                if entry_tags and not entry_tags & tags:
                    rejected.append(entry.position)
                    continue
            if delayed is not None and (deliver_at := entry.deliver_at) is not None:
                outcome = delayed.add(entry.position.ledger_id, entry.position.entry_id,
                                      deliver_at)
                if outcome is DelayedAdd.TRACKED:
                    continue
                if outcome is DelayedAdd.OVERFLOW:
                    self.cursor.seek(entries[index].position)
                    break
            out.append(entry)
        if rejected:
            self._spawn(self._auto_ack(rejected))
        if delayed is not None:
            self._arm_delayed_timer()
        return out

    async def _auto_ack(self, positions: list[Position]) -> None:
        await self.cursor.delete(positions)
        self._after_ack(None, positions, 0, moved=True)

    def _spawn(self, work: Any) -> None:
        if self._background is None:
            self._background = set()
        spawn(work, self._background, f"subscription {self.topic_name}/{self.name}")

    # -- consumers -------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach a consumer.

        Raises:
            NotAllowedError: the subscription type is disabled.
            ConsumerBusyError: Exclusive already taken, a different type is connected, or
                the consumer limit is reached.
            ConsumerAssignError: Key_Shared refused its ranges.
        """
        spec = consumer.spec
        enabled = self.topic.policies.subscription_types_enabled
        if spec.sub_type not in enabled and not self.topic.name.is_system_topic:
            raise NotAllowedError(
                f"Topic[{self.topic_name}] doesn't support {spec.sub_type} sub type!")
        if spec.read_compacted and spec.sub_type not in ("Exclusive", "Failover"):
            raise NotAllowedError("Read compacted can only be used with exclusive or failover "
                                  "persistent subscriptions")
        dispatcher = self._dispatcher_for(spec)
        if dispatcher.consumers:
            if dispatcher.sub_type == "Exclusive":
                raise ConsumerBusyError("Exclusive consumer is already connected")
            limit = self.topic.policies.max_consumers_per_subscription
            if limit > 0 and len(dispatcher.consumers) >= limit:
                raise ConsumerBusyError("Subscription reached max consumers limit")
        if spec.read_compacted != (self._compacted is not None and self._compacted.enabled):
            self.compacted.enabled = spec.read_compacted
            self.compacted.restart()
        dispatcher.add_consumer(consumer)

    def _dispatcher_for(self, spec: SubscribeSpec) -> Dispatcher:
        current = self.dispatcher
        if current is not None and current.consumers:
            if current.sub_type != spec.sub_type:
                raise ConsumerBusyError("Subscription is of different type")
            return current
        if current is not None and self._same_policy(current, spec):
            return current
        if current is not None:
            current.close()
        self.dispatcher = self._new_dispatcher(spec)
        return self.dispatcher

    @staticmethod
    def _same_policy(current: Dispatcher, spec: SubscribeSpec) -> bool:
        if current.sub_type != spec.sub_type:
            return False
        if isinstance(current, KeySharedDispatcher):
            mode = spec.key_shared_mode if spec.has_key_shared_meta else "AUTO_SPLIT"
            return (current.key_shared_mode == mode
                    and current.allow_out_of_order == spec.allow_out_of_order_delivery)
        return True

    def _new_dispatcher(self, spec: SubscribeSpec) -> Dispatcher:
        self.delayed = None
        if spec.sub_type in ("Exclusive", "Failover"):
            return SingleActiveConsumerDispatcher(self, spec.sub_type)
        if self.topic.policies.delayed_delivery_enabled:
            self.delayed = InMemoryDelayedDeliveryTracker(
                self.now_ms, tick_time_ms=self.topic.policies.delayed_delivery_tick_ms,
                strict=self.config.delayed_delivery_deliver_at_time_strict,
                tracked_messages_max=self.config.delayed_delivery_tracked_in_memory_max)
        if spec.sub_type == "Shared":
            return SharedDispatcher(self)
        sticky = spec.has_key_shared_meta and spec.key_shared_mode == "STICKY"
        return KeySharedDispatcher(self, sticky=sticky,
                                   allow_out_of_order=spec.allow_out_of_order_delivery)

    def remove_consumer(self, consumer: Consumer) -> None:
        consumer.closed = True
        if self.dispatcher is not None:
            self.dispatcher.remove_consumer(consumer)

    def flow(self, consumer: Consumer, permits: int) -> None:
        self.last_consumed_flow_timestamp = self.now_ms()
        if self.dispatcher is not None:
            self.dispatcher.flow(consumer, permits)

    def redeliver(self, consumer: Consumer, positions: list[tuple[int, int]] | None) -> None:
        if self.dispatcher is not None:
            self.dispatcher.redeliver(consumer, positions)

    def kick(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.kick()

    # -- acknowledgements ------------------------------------------------------------------

    async def acknowledge(self, consumer: Consumer | None, ack_type: int,
                          acks: list[tuple[int, int, list[int] | None]]) -> None:
        """Apply a CommandAck: (ledger, entry, ack set or None) per message id. Returns once
        the cursor change is durable (durable subscriptions)."""
        if ack_type == ACK_CUMULATIVE:
            await self._ack_cumulative(consumer, acks)
        else:
            await self._ack_individual(consumer, acks)
        if consumer is not None:
            consumer.message_ack_counter += len(acks)
            consumer.last_acked_timestamp = self.now_ms()

    async def _ack_individual(self, consumer: Consumer | None,
                              acks: list[tuple[int, int, list[int] | None]]) -> None:
        whole: list[Position] = []
        remaining: dict[tuple[int, int], int] = {}  # unacked messages of partial batches
        if not self.cursor.batch_deleted and all(words is None for _, _, words in acks):
            whole = [Position(ledger_id, entry_id) for ledger_id, entry_id, _ in acks]
            acks = []  # whole entries, none of them partially acknowledged: nothing to count
        for ledger_id, entry_id, ack_set in acks:
            position = Position(ledger_id, entry_id)
            if ack_set is None or not self.config.acknowledgment_at_batch_index_level_enabled:
                if ack_set is None:
                    whole.append(position)
                    if self.cursor.get_ack_set(position) is not None:
                        remaining[(ledger_id, entry_id)] = self._unacked_in_batch(
                            position, await self._batch_size(consumer, position))
                continue
            size = await self._checked_batch_size(consumer, position, ack_set)
            before = self._unacked_in_batch(position, size)
            await self.cursor.delete_batch_index(position, ack_set, size)
            if self.cursor.is_acked(position):
                whole.append(position)
                remaining[(ledger_id, entry_id)] = before
            elif self.dispatcher is not None and isinstance(self.dispatcher, SharedDispatcher) \
                    and consumer is not None:
                newly = before - self._unacked_in_batch(position, size)
                self.dispatcher.batch_index_acked(consumer, max(0, newly),
                                                  (ledger_id, entry_id))
        if whole:
            mark = self.cursor.mark_delete_position
            await self.cursor.delete(whole)
            self._after_ack(consumer, whole, 0, moved=self.cursor.mark_delete_position != mark,
                            remaining=remaining)

    async def _ack_cumulative(self, consumer: Consumer | None,
                              acks: list[tuple[int, int, list[int] | None]]) -> None:
        if isinstance(self.dispatcher, SharedDispatcher):
            log.debug("ignoring a cumulative ack on %s subscription %s",
                      self.dispatcher.sub_type, self.name)
            return
        if not acks:
            return
        ledger_id, entry_id, ack_set = acks[-1]
        position = Position(ledger_id, entry_id)
        # Already mark-deleted: upstream logs it and the client hears nothing. With an ack
        # set the cursor would mark-delete the entry before `position`, so `position` at
        # the mark-delete (the rest of its batch was acked meanwhile) is old news too.
        mark_delete = self.cursor.mark_delete_position
        if position < mark_delete or (ack_set is not None and position == mark_delete):
            log.debug("ignoring a cumulative ack of %s at or below the mark-delete %s on %s",
                      position, mark_delete, self.name)
            return
        size = await self._checked_batch_size(consumer, position, ack_set) if ack_set else None
        await self.cursor.mark_delete(position, ack_set=ack_set, batch_size=size)
        self._after_ack(consumer, [], 0, moved=True)

    def _after_ack(self, consumer: Consumer | None, positions: list[Position], messages: int,
                   moved: bool, remaining: dict[tuple[int, int], int] | None = None) -> None:
        self.cursor.redelivery.discard(positions)
        if self.dispatcher is not None:
            self.dispatcher.acked(consumer, positions, messages, remaining)
            if moved:
                self.dispatcher.mark_delete_moved()
        self.topic.acks_changed()

    async def _batch_size(self, consumer: Consumer | None, position: Position) -> int:
        if consumer is not None and consumer.pending_acks is not None:
            found = consumer.pending_acks.get(position.ledger_id, position.entry_id)
            if found is not None:
                return int(found.batch_size)
        data = await self.topic.managed_ledger.read_entry_async(position)
        return EntryInfo(position, data).batch_size

    async def _checked_batch_size(self, consumer: Consumer | None, position: Position,
                            ack_set: list[int]) -> int:
        """The batch size of the entry an ack set refers to, once the ack set is found to fit
        it -- before any work in proportion to the ack set's length.

        Raises:
            InvalidPositionError: `position` is not an entry of the topic.
            NotAllowedError: the ack set has more words than the batch has messages.
            (Nothing changed.)
        """
        size = await self._batch_size(consumer, position)
        if len(ack_set) > ack_set_words_max(size):
            raise NotAllowedError(
                f"Ack set of {len(ack_set)} words for {position}, a batch of {size} messages "
                f"(at most {ack_set_words_max(size)} words)")
        return size

    def _unacked_in_batch(self, position: Position, size: int) -> int:
        words = self.cursor.get_ack_set(position)
        if words is None:
            return 0 if self.cursor.is_acked(position) else size
        return unacked_in_ack_set(words, size)

    # -- cursor operations -----------------------------------------------------------------

    def disconnect_for_reset(self) -> None:
        """Before a seek: all consumers for Shared/Key_Shared, the active one otherwise."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            return
        if isinstance(dispatcher, SingleActiveConsumerDispatcher):
            victims = [dispatcher.active] if dispatcher.active is not None else []
        else:
            victims = list(dispatcher.consumers)
        for consumer in victims:
            if consumer is None:
                continue
            self.remove_consumer(consumer)
            consumer.sink.close_consumer(consumer, "subscription reset")

    async def reset_cursor(self, position: Position, ack_set: list[int] | None = None) -> None:
        """Seek by message id (§4.7): delivery restarts AT `position`; `ack_set` (a batch
        id's `CommandSeek.ack_set`) marks the indexes before it acknowledged.

        Raises:
            SubscriptionBusyError: another reset is running (nothing changed).
        """
        ml = self.topic.managed_ledger
        if ack_set and ml.is_valid_position(position):  # no more words than the batch needs
            size = EntryInfo(position, await ml.read_entry_async(position)).batch_size
            ack_set = ack_set[:ack_set_words_max(size)]
        async with self._resetting():
            self.disconnect_for_reset()
            await self.cursor.reset(position, ack_set)
            self._restart_compacted()
            self._after_reset()

    async def reset_cursor_by_time(self, timestamp_ms: int) -> None:
        """Seek by publish time (§4.7); raises SubscriptionBusyError as `reset_cursor`."""
        async with self._resetting():
            self.disconnect_for_reset()
            await self.cursor.reset_by_time(timestamp_ms, entry_publish_time)
            self._restart_compacted()
            self._after_reset()

    @contextlib.asynccontextmanager
    async def _resetting(self) -> AsyncIterator[None]:
        """One reset at a time; consumers that subscribe meanwhile wait (`wait_reset`)."""
        if self._reset_done is not None:
            raise SubscriptionBusyError("Failed to fence subscription")
        done = self._reset_done = asyncio.Event()
        try:
            yield
        finally:
            self._reset_done = None
            done.set()

    async def wait_reset(self) -> None:
        """Return once no reset is running (at once when none is)."""
        while self._reset_done is not None:
            await self._reset_done.wait()

    def _after_reset(self) -> None:
        self.cursor.clear_redelivery_counts()
        self.clear_delayed()
        if isinstance(self.dispatcher, SharedDispatcher):
            self.dispatcher.replay.clear()
        if self.dispatcher is not None:
            self.dispatcher.mark_delete_moved()

    async def skip(self, count: int) -> None:
        await self.cursor.skip_entries(count)
        self._after_ack(None, [], 0, moved=True)

    async def clear_backlog(self) -> None:
        await self.cursor.clear_backlog()
        self.clear_delayed()
        self._after_ack(None, [], 0, moved=True)

    async def expire_messages(self, ttl_s: int) -> int:
        """Mark-delete over every entry published more than `ttl_s` ago; returns the number
        of entries expired."""
        ml = self.topic.managed_ledger
        cutoff = self.now_ms() - ttl_s * 1000  # expired: now > publish time + ttl (§7.2)
        newest = self._expired_closed_ledgers_end(cutoff)
        start = self.cursor.mark_delete_position if newest is None else newest
        found = await ml.find_newest_matching(lambda data: entry_publish_time(data) < cutoff,
                                        start=ml.next_valid_position(start))
        newest = found or newest
        if newest is None or newest <= self.cursor.mark_delete_position:
            return 0
        before = self.cursor.backlog()
        await self.cursor.expire_until(newest)
        expired = before - self.cursor.backlog()
        self.total_msg_expired += expired
        self.last_expire_timestamp = self.now_ms()
        self._after_ack(None, [], 0, moved=True)
        return expired

    def _expired_closed_ledgers_end(self, cutoff_ms: int) -> Position | None:
        """TTL's first step (§7.2): the last entry of the last closed ledger, from the
        mark-delete's ledger on, whose close time and every earlier one's is before
        `cutoff_ms` — whole ledgers expire by their close time whatever the publish times
        inside say. None when the first such ledger is not expired."""
        md_ledger = self.cursor.mark_delete_position.ledger_id
        end: Position | None = None
        for ledger in self.topic.managed_ledger.ledgers()[:-1]:  # the last one is open
            if ledger.ledger_id < md_ledger or ledger.entries == 0:
                continue
            if not 0 < ledger.timestamp_ms < cutoff_ms:
                break
            end = Position(ledger.ledger_id, ledger.entries - 1)
        return end

    def backlog(self) -> int:
        return int(self.cursor.backlog())

    def close(self) -> None:
        self.reads.close()
        if self.dispatcher is not None:
            self.dispatcher.close()
        for task in list(self._background or ()):
            task.cancel()

    def read_failed(self, error: BaseException) -> None:
        """The dispatcher cannot read this subscription's entries, for good: the topic
        fails (see `PersistentTopic.read_failed`)."""
        self.topic.read_failed(error, self)


def entry_publish_time(data: bytes) -> int:
    """The time (ms) seek by time and TTL compare: the broker timestamp of an entry stored with
    one, else the producer's publish time."""
    return EntryInfo(Position(0, 0), data).timestamp
