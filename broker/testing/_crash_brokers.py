"""The brokers the broker crash harness crashes (see `crashtest` for the theory of operation).

* `BrokerProcess`: `python -m magnetar.broker.cli standalone` in a subprocess on a free
  loopback port; `kill()` is SIGKILL by PID, `stop()` SIGTERM (a clean shutdown).
* `InProcessBroker`: the service and its protocol server on a private event loop in a
  thread of the harness, over a `Storage` on the fault-injecting `SimFileSystem` (with the
  storage's own journal and checkpoint threads, as in the real broker). `power_loss()` stops
  the file system first (every later file operation fails, nothing more reaches the disk),
  then the broker without any I/O, then drops, tears or corrupts what was not synced.

Both take the same settings (`BROKER_SETTINGS`): deduplication on, snapshots of the dedup
state and delayed-delivery ticks frequent enough that a short run crosses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from magnetar.storage import Storage
from magnetar.storage.testing.simfs import SimFileSystem

from .._config import BrokerConfig
from ..topics._service import BrokerService
from ..wire._server import BrokerServer, serve
from ._sim_core import _silence_service

__all__ = ["BROKER_SETTINGS", "BrokerProcess", "InProcessBroker", "free_port"]

T = TypeVar("T")

HOST = "127.0.0.1"
STARTUP_DEADLINE_S = 60.0  # from Popen (or Storage.open) to accepting connections
STOP_DEADLINE_S = 30.0  # from SIGTERM to the process's exit
CALL_DEADLINE_S = 30.0  # for work run on the in-process broker's loop
POLL_INTERVAL_S = 0.02
LOG_TAIL_BYTES_MAX = 2000

BROKER_SETTINGS: dict[str, object] = {
    "broker_deduplication_enabled": True,
    "broker_deduplication_entries_interval": 25,  # a dedup snapshot every 25 entries
    "delayed_delivery_tick_time_ms": 50,
}


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


class BrokerProcess:
    """One `magnetar standalone` subprocess on `data_dir` (see the module comment); its
    output goes to `log_path`."""

    def __init__(self, data_dir: str, log_path: str):
        self.data_dir = data_dir
        self.log_path = log_path
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    def start(self) -> None:
        """Start it and wait until it accepts connections.

        Raises:
            RuntimeError: it exited or did not accept in time (it is killed; the log's
                tail is in the message).
        """
        self.port = free_port()
        command = [sys.executable, "-m", "magnetar.broker.cli", "standalone", "--data-dir",
                   self.data_dir, "--host", HOST, "--port", str(self.port), "--http-port", "0"]
        for name, value in BROKER_SETTINGS.items():
            command += ["--config", f"{name}={str(value).lower()}"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while not self._accepting():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the broker did not start (exit status "
                                   f"{self.process.returncode}): {self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def _accepting(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL by PID (a crash), and reap it."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL after `STOP_DEADLINE_S`); its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - LOG_TAIL_BYTES_MAX))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return text.strip().replace("\n", " | ")


class InProcessBroker:
    """A broker on a private loop in a thread over `SimFileSystem` (see the module comment).

    Raises (from the constructor) what `Storage.open` raises, and RuntimeError when the
    service or the server cannot start (the loop is stopped; the storage is abandoned).
    """

    def __init__(self, data_dir: str, fs: SimFileSystem):
        self.fs = fs
        self.storage = Storage.open(data_dir, fs=fs)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="crashtest-broker")
        self.thread.start()
        self.service: BrokerService | None = None
        self.server: BrokerServer | None = None
        try:
            self.call(self._start())
        except BaseException:
            self._end_loop()
            self.storage.abandon()
            raise

    async def _start(self) -> None:
        config = BrokerConfig(**BROKER_SETTINGS)  # type: ignore[arg-type]
        self.service = BrokerService(self.storage, config)
        await self.service.start()
        self.server = await serve(self.service, HOST, 0)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(work, self.loop)
        return future.result(timeout=CALL_DEADLINE_S)

    def power_loss(self, where: str) -> dict[str, int]:
        """Stop the disk (unless a planned crash already did, `where` names it otherwise),
        then the broker without I/O, then lose the unsynced writes. Returns their fates."""
        self.fs.crash(where)
        with contextlib.suppress(Exception):
            self.call(self._halt())
        self._end_loop()
        self.storage.abandon()
        return self.fs.power_loss()

    async def _halt(self) -> None:
        """Close every connection at once (clients see the broker go) and stop the service's
        dispatchers and tasks; nothing of it can reach the stopped disk."""
        if self.service is not None:
            _silence_service(self.service)
        if self.server is not None:
            await self.server.shutdown(grace_s=0)

    def stop(self) -> None:
        """A clean shutdown: the server, the service, the storage."""
        try:
            self.call(self._close())
        finally:
            self._end_loop()
            self.storage.close()

    async def _close(self) -> None:
        if self.server is not None:
            await self.server.shutdown(grace_s=5)
        if self.service is not None:
            await self.service.close()

    def _end_loop(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread."""
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        # What the cancelled connection tasks report at the end is the point, not news.
        self.loop.set_exception_handler(lambda _loop, _context: None)
        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(cancel_all())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=CALL_DEADLINE_S)
        if not self.thread.is_alive():
            self.loop.close()
