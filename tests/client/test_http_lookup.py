"""`Client("http://host:port")`: discovery over the admin server's HTTP lookup, then the
binary protocol to the broker it names (the official `test_v2_topics_http`)."""

from __future__ import annotations

import re

import pytest

import magnetar
from magnetar import InitialPosition
from magnetar.pytest_plugin import StandaloneBroker

from .test_produce_consume import drain

RECEIVE_MS = 5000


def test_produce_consume_and_patterns_over_http_lookup(
        magnetar_standalone: StandaloneBroker) -> None:
    with magnetar.Client(magnetar_standalone.admin_url) as client:
        consumer = client.subscribe("http-topic", "sub")
        producer = client.create_producer("http-topic")
        sent = producer.send(b"looked up over http")
        message = consumer.receive(RECEIVE_MS)
        assert (message.data(), message.message_id()) == (b"looked up over http", sent)
        assert client.get_topic_partitions("http-topic") == \
            ["persistent://public/default/http-topic"]
        pattern = client.subscribe(re.compile("persistent://public/default/http-.*"), "p",
                                   initial_position=InitialPosition.Earliest)
        assert [m.data() for m in drain(pattern, 1)] == [b"looked up over http"]


def test_http_lookup_errors(magnetar_standalone: StandaloneBroker) -> None:
    with magnetar.Client(magnetar_standalone.admin_url) as client, \
            pytest.raises(magnetar.TopicNotFound, match="no-such-tenant"):
        client.create_producer("persistent://no-such-tenant/ns/t")
    with pytest.raises(magnetar.ConnectError, match="cannot reach"):
        magnetar.Client("http://127.0.0.1:9", operation_timeout_seconds=2)
