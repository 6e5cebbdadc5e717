"""Redelivery through the official client: negative acks, ack timeout, explicit
redeliver-all, unacked messages of a closed consumer, batch-index acknowledgements, and
redelivery counts (with a dead-letter policy) that survive a kill -9 of the broker."""

from __future__ import annotations

import pulsar
import pytest

from .conftest import BrokerFactory, new_client

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000
QUIET_MS = 300
NACK_DELAY_MS = 100
ACK_TIMEOUT_MS = 10_000  # the C++ client's minimum
ACK_TIMEOUT_RECEIVE_MS = 20_000


def _send(client: pulsar.Client, topic: str, count: int, **options: object) -> None:
    producer = client.create_producer(topic, **options)  # type: ignore[arg-type]
    for i in range(count):
        producer.send_async(f"m-{i}".encode(), None)
    producer.flush()


def test_negative_ack_redelivers_on_shared_with_a_count(client: pulsar.Client,
                                                        topic: str) -> None:
    consumer = client.subscribe(topic, "nack", consumer_type=pulsar.ConsumerType.Shared,
                                negative_ack_redelivery_delay_ms=NACK_DELAY_MS)
    _send(client, topic, 3)
    first = [consumer.receive(RECEIVE_MS) for _ in range(3)]
    consumer.negative_acknowledge(first[1])
    consumer.acknowledge(first[0])
    consumer.acknowledge(first[2])
    again = consumer.receive(RECEIVE_MS)
    assert again.data() == b"m-1"
    assert again.redelivery_count() == 1
    assert again.message_id().entry_id() == first[1].message_id().entry_id()
    consumer.negative_acknowledge(again)
    third = consumer.receive(RECEIVE_MS)
    assert (third.data(), third.redelivery_count()) == (b"m-1", 2)
    consumer.acknowledge(third)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)


def test_negative_ack_on_exclusive_redelivers_everything_unacked(client: pulsar.Client,
                                                                 topic: str) -> None:
    consumer = client.subscribe(topic, "nack-ex", negative_ack_redelivery_delay_ms=NACK_DELAY_MS)
    _send(client, topic, 4)
    first = [consumer.receive(RECEIVE_MS) for _ in range(4)]
    consumer.acknowledge(first[0])
    consumer.negative_acknowledge(first[2])
    again = [consumer.receive(RECEIVE_MS).data() for _ in range(3)]
    assert again == [b"m-1", b"m-2", b"m-3"]  # the cursor rewinds past the acked one


def test_redeliver_unacknowledged_messages(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "redeliver", consumer_type=pulsar.ConsumerType.Shared)
    _send(client, topic, 5)
    first = [consumer.receive(RECEIVE_MS) for _ in range(5)]
    consumer.acknowledge(first[0])
    consumer.acknowledge(first[3])
    consumer.redeliver_unacknowledged_messages()
    again = sorted(consumer.receive(RECEIVE_MS).data() for _ in range(3))
    assert again == [b"m-1", b"m-2", b"m-4"]


def test_unacked_messages_of_a_closed_consumer_go_to_another(client: pulsar.Client,
                                                             topic: str) -> None:
    first = client.subscribe(topic, "handover", consumer_type=pulsar.ConsumerType.Shared)
    _send(client, topic, 6)
    received = [first.receive(RECEIVE_MS) for _ in range(6)]
    for message in received[:2]:
        first.acknowledge(message)
    first.close()
    second = client.subscribe(topic, "handover", consumer_type=pulsar.ConsumerType.Shared)
    rest = [second.receive(RECEIVE_MS) for _ in range(4)]
    assert sorted(m.data() for m in rest) == [b"m-2", b"m-3", b"m-4", b"m-5"]
    # A disconnect does not count as a redelivery (broker reference §3.4).
    assert {m.redelivery_count() for m in rest} == {0}


def test_ack_timeout_redelivers(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "timeout", consumer_type=pulsar.ConsumerType.Shared,
                                unacked_messages_timeout_ms=ACK_TIMEOUT_MS)
    _send(client, topic, 2)
    first = [consumer.receive(RECEIVE_MS) for _ in range(2)]
    consumer.acknowledge(first[0])
    again = consumer.receive(ACK_TIMEOUT_RECEIVE_MS)
    assert (again.data(), again.redelivery_count()) == (b"m-1", 1)
    consumer.acknowledge(again)


def test_batch_index_acks_redeliver_only_the_unacked_messages(client: pulsar.Client,
                                                              topic: str) -> None:
    consumer = client.subscribe(topic, "batch-ack", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    _send(client, topic, 4, batching_enabled=True, batching_max_publish_delay_ms=50)
    first = [consumer.receive(RECEIVE_MS) for _ in range(4)]
    assert len({m.message_id().entry_id() for m in first}) == 1, "one batch entry"
    consumer.acknowledge(first[0])
    consumer.acknowledge(first[2])
    consumer.close()  # flushes the index acks, then the entry goes back to the subscription
    second = client.subscribe(topic, "batch-ack", consumer_type=pulsar.ConsumerType.Shared,
                              batch_index_ack_enabled=True)
    again = [second.receive(RECEIVE_MS) for _ in range(2)]
    assert [m.data() for m in again] == [b"m-1", b"m-3"]
    assert [m.message_id().batch_index() for m in again] == [1, 3]
    for message in again:
        second.acknowledge(message)
    with pytest.raises(pulsar.Timeout):
        second.receive(QUIET_MS)


def test_cumulative_ack_inside_a_batch(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "cumulative")
    _send(client, topic, 4, batching_enabled=True, batching_max_publish_delay_ms=50)
    _send(client, topic, 2)
    received = [consumer.receive(RECEIVE_MS) for _ in range(6)]
    consumer.acknowledge_cumulative(received[1])  # the middle of the batch: (entry - 1) on the wire
    consumer.close()
    again = client.subscribe(topic, "cumulative")
    # Without batch-index acks the whole batch entry comes back; the client drops nothing.
    replayed = [again.receive(RECEIVE_MS) for _ in range(6)]
    assert [m.data() for m in replayed] == [b"m-0", b"m-1", b"m-2", b"m-3", b"m-0", b"m-1"]
    again.acknowledge_cumulative(replayed[4])  # past the batch: only the last one is left
    again.close()
    last = client.subscribe(topic, "cumulative")
    assert last.receive(RECEIVE_MS).data() == b"m-1"
    with pytest.raises(pulsar.Timeout):
        last.receive(QUIET_MS)


@pytest.mark.parametrize("stop", ["kill-9", "sigterm"])
def test_redelivery_counts_survive_a_restart_and_the_dlq_keeps_counting(
        broker_factory: BrokerFactory, topic: str, stop: str) -> None:
    max_redeliver = 3
    process = broker_factory()
    options = dict(consumer_type=pulsar.ConsumerType.Shared,
                   negative_ack_redelivery_delay_ms=NACK_DELAY_MS,
                   dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
                       max_redeliver_count=max_redeliver,
                       initial_subscription_name="dead"))
    client = new_client(process.url)
    try:
        consumer = client.subscribe(topic, "sub", **options)  # type: ignore[arg-type]
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"poison")
        counts = []
        for _ in range(3):
            message = consumer.receive(RECEIVE_MS)
            counts.append(message.redelivery_count())
            if len(counts) < 3:
                consumer.negative_acknowledge(message)
        assert counts == [0, 1, 2]
        # The broker started the cursor write of count 2 before delivering it; this publish
        # goes through the same journal after it, so once it is receipted the count is
        # durable.
        producer.send(b"barrier")
    finally:
        if stop == "kill-9":
            process.kill()
        else:
            assert process.stop() == 0  # clients are dropped while the broker stops
        client.close()
    process.start()
    client = new_client(process.url)
    try:
        consumer = client.subscribe(topic, "sub", **options)  # type: ignore[arg-type]
        seen = {}
        for _ in range(3):
            message = consumer.receive(RECEIVE_MS)
            seen.setdefault(message.data(), []).append(message.redelivery_count())
            if message.data() == b"barrier":
                consumer.acknowledge(message)
            else:
                consumer.negative_acknowledge(message)
        assert seen == {b"poison": [2, 3], b"barrier": [0]}
        # Count 3 reached the limit: the next nack sent it to the dead-letter topic.
        dead = client.subscribe(f"{topic}-sub-DLQ", "dead")
        assert dead.receive(RECEIVE_MS).data() == b"poison"
        with pytest.raises(pulsar.Timeout):
            consumer.receive(QUIET_MS)
    finally:
        client.close()
