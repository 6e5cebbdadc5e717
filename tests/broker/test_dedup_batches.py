"""Deduplication of batches whose SEND states no highest sequence id (issue 9, item 1).

The official C++/Python client sends a batch with only its first `sequence_id`, in neither
CommandSend nor MessageMetadata a `highest_sequence_id`; each single-message metadata carries
its own id. The broker must take the batch's highest id from the batch (live check, what is
recorded as persisted, snapshots, the replay after a crash or a power loss), so that a
producer with the same name learns the highest id stored and resending after it stores
nothing twice. The SENDs here are built the way that client builds them and are passed to
`publish` the way the connection handler passes an unstated highest id (-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.broker import PersistentTopic, Position, ProducerSpec
from magnetar.broker._config import BrokerConfig
from magnetar.broker.topics._dedup import DEDUP_CURSOR_NAME, highest_sequence_id_of
from magnetar.broker.topics._service import BrokerService
from magnetar.broker.topics._topic import Producer
from magnetar.codec import (
    CompressionType,
    SingleMessage,
    build_batch,
    encode_entry,
    prefix_broker_entry_metadata,
)
from magnetar.codec._proto import pulsar_api_pb2 as pb
from magnetar.storage import Storage
from magnetar.storage.testing.simfs import SimFileSystem

from .helpers import broker_env, make_entry, now_ms, publish, settle, wait_for

TOPIC = "persistent://public/default/dedup-batches"
BATCH_MESSAGES = 100
NO_HIGHEST_STATED = -1  # what the connection handler passes when the SEND states none


def _client_batch(first: int, count: int = BATCH_MESSAGES, *, step: int = 1,
                  compression: CompressionType = CompressionType.NONE,
                  key: str | None = None) -> tuple[pb.MessageMetadata, bytes]:
    """A batch as the C++ client sends it, ids first, first+step, ...: (metadata, entry)."""
    messages = [SingleMessage(f"m{first + i * step}".encode(), sequence_id=first + i * step,
                              partition_key=key) for i in range(count)]
    metadata, payload = build_batch(messages, producer_name="p1", publish_time=now_ms(),
                                    compression=compression)
    assert not metadata.HasField("highest_sequence_id")
    return metadata, encode_entry(metadata, payload)


async def _send_batch(topic: PersistentTopic, producer: Producer, first: int,
                      count: int = BATCH_MESSAGES, *, step: int = 1,
                      compression: CompressionType = CompressionType.NONE,
                      key: str | None = None) -> tuple[int, int]:
    metadata, entry = _client_batch(first, count, step=step, compression=compression, key=key)
    result = await topic.publish(producer, entry, first, NO_HIGHEST_STATED, metadata)
    return result.ledger_id, result.entry_id


async def _producer(service: BrokerService) -> tuple[PersistentTopic, Producer]:
    topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
    assert isinstance(topic, PersistentTopic)
    return topic, producer


async def _keep(topic: PersistentTopic) -> None:
    """A subscription at the start, so every stored copy stays countable."""
    await topic.create_subscription("keep", "earliest")


async def _assert_resume_stores_nothing_twice(topic: PersistentTopic, producer: Producer,
                                              highest: int, entries: int) -> None:
    """`last_sequence_id` is `highest`; every earlier id is a duplicate; the next is new."""
    assert topic.last_sequence_id(producer) == highest
    for sequence_id in (1, highest // 2, highest - 1, highest):
        assert await publish(topic, producer, b"again", sequence_id=sequence_id) == (-1, -1)
    assert topic.managed_ledger.number_of_entries == entries
    assert await publish(topic, producer, b"next", sequence_id=highest + 1) != (-1, -1)
    assert topic.managed_ledger.number_of_entries == entries + 1


async def test_running_broker_learns_the_highest_id_of_an_unstated_batch(tmp_path: Path) -> None:
    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        topic, producer = await _producer(env.service)
        await _keep(topic)
        assert await _send_batch(topic, producer, 0) != (-1, -1)
        assert topic.dedup is not None
        assert topic.dedup.highest_pushed("p1") == BATCH_MESSAGES - 1
        assert topic.dedup.highest_persisted("p1") == BATCH_MESSAGES - 1
        # A batch resent whole, or starting inside the stored one, is a duplicate.
        assert await _send_batch(topic, producer, 0) == (-1, -1)
        assert await _send_batch(topic, producer, 50, 10) == (-1, -1)
        topic.remove_producer(producer)
        _, again = await _producer(env.service)
        await _assert_resume_stores_nothing_twice(topic, again, BATCH_MESSAGES - 1, 1)


async def test_gapped_ids_come_from_the_last_single_message_metadata(tmp_path: Path) -> None:
    """Ids 0, 3, ..., 297 (not consecutive), plain, compressed and keyed."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        topic, producer = await _producer(env.service)
        await _keep(topic)
        await _send_batch(topic, producer, 0, step=3)
        assert topic.last_sequence_id(producer) == 297
        await _send_batch(topic, producer, 1000, step=3, compression=CompressionType.LZ4)
        assert topic.last_sequence_id(producer) == 1297
        await _send_batch(topic, producer, 2000, step=2, key="k")
        assert topic.last_sequence_id(producer) == 2198
        assert await publish(topic, producer, b"x", sequence_id=2197) == (-1, -1)
        assert topic.managed_ledger.number_of_entries == 3


async def test_clean_restart_and_crash_keep_the_highest_id(tmp_path: Path) -> None:
    """A clean restart (snapshot at close) and a kill -9 (replay of the tail)."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        topic, producer = await _producer(env.service)
        await _keep(topic)
        await _send_batch(topic, producer, 0)
        service = await env.restart()
        topic, producer = await _producer(service)
        await _assert_resume_stores_nothing_twice(topic, producer, 99, 1)
        await _send_batch(topic, producer, 101)  # 101..200
        service = await env.crash()
        topic, producer = await _producer(service)
        assert topic.dedup is not None
        assert topic.dedup.entries_since_snapshot == 2  # replayed, not snapshotted
        await _assert_resume_stores_nothing_twice(topic, producer, 200, 3)


async def test_snapshot_holds_highest_ids_and_recovery_replays_after_it(tmp_path: Path) -> None:
    """Snapshots every 2 entries: after 5 batches the snapshot is at the 4th and holds its
    highest id; a crash replays the 5th on top of it."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True,
                          broker_deduplication_entries_interval=2) as env:
        topic, producer = await _producer(env.service)
        await _keep(topic)
        positions = [await _send_batch(topic, producer, i * BATCH_MESSAGES)
                     for i in range(5)]
        cursor = topic.managed_ledger.cursors[DEDUP_CURSOR_NAME]
        await wait_for(lambda: cursor.mark_delete_position == Position(*positions[3]))
        await cursor.flush()  # the snapshot is durable before the crash
        assert cursor.properties == {"p1": 4 * BATCH_MESSAGES - 1}
        service = await env.crash()
        topic, producer = await _producer(service)
        assert topic.managed_ledger.cursors[DEDUP_CURSOR_NAME].properties == {
            "p1": 4 * BATCH_MESSAGES - 1}
        assert topic.dedup is not None
        assert topic.dedup.entries_since_snapshot == 1
        await _assert_resume_stores_nothing_twice(topic, producer,
                                                  5 * BATCH_MESSAGES - 1, 5)


@pytest.mark.parametrize("power_seed", range(3))  # each on its own event loop
async def test_power_loss_keeps_the_highest_id_of_acknowledged_batches(tmp_path: Path,
                                                                    power_seed: int) -> None:
    """On the simulated file system: batches acknowledged (durable), one snapshot among
    them, then the power fails and unsynced writes are dropped, torn or corrupted."""

    directory = tmp_path / f"power-{power_seed}"
    config = BrokerConfig(broker_deduplication_enabled=True,
                          broker_deduplication_entries_interval=3)
    fs = SimFileSystem(power_seed)
    storage = Storage.open(directory, fs=fs)
    service = BrokerService(storage, config)
    await service.start(maintenance=False)
    topic, producer = await _producer(service)
    await _keep(topic)
    for i in range(4):
        await _send_batch(topic, producer, i * BATCH_MESSAGES)
    await settle(service)
    # The power fails: no more I/O from the broker, then the disk loses what it may.
    service.closed = True
    for loaded in service.topics.values():
        assert isinstance(loaded, PersistentTopic)
        loaded.fenced = True
        for subscription in loaded.all_subscriptions():
            subscription.close()
        for task in list(loaded._background):
            task.cancel()
    storage.abandon()
    fs.crash("simulated power loss")
    fs.power_loss()

    storage = Storage.open(directory)
    service = BrokerService(storage, config)
    await service.start(maintenance=False)
    try:
        topic, producer = await _producer(service)
        await _assert_resume_stores_nothing_twice(topic, producer,
                                                  4 * BATCH_MESSAGES - 1, 4)
    finally:
        await service.close()
        storage.close()


# -- the derivation itself (`highest_sequence_id_of`) ---------------------------------------

def _derive(metadata: pb.MessageMetadata, entry: bytes, stated: int = NO_HIGHEST_STATED) -> int:
    return highest_sequence_id_of(metadata.sequence_id, stated, metadata, entry)


def test_derivation_prefers_what_the_send_or_the_metadata_states() -> None:
    metadata, entry = _client_batch(10, 5)
    assert _derive(metadata, entry, stated=20) == 20  # CommandSend's highest_sequence_id
    assert _derive(metadata, entry, stated=10) == 10
    metadata.highest_sequence_id = 30  # as the Java client writes it
    assert _derive(metadata, entry) == 30
    metadata.highest_sequence_id = 3  # below sequence_id: not a highest id
    assert _derive(metadata, entry) == 14


def test_derivation_reads_the_last_single_message_metadata() -> None:
    for compression in CompressionType:
        for step in (1, 7):
            for key in (None, "key"):
                metadata, entry = _client_batch(5, 40, step=step, compression=compression,
                                                key=key)
                assert _derive(metadata, entry) == 5 + 39 * step, (compression, step, key)


def test_derivation_of_stored_entries_with_broker_entry_metadata() -> None:
    metadata, entry = _client_batch(0, 10, step=2)
    block = pb.BrokerEntryMetadata(broker_timestamp=1, index=9)
    assert _derive(metadata, prefix_broker_entry_metadata(block, entry)) == 18


def test_derivation_falls_back_to_consecutive_ids() -> None:
    # The single-message metadata carries no ids.
    messages = [SingleMessage(b"x") for _ in range(4)]
    metadata, payload = build_batch(messages, producer_name="p1", publish_time=1)
    metadata.sequence_id = 100
    assert _derive(metadata, encode_entry(metadata, payload)) == 103
    # A payload the broker cannot read (it stores payloads unchecked).
    broken = encode_entry(metadata, payload[:-3])
    assert _derive(metadata, broken) == 103
    metadata.compression = pb.LZ4
    metadata.uncompressed_size = len(payload)
    assert _derive(metadata, encode_entry(metadata, b"not lz4")) == 103


def test_derivation_of_single_messages_is_their_id() -> None:
    metadata, entry = make_entry(b"x", sequence_id=42)
    assert _derive(metadata, entry) == 42
    metadata, entry = _client_batch(42, 1)
    assert _derive(metadata, entry) == 42
