"""Broker-side topic control seen by the official client: termination (TopicTerminated for
producers, consumers read everything up to the end, kept across a restart), unload while
producing and consuming (nothing lost, the client carries on) and a forced delete (the
producer is closed and reconnects to a fresh topic). The broker runs with an admin port."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from magnetar.codec import SingleMessage, build_message, pb

from . import HOST, HTTP_TIMEOUT_S, HttpBrokerProcess, RawClient, wait_for
from .conftest import new_client

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000
DEADLINE_S = 20.0


def _admin(process: HttpBrokerProcess, method: str, path: str) -> Any:
    request = urllib.request.Request(f"http://{HOST}:{process.http_port}{path}",
                                     method=method, data=b"" if method != "GET" else None)
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        body = response.read()
    return json.loads(body) if body else None


def _rest_path(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


@pytest.fixture
def http_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpBrokerProcess]:
    base = tmp_path_factory.mktemp("topic-control-broker")
    process = HttpBrokerProcess(base / "data", base / "broker.log")
    process.start()
    yield process
    process.cleanup()


def test_termination(http_broker: HttpBrokerProcess, topic: str) -> None:
    client = new_client(http_broker.url)
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, send_timeout_millis=5000)
        ids = [producer.send(f"m{i}".encode()) for i in range(5)]
        last = _admin(http_broker, "POST", _rest_path(topic) + "/terminate")
        assert last == {"ledgerId": ids[-1].ledger_id(), "entryId": ids[-1].entry_id(),
                        "partitionIndex": -1}
        # The broker closed the producer; its reconnect is refused as terminated.
        with pytest.raises(pulsar.TopicTerminated):
            producer.send(b"late")
        with pytest.raises(pulsar.TopicTerminated):
            client.create_producer(topic)
        received = []
        for _ in range(5):
            message = consumer.receive(RECEIVE_MS)
            received.append(message.data())
            consumer.acknowledge(message)
        assert received == [f"m{i}".encode() for i in range(5)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(300)  # the end: nothing more, and no connection trouble
        stats = _admin(http_broker, "GET", _rest_path(topic) + "/internalStats")
        assert stats["state"] == "Terminated"
    finally:
        client.close()
    http_broker.restart()
    client = new_client(http_broker.url)
    try:
        with pytest.raises(pulsar.TopicTerminated):
            client.create_producer(topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(RECEIVE_MS).data() for _ in range(5)] == [
            f"m{i}".encode() for i in range(5)]
        assert not reader.has_message_available()
    finally:
        client.close()


def test_unload_while_producing_and_consuming(http_broker: HttpBrokerProcess,
                                              topic: str) -> None:
    client = new_client(http_broker.url)
    total = 300
    try:
        consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, batching_enabled=False)
        failures: list[Exception] = []
        sent = threading.Event()

        def produce() -> None:
            try:
                for i in range(total):
                    producer.send(f"m{i}".encode())
            except Exception as exc:  # reported through the list
                failures.append(exc)
            sent.set()

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        received: set[bytes] = set()
        unloads = 0
        while len(received) < total:
            message = consumer.receive(RECEIVE_MS * 2)
            received.add(message.data())
            consumer.acknowledge(message)
            if len(received) in (50, 150) and unloads < 2:
                _admin(http_broker, "PUT", _rest_path(topic) + "/unload")
                unloads += 1
        assert sent.wait(DEADLINE_S)
        assert failures == []
        assert unloads == 2
        assert received == {f"m{i}".encode() for i in range(total)}
        log = http_broker.log_path.read_text()
        assert log.count(f"topic {topic} unloaded") == 2
        producer.send(b"after")  # the same producer carries on
        assert consumer.receive(RECEIVE_MS).data() == b"after"
    finally:
        client.close()


def test_forced_delete_closes_producers_and_consumers(http_broker: HttpBrokerProcess,
                                                      topic: str) -> None:
    client = new_client(http_broker.url)
    try:
        consumer = client.subscribe(topic, "sub",
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        producer.send(b"old")
        assert consumer.receive(RECEIVE_MS).data() == b"old"  # not acked: deleted with it
        _admin(http_broker, "DELETE", _rest_path(topic) + "?force=true")
        log = http_broker.log_path
        wait_for(lambda: log.read_text().count("topic deleted") >= 2, DEADLINE_S,
                 "the broker closing the producer and the consumer")
        # Both reconnect to a freshly auto-created topic and carry on there.
        producer.send(b"new")
        assert consumer.receive(RECEIVE_MS).data() == b"new"
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert reader.read_next(RECEIVE_MS).data() == b"new"
        assert not reader.has_message_available()
    finally:
        client.close()


def _send(connection: RawClient, sequence_id: int, body: bytes) -> None:
    metadata, payload = build_message(SingleMessage(body, sequence_id=sequence_id),
                                      producer_name="raw", publish_time=1_700_000_000_000)
    connection.send(pb.CommandSend(producer_id=1, sequence_id=sequence_id), metadata, payload)


def test_raw_termination_closes_the_producer_and_refuses_it(http_broker: HttpBrokerProcess,
                                                            topic: str) -> None:
    T = pb.BaseCommand
    connection = RawClient(http_broker.port)
    try:
        connection.handshake()
        connection.request(pb.CommandProducer(topic=topic, producer_id=1, request_id=1),
                           T.PRODUCER_SUCCESS)
        _send(connection, 0, b"kept")
        assert connection.expect(T.SEND_RECEIPT).body.sequence_id == 0
        _admin(http_broker, "POST", _rest_path(topic) + "/terminate")
        closed = connection.expect(T.CLOSE_PRODUCER).body
        assert (closed.producer_id, closed.request_id) == (1, 2**64 - 1)
        _send(connection, 1, b"crossed the close")  # dropped quietly, as Pulsar does
        connection.send(pb.CommandProducer(topic=topic, producer_id=1, request_id=2))
        refused = connection.expect(T.ERROR).body
        assert (refused.request_id, refused.error) == (2, pb.TopicTerminatedError)
    finally:
        connection.close()
