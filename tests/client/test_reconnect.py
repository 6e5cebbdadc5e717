"""Reconnection over TCP: the broker restarts under a producer and a consumer. The producer
re-creates itself and sends what was not answered; the consumer resubscribes; nothing is
lost and nothing acknowledged comes back."""

from __future__ import annotations

from pathlib import Path

import pytest

import magnetar
from magnetar import InitialPosition
from tests.interop import BrokerProcess

from .test_produce_consume import drain

pytestmark = pytest.mark.interop


def test_broker_restart_under_a_producer_and_a_consumer(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.start()
    try:
        with magnetar.Client(broker.url, operation_timeout_seconds=15) as client:
            topic = "persistent://public/default/restart"
            consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
            producer = client.create_producer(topic)
            producer.send(b"before")
            assert [m.data() for m in drain(consumer, 1)] == [b"before"]
            broker.restart()
            producer.send(b"after")  # waits for the producer to be re-created
            assert producer.last_sequence_id() == 1
            assert [m.data() for m in drain(consumer, 1)] == [b"after"]
            assert consumer.is_connected()
    finally:
        broker.cleanup()
