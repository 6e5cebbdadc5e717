"""The producer core: one producer on one topic (or one partition), over a `Transport`.

Theory of operation
-------------------
Everything here runs on the client's loop. `send` takes an `OutMessage` and returns a future
that resolves with the message's `MessageId` once the broker has stored it durably (or fails
with a `PulsarException`). In between:

1. Slots. Each message holds one slot of the pending queue (`max_pending_messages`) until its
   receipt; a chunked message holds one per chunk. When the queue is full `send` raises
   `ProducerQueueIsFull`, or with `block_if_queue_full` waits for room.
2. Sequence ids. Without a user-given id, ids run on from the last one: the first is
   `initial_sequence_id + 1`, else the broker's `last_sequence_id + 1` for a named producer it
   knows (deduplication resumes across restarts), else 0.
3. Batching (`batching_enabled`, never for delayed messages): messages go into codec's
   `BatchContainer` (or `KeyBasedBatchContainer`), which closes a batch by count, bytes, or
   the `batching_max_publish_delay_ms` timer armed here. A message whose user-given sequence
   id is not above the last one pushed closes the open batch first, and the next new message
   closes that one, so a possible duplicate never shares an entry with new messages (the
   broker judges an entry by its lowest id: a batch starting with a duplicate is dropped whole).
4. Entries. A closed batch or a single message becomes metadata plus payload
   (`codec.build_batch` / `build_message`, compressed as configured). Larger than the broker's
   `max_message_size`: with `chunking_enabled` it is cut into chunks (`codec.split_into_chunks`),
   each sent on its own; otherwise the message fails with `MessageTooBig`.
5. Receipts. Each entry is an `Op` handed to `Transport.send`; its future's outcome completes
   the messages' futures (a batch's message i gets batch index i). `last_sequence_id` follows
   the highest id stored.
6. Send timeout. A timer looks at the oldest op every so often; once it is `send_timeout_millis`
   old, every pending op and the open batch fail with `Timeout` (the broker may still store
   them; deduplication makes a resend safe).

`flush` closes the open batch and waits for every op pending at the call. `close` flushes,
waits, then closes the producer on the broker; later sends raise `AlreadyClosed`.

Reconnection. When the broker drops the producer (its connection broke, the topic was
unloaded), ops keep their entries; those that fail while the producer is disconnected stay
queued, and new ones wait. `_reconnect` re-creates the producer under the name the broker gave
it, with backoff while the error may pass, then sends every unanswered op again in order
(the broker's deduplication, when on, drops those it had stored). A lasting refusal --
fenced, terminated, deleted -- closes the producer and fails its pending sends with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Final, TypeVar

from magnetar.codec import (
    Batch,
    BatchContainer,
    KeyBasedBatchContainer,
    MessageId,
    SingleMessage,
    build_batch,
    build_message,
    chunk_payload_size_bytes,
    pb,
    split_into_chunks,
)

from ._enums import BatchingType
from ._errors import (
    AlreadyClosed,
    BrokerMetadataError,
    BrokerPersistenceError,
    ConnectError,
    MessageTooBig,
    NotConnected,
    ProducerBusy,
    ProducerQueueIsFull,
    PulsarException,
    ServiceUnitNotReady,
    Timeout,
)
from ._outgoing import (
    NO_PROPERTIES,
    OutMessage,
    PartsSink,
    Queued,
    ResultSink,
    out_of,
    plain_message,
    stored,
    stored_one,
)
from ._producer_data import Offered, Op, ProducerConfig, now_ms
from ._transport import ProducerOpened, ProducerRequest, SendReceipt, Transport

__all__ = ["Offered", "OutMessage", "PartsSink", "ProducerConfig", "ProducerCore", "Queued",
           "ResultSink", "now_ms", "out_of", "plain_message", "stored", "stored_one"]

SEND_TIMEOUT_CHECK_S_MAX: Final = 1.0  # the send-timeout timer looks at least this often
RECONNECT_BACKOFF_S_MIN: Final = 0.05
RECONNECT_BACKOFF_S_MAX: Final = 2.0
# Errors after which re-creating the producer may succeed later (the broker is restarting,
# the topic is moving, the old producer is still registered).
_PASSING_ERRORS: Final = (ConnectError, NotConnected, Timeout, ServiceUnitNotReady,
                          ProducerBusy, BrokerMetadataError, BrokerPersistenceError)

log = logging.getLogger(__name__)
_new_tuple = tuple.__new__


_O = TypeVar("_O", bound=Offered)


class ProducerCore:
    """One producer on one topic or partition (see the module comment)."""

    def __init__(self, transport: Transport, producer_id: int, topic: str, partition: int,
                 config: ProducerConfig):
        self.transport = transport
        self.producer_id = producer_id
        self.topic = topic
        self.partition = partition
        self.config = config
        self.producer_name = config.producer_name
        self.last_sequence_id = -1
        self._next_sequence_id = 0
        self._last_pushed = -1
        self._duplicate_batched = False  # the open batch may hold a possible duplicate
        self._slots_used = 0
        self._room = asyncio.Event()
        self._room.set()
        self._ops: dict[Op, None] = {}  # in flight, oldest first
        self._container: BatchContainer | KeyBasedBatchContainer | None = None
        # The open batches' sinks: in message order for the default container (its batches
        # close oldest first), by sequence id for a key-based one (which regroups them).
        self._batch_sinks: list[ResultSink] = []
        self._batch_results: dict[int, ResultSink] = {}
        self._key_based = config.batching_type is BatchingType.KeyBased
        self._batch_timer: asyncio.TimerHandle | None = None
        self._timeout_timer: asyncio.TimerHandle | None = None
        self._closed_reason: str | None = None
        self._connected = False
        self._reconnecting: asyncio.Task[None] | None = None
        if config.batching_enabled:
            kind = KeyBasedBatchContainer if config.batching_type is BatchingType.KeyBased \
                else BatchContainer
            self._container = kind(
                batch_messages_max=config.batching_max_messages,
                batch_size_bytes_max=config.batching_max_allowed_size_in_bytes,
                batch_delay_ms_max=config.batching_max_publish_delay_ms)

    # -- lifetime --------------------------------------------------------------------------

    async def _create(self, name: str) -> ProducerOpened:
        opened = await self.transport.create_producer(
            self.producer_id,
            ProducerRequest(topic=self.topic, producer_name=name,
                            access_mode=self.config.access_mode,
                            properties=dict(self.config.properties),
                            initial_subscription_name=self.config.initial_subscription_name),
            self)
        self._connected = True
        return opened

    async def start(self) -> None:
        """Create the producer on the broker and pick the first sequence id."""
        opened = await self._create(self.config.producer_name)
        self.producer_name = opened.producer_name
        initial = self.config.initial_sequence_id
        if initial is not None:
            self.last_sequence_id = initial
        elif opened.last_sequence_id >= 0:
            self.last_sequence_id = opened.last_sequence_id
        self._next_sequence_id = self.last_sequence_id + 1
        self._last_pushed = self.last_sequence_id

    def on_closed(self, reason: str) -> None:
        """The broker dropped this producer (ProducerEvents): re-create it in the background;
        sends failing meanwhile are sent again once it is back."""
        self._connected = False
        if self._closed_reason is None and self._reconnecting is None:
            log.info("producer %s on %s closed by the broker (%s); reconnecting",
                     self.producer_name, self.topic, reason)
            self._reconnecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        """Re-create the producer under the same name (with backoff while the error may pass),
        then resend what was not answered, in order. A lasting refusal (fenced, topic
        terminated or deleted) closes the producer and fails its pending sends."""
        delay_s = RECONNECT_BACKOFF_S_MIN
        try:
            while self._closed_reason is None:
                try:
                    await self._create(self.producer_name)
                    break
                except PulsarException as exc:
                    if not isinstance(exc, _PASSING_ERRORS):
                        self._closed_reason = f"closed by the broker ({exc})"
                        self._fail_all(exc)
                        return
                await asyncio.sleep(delay_s)  # backoff between attempts
                delay_s = min(delay_s * 2, RECONNECT_BACKOFF_S_MAX)
            for op in list(self._ops):
                if not op.in_flight and not op.done:
                    self._send_op(op)
        finally:
            self._reconnecting = None

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise AlreadyClosed(f"producer {self.producer_name!r} on {self.topic} is "
                                f"{self._closed_reason}")

    async def flush(self) -> None:
        """Send the open batch and wait for every op pending now (failures are the sends')."""
        self._send_batches(self._drain_container())
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Future[None]] = []
        for op in self._ops:
            op.waiters.append(loop.create_future())
            pending.append(op.waiters[-1])
        if pending:
            await asyncio.wait(pending)

    async def close(self) -> None:
        """Flush (unless the client shuts down at once), then close on the broker; what is
        still pending then fails with AlreadyClosed. Idempotent."""
        if self._closed_reason is None:
            try:
                if not self.transport.immediate_close:
                    await self.flush()
            finally:
                self._closed_reason = "closed"
                self._cancel_timers()
                if self._reconnecting is not None:
                    self._reconnecting.cancel()
                await self.transport.close_producer(self.producer_id)
        self._fail_all(AlreadyClosed(f"producer on {self.topic} is closed"))

    def _cancel_timers(self) -> None:
        for timer in (self._batch_timer, self._timeout_timer):
            if timer is not None:
                timer.cancel()
        self._batch_timer = self._timeout_timer = None

    # -- sending ---------------------------------------------------------------------------

    async def send(self, message: OutMessage) -> asyncio.Future[MessageId]:
        """Queue one message (waiting for room if so configured).

        Returns:
            A future for its id.

        Raises:
            AlreadyClosed, ProducerQueueIsFull, MessageTooBig: nothing was queued.
        """
        result: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        await self.send_to(message, result)
        return result

    async def send_to(self, message: OutMessage, sink: ResultSink) -> None:
        """As `send`, the outcome going to `sink`."""
        if not self.offer(message, sink):
            entry = self._entry(message)
            await self._reserve(1 if entry is None else len(entry[2]))
            self._enqueue(message, sink, entry)

    @property
    def batches(self) -> bool:
        """Whether messages without a delivery time go into batches (`offer_batched`)."""
        return self._container is not None

    def offer_batched(self, message: OutMessage, sink: ResultSink, now_ms: int) -> bool:
        """`offer` for a message without a delivery time on a producer that `batches` (the
        hot path of `send_async`: one call, the clock read once per burst by the caller).

        Raises:
            AlreadyClosed: nothing was queued.
        """
        if self._closed_reason is not None:
            self._check_open()
        used = self._slots_used
        if used >= self.config.max_pending_messages and used:
            return False
        self._slots_used = used + 1
        self._add_to_batch(message, sink, now_ms)
        return True

    def offer_batched_run(self, queue: deque[_O], now_ms: int,
                          failed: Callable[[_O, Exception], None]) -> None:
        """`offer_batched` for each message at the head of `queue` (its own sink) while it has
        no delivery time, the producer is open and a slot is free (the hot path of `send_async`:
        one call per burst); the rest stay queued. One whose add raised goes to `failed`.
        Stretches of bare bytes go in one loop (`_add_run`), other messages one by one."""
        limit = self.config.max_pending_messages
        add = self._add_to_batch
        while queue and self._closed_reason is None:
            if not self._key_based and not self._duplicate_batched and \
                    self._add_run(queue, now_ms, failed):
                continue
            sink = queue[0]
            message = out_of(sink.message)
            used = self._slots_used
            if message.deliver_at_ms is not None or (used >= limit and used):
                return
            queue.popleft()
            self._slots_used = used + 1
            try:
                add(message, sink, now_ms)
            except Exception as exc:  # as `offer_batched` raising for this one message
                failed(sink, exc)

    def _add_run(self, queue: deque[_O], now_ms: int,
                 failed: Callable[[_O, Exception], None]) -> bool:
        """`_add_to_batch` for the sends of bare bytes (`Queued`) at the head of `queue` while
        each has a slot and its sequence id is above the last one pushed, in one loop and one
        call of the (default) container; False when it took none. Should that call raise, the
        sends it took that are not answered yet go to `failed`."""
        limit = self.config.max_pending_messages
        used, last, next_id = self._slots_used, self._last_pushed, self._next_sequence_id
        sinks = self._batch_sinks
        singles: list[SingleMessage] = []
        append = singles.append
        while queue:
            sink = queue[0]
            payload = sink.message
            if type(payload) is not bytes or (used >= limit and used) or next_id <= last:
                break  # a possible duplicate (`_add_to_batch` closes the batch first), or full
            queue.popleft()
            used += 1
            last = next_id
            sinks.append(sink)
            append(_new_tuple(SingleMessage, (  # `plain_message(payload).single`, inline
                payload, NO_PROPERTIES, None, False, None, 0, next_id, False, -1, False)))
            next_id += 1
        if not singles:
            return False
        taken: list[_O] = sinks[-len(singles):]  # type: ignore[assignment]
        self._slots_used, self._last_pushed, self._next_sequence_id = used, last, next_id
        container = self._container
        assert container is not None
        try:
            self._send_batches(container.add_many(singles, now_ms))
            if self._batch_timer is None:
                self._arm_batch_timer()
        except Exception as exc:  # as `offer_batched` raising (not expected)
            for sink in taken:
                if not sink.done():
                    failed(sink, exc)
        return True

    def offer(self, message: OutMessage, sink: ResultSink) -> bool:
        """Queue `message` if its slots are free now, its outcome going to `sink`; False (and
        nothing queued) when it would have to wait for room -- then `send_to` waits.

        Raises:
            AlreadyClosed, MessageTooBig: nothing was queued.
        """
        entry = self._entry(message)
        slots = 1 if entry is None else len(entry[2])
        if self._slots_used + slots > self.config.max_pending_messages and self._slots_used:
            return False
        self._slots_used += slots
        self._enqueue(message, sink, entry)
        return True

    def _entry(self, message: OutMessage,
               ) -> tuple[pb.MessageMetadata, bytes, list[None]] | None:
        """None for a message that goes into the open batch, else its single entry's metadata,
        payload and one item per entry it takes (chunks)."""
        self._check_open()
        if self._container is not None and message.deliver_at_ms is None:
            return None
        metadata, payload = build_message(
            message.single(0), producer_name=self.producer_name, publish_time=now_ms(),
            compression=int(self.config.compression_type))
        if message.deliver_at_ms is not None:
            metadata.deliver_at_time = message.deliver_at_ms
        return metadata, payload, self._pieces(metadata, payload)

    def _enqueue(self, message: OutMessage, sink: ResultSink,
                 entry: tuple[pb.MessageMetadata, bytes, list[None]] | None) -> None:
        """Put a message whose slots are taken into the batch or on the wire."""
        if entry is None:
            self._add_to_batch(message, sink, now_ms())
            return
        metadata, payload, pieces = entry
        sequence_id = self._assign(message.sequence_id)
        self._last_pushed = max(self._last_pushed, sequence_id)
        metadata.sequence_id = sequence_id
        chunks = split_into_chunks(metadata, payload, chunk_size_bytes=self._chunk_size(
            metadata)) if len(pieces) > 1 else [(metadata, payload)]
        for index, (chunk_metadata, chunk_payload) in enumerate(chunks):
            last = index == len(chunks) - 1
            self._dispatch(Op(sequence_id, sequence_id, 1, [sink] if last else [],
                               time.monotonic()), chunk_metadata, chunk_payload, 1)

    def _add_to_batch(self, message: OutMessage, sink: ResultSink, now_ms: int) -> None:
        """Put a message whose slot is taken into the open batch (the hot path: no call it can
        skip)."""
        container = self._container
        assert container is not None
        sequence_id = message.sequence_id
        if sequence_id is None:  # `_assign`, inline
            sequence_id = self._next_sequence_id
            self._next_sequence_id = sequence_id + 1
        possible_duplicate = sequence_id <= self._last_pushed
        if possible_duplicate or self._duplicate_batched:
            self._send_batches(self._drain_container())
        self._duplicate_batched = possible_duplicate
        if not possible_duplicate:
            self._last_pushed = sequence_id
        if self._key_based:
            self._batch_results[sequence_id] = sink
        else:
            self._batch_sinks.append(sink)
        closed = container.add(message.single(sequence_id), now_ms)
        if closed:
            self._send_batches(closed)
        if self._batch_timer is None:
            self._arm_batch_timer()

    def _chunk_size(self, metadata: pb.MessageMetadata) -> int:
        return chunk_payload_size_bytes(metadata, self.transport.max_message_size)

    def _pieces(self, metadata: pb.MessageMetadata, payload: bytes) -> list[None]:
        """One item per entry the message needs (one, or one per chunk)."""
        limit = self.transport.max_message_size
        if len(payload) <= limit:
            return [None]
        if not self.config.chunking_enabled:
            raise MessageTooBig(f"message of {len(payload)} bytes exceeds the maximum of "
                                f"{limit} on {self.topic} (enable chunking to send it)")
        size = self._chunk_size(metadata)
        return [None] * (-(-len(payload) // size))

    def _assign(self, user_sequence_id: int | None) -> int:
        if user_sequence_id is not None:
            return user_sequence_id
        sequence_id = self._next_sequence_id
        self._next_sequence_id += 1
        return sequence_id

    async def _reserve(self, slots: int) -> None:
        limit = self.config.max_pending_messages
        while self._slots_used + slots > limit and self._slots_used > 0:
            if not self.config.block_if_queue_full:
                raise ProducerQueueIsFull(
                    f"producer {self.producer_name!r} on {self.topic} has "
                    f"{self._slots_used} of {limit} pending messages")
            self._room.clear()
            await self._room.wait()
            self._check_open()
        self._slots_used += slots

    def _release(self, slots: int) -> None:
        self._slots_used -= slots
        assert self._slots_used >= 0
        self._room.set()

    # -- batches ---------------------------------------------------------------------------

    def _arm_batch_timer(self) -> None:
        container = self._container
        if container is None or self._batch_timer is not None or container.deadline_ms is None:
            return
        delay_s = max(0.0, (container.deadline_ms - now_ms()) / 1000)
        self._batch_timer = asyncio.get_running_loop().call_later(delay_s, self._batch_due)

    def _batch_due(self) -> None:
        self._batch_timer = None
        if self._container is not None:
            self._send_batches(self._container.expire(now_ms()))
            self._arm_batch_timer()

    def _drain_container(self) -> list[Batch]:
        return self._container.flush() if self._container is not None else []

    def _send_batches(self, batches: list[Batch]) -> None:
        for batch in batches:
            count = len(batch.messages)
            results = self._take_batch_results(batch)
            metadata, payload = build_batch(
                batch.messages, producer_name=self.producer_name, publish_time=now_ms(),
                compression=int(self.config.compression_type))
            metadata.highest_sequence_id = batch.highest_sequence_id
            op = Op(batch.sequence_id, batch.highest_sequence_id, count, results,
                     time.monotonic(), batch_size=count)
            if len(payload) > self.transport.max_message_size:
                self._finish(op, MessageTooBig(
                    f"batch of {len(payload)} bytes exceeds the maximum of "
                    f"{self.transport.max_message_size} on {self.topic}"))
                continue
            self._dispatch(op, metadata, payload, count)

    def _take_batch_results(self, batch: Batch) -> list[ResultSink]:
        """The sinks of a closed batch's messages: the oldest ones of the default container;
        a key-based container regroups messages by key, so they are found by sequence id
        (unique within the open batches: a repeated or lower id closes them first)."""
        if not self._key_based:
            count = len(batch.messages)
            sinks = self._batch_sinks[:count]
            del self._batch_sinks[:count]
            return sinks
        return [self._batch_results.pop(m.sequence_id or 0) for m in batch.messages]

    # -- ops -------------------------------------------------------------------------------

    def _dispatch(self, op: Op, metadata: pb.MessageMetadata, payload: bytes,
                  num_messages: int) -> None:
        op.metadata, op.payload, op.num_messages = metadata, payload, num_messages
        self._ops[op] = None
        if self._connected:
            self._send_op(op)
        self._arm_timeout_timer()

    def _send_op(self, op: Op) -> None:
        assert op.metadata is not None
        op.in_flight = True
        future = self.transport.send(self.producer_id, op.sequence_id, op.highest_sequence_id,
                                     op.num_messages, op.metadata, op.payload)
        future.add_done_callback(lambda done: self._receipt(op, done))

    def _receipt(self, op: Op, done: SendReceipt) -> None:
        op.in_flight = False
        if op.done:
            return  # failed by the send timeout already
        if done.cancelled():
            self._finish(op, AlreadyClosed(f"send on {self.topic} was cancelled"))
            return
        error = done.exception()
        if error is not None and not self._connected and self._closed_reason is None:
            return  # lost with the producer: sent again once it is re-created
        if error is not None:
            self._finish(op, error if isinstance(error, PulsarException) else
                         PulsarException(f"send on {self.topic}: {error}"))
            return
        ledger_id, entry_id = done.result()
        self.last_sequence_id = max(self.last_sequence_id, op.highest_sequence_id)
        self._finish(op, None, ledger_id, entry_id)

    def _finish(self, op: Op, error: BaseException | None, ledger_id: int = -1,
                entry_id: int = -1) -> None:
        op.done = True
        self._ops.pop(op, None)
        self._release(op.slots)
        for waiter in op.waiters:
            if not waiter.done():
                waiter.set_result(None)
        if error is not None:
            for result in op.results:
                if not result.done():
                    result.set_exception(error)
            return
        results = op.results
        if results and isinstance(results[0], PartsSink):  # send_async's: one call per entry
            results[0].set_parts_of_entry(results, ledger_id, entry_id, self.partition,
                                          op.batch_size)
        else:
            stored(results, ledger_id, entry_id, self.partition, op.batch_size)

    def _fail_all(self, error: PulsarException) -> None:
        for op in list(self._ops):
            self._finish(op, error)
        for result in [*self._batch_sinks, *self._batch_results.values()]:
            if not result.done():
                result.set_exception(error)
        self._batch_sinks.clear()
        self._batch_results.clear()
        if self._container is not None:
            self._container.flush()

    def _arm_timeout_timer(self) -> None:
        timeout_s = self.config.send_timeout_ms / 1000
        if not timeout_s or self._timeout_timer is not None:
            return
        self._timeout_timer = asyncio.get_running_loop().call_later(
            min(timeout_s, SEND_TIMEOUT_CHECK_S_MAX), self._check_timeout)

    def _check_timeout(self) -> None:
        self._timeout_timer = None
        if not self._ops:
            return
        oldest = next(iter(self._ops))
        timeout_s = self.config.send_timeout_ms / 1000
        if time.monotonic() - oldest.created_s >= timeout_s:
            count = len(self._ops)
            self._fail_all(Timeout(f"{count} message(s) on {self.topic} got no receipt within "
                                   f"{self.config.send_timeout_ms} ms"))
            return
        self._arm_timeout_timer()
