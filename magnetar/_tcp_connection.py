"""One binary-protocol connection to a broker: `BrokerConnection`, over `codec.Connection`.

Theory of operation
-------------------
Each `BrokerConnection` is its socket's asyncio protocol (`_Wire`): received bytes go to its
sans-IO `codec.Connection` right in the transport's callback, with no reader task or stream
buffer in between, and each frame is routed -- responses by request id to the waiting future,
SEND_RECEIPT/SEND_ERROR to the producer's queue of sends in order, MESSAGE to the consumer's
events, CLOSE_PRODUCER/CLOSE_CONSUMER to the broker-close callbacks, PING to a PONG. `write`
awaits nothing, so SENDs leave in call order: it encodes the frame and appends it to the
connection's outgoing buffer, which goes to the socket in one write at the end of the loop's
turn, or of the transport's burst of sends (`TcpTransport.end_burst`), or at once past
`WRITE_BUFFER_BYTES_MAX` -- one system call for a burst of frames, not one per frame.

When a connection breaks its producers are told first (their sends failing now are sent again
once they are re-created), then every request waiting on it fails with `ConnectError` and its
sends with `NotConnected`; its consumers are told last, and resubscribe through a fresh lookup
(`_consumer.py`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

from google.protobuf.message import Message as ProtoMessage

from magnetar.codec import (
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    ProtocolError,
    Role,
    base_command,
    pb,
)

from ._auth import AuthenticationToken
from ._errors import (
    ConnectError,
    InvalidUrl,
    NotConnected,
    PulsarException,
    Timeout,
    error_for_code,
)
from ._transport import ConsumerEvents, Incoming, ProducerEvents, SendReceipt

__all__ = ["BrokerConnection", "ConnectionOwner", "TlsSettings", "parse_address", "signed"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION: Final = 19
CLIENT_VERSION: Final = "magnetar"
READ_BYTES_MAX: Final = 256 * 1024
CLOSE_WAIT_S_MAX: Final = 2.0  # how long `closed_socket` waits for a clean close (TLS's too)
WRITE_BUFFER_BYTES_MAX: Final = 256 * 1024  # encoded frames held for one write, at most
_T = pb.BaseCommand
_2_63: Final = 1 << 63
_2_64: Final = 1 << 64


class ConnectionOwner(Protocol):
    """What a connection needs from the transport that pools it."""

    tls: TlsSettings
    operation_timeout_s: float
    bursting: bool  # writes wait for the burst's end instead of the loop turn's
    authentication: AuthenticationToken | None

    def forget(self, connection: BrokerConnection) -> None: ...


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


class BrokerConnection:
    """One connection to one broker (see the module comment)."""

    def __init__(self, owner: ConnectionOwner, url: str):
        self.owner = owner
        self.url = url
        self.host, self.port, self.tls = parse_address(url)
        self.conn = Connection(Role.CLIENT)
        self.max_message_size = 5 * 1024 * 1024
        self._writer: asyncio.Transport | None = None
        self._out: list[bytes] = []  # encoded frames not yet written (see the module comment)
        self._out_bytes = 0
        self._flush_due = False  # `_flush` is scheduled
        self._socket_gone: asyncio.Future[None] | None = None  # resolved by connection_lost
        self._requests: dict[int, asyncio.Future[Frame]] = {}
        self.sends: dict[int, deque[tuple[int, SendReceipt]]] = {}
        self.producers: dict[int, ProducerEvents] = {}
        self.consumers: dict[int, ConsumerEvents] = {}
        self.closed = False

    async def open(self, timeout_s: float) -> None:
        """Connect and complete the handshake.

        Raises:
            ConnectError: the broker cannot be reached or refused the connection.
        """
        context = self.owner.tls.context() if self.tls else None
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await asyncio.wait_for(loop.create_connection(
                lambda: _Wire(self), self.host, self.port, ssl=context), timeout_s)
        except (OSError, TimeoutError) as exc:
            raise ConnectError(f"cannot connect to {self.url}: {exc or 'timed out'}") from None
        assert isinstance(transport, asyncio.Transport)
        self._writer = transport
        self._socket_gone = loop.create_future()
        waiter: asyncio.Future[Frame] = loop.create_future()
        self._requests[-1] = waiter  # the handshake's answer
        connect = pb.CommandConnect(client_version=CLIENT_VERSION,
                                    protocol_version=PROTOCOL_VERSION)
        auth = self.owner.authentication
        if auth is not None:
            connect.auth_method_name = auth.method
            connect.auth_data = auth.token().encode()
        self.write(connect)
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
        """Queue a sub-command (wrapped in its BaseCommand) for the socket.

        Raises:
            NotConnected: the connection is closed. PulsarException: it cannot be encoded."""
        self.write_command(base_command(body), metadata, payload)

    def write_command(self, command: pb.BaseCommand, metadata: pb.MessageMetadata | None = None,
                      payload: bytes = b"") -> None:
        """`write` of a whole BaseCommand."""
        if self.closed or self._writer is None:
            raise NotConnected(f"the connection to {self.url} is closed")
        try:
            data = self.conn.send(command, metadata, payload)
        except ProtocolError as exc:
            raise PulsarException(f"cannot send to {self.url}: {exc}") from None
        if not self._flush_due and not self.owner.bursting:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= WRITE_BUFFER_BYTES_MAX:
            self._flush()

    def flush_held(self) -> None:
        """The transport's burst ended: write what it held, unless a flush is due anyway."""
        if self._out and not self._flush_due:
            self._flush()

    def _flush(self) -> None:
        """Write the buffered frames in one go (nothing when they went already)."""
        self._flush_due = False
        if not self._out:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        self._out_bytes = 0
        if self._writer is not None and not self._writer.is_closing():
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

    def received(self, data: bytes) -> None:
        """Bytes from the socket (`_Wire`): every whole frame in them is routed now.

        A frame that breaks the protocol closes the connection (`_lost` tells its users)."""
        try:
            self.conn.receive_data(data)
            while events := self.conn.next_events():  # the frames of a read in one pass
                for event in events:
                    if isinstance(event, Frame):
                        self._route(event)
                    elif isinstance(event, ConnectionClosed):
                        self._close_transport()
                        return
                    elif isinstance(event, ChecksumMismatch):
                        log.warning("a frame from %s failed its checksum", self.url)
        except ProtocolError as exc:
            log.info("connection to %s failed: %s", self.url, exc)
            self._close_transport()

    def _close_transport(self) -> None:
        """Close the socket; `connection_lost` follows (`_lost`)."""
        if self._writer is not None:
            self._writer.close()

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
        elif kind == _T.AUTH_CHALLENGE:
            self._answer_challenge()
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

    def _answer_challenge(self) -> None:
        """AUTH_CHALLENGE: present the (current) token again."""
        auth = self.owner.authentication
        if auth is None:
            log.warning("%s asked for credentials, and the client has none", self.url)
            return
        self.write(pb.CommandAuthResponse(
            client_version=CLIENT_VERSION, protocol_version=PROTOCOL_VERSION,
            response=pb.AuthData(auth_method_name=auth.method,
                                 auth_data=auth.token().encode())))

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
            future.set_result((signed(ledger), signed(entry)))

    def _message(self, frame: Frame) -> None:
        message = frame.command.message
        events = self.consumers.get(message.consumer_id)
        if events is None or frame.metadata is None:
            return
        message_id = message.message_id
        ledger_id, entry_id = message_id.ledgerId, message_id.entryId
        events.on_message(Incoming(
            ledger_id - _2_64 if ledger_id >= _2_63 else ledger_id,  # `signed`, inline
            entry_id - _2_64 if entry_id >= _2_63 else entry_id, message_id.partition,
            message.redelivery_count, list(message.ack_set) if message.ack_set else None,
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
        self._flush()  # what was written before the close still leaves
        if self._writer is not None:
            self._writer.close()

    async def closed_socket(self) -> None:
        """After `close`: until the socket is closed (a TLS connection's only once the broker
        answered its close_notify), aborted after `CLOSE_WAIT_S_MAX`, so no socket outlives
        the client's loop."""
        gone = self._socket_gone
        if gone is None or self._writer is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(gone), CLOSE_WAIT_S_MAX)
        except TimeoutError:
            self._writer.abort()

    def socket_gone(self) -> None:
        """The socket is closed (`_Wire.connection_lost`)."""
        if self._socket_gone is not None and not self._socket_gone.done():
            self._socket_gone.set_result(None)


class _Wire(asyncio.Protocol):
    """The socket's protocol: hands what arrives to its connection, and tells it when the
    socket is gone."""

    def __init__(self, connection: BrokerConnection):
        self.connection = connection

    def data_received(self, data: bytes) -> None:
        self.connection.received(data)

    def eof_received(self) -> bool:
        return False  # the transport closes; `connection_lost` follows

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.info("connection to %s failed: %s", self.connection.url, exc)
        self.connection.socket_gone()
        self.connection._lost()


def signed(value: int) -> int:
    """A uint64 from the wire as the signed long Pulsar means."""
    return value - (1 << 64) if value >= 1 << 63 else value
