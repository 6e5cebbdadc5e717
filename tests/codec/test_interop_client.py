"""Interop with the official `pulsar-client` (C++ client 4.2.0 inside): it connects to a loopback
listener built on our `Connection`, publishes, and we decode what it sent -- checksums included --
and rebuild the same bytes with our own encoders."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.codec import (
    ChunkAssembler,
    CompressionType,
    KeyBasedBatchContainer,
    MessageId,
    SingleMessage,
    boost_hash,
    build_batch,
    build_message,
    chunk_payload_size_bytes,
    crc32c,
    encode_entry,
    pb,
    split_into_chunks,
    unpack_messages,
)

from .loopback_broker import LEDGER_ID, LoopbackBroker, loopback_broker

pytestmark = pytest.mark.interop

CODECS = {
    CompressionType.NONE: pulsar.CompressionType.NONE,
    CompressionType.LZ4: pulsar.CompressionType.LZ4,
    CompressionType.ZLIB: pulsar.CompressionType.ZLib,
    CompressionType.ZSTD: pulsar.CompressionType.ZSTD,
    CompressionType.SNAPPY: pulsar.CompressionType.SNAPPY,
}
CHUNKING_MAX_MESSAGE_SIZE = 4096
PARTITIONED_TOPIC = "persistent://public/default/routed"
PARTITIONS = 7


@pytest.fixture(scope="module")
def broker() -> Iterator[LoopbackBroker]:
    with loopback_broker(
        max_message_size=CHUNKING_MAX_MESSAGE_SIZE, partitions={PARTITIONED_TOPIC: PARTITIONS}
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(broker: LoopbackBroker) -> Iterator[pulsar.Client]:
    official = pulsar.Client(
        broker.url,
        operation_timeout_seconds=15,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield official
    official.close()


def _check_entry_crc(entry: bytes, checksum: int | None) -> None:
    # The Connection verified it already; recompute it independently over [metadataSize..end].
    assert entry[:2] == b"\x0e\x01"
    assert checksum is not None
    assert int.from_bytes(entry[2:6], "big") == checksum
    assert crc32c(entry[6:]) == checksum


@pytest.mark.parametrize("compression", list(CODECS), ids=lambda c: c.name)
def test_batched_compressed_keyed_send_with_properties(
    broker: LoopbackBroker, client: pulsar.Client, compression: CompressionType
) -> None:
    producer = client.create_producer(
        f"batched-{compression.name}",
        producer_name=f"batcher-{compression.name}",
        batching_enabled=True,
        batching_max_messages=3,
        batching_max_publish_delay_ms=60_000,
        compression_type=CODECS[compression],
    )
    ids: list[pulsar.MessageId] = []
    sent = [
        SingleMessage(
            payload=f"body-{i}-".encode() * 30,
            properties={"k": f"v{i}", "origin": "interop"},
            partition_key=f"key{i}",
            event_time=1_700_000_000_000 + i,
            sequence_id=i,
        )
        for i in range(3)
    ]
    for message in sent:
        assert message.payload is not None
        producer.send_async(
            message.payload,
            lambda result, msg_id: ids.append(msg_id),
            properties=dict(message.properties),
            partition_key=message.partition_key,
            event_timestamp=message.event_time,
        )
    producer.flush()
    [received] = broker.wait_for(1)
    producer.close()

    frame = received.frame
    assert frame.command.send.num_messages == 3
    _check_entry_crc(frame.entry, frame.checksum)
    metadata = frame.metadata
    assert metadata is not None
    assert metadata.HasField("num_messages_in_batch")
    assert metadata.num_messages_in_batch == 3
    assert metadata.partition_key == "key0"
    assert metadata.HasField("compression") == (compression is not CompressionType.NONE)
    assert metadata.compression == compression
    messages = unpack_messages(metadata, frame.payload)
    assert messages == [m._replace(batch_index=i) for i, m in enumerate(sent)]
    # Our encoders produce the very same entry: metadata, batch layout, compressed bytes, CRC.
    ours = build_batch(
        sent,
        producer_name=received.producer_name,
        publish_time=metadata.publish_time,
        compression=compression,
    )
    assert encode_entry(*ours) == frame.entry
    assert sorted((m.ledger_id(), m.entry_id(), m.batch_index()) for m in ids) == [
        (LEDGER_ID, received.entry_id, i) for i in range(3)
    ]


def test_single_message_with_every_key_and_a_null_value(
    broker: LoopbackBroker, client: pulsar.Client
) -> None:
    producer = client.create_producer("single", producer_name="single-1")
    message_id = producer.send(
        b"hello", properties={"x": "y"}, partition_key="pk", ordering_key="ok", event_timestamp=99
    )
    producer.send(None)
    first, tombstone = broker.wait_for(2)
    producer.close()

    assert (message_id.ledger_id(), message_id.entry_id()) == (LEDGER_ID, first.entry_id)
    metadata = first.frame.metadata
    assert metadata is not None
    assert not metadata.HasField("num_messages_in_batch")
    expected = SingleMessage(b"hello", {"x": "y"}, "pk", False, b"ok", 99, sequence_id=0)
    assert unpack_messages(metadata, first.frame.payload) == [expected]
    ours = build_message(expected, producer_name="single-1", publish_time=metadata.publish_time)
    assert encode_entry(*ours) == first.frame.entry

    assert tombstone.frame.metadata is not None
    [null] = unpack_messages(tombstone.frame.metadata, tombstone.frame.payload)
    assert null.payload is None
    assert null.sequence_id == 1


def test_key_based_batching_groups_like_our_container(
    broker: LoopbackBroker, client: pulsar.Client
) -> None:
    producer = client.create_producer(
        "key-based",
        producer_name="keyed-1",
        batching_enabled=True,
        batching_type=pulsar.BatchingType.KeyBased,
        batching_max_messages=100,
        batching_max_publish_delay_ms=60_000,
    )
    keys = "ABCBCA"
    container = KeyBasedBatchContainer(batch_messages_max=100, batch_delay_ms_max=60_000)
    for i, key in enumerate(keys):
        producer.send_async(str(i).encode(), None, partition_key=key)
        message = SingleMessage(str(i).encode(), partition_key=key, sequence_id=i)
        assert container.add(message, now_ms=0) == []
    producer.flush()
    received = broker.wait_for(3)
    producer.close()

    theirs = []
    for item in received:
        metadata = item.frame.metadata
        assert metadata is not None
        assert metadata.partition_key == keys[metadata.sequence_id]
        theirs.append([m.sequence_id for m in unpack_messages(metadata, item.frame.payload)])
    ours = [[m.sequence_id for m in batch.messages] for batch in container.flush()]
    assert theirs == ours == [[0, 5], [1, 3], [2, 4]]


def test_chunked_message_reassembles_and_matches_our_split(
    broker: LoopbackBroker, client: pulsar.Client
) -> None:
    producer = client.create_producer(
        "chunky",
        producer_name="chunker",
        chunking_enabled=True,
        compression_type=pulsar.CompressionType.LZ4,
    )
    body = os.urandom(10_000)
    message_id = producer.send(body)
    producer.close()
    assembler = ChunkAssembler()
    chunks = []
    done = None
    while done is None:
        [item] = broker.wait_for(1)
        chunks.append(item)
        assert item.frame.command.send.is_chunk
        assert item.frame.metadata is not None
        result = assembler.add(
            MessageId(LEDGER_ID, item.entry_id), item.frame.metadata, item.frame.payload, 0
        )
        assert result.ack == result.redeliver == ()
        done = result.message
    assert len(chunks) == 3
    assert unpack_messages(done.metadata, done.payload) == [SingleMessage(body, sequence_id=0)]
    assert done.message_id.to_cpp_string() == str(message_id)
    assert done.chunk_ids == tuple(MessageId(LEDGER_ID, c.entry_id) for c in chunks)

    # Our splitter, given the same metadata and budget, produces the same chunks.
    first = chunks[0].frame.metadata
    assert first is not None
    base = pb.MessageMetadata()
    base.CopyFrom(first)
    for name in ("uuid", "num_chunks_from_msg", "total_chunk_msg_size", "chunk_id"):
        base.ClearField(name)
    size = chunk_payload_size_bytes(base, CHUNKING_MAX_MESSAGE_SIZE)
    ours = split_into_chunks(base, done.payload, chunk_size_bytes=size)
    assert [encode_entry(m, p) for m, p in ours] == [c.frame.entry for c in chunks]


def test_keyed_routing_to_partitions_is_boost_hash(
    broker: LoopbackBroker, client: pulsar.Client
) -> None:
    producer = client.create_producer(PARTITIONED_TOPIC, producer_name="router")
    # (An empty key counts as no key for the client, which then routes round-robin.)
    keys = [f"order-{i}" for i in range(40)] + ["é", "a-much-longer-key-than-eight-bytes"]
    for key in keys:
        producer.send(b"x", partition_key=key)
    received = broker.wait_for(len(keys))
    producer.close()
    partitions = [int(item.topic.rsplit("-", 1)[1]) for item in received]
    assert partitions == [boost_hash(key) % PARTITIONS for key in keys]
