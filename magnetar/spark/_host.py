"""Serving a data directory to Spark's worker processes: the driver's broker host.

Theory of operation
-------------------
A data directory is locked by the one process that opens it, but Spark runs a data source's
`schema`/`reader`/`partitions` in one Python worker and every `read`/`write` task in others.
So no worker opens the directory itself. `magnetar.spark.register(spark)`, which runs in the
driver's own Python process, starts a `BrokerHost` there: a small loopback control server.
The data source class it registers carries the host's address and a random token (the class is
built inside `register`, so cloudpickle ships it by value to every worker). A worker that is
given `service=./data` asks the host for that directory; the host starts (once per directory)
a broker in the driver process -- storage, broker service, Pulsar protocol server and admin
API on free loopback ports, on its own event-loop thread -- and answers its `pulsar://` and
`http://` URLs. Every task then talks to the broker over loopback TCP, exactly as it would to a
remote `magnetar standalone` or Pulsar cluster, so one code path serves all three.

Why the driver and not a subprocess: the brokers live exactly as long as the Spark
application's driver (closed by `stop_brokers()`, which `register` also installs at exit), no
orphan can keep a directory locked, and the application can publish to or read the same
directory meanwhile through `serve(data_dir)` (the same broker). The cost is that executors
must reach the driver's loopback, i.e. local mode; on a cluster give `service=pulsar://...`.

Protocol: one JSON line each way, `{"token", "data_dir"}` -> `{"service_url", "admin_url"}` or
`{"error"}`; the host serves one request per connection.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import socketserver
import threading
from dataclasses import dataclass
from typing import Any

from magnetar._standalone import StandaloneBroker

__all__ = ["BrokerHost", "Endpoints", "HostAddress", "ask_host", "host", "serve",
           "stop_brokers"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
REQUEST_BYTES_MAX = 64 * 1024  # one control request line
ASK_TIMEOUT_S = 60.0  # a broker's start includes the storage's recovery


@dataclass(frozen=True)
class Endpoints:
    """Where a worker connects: the broker's binary protocol URL and, when known, its admin
    REST URL (None for a `pulsar://` service given without `adminUrl`)."""

    service_url: str
    admin_url: str | None


@dataclass(frozen=True)
class HostAddress:
    """How a worker reaches the driver's `BrokerHost` (shipped inside the data source class)."""

    port: int
    token: str


def _start_broker(data_dir: str) -> tuple[StandaloneBroker, Endpoints]:
    """A broker on `data_dir` and its endpoints.

    Raises:
        magnetar.ConnectError: another process holds the directory.
        magnetar.InvalidConfiguration: the path is not a usable data directory.
    """
    broker = StandaloneBroker(data_dir, thread_name="magnetar-spark-broker")
    return broker, Endpoints(broker.service_url, broker.admin_url)


_brokers: dict[str, tuple[StandaloneBroker, Endpoints]] = {}
_brokers_lock = threading.Lock()


def serve(data_dir: str) -> Endpoints:
    """The endpoints of this process's broker on `data_dir`, started on first use.

    Raises:
        magnetar.ConnectError / InvalidConfiguration: as `_start_broker`.
    """
    path = os.path.realpath(data_dir)
    with _brokers_lock:
        served = _brokers.get(path)
        if served is None:
            served = _brokers[path] = _start_broker(path)
    return served[1]


def stop_brokers() -> None:
    """Stop every broker `serve` started in this process (and the control server)."""
    global _host
    with _brokers_lock:
        brokers = [broker for broker, _ in _brokers.values()]
        _brokers.clear()
        server, _host = _host, None
    if server is not None:
        server.shutdown()
        server.server_close()
    for broker in brokers:
        try:
            broker.stop()
        except Exception:
            log.exception("stopping the broker on %s failed", broker.data_dir)


class _Handler(socketserver.StreamRequestHandler):
    server: BrokerHost

    def handle(self) -> None:
        line = self.rfile.readline(REQUEST_BYTES_MAX)
        try:
            request = json.loads(line)
            if not secrets.compare_digest(str(request.get("token")), self.server.token):
                raise PermissionError("wrong token")
            endpoints = serve(str(request["data_dir"]))
            answer: dict[str, Any] = {"service_url": endpoints.service_url,
                                      "admin_url": endpoints.admin_url}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(answer).encode() + b"\n")


class BrokerHost(socketserver.ThreadingTCPServer):
    """The driver's control server (see the module comment)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((HOST, 0), _Handler)
        self.token = secrets.token_hex(16)
        self.address = HostAddress(self.server_address[1], self.token)
        threading.Thread(target=self.serve_forever, name="magnetar-spark-host",
                         daemon=True).start()


_host: BrokerHost | None = None


def host() -> HostAddress:
    """This process's broker host, started on first use (stopped by `stop_brokers`)."""
    global _host
    with _brokers_lock:
        if _host is None:
            _host = BrokerHost()
            # Before the interpreter's own worker threads stop (atexit runs after that, and
            # closing the storage needs a worker thread): threading's exit hooks run in reverse.
            import concurrent.futures.thread  # noqa: F401 -- its hook registered first

            threading._register_atexit(stop_brokers)  # type: ignore[attr-defined]
        return _host.address


def ask_host(address: HostAddress, data_dir: str) -> Endpoints:
    """Ask the driver's host for the broker on `data_dir` (from a worker).

    Raises:
        ConnectionError: the host cannot be reached or the broker could not start (the message
            says why).
    """
    request = json.dumps({"token": address.token, "data_dir": data_dir}).encode() + b"\n"
    try:
        with socket.create_connection((HOST, address.port), timeout=ASK_TIMEOUT_S) as sock:
            sock.sendall(request)
            answer = json.loads(sock.makefile("rb").readline(REQUEST_BYTES_MAX))
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"cannot reach the driver's magnetar broker host on port "
                              f"{address.port}: {exc}") from None
    if "error" in answer:
        raise ConnectionError(f"the driver could not serve {data_dir}: {answer['error']}")
    return Endpoints(answer["service_url"], answer["admin_url"])
