"""`EmbeddedTransport`: the broker in this process, called directly.

Theory of operation
-------------------
`open` takes the data directory's lock by opening `storage.Storage` (recovery runs in a worker
thread, so the client's loop never waits on the disk), builds a `broker.BrokerService` on it and
starts the service on the client's loop. From then on every transport call is a direct call
into the service -- the same calls the TCP server's command handlers make
(`broker/wire/_producers.py`, `_consumers.py`) -- with no socket and no frame encoding: a send
hands the entry bytes to `PersistentTopic.publish`, deliveries arrive through a `ConsumerSink`
whose `deliver` parses each stored entry and passes it on.

Ordering: as on a connection, acks, redeliveries, seeks, unsubscribes and closes of one
consumer run one after the other under that consumer's lock, so a redelivery never overtakes an
ack issued before it.

Publishes: `send` appends to its producer's run of sends, and once per turn of the loop (or at
once at the end of a burst of sends, `end_burst`) every run goes to its topic as the TCP
server's SENDs of one socket read do: the topic admits the run in order and adds it through
one `AddGroup` for all the runs (one storage write), whose confirmation resolves each run's
receipts in order right there -- no task per run, and the receipts come before the entries
are dispatched to consumers (which their producers wait for). A run the topic cannot add
that way now (an earlier publish of it still queued, or a non-persistent topic) is published
in a task (`publish_many_soon` / `publish_many`). Either way one producer's entries are stored
in call order. A run is bounded by its producer's pending-message limit
(`max_pending_messages`: a send holds a slot until its receipt).

`close` closes the service (topics, managed ledgers, dedup snapshots) and then the storage
(queued writes, checkpoint, the directory lock) in a worker thread.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from magnetar.broker import (
    BrokerConfig,
    BrokerError,
    BrokerService,
    Consumer,
    Delivery,
    NotAllowedError,
    PersistentTopic,
    Position,
    ProducerSpec,
    SubscribeSpec,
    TopicName,
)

# Not in broker's __all__: what the TCP server's command handlers use besides the service.
from magnetar.broker._errors import ConsumerNotFoundError, from_storage_error
from magnetar.broker._names import check_producer_name, check_subscription_name
from magnetar.broker.dispatch._entry import EntryInfo
from magnetar.broker.dispatch._nonpersistent import NonPersistentSubscription
from magnetar.broker.dispatch._subscription import Subscription
from magnetar.broker.ledger._add_group import AddGroup
from magnetar.broker.ledger._position import InvalidPositionError
from magnetar.broker.topics._nonpersistent_topic import NonPersistentTopic
from magnetar.broker.topics._producer import PublishResult
from magnetar.broker.topics._publishing import Send
from magnetar.broker.topics._topic import Producer
from magnetar.codec import MessageId, RemoteProtocolError, encode_entry, parse_entry, pb
from magnetar.storage import DataDirLockedError, Storage, StorageConfig, StorageError

from ._errors import ConnectError, InvalidConfiguration, PulsarException, error_for_code
from ._transport import (
    ConsumerEvents,
    Incoming,
    ProducerEvents,
    ProducerOpened,
    ProducerRequest,
    SendReceipt,
    SubscribeRequest,
)

__all__ = ["EmbeddedTransport"]

# One send of a run: sequence id, highest sequence id, metadata, payload, its receipt.
_Send = tuple[int, int, pb.MessageMetadata, bytes, SendReceipt]

_ACK_TYPES = {False: pb.CommandAck.Individual, True: pb.CommandAck.Cumulative}


def converted(exc: BaseException, where: str) -> PulsarException:
    """The client exception for what the service raised (its wire code decides the class)."""
    if isinstance(exc, PulsarException):
        return exc
    if isinstance(exc, BrokerError):
        return error_for_code(exc.code, str(exc) or type(exc).__name__, where)
    if isinstance(exc, StorageError):
        return error_for_code(from_storage_error(exc).code, str(exc), where)
    return error_for_code(0, f"{type(exc).__name__}: {exc}", where)


class _Sink:
    """The `ConsumerSink` of one embedded consumer: stored entries become `Incoming`s."""

    def __init__(self, events: ConsumerEvents):
        self.events = events
        self.live = True

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        if not self.live:
            return
        for delivery in deliveries:
            try:
                entry = parse_entry(delivery.entry, verify_checksum=False)
            except RemoteProtocolError:
                continue  # unreadable stored bytes: the dispatcher's own checks report them
            self.events.on_message(Incoming(
                delivery.ledger_id, delivery.entry_id, delivery.partition,
                delivery.redelivery_count, delivery.ack_set, delivery.epoch,
                entry.metadata, entry.payload))

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        pass

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        if self.live:
            self.live = False
            self.events.on_closed(reason)


@dataclass
class _ConsumerState:
    topic: PersistentTopic | NonPersistentTopic
    consumer: Consumer
    subscription: Subscription | NonPersistentSubscription
    sink: _Sink
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class EmbeddedTransport:
    """The in-process broker (see the module comment). Build it with `open`."""

    def __init__(self, data_dir: str, storage: Storage, service: BrokerService):
        self.data_dir = data_dir
        self.immediate_close = False
        self.storage = storage
        self.service = service
        self._producers: dict[int, tuple[PersistentTopic | NonPersistentTopic, Producer]] = {}
        self._consumers: dict[int, _ConsumerState] = {}
        # Sends of this turn of the loop, by producer (see the module comment).
        self._runs: dict[int, list[_Send]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._bursting = False
        self._runs_due = False  # `_start_runs` is scheduled

    @classmethod
    async def open(cls, data_dir: str, config: BrokerConfig | None = None,
                   storage_config: StorageConfig | None = None) -> EmbeddedTransport:
        """Open the data directory and start the broker on the running loop.

        Raises:
            InvalidConfiguration: the path exists and is not a directory, or cannot be used.
            ConnectError: another process holds the directory (the message names it and
                points to `magnetar standalone`).
        """
        path = os.path.abspath(data_dir)
        if os.path.exists(path) and not os.path.isdir(path):
            raise InvalidConfiguration(f"data directory {path} is not a directory")
        try:
            storage = await asyncio.to_thread(Storage.open, path, storage_config)
        except DataDirLockedError as exc:
            raise ConnectError(
                f"cannot open {path}: {exc}; to share one data directory between processes, "
                f"run `magnetar standalone --data-dir {path}` and connect with "
                f"magnetar.Client('pulsar://127.0.0.1:6650')") from None
        except (OSError, StorageError) as exc:
            raise InvalidConfiguration(f"cannot use data directory {path}: {exc}") from None
        try:
            service = BrokerService(storage, config)
            await service.start()
        except BaseException:
            await asyncio.to_thread(storage.close)
            raise
        return cls(path, storage, service)

    @property
    def max_message_size(self) -> int:
        return self.service.config.max_message_size_bytes

    async def close(self) -> None:
        for state in self._consumers.values():
            state.sink.live = False
        self._consumers.clear()
        self._producers.clear()
        try:
            await self.service.close()
        finally:
            await asyncio.to_thread(self.storage.close)

    # -- lookup ----------------------------------------------------------------------------

    async def partitioned_metadata(self, topic: str) -> int:
        try:
            return await self.service.partitioned_metadata(TopicName.parse(topic))
        except BrokerError as exc:
            raise converted(exc, f"partitioned metadata of {topic}") from None

    async def topics_of_namespace(self, namespace: str, mode: str) -> list[str]:
        return self.service.list_topics(namespace, mode)

    # -- producers -------------------------------------------------------------------------

    async def create_producer(self, producer_id: int, request: ProducerRequest,
                              events: ProducerEvents) -> ProducerOpened:
        where = f"create producer on {request.topic}"
        try:
            name = TopicName.parse(request.topic)
            check_producer_name(request.producer_name)
            spec = ProducerSpec(producer_name=request.producer_name,
                                access_mode=request.access_mode,
                                metadata=dict(request.properties),
                                initial_subscription_name=request.initial_subscription_name,
                                address="embedded", client_version="magnetar")
            topic, producer = await self.service.create_producer(name, spec)
            try:
                self.service.schemas.admit_schemaless_producer(name)
                if producer.waiter is not None:  # WaitForExclusive: until promoted
                    await asyncio.shield(producer.waiter.admitted)
                    await topic.epoch_durable()
            except BaseException:
                topic.remove_producer(producer)
                raise
        except (BrokerError, StorageError) as exc:
            raise converted(exc, where) from None
        producer.closer = events.on_closed
        self._producers[producer_id] = (topic, producer)
        return ProducerOpened(producer.name, topic.last_sequence_id(producer))

    def send(self, producer_id: int, sequence_id: int, highest_sequence_id: int,
             num_messages: int, metadata: pb.MessageMetadata, payload: bytes) -> SendReceipt:
        receipt = SendReceipt()
        if not self._runs_due and not self._bursting:
            self._runs_due = True
            asyncio.get_running_loop().call_soon(self._start_runs)
        run = self._runs.get(producer_id)
        if run is None:
            run = self._runs[producer_id] = []
        run.append((sequence_id, highest_sequence_id, metadata, payload, receipt))
        return receipt

    def begin_burst(self) -> None:
        self._bursting = True

    def end_burst(self) -> None:
        self._bursting = False
        if self._runs and not self._runs_due:
            self._start_runs()

    def _start_runs(self) -> None:
        self._runs_due = False
        runs, self._runs = self._runs, {}
        group = AddGroup()
        for producer_id, run in runs.items():
            found = self._producers.get(producer_id)
            if found is None:
                for sequence_id, _, _, _, receipt in run:
                    receipt.set_exception(error_for_code(
                        pb.TopicTerminatedError, "the producer is closed",
                        f"send of sequence id {sequence_id}"))
                continue
            topic, producer = found
            sends: list[Send] = [(encode_entry(metadata, payload), sequence_id, highest,
                                  metadata) for sequence_id, highest, metadata, payload, _ in run]
            if not isinstance(topic, PersistentTopic):
                self._spawn(self._publish(str(topic.name), run,
                                          topic.publish_many(producer, sends)))
            elif not topic.publish_grouped(producer, sends, group, _answer,
                                           (str(topic.name), run)):
                self._spawn(self._publish(str(topic.name), run,
                                          topic.publish_many_soon(producer, sends)))
        added = group.submit()
        if added is not None:
            self._spawn(added)

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _publish(topic: str, run: list[_Send],
                       publish: Awaitable[list[PublishResult | BaseException]]) -> None:
        """Resolve a run's receipts once its publish (a task) is over."""
        try:
            outcomes = await publish
        except Exception as exc:  # publish_many reports per send; this is a bug's safety net
            outcomes = [exc] * len(run)
        _answer((topic, run), outcomes)

    async def close_producer(self, producer_id: int) -> None:
        found = self._producers.pop(producer_id, None)
        if found is not None:
            topic, producer = found
            producer.closer = None
            topic.remove_producer(producer)

    # -- consumers -------------------------------------------------------------------------

    async def subscribe(self, consumer_id: int, request: SubscribeRequest,
                        events: ConsumerEvents) -> None:
        start = request.start_message_id
        key_shared = request.key_shared
        spec = SubscribeSpec(
            subscription=request.subscription, sub_type=request.sub_type,
            consumer_name=request.consumer_name, initial_position=request.initial_position,
            durable=request.durable,
            start_message_id=None if start is None else
            (start.ledger_id, start.entry_id, start.batch_index),
            subscription_properties=dict(request.properties), consumer_epoch=request.epoch,
            address="embedded", client_version="magnetar",
            has_key_shared_meta=key_shared is not None,
            key_shared_mode=key_shared.mode if key_shared else "AUTO_SPLIT",
            key_shared_ranges=key_shared.ranges if key_shared else (),
            allow_out_of_order_delivery=bool(key_shared and
                                             key_shared.allow_out_of_order_delivery))
        sink = _Sink(events)
        where = f"subscribe {request.subscription!r} to {request.topic}"
        try:
            name = TopicName.parse(request.topic)
            check_subscription_name(request.subscription)
            topic, consumer = await self.service.subscribe(name, spec, sink)
        except (BrokerError, StorageError) as exc:
            raise converted(exc, where) from None
        subscription: Subscription | NonPersistentSubscription
        if isinstance(topic, PersistentTopic):
            table = topic.subscriptions if request.durable else topic.readers
            subscription = table[request.subscription]
        else:
            subscription = topic.subscriptions[request.subscription]
        self._consumers[consumer_id] = _ConsumerState(topic, consumer, subscription, sink)

    def _state(self, consumer_id: int, what: str) -> _ConsumerState:
        state = self._consumers.get(consumer_id)
        if state is None or not state.sink.live:
            raise converted(ConsumerNotFoundError("the consumer is not connected"), what)
        return state

    def flow(self, consumer_id: int, permits: int) -> None:
        state = self._consumers.get(consumer_id)
        if state is not None and state.sink.live:
            state.subscription.flow(state.consumer, permits)

    async def ack(self, consumer_id: int, acks: list[tuple[int, int, list[int] | None]],
                  cumulative: bool, wait: bool = False) -> None:
        """(In-process every ack returns once stored, `wait` or not.)"""
        state = self._consumers.get(consumer_id)
        if state is None or not state.sink.live:
            return  # gone: the broker redelivers what was not acknowledged, as over TCP
        subscription = state.subscription
        if not isinstance(subscription, Subscription):
            return  # non-persistent: acks are no-ops there, as over TCP
        async with state.lock:
            try:
                await subscription.acknowledge(state.consumer, _ACK_TYPES[cumulative], acks)
            except (BrokerError, StorageError) as exc:
                raise converted(exc, f"ack on {state.topic.name}") from None

    async def redeliver(self, consumer_id: int, ids: list[tuple[int, int]] | None,
                        epoch: int) -> None:
        state = self._consumers.get(consumer_id)
        if state is None or not state.sink.live:
            return
        subscription = state.subscription
        if not isinstance(subscription, Subscription):
            return  # non-persistent: nothing is kept to redeliver
        async with state.lock:
            if epoch > state.consumer.epoch:
                state.consumer.epoch = epoch
            subscription.redeliver(state.consumer, ids)

    async def seek(self, consumer_id: int, target: MessageId | int) -> None:
        state = self._state(consumer_id, "seek")
        subscription = _persistent(state, "seek")
        async with state.lock:
            try:
                if isinstance(target, MessageId):
                    await subscription.reset_cursor(Position(target.ledger_id, target.entry_id))
                else:
                    await subscription.reset_cursor_by_time(target)
            except (BrokerError, StorageError) as exc:
                raise converted(exc, f"seek on {state.topic.name}") from None

    async def last_message_id(self, consumer_id: int) -> tuple[MessageId, MessageId | None]:
        """The topic's last message id (its batch index read from the last entry: from
        memory, or loaded off the loop) and the subscription's mark-delete position."""
        state = self._state(consumer_id, "get last message id")
        subscription = _persistent(state, "get last message id")
        topic = state.topic
        assert isinstance(topic, PersistentTopic)
        ml = topic.managed_ledger
        last = ml.last_confirmed_position
        partition = topic.name.partition_index
        last_id = MessageId(-1, -1, partition)
        if last.entry_id >= 0:
            batch_index = -1
            try:
                entry = EntryInfo(last, await ml.read_entry_async(last))
            except InvalidPositionError:
                pass  # trimmed already: the position stands, without its batch index
            else:
                if entry.metadata.HasField("num_messages_in_batch"):
                    batch_index = entry.batch_size - 1
            last_id = MessageId(last.ledger_id, last.entry_id, partition, batch_index)
        mark = subscription.cursor.mark_delete_position
        mark_id = MessageId(mark.ledger_id, mark.entry_id) if mark.ledger_id >= 0 else None
        return last_id, mark_id

    async def unsubscribe(self, consumer_id: int) -> None:
        state = self._state(consumer_id, "unsubscribe")
        async with state.lock:
            try:
                subscription = state.subscription
                if isinstance(subscription, Subscription) and subscription.durable:
                    assert isinstance(state.topic, PersistentTopic)
                    await state.topic.unsubscribe(subscription.name, state.consumer, False)
                else:
                    state.topic.consumer_closed(subscription, state.consumer)  # type: ignore[arg-type]
            except (BrokerError, StorageError) as exc:
                raise converted(exc, f"unsubscribe {state.subscription.name!r} from "
                                     f"{state.topic.name}") from None
            state.sink.live = False
            self._consumers.pop(consumer_id, None)

    async def close_consumer(self, consumer_id: int) -> None:
        state = self._consumers.pop(consumer_id, None)
        if state is None:
            return
        async with state.lock:
            if state.sink.live:
                state.sink.live = False
                state.topic.consumer_closed(state.subscription, state.consumer)  # type: ignore[arg-type]


def _answer(key: tuple[str, list[_Send]],
            outcomes: list[PublishResult | BaseException]) -> None:
    """Resolve the receipts of one run of sends to topic `key[0]`, one outcome each, in order."""
    topic, run = key
    for (_, _, _, _, receipt), outcome in zip(run, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            receipt.set_exception(converted(outcome, f"send to {topic}"))
        else:
            receipt.set_result((outcome.ledger_id, outcome.entry_id))


def _persistent(state: _ConsumerState, what: str) -> Subscription:
    """The consumer's subscription, which `what` needs persistent.

    Raises:
        NotAllowedError (as a client exception): a non-persistent topic.
    """
    if not isinstance(state.subscription, Subscription):
        raise converted(NotAllowedError(f"{what} is not supported on non-persistent topics"),
                        f"{what} on {state.topic.name}")
    return state.subscription
