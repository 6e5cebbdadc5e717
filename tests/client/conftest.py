"""Fixtures for the client suite: the same tests run against both transports.

`make_client` builds `magnetar.Client`s of one transport, chosen by the test's parameter:
"embedded" opens the broker in this process on a fresh data directory; "tcp" connects to a
standalone broker subprocess (`tests/interop`'s `BrokerProcess`) on a free loopback port.
`partitioned_client` does the same against a broker that creates partitioned topics
(`PARTITIONS` partitions) on first use.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import magnetar
from magnetar.broker import BrokerConfig
from tests.interop import BrokerProcess

TRANSPORTS = ("embedded", "tcp")
PARTITIONS = 3
PARTITIONED_CONFIG = {"allow_auto_topic_creation_type": "partitioned",
                      "default_num_partitions": PARTITIONS}
ClientFactory = Callable[[], magnetar.Client]


def _broker(base: Path, config: dict[str, object]) -> BrokerProcess:
    process = BrokerProcess(base / "data", base / "broker.log",
                            config=tuple(f"{k}={v}" for k, v in config.items()))
    process.start()
    return process


@pytest.fixture(scope="session")
def tcp_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = _broker(tmp_path_factory.mktemp("client-broker"), {})
    yield process
    process.cleanup()


@pytest.fixture(scope="session")
def partitioned_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = _broker(tmp_path_factory.mktemp("client-pbroker"), PARTITIONED_CONFIG)
    yield process
    process.cleanup()


def _factory(request: pytest.FixtureRequest, tmp_path: Path, broker_name: str,
             config: dict[str, object]) -> Iterator[ClientFactory]:
    """Clients of the parametrized transport; all closed after the test."""
    made: list[magnetar.Client] = []

    def make() -> magnetar.Client:
        if request.param == "embedded":
            client = magnetar.Client(str(tmp_path / "data"), broker_config=BrokerConfig(**config))
        else:
            broker: BrokerProcess = request.getfixturevalue(broker_name)
            client = magnetar.Client(broker.url, operation_timeout_seconds=15)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture(params=TRANSPORTS)
def make_client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClientFactory]:
    yield from _factory(request, tmp_path, "tcp_broker", {})


@pytest.fixture
def client(make_client: ClientFactory) -> magnetar.Client:
    return make_client()


@pytest.fixture(params=TRANSPORTS)
def partitioned_client(request: pytest.FixtureRequest,
                       tmp_path: Path) -> Iterator[magnetar.Client]:
    factory = _factory(request, tmp_path, "partitioned_broker", PARTITIONED_CONFIG)
    yield next(factory)()
    for _ in factory:
        pass


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    local = re.sub(r"[^a-zA-Z0-9-]", "-", request.node.name)[:60]
    return f"persistent://public/default/{local}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=TRANSPORTS)
def service_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A service URL of the parametrized transport: a data directory, or the TCP broker's."""
    if request.param == "embedded":
        return str(tmp_path / "data")
    broker: BrokerProcess = request.getfixturevalue("tcp_broker")
    return broker.url
