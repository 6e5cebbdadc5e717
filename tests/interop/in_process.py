"""An in-process broker for interop tests that need to reach into it: the service, its
binary-protocol server and its admin API on a private event loop in a thread, over a real
storage on the fault-injecting file system (`SimFileSystem`), all on loopback ports. The
test's own thread drives it with the official client; `call` runs a coroutine on the
broker's loop.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from magnetar.broker import BrokerConfig, BrokerService
from magnetar.broker.http._admin import AdminServer, start_admin
from magnetar.broker.wire._server import BrokerServer, serve
from magnetar.storage import Storage
from magnetar.storage.testing.simfs import SimFileSystem

CALL_TIMEOUT_S = 30.0


class InProcessBroker:
    """A broker service, its binary-protocol server and its admin API on a private event
    loop in a thread, over a storage on `SimFileSystem`."""

    def __init__(self, path: Path, config: BrokerConfig | None = None):
        self.fs = SimFileSystem(seed=5)
        self.storage = Storage.open(path, fs=self.fs)
        self.config = config or BrokerConfig()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.service: BrokerService = self.call(self._start())
        assert self.server.port > 0

    async def _start(self) -> BrokerService:
        service = BrokerService(self.storage, self.config)
        await service.start()  # maintenance on: it resumes writes
        self.server: BrokerServer = await serve(service, "127.0.0.1", 0)
        self.admin: AdminServer = await start_admin(service, "127.0.0.1", 0)
        return service

    def call(self, work: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(work, self.loop)
        return future.result(timeout=CALL_TIMEOUT_S)

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.server.port}"

    def health(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"{self.admin.url}/admin/v2/brokers/health",
                                        timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def stop(self) -> None:
        async def shutdown() -> None:
            await self.server.shutdown(grace_s=5)
            await self.admin.close()
            await self.service.close()

        self.call(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=CALL_TIMEOUT_S)
        self.loop.close()
        self.storage.close()
