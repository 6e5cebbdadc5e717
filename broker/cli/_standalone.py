"""`magnetar standalone`: one process, one data directory, the whole broker.

Theory of operation
-------------------
Start-up, in order: install the SIGTERM/SIGINT handlers (so a signal that arrives while the
data directory is being recovered still shuts down cleanly), open the `Storage` (recovering
the directory), start the `BrokerService`, start the binary-protocol server
(`wire/_server.serve`), then the admin HTTP server (`start_http`). Only then
does the process log that it is ready; the TCP port accepts connections from the moment the
server starts. The admin server's modules (aiohttp above all: a quarter of a second) are
imported only then, on a worker thread, while the event loop serves the binary protocol: a
restarted broker serves its topics before its admin API is up.

Security. Before the data directory is opened, the authentication service
(`_auth.AuthenticationService.from_config`: the token key is read) and the TLS context
(`_tls.server_ssl_context`: certificate, key, trusted CAs) are built, so a bad key or
certificate stops the process with a clear message before anything listens. So do advertised
listeners that contradict the TLS settings or `--advertised-url` (`_listeners.py`); with them
the internal listener's URLs are the advertised ones. Both listeners
of the binary protocol (plain `port`, TLS `tls_port`) and of the admin API (`http_port`,
`https_port`) share them.

Shutdown, on the first SIGTERM or SIGINT: stop accepting, let the commands already received
finish (every SEND that reached the broker is persisted and receipted), close the connections,
stop the admin server, close the service (topics, cursors, dedup snapshots) and finally the
storage (queued writes, checkpoint, directory lock). The signal handlers are removed first, so
a second signal kills the process at once; the data directory recovers from that like from any
crash.

The admin hook. `start_http(service, host, port, **options)` awaits
`broker.http._admin.start_admin(service, host, port, **options)` and returns what it gives (a
handle). The options carry the URLs its HTTP lookups answer with and, when configured,
authentication and HTTPS. At shutdown
`stop_http(handle)` calls the handle's `close()` (awaited if awaitable) and then its
`wait_closed()` if it has one -- the shape of an `asyncio.Server` or an aiohttp runner
wrapper.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import gc
import inspect
import logging
import os
import signal
import socket
import ssl
import time
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from magnetar.storage import (
    CorruptionError,
    DataDirLockedError,
    Storage,
    StorageConfig,
    latency_trace,
)

from .._config import REMOVED_SETTINGS, BrokerConfig, parse_value
from .._errors import ConfigurationError
from .._listeners import check_tls, listeners_of
from ..security._auth import AuthenticationService
from ..security._tls import TlsOptions, server_ssl_context
from ..topics._service import BrokerService, check_entry_fits_storage
from ..wire._connection_view import KEEPALIVE_INTERVAL_S_DEFAULT, PENDING_SENDS_MAX_DEFAULT
from ..wire._server import SHUTDOWN_GRACE_S_DEFAULT, serve

__all__ = [
    "StandaloneOptions",
    "config_with_overrides",
    "freeze_loaded",
    "run_standalone",
    "serve_standalone",
    "start_http",
    "stop_http",
]

log = logging.getLogger(__name__)

SHUTDOWN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
# The broker process's GIL switch interval (`sys.setswitchinterval`; Python's default is 5 ms).
# A thread that wants the GIL waits until the holder releases it; when the holder takes it
# straight back -- the event loop between two system calls, a checkpoint between two slices
# (`storage/_gil.py`) -- before the waiter has woken up, the waiter waits again, until one
# whole interval has passed and it forces a switch. A SEND's receipt needs three such
# hand-overs (loop -> journal writer -> loop), so with 5 ms its latency tail was a few of
# those: issue 14's publish latency p99 (bench_ab, alternated rounds: p99 3.48 ms against 3.01
# with 2 ms, p50 0.83 against 0.71). Shorter is not better: every forced switch also
# interrupts the event loop in the middle of a read's SENDs, and since the storage's
# background loops hand the GIL over by themselves (`storage/_gil.py`) the short interval
# mostly did that. 2 ms against 0.5 ms, three bench_ab runs of 6 alternated rounds, idle
# machine: batched publish 1.13x, 1.08x, 1.00x; unbatched 1.08x, 1.09x, 1.04x; publish
# latency p99 2.64 against 2.61 ms, then 2.99 against 3.20 ms.
GIL_SWITCH_INTERVAL_S: Final = 0.002
# The broker process's first cyclic-GC threshold (`gc.set_threshold`; Python's default is 700
# tracked allocations not yet freed). A collection holds the GIL for as long as it walks the
# young objects; at 700, publishing 5,000 msg/s set off about 40 young collections a second
# and a generation-1 pass every tenth (up to 1-4 ms each; the latency trace found one beside
# 78-88% of issue 14's slowest receipts, and beside 6-10% of all). At 5,000 most short-lived
# objects are freed before a collection sees them: 3-10 young collections in 6 s (0.5-0.8
# ms each) and no older one, against 219-343 and 20-32 (sum of pauses 1.7-8 ms against
# 27-50 ms). The other thresholds stay Python's.
GC_YOUNG_THRESHOLD: Final = 5000
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EVENT_LOOP_ENV: Final = "MAGNETAR_EVENT_LOOP"  # "asyncio" (the default) or "uvloop"


@dataclass(frozen=True)
class StandaloneOptions:
    """What `magnetar standalone` was asked for.

    Attributes:
        data_dir: the data directory (created when missing).
        host: bind address of the binary protocol and the admin server.
        port: binary protocol port (0: any free port).
        http_port: admin HTTP port, passed to the admin hook.
        advertised_url: what LOOKUP answers (default `pulsar://host:port`; with advertised
            listeners in `config`: the internal listener's URL, and it must stay None).
        config: the broker configuration.
        shutdown_grace_s: how long in-flight work may take at shutdown.
        tls: certificate and key for the TLS listeners (None: no TLS).
        tls_port: the `pulsar+ssl://` port (needs `tls`; 0: any free port).
        https_port: the admin API's HTTPS port (needs `tls`).
        advertised_url_tls: the TLS URL LOOKUP answers (default `pulsar+ssl://host:tls_port`).
        keepalive_interval_s: the broker's PING cadence; a connection silent for a whole
            interval after a PING is closed (<= 0: no broker PINGs, no idle timeout).
        pending_sends_max: SENDs awaiting receipts per connection before the broker stops
            reading that connection (Pulsar's maxPendingPublishRequestsPerConnection).
    """

    data_dir: str
    host: str = "127.0.0.1"
    port: int = 6650
    http_port: int = 8080
    advertised_url: str | None = None
    config: BrokerConfig = field(default_factory=BrokerConfig)
    shutdown_grace_s: float = SHUTDOWN_GRACE_S_DEFAULT
    tls: TlsOptions | None = None
    tls_port: int | None = None
    https_port: int | None = None
    advertised_url_tls: str | None = None
    keepalive_interval_s: float = KEEPALIVE_INTERVAL_S_DEFAULT
    pending_sends_max: int = PENDING_SENDS_MAX_DEFAULT
    # Start even when a journal record recovery must replay is corrupt: skip the rest of
    # that segment and lose what it holds (logged at ERROR with the records/bytes lost).
    skip_corrupt_journal_segments: bool = False
    # The storage engine's tunables (its skip_corrupt_journal_segments is the field above).
    storage: StorageConfig = field(default_factory=StorageConfig)
    # The host LOOKUP answers with, the port being the bound one (Pulsar's advertisedAddress;
    # None: the bind address; not with advertised_url / advertised_url_tls).
    advertised_address: str | None = None

    def __post_init__(self) -> None:
        """Raises ConfigurationError naming a setting out of its range, or
        max_message_size_bytes and entry_size_bytes_max when the broker's largest message
        does not fit the storage's largest entry (nothing built)."""
        if self.pending_sends_max < 1:
            raise ConfigurationError(f"pending_sends_max must be at least 1, not "
                                     f"{self.pending_sends_max}")
        if not self.shutdown_grace_s >= 0:  # NaN too
            raise ConfigurationError(f"shutdown_grace_s must be 0 or more, not "
                                     f"{self.shutdown_grace_s}")
        check_entry_fits_storage(self.config, self.storage_config().entry_size_bytes_max)

    def storage_config(self) -> StorageConfig:
        """The storage the broker runs on."""
        return dataclasses.replace(
            self.storage, skip_corrupt_journal_segments=self.skip_corrupt_journal_segments)


def config_with_overrides(overrides: list[str], base: BrokerConfig | None = None) -> BrokerConfig:
    """A `BrokerConfig` with `name=value` overrides (`--config` on the command line).

    Values are parsed by the field's type: integers, floats, booleans (true/false/1/0/yes/no)
    and comma-separated tuples of strings.

    Raises:
        ConfigurationError: (a ValueError) an unknown field, a malformed item, a value of the
            wrong type or out of the setting's range (`_config.SETTING_RANGES`).
    """
    base = base or BrokerConfig()
    types_by_name = typing.get_type_hints(BrokerConfig)
    changes: dict[str, Any] = {}
    for item in overrides:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if sep and name in REMOVED_SETTINGS:
            raise ConfigurationError(f"{name} is no longer a setting: {REMOVED_SETTINGS[name]}")
        if not sep or name not in types_by_name:
            raise ConfigurationError(_unknown_setting(item, name, list(types_by_name)))
        changes[name] = parse_value(types_by_name[name], text.strip(), name)
    return dataclasses.replace(base, **changes)


def _unknown_setting(item: str, name: str, names: list[str]) -> str:
    if "=" not in item:
        return f"not a broker setting: {item!r} (expected name=value)"
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"not a broker setting: {item!r}{hint}"


async def start_http(service: BrokerService, host: str, port: int,
                     **options: Any) -> object | None:
    """Start the admin HTTP server (see the module comment); `options` go to its
    `start_admin` as keywords.

    Returns:
        The admin server's handle.
    """
    start_admin = await asyncio.to_thread(_admin_starter)
    handle: object = await start_admin(service, host, port, **options)
    return handle


def _admin_starter() -> Callable[..., Awaitable[object]]:
    """`start_admin`, its modules imported by the calling thread (see the module comment)."""
    from ..http._admin import start_admin
    return start_admin


async def stop_http(handle: object | None) -> None:
    """Stop what `start_http` started (nothing for None)."""
    if handle is None:
        return
    close = getattr(handle, "close", None)
    if close is not None:
        result = close()
        if inspect.isawaitable(result):
            await result
    wait_closed = getattr(handle, "wait_closed", None)
    if wait_closed is not None:
        result = wait_closed()
        if inspect.isawaitable(result):
            await result


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        log.info("%s received: shutting down", signal.Signals(signum).name)
        for each in SHUTDOWN_SIGNALS:  # a second signal takes the default action: exit now
            loop.remove_signal_handler(each)
        stop.set()

    for each in SHUTDOWN_SIGNALS:
        loop.add_signal_handler(each, on_signal, each)


async def serve_standalone(options: StandaloneOptions, stop: asyncio.Event | None = None) -> int:
    """Run the standalone broker until `stop` is set (or a shutdown signal arrives).

    Args:
        options: what to run.
        stop: an event that ends the run (default: a new one set by the signal handlers).

    Returns:
        The process exit status: 0 after a clean shutdown.

    Raises:
        DataDirLockedError: another process owns the data directory.
        CorruptionError: recovery refused the data directory (left as found).
        ConfigurationError: a key, certificate or TLS setting, or the data directory, is
            unusable (nothing started).
        OSError: the ports cannot be bound.
    """
    latency_trace.start_lag_probe(asyncio.get_running_loop())
    started = time.monotonic()
    security = _Security.from_options(options)
    options = _with_listener_urls(options, security)
    stop = stop or asyncio.Event()
    _install_signal_handlers(stop)
    storage = _open_storage(options.data_dir, options.storage_config())
    try:
        service = BrokerService(storage, options.config)
        await service.start()
        # The storage's ledger table (several objects a ledger, one ledger or more a topic:
        # ~120,000 at 100,000 topics) lives as long as the process; `_main` froze what the
        # imports loaded, this freezes the table too (see `freeze_loaded`).
        freeze_loaded()
        try:
            await _serve_until(service, options, stop, started, security)
        finally:
            await service.close()
    finally:
        storage.close()
    log.info("stopped cleanly")
    return EXIT_OK


def freeze_loaded() -> None:
    """Move every object the cyclic GC tracks by now out of its full collections
    (`gc.freeze`). A full collection holds the GIL while it walks every tracked object: with
    100,000 topics' ledgers loaded each took ~80 ms (6 in 3 s of 100 producers publishing,
    measured on the shared 2-core machine), a stall of every connection and of the journal's
    receipts. Frozen objects are never collected: only what lives as long as the process
    (modules, the ledger table as recovered) is frozen, before anything is served."""
    gc.freeze()


def _open_storage(data_dir: str, config: StorageConfig) -> Storage:
    """`Storage.open`, with a data directory that cannot be used reported as a
    ConfigurationError naming it (DataDirLockedError passes through)."""
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise ConfigurationError(f"--data-dir {data_dir} is not a directory")
    try:
        return Storage.open(data_dir, config)
    except OSError as exc:
        raise ConfigurationError(f"cannot use --data-dir {data_dir}: "
                                 f"{exc.strerror or exc}") from exc


def _with_listener_urls(options: StandaloneOptions, security: _Security) -> StandaloneOptions:
    """With advertised listeners configured, the internal listener's URLs become the
    advertised ones (what LOOKUP answers a client that names no listener).

    Raises:
        ConfigurationError: listeners next to --advertised-url/--advertised-url-tls, or a
            `pulsar+ssl://` URL missing (TLS port) or superfluous (none); nothing started.
    """
    listeners = listeners_of(options.config)
    internal = listeners.internal
    if internal is None:
        return options
    if options.advertised_url is not None or options.advertised_url_tls is not None:
        raise ConfigurationError("advertised_listeners and --advertised-url/"
                                 "--advertised-url-tls must not appear together")
    if options.advertised_address is not None:
        raise ConfigurationError("advertised_listeners and advertisedAddress must not "
                                 "appear together")
    try:
        check_tls(listeners, security.ssl_context is not None and options.tls_port is not None)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    return dataclasses.replace(options, advertised_url=internal.broker_url,
                               advertised_url_tls=internal.broker_url_tls)


@dataclass(frozen=True)
class _Security:
    auth: AuthenticationService | None
    ssl_context: ssl.SSLContext | None

    @classmethod
    def from_options(cls, options: StandaloneOptions) -> _Security:
        if options.tls is None and (options.tls_port is not None
                                    or options.https_port is not None):
            raise ConfigurationError("--tls-port and --https-port need --tls-cert-file and "
                                     "--tls-key-file")
        if options.tls is not None and options.tls_port is None and options.https_port is None:
            log.warning("TLS certificate given but neither --tls-port nor --https-port: "
                        "nothing is served over TLS")
        return cls(AuthenticationService.from_config(options.config),
                   None if options.tls is None else server_ssl_context(options.tls))

    def admin_options(self, options: StandaloneOptions) -> dict[str, object]:
        found: dict[str, object] = {}
        if self.auth is not None:
            found["auth"] = self.auth
        if self.ssl_context is not None and options.https_port is not None:
            found.update(ssl_context=self.ssl_context, https_port=options.https_port)
        return found


async def _serve_until(service: BrokerService, options: StandaloneOptions, stop: asyncio.Event,
                       started: float, security: _Security) -> None:
    tls = security.ssl_context is not None and options.tls_port is not None
    server = await serve(service, options.host, options.port,
                         advertised_url=options.advertised_url, auth=security.auth,
                         ssl_context=security.ssl_context if tls else None,
                         tls_port=options.tls_port if tls else None,
                         advertised_url_tls=options.advertised_url_tls,
                         advertised_host=options.advertised_address,
                         keepalive_interval_s=options.keepalive_interval_s,
                         pending_sends_max=options.pending_sends_max)
    http: object | None = None
    try:
        http = await start_http(service, options.host, options.http_port,
                                broker_url=server.url,
                                broker_url_tls=server.context.advertised_url_tls or None,
                                **security.admin_options(options))
        log.info("Magnetar standalone ready on %s%s (data in %s, %s, started in %.2f s)",
                 server.url, f" and {server.context.advertised_url_tls}"
                 if server.tls_port is not None else "", options.data_dir,
                 "no admin HTTP" if http is None
                 else f"admin HTTP port {getattr(http, 'port', options.http_port)}",
                 time.monotonic() - started)
        await stop.wait()
    finally:
        await server.shutdown(options.shutdown_grace_s)
        await stop_http(http)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """The standard event loop; uvloop's when `MAGNETAR_EVENT_LOOP=uvloop` and it is
    installed. Opt-in, and uvloop stays out of the runtime dependencies: measured in one run
    of bench_ab.py (3 alternated rounds, unbatched 1 KB publish, 2 loaded cores, issue 14) it
    published 1.01x as fast as the standard loop for the same CPU per message (52.2 against
    52.5 us) -- the loop's own work is a small share of a SEND's cost.

    Raises:
        ConfigurationError: the variable names another loop, or uvloop is not installed.
    """
    choice = os.environ.get(EVENT_LOOP_ENV, "asyncio")
    if choice == "asyncio":
        return asyncio.new_event_loop
    if choice != "uvloop":
        raise ConfigurationError(f"{EVENT_LOOP_ENV}={choice}: expected asyncio or uvloop")
    try:
        import uvloop
    except ImportError:
        raise ConfigurationError(f"{EVENT_LOOP_ENV}=uvloop: uvloop is not installed") from None
    return uvloop.new_event_loop


def run_standalone(options: StandaloneOptions) -> int:
    """`magnetar standalone`: run until SIGTERM/SIGINT; returns the exit status."""
    try:
        factory = event_loop_factory()
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(serve_standalone(options))
    except (DataDirLockedError, CorruptionError, ConfigurationError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_FAILED
    except socket.gaierror as exc:  # an OSError that does not say which name
        log.error("cannot start: --host %s: %s", options.host, exc.strerror)
        return EXIT_FAILED
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return EXIT_FAILED
