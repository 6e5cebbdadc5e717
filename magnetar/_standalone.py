"""`StandaloneBroker`: a broker serving a data directory on free loopback ports, in this
process, on its own event-loop thread.

It is what the pytest plugin's fixtures yield (`pytest_plugin.py`) and what the Spark source's
driver starts for a data directory (`spark/_host.py`): storage, broker service, the Pulsar
binary protocol and the admin REST API, with `service_url` (`pulsar://127.0.0.1:N`) and
`admin_url` (`http://127.0.0.1:M`). The OS picks the ports, so there is no race for one.
`stop()` stops serving, then closes the broker and its storage; a start that fails part-way
closes what it had opened.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magnetar.broker import BrokerConfig

__all__ = ["HOST", "StandaloneBroker"]

HOST = "127.0.0.1"


class StandaloneBroker:
    """A broker on loopback ports, in this process (see the module comment).

    Args:
        data_dir: its data directory (created when missing).
        config: the broker configuration (default: Magnetar's defaults).

    Raises:
        ConnectError: another process holds the data directory.
        OSError: the loopback ports cannot be bound.
    """

    def __init__(self, data_dir: str | os.PathLike[str], config: BrokerConfig | None = None,
                 *, thread_name: str = "magnetar-standalone"):
        from ._loop import LoopThread

        self.data_dir = os.fspath(data_dir)
        self._thread = LoopThread(thread_name)
        try:
            self._state: dict[str, Any] = self._thread.run(self._start(config))
        except BaseException:
            self._thread.stop()
            raise
        self.service_url: str = self._state["server"].url
        self.admin_url: str = self._state["admin"].url

    async def _start(self, config: BrokerConfig | None) -> dict[str, Any]:
        from magnetar.broker import serve, start_admin

        from ._embedded import EmbeddedTransport

        transport = await EmbeddedTransport.open(self.data_dir, config)
        try:
            server = await serve(transport.service, HOST, 0)
            try:
                admin = await start_admin(transport.service, HOST, 0, broker_url=server.url)
            except BaseException:
                await server.shutdown()
                raise
        except BaseException:
            await transport.close()
            raise
        return {"transport": transport, "server": server, "admin": admin}

    async def _stop(self) -> None:
        state = self._state
        try:
            await state["server"].shutdown()
            await state["admin"].close()
        finally:
            await state["transport"].close()

    def stop(self) -> None:
        """Stop serving, close the broker and its storage (idempotent)."""
        if self._thread.alive:
            try:
                self._thread.run(self._stop())
            finally:
                self._thread.stop()

    def __enter__(self) -> StandaloneBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
