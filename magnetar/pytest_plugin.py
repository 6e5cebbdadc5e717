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

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ._standalone import StandaloneBroker

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["StandaloneBroker", "magnetar_embedded", "magnetar_standalone",
           "magnetar_standalone_session"]

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
