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
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
STOP_DEADLINE_S = 20.0  # from the signal to the process's exit
POLL_INTERVAL_S = 0.01  # between two looks while polling
RECEIVE_BYTES_MAX = 65536
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
    stopped and started again on both (a restart)."""

    data_dir: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    config: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()  # more `magnetar standalone` options
    process: subprocess.Popen[bytes] | None = None
    startup_s: float = 0.0  # from Popen to the first accepted connection, last start

    @property
    def url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "magnetar.broker.cli", "standalone", "--data-dir",
                str(self.data_dir), "--host", HOST, "--port", str(self.port), "--http-port", "0"]
        for item in EXTRA_CONFIG + self.config:
            args += ["--config", item]
        return args + list(self.extra_args)

    def start(self) -> float:
        """Start the process and wait until it accepts connections; returns the time that took."""
        assert self.process is None or self.process.poll() is not None, "already running"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with self.log_path.open("ab") as log:
            began = time.monotonic()
            self.process = subprocess.Popen(self.command(), cwd=REPO_ROOT, env=env,
                                            stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._accepting, STARTUP_DEADLINE_S, f"the broker on port {self.port}")
        self.startup_s = time.monotonic() - began
        return self.startup_s

    def _accepting(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the broker exited with {self.process.returncode}:\n"
                                 f"{self.log_tail()}")
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5):
                return True
        except OSError:
            return False

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
