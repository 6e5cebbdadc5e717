"""Errors: closed objects, bad URLs and arguments, missing namespaces, unreachable brokers, a
data directory that is not one. Each is one exception of the official hierarchy, with a
message naming what failed and where."""

from __future__ import annotations

from pathlib import Path

import pytest

import magnetar
from magnetar import _errors
from tests.interop import free_port

from .test_produce_consume import QUIET_MS


def test_every_error_is_a_pulsar_exception() -> None:
    for name in _errors.__all__:
        value = getattr(magnetar, name, None)
        if isinstance(value, type):
            assert issubclass(value, magnetar.PulsarException), name
    assert issubclass(magnetar.InvalidUrl, ValueError)
    assert issubclass(magnetar.InvalidConfiguration, ValueError)


def test_closed_client_producer_and_consumer(make_client: object, topic: str) -> None:
    assert callable(make_client)
    client: magnetar.Client = make_client()
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "sub")
    producer.close()
    with pytest.raises(magnetar.AlreadyClosed, match=topic):
        producer.send(b"x")
    consumer.close()
    with pytest.raises(magnetar.AlreadyClosed, match=topic):
        consumer.receive(QUIET_MS)
    client.close()
    client.close()  # idempotent
    with pytest.raises(magnetar.AlreadyClosed, match="closed"):
        client.create_producer(topic)
    assert not producer.is_connected()


def test_a_missing_namespace_is_topic_not_found(client: magnetar.Client) -> None:
    with pytest.raises(magnetar.TopicNotFound, match="no-such-tenant/ns"):
        client.create_producer("persistent://no-such-tenant/ns/t")


@pytest.mark.parametrize("url", ["", "http://", "kafka://host:9092",
                                 "pulsar://127.0.0.1:notaport", "pulsar://",
                                 "file://remote-host/data"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(magnetar.InvalidUrl):
        magnetar.Client(url)


def test_unreachable_broker_is_a_connect_error() -> None:
    url = f"pulsar://127.0.0.1:{free_port()}"
    with pytest.raises(magnetar.ConnectError, match=url):
        magnetar.Client(url, connection_timeout_ms=2000)


def test_data_dir_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(magnetar.InvalidConfiguration, match=str(path)):
        magnetar.Client(str(path))
    with pytest.raises(magnetar.InvalidConfiguration, match=str(path)):
        magnetar.Client(path.as_uri())


def test_bad_arguments_are_value_errors(client: magnetar.Client, topic: str) -> None:
    with pytest.raises(ValueError, match="unacked_messages_timeout_ms"):
        client.subscribe(topic, "sub", unacked_messages_timeout_ms=5000)
    with pytest.raises(ValueError, match="dead_letter_policy"):
        client.subscribe(topic, "sub", dead_letter_policy=object())
    with pytest.raises(ValueError, match="consumer_type"):
        client.subscribe(topic, "sub", consumer_type="Shared")
    with pytest.raises(ValueError, match="topic"):
        client.subscribe(["a", 3], "sub")  # type: ignore[list-item]
    producer = client.create_producer(topic)
    with pytest.raises(TypeError, match="bytes"):
        producer.send("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="properties"):
        producer.send(b"x", properties={"a": 1})  # type: ignore[dict-item]
