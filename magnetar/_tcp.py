"""`TcpTransport`: the binary protocol over TCP (optionally TLS) through `codec.Connection`.

Theory of operation
-------------------
Connections are pooled by broker address. The first one goes to the service URL and answers
lookups (LOOKUP, PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE); a producer or consumer is
created on the connection its topic's lookup names (following Redirect answers up to
`LOOKUP_REDIRECTS_MAX` times), so the client works against our standalone broker and against a
Pulsar cluster alike.

Each `_Connection` runs one reader task: it feeds received bytes to its sans-IO
`codec.Connection` and routes each frame -- responses by request id to the waiting future,
SEND_RECEIPT/SEND_ERROR to the producer's queue of sends in order, MESSAGE to the consumer's
events, CLOSE_PRODUCER/CLOSE_CONSUMER to the broker-close callbacks, PING to a PONG. Writes go
straight to the stream writer; `send` awaits nothing before writing, so SENDs leave in call
order.

When a connection breaks, every request waiting on it fails with `ConnectError`, its producers'
sends fail with `NotConnected` and its producers are told they were closed; its consumers are
told they were closed, and resubscribe through a fresh lookup (`_consumer.py`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from google.protobuf.message import Message as ProtoMessage

from codec import (
    NEED_DATA,
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    MessageId,
    ProtocolError,
    Role,
    base_command,
    pb,
)

from ._errors import (
    ConnectError,
    InvalidUrl,
    LookupError,
    NotConnected,
    PulsarException,
    Timeout,
    error_for_code,
)
from ._transport import (
    ConsumerEvents,
    Incoming,
    ProducerEvents,
    ProducerOpened,
    ProducerRequest,
    SubscribeRequest,
)

__all__ = ["TcpTransport", "TlsSettings"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION: Final = 19
CLIENT_VERSION: Final = "magnetar"
LOOKUP_REDIRECTS_MAX: Final = 5
READ_BYTES_MAX: Final = 256 * 1024
_T = pb.BaseCommand
_SUB_TYPES: Final = {"Exclusive": pb.CommandSubscribe.Exclusive,
                     "Shared": pb.CommandSubscribe.Shared,
                     "Failover": pb.CommandSubscribe.Failover,
                     "Key_Shared": pb.CommandSubscribe.Key_Shared}
_ACCESS_MODES: Final = {"Shared": pb.Shared, "Exclusive": pb.Exclusive,
                        "WaitForExclusive": pb.WaitForExclusive,
                        "ExclusiveWithFencing": pb.ExclusiveWithFencing}
_NAMESPACE_MODES: Final = {"PERSISTENT": pb.CommandGetTopicsOfNamespace.PERSISTENT,
                           "NON_PERSISTENT": pb.CommandGetTopicsOfNamespace.NON_PERSISTENT,
                           "ALL": pb.CommandGetTopicsOfNamespace.ALL}
_UINT64: Final = (1 << 64) - 1


@dataclass(frozen=True)
class TlsSettings:
    trust_certs_file: str | None = None
    allow_insecure: bool = False
    validate_hostname: bool = False

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.trust_certs_file)
        if self.allow_insecure or not self.validate_hostname:
            context.check_hostname = False
        if self.allow_insecure:
            context.verify_mode = ssl.CERT_NONE
        return context


def parse_address(url: str) -> tuple[str, int, bool]:
    """(host, port, tls) of a `pulsar://` or `pulsar+ssl://` URL.

    Raises:
        InvalidUrl: another scheme, no host, or a bad port.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("pulsar", "pulsar+ssl"):
        raise InvalidUrl(f"unsupported service URL {url!r}: use pulsar://host:port, "
                         f"pulsar+ssl://host:port, or a data directory")
    tls = parts.scheme == "pulsar+ssl"
    try:
        port = parts.port or (6651 if tls else 6650)
    except ValueError:
        raise InvalidUrl(f"bad port in service URL {url!r}") from None
    if not parts.hostname:
        raise InvalidUrl(f"no host in service URL {url!r}")
    return parts.hostname, port, tls


class _Connection:
    """One TCP connection (see the module comment)."""

    def __init__(self, owner: TcpTransport, url: str):
        self.owner = owner
        self.url = url
        self.host, self.port, self.tls = parse_address(url)
        self.conn = Connection(Role.CLIENT)
        self.max_message_size = 5 * 1024 * 1024
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._requests: dict[int, asyncio.Future[Frame]] = {}
        self.sends: dict[int, deque[tuple[int, asyncio.Future[tuple[int, int]]]]] = {}
        self.producers: dict[int, ProducerEvents] = {}
        self.consumers: dict[int, ConsumerEvents] = {}
        self.closed = False

    async def open(self, timeout_s: float) -> None:
        """Connect and complete the handshake.

        Raises:
            ConnectError: the broker cannot be reached or refused the connection.
        """
        context = self.owner.tls.context() if self.tls else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=context), timeout_s)
        except (OSError, TimeoutError) as exc:
            raise ConnectError(f"cannot connect to {self.url}: {exc or 'timed out'}") from None
        self._writer = writer
        waiter: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._requests[-1] = waiter  # the handshake's answer
        self._reader_task = asyncio.ensure_future(self._read(reader))
        self.write(pb.CommandConnect(client_version=CLIENT_VERSION,
                                     protocol_version=PROTOCOL_VERSION))
        try:
            frame = await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            self.close()
            raise ConnectError(f"no CONNECTED from {self.url} within {timeout_s} s") from None
        except PulsarException as exc:
            self.close()
            raise ConnectError(f"{self.url} refused the connection: {exc}") from None
        connected = frame.command.connected
        if connected.HasField("max_message_size"):
            self.max_message_size = connected.max_message_size

    def write(self, body: ProtoMessage, metadata: pb.MessageMetadata | None = None,
              payload: bytes = b"") -> None:
        if self.closed or self._writer is None:
            raise NotConnected(f"the connection to {self.url} is closed")
        try:
            data = self.conn.send(base_command(body), metadata, payload)
        except ProtocolError as exc:
            raise PulsarException(f"cannot send to {self.url}: {exc}") from None
        self._writer.write(data)

    async def request(self, body: Any, where: str) -> Frame:
        """Send a command carrying `request_id` and wait for its answer.

        Raises:
            The mapped broker error; `Timeout` after the operation timeout; `ConnectError`.
        """
        request_id = body.request_id
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        try:
            self.write(body)
            return await asyncio.wait_for(future, self.owner.operation_timeout_s)
        except TimeoutError:
            raise Timeout(f"{where}: no answer from {self.url} within "
                          f"{self.owner.operation_timeout_s} s") from None
        except PulsarException as exc:
            raise type(exc)(f"{where}: {exc}") from None
        finally:
            self._requests.pop(request_id, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await reader.read(READ_BYTES_MAX)
                self.conn.receive_data(data)
                while (event := self.conn.next_event()) is not NEED_DATA:
                    if isinstance(event, ConnectionClosed):
                        return
                    if isinstance(event, Frame):
                        self._route(event)
                    elif isinstance(event, ChecksumMismatch):
                        log.warning("a frame from %s failed its checksum", self.url)
                if not data:
                    return
        except (OSError, ProtocolError) as exc:
            log.info("connection to %s failed: %s", self.url, exc)
        finally:
            self._lost()

    def _route(self, frame: Frame) -> None:
        command = frame.command
        kind = command.type
        if kind == _T.MESSAGE:
            self._message(frame)
        elif kind == _T.SEND_RECEIPT:
            receipt = command.send_receipt
            self._send_done(receipt.producer_id, receipt.sequence_id,
                            (receipt.message_id.ledgerId, receipt.message_id.entryId), None)
        elif kind == _T.SEND_ERROR:
            error = command.send_error
            self._send_done(error.producer_id, error.sequence_id, None,
                            error_for_code(error.error, error.message, f"send to {self.url}"))
        elif kind == _T.PING:
            self.write(pb.CommandPong())
        elif kind == _T.CONNECTED:
            self._resolve(-1, frame)
        elif kind == _T.CLOSE_PRODUCER:
            events = self.producers.pop(command.close_producer.producer_id, None)
            if events is not None:
                events.on_closed("CLOSE_PRODUCER from the broker")
        elif kind == _T.CLOSE_CONSUMER:
            consumer = self.consumers.pop(command.close_consumer.consumer_id, None)
            if consumer is not None:
                consumer.on_closed("CLOSE_CONSUMER from the broker")
        elif kind == _T.PRODUCER_SUCCESS and not command.producer_success.producer_ready:
            pass  # WaitForExclusive: a second PRODUCER_SUCCESS follows once it is admitted
        else:
            request_id = getattr(frame.body, "request_id", None)
            if kind == _T.ERROR:
                refusal = command.error
                self._fail(refusal.request_id, error_for_code(refusal.error, refusal.message,
                                                              self.url))
            elif request_id is not None:
                self._resolve(request_id, frame)

    def _resolve(self, request_id: int, frame: Frame) -> None:
        future = self._requests.get(request_id)
        if future is not None and not future.done():
            future.set_result(frame)

    def _fail(self, request_id: int, error: PulsarException) -> None:
        future = self._requests.get(request_id, self._requests.get(-1))
        if future is not None and not future.done():
            future.set_exception(error)

    def _send_done(self, producer_id: int, sequence_id: int, ids: tuple[int, int] | None,
                   error: PulsarException | None) -> None:
        queue = self.sends.get(producer_id)
        if not queue:
            return
        # Receipts come in send order (a chunked message's chunks share a sequence id).
        if queue[0][0] != sequence_id:
            log.warning("receipt for sequence id %s from %s does not match the oldest send "
                        "(%s); ignored", sequence_id, self.url, queue[0][0])
            return
        _, future = queue.popleft()
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert ids is not None
            ledger, entry = ids
            future.set_result((_signed(ledger), _signed(entry)))

    def _message(self, frame: Frame) -> None:
        message = frame.command.message
        events = self.consumers.get(message.consumer_id)
        if events is None or frame.metadata is None:
            return
        message_id = message.message_id
        events.on_message(Incoming(
            _signed(message_id.ledgerId), _signed(message_id.entryId), message_id.partition,
            message.redelivery_count, list(message.ack_set) or None,
            message.consumer_epoch if message.HasField("consumer_epoch") else None,
            frame.metadata, frame.payload))

    def _lost(self) -> None:
        if self.closed and not self._requests and not self.consumers and not self.producers:
            return
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        self.owner.forget(self)
        producers, consumers = list(self.producers.values()), list(self.consumers.values())
        self.producers.clear()
        self.consumers.clear()
        for producer in producers:  # first: their sends failing now are sent again later
            producer.on_closed("connection lost")
        error = ConnectError(f"the connection to {self.url} was lost")
        for future in self._requests.values():
            if not future.done():
                future.set_exception(error)
        for queue in self.sends.values():
            for _, send in queue:
                if not send.done():
                    send.set_exception(NotConnected(f"the connection to {self.url} was lost"))
        self.sends.clear()
        for consumer in consumers:
            consumer.on_closed("connection lost")

    def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None and not self._reader_task.done():
            self._reader_task.cancel()


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


class TcpTransport:
    """The binary protocol over TCP (see the module comment). Build it with `open`."""

    def __init__(self, url: str, tls: TlsSettings, operation_timeout_s: float,
                 connection_timeout_s: float):
        parse_address(url)  # InvalidUrl before anything else
        self.url = url
        self.tls = tls
        self.operation_timeout_s = operation_timeout_s
        self.connection_timeout_s = connection_timeout_s
        self._pool: dict[str, _Connection] = {}
        self._connecting: dict[str, asyncio.Future[_Connection]] = {}
        self._producers: dict[int, _Connection] = {}
        self._consumers: dict[int, _Connection] = {}
        self._request_ids = iter(range(1, 1 << 62))

    @classmethod
    async def open(cls, url: str, tls: TlsSettings, operation_timeout_s: float = 30,
                   connection_timeout_s: float = 10) -> TcpTransport:
        transport = cls(url, tls, operation_timeout_s, connection_timeout_s)
        await transport._connection(url)
        return transport

    @property
    def max_message_size(self) -> int:
        service = self._pool.get(self.url)
        return service.max_message_size if service is not None else 5 * 1024 * 1024

    def _rid(self) -> int:
        return next(self._request_ids)

    async def _connection(self, url: str) -> _Connection:
        existing = self._pool.get(url)
        if existing is not None and not existing.closed:
            return existing
        pending = self._connecting.get(url)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_Connection] = asyncio.get_running_loop().create_future()
        self._connecting[url] = future
        try:
            connection = _Connection(self, url)
            await connection.open(self.connection_timeout_s)
            self._pool[url] = connection
            future.set_result(connection)
            return connection
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._connecting[url]

    def forget(self, connection: _Connection) -> None:
        if self._pool.get(connection.url) is connection:
            del self._pool[connection.url]

    async def close(self) -> None:
        for connection in list(self._pool.values()):
            connection.close()
        self._pool.clear()

    # -- lookup ----------------------------------------------------------------------------

    async def _lookup(self, topic: str) -> _Connection:
        """The connection of the broker that serves `topic`."""
        url, authoritative = self.url, False
        for _ in range(LOOKUP_REDIRECTS_MAX):
            service = await self._connection(url)
            frame = await service.request(pb.CommandLookupTopic(
                topic=topic, request_id=self._rid(), authoritative=authoritative),
                f"lookup of {topic}")
            answer = frame.command.lookupTopicResponse
            if answer.response == pb.CommandLookupTopicResponse.Failed:
                raise error_for_code(answer.error, answer.message, f"lookup of {topic}")
            target = answer.brokerServiceUrlTls if service.tls and \
                answer.brokerServiceUrlTls else answer.brokerServiceUrl
            if answer.response == pb.CommandLookupTopicResponse.Connect:
                if answer.proxy_through_service_url or not target:
                    return service
                return await self._connection(target)
            url, authoritative = target or url, answer.authoritative
        raise LookupError(f"lookup of {topic}: more than {LOOKUP_REDIRECTS_MAX} redirects")

    async def partitioned_metadata(self, topic: str) -> int:
        service = await self._connection(self.url)
        frame = await service.request(pb.CommandPartitionedTopicMetadata(
            topic=topic, request_id=self._rid()), f"partitioned metadata of {topic}")
        answer = frame.command.partitionMetadataResponse
        if answer.response == pb.CommandPartitionedTopicMetadataResponse.Failed:
            raise error_for_code(answer.error, answer.message, f"partitioned metadata of {topic}")
        return int(answer.partitions)

    async def topics_of_namespace(self, namespace: str, mode: str) -> list[str]:
        service = await self._connection(self.url)
        frame = await service.request(pb.CommandGetTopicsOfNamespace(
            request_id=self._rid(), namespace=namespace, mode=_NAMESPACE_MODES[mode]),
            f"list topics of {namespace}")
        return list(frame.command.getTopicsOfNamespaceResponse.topics)

    # -- producers -------------------------------------------------------------------------

    async def create_producer(self, producer_id: int, request: ProducerRequest,
                              events: ProducerEvents) -> ProducerOpened:
        connection = await self._lookup(request.topic)
        body = pb.CommandProducer(topic=request.topic, producer_id=producer_id,
                                  request_id=self._rid(),
                                  producer_access_mode=_ACCESS_MODES[request.access_mode])
        if request.producer_name:
            body.producer_name = request.producer_name
        else:
            body.user_provided_producer_name = False
        for key, value in request.properties.items():
            body.metadata.add(key=key, value=value)
        if request.initial_subscription_name:
            body.initial_subscription_name = request.initial_subscription_name
        connection.sends[producer_id] = deque()
        connection.producers[producer_id] = events
        try:
            frame = await connection.request(body, f"create producer on {request.topic}")
        except BaseException:
            connection.sends.pop(producer_id, None)
            connection.producers.pop(producer_id, None)
            raise
        self._producers[producer_id] = connection
        success = frame.command.producer_success
        return ProducerOpened(success.producer_name, success.last_sequence_id)

    def send(self, producer_id: int, sequence_id: int, highest_sequence_id: int,
             num_messages: int, metadata: pb.MessageMetadata, payload: bytes,
             ) -> asyncio.Future[tuple[int, int]]:
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        connection = self._producers.get(producer_id)
        queue = connection.sends.get(producer_id) if connection is not None else None
        if connection is None or queue is None:
            future.set_exception(NotConnected(f"producer {producer_id} is not connected"))
            return future
        body = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id & _UINT64,
                              num_messages=num_messages)
        if highest_sequence_id > sequence_id:
            body.highest_sequence_id = highest_sequence_id
        if metadata.HasField("chunk_id"):
            body.is_chunk = True
        try:
            connection.write(body, metadata, payload)
        except PulsarException as exc:
            future.set_exception(exc)
            return future
        queue.append((sequence_id, future))
        return future

    async def close_producer(self, producer_id: int) -> None:
        connection = self._producers.pop(producer_id, None)
        if connection is None or connection.closed:
            return
        connection.producers.pop(producer_id, None)
        try:
            await connection.request(pb.CommandCloseProducer(
                producer_id=producer_id, request_id=self._rid()), "close producer")
        finally:
            connection.sends.pop(producer_id, None)

    # -- consumers -------------------------------------------------------------------------

    async def subscribe(self, consumer_id: int, request: SubscribeRequest,
                        events: ConsumerEvents) -> None:
        connection = await self._lookup(request.topic)
        body = pb.CommandSubscribe(
            topic=request.topic, subscription=request.subscription,
            subType=_SUB_TYPES[request.sub_type], consumer_id=consumer_id,
            request_id=self._rid(), durable=request.durable, consumer_epoch=request.epoch,
            initialPosition=pb.CommandSubscribe.Earliest if request.initial_position ==
            "earliest" else pb.CommandSubscribe.Latest)
        if request.consumer_name:
            body.consumer_name = request.consumer_name
        if request.start_message_id is not None:
            body.start_message_id.CopyFrom(request.start_message_id.to_proto())
        for key, value in request.properties.items():
            body.subscription_properties.add(key=key, value=value)
        connection.consumers[consumer_id] = events
        try:
            await connection.request(body, f"subscribe {request.subscription!r} to "
                                           f"{request.topic}")
        except BaseException:
            connection.consumers.pop(consumer_id, None)
            raise
        self._consumers[consumer_id] = connection

    def _consumer(self, consumer_id: int) -> _Connection:
        connection = self._consumers.get(consumer_id)
        if connection is None or connection.closed:
            raise NotConnected(f"consumer {consumer_id} is not connected")
        return connection

    def flow(self, consumer_id: int, permits: int) -> None:
        connection = self._consumers.get(consumer_id)
        if connection is not None and not connection.closed:
            connection.write(pb.CommandFlow(consumer_id=consumer_id, messagePermits=permits))

    async def ack(self, consumer_id: int, acks: list[tuple[int, int, list[int] | None]],
                  cumulative: bool, wait: bool = False) -> None:
        connection = self._consumers.get(consumer_id)
        if connection is None or connection.closed:
            if wait:
                raise NotConnected(f"consumer {consumer_id} is not connected: ack not sent")
            return
        body = pb.CommandAck(consumer_id=consumer_id, ack_type=pb.CommandAck.Cumulative
                             if cumulative else pb.CommandAck.Individual)
        for ledger, entry, ack_set in acks:
            data = body.message_id.add(ledgerId=ledger & _UINT64, entryId=entry & _UINT64)
            if ack_set:
                data.ack_set.extend(ack_set)
        if not wait:
            connection.write(body)
            return
        body.request_id = self._rid()  # an ack receipt: ACK_RESPONSE once it is stored
        answer = (await connection.request(body, "ack")).command.ackResponse
        if answer.HasField("error"):
            raise error_for_code(answer.error, answer.message, f"ack on {connection.url}")

    async def redeliver(self, consumer_id: int, ids: list[tuple[int, int]] | None,
                        epoch: int) -> None:
        connection = self._consumers.get(consumer_id)
        if connection is None or connection.closed:
            return
        body = pb.CommandRedeliverUnacknowledgedMessages(consumer_id=consumer_id,
                                                         consumer_epoch=epoch)
        for ledger, entry in ids or []:
            body.message_ids.add(ledgerId=ledger & _UINT64, entryId=entry & _UINT64)
        connection.write(body)

    async def seek(self, consumer_id: int, target: MessageId | int) -> None:
        body = pb.CommandSeek(consumer_id=consumer_id, request_id=self._rid())
        if isinstance(target, MessageId):
            body.message_id.CopyFrom(MessageId(target.ledger_id, target.entry_id).to_proto())
        else:
            body.message_publish_time = target
        await self._consumer(consumer_id).request(body, "seek")

    async def last_message_id(self, consumer_id: int) -> tuple[MessageId, MessageId | None]:
        frame = await self._consumer(consumer_id).request(pb.CommandGetLastMessageId(
            consumer_id=consumer_id, request_id=self._rid()), "get last message id")
        answer = frame.command.getLastMessageIdResponse
        mark = None
        if answer.HasField("consumer_mark_delete_position"):
            mark = MessageId.from_proto(answer.consumer_mark_delete_position)
        return MessageId.from_proto(answer.last_message_id), mark

    async def unsubscribe(self, consumer_id: int) -> None:
        connection = self._consumer(consumer_id)
        await connection.request(pb.CommandUnsubscribe(
            consumer_id=consumer_id, request_id=self._rid()), "unsubscribe")
        connection.consumers.pop(consumer_id, None)
        self._consumers.pop(consumer_id, None)

    async def close_consumer(self, consumer_id: int) -> None:
        connection = self._consumers.pop(consumer_id, None)
        if connection is None or connection.closed:
            return
        connection.consumers.pop(consumer_id, None)
        await connection.request(pb.CommandCloseConsumer(
            consumer_id=consumer_id, request_id=self._rid()), "close consumer")
