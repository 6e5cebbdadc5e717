"""`TcpTransport`: the binary protocol over TCP (optionally TLS) through `codec.Connection`.

Theory of operation
-------------------
Connections (`_tcp_connection.BrokerConnection`) are pooled by broker address. The first one
goes to the service URL and answers lookups (LOOKUP, PARTITIONED_METADATA,
GET_TOPICS_OF_NAMESPACE) -- or, for an `http(s)://` service URL, `_http_lookup.py` asks the
admin server instead; a producer or consumer is created on the connection its topic's lookup
names (following Redirect answers up to `LOOKUP_REDIRECTS_MAX` times), so the client works
against our standalone broker and against a Pulsar cluster alike. The transport keeps which
connection each producer and consumer lives on; a connection that broke is dropped from the
pool (`forget`) and the next lookup opens a new one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

from magnetar.codec import MessageId, pb

from ._auth import AuthenticationToken
from ._errors import LookupError, NotConnected, PulsarException, error_for_code
from ._http_lookup import HttpLookup
from ._tcp_connection import BrokerConnection, TlsSettings, parse_address
from ._transport import (
    ConsumerEvents,
    ProducerEvents,
    ProducerOpened,
    ProducerRequest,
    SendReceipt,
    SubscribeRequest,
)

__all__ = ["TcpTransport"]

LOOKUP_REDIRECTS_MAX: Final = 5
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
_SEND: Final = pb.BaseCommand.SEND


class TcpTransport:
    """The binary protocol over TCP (see the module comment). Build it with `open`."""

    def __init__(self, url: str, tls: TlsSettings, operation_timeout_s: float,
                 connection_timeout_s: float,
                 authentication: AuthenticationToken | None = None):
        self.authentication = authentication
        self.immediate_close = False
        self.http: HttpLookup | None = None
        if url.startswith(("http://", "https://")):
            self.http = HttpLookup(url, tls.context() if url.startswith("https://") else None,
                                   operation_timeout_s, authentication)
        else:
            parse_address(url)  # InvalidUrl before anything else
        self.url = url
        self.tls = tls
        self.operation_timeout_s = operation_timeout_s
        self.connection_timeout_s = connection_timeout_s
        self._pool: dict[str, BrokerConnection] = {}
        self._connecting: dict[str, asyncio.Future[BrokerConnection]] = {}
        self._producers: dict[int, BrokerConnection] = {}
        self._consumers: dict[int, BrokerConnection] = {}
        self._request_ids = iter(range(1, 1 << 62))
        self.bursting = False  # writes wait for `end_burst` (see `BrokerConnection.write`)

    @classmethod
    async def open(cls, url: str, tls: TlsSettings, operation_timeout_s: float = 30,
                   connection_timeout_s: float = 10,
                   authentication: AuthenticationToken | None = None) -> TcpTransport:
        transport = cls(url, tls, operation_timeout_s, connection_timeout_s, authentication)
        try:
            if transport.http is not None:
                await transport.http.check()
            else:
                await transport._connection(url)
        except BaseException:
            await transport.close()  # nothing left open behind a failed construction
            raise
        return transport

    @property
    def max_message_size(self) -> int:
        """The broker's (from CONNECTED; with HTTP lookup, of the first broker reached)."""
        service = self._pool.get(self.url) or next(iter(self._pool.values()), None)
        return service.max_message_size if service is not None else 5 * 1024 * 1024

    def begin_burst(self) -> None:
        self.bursting = True

    def end_burst(self) -> None:
        self.bursting = False
        for connection in self._pool.values():
            connection.flush_held()

    def _rid(self) -> int:
        return next(self._request_ids)

    async def _connection(self, url: str) -> BrokerConnection:
        existing = self._pool.get(url)
        if existing is not None and not existing.closed:
            return existing
        pending = self._connecting.get(url)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[BrokerConnection] = asyncio.get_running_loop().create_future()
        self._connecting[url] = future
        try:
            connection = BrokerConnection(self, url)
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

    def forget(self, connection: BrokerConnection) -> None:
        if self._pool.get(connection.url) is connection:
            del self._pool[connection.url]

    async def close(self) -> None:
        connections = list(self._pool.values())
        self._pool.clear()
        for connection in connections:
            connection.close()
        await asyncio.gather(*(c.closed_socket() for c in connections))
        if self.http is not None:
            await self.http.close()

    # -- lookup ----------------------------------------------------------------------------

    async def _lookup(self, topic: str) -> BrokerConnection:
        """The connection of the broker that serves `topic`."""
        if self.http is not None:
            return await self._connection(await self.http.broker_url(topic))
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
        if self.http is not None:
            return await self.http.partitions(topic)
        service = await self._connection(self.url)
        frame = await service.request(pb.CommandPartitionedTopicMetadata(
            topic=topic, request_id=self._rid()), f"partitioned metadata of {topic}")
        answer = frame.command.partitionMetadataResponse
        if answer.response == pb.CommandPartitionedTopicMetadataResponse.Failed:
            raise error_for_code(answer.error, answer.message, f"partitioned metadata of {topic}")
        return int(answer.partitions)

    async def topics_of_namespace(self, namespace: str, mode: str) -> list[str]:
        if self.http is not None:
            return await self.http.topics(namespace, mode)
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
             ) -> SendReceipt:
        future = SendReceipt()
        connection = self._producers.get(producer_id)
        queue = connection.sends.get(producer_id) if connection is not None else None
        if connection is None or queue is None:
            future.set_exception(NotConnected(f"producer {producer_id} is not connected"))
            return future
        command = pb.BaseCommand(type=_SEND)  # filled in place: no sub-command to copy
        body = command.send
        body.producer_id = producer_id
        body.sequence_id = sequence_id & _UINT64
        body.num_messages = num_messages
        if highest_sequence_id > sequence_id:
            body.highest_sequence_id = highest_sequence_id
        if metadata.HasField("chunk_id"):
            body.is_chunk = True
        try:
            connection.write_command(command, metadata, payload)
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
        if request.key_shared is not None:
            meta = body.keySharedMeta
            meta.keySharedMode = pb.STICKY if request.key_shared.mode == "STICKY" \
                else pb.AUTO_SPLIT
            meta.allowOutOfOrderDelivery = request.key_shared.allow_out_of_order_delivery
            for start, end in request.key_shared.ranges:
                meta.hashRanges.add(start=start, end=end)
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

    def _consumer(self, consumer_id: int) -> BrokerConnection:
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
