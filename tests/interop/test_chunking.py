"""Chunked messages through a broker with a small `max_message_size`: the client splits a
large message into chunks (one entry and one receipt each) and the consumer reassembles them;
the broker stores and forwards the chunks like any entry."""

from __future__ import annotations

import os

import pulsar
import pytest

from .conftest import BrokerFactory, new_client

pytestmark = pytest.mark.interop

MAX_MESSAGE_BYTES = 64 * 1024
RECEIVE_MS = 5000


def test_chunked_message_round_trip(broker_factory: BrokerFactory) -> None:
    process = broker_factory(f"max_message_size_bytes={MAX_MESSAGE_BYTES}")
    client = new_client(process.url)
    try:
        topic = "persistent://public/default/chunked"
        consumer = client.subscribe(topic, "chunks")
        producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
        big = os.urandom(5 * MAX_MESSAGE_BYTES + 123)
        producer.send(big)
        producer.send(b"small")
        message = consumer.receive(RECEIVE_MS)
        assert message.data() == big
        assert consumer.receive(RECEIVE_MS).data() == b"small"
        consumer.acknowledge(message)
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(topic, batching_enabled=False).send(big)  # MessageTooBig
    finally:
        client.close()
