"""Client-side features the broker must carry through the official client: the dead letter
topic after too many redeliveries, a 12 MB chunked message, the producer's partition routing
modes, and TDMQ tag filtering by subscription properties."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.codec import boost_hash, pb

from . import BrokerProcess, RawClient
from .conftest import new_client

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000
QUIET_MS = 300
NACK_DELAY_MS = 100
MAX_REDELIVER = 2
PARTITIONS = 4
ROUTED_MESSAGES = 40
BIG_MESSAGE_BYTES = 12 * 1024 * 1024


@pytest.fixture(scope="module")
def partitioned_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("routing-broker")
    process = BrokerProcess(base / "data", base / "broker.log", config=(
        "allow_auto_topic_creation_type=partitioned", f"default_num_partitions={PARTITIONS}"))
    process.start()
    yield process
    process.cleanup()


@pytest.fixture
def pclient(partitioned_broker: BrokerProcess) -> Iterator[pulsar.Client]:
    official = new_client(partitioned_broker.url)
    yield official
    official.close()


def test_dead_letter_topic_after_max_redeliveries(client: pulsar.Client, topic: str) -> None:
    dlq_topic = f"{topic}-dlq-sub-DLQ"
    policy = pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=MAX_REDELIVER,
                                             initial_subscription_name="dlq-init")
    consumer = client.subscribe(topic, "dlq-sub", consumer_type=pulsar.ConsumerType.Shared,
                                negative_ack_redelivery_delay_ms=NACK_DELAY_MS,
                                dead_letter_policy=policy)
    producer = client.create_producer(topic, batching_enabled=False)
    sent_id = producer.send(b"poison", properties={"k": "v"})
    counts = []
    for _ in range(MAX_REDELIVER + 1):
        message = consumer.receive(RECEIVE_MS)
        assert message.data() == b"poison"
        counts.append(message.redelivery_count())
        consumer.negative_acknowledge(message)
    assert counts == list(range(MAX_REDELIVER + 1))
    # The DLQ subscription was created at the earliest position when the client produced to
    # the DLQ, so a consumer joining it later still finds the message.
    dlq = client.subscribe(dlq_topic, "dlq-init", consumer_type=pulsar.ConsumerType.Shared)
    dead = dlq.receive(RECEIVE_MS)
    assert dead.data() == b"poison"
    properties = dead.properties()
    assert properties["k"] == "v"
    assert properties["REAL_TOPIC"] == topic
    origin = properties["ORIGIN_MESSAGE_ID"]
    assert f"{sent_id.ledger_id()}" in origin, origin
    assert f"{sent_id.entry_id()}" in origin, origin
    dlq.acknowledge(dead)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)  # acknowledged on the original topic once dead-lettered
    with pytest.raises(pulsar.Timeout):
        dlq.receive(QUIET_MS)


def test_twelve_megabyte_chunked_message(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "chunks")
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    big = os.urandom(BIG_MESSAGE_BYTES)
    producer.send(big)
    producer.send(b"after")
    message = consumer.receive(3 * RECEIVE_MS)
    assert len(message.data()) == BIG_MESSAGE_BYTES
    assert hashlib.sha256(message.data()).digest() == hashlib.sha256(big).digest()
    consumer.acknowledge(message)
    assert consumer.receive(RECEIVE_MS).data() == b"after"


def _consume_partitions(client: pulsar.Client, topic: str, count: int) -> list[pulsar.Message]:
    consumer = client.subscribe(topic, "routing", initial_position=pulsar.InitialPosition.Earliest)
    received = [consumer.receive(RECEIVE_MS) for _ in range(count)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)
    consumer.close()
    return received


def test_round_robin_routing_spreads_evenly(pclient: pulsar.Client, topic: str) -> None:
    producer = pclient.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    ids = [producer.send(f"m-{i}".encode()) for i in range(ROUTED_MESSAGES)]
    partitions = [mid.partition() for mid in ids]
    assert Counter(partitions) == {p: ROUTED_MESSAGES // PARTITIONS for p in range(PARTITIONS)}
    first = partitions[0]
    assert partitions == [(first + i) % PARTITIONS for i in range(ROUTED_MESSAGES)]
    received = _consume_partitions(pclient, topic, ROUTED_MESSAGES)
    assert {m.data(): m.message_id().partition() for m in received} == {
        f"m-{i}".encode(): p for i, p in enumerate(partitions)}


def test_single_partition_routing_uses_one_partition(pclient: pulsar.Client, topic: str) -> None:
    producer = pclient.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.UseSinglePartition)
    ids = [producer.send(f"m-{i}".encode()) for i in range(ROUTED_MESSAGES)]
    chosen = {mid.partition() for mid in ids}
    assert len(chosen) == 1
    assert chosen <= set(range(PARTITIONS))
    received = _consume_partitions(pclient, topic, ROUTED_MESSAGES)
    assert {m.message_id().partition() for m in received} == chosen
    assert [m.data() for m in received] == [f"m-{i}".encode() for i in range(ROUTED_MESSAGES)]


@pytest.mark.parametrize("mode", [pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                                  pulsar.PartitionsRoutingMode.UseSinglePartition],
                         ids=["RoundRobin", "SinglePartition"])
def test_keyed_messages_hash_to_fixed_partitions(pclient: pulsar.Client, topic: str,
                                                 mode: pulsar.PartitionsRoutingMode) -> None:
    producer = pclient.create_producer(topic, batching_enabled=False, message_routing_mode=mode)
    keys = [f"key-{i}" for i in range(10)]
    placed: dict[str, set[int]] = {key: set() for key in keys}
    for i in range(ROUTED_MESSAGES):
        key = keys[i % len(keys)]
        placed[key].add(producer.send(f"{key}:{i}".encode(), partition_key=key).partition())
    # the C++ client's default hashing scheme is BoostHash, modulo the partition count
    assert placed == {key: {boost_hash(key) % PARTITIONS} for key in keys}
    received = _consume_partitions(pclient, topic, ROUTED_MESSAGES)
    for message in received:
        assert message.message_id().partition() == boost_hash(message.partition_key()) % PARTITIONS


def _subscription_with_properties(port: int, topic: str, subscription: str,
                                  properties: dict[str, str]) -> None:
    """Create `subscription` with subscription properties on a raw connection: the Python
    client (3.x) has no `subscription_properties` option, the C++ client underneath does."""
    connection = RawClient(port)
    try:
        connection.handshake()
        request = pb.CommandSubscribe(
            topic=topic, subscription=subscription, consumer_id=1, request_id=1,
            subType=pb.CommandSubscribe.Shared, initialPosition=pb.CommandSubscribe.Earliest,
            subscription_properties=[pb.KeyValue(key=k, value=v) for k, v in properties.items()])
        connection.request(request, pb.BaseCommand.SUCCESS)
        connection.request(pb.CommandCloseConsumer(consumer_id=1, request_id=2),
                           pb.BaseCommand.SUCCESS)
    finally:
        connection.close()


def test_tag_filtering_by_subscription_properties(broker: BrokerProcess, client: pulsar.Client,
                                                  topic: str) -> None:
    _subscription_with_properties(broker.port, topic, "tagged", {"tag1": "1"})
    consumer = client.subscribe(topic, "tagged", consumer_type=pulsar.ConsumerType.Shared)
    everything = client.subscribe(topic, "all", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"t1", properties={"tag1": "TAGS"})
    producer.send(b"t2", properties={"tag2": "TAGS"})
    producer.send(b"plain")
    producer.send(b"t1-and-t2", properties={"tag1": "TAGS", "tag2": "TAGS"})
    producer.send(b"not-a-tag", properties={"tag2": "something-else"})
    got = [consumer.receive(RECEIVE_MS).data() for _ in range(4)]
    assert got == [b"t1", b"plain", b"t1-and-t2", b"not-a-tag"]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)
    assert len([everything.receive(RECEIVE_MS) for _ in range(5)]) == 5
