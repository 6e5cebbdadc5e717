"""Reconnection over TCP: the broker restarts under a producer and a consumer. The producer
re-creates itself and sends what was not answered; the consumer resubscribes; nothing is
lost and nothing acknowledged comes back."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import magnetar
from magnetar import InitialPosition
from tests.interop import BrokerProcess

from .test_produce_consume import drain

pytestmark = pytest.mark.interop
SHUTDOWN_DEADLINE_S = 20.0  # far more than an immediate shutdown needs (no timing asserted)


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


def test_shutdown_fails_what_is_pending_instead_of_flushing_it(tmp_path: Path) -> None:
    """`shutdown()` is immediate (as the official client's): a send to a broker that is gone
    fails with AlreadyClosed instead of holding the shutdown until its send timeout. Before
    the fix `shutdown()` was `close()`, which flushed: with no send timeout it never ended."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.start()
    client = magnetar.Client(broker.url, operation_timeout_seconds=15)
    try:
        producer = client.create_producer("persistent://public/default/gone",
                                          send_timeout_millis=0, batching_enabled=False)
        producer.send(b"stored")
        broker.kill()
        outcome: list[magnetar.Result] = []
        producer.send_async(b"pending", lambda result, _id: outcome.append(result))
        finisher = threading.Thread(target=client.shutdown, daemon=True)
        finisher.start()
        finisher.join(SHUTDOWN_DEADLINE_S)
        assert not finisher.is_alive(), "shutdown() waited for a send to a broker that is gone"
        assert outcome == [magnetar.Result.AlreadyClosed]
    finally:
        client.close()
        broker.cleanup()
