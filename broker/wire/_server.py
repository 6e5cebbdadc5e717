"""The TCP server: Pulsar's binary protocol on a socket, one task per connection.

Theory of operation
-------------------
`serve()` starts an asyncio server for a `BrokerService` and returns a `BrokerServer`. For each
accepted connection one task runs `_serve_connection`: it reads whatever bytes arrive and hands
them to that connection's `ConnectionHandler` (`_connection_handler.py`), which decodes frames,
hands each to its command handler (producers, consumers, lookup and discovery), which call the
service, and writes replies and deliveries through the stream writer. The task is the
only reader of its socket; everything else the connection does happens in handler tasks or in
dispatcher callbacks on the same event loop.

Back-pressure. After each read the task waits while the handler has `pending_sends_max`
SENDs without receipts (the client's publishes outrun storage), and while the socket's write
buffer is above its high-water mark (the client does not read what we send). Either way the
server simply stops reading that socket; other connections carry on.

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
so every SEND that reached us is persisted and receipted; then close every connection. Closing
the service and the storage is the caller's job (`_standalone.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import ssl
from typing import Final

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

RECEIVE_BYTES_MAX: Final = 256 * 1024  # one read from a socket
SHUTDOWN_GRACE_S_DEFAULT: Final = 10.0  # in-flight work is waited for at most this long
CLOSE_WAIT_S_MAX: Final = 2.0  # then connection tasks that have not ended are cancelled
REFUSAL_WRITE_S_MAX: Final = 1.0  # a refused connection's ERROR is written this long at most
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
        # handler -> (its reading task, its writer)
        self._connections: dict[ConnectionHandler,
                                tuple[asyncio.Task[None], asyncio.StreamWriter]] = {}
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
            self._tls_server = await asyncio.start_server(
                self._serve_connection, self.host, self.tls_port, ssl=self._ssl_context)
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            self.context.advertised_url_tls = self._advertised_url_tls or advertised_url_for(
                self._advertised_host, self.tls_port, "pulsar+ssl")
            log.info("TLS listening on %s:%d", self.host, self.tls_port)
        try:
            self._server = await asyncio.start_server(self._serve_connection, self.host,
                                                      self.port)
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

    async def _refuse(self, writer: asyncio.StreamWriter, peer: str, reason: str) -> None:
        """ERROR NotAllowedError with request id -1, then close (Pulsar's refusal)."""
        self.counters.refused += 1
        level = logging.WARNING if _logged_in_full(self.counters.refused) else logging.DEBUG
        log.log(level, "refusing the connection of %s: %s (%d refused since start)", peer,
                reason, self.counters.refused)
        error = pb.CommandError(request_id=REQUEST_ID_NONE, error=pb.NotAllowedError,
                                message=reason)
        with contextlib.suppress(ConnectionError, OSError):
            writer.write(encode_frame(base_command(error)))
            await asyncio.wait_for(writer.drain(), REFUSAL_WRITE_S_MAX)
        writer.close()
        with contextlib.suppress(ConnectionError, OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), REFUSAL_WRITE_S_MAX)

    async def _serve_connection(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        peer = _peer_name(writer)
        address = _peer_address(writer)
        refusal = self._refusal(address)
        if refusal is not None:
            await self._refuse(writer, peer, refusal)
            return
        handler = ConnectionHandler(self.context, writer.write, writer.close, peer,
                                    write_parts=gathering_writer(writer.transport),
                                    write_buffer_bytes=writer.transport.get_write_buffer_size,
                                    drain=writer.drain,
                                    tls_common_name=peer_common_name(
                                        writer.get_extra_info("peercert")))
        task = asyncio.current_task()
        assert task is not None
        self._connections[handler] = (task, writer)
        self._per_ip[address] = self._per_ip.get(address, 0) + 1
        self.counters.active = len(self._connections)
        log.debug("connection from %s", peer)
        counted = [0]  # this connection's share of `incomplete_frames_bytes`
        try:
            handler.start_keepalive()
            await self._read_loop(handler, reader, writer, counted)
        except (ConnectionError, OSError) as exc:
            log.debug("connection from %s ended: %s", peer, exc)
        except Exception:
            log.exception("connection from %s failed", peer)
        finally:
            handler.connection_lost()
            self._count_incomplete(counted, 0)
            self._connections.pop(handler, None)
            self.counters.active = len(self._connections)
            left = self._per_ip.pop(address) - 1
            assert left >= 0
            if left:
                self._per_ip[address] = left
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
            log.debug("connection from %s closed", peer)

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

    async def _read_loop(self, handler: ConnectionHandler, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, counted: list[int]) -> None:
        while not handler.closed:
            data = await reader.read(RECEIVE_BYTES_MAX)
            handler.data_received(data)
            if not data:
                return
            del data  # not held while waiting below
            self._check_incomplete(handler, counted)
            await handler.wait_send_room()
            await writer.drain()

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S_DEFAULT) -> None:
        """Stop gracefully (see the module comment). Idempotent."""
        self.context.accepting = False
        self.context.service.stopping = True
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        handlers = list(self._connections)
        for _, writer in self._connections.values():
            with contextlib.suppress(RuntimeError, AttributeError):
                writer.transport.pause_reading()  # type: ignore[attr-defined]
        idle = [asyncio.ensure_future(handler.wait_idle()) for handler in handlers]
        if idle:
            _, late = await asyncio.wait(idle, timeout=grace_s)
            for waiter in late:
                waiter.cancel()
            if late:
                log.warning("%d connections still had work after %.1f s", len(late), grace_s)
        for handler in handlers:
            handler.close()
        tasks = [task for task, _ in self._connections.values()]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S_MAX)
            for task in stuck:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
        if self._tls_server is not None:
            await self._tls_server.wait_closed()
        log.info("server on port %d stopped", self.port)


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


def _peer_address(writer: asyncio.StreamWriter) -> str:
    """The client's address without the port (what `max_connections_per_ip` counts)."""
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer)


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
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
