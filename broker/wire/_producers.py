"""The producers of one connection: PRODUCER, SEND and its receipts, CLOSE_PRODUCER.

Theory of operation
-------------------
`ProducerCommands` serves the producer commands of one connection through its
`ConnectionView` (`_connection_view.py`) and owns the connection's producers, keyed by the
client's producer ids.

Receipts. The SENDs of one socket read are gathered per producer (`unsent`) and handed over at
the end of the read, or before any other command, all of one producer's SENDs of the read as
one run, in the order they came (producers in the order of their first SEND; a read of a
client that sends round its producers holds several SENDs of each) -- unless producers of
the read share a topic: then each stretch of one producer's SENDs is a run, in arrival order,
so that the topic's entries keep the order the SENDs came in: a persistent
topic admits the run at once (checks, dedup) and adds what it admitted through the read's one
`AddGroup`, so the SENDs of every producer and topic of the read reach the storage as one
write with one completion, and are answered from one callback on the loop, with no task
(`PersistentTopic.publish_grouped`): each run's outcomes are recorded, then the group's
`after` hook builds the receipts of every producer of the read at once (one transport
write). A topic whose earlier publish is still queued, and a
non-persistent topic, publish the run in a task (`publish_many_soon`, `publish_many`); each
managed ledger assigns positions in call order. Receipts leave in the order the SENDs
arrived, per producer, those completed in one loop turn in one write: each producer keeps a
queue of pending sends, and a completed publish flushes the queue's completed head.
The connection counts unanswered SENDs; at `ServerContext.pending_sends_max` the server stops
reading (`wait_send_room`) until half of them are answered.

Creation. A CLOSE_PRODUCER that arrives while the creation is still running waits for it,
then undoes it; the receipts of earlier SENDs leave before its SUCCESS (wire reference §6.5).
A WaitForExclusive producer that has to wait gets PRODUCER_SUCCESS with producer_ready=false
at once, and a second one (same request id, ready, with its topic epoch) from a callback on its
waiter when the topic promotes it — or ERROR ProducerFenced when an ExclusiveWithFencing
producer clears the queue. No task waits meanwhile, so a shutdown does not wait for waiting
producers. Each producer's schema (or its lack of one) is admitted by the schema registry.

The broker's own closes of producers (fencing, termination, unload, forced delete, backlog
quota) arrive through `Producer.closer` and become CLOSE_PRODUCER with request id 2**64-1;
later SENDs of that producer id (the last `CLOSED_PRODUCER_IDS_MAX` closed ones) are dropped
quietly. A SEND for any other unknown producer closes the connection (`CloseConnection`).

Claims are checked before work in proportion to them: a SEND whose num_messages_in_batch its
payload cannot hold (`_entry.batch_count_error`) gets SEND_ERROR NotAllowedError, which fails
that message only. A SEND with a bad checksum gets SEND_ERROR ChecksumError (logged once per
connection at WARNING). A transactional SEND gets NotAllowedError, as Pulsar answers with its
coordinator off. A full disk answers no receipt: the topic closes the producer instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from magnetar.codec import ChecksumMismatch, Frame, Send, pb, send_receipt_frames
from magnetar.storage import latency_trace

from .._errors import DiskFullError
from .._names import TopicName, check_producer_name, check_subscription_name
from ..dispatch._entry import batch_count_error
from ..ledger._add_group import AddGroup
from ..schemas._schemas import StoredSchema, encode_schema_version
from ..security._authz import PRODUCE_REFUSED
from ..topics._service import Topic
from ..topics._topic import PersistentTopic, Producer, ProducerSpec, PublishResult
from ._connection_view import (
    REQUEST_ID_NONE,
    SHUTTING_DOWN,
    TRANSACTIONS_DISABLED,
    CloseConnection,
    ConnectionView,
    authorize,
    carries_schema,
    key_values,
    server_error,
)

__all__ = ["CLOSED_PRODUCER_IDS_MAX", "ProducerCommands"]

log = logging.getLogger(__name__)

CLOSED_PRODUCER_IDS_MAX: Final = 1024  # closed ids remembered, to drop their late SENDs quietly

_ACCESS_MODES: Final = {
    pb.Shared: "Shared",
    pb.Exclusive: "Exclusive",
    pb.WaitForExclusive: "WaitForExclusive",
    pb.ExclusiveWithFencing: "ExclusiveWithFencing",
}


@dataclass(slots=True)
class _PendingSend:
    sequence_id: int
    highest_sequence_id: int
    done: bool = False
    result: PublishResult | None = None
    error: tuple[int, str] | None = None
    dropped: bool = False  # answered by closing the producer instead (a full disk)


# A SEND gathered for `flush_sends`, as a topic publishes it: entry, sequence id, highest
# sequence id (-1: none stated), metadata.
_Unsent = tuple[bytes, int, int, "pb.MessageMetadata | None"]
# A run of one producer's SENDs in `flush_sends`: its producer, and each SEND's receipt.
_Run = tuple["_ProducerState", list[_PendingSend]]


@dataclass(eq=False)  # hashed by identity: the key of `unsent`
class _ProducerState:
    producer_id: int
    ready: asyncio.Future[None]
    topic: Topic | None = None
    producer: Producer | None = None
    schema_version: bytes | None = None
    pending: deque[_PendingSend] = field(default_factory=deque)
    drained: asyncio.Event | None = None  # set once `pending` is empty, for a CLOSE_PRODUCER


class ProducerCommands:
    """The producers of one connection (see the module comment).

    Args:
        view: the connection.
    """

    def __init__(self, view: ConnectionView):
        self.view = view
        self._producers: dict[int, _ProducerState] = {}
        self._closed_producers: OrderedDict[int, None] = OrderedDict()
        self.pending_sends = 0
        # The SENDs of the socket read being handled, not yet handed to their topics (at most
        # one read's frames: `flush_sends` runs at its end and before any other command).
        # Per producer, in the order of its first SEND: the SENDs and their receipts.
        self.unsent: dict[_ProducerState, tuple[list[_Unsent], list[_PendingSend]]] = {}
        self._arrivals: list[_ProducerState] = []  # each gathered SEND's producer, in order
        # Producers with receipts answered by the AddGroup being confirmed, not yet written.
        self._answered: list[_ProducerState] = []
        self._send_room = asyncio.Event()
        self._send_room.set()

    # -- lifetime --------------------------------------------------------------------------

    async def wait_send_room(self) -> None:
        """Until fewer than `pending_sends_max` SENDs wait for their receipts (or the
        connection is closed)."""
        while self.pending_sends >= self.view.ctx.pending_sends_max and not self.view.closed:
            self._send_room.clear()
            await self._send_room.wait()

    def release_all(self) -> None:
        """The connection closed: every producer leaves its topic; `wait_send_room` ends."""
        self.unsent.clear()
        self._arrivals.clear()
        for state in list(self._producers.values()):
            self._release_producer(state)
        self._producers.clear()
        self._send_room.set()

    # -- creation and close ----------------------------------------------------------------

    def on_producer(self, frame: Frame) -> None:
        self.view.spawn(self._create_producer(frame.command.producer))

    def _producer_spec(self, request: pb.CommandProducer) -> ProducerSpec:
        return ProducerSpec(
            producer_name=request.producer_name if request.HasField("producer_name") else "",
            access_mode=_ACCESS_MODES.get(request.producer_access_mode, "Shared"),
            epoch=request.epoch,
            topic_epoch=request.topic_epoch if request.HasField("topic_epoch") else None,
            metadata=key_values(request.metadata),
            initial_subscription_name=request.initial_subscription_name,
            address=self.view.peer,
            client_version=self.view.client_version,
        )

    async def _create_producer(self, request: pb.CommandProducer) -> None:
        view = self.view
        producer_id, request_id = request.producer_id, request.request_id
        existing = self._producers.get(producer_id)
        if existing is not None:
            if existing.ready.done() and existing.producer is not None:
                self._producer_success(request_id, existing)
            else:
                view.error_code(request_id, pb.ServiceNotReady,
                                "Producer is already present on the connection")
            return
        if not view.ctx.accepting:
            view.error_code(request_id, pb.ServiceNotReady, SHUTTING_DOWN)
            return
        state = _ProducerState(producer_id, asyncio.get_running_loop().create_future())
        self._producers[producer_id] = state
        try:
            await self._open_producer(state, request)
        except Exception as exc:
            if self._producers.get(producer_id) is state:
                del self._producers[producer_id]
            view.error(request_id, exc)
            return
        finally:
            state.ready.set_result(None)
        if view.closed or self._producers.get(producer_id) is not state:
            self._release_producer(state)  # the connection or a CLOSE_PRODUCER beat us
            return
        self._producer_success(request_id, state)
        waiter = state.producer.waiter if state.producer is not None else None
        if waiter is not None:  # WaitForExclusive: a second reply once it is promoted
            waiter.admitted.add_done_callback(
                lambda granted: self._exclusive_granted(request_id, state, granted))

    def _exclusive_granted(self, request_id: int, state: _ProducerState,
                           granted: asyncio.Future[int]) -> None:
        """A waiting producer was promoted (ready now) or fenced out (ERROR); nothing when
        it left first (its wait was cancelled)."""
        if granted.cancelled() or self.view.closed or self._producers.get(state.producer_id) \
                is not state:
            return
        error = granted.exception()
        if error is None:
            self.view.spawn(self._success_once_stored(request_id, state))
            return
        del self._producers[state.producer_id]
        self._remember_closed_producer(state.producer_id)
        self.view.error(request_id, error)

    async def _success_once_stored(self, request_id: int, state: _ProducerState) -> None:
        """Answer a promoted producer once its topic epoch is durable (ERROR if storing it
        failed: the producer is removed)."""
        assert state.topic is not None
        assert state.producer is not None
        try:
            await state.topic.epoch_durable()
        except Exception as exc:
            if self._producers.get(state.producer_id) is state:
                del self._producers[state.producer_id]
                self._remember_closed_producer(state.producer_id)
            self._release_producer(state)
            self.view.error(request_id, exc)
            return
        if not self.view.closed and self._producers.get(state.producer_id) is state:
            self._producer_success(request_id, state)

    async def _open_producer(self, state: _ProducerState, request: pb.CommandProducer) -> None:
        schemas = self.view.ctx.schemas
        name = TopicName.parse(request.topic)
        authorize(self.view, "produce on", str(name),
                  lambda authz, role: authz.can_produce(name, role), PRODUCE_REFUSED)
        check_producer_name(request.producer_name)  # before anything is created
        check_subscription_name(request.initial_subscription_name)
        topic, producer = await self.view.service.create_producer(
            name, self._producer_spec(request))
        try:
            if carries_schema(request):
                version = schemas.add(name, StoredSchema.from_proto(request.schema))
                state.schema_version = encode_schema_version(version)
            else:
                schemas.admit_schemaless_producer(name)
        except BaseException:
            topic.remove_producer(producer)
            raise
        producer.closer = lambda reason: self._broker_closed_producer(state, reason)
        state.topic, state.producer = topic, producer

    def _producer_success(self, request_id: int, state: _ProducerState) -> None:
        assert state.topic is not None
        assert state.producer is not None
        producer = state.producer
        reply = pb.CommandProducerSuccess(
            request_id=request_id, producer_name=producer.name,
            last_sequence_id=state.topic.last_sequence_id(producer),
            producer_ready=producer.waiter is None)
        if producer.topic_epoch is not None:
            reply.topic_epoch = producer.topic_epoch
        if state.schema_version is not None:
            reply.schema_version = state.schema_version
        self.view.send(reply)

    @staticmethod
    def _release_producer(state: _ProducerState) -> None:
        if state.topic is not None and state.producer is not None:
            state.topic.remove_producer(state.producer)

    def _broker_closed_producer(self, state: _ProducerState, reason: str) -> None:
        """The service dropped the producer (e.g. backlog quota): the client reconnects."""
        if self._producers.get(state.producer_id) is state:
            del self._producers[state.producer_id]
            self._remember_closed_producer(state.producer_id)
        log.info("closing producer %s of %s: %s", state.producer_id, self.view.peer, reason)
        self.view.send(pb.CommandCloseProducer(producer_id=state.producer_id,
                                               request_id=REQUEST_ID_NONE))

    def _remember_closed_producer(self, producer_id: int) -> None:
        self._closed_producers[producer_id] = None
        while len(self._closed_producers) > CLOSED_PRODUCER_IDS_MAX:
            self._closed_producers.popitem(last=False)

    def on_close_producer(self, frame: Frame) -> None:
        self.view.spawn(self._close_producer(frame.command.close_producer))

    async def _close_producer(self, request: pb.CommandCloseProducer) -> None:
        state = self._producers.pop(request.producer_id, None)
        if state is not None:
            self._remember_closed_producer(request.producer_id)
            await asyncio.wait([state.ready])
            if state.pending:  # receipts of earlier SENDs go first (wire reference §6.5)
                state.drained = asyncio.Event()
                await state.drained.wait()
            self._release_producer(state)
        self.view.success(request.request_id)

    # -- publishing ------------------------------------------------------------------------

    def _sender(self, producer_id: int) -> _ProducerState | None:
        """The ready producer a SEND names; None for a closed one (the SEND is dropped).

        Raises:
            CloseConnection: no such producer, or not ready yet.
        """
        state = self._producers.get(producer_id)
        if state is None or state.producer is None:
            if producer_id in self._closed_producers:
                return None  # a SEND that crossed our CLOSE_PRODUCER: dropped, as Pulsar does
            raise CloseConnection(f"SEND for producer {producer_id}, which is not ready")
        return state

    def on_send(self, frame: Frame) -> None:
        send = frame.command.send
        highest = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
        assert frame.metadata is not None  # the codec gives every SEND its metadata
        self._on_send(send.producer_id, send.sequence_id, highest,
                      bool(send.txnid_least_bits or send.txnid_most_bits), frame.entry,
                      frame.metadata, batch_count_error(frame.metadata, len(frame.payload)))

    def on_plain_send(self, send: Send) -> None:
        """`on_send` for a plain SEND (codec's `decode_plain_send`). The hot path:
        `_on_send`'s common case, a lone message, inlined; a batch's count is checked in
        `_on_send`."""
        state = self._producers.get(send.producer_id)
        if state is None or state.producer is None or send.txnid_least_bits or \
                send.txnid_most_bits or send.metadata.HasField("num_messages_in_batch"):
            self._on_send(send.producer_id, send.sequence_id, send.highest_sequence_id,
                          bool(send.txnid_least_bits or send.txnid_most_bits), send.entry,
                          send.metadata, batch_count_error(send.metadata, send.payload_bytes))
            return
        sequence_id, highest = send.sequence_id, send.highest_sequence_id
        if highest is None or highest < sequence_id:
            highest = -1  # none stated: the topic's dedup derives it from the entry
        pending = _PendingSend(sequence_id, highest)
        state.pending.append(pending)
        self.pending_sends += 1
        run = self.unsent.get(state)
        if run is None:
            self.unsent[state] = run = ([], [])
        run[0].append((send.entry, sequence_id, highest, send.metadata))
        run[1].append(pending)
        self._arrivals.append(state)

    def _on_send(self, producer_id: int, sequence_id: int, highest: int | None,
                 transactional: bool, entry: bytes, metadata: pb.MessageMetadata,
                 problem: str | None) -> None:
        """A SEND's receipt is queued, then: refused now (a transaction, or the batch count
        `problem`), or gathered in `unsent` for `flush_sends`."""
        state = self._producers.get(producer_id)
        if state is None or state.producer is None:  # not ready or closed: `_sender` decides
            state = self._sender(producer_id)
            if state is None:
                return
        if highest is None or highest < sequence_id:
            highest = -1  # none stated: the topic's dedup derives it from the entry
        pending = _PendingSend(sequence_id, highest)
        state.pending.append(pending)
        self.pending_sends += 1
        if transactional:
            self._finish_send(state, pending, error=(pb.NotAllowedError, TRANSACTIONS_DISABLED))
            return
        if problem is not None:
            # NotAllowed fails this message only (Java), where other codes make clients
            # reconnect and send the same batch again.
            log.debug("refusing a SEND from %s: %s", self.view.peer, problem)
            self._finish_send(state, pending, error=(pb.NotAllowedError, problem))
            return
        run = self.unsent.get(state)
        if run is None:
            self.unsent[state] = run = ([], [])
        run[0].append((entry, sequence_id, highest, metadata))
        run[1].append(pending)
        self._arrivals.append(state)

    def flush_sends(self) -> None:
        """Hand the SENDs gathered so far to their topics, each producer's as one run in
        arrival order: a persistent topic admits a run at once and adds it through the
        read's one `AddGroup` (one storage write for the whole read, whose confirmation
        answers every run, then writes all their receipts at once: `_write_answered`); a
        non-persistent one, and a persistent one whose earlier publish is still queued,
        publishes it in a task."""
        unsent, self.unsent = self.unsent, {}
        arrivals, self._arrivals = self._arrivals, []
        if not unsent:
            return
        if latency_trace.on:  # the sequence ids of the read's first and last SEND
            latency_trace.mark("read", unsent[arrivals[0]][0][0][1],
                               unsent[arrivals[-1]][0][-1][1])
        group = AddGroup(self._write_answered)
        answered = self._answered_in_group
        runs = ((state, sends, pendings) for state, (sends, pendings) in unsent.items()) \
            if len({id(state.topic) for state in unsent}) == len(unsent) \
            else _stretches(unsent, arrivals)  # producers sharing a topic
        for state, sends, pendings in runs:
            topic, producer = state.topic, state.producer
            assert topic is not None
            assert producer is not None
            if not isinstance(topic, PersistentTopic):
                self.view.spawn(self._publish((state, pendings),
                                              topic.publish_many(producer, sends)))
            elif not topic.publish_grouped(producer, sends, group, answered,
                                           (state, pendings)):
                self.view.spawn(self._publish((state, pendings),
                                              topic.publish_many_soon(producer, sends)))
        added = group.submit()
        if added is not None:
            self.view.spawn(added)
        self._write_answered()  # the runs answered at once (duplicates, refusals)

    async def _publish(self, run: _Run,
                       publish: Awaitable[list[PublishResult | BaseException]]) -> None:
        try:
            outcomes = await publish
        except Exception as exc:
            outcomes = [exc] * len(run[1])
        self._answered_in_group(run, outcomes)
        self._write_answered()

    def _write_answered(self) -> None:
        """Write the receipts `_answered_in_group` recorded (the group's `after`)."""
        if self._answered:
            answered, self._answered = self._answered, []
            self._send_receipts(answered)

    def _answered_in_group(self, run: _Run,
                           outcomes: Sequence[PublishResult | BaseException]) -> None:
        """A run's publish finished (one outcome per SEND of the run): each SEND's receipt
        (or error) is recorded; `_write_answered` writes it."""
        state, pendings = run
        self._answered.append(state)
        for pending, outcome in zip(pendings, outcomes, strict=True):
            pending.done = True
            if type(outcome) is PublishResult:
                pending.result = outcome
            elif isinstance(outcome, DiskFullError):
                # The topic closed the producer (CLOSE_PRODUCER): no receipt, the client
                # fails the send itself once its reconnection is refused (see _topic.py).
                log.debug("SEND of %s dropped: %s", self.view.peer, outcome)
                pending.dropped = True
                pending.error = server_error(outcome)
            else:
                self.view.log_failure(outcome)  # type: ignore[arg-type]
                pending.error = server_error(outcome)  # type: ignore[arg-type]

    def on_corrupt_send(self, event: ChecksumMismatch) -> None:
        send = event.command.send
        self.view.warn_once("checksum", "SEND from %s failed its checksum (%#010x != %#010x)",
                            self.view.peer, event.expected, event.actual)
        state = self._sender(send.producer_id)
        if state is None:
            return
        pending = _PendingSend(send.sequence_id, send.sequence_id)
        state.pending.append(pending)
        self.pending_sends += 1
        self._finish_send(state, pending, error=(pb.ChecksumError, "Checksum failed on the broker"))

    def _finish_send(self, state: _ProducerState, pending: _PendingSend, *,
                     result: PublishResult | None = None,
                     error: tuple[int, str] | None = None) -> None:
        assert (result is None) != (error is None)
        pending.done, pending.result, pending.error = True, result, error
        self._send_receipts([state])

    def _send_receipts(self, states: Sequence[_ProducerState]) -> None:
        """Write the receipts of the completed head of each producer's queue (one write
        for them all)."""
        out = bytearray()
        answered = 0
        closed = self.view.closed
        for state in states:
            queue = state.pending
            producer_id = state.producer_id
            receipts: list[tuple[int, int, PublishResult]] = []  # for send_receipt_frames
            while queue and queue[0].done:
                pending = queue.popleft()
                answered += 1
                result = pending.result
                if result is None:
                    if receipts:  # the receipts before it leave before it
                        out += send_receipt_frames(producer_id, receipts)
                        receipts = []
                    out += self._error_bytes(producer_id, pending)
                else:
                    sequence_id, highest = pending.sequence_id, pending.highest_sequence_id
                    receipts.append((sequence_id, sequence_id if highest < sequence_id
                                     else highest, result))
            if receipts and not closed:  # the protobuf runtime's bytes, built faster
                out += send_receipt_frames(producer_id, receipts)
            if not queue and state.drained is not None:
                state.drained.set()
        self.pending_sends -= answered
        assert self.pending_sends >= 0
        if out and not closed:
            self.view.write_soon(bytes(out))
            if latency_trace.on:
                latency_trace.mark("receipts", pending.sequence_id, answered)
        if self.pending_sends < self.view.ctx.pending_sends_max // 2 + 1:
            self._send_room.set()

    def _error_bytes(self, producer_id: int, pending: _PendingSend) -> bytes:
        """The SEND_ERROR of a failed SEND; nothing for a dropped one (a full disk: see
        `_answer`), nor on a closed connection."""
        if pending.dropped or self.view.closed:
            return b""
        assert pending.error is not None
        code, message = pending.error
        return self.view.encode(pb.CommandSendError(
            producer_id=producer_id, sequence_id=pending.sequence_id, error=code,  # type: ignore[arg-type]
            message=message))


def _stretches(unsent: dict[_ProducerState, tuple[list[_Unsent], list[_PendingSend]]],
               arrivals: list[_ProducerState],
               ) -> Iterator[tuple[_ProducerState, list[_Unsent], list[_PendingSend]]]:
    """The gathered SENDs as runs of consecutive SENDs of one producer, in arrival order
    (`arrivals`: each SEND's producer): each run's producer, SENDs and receipts."""
    taken = dict.fromkeys(unsent, 0)
    start, count = 0, len(arrivals)
    for end in range(1, count + 1):
        if end < count and arrivals[end] is arrivals[start]:
            continue
        state = arrivals[start]
        first = taken[state]
        taken[state] = first + end - start
        sends, pendings = unsent[state]
        yield state, sends[first:first + end - start], pendings[first:first + end - start]
        start = end
