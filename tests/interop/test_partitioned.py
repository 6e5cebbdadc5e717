"""Partitioned topics through the official client: PARTITIONED_METADATA > 0, one producer and
one consumer per partition behind the client's partitioned wrappers, partition indexes in
message ids. The broker here creates partitioned topics automatically (3 partitions)."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest

from . import BrokerProcess
from .conftest import new_client

pytestmark = pytest.mark.interop

PARTITIONS = 3
RECEIVE_MS = 5000
QUIET_MS = 300


@pytest.fixture(scope="module")
def partitioned_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("partitioned-broker")
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


def test_client_sees_the_partitions(pclient: pulsar.Client, topic: str) -> None:
    pclient.create_producer(topic).close()
    assert pclient.get_topic_partitions(topic) == [f"{topic}-partition-{i}"
                                                  for i in range(PARTITIONS)]


@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Exclusive,
                                      pulsar.ConsumerType.Shared], ids=["Exclusive", "Shared"])
def test_produce_and_consume_across_partitions(pclient: pulsar.Client, topic: str,
                                               sub_type: pulsar.ConsumerType) -> None:
    consumer = pclient.subscribe(topic, "sub", consumer_type=sub_type)
    producer = pclient.create_producer(topic)
    keys = [f"k{i}" for i in range(9)]
    sent = {}
    for i in range(45):
        message_id = producer.send(f"{keys[i % 9]}:{i}".encode(), partition_key=keys[i % 9])
        sent[f"{keys[i % 9]}:{i}".encode()] = message_id.partition()
    received = [consumer.receive(RECEIVE_MS) for _ in range(45)]
    for message in received:
        consumer.acknowledge(message)
    assert sorted(m.data() for m in received) == sorted(sent)
    assert {m.data(): m.message_id().partition() for m in received} == sent
    assert set(sent.values()) == set(range(PARTITIONS)), "keys spread over every partition"
    for key in keys:  # a key lives in one partition, so its order holds
        numbers = [int(m.data().split(b":")[1]) for m in received if m.partition_key() == key]
        assert numbers == sorted(numbers)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)


def test_one_partition_on_its_own(pclient: pulsar.Client, topic: str) -> None:
    producer = pclient.create_producer(topic)
    ids = [producer.send(f"m-{i}".encode()) for i in range(12)]
    wanted = [f"m-{i}".encode() for i, mid in enumerate(ids) if mid.partition() == 1]
    assert wanted, "round robin reaches partition 1"
    consumer = pclient.subscribe(f"{topic}-partition-1", "one",
                                 initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(RECEIVE_MS) for _ in wanted]
    assert [m.data() for m in got] == wanted
    assert {m.message_id().partition() for m in got} == {1}
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)
