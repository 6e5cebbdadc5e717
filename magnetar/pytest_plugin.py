"""A pytest plugin for testing Pulsar applications against Magnetar (entry point `pytest11`).

Installed with magnetar, it gives every pytest run three fixtures:

| fixture                       | scope    | yields                                             |
|-------------------------------|----------|----------------------------------------------------|
| `magnetar_standalone`         | function | a `StandaloneBroker` in a fresh temporary directory|
| `magnetar_standalone_session` | session  | one `StandaloneBroker` for the whole session       |
| `magnetar_embedded`           | function | a `magnetar.Client` with the broker in-process     |

A `StandaloneBroker` serves the Pulsar binary protocol and the admin REST API on free loopback
ports (the OS picks them: no race for a port) and has `service_url` (`pulsar://127.0.0.1:N`,
for the official `pulsar.Client` or `magnetar.Client`) and `admin_url` (`http://127.0.0.1:M`).
It runs in this process, on its own event-loop thread, so it starts in a fraction of a second
-- where a Pulsar container takes half a minute -- and stops cleanly when the fixture ends.

    def test_orders(magnetar_standalone):
        client = pulsar.Client(magnetar_standalone.service_url)
        ...

The plugin module imports nothing heavy until a fixture is used.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from magnetar.broker import BrokerConfig

    from ._client import Client

__all__ = ["StandaloneBroker", "magnetar_embedded", "magnetar_standalone",
           "magnetar_standalone_session"]

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

    def __init__(self, data_dir: str | os.PathLike[str], config: BrokerConfig | None = None):
        from ._loop import LoopThread

        self.data_dir = os.fspath(data_dir)
        self._thread = LoopThread("magnetar-standalone")
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


@pytest.fixture
def magnetar_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneBroker]:
    """A standalone broker of its own for one test."""
    with StandaloneBroker(tmp_path_factory.mktemp("magnetar-standalone")) as broker:
        yield broker


@pytest.fixture(scope="session")
def magnetar_standalone_session(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneBroker]:
    """One standalone broker for the whole session (use fresh topic names per test)."""
    with StandaloneBroker(tmp_path_factory.mktemp("magnetar-standalone-session")) as broker:
        yield broker


@pytest.fixture
def magnetar_embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """A `magnetar.Client` with the broker in this process, on a fresh data directory."""
    from ._client import Client

    client = Client(str(tmp_path_factory.mktemp("magnetar-embedded")))
    try:
        yield client
    finally:
        client.close()
