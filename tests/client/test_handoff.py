"""The synchronous receive's hand-off (`_handoff.Handoff`) and the acks it carries to the loop
without a thread switch each: what is acknowledged before an operation is applied before it,
and a receive still waiting when the loop ends fails instead of hanging."""

from __future__ import annotations

import threading

import pytest

import magnetar
from magnetar import AlreadyClosed, InitialPosition
from magnetar._handoff import Handoff
from magnetar._loop import LoopThread

from .test_acks_and_subscriptions import bodies, fill
from .test_produce_consume import QUIET_MS, RECEIVE_MS, drain

DEADLINE_S = 10.0


def test_acks_since_the_last_receive_come_before_a_redelivery(client: magnetar.Client,
                                                              topic: str) -> None:
    fill(client, topic, 4)
    consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    received = [consumer.receive(RECEIVE_MS) for _ in range(4)]
    consumer.acknowledge(received[0])
    consumer.acknowledge(received[1])
    consumer.redeliver_unacknowledged_messages()  # no receive in between
    assert bodies(drain(consumer, 2)) == [b"m2", b"m3"]


def test_acks_since_the_last_receive_are_kept_by_a_close(client: magnetar.Client,
                                                         topic: str) -> None:
    fill(client, topic, 3)
    consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    received = [consumer.receive(RECEIVE_MS) for _ in range(3)]
    consumer.acknowledge(received[0])
    consumer.acknowledge(received[2])
    consumer.close()
    again = client.subscribe(topic, "sub")
    assert bodies(drain(again, 1)) == [b"m1"]


def test_a_timed_out_receive_loses_nothing_that_comes_later(client: magnetar.Client,
                                                            topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    with pytest.raises(magnetar.Timeout):
        consumer.receive(QUIET_MS // 3)
    client.create_producer(topic).send(b"late")
    assert consumer.receive(RECEIVE_MS).data() == b"late"


def test_a_receive_waiting_when_the_loop_ends_fails_with_already_closed() -> None:
    loop = LoopThread("test-loop")
    waiter = Handoff(1)
    registered = threading.Event()
    loop.call_for(waiter, registered.set)  # nothing resolves it on the loop
    assert registered.wait(DEADLINE_S)
    loop.stop()
    with pytest.raises(AlreadyClosed):
        waiter.wait()
    with pytest.raises(AlreadyClosed):
        loop.call_for(Handoff(1), registered.set)


@pytest.mark.parametrize("batch_index_ack", [False, True], ids=["entry", "batch-index"])
def test_a_batch_acknowledged_as_one_run_is_not_redelivered(client: magnetar.Client, topic: str,
                                                            batch_index_ack: bool) -> None:
    fill(client, topic, 5, batching=True)
    consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest,
                                batch_index_ack_enabled=batch_index_ack)
    received = [consumer.receive(RECEIVE_MS) for _ in range(5)]
    for message in [received[0], received[2], received[4], received[1]]:
        consumer.acknowledge(message)
    consumer.close()  # the four queued acks are applied as one run first
    again = client.subscribe(topic, "sub", batch_index_ack_enabled=batch_index_ack)
    expected = [b"m3"] if batch_index_ack else bodies(received)
    assert bodies(drain(again, len(expected))) == expected
