"""One client connection: Pulsar binary-protocol frames in, command handlers, replies out.

Theory of operation
-------------------
A `ConnectionHandler` sits between one TCP connection (owned by `_server.py`) and the shared
`BrokerService`. It holds a sans-IO `codec.Connection` in the broker role: the server feeds it
the bytes it reads (`data_received`), and the handler writes whole frames through the `write`
callable it was given. It never reads a socket itself and never blocks.

This module keeps the connection's mechanics: the handshake, authentication, keep-alive, frame
reading and its limits, the standard replies and logging, its command tasks, and close and
clean-up. The commands about a client's work are served by one class per area, each seeing
the connection through the narrow `ConnectionView` (`_connection_view.py`, which lists the
areas): `ProducerCommands` (`_producers.py`), `ConsumerCommands` (`_consumers.py`) and
`DiscoveryCommands` (`_discovery.py`).

Dispatch. Each decoded frame goes to the one method the dispatch table names for its type.
Cheap commands (PING, FLOW, LOOKUP, ...) are answered at once; commands that wait on the
service (PRODUCER, SUBSCRIBE, SEND, ACK, SEEK, ...) run as tasks that the handler tracks
(`spawn`), so a shutdown can wait for them. A frame of a type the broker does not serve, bad
bytes (any codec `ProtocolError`) and a command an area answers with `CloseConnection` (a SEND
for an unknown producer) close this connection only.

The broker-to-client commands the C++ client cannot handle (REACHED_END_OF_TOPIC, transaction
replies, ...) are refused by the codec's `peer_accepted_types`, which CONNECT sets from what
the client is: the Java client also takes GET_OR_CREATE_SCHEMA_RESPONSE, and the Java client
and clients that declared feature_flags.supports_topic_watchers take the WATCH_TOPIC_*
replies. Transactions are answered with ERROR NotAllowed "Transactions are not enabled.", as
Pulsar does with its coordinator off.

Logging. A client's mistake is logged once per connection at WARNING (a reply its declared
command set cannot take, a SEND with a bad checksum), repeats at DEBUG; a refused request is
INFO. An unexpected exception in a request (a bug a client may repeat at will) is an ERROR
with its traceback once per connection and exception type, then DEBUG.

Keep-alive: every `keepalive_interval_s` the handler sends PING; a connection that sent no
frame at all during a whole interval after a PING is closed (Pulsar's rule).

Back-pressure on deliveries: when more than `WRITE_BUFFER_BYTES_MAX` bytes wait in the
socket's buffer (the client does not read), the connection's consumers are paused until it
drains. Unanswered SENDs are bounded by `ServerContext.pending_sends_max`: the server stops
reading meanwhile (`wait_send_room`).

Authentication, when the server has an `AuthenticationService`, is `_auth.py`'s: CONNECT is
checked there (a refusal is ERROR with request id -1, then close), and the connection's
`AuthSession` sends AUTH_CHALLENGE when the credentials expire and takes the AUTH_RESPONSE.
A CONNECT whose check means computing a password hash is answered from a task once a hash
thread has computed it (`_basic.py`): the loop goes on serving every other connection, and
this one, still in its handshake, can send nothing else meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from google.protobuf.message import Message

from magnetar.codec import (
    CPP_CLIENT_ACCEPTED_TYPES,
    FRAME_PADDING_BYTES,
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    LocalProtocolError,
    ProtocolError,
    Role,
    Send,
    State,
    base_command,
    pb,
)
from magnetar.storage import StorageError

from .._errors import AuthenticationError, BrokerError
from .._tasks import log_task_failure
from ..security._auth import AUTH_REFUSED, AuthSession, Principal
from ._connection_view import (
    REQUEST_ID_NONE,
    TRANSACTIONS_DISABLED,
    CloseConnection,
    ServerContext,
    server_error,
)
from ._consumers import ConsumerCommands
from ._discovery import DiscoveryCommands
from ._gather_write import Buffers, joining_writer
from ._producers import ProducerCommands
from ._topic_watchers import WATCHER_REPLY_TYPES

__all__ = [
    "PROTOCOL_VERSION_MAX",
    "SERVER_VERSION",
    "WRITE_BUFFER_BYTES_MAX",
    "ConnectionHandler",
]

log = logging.getLogger(__name__)

T = pb.BaseCommand

PROTOCOL_VERSION_MAX: Final = 20  # what the 4.x C++ client declares; v12+ is what it needs
SERVER_VERSION: Final = "Magnetar-0.1.0"
WRITE_BUFFER_BYTES_MAX: Final = 1024 * 1024  # unsent bytes before deliveries pause

_TRANSACTION_TYPES: Final = frozenset(
    {
        T.NEW_TXN, T.ADD_PARTITION_TO_TXN, T.ADD_SUBSCRIPTION_TO_TXN, T.END_TXN,
        T.END_TXN_ON_PARTITION, T.END_TXN_ON_SUBSCRIPTION, T.TC_CLIENT_CONNECT_REQUEST,
    }
)  # fmt: skip


class ConnectionHandler:
    """The broker side of one client connection (see the module comment); its command
    handlers see it as a `ConnectionView`.

    Args:
        context: the server's shared state.
        write: writes bytes to the socket; must not block.
        close_transport: closes the socket (the server's reader then ends).
        peer: the client's address, for stats and logs (Pulsar's form: "/host:port").
        write_parts: writes a run of frames given as separate buffers (`_gather_write.py`;
            default: joined, through `write`); must not block.
        write_buffer_bytes: bytes written but not yet sent on the socket (None: unknown).
        drain: waits until the socket's write buffer is below its low-water mark.
        tls_common_name: the common name of the client certificate the TLS handshake
            verified (the role of the "tls" authentication method).
    """

    def __init__(self, context: ServerContext, write: Callable[[bytes], None],
                 close_transport: Callable[[], None], peer: str, *,
                 write_parts: Callable[[Buffers], None] | None = None,
                 write_buffer_bytes: Callable[[], int] | None = None,
                 drain: Callable[[], Awaitable[None]] | None = None,
                 tls_common_name: str | None = None):
        self.ctx = context
        self._write_buffer_bytes = write_buffer_bytes
        self._drain = drain
        self._writes_paused = False
        self._resume_task: asyncio.Future[None] | None = None
        self.service = context.service
        self._write = write
        self._write_parts = write_parts or joining_writer(write)
        self._soon: list[bytes] = []  # `write_soon`'s frames; at most one turn's receipts
        self._close_transport = close_transport
        self.peer = peer
        frame_max = self.service.config.max_message_size_bytes + FRAME_PADDING_BYTES
        self.conn = Connection(Role.BROKER, frame_size_bytes_max=frame_max, plain_sends=True)
        self.closed = False
        self.client_version = ""
        self.protocol_version = 0
        self.auth: AuthSession | None = None  # with authentication: who the client is
        self._tls_common_name = tls_common_name
        self.wants_entry_metadata = False  # the client declared supports_broker_entry_metadata
        self._logged_once: set[str] = set()  # what `warn_once`/`log_failure` logged once
        self._tasks: set[asyncio.Future[object]] = set()
        self._received_since_ping = True
        self._ping_outstanding = False
        self._keepalive: asyncio.TimerHandle | None = None
        self.producers = ProducerCommands(self)
        self.consumers = ConsumerCommands(self)
        self.discovery = DiscoveryCommands(self)
        self._dispatch_table: dict[int, Callable[[Frame], None]] = self._build_dispatch()

    def _build_dispatch(self) -> dict[int, Callable[[Frame], None]]:
        producers, consumers, discovery = self.producers, self.consumers, self.discovery
        table: dict[int, Callable[[Frame], None]] = {
            T.CONNECT: self._on_connect, T.PING: self._on_ping, T.PONG: self._on_pong,
            T.AUTH_RESPONSE: self._on_auth_response,
            T.PRODUCER: producers.on_producer, T.SEND: producers.on_send,
            T.CLOSE_PRODUCER: producers.on_close_producer,
            T.SUBSCRIBE: consumers.on_subscribe, T.FLOW: consumers.on_flow,
            T.ACK: consumers.on_ack, T.REDELIVER_UNACKNOWLEDGED_MESSAGES: consumers.on_redeliver,
            T.CLOSE_CONSUMER: consumers.on_close_consumer,
            T.UNSUBSCRIBE: consumers.on_unsubscribe, T.SEEK: consumers.on_seek,
            T.GET_LAST_MESSAGE_ID: consumers.on_get_last_message_id,
            T.CONSUMER_STATS: consumers.on_stats,
            T.PARTITIONED_METADATA: discovery.on_partitioned_metadata,
            T.LOOKUP: discovery.on_lookup, T.GET_TOPICS_OF_NAMESPACE: discovery.on_get_topics,
            T.GET_SCHEMA: discovery.on_get_schema,
            T.GET_OR_CREATE_SCHEMA: discovery.on_get_or_create_schema,
            T.WATCH_TOPIC_LIST: discovery.on_watch_topic_list,
            T.WATCH_TOPIC_LIST_CLOSE: discovery.on_watch_topic_list_close,
        }  # fmt: skip
        for kind in _TRANSACTION_TYPES:
            table[kind] = self._on_transaction
        return table

    @property
    def role(self) -> str | None:
        """The authenticated role (None: no authentication)."""
        return None if self.auth is None else self.auth.principal.role

    @property
    def peer_accepted_types(self) -> frozenset[int] | None:
        """The command types the client can take (set by CONNECT; None: any)."""
        return self.conn.peer_accepted_types

    # -- input -----------------------------------------------------------------------------

    def data_received(self, data: bytes | memoryview) -> None:
        """Process bytes from the client (`b""`: the client closed its side).

        A protocol violation closes this connection (logged); nothing is raised.
        """
        if self.closed:
            return
        try:
            self.conn.receive_data(data)
            for event in self.conn.events():
                if isinstance(event, ConnectionClosed):
                    self.close()
                    return
                self._received_since_ping = True
                if isinstance(event, Send):  # the hot command, without `_dispatch`'s call
                    self.producers.on_plain_send(event)
                    continue
                self._dispatch(event)
                if self.closed:
                    return
            if self.producers.unsent:
                self.producers.flush_sends()
        except ProtocolError as exc:
            log.warning("closing the connection of %s: %s", self.peer, exc.reason)
            self.close()
        except CloseConnection as exc:
            log.warning("closing the connection of %s: %s", self.peer, exc)
            self.close()

    def _dispatch(self, event: Frame | Send | ChecksumMismatch) -> None:
        if isinstance(event, Send):
            self.producers.on_plain_send(event)
            return
        if isinstance(event, ChecksumMismatch):
            self.producers.on_corrupt_send(event)
            return
        kind = event.command.type
        if kind != T.SEND and self.producers.unsent:
            self.producers.flush_sends()  # commands take effect in the order they came
        handler = self._dispatch_table.get(kind)
        if handler is None:
            raise CloseConnection(f"unexpected {T.Type.Name(kind)}")
        handler(event)

    # -- output ----------------------------------------------------------------------------

    def send(self, body: Message) -> bool:
        """Send one command; returns False when it could not be sent (closed connection, or
        a command this client cannot handle -- logged)."""
        if self.closed:
            return False
        try:
            data = self.conn.send(base_command(body))
        except LocalProtocolError as exc:  # e.g. a C++ client asked GET_OR_CREATE_SCHEMA
            self.warn_once(f"not sending {type(body).__name__}",
                           "not sending %s to %s: %s", type(body).__name__, self.peer,
                           exc.reason)
            return False
        if self._soon:
            self._flush_soon()
        self._write(data)
        return True

    def encode(self, body: Message, entry: bytes | None = None) -> bytes:
        """One command's frame (MESSAGE: with a stored entry appended verbatim), for `write`."""
        return self.conn.send(base_command(body), entry=entry)

    def check_send(self, command_type: int) -> None:
        """Raise LocalProtocolError if this command type may not be sent now."""
        self.conn.check_send(command_type)

    @property
    def frame_size_bytes_max(self) -> int:
        return self.conn.frame_size_bytes_max

    def write(self, data: bytes) -> None:
        """Write encoded frames to the socket."""
        if self._soon:
            self._flush_soon()
        self._write(data)

    def write_parts(self, parts: Buffers) -> None:
        """Write encoded frames given as separate buffers (heads and stored entries), in
        order, without joining them when the socket takes them at once."""
        if self._soon:
            self._flush_soon()
        self._write_parts(parts)

    def write_soon(self, data: bytes) -> None:
        """Write encoded frames at the end of this loop turn, with every other `write_soon`
        of the turn in one transport write (the receipts of a group of completed SENDs).
        A `send` or `write` meanwhile writes them first: frames leave in call order. The
        buffer holds one turn's frames at most (bounded by `pending_sends_max` receipts)."""
        if self.closed:
            return
        if not self._soon:
            asyncio.get_running_loop().call_soon(self._flush_soon)
        self._soon.append(data)

    def _flush_soon(self) -> None:
        if self._soon:
            data = b"".join(self._soon)
            self._soon.clear()
            self._write(data)

    def check_write_room(self) -> None:
        """Back-pressure on deliveries: when more than `WRITE_BUFFER_BYTES_MAX` bytes wait in
        the socket's buffer (the client does not read), every consumer of this connection gets
        no usable permits until the buffer drains; then their dispatchers are kicked."""
        if self._write_buffer_bytes is None or self._drain is None:
            return
        if self._write_buffer_bytes() <= WRITE_BUFFER_BYTES_MAX:
            return
        self.consumers.pause_deliveries()
        if not self._writes_paused:
            self._writes_paused = True
            # not a command task: shutdown must not wait for a client that never reads
            self._resume_task = asyncio.ensure_future(self._resume_writes())
            self._resume_task.add_done_callback(
                lambda task: log_task_failure(task, f"resuming writes to {self.peer}"))

    async def _resume_writes(self) -> None:
        assert self._drain is not None
        try:
            await self._drain()
        except (ConnectionError, OSError):
            return  # the connection is gone; its consumers are closed with it
        self._writes_paused = False
        self.consumers.resume_deliveries()

    def error(self, request_id: int, exc: BaseException) -> None:
        """Reply ERROR for a failed request, with `server_error`'s code; logged."""
        code, message = server_error(exc)
        self.log_failure(exc)
        self.send(pb.CommandError(request_id=request_id, error=code, message=message))  # type: ignore[arg-type]

    def error_code(self, request_id: int, code: int, message: str) -> None:
        """Reply ERROR with a given code and message."""
        self.send(pb.CommandError(request_id=request_id, error=code, message=message))  # type: ignore[arg-type]

    def log_failure(self, exc: BaseException) -> None:
        """Log a failed request: a refusal at INFO; an unexpected exception (a bug a client
        may be able to repeat at will) at ERROR with its traceback once per connection and
        exception type, then at DEBUG."""
        if isinstance(exc, BrokerError | StorageError):
            log.info("request from %s failed: %s: %s", self.peer, type(exc).__name__, exc)
            return
        key = f"unexpected {type(exc).__name__}"
        if key in self._logged_once:
            log.debug("request from %s failed unexpectedly: %r", self.peer, exc)
            return
        self._logged_once.add(key)
        log.error("request from %s failed unexpectedly (further %s of this connection are "
                  "logged at DEBUG)", self.peer, type(exc).__name__, exc_info=exc)

    def warn_once(self, key: str, message: str, *args: object) -> None:
        """A client's mistake: WARNING the first time on this connection, DEBUG after."""
        if key in self._logged_once:
            log.debug(message, *args)
            return
        self._logged_once.add(key)
        log.warning(message + " (repeats on this connection are logged at DEBUG)", *args)

    def success(self, request_id: int) -> None:
        """Reply SUCCESS."""
        self.send(pb.CommandSuccess(request_id=request_id))

    # -- tasks and lifetime ----------------------------------------------------------------

    def spawn(self, work: Awaitable[object]) -> None:
        """Run a command as a task `wait_idle` waits for (a future is waited for as it is);
        a failure is logged."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a command task of %s failed", self.peer, exc_info=exc)

    async def wait_idle(self) -> None:
        """Until every command task (publishes and their receipts included) has finished."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def wait_send_room(self) -> None:
        """Until fewer than `pending_sends_max` SENDs wait for their receipts."""
        await self.producers.wait_send_room()

    def start_keepalive(self) -> None:
        """Start the PING timer (see the module comment)."""
        interval = self.ctx.keepalive_interval_s
        if interval > 0 and not self.closed:
            loop = asyncio.get_running_loop()
            self._keepalive = loop.call_later(interval, self._keepalive_tick)

    def _keepalive_tick(self) -> None:
        self._keepalive = None
        if self.closed:
            return
        if self._ping_outstanding and not self._received_since_ping:
            log.warning("closing the connection of %s: no frame for a keep-alive interval",
                        self.peer)
            self.close()
            return
        if self.conn.state is not State.CONNECTED:
            log.warning("closing the connection of %s: no handshake", self.peer)
            self.close()
            return
        self._received_since_ping = False
        self._ping_outstanding = True
        self.send(pb.CommandPing())
        self.start_keepalive()

    def close(self) -> None:
        """Close the connection: producers and consumers leave their topics, watchers stop.
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._flush_soon()  # what was written before the close leaves before it
        if self.auth is not None:
            self.auth.stop()
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self.producers.release_all()
        self.consumers.release_all()
        self.discovery.close()
        self.conn.discard_received()  # a partial frame's bytes do not outlive the connection
        self._close_transport()

    def connection_lost(self) -> None:
        """The socket is gone (the server's reader ended)."""
        self.close()

    # -- handshake, authentication, keep-alive ---------------------------------------------

    def _on_connect(self, frame: Frame) -> None:
        connect = frame.command.connect
        self.client_version = connect.client_version
        self.protocol_version = min(connect.protocol_version, PROTOCOL_VERSION_MAX)
        self.wants_entry_metadata = connect.feature_flags.supports_broker_entry_metadata
        accepted = CPP_CLIENT_ACCEPTED_TYPES
        java = connect.client_version.startswith("Pulsar-Java")
        if java:
            # The Java client, unlike the C++ one, handles GET_OR_CREATE_SCHEMA_RESPONSE.
            accepted |= {T.GET_OR_CREATE_SCHEMA_RESPONSE}
        if java or connect.feature_flags.supports_topic_watchers:
            # The Java client watches topic lists (it learns the broker can from CONNECTED's
            # flag and does not declare its own); the C++ client never does.
            accepted |= WATCHER_REPLY_TYPES
        self.conn.peer_accepted_types = accepted
        auth = self.ctx.auth
        if auth is not None and auth.costly(connect.auth_method_name, connect.auth_data):
            self.spawn(self._authenticate_off_loop(connect))  # CONNECTED or ERROR follows
            return
        if auth is not None and not self._authenticate(connect):
            return
        self._connected()

    def _connected(self) -> None:
        self.send(pb.CommandConnected(
            server_version=SERVER_VERSION, protocol_version=self.protocol_version,
            max_message_size=self.service.config.max_message_size_bytes,
            feature_flags=pb.FeatureFlags(supports_topic_watchers=True)))

    def _on_ping(self, frame: Frame) -> None:
        self.send(pb.CommandPong())

    def _on_pong(self, frame: Frame) -> None:
        self._ping_outstanding = False

    def _authenticate(self, connect: pb.CommandConnect,
                      principal: Principal | None = None) -> bool:
        """Authenticate a CONNECT (`_auth.py`; `principal`: already checked); a refusal is
        ERROR with request id -1, then the connection closes (wire reference 5.1). Returns
        whether the client may go on."""
        assert self.ctx.auth is not None
        try:
            self.auth = self.ctx.auth.start_session(
                connect, self.send, self.close, self.peer, SERVER_VERSION,
                self._tls_common_name, refuse=self._refuse_credentials, principal=principal)
        except AuthenticationError as exc:
            self._refuse_connect(connect, exc)
            return False
        return True

    async def _authenticate_off_loop(self, connect: pb.CommandConnect) -> None:
        """Check a password off the event loop's thread (`_basic.py`), then answer the CONNECT;
        a connection closed meanwhile gets nothing."""
        assert self.ctx.auth is not None
        try:
            principal = await self.ctx.auth.authenticate_off_loop(
                connect.auth_method_name, connect.auth_data, self._tls_common_name)
        except AuthenticationError as exc:
            if not self.closed:
                self._refuse_connect(connect, exc)
            return
        if not self.closed and self._authenticate(connect, principal):
            self._connected()

    def _refuse_connect(self, connect: pb.CommandConnect, exc: AuthenticationError) -> None:
        log.info("refusing the connection of %s (method %r): %s", self.peer,
                 connect.auth_method_name[:40], exc.logged())
        self._refuse_credentials(f"{AUTH_REFUSED}: {exc}")
        self.close()

    def _refuse_credentials(self, message: str) -> None:
        """ERROR with request id -1 and code AuthenticationError (the close follows)."""
        self.error_code(REQUEST_ID_NONE, pb.AuthenticationError, message)

    def _on_auth_response(self, frame: Frame) -> None:
        if self.auth is None:
            log.debug("ignoring AUTH_RESPONSE from %s: no authentication configured", self.peer)
            return
        response = frame.command.authResponse
        if self.auth.costly(response):
            self.spawn(self.auth.on_response_off_loop(response))
        else:
            self.auth.on_response(response)

    def _on_transaction(self, frame: Frame) -> None:
        body: Any = frame.body
        self.error_code(body.request_id, pb.NotAllowedError, TRANSACTIONS_DISABLED)
