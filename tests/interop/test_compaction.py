"""Topic compaction with the official client: `PUT .../compaction` and its status over the
admin REST API, `read_compacted=True` readers and Exclusive consumers seeing the latest value
per key and then the live tail, batched producers, the TableView, and a broker subprocess
compacting by its threshold and then killed with SIGKILL."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from . import wait_for
from .conftest import BrokerFactory, new_client
from .in_process import InProcessBroker

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000
QUIET_MS = 500
COMPACTION_DEADLINE_S = 20.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    process = InProcessBroker(tmp_path / "data")
    yield process
    process.stop()


def _topic() -> str:
    return f"persistent://public/default/compact-{uuid.uuid4().hex[:8]}"


def admin(broker: InProcessBroker, method: str, topic: str) -> tuple[int, Any]:
    path = "/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/compaction"
    request = urllib.request.Request(broker.admin.url + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
            return answer.status, json.loads(body) if body else None
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def compact(broker: InProcessBroker, topic: str) -> None:
    status, _ = admin(broker, "PUT", topic)
    assert status == 204
    wait_for(lambda: admin(broker, "GET", topic)[1]["status"] != "RUNNING",
             COMPACTION_DEADLINE_S, "the compaction to end")
    assert admin(broker, "GET", topic) == (200, {"status": "SUCCESS", "lastError": ""})


def populate(client: pulsar.Client, topic: str, batched: bool) -> None:
    """k0..k3 twice, then k1 and k2 deleted (empty values) and a keyless message."""
    producer = client.create_producer(topic, batching_enabled=batched,
                                      batching_max_publish_delay_ms=50)
    for round_ in ("a", "b"):
        for i in range(4):
            producer.send_async(f"v{i}{round_}".encode(), None, partition_key=f"k{i}")
    producer.send_async(b"", None, partition_key="k1")
    producer.send_async(b"", None, partition_key="k2")
    producer.send_async(b"no key", None)
    producer.flush()
    producer.close()


EXPECTED = [("k0", b"v0b"), ("k3", b"v3b")]


def drain(receive: Any) -> list[tuple[str, bytes]]:
    """(key, value) of everything `receive(ms)` returns until it times out."""
    found = []
    while True:
        try:
            message = receive(QUIET_MS)
        except pulsar.Timeout:
            return found
        found.append((message.partition_key(), message.data()))


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_reader_and_exclusive_consumer_see_the_compacted_view_then_the_tail(
        broker: InProcessBroker, batched: bool) -> None:
    topic = _topic()
    assert admin(broker, "GET", topic)[0] == 404
    client = new_client(broker.url)
    try:
        client.subscribe(topic, "everything", initial_position=pulsar.InitialPosition.Earliest)
        populate(client, topic, batched)
        assert admin(broker, "GET", topic) == (200, {"status": "NOT_RUN", "lastError": ""})
        compact(broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        consumer = client.subscribe(topic, "compacted", is_read_compacted=True,
                                    consumer_type=pulsar.ConsumerType.Exclusive,
                                    initial_position=pulsar.InitialPosition.Earliest)
        assert drain(reader.read_next) == EXPECTED
        assert drain(consumer.receive) == EXPECTED
        producer = client.create_producer(topic)
        producer.send(b"tail", partition_key="k0")
        assert reader.read_next(RECEIVE_MS).data() == b"tail"
        assert consumer.receive(RECEIVE_MS).data() == b"tail"
        plain = client.create_reader(topic, pulsar.MessageId.earliest)
        assert len(drain(plain.read_next)) == 12  # without read_compacted: everything
    finally:
        client.close()


def test_table_view_sees_the_compacted_state(broker: InProcessBroker) -> None:
    topic = _topic()
    client = new_client(broker.url)
    try:
        client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
        populate(client, topic, batched=True)
        compact(broker, topic)
        view = client.create_table_view(topic)
        found: dict[str, bytes] = {}
        view.for_each(lambda key, value: found.__setitem__(key, value))
        assert found == dict(EXPECTED)
        view.close()
    finally:
        client.close()


def test_compaction_while_one_runs_is_a_conflict_and_unknown_topics_404(
        broker: InProcessBroker) -> None:
    topic = _topic()
    assert admin(broker, "PUT", topic)[0] == 404
    client = new_client(broker.url)
    try:
        producer = client.create_producer(topic)
        for i in range(2000):
            producer.send_async(b"x" * 100, None, partition_key=f"k{i % 300}")
        producer.flush()
        statuses = [admin(broker, "PUT", topic)[0] for _ in range(2)]
        assert statuses[0] == 204
        assert statuses[1] in (204, 409)  # 409 while the first still runs
        wait_for(lambda: admin(broker, "GET", topic)[1]["status"] == "SUCCESS",
                 COMPACTION_DEADLINE_S, "the compaction to succeed")
    finally:
        client.close()


def test_threshold_compaction_survives_sigkill(broker_factory: BrokerFactory) -> None:
    process = broker_factory("broker_service_compaction_threshold_bytes=1",
                             "broker_service_compaction_monitor_interval_s=1")
    topic = _topic()
    client = new_client(process.url)
    try:
        populate(client, topic, batched=False)

        def compacted() -> bool:
            reader = client.create_reader(topic, pulsar.MessageId.earliest,
                                          is_read_compacted=True)
            try:
                return drain(reader.read_next) == EXPECTED
            finally:
                reader.close()

        wait_for(compacted, COMPACTION_DEADLINE_S, "the threshold's compaction")
    finally:
        client.close()
    process.kill()
    process.start()
    again = new_client(process.url)
    try:
        began = time.monotonic()
        reader = again.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert drain(reader.read_next) == EXPECTED
        assert time.monotonic() - began < COMPACTION_DEADLINE_S
    finally:
        again.close()


def test_the_cli_compacts_and_reports_the_status(broker: InProcessBroker,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from magnetar.broker.cli._main import main

    topic = _topic()
    client = new_client(broker.url)
    try:
        client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
        populate(client, topic, batched=False)
    finally:
        client.close()
    common = ["--admin-url", broker.admin.url]
    assert main(["topics", "compaction-status", topic, *common]) == 0
    assert "NOT_RUN" in capsys.readouterr().out
    assert main(["topics", "compact", topic, *common]) == 0
    assert main(["topics", "compaction-status", "-w", topic, *common]) == 0
    assert f"Compaction status of {topic}: SUCCESS" in capsys.readouterr().out
