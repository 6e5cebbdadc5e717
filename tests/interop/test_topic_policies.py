"""Topic-level policies and message inspection with the official client: a topic's
maxProducers, deduplication and message TTL set over the admin REST API take effect on the
official client's producers and subscriptions (and its namespace's policy does not), and a
batch the client wrote is inspected as Pulsar's admin API shows it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.codec import decode_batch_payload

from .conftest import new_client, read_everything
from .in_process import InProcessBroker

NS_PATH = "/admin/v2/namespaces/public/default"
EXPIRY_WITHIN_S = 20.0
POLL_S = 0.05


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    process = InProcessBroker(tmp_path / "data")
    yield process
    process.stop()


def admin(broker: InProcessBroker, method: str, path: str, body: Any = None,
          query: dict[str, str] | None = None) -> tuple[int, Message, bytes]:
    url = broker.admin.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def topic_path(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def test_max_producers_on_the_topic_refuses_the_second_producer(
        broker: InProcessBroker, topic: str) -> None:
    client = new_client(broker.url)
    try:
        first = client.create_producer(topic)
        assert admin(broker, "POST", f"{NS_PATH}/maxProducersPerTopic", 5)[0] == 204
        assert admin(broker, "POST", f"{topic_path(topic)}/maxProducers", 1)[0] == 204
        with pytest.raises(pulsar.ProducerBusy):
            client.create_producer(topic)
        assert admin(broker, "DELETE", f"{topic_path(topic)}/maxProducers")[0] == 204
        second = client.create_producer(topic)  # the namespace's 5 apply again
        second.close()
        first.close()
    finally:
        client.close()


def test_deduplication_on_the_topic_only(broker: InProcessBroker, topic: str) -> None:
    other = topic + "-plain"
    client = new_client(broker.url)
    try:
        for name in (topic, other):
            client.create_producer(name).close()  # the topics exist
        assert admin(broker, "POST", f"{topic_path(topic)}/deduplicationEnabled", True)[0] \
            == 204
        for name in (topic, other):
            producer = client.create_producer(name, producer_name="dp",
                                              batching_enabled=False)
            producer.send(b"once", sequence_id=5)
            producer.send(b"once", sequence_id=5)  # a resend: dropped where dedup is on
            producer.close()
        assert read_everything(broker.url, topic) == [b"once"]
        assert read_everything(broker.url, other) == [b"once", b"once"]
    finally:
        client.close()


def test_message_ttl_on_the_topic_expires_the_backlog(broker: InProcessBroker,
                                                      topic: str) -> None:
    client = new_client(broker.url)
    try:
        client.subscribe(topic, "sub").close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(3):
            producer.send(b"m%d" % i)

        def backlog() -> int:
            status, _, body = admin(broker, "GET", f"{topic_path(topic)}/stats")
            assert status == 200
            return int(json.loads(body)["subscriptions"]["sub"]["msgBacklog"])

        assert backlog() == 3
        assert admin(broker, "POST", f"{topic_path(topic)}/messageTTL",
                     query={"messageTTL": "1"})[0] == 204
        assert json.loads(admin(broker, "GET", f"{NS_PATH}/messageTTL")[2] or b"null") is None
        deadline = time.monotonic() + EXPIRY_WITHIN_S
        while backlog() > 0:  # the messages turn 1 s old, then the expiry check runs
            assert time.monotonic() < deadline, "the topic's TTL expired nothing"
            broker.call(broker.service.run_maintenance(force=True))
            time.sleep(POLL_S)
        producer.close()
    finally:
        client.close()


def test_inspecting_a_batch_the_client_wrote(broker: InProcessBroker, topic: str) -> None:
    client = new_client(broker.url)
    try:
        client.subscribe(topic, "sub").close()
        producer = client.create_producer(topic, batching_enabled=True,
                                          batching_max_messages=3,
                                          batching_max_publish_delay_ms=60_000)
        for i in range(3):
            producer.send_async(b"b%d" % i, None, properties={"n": str(i)})
        producer.flush()
        status, headers, body = admin(broker, "GET",
                                      f"{topic_path(topic)}/subscription/sub/position/1")
        assert status == 200
        assert headers["X-Pulsar-num-batch-message"] == "3"
        messages = decode_batch_payload(body, 3)
        assert [m.payload for m in messages] == [b"b0", b"b1", b"b2"]
        assert [dict(m.properties) for m in messages] == [{"n": "0"}, {"n": "1"}, {"n": "2"}]
        last = json.loads(admin(broker, "GET", f"{topic_path(topic)}/lastMessageId")[2])
        assert last["batchIndex"] == 2
        assert f"{last['ledgerId']}:{last['entryId']}" == headers["X-Pulsar-Message-ID"]
        status, _, examined = admin(broker, "GET", f"{topic_path(topic)}/examinemessage",
                                    query={"initialPosition": "latest", "messagePosition": "1"})
        assert (status, examined) == (200, body)
        assert broker.health() == (200, "ok")
        producer.close()
    finally:
        client.close()
