"""The TCP server: Pulsar's binary protocol on a socket, one task per connection.

Theory of operation
-------------------
`serve()` starts an asyncio server for a `BrokerService` and returns a `BrokerServer`. Each
accepted connection gets a `_ClientProtocol` (an asyncio buffered protocol) and a
`ConnectionHandler` (`_connection_handler.py`): the transport reads the socket straight into
one scratch buffer the server shares among its connections (`recv_into`: no buffer is
allocated per read, and the loop being single-threaded, each read is handed over before the
next one), and the protocol hands those bytes to the handler, which decodes frames, hands each
to its command handler (producers, consumers, lookup and discovery), which call the service,
and writes replies and deliveries through the transport. Everything else the connection does
happens in handler tasks or in dispatcher callbacks on the same event loop.

Back-pressure. After each read the protocol stops reading the socket while the handler has
`pending_sends_max` SENDs without receipts (the client's publishes outrun storage) -- a small
task resumes it once half of them are answered -- and while the socket's write buffer is
above its high-water mark (the client does not read what we send; `pause_writing` to
`resume_writing`). Either way the server simply stops reading that socket; other connections
carry on.

TLS. With an `ssl.SSLContext` (`_tls.py`) a second listener on `tls_port` serves the same
protocol over TLS, with the same context, service and connection table; LOOKUP then answers
`brokerServiceUrlTls = pulsar+ssl://host:tls_port` next to the plain URL, and a client whose
service URL is `pulsar+ssl://` follows the TLS one. Authentication (`_auth.py`), when
configured, applies on both listeners alike.

Limits (`BrokerConfig`). A connection beyond `broker_max_connections` (lowered, with a
WARNING, to what the descriptor limit leaves after `DESCRIPTORS_RESERVED`), or beyond
`max_connections_per_ip` from one address, is refused as Pulsar refuses it: ERROR
NotAllowedError (request id -1) naming the limit, then close; nothing else is done for it.
After every read the server counts the bytes each connection's codec holds for a frame not yet
complete; when the sum over all connections passes `max_incomplete_frames_bytes`, the
connection whose read pushed it over is closed. The first refusal and the first such close are
a WARNING, then every `LIMIT_WARNING_EVERY`-th; the rest are DEBUG. A closed connection's
handler drops its codec buffer, so no frame's bytes outlive the connection. The counts live
in the service's `ConnectionCounters` (`service.connections`), which `/metrics` shows.

Errors. A connection's failure -- bad bytes, a reset, a bug in a handler -- ends that
connection only; the listener and the other connections are untouched.

Shutdown (`shutdown`): stop accepting; refuse new producers and consumers; stop reading from
every connection; wait (bounded by `grace_s`) until the commands already received have finished,
so every SEND that reached us is persisted and receipted; then close every connection (a
transport not closed within `CLOSE_WAIT_S_MAX` is aborted). Closing the service and the
storage is the caller's job (`_standalone.py`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
from typing import Final, cast

from magnetar.codec import base_command, encode_frame, pb

from .._names import advertised_url_for
from ..security._auth import AuthenticationService
from ..security._authz import AuthorizationService
from ..security._basic import peer_common_name
from ..topics._service import BrokerService
from ._connection_handler import ConnectionHandler
from ._connection_view import (
    KEEPALIVE_INTERVAL_S_DEFAULT,
    PENDING_SENDS_MAX_DEFAULT,
    REQUEST_ID_NONE,
    ServerContext,
)
from ._gather_write import gathering_writer

__all__ = ["SHUTDOWN_GRACE_S_DEFAULT", "BrokerServer", "serve"]

log = logging.getLogger(__name__)

RECEIVE_BYTES_MAX: Final = 256 * 1024  # one read from a socket (the shared scratch buffer)
SHUTDOWN_GRACE_S_DEFAULT: Final = 10.0  # in-flight work is waited for at most this long
CLOSE_WAIT_S_MAX: Final = 2.0  # then transports that have not closed are aborted
# A refused or closed connection is a WARNING the first time and every this many times after
# (the rest DEBUG): a flood of them does not flood the log.
LIMIT_WARNING_EVERY: Final = 1000
# File descriptors kept for everything but client connections (the storage's files, LMDB, the
# admin HTTP server): the connection limit never lets clients take these.
DESCRIPTORS_RESERVED: Final = 256


class BrokerServer:
    """A listening Pulsar protocol server for one service. Create it with `serve()`.

    Attributes:
        context: the state shared by its connections.
        host: the bind address.
        port: the bound port (the OS's choice when 0 was asked for).
        tls_port: the bound TLS port (None: no TLS listener).
    """

    def __init__(self, service: BrokerService, host: str, port: int, *,
                 advertised_url: str | None = None,
                 keepalive_interval_s: float = KEEPALIVE_INTERVAL_S_DEFAULT,
                 pending_sends_max: int = PENDING_SENDS_MAX_DEFAULT,
                 ssl_context: ssl.SSLContext | None = None, tls_port: int | None = None,
                 auth: AuthenticationService | None = None,
                 advertised_url_tls: str | None = None, advertised_host: str | None = None):
        assert pending_sends_max >= 1
        assert (ssl_context is None) == (tls_port is None), "TLS needs a context and a port"
        self.host = host
        self.port = port
        self.tls_port = tls_port
        self._ssl_context = ssl_context
        self._advertised_url = advertised_url
        self._advertised_url_tls = advertised_url_tls
        self._advertised_host = advertised_host or host
        authz = (AuthorizationService(service.namespaces, service.config.superuser_roles)
                 if service.config.authorization_enabled else None)
        self.context = ServerContext(service, advertised_url or "",
                                     service.schemas,
                                     keepalive_interval_s, pending_sends_max, auth=auth,
                                     authz=authz)
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self._connections: dict[ConnectionHandler, _ClientProtocol] = {}
        # Every connection's reads land here first (see the module comment).
        self._scratch = memoryview(bytearray(RECEIVE_BYTES_MAX))
        self._per_ip: dict[str, int] = {}  # open connections (refused ones not) per address
        self.counters = service.connections  # what /metrics shows of this server
        self.connections_max = _connections_max(service.config.broker_max_connections)

    @property
    def url(self) -> str:
        """The advertised service URL."""
        return self.context.advertised_url

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def incomplete_frames_bytes(self) -> int:
        """Bytes of frames not yet complete, summed over the connections."""
        return self.counters.incomplete_frames_bytes

    @property
    def refused_connections(self) -> int:
        """Connections refused for a connection limit, since start."""
        return self.counters.refused

    async def start(self) -> None:
        """Bind and start accepting.

        Raises:
            OSError: the address cannot be bound (e.g. the port is taken).
        """
        assert self._server is None, "already started"
        if self._ssl_context is not None:  # first: the plain port accepting means "ready"
            assert self.tls_port is not None
            self._tls_server = await asyncio.get_running_loop().create_server(
                self._new_protocol, self.host, self.tls_port, ssl=self._ssl_context)
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            self.context.advertised_url_tls = self._advertised_url_tls or advertised_url_for(
                self._advertised_host, self.tls_port, "pulsar+ssl")
            log.info("TLS listening on %s:%d", self.host, self.tls_port)
        try:
            self._server = await asyncio.get_running_loop().create_server(
                self._new_protocol, self.host, self.port)
        except BaseException:
            if self._tls_server is not None:
                self._tls_server.close()
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        self.context.advertised_url = self._advertised_url or advertised_url_for(
            self._advertised_host, self.port)
        log.info("listening on %s:%d, advertised as %s", self.host, self.port, self.url)

    def _refusal(self, address: str) -> str | None:
        """Why a new connection from `address` is refused (None: it is not)."""
        total_max = self.connections_max
        per_ip_max = self.context.service.config.max_connections_per_ip
        if total_max > 0 and len(self._connections) >= total_max:
            return "Reached the maximum number of connections"
        if per_ip_max > 0 and self._per_ip.get(address, 0) >= per_ip_max:
            return f"Reached the maximum number of connections on address {address}"
        return None

    def _new_protocol(self) -> _ClientProtocol:
        return _ClientProtocol(self)

    def _refuse(self, transport: asyncio.Transport, peer: str, reason: str) -> None:
        """ERROR NotAllowedError with request id -1, then close (Pulsar's refusal); the
        transport writes what it holds before it closes."""
        self.counters.refused += 1
        level = logging.WARNING if _logged_in_full(self.counters.refused) else logging.DEBUG
        log.log(level, "refusing the connection of %s: %s (%d refused since start)", peer,
                reason, self.counters.refused)
        error = pb.CommandError(request_id=REQUEST_ID_NONE, error=pb.NotAllowedError,
                                message=reason)
        transport.write(encode_frame(base_command(error)))
        transport.close()

    def _accepted(self, protocol: _ClientProtocol, transport: asyncio.Transport) -> None:
        """A new connection: refused, or given its handler and counted."""
        peer = _peer_name(transport)
        address = _peer_address(transport)
        refusal = self._refusal(address)
        if refusal is not None:
            self._refuse(transport, peer, refusal)
            return
        handler = ConnectionHandler(self.context, transport.write, transport.close, peer,
                                    write_parts=gathering_writer(transport),
                                    write_buffer_bytes=transport.get_write_buffer_size,
                                    drain=protocol.drain,
                                    tls_common_name=peer_common_name(
                                        transport.get_extra_info("peercert")))
        protocol.handler, protocol.address = handler, address
        self._connections[handler] = protocol
        self._per_ip[address] = self._per_ip.get(address, 0) + 1
        self.counters.active = len(self._connections)
        log.debug("connection from %s", peer)
        handler.start_keepalive()

    def _lost(self, protocol: _ClientProtocol) -> None:
        """A connection's socket is gone: its handler closes, its counts are dropped."""
        handler = protocol.handler
        if handler is None:
            return  # a refused connection
        handler.connection_lost()
        self._count_incomplete(protocol.counted, 0)
        self._connections.pop(handler, None)
        self.counters.active = len(self._connections)
        left = self._per_ip.pop(protocol.address) - 1
        assert left >= 0
        if left:
            self._per_ip[protocol.address] = left
        log.debug("connection from %s closed", handler.peer)

    def _count_incomplete(self, counted: list[int], now: int) -> None:
        """Move one connection's share of `incomplete_frames_bytes` from `counted[0]` to
        `now`."""
        self.counters.incomplete_frames_bytes += now - counted[0]
        counted[0] = now
        assert self.counters.incomplete_frames_bytes >= 0

    def _check_incomplete(self, handler: ConnectionHandler, counted: list[int]) -> None:
        """After a read: count the connection's incomplete frame and close it when it pushes
        the sum over the limit (see the module comment)."""
        if handler.closed:
            return
        self._count_incomplete(counted, handler.conn.buffered_bytes)
        limit = self.context.service.config.max_incomplete_frames_bytes
        if self.incomplete_frames_bytes <= limit or counted[0] == 0:
            return
        self.counters.closed_for_incomplete_frames += 1
        closes = self.counters.closed_for_incomplete_frames
        level = logging.WARNING if _logged_in_full(closes) else logging.DEBUG
        log.log(level, "closing the connection of %s: incomplete frames hold %d bytes over all "
                "connections, more than max_incomplete_frames_bytes=%d (this one %d; %d closed "
                "so since start)", handler.peer, self.incomplete_frames_bytes, limit,
                counted[0], closes)
        handler.close()
        self._count_incomplete(counted, 0)

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S_DEFAULT) -> None:
        """Stop gracefully (see the module comment). Idempotent."""
        self.context.accepting = False
        self.context.service.stopping = True
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        handlers = list(self._connections)
        for protocol in self._connections.values():
            protocol.block_reading("shutdown")  # for good
        idle = [asyncio.ensure_future(handler.wait_idle()) for handler in handlers]
        if idle:
            _, late = await asyncio.wait(idle, timeout=grace_s)
            for waiter in late:
                waiter.cancel()
            if late:
                log.warning("%d connections still had work after %.1f s", len(late), grace_s)
        for handler in handlers:
            handler.close()
        closing = {protocol.lost: protocol for protocol in self._connections.values()}
        if closing:
            _, stuck = await asyncio.wait(list(closing), timeout=CLOSE_WAIT_S_MAX)
            for lost in stuck:
                closing[lost].abort()
        if self._server is not None:
            await self._server.wait_closed()
        if self._tls_server is not None:
            await self._tls_server.wait_closed()
        log.info("server on port %d stopped", self.port)


class _ClientProtocol(asyncio.BufferedProtocol):
    """One accepted connection's transport callbacks (see the module comment): reads into
    the server's scratch buffer, hands them to the handler, and stops reading while any
    reason to (`block_reading`) holds."""

    def __init__(self, server: BrokerServer):
        self.server = server
        self.handler: ConnectionHandler | None = None  # None: refused (or not yet accepted)
        self.address = ""
        self.transport: asyncio.Transport | None = None
        self.counted = [0]  # this connection's share of `incomplete_frames_bytes`
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._blocked: set[str] = set()  # why reading is paused: "sends", "writes", "shutdown"
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._room_task: asyncio.Task[None] | None = None
        self.read_pauses = 0  # times reading stopped (back-pressure; for stats and tests)

    # -- transport callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's TCPTransport has the methods without the base class).
        self.transport = cast(asyncio.Transport, transport)
        self.server._accepted(self, self.transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server._scratch

    def buffer_updated(self, nbytes: int) -> None:
        handler = self.handler
        if handler is None:
            return  # refused: what it sends is ignored until the close
        try:
            handler.data_received(self.server._scratch[:nbytes])
            self.server._check_incomplete(handler, self.counted)
            if handler.producers.pending_sends >= handler.ctx.pending_sends_max:
                self._wait_for_send_room(handler)
        except Exception:
            log.exception("connection from %s failed", handler.peer)
            handler.close()

    def eof_received(self) -> bool:
        if self.handler is not None:
            self.handler.data_received(b"")
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.handler is not None:
            log.debug("connection from %s ended: %s", self.handler.peer, exc)
        try:
            self.server._lost(self)
        finally:
            if self._writable is not None and not self._writable.done():
                self._writable.set_exception(ConnectionResetError("connection lost"))
                self._writable.exception()  # retrieved: no waiter needs to see it
            if self._room_task is not None:
                self._room_task.cancel()
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()
        self.block_reading("writes")

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)
        self.unblock_reading("writes")

    # -- back-pressure ---------------------------------------------------------------------

    async def drain(self) -> None:
        """Until the socket's write buffer is below its low-water mark.

        Raises:
            ConnectionResetError: the connection was lost meanwhile.
        """
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def block_reading(self, reason: str) -> None:
        if not self._blocked and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
            self.read_pauses += 1
        self._blocked.add(reason)

    def unblock_reading(self, reason: str) -> None:
        if reason not in self._blocked:
            return
        self._blocked.discard(reason)
        if not self._blocked and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _wait_for_send_room(self, handler: ConnectionHandler) -> None:
        """Stop reading until fewer than `pending_sends_max` SENDs wait for receipts."""
        if self._room_task is not None:
            return
        self.block_reading("sends")

        async def wait() -> None:
            await handler.wait_send_room()
            self._room_task = None
            self.unblock_reading("sends")

        self._room_task = asyncio.ensure_future(wait())


def _connections_max(configured: int) -> int:
    """The total connection limit in force: `broker_max_connections` (0: none), lowered to
    what the process's descriptor limit leaves after `DESCRIPTORS_RESERVED` (logged)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    room = max(1, soft - DESCRIPTORS_RESERVED)
    if configured == 0 or configured > room:
        log.warning("broker_max_connections=%d lowered to %d: the process may open %d files "
                    "(ulimit -n) and keeps %d for storage and the admin server", configured,
                    room, soft, DESCRIPTORS_RESERVED)
        return room
    return configured


def _logged_in_full(count: int) -> bool:
    """Whether the `count`-th event of a kind is a WARNING (else DEBUG)."""
    return count == 1 or count % LIMIT_WARNING_EVERY == 0


def _peer_address(transport: asyncio.BaseTransport) -> str:
    """The client's address without the port (what `max_connections_per_ip` counts)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer)


def _peer_name(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"/{peer[0]}:{peer[1]}"
    return str(peer)


async def serve(service: BrokerService, host: str = "127.0.0.1", port: int = 6650, *,
                advertised_url: str | None = None,
                keepalive_interval_s: float = KEEPALIVE_INTERVAL_S_DEFAULT,
                pending_sends_max: int = PENDING_SENDS_MAX_DEFAULT,
                ssl_context: ssl.SSLContext | None = None, tls_port: int | None = None,
                auth: AuthenticationService | None = None,
                advertised_url_tls: str | None = None,
                advertised_host: str | None = None) -> BrokerServer:
    """Serve a broker over TCP until `shutdown()` is awaited on the result.

    Args:
        service: the started broker service.
        host: bind address.
        port: bind port (0: any free one; read it back from `.port`).
        advertised_url: what LOOKUP answers (default `pulsar://host:port`).
        keepalive_interval_s: the broker's PING cadence (<= 0: no broker PINGs).
        pending_sends_max: SENDs awaiting receipts per connection before reading pauses.
        ssl_context: with `tls_port`: also serve TLS there (0: any free port).
        auth: authenticate every connection with this service (None: no authentication).
        advertised_url_tls: the TLS URL LOOKUP answers (default `pulsar+ssl://host:tls_port`).
        advertised_host: the host of the default URLs instead of `host` (their ports are the
            bound ones; Pulsar's advertisedAddress).

    Returns:
        The running server.

    Raises:
        OSError: the address cannot be bound.
    """
    server = BrokerServer(service, host, port, advertised_url=advertised_url,
                          keepalive_interval_s=keepalive_interval_s,
                          pending_sends_max=pending_sends_max, ssl_context=ssl_context,
                          tls_port=tls_port, auth=auth, advertised_url_tls=advertised_url_tls,
                          advertised_host=advertised_host)
    await server.start()
    return server
