"""The official client with an `http://` service URL: its lookups, partition metadata and
namespace listings go to the admin HTTP server (`_lookup_http.py`), its data to the binary
port the lookup names. Produce/consume, a partitioned topic and a regex consumer."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from . import HOST, HTTP_TIMEOUT_S, HttpBrokerProcess
from .conftest import new_client

RECEIVE_TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def http_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpBrokerProcess]:
    base = tmp_path_factory.mktemp("http-lookup-broker")
    process = HttpBrokerProcess(base / "data", base / "broker.log")
    process.start()
    yield process
    process.cleanup()


@pytest.fixture
def http_client(http_broker: HttpBrokerProcess) -> Iterator[pulsar.Client]:
    official = new_client(f"http://{HOST}:{http_broker.http_port}")
    yield official
    official.close()


def test_lookup_answers_lookup_data(http_broker: HttpBrokerProcess, topic: str) -> None:
    local = topic.removeprefix("persistent://")
    data = http_broker.get_json(f"/lookup/v2/topic/persistent/{local}")
    assert data["brokerUrl"] == http_broker.url
    assert data["nativeUrl"] == http_broker.url
    assert data["httpUrl"] == f"http://{HOST}:{http_broker.http_port}"
    assert "brokerUrlTls" in data  # the C++ client refuses an answer without it
    assert http_broker.get_json(
        f"/admin/v2/persistent/{local}/partitions?checkAllowAutoCreation=true") == {
        "partitions": 0}
    url = f"http://{HOST}:{http_broker.http_port}/lookup/v2/topic/persistent/nope/ns/t"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S)
    assert missing.value.code == 404
    assert "nope/ns" in json.loads(missing.value.read())["reason"]


def test_produce_and_consume_through_an_http_service_url(http_client: pulsar.Client,
                                                         topic: str) -> None:
    consumer = http_client.subscribe(topic, "sub")
    producer = http_client.create_producer(topic)
    sent = [f"m-{i}".encode() for i in range(20)]
    for payload in sent:
        producer.send(payload)
    received = []
    for _ in sent:
        message = consumer.receive(RECEIVE_TIMEOUT_MS)
        received.append(message.data())
        consumer.acknowledge(message)
    assert received == sent


def test_partitioned_topic_through_an_http_service_url(http_broker: HttpBrokerProcess,
                                                       http_client: pulsar.Client,
                                                       topic: str) -> None:
    local = topic.removeprefix("persistent://")
    request = urllib.request.Request(
        f"http://{HOST}:{http_broker.http_port}/admin/v2/persistent/{local}/partitions",
        data=b"3", method="PUT", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S).close()
    assert len(http_client.get_topic_partitions(topic)) == 3
    consumer = http_client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = http_client.create_producer(
        topic, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    sent = {f"p-{i}".encode() for i in range(30)}
    for payload in sorted(sent):
        producer.send(payload)
    received, partitions = set(), set()
    for _ in sent:
        message = consumer.receive(RECEIVE_TIMEOUT_MS)
        received.add(message.data())
        partitions.add(message.topic_name())
        consumer.acknowledge(message)
    assert received == sent
    assert partitions == {f"{topic}-partition-{i}" for i in range(3)}


def test_regex_consumer_through_an_http_service_url(http_client: pulsar.Client,
                                                    topic: str) -> None:
    names = [f"{topic}-r{i}" for i in range(3)]
    for name in names:
        http_client.create_producer(name).close()  # the topics exist before the subscribe
    consumer = http_client.subscribe(re.compile(re.escape(topic) + "-r.*"), "sub",
                                     initial_position=pulsar.InitialPosition.Earliest)
    for name in names:
        http_client.create_producer(name).send(name.encode())
    got = {consumer.receive(RECEIVE_TIMEOUT_MS).data() for _ in names}
    assert got == {name.encode() for name in names}
