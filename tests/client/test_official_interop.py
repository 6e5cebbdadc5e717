"""Cross-client tests over TCP: our client produces and the official `pulsar-client` consumes,
and the reverse -- with and without batching, every compression type, chunking, keys and
properties. Both clients talk to the same standalone broker subprocess."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest

import magnetar
from tests.interop import BrokerProcess
from tests.interop.conftest import new_client

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000
COMPRESSIONS = [(magnetar.CompressionType.NONE, pulsar.CompressionType.NONE),
                (magnetar.CompressionType.LZ4, pulsar.CompressionType.LZ4),
                (magnetar.CompressionType.ZLib, pulsar.CompressionType.ZLib),
                (magnetar.CompressionType.ZSTD, pulsar.CompressionType.ZSTD),
                (magnetar.CompressionType.SNAPPY, pulsar.CompressionType.SNAPPY)]
BIG = bytes(range(256)) * (6 * 1024 * 4)  # 6 MiB: chunked at the 5 MiB default


@pytest.fixture
def ours(tcp_broker: BrokerProcess) -> Iterator[magnetar.Client]:
    client = magnetar.Client(tcp_broker.url, operation_timeout_seconds=15)
    yield client
    client.close()


@pytest.fixture
def official(tcp_broker: BrokerProcess) -> Iterator[pulsar.Client]:
    client = new_client(tcp_broker.url)
    yield client
    client.close()


def _messages(count: int) -> list[tuple[bytes, dict[str, str], str]]:
    return [(f"body {i} ".encode() * 20, {"index": str(i), "kind": "interop"}, f"key-{i % 3}")
            for i in range(count)]


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=lambda c: c[0].name)
@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_ours_to_official(ours: magnetar.Client, official: pulsar.Client, topic: str,
                          compression: tuple[magnetar.CompressionType, object],
                          batching: bool) -> None:
    consumer = official.subscribe(topic, "sub")
    producer = ours.create_producer(topic, compression_type=compression[0],
                                    batching_enabled=batching)
    sent = []
    for body, properties, key in _messages(10):
        producer.send_async(body, lambda _r, mid: sent.append(mid), properties=properties,
                            partition_key=key, ordering_key=key + "-o", event_timestamp=7)
    producer.flush()
    for (body, properties, key), message_id in zip(_messages(10), sent, strict=True):
        message = consumer.receive(RECEIVE_MS)
        assert message.data() == body
        assert message.properties() == properties
        assert message.partition_key() == key
        assert message.ordering_key() == key + "-o"
        assert message.event_timestamp() == 7
        got = message.message_id()
        assert (got.ledger_id(), got.entry_id(), got.batch_index()) == \
            (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
        consumer.acknowledge(message)


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=lambda c: c[0].name)
@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_official_to_ours(ours: magnetar.Client, official: pulsar.Client, topic: str,
                          compression: tuple[object, pulsar.CompressionType],
                          batching: bool) -> None:
    consumer = ours.subscribe(topic, "sub")
    producer = official.create_producer(topic, compression_type=compression[1],
                                        batching_enabled=batching)
    for body, properties, key in _messages(10):
        producer.send_async(body, None, properties=properties, partition_key=key,
                            event_timestamp=7)
    producer.flush()
    for body, properties, key in _messages(10):
        message = consumer.receive(RECEIVE_MS)
        assert message.data() == body
        assert message.properties() == properties
        assert message.partition_key() == key
        assert message.event_timestamp() == 7
        consumer.acknowledge(message)
    with pytest.raises(magnetar.Timeout):
        consumer.receive(300)


def test_chunked_both_ways(ours: magnetar.Client, official: pulsar.Client,
                           topic: str) -> None:
    their_consumer = official.subscribe(topic, "theirs")
    our_consumer = ours.subscribe(topic, "ours")
    ours.create_producer(topic, chunking_enabled=True).send(BIG + b"ours")
    official.create_producer(topic, chunking_enabled=True, batching_enabled=False).send(
        BIG + b"theirs")
    assert their_consumer.receive(RECEIVE_MS).data() == BIG + b"ours"
    assert their_consumer.receive(RECEIVE_MS).data() == BIG + b"theirs"
    assert our_consumer.receive(RECEIVE_MS).data() == BIG + b"ours"
    assert our_consumer.receive(RECEIVE_MS).data() == BIG + b"theirs"

