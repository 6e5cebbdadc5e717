"""Fixtures for the interop tests: standalone brokers in subprocesses and official clients.

`broker` is one broker for the whole session (default configuration); tests that restart,
kill or reconfigure a broker get their own from `broker_factory`. Every test uses fresh topic
names, so the shared broker's state never leaks from one test into another's assertions.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pulsar
import pytest

from . import BrokerProcess, RawClient

OPERATION_TIMEOUT_S = 15
BROKER_LOG_LINES_MAX = 60  # of each broker's log in a failed test's report


def _start_broker(base: Path, config: tuple[str, ...]) -> BrokerProcess:
    process = BrokerProcess(base / "data", base / "broker.log", config=config)
    process.start()
    return process


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The session's shared broker (fresh data directory, default settings)."""
    process = _start_broker(tmp_path_factory.mktemp("shared-broker"), ())
    yield process
    process.cleanup()


BrokerFactory = Callable[..., BrokerProcess]


class _PrivateBrokers:
    """`broker_factory`'s value: starts brokers and remembers them (for cleanup, and for the
    logs a failed test's report shows)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self._tmp_path_factory = tmp_path_factory
        self.started: list[BrokerProcess] = []

    def __call__(self, *config: str) -> BrokerProcess:
        process = _start_broker(self._tmp_path_factory.mktemp("broker"), tuple(config))
        self.started.append(process)
        return process


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """Start private brokers: `broker_factory("name=value", ...)` passes `--config` items."""
    brokers = _PrivateBrokers(tmp_path_factory)
    yield brokers
    for process in brokers.started:
        process.cleanup()


def _brokers_of(item: pytest.Item) -> Iterator[tuple[str, BrokerProcess]]:
    """The broker processes a test used: its fixtures' values, and a factory's brokers."""
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, BrokerProcess):
            yield name, value
        elif isinstance(value, _PrivateBrokers):
            for index, process in enumerate(value.started):
                yield f"{name}[{index}]", process


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report ends with the state and log tail of each broker it used: a
    broker that died or refused something says why only there (CI keeps no other trace)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for name, process in _brokers_of(item):
            report.sections.append((f"broker {name}: {process.describe()}",
                                    process.log_tail(BROKER_LOG_LINES_MAX)))


def new_client(url: str) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def read_everything(url: str, topic: str, receive_ms: int = 5000) -> list[bytes]:
    """Every stored message of `topic`, oldest first, through a reader from the earliest."""
    client = new_client(url)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(receive_ms).data())
        return out
    finally:
        client.close()


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[pulsar.Client]:
    """An official client of the shared broker, closed after the test."""
    official = new_client(broker.url)
    yield official
    official.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    local = re.sub(r"[^a-zA-Z0-9-]", "-", request.node.name)[:60]
    return f"persistent://public/default/{local}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def raw(broker: BrokerProcess) -> Iterator[Callable[[], RawClient]]:
    """Open raw protocol connections to the shared broker (closed after the test)."""
    opened: list[RawClient] = []

    def connect() -> RawClient:
        connection = RawClient(broker.port)
        opened.append(connection)
        return connection

    yield connect
    for connection in opened:
        connection.close()


@pytest.fixture
def service_url(broker: BrokerProcess) -> str:
    """The shared broker's `pulsar://127.0.0.1:PORT`."""
    return broker.url
