"""The pytest plugin (entry point `pytest11`): its fixtures, used here as any project would,
and a separate pytest run in a bare directory proving the entry point is found."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pulsar

import magnetar
from magnetar.pytest_plugin import StandaloneBroker
from tests.interop.conftest import new_client

RECEIVE_MS = 5000


def test_standalone_serves_the_official_client_and_the_admin_api(
        magnetar_standalone: StandaloneBroker) -> None:
    official = new_client(magnetar_standalone.service_url)
    try:
        consumer = official.subscribe("plugin-topic", "sub")
        official.create_producer("plugin-topic").send(b"through the plugin")
        assert consumer.receive(RECEIVE_MS).data() == b"through the plugin"
    finally:
        official.close()
    with urllib.request.urlopen(f"{magnetar_standalone.admin_url}/admin/v2/tenants",
                                timeout=10) as answer:
        assert "public" in json.loads(answer.read())


def test_session_broker_with_our_client(magnetar_standalone_session: StandaloneBroker) -> None:
    with magnetar.Client(magnetar_standalone_session.service_url) as client:
        reader = client.create_reader("session-topic", magnetar.MessageId.earliest)
        client.create_producer("session-topic").send(b"session")
        assert reader.read_next(RECEIVE_MS).data() == b"session"


def test_embedded_fixture(magnetar_embedded: magnetar.Client) -> None:
    consumer = magnetar_embedded.subscribe("t", "sub")
    magnetar_embedded.create_producer("t").send(b"embedded")
    assert consumer.receive(RECEIVE_MS).data() == b"embedded"


def test_stopping_releases_the_data_directory(tmp_path: Path) -> None:
    with StandaloneBroker(tmp_path / "data") as broker:
        url = broker.service_url
    with magnetar.Client(str(tmp_path / "data")):  # the lock is free again
        pass
    try:
        pulsar.Client(url, connection_timeout_ms=1000, operation_timeout_seconds=2,
                      logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
                      ).create_producer("x")
        raise AssertionError("the stopped broker still accepted a producer")
    except pulsar.PulsarException:
        pass


def test_a_project_gets_the_fixtures_from_the_entry_point(tmp_path: Path) -> None:
    (tmp_path / "test_app.py").write_text(textwrap.dedent("""
        import pulsar

        def test_app(magnetar_standalone):
            client = pulsar.Client(magnetar_standalone.service_url)
            producer = client.create_producer("app")
            assert producer.send(b"x") is not None
            client.close()
    """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_app.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
