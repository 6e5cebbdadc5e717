"""Interop tests: `magnetar standalone` in a subprocess, driven over TCP by the official
`pulsar-client` (C++ client inside) and by a raw protocol client built on our codec.

This module holds the helpers the tests share: `BrokerProcess` (start, stop by signal, kill,
restart -- always by PID), `RawClient` (one protocol connection, frame by frame) and small
pollers. Waiting is always a poll bounded by a deadline; nothing sleeps as an assertion.

`MAGNETAR_INTEROP_BROKER_CONFIG="name=value;name=value"` adds settings to every broker a
`BrokerProcess` starts: e.g. `broker_entry_metadata_interceptors=timestamp,index` runs the
whole interop suite against stored entries prefixed with broker entry metadata.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from google.protobuf.message import Message

from magnetar.codec import (
    NEED_DATA,
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    Role,
    base_command,
    pb,
)

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
STARTUP_DEADLINE_S = 30.0  # from Popen to accepting connections
PORT_ATTEMPTS_MAX = 3  # first starts, each with fresh ports after a collision
STOP_DEADLINE_S = 20.0  # from the signal to the process's exit
POLL_INTERVAL_S = 0.01  # between two looks while polling
RECEIVE_BYTES_MAX = 65536
HTTP_TIMEOUT_S = 10  # one admin HTTP request
EXTRA_CONFIG = tuple(item for item in os.environ.get("MAGNETAR_INTEROP_BROKER_CONFIG",
                                                     "").split(";") if item.strip())


def interruptible_child() -> None:
    """`preexec_fn` for a child a test interrupts with SIGINT: SIGINT unblocked and at its
    default disposition, whatever the test process inherited or its threads (the official
    client's among them) left behind, so the child's Python turns it into KeyboardInterrupt.
    Two Ctrl-C tests timed out in two clean-clone runs of the whole suite, the child never
    seeing the signal; alone they passed every time."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], T | None], deadline_s: float, what: str) -> T:
    """Poll `condition` until it returns something other than None/False, or fail."""
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value is not None and value is not False:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


@dataclass
class BrokerProcess:
    """One `magnetar standalone` subprocess on a fixed port and data directory; it can be
    stopped and started again on both (a restart).

    Ports. A port left at 0 is picked here (`free_port`) before the first start. Such a pick
    can collide: another process may bind the same port between the probe closing it and the
    broker binding it. A broker that cannot bind exits, so the first start retries with fresh
    picks (`PORT_ATTEMPTS_MAX`), and only then fails. A restart keeps its ports (clients
    reconnect to them) and fails with the broker's log if one was taken meanwhile.

    Readiness is the broker's own log line for each port it binds (`ready_patterns`), read
    from this start's part of the log: a probe connection would also succeed if a stranger
    held the port, and the test would then talk to the stranger."""

    data_dir: Path
    log_path: Path
    port: int = 0
    config: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()  # more `magnetar standalone` options
    process: subprocess.Popen[bytes] | None = None
    startup_s: float = 0.0  # from Popen to the broker's last listening line, last start
    picked_ports: set[str] = field(default_factory=set, init=False)  # fields chosen here
    started_once: bool = field(default=False, init=False)

    PORT_FIELDS: ClassVar[tuple[str, ...]] = ("port",)  # the fields that hold a port

    def __post_init__(self) -> None:
        for name in self.PORT_FIELDS:
            if getattr(self, name) == 0:
                self.picked_ports.add(name)
        self.repick_ports()

    def repick_ports(self) -> None:
        """Choose a fresh port for each field picked here (first, or after a collision)."""
        for name in self.picked_ports:
            setattr(self, name, free_port())

    @property
    def url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "magnetar.broker.cli", "standalone", "--data-dir",
                str(self.data_dir), "--host", HOST, "--port", str(self.port), "--http-port", "0"]
        for item in EXTRA_CONFIG + self.config:
            args += ["--config", item]
        return args + list(self.extra_args)

    def ready_patterns(self) -> list[re.Pattern[str]]:
        """The log lines that show this broker listens on each of its known ports."""
        return [re.compile(rf": listening on {re.escape(HOST)}:{self.port}, ")]

    def start(self) -> float:
        """Start the process and wait until it listens; returns the time that took.

        Raises:
            AssertionError: it exited first (with its log), or a deadline passed.
        """
        assert self.process is None or self.process.poll() is not None, "already running"
        for attempt in range(1, PORT_ATTEMPTS_MAX + 1):
            began = time.monotonic()
            if self._spawn_until_ready():
                self.startup_s = time.monotonic() - began
                self.started_once = True
                return self.startup_s
            if self.started_once or not self.picked_ports or attempt == PORT_ATTEMPTS_MAX:
                break
            self.repick_ports()
        assert self.process is not None
        raise AssertionError(f"the broker exited with {self.process.returncode}:\n"
                             f"{self.log_tail()}")

    def _spawn_until_ready(self) -> bool:
        """Run the broker until its ready lines appear (True) or until it exits because a
        port was in use (False); any other exit or a timeout raises AssertionError."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.command(), cwd=REPO_ROOT, env=env,
                                            stdout=log, stderr=subprocess.STDOUT)
        patterns = self.ready_patterns()
        process = self.process

        def outcome() -> str | None:
            exited = process.poll() is not None  # (before reading: its last lines are in)
            with self.log_path.open("rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            if all(pattern.search(text) for pattern in patterns):
                return "ready"
            if not exited:
                return None
            if "address already in use" in text:
                return "port taken"
            raise AssertionError(f"the broker exited with {process.returncode}:\n"
                                 f"{self.log_tail()}")

        return wait_for(outcome, STARTUP_DEADLINE_S,
                        f"the broker on port {self.port} to listen") == "ready"

    def send_signal(self, signum: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signum)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` to the process and wait for it to exit; returns its exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.send_signal(signum)
        try:
            return self.process.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.process.wait(timeout=STOP_DEADLINE_S)
            raise AssertionError(
                f"the broker ignored signal {signum}:\n{self.log_tail()}") from None

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.stop(signal.SIGKILL)

    def restart(self) -> float:
        self.stop()
        return self.start()

    def describe(self) -> str:
        """The process's state, for a report: running, exited (with its status), or never
        started."""
        if self.process is None:
            return "never started"
        status = self.process.poll()
        if status is None:
            return f"running, pid {self.process.pid}, port {self.port}"
        return f"exited with status {status}, port {self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def cleanup(self) -> None:
        """Stop the process if it still runs (by PID, SIGKILL after the stop deadline)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(AssertionError):
                self.stop()


@dataclass
class HttpBrokerProcess(BrokerProcess):
    """A standalone broker with its admin HTTP server on a known port (0: picked here)."""

    http_port: int = 0

    PORT_FIELDS: ClassVar[tuple[str, ...]] = ("port", "http_port")

    def command(self) -> list[str]:
        args = super().command()
        args[args.index("--http-port") + 1] = str(self.http_port)
        return args

    def ready_patterns(self) -> list[re.Pattern[str]]:
        """The binary port's line, and the admin API's (it starts after the binary port)."""
        return [*super().ready_patterns(),
                re.compile(rf"admin API listening on {re.escape(HOST)}:{self.http_port}\b")]

    def get_json(self, path: str) -> Any:
        url = f"http://{HOST}:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read())


class RawClient:
    """One protocol connection to the broker, frame by frame, with our codec as the client."""

    def __init__(self, port: int, timeout_s: float = 5.0):
        self.sock = socket.create_connection((HOST, port), timeout=timeout_s)
        self.conn = Connection(Role.CLIENT)
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.sock.close()

    def send(self, body: Message, metadata: pb.MessageMetadata | None = None,
             payload: bytes = b"") -> None:
        self.sock.sendall(self.conn.send(base_command(body), metadata, payload))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_event(self) -> Frame | ChecksumMismatch | ConnectionClosed:
        """The next event from the broker, PINGs answered and skipped."""
        end = time.monotonic() + self.timeout_s
        while True:
            event = self.conn.next_event()
            if isinstance(event, Frame) and event.type == pb.BaseCommand.PING:
                self.send(pb.CommandPong())
                continue
            if event is not NEED_DATA:
                assert not isinstance(event, type(NEED_DATA))
                return event
            if time.monotonic() > end:
                raise AssertionError("no frame from the broker in time")
            try:
                data = self.sock.recv(RECEIVE_BYTES_MAX)
            except ConnectionResetError:
                data = b""
            self.conn.receive_data(data)

    def expect(self, command_type: int) -> Frame:
        """The next frame, which must be of `command_type`."""
        event = self.next_event()
        assert isinstance(event, Frame), f"expected {pb.BaseCommand.Type.Name(command_type)}, " \
                                         f"got {event!r}"
        assert event.type == command_type, (
            f"expected {pb.BaseCommand.Type.Name(command_type)}, got "
            f"{pb.BaseCommand.Type.Name(event.type)}: {event.command}")
        return event

    def request(self, body: Message, reply_type: int) -> Any:
        """Send a command and return the body of the reply of `reply_type`."""
        self.send(body)
        return self.expect(reply_type).body

    def handshake(self, protocol_version: int = 20,
                  client_version: str = "magnetar-interop") -> pb.CommandConnected:
        self.send(pb.CommandConnect(client_version=client_version,
                                    protocol_version=protocol_version, auth_method_name="none"))
        connected: pb.CommandConnected = self.expect(pb.BaseCommand.CONNECTED).body
        return connected

    def closed_by_broker(self) -> bool:
        """Whether the broker closes the socket within the timeout (data before is ignored)."""
        end = time.monotonic() + self.timeout_s
        while time.monotonic() < end:
            try:
                data = self.sock.recv(RECEIVE_BYTES_MAX)
            except ConnectionResetError:
                return True
            except TimeoutError:
                return False
            if not data:
                return True
        return False
