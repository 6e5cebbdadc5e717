"""Produce and consume with the official client's sync API: the four subscription types,
batching on and off with every compression codec, key-based batching on Key_Shared, and
regex subscriptions (GET_TOPICS_OF_NAMESPACE)."""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta

import pulsar
import pytest

from magnetar.codec import hash_range_slot

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000  # a message that should come
QUIET_MS = 300  # how long "nothing more comes" is watched
DRAIN_DEADLINE_S = 10.0
DELAY_MS = 2500
TICK_MS = 1000  # the broker's delayed_delivery_tick_time_ms

SUB_TYPES = {
    "Exclusive": pulsar.ConsumerType.Exclusive,
    "Shared": pulsar.ConsumerType.Shared,
    "Failover": pulsar.ConsumerType.Failover,
    "Key_Shared": pulsar.ConsumerType.KeyShared,
}
CODECS = {
    "NONE": pulsar.CompressionType.NONE,
    "LZ4": pulsar.CompressionType.LZ4,
    "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD,
    "SNAPPY": pulsar.CompressionType.SNAPPY,
}


def _assert_quiet(consumer: pulsar.Consumer) -> None:
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)


def _drain(consumers: list[pulsar.Consumer], count: int) -> list[list[pulsar.Message]]:
    """Receive `count` messages in total from several consumers; per consumer, in order."""
    got: list[list[pulsar.Message]] = [[] for _ in consumers]
    end = time.monotonic() + DRAIN_DEADLINE_S
    while sum(map(len, got)) < count:
        assert time.monotonic() < end, f"{sum(map(len, got))} of {count} messages arrived"
        for index, consumer in enumerate(consumers):
            try:
                got[index].append(consumer.receive(50))
            except pulsar.Timeout:
                continue
    return got


@pytest.mark.parametrize("sub_type", list(SUB_TYPES))
def test_each_subscription_type_receives_in_order_and_acks_stick(
        client: pulsar.Client, topic: str, sub_type: str) -> None:
    kind = SUB_TYPES[sub_type]
    consumer = client.subscribe(topic, "sub", consumer_type=kind)
    producer = client.create_producer(topic, producer_name=f"p-{sub_type}")
    sent = [producer.send(f"m-{i}".encode(), properties={"i": str(i)},
                          partition_key=f"k{i % 3}", event_timestamp=1000 + i)
            for i in range(20)]
    received = [consumer.receive(RECEIVE_MS) for _ in range(20)]
    assert [m.data() for m in received] == [f"m-{i}".encode() for i in range(20)]
    assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in received] == [
        (s.ledger_id(), s.entry_id()) for s in sent]
    assert [m.properties() for m in received] == [{"i": str(i)} for i in range(20)]
    assert [m.partition_key() for m in received] == [f"k{i % 3}" for i in range(20)]
    assert [m.event_timestamp() for m in received] == [1000 + i for i in range(20)]
    assert {m.redelivery_count() for m in received} == {0}
    assert {m.message_id().partition() for m in received} == {-1}
    for message in received:
        consumer.acknowledge(message)
    consumer.close()
    again = client.subscribe(topic, "sub", consumer_type=kind)
    _assert_quiet(again)


def test_entry_ids_increase_in_send_order(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic)
    ids = [producer.send(b"x") for _ in range(10)]
    positions = [(i.ledger_id(), i.entry_id()) for i in ids]
    assert positions == sorted(positions)
    assert len(set(positions)) == 10


def test_async_sends_complete_in_order(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, producer_name="async")
    results: list[tuple[int, tuple[int, int]]] = []

    def done(index: int) -> object:
        def callback(result: pulsar.Result, message_id: pulsar.MessageId) -> None:
            assert result == pulsar.Result.Ok
            results.append((index, (message_id.ledger_id(), message_id.entry_id())))
        return callback

    for i in range(200):
        producer.send_async(f"a-{i}".encode(), done(i))
    producer.flush()
    assert [index for index, _ in results] == list(range(200))
    assert [position for _, position in results] == sorted(position for _, position in results)


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_batching_and_compression(client: pulsar.Client, topic: str, codec: str,
                                  batching: bool) -> None:
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, compression_type=CODECS[codec],
                                      batching_enabled=batching, batching_max_messages=10,
                                      batching_max_publish_delay_ms=20)
    bodies = [(f"body-{i}-" + "abc" * 50).encode() for i in range(25)]
    for body in bodies:
        producer.send_async(body, None)
    producer.flush()
    received = [consumer.receive(RECEIVE_MS) for _ in bodies]
    assert [m.data() for m in received] == bodies
    batch_indexes = [m.message_id().batch_index() for m in received]
    if batching:
        assert max(batch_indexes) >= 1  # several messages shared an entry
        entries = {(m.message_id().ledger_id(), m.message_id().entry_id()) for m in received}
        assert len(entries) < len(bodies)
    else:
        assert set(batch_indexes) == {-1}
    for message in received:
        consumer.acknowledge(message)
    _assert_quiet(consumer)


def test_key_based_batches_reach_one_consumer_per_key(client: pulsar.Client,
                                                      topic: str) -> None:
    consumers = [client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                                  consumer_name=f"c{i}") for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_type=pulsar.BatchingType.KeyBased,
                                      batching_max_publish_delay_ms=20)
    keys = [f"key-{i}" for i in range(10)]
    for i in range(60):
        producer.send_async(f"{keys[i % 10]}:{i}".encode(), None, partition_key=keys[i % 10])
    producer.flush()
    got = _drain(consumers, 60)
    owners: dict[str, set[int]] = {}
    for index, messages in enumerate(got):
        for message in messages:
            owners.setdefault(message.partition_key(), set()).add(index)
            consumers[index].acknowledge(message)
    assert set(owners) == set(keys)
    assert all(len(who) == 1 for who in owners.values()), owners
    assert all(messages for messages in got), "both consumers own some keys"
    for messages in got:  # per key, in publish order
        for key in keys:
            numbers = [int(m.data().split(b":")[1]) for m in messages if m.partition_key() == key]
            assert numbers == sorted(numbers)
    assert sorted(m.data() for messages in got for m in messages) == sorted(
        f"{keys[i % 10]}:{i}".encode() for i in range(60))


def test_shared_subscription_spreads_and_covers_everything(client: pulsar.Client,
                                                           topic: str) -> None:
    consumers = [client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                                  receiver_queue_size=5) for _ in range(2)]
    producer = client.create_producer(topic)
    for i in range(40):
        producer.send(f"s-{i}".encode())
    got = _drain(consumers, 40)
    for index, messages in enumerate(got):
        for message in messages:
            consumers[index].acknowledge(message)
    assert all(messages for messages in got), [len(m) for m in got]
    assert sorted(m.data() for messages in got for m in messages) == sorted(
        f"s-{i}".encode() for i in range(40))


def test_failover_moves_unacked_messages_to_the_standby(client: pulsar.Client,
                                                        topic: str) -> None:
    first = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover,
                             consumer_name="a")
    second = client.subscribe(topic, "fo", consumer_type=pulsar.ConsumerType.Failover,
                              consumer_name="b")
    producer = client.create_producer(topic)
    for i in range(10):
        producer.send(f"f-{i}".encode())
    got = _drain([first, second], 10)
    active = 0 if got[0] else 1
    assert len(got[active]) == 10, "one active consumer receives everything"
    assert [m.data() for m in got[active]] == [f"f-{i}".encode() for i in range(10)]
    for message in got[active][:4]:
        [first, second][active].acknowledge(message)
    [first, second][active].close()  # the six unacked ones go to the standby
    standby = [first, second][1 - active]
    rest = [standby.receive(RECEIVE_MS) for _ in range(6)]
    assert [m.data() for m in rest] == [f"f-{i}".encode() for i in range(4, 10)]


def test_regex_subscription_finds_matching_topics(client: pulsar.Client) -> None:
    tag = uuid.uuid4().hex[:8]
    names = [f"persistent://public/default/rx-{tag}-{suffix}" for suffix in ("a", "b")]
    other = f"persistent://public/default/other-{tag}"
    for name in [*names, other]:
        client.create_producer(name).send(name.encode())
    consumer = client.subscribe(re.compile(f"persistent://public/default/rx-{tag}-.*"), "rx",
                                initial_position=pulsar.InitialPosition.Earliest)
    received = sorted(consumer.receive(RECEIVE_MS).data() for _ in names)
    assert received == sorted(name.encode() for name in names)
    _assert_quiet(consumer)


def test_string_schema_round_trip(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", schema=pulsar.schema.StringSchema())
    producer = client.create_producer(topic, schema=pulsar.schema.StringSchema())
    producer.send("héllo")
    message = consumer.receive(RECEIVE_MS)
    assert message.value() == "héllo"
    assert message.data() == "héllo".encode()


def test_sticky_key_shared_ranges_route_by_hash(client: pulsar.Client, topic: str) -> None:
    halves = [(0, 32767), (32768, 65535)]
    consumers = [client.subscribe(
        topic, "sticky", consumer_type=pulsar.ConsumerType.KeyShared,
        key_shared_policy=pulsar.ConsumerKeySharedPolicy(pulsar.KeySharedMode.Sticky,
                                                         sticky_ranges=[half]))
        for half in halves]
    producer = client.create_producer(topic)
    keys = [f"sticky-{i}" for i in range(20)]
    for key in keys:
        producer.send(key.encode(), partition_key=key)
    got = _drain(consumers, len(keys))
    for index, (start, end) in enumerate(halves):
        assert sorted(m.partition_key() for m in got[index]) == sorted(
            k for k in keys if start <= hash_range_slot(k) <= end)
    with pytest.raises(pulsar.ConsumerAssignError):
        client.subscribe(topic, "sticky", consumer_type=pulsar.ConsumerType.KeyShared,
                         key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                             pulsar.KeySharedMode.Sticky, sticky_ranges=[(100, 200)]))


def test_exclusive_subscription_refuses_a_second_consumer(client: pulsar.Client,
                                                          topic: str) -> None:
    client.subscribe(topic, "only")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "only")


def test_unsubscribe_deletes_the_subscription(client: pulsar.Client, topic: str) -> None:
    first = client.subscribe(topic, "gone", consumer_type=pulsar.ConsumerType.Shared)
    second = client.subscribe(topic, "gone", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    producer.send(b"before")
    with pytest.raises(pulsar.PulsarException):
        first.unsubscribe()  # another consumer is still connected
    second.close()
    first.unsubscribe()
    producer.send(b"after")
    fresh = client.subscribe(topic, "gone", initial_position=pulsar.InitialPosition.Earliest)
    assert [fresh.receive(RECEIVE_MS).data() for _ in range(2)] == [b"before", b"after"]
    latest = client.subscribe(topic, "gone-latest")
    _assert_quiet(latest)


def test_non_persistent_topic_delivers_to_connected_consumers(client: pulsar.Client) -> None:
    topic = f"non-persistent://public/default/np-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(topic, "np", receiver_queue_size=100)
    producer = client.create_producer(topic)
    for i in range(5):
        producer.send(f"np-{i}".encode())
    assert [consumer.receive(RECEIVE_MS).data() for _ in range(5)] == [
        f"np-{i}".encode() for i in range(5)]
    late = client.subscribe(topic, "np-late")
    _assert_quiet(late)  # nothing is stored for those who were not there


class _Point(pulsar.schema.Record):
    name = pulsar.schema.String()
    x = pulsar.schema.Integer()


def test_json_schema_round_trip(client: pulsar.Client, topic: str) -> None:
    schema = pulsar.schema.JsonSchema(_Point)
    consumer = client.subscribe(topic, "json", schema=schema)
    producer = client.create_producer(topic, schema=schema)
    producer.send(_Point(name="p", x=7))
    value = consumer.receive(RECEIVE_MS).value()
    assert (value.name, value.x) == ("p", 7)


def test_delayed_delivery_on_shared(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "later", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic)
    sent = time.monotonic()
    producer.send(b"later", deliver_after=timedelta(milliseconds=DELAY_MS))
    producer.send(b"now")
    assert consumer.receive(RECEIVE_MS).data() == b"now"
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)
    assert consumer.receive(DELAY_MS + RECEIVE_MS).data() == b"later"
    # Delivered at most one delayed-delivery tick (1 s by default) early.
    assert time.monotonic() - sent >= (DELAY_MS - TICK_MS) / 1000
