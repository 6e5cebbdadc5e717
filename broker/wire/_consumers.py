"""The consumers of one connection: SUBSCRIBE, FLOW, ACK, REDELIVER, SEEK, UNSUBSCRIBE,
GET_LAST_MESSAGE_ID, CONSUMER_STATS, CLOSE_CONSUMER, and the MESSAGE frames of deliveries.

Theory of operation
-------------------
`ConsumerCommands` serves the consumer commands of one connection through its
`ConnectionView` (`_connection_view.py`) and owns the connection's consumers, keyed by the
client's consumer ids. Each consumer's `WireConsumerSink` turns the service's deliveries into
MESSAGE frames, and the broker's close of a consumer (seek, unsubscribe by another, topic
deleted) into CLOSE_CONSUMER with request id 2**64-1, after which the client resubscribes.

Ordering. ACK, REDELIVER, SEEK, UNSUBSCRIBE and CLOSE_CONSUMER of one consumer run one after
the other under the consumer's lock, so a redelivery never overtakes an ack the client sent
before it. A CLOSE_CONSUMER that arrives while the SUBSCRIBE is still running waits for it,
then undoes it. Each consumer's schema is admitted by the schema registry before it
subscribes.

Claims are checked before work in proportion to them: ack sets are checked against their
entry's batch (`Subscription`). A transactional ACK is refused with NotAllowedError, as Pulsar
answers with its coordinator off.

Deliveries. A stored entry may carry the broker entry metadata block (0x0e02,
`_entry_metadata.py`); it goes out verbatim to clients that declared
supports_broker_entry_metadata and is stripped for the others. After writing deliveries the
connection checks its socket's buffer: while it is full, every consumer of the connection is
paused (`pause_deliveries`) until it drains (`resume_deliveries` kicks their dispatchers).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Final

from magnetar.codec import (
    Frame,
    MessageFrameHeads,
    MessageId,
    pb,
    strip_broker_entry_metadata,
)

from .._errors import ConsumerNotFoundError, NotAllowedError
from .._names import TopicName, check_subscription_name
from ..dispatch._compacted_read import live_mask
from ..dispatch._consumer import Consumer, Delivery, SubscribeSpec
from ..dispatch._entry import EntryInfo
from ..dispatch._nonpersistent import NonPersistentSubscription
from ..dispatch._subscription import Subscription
from ..ledger._compacted import decode_compacted_entry
from ..ledger._position import Position
from ..schemas._schemas import StoredSchema
from ..security._authz import SUBSCRIBE_REFUSED
from ..topics._service import Topic
from ..topics._topic import PersistentTopic
from ._connection_view import (
    INT64_MAX,
    REQUEST_ID_NONE,
    SHUTTING_DOWN,
    TRANSACTIONS_DISABLED,
    ConnectionView,
    authorize,
    carries_schema,
    id_data,
    key_values,
    server_error,
    signed,
)

__all__ = ["ConsumerCommands", "WireConsumerSink"]

log = logging.getLogger(__name__)

_SUB_TYPES: Final = {
    pb.CommandSubscribe.Exclusive: "Exclusive",
    pb.CommandSubscribe.Shared: "Shared",
    pb.CommandSubscribe.Failover: "Failover",
    pb.CommandSubscribe.Key_Shared: "Key_Shared",
}

_UINT64_SPAN: Final = 1 << 64  # a uint64 above INT64_MAX less this is the signed long

assert set(_SUB_TYPES.values()) == {"Exclusive", "Shared", "Failover", "Key_Shared"}


@dataclass
class _ConsumerState:
    consumer_id: int
    ready: asyncio.Future[None]
    sink: WireConsumerSink
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    topic: Topic | None = None
    consumer: Consumer | None = None
    subscription: Subscription | NonPersistentSubscription | None = None
    detached: bool = False

    @property
    def live(self) -> bool:
        return self.consumer is not None and not self.detached


class WireConsumerSink:
    """The `ConsumerSink` of one consumer on one connection: deliveries become MESSAGE
    frames carrying the stored entry verbatim; the broker's close becomes CLOSE_CONSUMER.

    After the consumer is gone (`live` False) every call is ignored: a dispatcher may still
    hold the consumer for a moment.
    """

    def __init__(self, commands: ConsumerCommands, consumer_id: int, send_epoch: bool):
        self.commands = commands
        self.consumer_id = consumer_id
        self.send_epoch = send_epoch  # only clients that use epochs get one back
        self.live = True

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        if self.live:
            self.commands.write_messages(self.consumer_id, deliveries, self.send_epoch)

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        if self.live:
            self.commands.view.send(pb.CommandActiveConsumerChange(
                consumer_id=self.consumer_id, is_active=is_active))

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        if self.live:
            self.commands.broker_closed_consumer(self, reason)


def _subscription_of(topic: Topic, spec: SubscribeSpec,
                     ) -> Subscription | NonPersistentSubscription | None:
    if isinstance(topic, PersistentTopic):
        table = topic.subscriptions if spec.durable else topic.readers
        return table.get(spec.subscription)
    return topic.subscriptions.get(spec.subscription)


class ConsumerCommands:
    """The consumers of one connection (see the module comment).

    Args:
        view: the connection.
    """

    def __init__(self, view: ConnectionView):
        self.view = view
        self._consumers: dict[int, _ConsumerState] = {}

    # -- deliveries and lifetime -----------------------------------------------------------

    def write_messages(self, consumer_id: int, deliveries: list[Delivery],
                       send_epoch: bool) -> None:
        """MESSAGE frames for deliveries, the stored entries appended verbatim (their broker
        entry metadata stripped for a client that did not declare it can read it)."""
        view = self.view
        if view.closed or not deliveries:
            return
        view.check_send(pb.BaseCommand.MESSAGE)  # once for the run: the frames skip `encode`
        size_max = view.frame_size_bytes_max
        keep_prefix = view.wants_entry_metadata
        parts: list[bytes] = []
        heads = MessageFrameHeads(consumer_id, frame_size_bytes_max=size_max).head
        for d in deliveries:  # the runtime's bytes, built faster
            entry = d.entry if keep_prefix else strip_broker_entry_metadata(d.entry)
            parts += (heads(d.ledger_id, d.entry_id, d.partition, d.redelivery_count, len(entry),
                            d.ack_set or (), d.epoch if send_epoch else None), entry)
        view.write_parts(parts)  # one gathering write: the entries are not copied
        view.check_write_room()

    def pause_deliveries(self) -> None:
        """The socket's buffer is full: no consumer of this connection has usable permits."""
        for state in self._consumers.values():
            if state.consumer is not None:
                state.consumer.write_paused = True

    def resume_deliveries(self) -> None:
        """The socket's buffer drained: the consumers' dispatchers are kicked."""
        for state in list(self._consumers.values()):
            if state.consumer is not None:
                state.consumer.write_paused = False
                dispatcher = getattr(state.subscription, "dispatcher", None)
                if dispatcher is not None:
                    dispatcher.kick()

    def release_all(self) -> None:
        """The connection closed: every consumer leaves its subscription."""
        for state in list(self._consumers.values()):
            self._detach(state)
        self._consumers.clear()

    # -- subscribe and close ---------------------------------------------------------------

    def on_subscribe(self, frame: Frame) -> None:
        self.view.spawn(self._subscribe(frame.command.subscribe))

    def _subscribe_spec(self, request: pb.CommandSubscribe) -> SubscribeSpec:
        start = None
        if request.HasField("start_message_id"):
            start_id = MessageId.from_proto(request.start_message_id)
            start = (start_id.ledger_id, start_id.entry_id, start_id.batch_index)
        meta = request.keySharedMeta
        return SubscribeSpec(
            subscription=request.subscription,
            sub_type=_SUB_TYPES[request.subType],
            consumer_name=request.consumer_name,
            initial_position=("earliest" if request.initialPosition
                              == pb.CommandSubscribe.Earliest else "latest"),
            durable=request.durable,
            priority_level=request.priority_level,
            start_message_id=start,
            key_shared_mode="STICKY" if meta.keySharedMode == pb.STICKY else "AUTO_SPLIT",
            key_shared_ranges=tuple((r.start, r.end) for r in meta.hashRanges),
            allow_out_of_order_delivery=meta.allowOutOfOrderDelivery,
            has_key_shared_meta=request.HasField("keySharedMeta"),
            subscription_properties=key_values(request.subscription_properties),
            metadata=key_values(request.metadata),
            replicate_subscription_state=request.replicate_subscription_state,
            read_compacted=request.read_compacted,
            start_message_rollback_duration_s=request.start_message_rollback_duration_sec,
            consumer_epoch=request.consumer_epoch,
            address=self.view.peer,
            client_version=self.view.client_version,
        )

    async def _subscribe(self, request: pb.CommandSubscribe) -> None:
        view = self.view
        consumer_id, request_id = request.consumer_id, request.request_id
        existing = self._consumers.get(consumer_id)
        if existing is not None:
            if existing.ready.done() and existing.live:
                view.success(request_id)
            else:
                view.error_code(request_id, pb.ServiceNotReady,
                                "Consumer is already present on the connection")
            return
        if not view.ctx.accepting:
            view.error_code(request_id, pb.ServiceNotReady, SHUTTING_DOWN)
            return
        sink = WireConsumerSink(self, consumer_id, request.HasField("consumer_epoch"))
        state = _ConsumerState(consumer_id, asyncio.get_running_loop().create_future(), sink)
        self._consumers[consumer_id] = state
        try:
            await self._open_consumer(state, request)
        except Exception as exc:
            if self._consumers.get(consumer_id) is state:
                del self._consumers[consumer_id]
            sink.live = False
            view.error(request_id, exc)
            return
        finally:
            state.ready.set_result(None)
        if view.closed or self._consumers.get(consumer_id) is not state:
            self._detach(state)  # the connection or a CLOSE_CONSUMER beat us
            return
        view.success(request_id)

    async def _open_consumer(self, state: _ConsumerState, request: pb.CommandSubscribe) -> None:
        spec = self._subscribe_spec(request)
        name = TopicName.parse(request.topic)
        check_subscription_name(spec.subscription)  # before anything is created
        authorize(self.view, "consume from", f"{name} (subscription {spec.subscription[:100]!r})",
                  lambda authz, role: authz.can_consume(name, role, spec.subscription),
                  SUBSCRIBE_REFUSED)
        if carries_schema(request):
            self.view.ctx.schemas.admit_consumer(name, StoredSchema.from_proto(request.schema))
        topic, consumer = await self.view.service.subscribe(name, spec, state.sink)
        state.topic, state.consumer = topic, consumer
        state.subscription = _subscription_of(topic, spec)
        assert state.subscription is not None, "subscribed, yet no subscription"

    @staticmethod
    def _detach(state: _ConsumerState) -> None:
        """The consumer leaves its subscription (its unacked messages go back). Idempotent."""
        state.sink.live = False
        if state.detached or state.consumer is None:
            return  # done already, or still subscribing: `_subscribe` detaches it when done
        state.detached = True
        assert state.topic is not None
        state.topic.consumer_closed(state.subscription, state.consumer)  # type: ignore[arg-type]

    def broker_closed_consumer(self, sink: WireConsumerSink, reason: str) -> None:
        """The service removed a consumer (seek, unsubscribe by another, topic deleted):
        forget it here and tell the client, which resubscribes (wire reference §10.4)."""
        state = self._consumers.get(sink.consumer_id)
        if state is not None and state.sink is sink:
            del self._consumers[sink.consumer_id]
            state.detached = True
        sink.live = False
        log.info("closing consumer %s of %s: %s", sink.consumer_id, self.view.peer, reason)
        self.view.send(pb.CommandCloseConsumer(consumer_id=sink.consumer_id,
                                               request_id=REQUEST_ID_NONE))

    def on_close_consumer(self, frame: Frame) -> None:
        self.view.spawn(self._close_consumer(frame.command.close_consumer))

    async def _close_consumer(self, request: pb.CommandCloseConsumer) -> None:
        state = self._consumers.pop(request.consumer_id, None)
        if state is not None:
            await asyncio.wait([state.ready])
            async with state.lock:
                self._detach(state)
        self.view.success(request.request_id)

    def _live_consumer(self, consumer_id: int) -> _ConsumerState | None:
        state = self._consumers.get(consumer_id)
        return state if state is not None and state.ready.done() and state.live else None

    # -- flow, acks, redelivery ------------------------------------------------------------

    def on_flow(self, frame: Frame) -> None:
        flow = frame.command.flow
        state = self._live_consumer(flow.consumer_id)
        if state is None:
            log.debug("FLOW for unknown consumer %s of %s", flow.consumer_id, self.view.peer)
            return
        assert state.subscription is not None
        assert state.consumer is not None
        state.subscription.flow(state.consumer, flow.messagePermits)

    def on_ack(self, frame: Frame) -> None:
        self.view.spawn(self._ack(frame.command.ack))

    async def _ack(self, request: pb.CommandAck) -> None:
        state = self._live_consumer(request.consumer_id)
        error: tuple[int, str] | None = None
        if state is None:
            error = (pb.ConsumerNotFound, f"Consumer {request.consumer_id} not found")
        elif request.txnid_least_bits or request.txnid_most_bits:
            error = (pb.NotAllowedError, TRANSACTIONS_DISABLED)
        else:
            acks = [(ledger if (ledger := m.ledgerId) <= INT64_MAX else ledger - _UINT64_SPAN,
                     entry if (entry := m.entryId) <= INT64_MAX else entry - _UINT64_SPAN,
                     list(words) if (words := m.ack_set) else None)  # `signed`, inlined:
                    for m in request.message_id]  # an ACK holds up to a thousand ids
            async with state.lock:
                try:
                    await self._apply_ack(state, request.ack_type, acks)
                except Exception as exc:
                    self.view.log_failure(exc)
                    error = server_error(exc)
        if request.HasField("request_id"):
            self._ack_response(request, error)

    @staticmethod
    async def _apply_ack(state: _ConsumerState, ack_type: int,
                         acks: list[tuple[int, int, list[int] | None]]) -> None:
        subscription = state.subscription
        if state.detached or not isinstance(subscription, Subscription):
            return  # gone meanwhile, or non-persistent: acks are no-ops there
        await subscription.acknowledge(state.consumer, ack_type, acks)

    def _ack_response(self, request: pb.CommandAck, error: tuple[int, str] | None) -> None:
        reply = pb.CommandAckResponse(consumer_id=request.consumer_id,
                                      request_id=request.request_id,
                                      txnid_least_bits=request.txnid_least_bits,
                                      txnid_most_bits=request.txnid_most_bits)
        if error is not None:
            reply.error = error[0]  # type: ignore[assignment]
            reply.message = error[1]
        self.view.send(reply)

    def on_redeliver(self, frame: Frame) -> None:
        self.view.spawn(self._redeliver(frame.command.redeliverUnacknowledgedMessages))

    async def _redeliver(self, request: pb.CommandRedeliverUnacknowledgedMessages) -> None:
        state = self._live_consumer(request.consumer_id)
        if state is None:
            return
        async with state.lock:
            consumer, subscription = state.consumer, state.subscription
            if state.detached or consumer is None or not isinstance(subscription, Subscription):
                return
            if request.HasField("consumer_epoch") and request.consumer_epoch > consumer.epoch:
                consumer.epoch = request.consumer_epoch
            positions = [(signed(m.ledgerId), signed(m.entryId)) for m in request.message_ids]
            subscription.redeliver(consumer, positions or None)

    # -- unsubscribe, seek, last message id, stats -----------------------------------------

    def on_unsubscribe(self, frame: Frame) -> None:
        self.view.spawn(self._unsubscribe(frame.command.unsubscribe))

    async def _unsubscribe(self, request: pb.CommandUnsubscribe) -> None:
        state = self._live_consumer(request.consumer_id)
        if state is None:
            self.view.error_code(request.request_id, pb.MetadataError, "Consumer not found")
            return
        async with state.lock:
            try:
                await self._delete_subscription(state, request.force)
            except Exception as exc:
                self.view.error(request.request_id, exc)
                return
        if self._consumers.get(request.consumer_id) is state:
            del self._consumers[request.consumer_id]
        self.view.success(request.request_id)

    async def _delete_subscription(self, state: _ConsumerState, force: bool) -> None:
        topic, subscription = state.topic, state.subscription
        assert topic is not None
        assert subscription is not None
        if state.detached:
            raise ConsumerNotFoundError("Consumer not found")
        if isinstance(subscription, Subscription) and subscription.durable:
            assert isinstance(topic, PersistentTopic)
            await topic.unsubscribe(subscription.name, state.consumer, force)
            state.sink.live = False
            state.detached = True  # the topic removed it with the subscription
        else:
            self._detach(state)  # readers and non-persistent subscriptions vanish when empty

    def on_seek(self, frame: Frame) -> None:
        self.view.spawn(self._seek(frame.command.seek))

    async def _seek(self, request: pb.CommandSeek) -> None:
        state = self._live_consumer(request.consumer_id)
        if state is None:
            self.view.error_code(request.request_id, pb.MetadataError, "Consumer not found")
            return
        async with state.lock:
            try:
                await self._reset_subscription(state, request)
            except Exception as exc:
                self.view.error(request.request_id, exc)
                return
        self.view.success(request.request_id)

    @staticmethod
    async def _reset_subscription(state: _ConsumerState, request: pb.CommandSeek) -> None:
        subscription = state.subscription
        if not isinstance(subscription, Subscription):
            raise NotAllowedError("Seek is not supported on non-persistent topics")
        if state.detached:
            raise ConsumerNotFoundError("Consumer not found")
        # The subscription closes its consumers through their sinks (CLOSE_CONSUMER) first.
        if request.HasField("message_id"):
            target = MessageId.from_proto(request.message_id)
            await subscription.reset_cursor(Position(target.ledger_id, target.entry_id))
        elif request.HasField("message_publish_time"):
            await subscription.reset_cursor_by_time(request.message_publish_time)
        else:
            raise NotAllowedError("Seek needs a message id or a publish time")

    def on_get_last_message_id(self, frame: Frame) -> None:
        """Answered at once when the last entry is in the storage's memory; otherwise its
        read goes to the loader and the answer follows (the loop never reads the disk)."""
        request = frame.command.getLastMessageId
        state = self._live_consumer(request.consumer_id)
        if state is None:
            self.view.error_code(request.request_id, pb.MetadataError, "Consumer not found")
            return
        try:
            reply = self._last_message_id(state, request.request_id)
        except _NeedsLoad as load:
            self.view.spawn(self._answer_after_load(state, request.request_id, load.position))
            return
        except Exception as exc:
            self.view.error(request.request_id, exc)
            return
        self.view.send(reply)

    async def _answer_after_load(self, state: _ConsumerState, request_id: int,
                                 position: Position) -> None:
        topic = state.topic
        assert isinstance(topic, PersistentTopic)
        try:
            loaded = await topic.managed_ledger.read_entries_async(position, 1, 1)
            reply = self._last_message_id(state, request_id, dict(loaded))
        except Exception as exc:
            self.view.error(request_id, exc)
            return
        self.view.send(reply)

    @staticmethod
    def _last_message_id(state: _ConsumerState, request_id: int,
                         loaded: dict[Position, bytes] | None = None,
                         ) -> pb.CommandGetLastMessageIdResponse:
        """Raises `_NeedsLoad` when the last entry is neither in `loaded` nor in memory."""
        topic = state.topic
        if not isinstance(topic, PersistentTopic):
            raise NotAllowedError("GetLastMessageId is not supported on non-persistent topics")
        ml = topic.managed_ledger
        last = ml.last_confirmed_position
        partition = topic.name.partition_index
        last_id = id_data(-1, -1, partition)
        last_id.batch_index = -1
        subscription = state.subscription
        compacted = _last_compacted(subscription, last)
        if compacted is not None:  # nothing live after the horizon: the view's last message
            if compacted[0].entry_id >= 0:
                last_id = id_data(compacted[0].ledger_id, compacted[0].entry_id, partition)
                last_id.batch_index = compacted[1]
        elif last.entry_id >= 0:
            last_id = id_data(last.ledger_id, last.entry_id, partition)
            last_id.batch_index = -1
            # The last entry's ledger may be trimmed already (nothing retains it): the position
            # still stands, without the batch index only its entry could tell.
            if ml.is_valid_position(last):
                data = (loaded or {}).get(last)
                if data is None:
                    cached = ml.read_cached(ml.plan_runs(last, 1), 1)
                    if not cached:
                        raise _NeedsLoad(last)
                    data = cached[0][1]
                entry = EntryInfo(last, data)
                # A stored count is a client's claim: clamped, so a bad one cannot fail it.
                if entry.metadata.HasField("num_messages_in_batch"):
                    last_id.batch_index = entry.batch_size - 1
        reply = pb.CommandGetLastMessageIdResponse(last_message_id=last_id, request_id=request_id)
        # Every subscription of a persistent topic answers its mark-delete position, readers'
        # non-durable ones included: the C++ client's has_message_available() for a reader at
        # `latest` compares it with the last id (and says False when it is missing).
        if isinstance(subscription, Subscription):
            mark = subscription.cursor.mark_delete_position
            if mark.ledger_id >= 0:
                reply.consumer_mark_delete_position.CopyFrom(
                    id_data(mark.ledger_id, mark.entry_id))
        return reply

    def on_stats(self, frame: Frame) -> None:
        request = frame.command.consumerStats
        reply = pb.CommandConsumerStatsResponse(request_id=request.request_id)
        state = self._live_consumer(request.consumer_id)
        if state is None or state.consumer is None:
            reply.error_code = pb.ConsumerNotFound
            reply.error_message = f"Consumer {request.consumer_id} not found"
            self.view.send(reply)
            return
        consumer = state.consumer
        reply.msgRateOut = consumer.rate_out.rate
        reply.msgThroughputOut = consumer.rate_out.value_rate
        reply.msgRateRedeliver = 0.0
        reply.msgRateExpired = reply.messageAckRate = 0.0
        reply.consumerName = consumer.consumer_name
        reply.availablePermits = max(0, consumer.permits)
        reply.unackedMessages = consumer.unacked_messages
        reply.blockedConsumerOnUnackedMsgs = consumer.blocked_on_unacked
        reply.address = self.view.peer
        reply.connectedSince = consumer.connected_since
        reply.type = consumer.spec.sub_type
        subscription = state.subscription
        reply.msgBacklog = subscription.backlog() if isinstance(subscription, Subscription) else 0
        self.view.send(reply)


def _last_compacted(subscription: object, last: Position) -> tuple[Position, int] | None:
    """For a read_compacted subscription whose topic has nothing after the compaction
    horizon: the (position, batch index) of the compacted view's last message ((-1, -1) when
    the view is empty), which is what such a consumer can receive last (Pulsar answers it so
    that `has_message_available` is not left waiting for a message compacted out). None
    otherwise."""
    if not isinstance(subscription, Subscription) or not subscription.compacted.enabled:
        return None
    view = subscription.topic.compacted_view
    if view is None or last > view.horizon:
        return None
    if view.entries == 0:
        return Position(-1, -1), -1
    position, entry = decode_compacted_entry(view.storage.read_entry(view.ledger_id,
                                                                     view.entries - 1))
    mask = live_mask(entry)
    if mask is not None:
        return position, mask.bit_length() - 1
    info = EntryInfo(position, entry)
    batch = info.batch_size - 1 if info.metadata.HasField("num_messages_in_batch") else -1
    return position, batch


class _NeedsLoad(Exception):  # an outcome, not an error
    """The last entry needs the disk: answer after loading it (`position`)."""

    def __init__(self, position: Position):
        super().__init__(f"{position} needs a load")
        self.position = position
