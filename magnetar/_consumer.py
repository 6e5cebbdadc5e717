"""The consumer core for one topic (or one partition): receive path, permits, acks, redelivery.

Theory of operation
-------------------
A `TopicConsumer` is one subscription's consumer on one concrete topic. Its `ConsumerGroup`
(`_group.py`) owns the receiver queue the application reads, and may hold many of them (a
partitioned topic, a list of topics, a pattern). Everything runs on the client's loop.

Zero-size queue (`receiver_queue_size=0`, one topic only): no permits are granted ahead;
while the application waits in `receive` and nothing is queued, the consumer asks for one
entry (a FLOW of 1) and asks again once it arrived if the wait goes on (its messages were
skipped). A receive that timed out leaves its permit asked: what arrives later is queued.

Receive path. After subscribing, the consumer grants `receiver_queue_size` permits (FLOW). The
transport calls `on_message` for each delivered entry: stale epochs are dropped, chunks go to
codec's `ChunkAssembler` until their message is whole, batches are decompressed and unpacked
(`codec.unpack_messages`), messages already acknowledged (the entry's `ack_set`), compacted
out, or before the start id (readers, seeks) are skipped, and the rest join the group's queue.
The usual batch -- uncompressed, bare bodies (`codec.plain_batch_starts`), nothing acknowledged
or screened by a start id -- is queued without being decoded (`_message.lazy_messages`).
Each message the application takes, and each one skipped here, gives back one permit; they go
to the broker in one FLOW once half the queue's worth has gathered.

Acks. Without batch-index acks, a batch entry is acknowledged on the broker once all its
messages are (`_batches` keeps the indexes still unacked); with them, partial acks carry the
entry's ack set (bit set = still unacknowledged). A cumulative ack in the middle of a batch
acknowledges up to the entry before (or, with batch-index acks, the batch's prefix). Acks are
grouped: individual ones gather in `_pending_acks`, the cumulative one keeps only the highest,
and both go out after `ACK_GROUP_MS` or at `ACK_GROUP_MAX` pending, and before anything that
depends on them (redelivery, seek, unsubscribe, close).

Redelivery. A negative ack (`_NackTracker`) or an ack timeout (`_UnackedTracker`) asks for
entry-level redelivery once due: Shared and Key_Shared consumers name the entries; Exclusive
and Failover ones cannot, and redeliver everything unacknowledged instead (`redeliver_all`):
the epoch grows, the queued messages are dropped and their permits returned, and deliveries
stamped with an older epoch are ignored when they arrive.

Broker closes (a seek, a topic unload) drop this consumer's queued messages and resubscribe in
the background with backoff until it succeeds or the consumer is closed.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from magnetar.codec import (
    EARLIEST,
    LATEST,
    ChunkAssembler,
    MessageId,
    ProtocolError,
    SingleMessage,
    decompress,
    plain_batch_starts,
    unpack_messages,
)

from ._dead_letter import ConsumerDeadLetterPolicy, DeadLetters
from ._errors import PulsarException
from ._message import Message, Received, lazy_messages, received_message
from ._message_id import trusted_id
from ._transport import Incoming, KeySharedPolicy, SubscribeRequest, Transport

if TYPE_CHECKING:
    from ._group import ConsumerGroup

__all__ = ["ConsumerConfig", "TopicConsumer"]

log = logging.getLogger(__name__)

ACK_GROUP_MS: Final = 100  # grouped acks leave at most this long after the first one
ACK_GROUP_MAX: Final = 1000  # ... or at once when this many are pending
RESUBSCRIBE_BACKOFF_S_MAX: Final = 2.0
TRACKER_TICK_S_MAX: Final = 1.0  # nack and ack-timeout timers look at least this often
_MASK64: Final = (1 << 64) - 1

EntryKey = tuple[int, int]
_COMPACTED_OUT: Final = operator.attrgetter("compacted_out")  # of a SingleMessage


@dataclass(frozen=True)
class ConsumerConfig:
    """What every per-topic consumer of one group shares."""

    subscription: str
    sub_type: str = "Exclusive"
    consumer_name: str = ""
    initial_position: str = "latest"
    receiver_queue_size: int = 1000
    negative_ack_delay_ms: int = 60_000
    ack_timeout_ms: int = 0
    batch_index_ack: bool = False
    durable: bool = True
    start_message_id: MessageId | None = None
    start_inclusive: bool = False
    properties: dict[str, str] = field(default_factory=dict)
    max_pending_chunked_message: int = 10
    auto_ack_oldest_chunked_message_on_queue_full: bool = False
    dead_letter_policy: ConsumerDeadLetterPolicy | None = None
    retry_enable: bool = False
    key_shared: KeySharedPolicy | None = None

    @property
    def redelivers_by_id(self) -> bool:
        return self.sub_type in ("Shared", "Key_Shared")


def _ack_set(unacked: set[int], size: int) -> list[int]:
    """The wire ack set of a batch: int64 words, bit i set while message i is unacked."""
    words = [0] * ((size + 63) // 64)
    for index in unacked:
        words[index // 64] |= 1 << (index % 64)
    return [w - (1 << 64) if w >= 1 << 63 else w for w in words]


def _acked_indexes(ack_set: list[int], size: int) -> set[int]:
    """The indexes an entry's ack set marks acknowledged (missing words: none acked)."""
    words = [w & _MASK64 for w in ack_set]
    return {i for i in range(size)
            if i // 64 < len(words) and not (words[i // 64] >> (i % 64)) & 1}


class TopicConsumer:
    """One consumer on one concrete topic (see the module comment)."""

    def __init__(self, group: ConsumerGroup, transport: Transport, consumer_id: int,
                 topic: str, partition: int, config: ConsumerConfig, queue_size: int):
        self.group = group
        self.transport = transport
        self.consumer_id = consumer_id
        self.topic = topic
        self.partition = partition
        self.config = config
        self.queue_size = max(1, queue_size)
        self.zero_queue = config.receiver_queue_size == 0
        self._asked = False  # zero queue: one permit is out, and its entry did not come yet
        self.epoch = 0
        # Bumped whenever messages handed out but not yet read become stale (a broker close, a
        # redeliver-all): the synchronous API's read-ahead drops those (`_client.Consumer`).
        self.generation = 0
        self.connected = asyncio.Event()
        self.closed = False
        self.start_id = config.start_message_id
        self._last_taken: Message | None = None
        self._permits = 0
        self._batches: dict[EntryKey, tuple[set[int], int]] = {}  # unacked indexes, size
        self._pending_acks: dict[EntryKey, list[int] | None] = {}
        self._pending_cumulative: tuple[EntryKey, list[int] | None] | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        self._nacks: dict[EntryKey, float] = {}  # entry -> due (monotonic s)
        self._unacked: dict[EntryKey, float] = {}  # entry -> ack deadline (monotonic s)
        self._tracker_timer: asyncio.TimerHandle | None = None
        self._chunks = ChunkAssembler(
            pending_chunked_messages_max=config.max_pending_chunked_message,
            auto_ack_oldest_on_full=config.auto_ack_oldest_chunked_message_on_queue_full)
        self._tasks: set[asyncio.Task[None]] = set()
        self.dead_letters = None if config.dead_letter_policy is None else DeadLetters(
            config.dead_letter_policy, transport, topic, config.subscription, group.new_id)

    # -- subscription ----------------------------------------------------------------------

    def _request(self) -> SubscribeRequest:
        config = self.config
        return SubscribeRequest(
            topic=self.topic, subscription=config.subscription, sub_type=config.sub_type,
            consumer_name=config.consumer_name, initial_position=config.initial_position,
            durable=config.durable, start_message_id=self.start_id,
            properties=dict(config.properties), epoch=self.epoch,
            key_shared=config.key_shared if config.sub_type == "Key_Shared" else None)

    async def subscribe(self) -> None:
        """Subscribe on the broker and grant the receiver queue's permits."""
        await self.transport.subscribe(self.consumer_id, self._request(), self)
        self._permits = 0
        self.connected.set()
        if not self.zero_queue:
            self.transport.flow(self.consumer_id, self.queue_size)
            return
        self._asked = False
        if self.group.waiting():
            self.ask_one()

    def ask_one(self) -> None:
        """Zero queue: ask the broker for one entry, unless one is asked for already."""
        if not self._asked and self.connected.is_set() and not self.closed:
            self._asked = True
            self.transport.flow(self.consumer_id, 1)

    def on_closed(self, reason: str) -> None:
        """The broker dropped this consumer (ConsumerEvents): resubscribe in the background."""
        self.connected.clear()
        self.generation += 1
        self.group.drop_queued(self)
        self._batches.clear()
        if not self.closed:
            log.info("consumer on %s closed by the broker (%s); resubscribing", self.topic, reason)
            self._spawn(self._resubscribe())

    async def _resubscribe(self) -> None:
        delay_s = 0.05
        while not self.closed and not self.connected.is_set():
            try:
                await self.subscribe()
                return
            except PulsarException as exc:
                log.info("resubscribing to %s failed (%s); retrying", self.topic, exc)
            await asyncio.sleep(delay_s)  # backoff between attempts, not a wait for an event
            delay_s = min(delay_s * 2, RESUBSCRIBE_BACKOFF_S_MAX)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self.closed:
            return
        await self.flush_acks()
        self.closed = True
        self._cancel_timers()
        for task in list(self._tasks):
            task.cancel()
        if self.dead_letters is not None:
            await self.dead_letters.close()
        await self.transport.close_consumer(self.consumer_id)

    async def unsubscribe(self) -> None:
        await self.flush_acks()
        await self.transport.unsubscribe(self.consumer_id)
        self.closed = True
        self._cancel_timers()

    def _cancel_timers(self) -> None:
        for timer in (self._ack_timer, self._tracker_timer):
            if timer is not None:
                timer.cancel()
        self._ack_timer = self._tracker_timer = None

    # -- receive path ----------------------------------------------------------------------

    def on_message(self, incoming: Incoming) -> None:
        """A delivered entry (ConsumerEvents): see the module comment."""
        if not self.zero_queue:
            self._on_message(incoming)
            return
        self._asked = False
        self._on_message(incoming)
        if self.group.waiting():
            self.ask_one()

    def _on_message(self, incoming: Incoming) -> None:
        if (incoming.epoch is not None and incoming.epoch < self.epoch) or self.closed:
            self.give_permits(max(1, incoming.metadata.num_messages_in_batch))
            return
        metadata, payload = incoming.metadata, incoming.payload
        entry_id: MessageId | None = None  # a chunked message's id; else built when asked for
        chunk_ids: tuple[MessageId, ...] = ()
        if metadata.HasField("num_chunks_from_msg") and metadata.num_chunks_from_msg > 1:
            entry_id = trusted_id(incoming.ledger_id, incoming.entry_id, self.partition)
            result = self._chunks.add(entry_id, metadata, payload, time.time() * 1000)
            self._drop_chunks(result.ack, result.redeliver)
            if result.message is None:
                self.give_permits(1)
                return
            metadata, payload = result.message.metadata, result.message.payload
            chunk_ids = result.message.chunk_ids
            entry_id = result.message.message_id
        if not chunk_ids and not incoming.ack_set and metadata.num_messages_in_batch > 0 and \
                metadata.HasField("num_messages_in_batch") and not metadata.compression and \
                not self._checks_start():
            starts = plain_batch_starts(payload, metadata.num_messages_in_batch)
            if starts is not None:  # the usual batch: its messages are decoded when asked for
                self.group.enqueue(self._lazy_messages(incoming, payload, starts))
                return
        try:
            if chunk_ids:
                payload = decompress(metadata.compression, payload, metadata.uncompressed_size
                                     ) if metadata.compression else payload
                metadata.ClearField("compression")
            messages = unpack_messages(metadata, payload)
        except ProtocolError as exc:
            where = entry_id or (incoming.ledger_id, incoming.entry_id)
            log.warning("dropping an unreadable message %s on %s: %s", where, self.topic, exc)
            if entry_id is not None:
                self._queue_ack(entry_id.ledger_id, entry_id.entry_id, None)
            else:
                self._queue_ack(incoming.ledger_id, incoming.entry_id, None)
            return
        self.group.enqueue(self._messages(incoming, entry_id, messages, chunk_ids))

    def _messages(self, incoming: Incoming, entry_id: MessageId | None,
                  messages: list[SingleMessage], chunk_ids: tuple[MessageId, ...],
                  ) -> list[Message]:
        """The messages of a delivered entry to queue (`entry_id`: a chunked message's id,
        which names the message; None: the delivery's own ids do)."""
        metadata = incoming.metadata
        batched = metadata.HasField("num_messages_in_batch")
        size = len(messages)
        ledger_id, entry = (incoming.ledger_id, incoming.entry_id) if entry_id is None else \
            (entry_id.ledger_id, entry_id.entry_id)
        received = Received(ledger_id, entry, self.partition, size if batched else 0,
                            None if batched else entry_id, self.topic, metadata.publish_time,
                            metadata.producer_name, incoming.redelivery_count, self, chunk_ids,
                            self.generation)
        acked = _acked_indexes(incoming.ack_set, size) if batched and incoming.ack_set else None
        check_start = self._checks_start()
        if acked is None and not check_start and not any(map(_COMPACTED_OUT, messages)):
            out = [received_message(received, single) for single in messages]
            skipped = 0
        else:
            out, skipped, acked = self._screened(received, messages, acked or set(),
                                                 check_start)
        key = (ledger_id, entry)
        if batched:
            self._batches[key] = (set(range(size)) - acked if acked else set(range(size)), size)
        return self._kept(key, out, skipped, incoming.redelivery_count)

    def _lazy_messages(self, incoming: Incoming, payload: bytes, starts: list[int],
                       ) -> list[Message]:
        """`_messages` for a plain batch (`codec.plain_batch_starts`, none acknowledged, no
        start id to check): its messages are not decoded here (`_message.lazy_messages`)."""
        metadata = incoming.metadata
        size = len(starts)
        received = Received(incoming.ledger_id, incoming.entry_id, self.partition, size, None,
                            self.topic, metadata.publish_time, metadata.producer_name,
                            incoming.redelivery_count, self, (), self.generation, payload,
                            metadata.sequence_id)
        key = (incoming.ledger_id, incoming.entry_id)
        self._batches[key] = (set(range(size)), size)
        return self._kept(key, lazy_messages(received, starts), 0, incoming.redelivery_count)

    def _checks_start(self) -> bool:
        """Whether delivered messages are screened against a start id (readers, seeks)."""
        return self.start_id is not None and self.start_id not in (EARLIEST, LATEST)

    def _kept(self, key: EntryKey, out: list[Message], skipped: int, redelivery_count: int,
              ) -> list[Message]:
        """The messages of entry `key` to queue: none when it goes to the dead letters;
        the permits of those not queued go back."""
        if self.dead_letters is not None and \
                self.dead_letters.screen(key, out, redelivery_count):
            skipped, out = skipped + len(out), []  # over the maximum: to the dead letters
            self._spawn(self._redeliver([key]))
        if skipped:
            self.give_permits(skipped)
        return out

    def _screened(self, entry: Received, messages: list[SingleMessage], acked: set[int],
                  check_start: bool) -> tuple[list[Message], int, set[int]]:
        """The messages of `entry` not acknowledged already (`acked`), compacted out or
        before the start id; how many were skipped; `acked` with the skipped added."""
        out: list[Message] = []
        skipped = 0
        for single in messages:
            if single.batch_index in acked:
                continue
            message = received_message(entry, single)
            if single.compacted_out or (check_start and self._before_start(message.codec_id)):
                skipped += 1
                acked.add(single.batch_index)
                continue
            out.append(message)
        return out, skipped, acked

    def _before_start(self, message_id: MessageId) -> bool:
        start = self.start_id
        if start is None or start in (EARLIEST, LATEST):
            return False
        entry, start_entry = (message_id.ledger_id, message_id.entry_id), \
            (start.ledger_id, start.entry_id)
        if entry != start_entry:
            return entry < start_entry
        inclusive = self.config.start_inclusive
        if start.batch_index < 0 or message_id.batch_index < 0:
            return not inclusive
        return message_id.batch_index < start.batch_index or \
            (message_id.batch_index == start.batch_index and not inclusive)

    def _drop_chunks(self, ack: tuple[MessageId, ...], redeliver: tuple[MessageId, ...]) -> None:
        for chunk in ack:
            self._queue_ack(chunk.ledger_id, chunk.entry_id, None)
        if redeliver and self.config.redelivers_by_id:
            ids = [(c.ledger_id, c.entry_id) for c in redeliver]
            self._spawn(self.transport.redeliver(self.consumer_id, ids, self.epoch))

    def taken(self, messages: list[Message]) -> None:
        """The application took these messages of this consumer's (in order): permits back,
        ack-timeout tracking."""
        self._last_taken = messages[-1]
        self.give_permits(len(messages))
        if self.config.ack_timeout_ms:
            deadline = time.monotonic() + self.config.ack_timeout_ms / 1000
            for message in messages:
                entry = message.received
                self._unacked.setdefault((entry.ledger_id, entry.entry_id), deadline)
            self._arm_tracker()

    @property
    def last_dequeued(self) -> MessageId | None:
        """The id of the last message the application took (None: none since the start or
        the last seek)."""
        return None if self._last_taken is None else self._last_taken.codec_id

    def give_permits(self, count: int) -> None:
        if self.zero_queue:
            return  # asked for one at a time (`ask_one`)
        self._permits += count
        if self._permits >= max(1, self.queue_size // 2) and self.connected.is_set():
            self.transport.flow(self.consumer_id, self._permits)
            self._permits = 0

    # -- acks ------------------------------------------------------------------------------

    def acknowledge(self, message_id: MessageId, chunk_ids: tuple[MessageId, ...] = ()) -> None:
        """Acknowledge one message (grouped; see the module comment)."""
        self._acknowledge(message_id.ledger_id, message_id.entry_id, (message_id.batch_index,),
                          chunk_ids)

    def acknowledge_message(self, message: Message) -> None:
        """`acknowledge` for a message this consumer received (without building its id)."""
        entry = message.received
        self._acknowledge(entry.ledger_id, entry.entry_id, (message.batch_index,),
                          entry.chunk_ids)

    def acknowledge_entry(self, entry: Received, batch_indexes: list[int]) -> None:
        """`acknowledge_message` for messages of one delivered entry at once."""
        self._acknowledge(entry.ledger_id, entry.entry_id, batch_indexes, entry.chunk_ids)

    def _acknowledge(self, ledger_id: int, entry_id: int, batch_indexes: Sequence[int],
                     chunk_ids: tuple[MessageId, ...]) -> None:
        """Acknowledge messages of one entry (their batch indexes; -1: not batched)."""
        for chunk in chunk_ids:
            self._queue_ack(chunk.ledger_id, chunk.entry_id, None)
        key = (ledger_id, entry_id)
        if self._unacked:
            self._unacked.pop(key, None)
        if self._nacks:
            self._nacks.pop(key, None)
        if self.dead_letters is not None:
            self.dead_letters.forget(key)
        batch = self._batches.get(key)
        if batch is None or min(batch_indexes) < 0:
            self._batches.pop(key, None)
            self._queue_ack(ledger_id, entry_id, None)
            return
        unacked, size = batch
        unacked.difference_update(batch_indexes)
        if not unacked:
            del self._batches[key]
            self._queue_ack(ledger_id, entry_id, None)
        elif self.config.batch_index_ack:
            self._queue_ack(ledger_id, entry_id, _ack_set(unacked, size))

    def _ack_entry(self, key: EntryKey) -> None:
        """Acknowledge a whole entry (dead-lettered)."""
        self._batches.pop(key, None)
        self._queue_ack(*key, None)

    def acknowledge_cumulative(self, message_id: MessageId) -> None:
        key = (message_id.ledger_id, message_id.entry_id)
        for tracked in (self._unacked, self._nacks):
            for entry in [k for k in tracked if k <= key]:
                del tracked[entry]
        for entry in [k for k in self._batches if k < key]:
            del self._batches[entry]
        batch = self._batches.get(key)
        target: tuple[EntryKey, list[int] | None] | None = (key, None)
        if batch is not None and message_id.batch_index >= 0:
            unacked, size = batch
            unacked -= set(range(message_id.batch_index + 1))
            if not unacked:
                del self._batches[key]
            elif self.config.batch_index_ack:
                target = (key, _ack_set(unacked, size))
            else:
                target = ((key[0], key[1] - 1), None) if key[1] > 0 else None
        if target is None:
            return
        current = self._pending_cumulative
        if current is None or current[0] < target[0] or \
                (current[0] == target[0] and target[1] is None):
            self._pending_cumulative = target
        self._arm_ack_timer()

    def _queue_ack(self, ledger_id: int, entry_id: int, ack_set: list[int] | None) -> None:
        self._pending_acks[(ledger_id, entry_id)] = ack_set
        if len(self._pending_acks) >= ACK_GROUP_MAX:
            self._spawn(self.flush_acks())
        else:
            self._arm_ack_timer()

    def _arm_ack_timer(self) -> None:
        if self._ack_timer is None and not self.closed:
            self._ack_timer = asyncio.get_running_loop().call_later(
                ACK_GROUP_MS / 1000, lambda: self._spawn(self.flush_acks()))

    async def flush_acks(self, wait: bool = False) -> None:
        """Send every grouped ack now; with `wait`, until the broker stored them."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        acks = [(ledger, entry, ack_set) for (ledger, entry), ack_set in
                self._pending_acks.items()]
        cumulative = self._pending_cumulative
        self._pending_acks = {}
        self._pending_cumulative = None
        if not self.connected.is_set():
            return  # the broker redelivers them; acking again then is harmless
        if acks:
            await self.transport.ack(self.consumer_id, acks, False, wait)
        if cumulative is not None:
            (ledger, entry), ack_set = cumulative
            await self.transport.ack(self.consumer_id, [(ledger, entry, ack_set)], True, wait)

    # -- negative acks, ack timeout, redelivery --------------------------------------------

    def negative_acknowledge(self, message_id: MessageId) -> None:
        key = (message_id.ledger_id, message_id.entry_id)
        self._unacked.pop(key, None)
        self._nacks[key] = time.monotonic() + self.config.negative_ack_delay_ms / 1000
        self._arm_tracker()

    def _arm_tracker(self) -> None:
        if self._tracker_timer is not None or self.closed:
            return
        dues = list(self._nacks.values()) + list(self._unacked.values())
        if not dues:
            return
        delay_s = min(max(0.0, min(dues) - time.monotonic()), TRACKER_TICK_S_MAX)
        self._tracker_timer = asyncio.get_running_loop().call_later(delay_s, self._tracker_due)

    def _tracker_due(self) -> None:
        self._tracker_timer = None
        now = time.monotonic()
        due: list[EntryKey] = []
        for tracked in (self._nacks, self._unacked):
            for key in [k for k, when in tracked.items() if when <= now]:
                del tracked[key]
                due.append(key)
        if due:
            self._spawn(self._redeliver(sorted(set(due))))
        self._arm_tracker()

    async def _redeliver(self, keys: list[EntryKey]) -> None:
        if self.dead_letters is not None:
            keys = await self.dead_letters.divert(keys, self._ack_entry)
            if not keys:
                return
        if not self.config.redelivers_by_id:
            await self.redeliver_all()
            return
        await self.flush_acks()
        for key in keys:
            self._batches.pop(key, None)
        if self.connected.is_set():
            await self.transport.redeliver(self.consumer_id, keys, self.epoch)

    async def redeliver_all(self) -> None:
        """Redeliver everything unacknowledged (queued messages are dropped first)."""
        await self.flush_acks()
        self.epoch += 1
        self.generation += 1
        self._batches.clear()
        self._nacks.clear()
        self._unacked.clear()
        dropped = self.group.drop_queued(self)
        if self.connected.is_set():
            await self.transport.redeliver(self.consumer_id, None, self.epoch)
            self.give_permits(dropped)

    # -- seek ------------------------------------------------------------------------------

    async def seek(self, target: MessageId | int, timeout_s: float) -> None:
        """Move the subscription; wait until the broker's close and our resubscription are
        over, so what follows reads from the new position."""
        await self.flush_acks()
        previous = self.start_id
        # Before the seek: the broker closes us and we resubscribe meanwhile.
        self.start_id = target if isinstance(target, MessageId) else None
        self._last_taken = None
        try:
            await self.transport.seek(self.consumer_id, target)
        except BaseException:
            self.start_id = previous
            raise
        await asyncio.wait_for(self.connected.wait(), timeout_s)
