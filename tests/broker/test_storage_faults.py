"""Storage faults seen from the broker (issue 10, items 2 and 6).

A full disk (item 6): the fault-injecting file system fails every write with ENOSPC. A
publish must then be refused in a way the official client reports to the application (the
producer is closed and re-creation refused with DiskFullError, ProducerBlockedQuota-
ExceededException on the wire), stats and metrics must say the disk is full, and writes must
resume by themselves once there is room, losing nothing acknowledged.

Corrupt data (item 2): bytes flipped in an entry log, or an index that cannot be read, make
the dispatcher's reads fail for good. The topic must say so: the error is logged with the file
and offset, the topic is marked failed in stats and metrics, its consumers are closed and new
subscriptions refused with a clear error, and every other topic keeps working. Real files and
a real restart; the corruption is made on disk between two runs.
"""

from __future__ import annotations

import errno
import logging
import os
import traceback
from pathlib import Path

import pytest

from magnetar.broker import (
    BrokerConfig,
    BrokerService,
    NotAllowedError,
    PersistentTopic,
    ProducerSpec,
    SubscribeSpec,
)
from magnetar.broker._errors import BrokerError, DiskFullError
from magnetar.broker.http._metrics import render_metrics
from magnetar.broker.http._stats import topic_stats
from magnetar.broker.ledger._position import Position
from magnetar.broker.topics._topic import Producer, PublishResult
from magnetar.storage import Storage
from magnetar.storage._entry_log import entry_log_name, split_location
from magnetar.storage.testing.simfs import SimFileSystem

from .helpers import BrokerEnv, RecordingSink, broker_env, make_entry, settle, wait_for

BAD = "persistent://public/default/bad"
GOOD = "persistent://public/default/good"
MESSAGES = 300
PUBLISHES_UNTIL_FULL_MAX = 10_000


async def _publish(service: BrokerService, topic_name: str, count: int) -> None:
    topic = await service.get_topic(topic_name)
    assert isinstance(topic, PersistentTopic)
    producer = topic.add_producer(ProducerSpec("p1"))
    for i in range(count):
        metadata, entry = make_entry(f"m{i}".encode(), sequence_id=i, producer_name="p1")
        await topic.publish(producer, entry, i, i, metadata)
    topic.remove_producer(producer)


async def _subscribe(service: BrokerService, topic_name: str, sink: RecordingSink,
                     sub_type: str = "Shared") -> PersistentTopic:
    topic, consumer = await service.subscribe(
        topic_name, SubscribeSpec("sub", sub_type, "c1", initial_position="earliest"), sink)
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions["sub"].flow(consumer, 100_000)
    return topic


def _flip_entry_bytes(env: BrokerEnv, ledger_id: int, entry_id: int) -> tuple[str, int]:
    """Flip bytes inside the stored record of one entry; returns (file, record offset)."""
    [(_, location)] = env.storage.index.locations(ledger_id, entry_id, entry_id)
    log_id, offset = split_location(location)
    path = os.path.join(str(env.path), "entrylogs", entry_log_name(log_id))
    with open(path, "r+b") as handle:
        handle.seek(offset + 30)
        data = handle.read(4)
        handle.seek(offset + 30)
        handle.write(bytes(b ^ 0xFF for b in data))
    return path, offset


async def _corrupt_and_restart(env: BrokerEnv) -> tuple[BrokerService, str, int]:
    """Publish to both topics, restart (the entries land in entry logs), flip a record of
    BAD in the middle, and restart again so that nothing is cached."""
    await _publish(env.service, BAD, MESSAGES)
    await _publish(env.service, GOOD, MESSAGES)
    service = await env.restart()
    bad = await service.get_topic(BAD)
    assert isinstance(bad, PersistentTopic)
    first_ledger = bad.managed_ledger.ledgers()[0].ledger_id
    path, offset = _flip_entry_bytes(env, first_ledger, MESSAGES // 2)
    return await env.restart(), path, offset


@pytest.mark.parametrize("sub_type", ["Exclusive", "Shared", "Key_Shared"])
async def test_corrupt_entry_log_fails_the_topic_loudly(tmp_path: Path, sub_type: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    async with broker_env(tmp_path) as env:
        service, path, offset = await _corrupt_and_restart(env)
        caplog.clear()
        bad_sink, good_sink = RecordingSink(), RecordingSink()
        with caplog.at_level(logging.ERROR):
            bad = await _subscribe(service, BAD, bad_sink, sub_type)
            good = await _subscribe(service, GOOD, good_sink, sub_type)
            await wait_for(lambda: bool(bad_sink.closed))
            await wait_for(lambda: len(good_sink.received) == MESSAGES)
        # The consumer of the broken topic is told, with the file and offset.
        assert len(bad_sink.received) < MESSAGES
        [(_, reason)] = bad_sink.closed
        assert path in reason
        assert f"offset {offset}" in reason
        # The log names them too, and no exception escaped into the event loop.
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any(path in m and BAD in m for m in errors), errors
        assert not any("Exception in callback" in m for m in errors), errors
        # Stats and metrics mark the topic failed; the healthy topic is not.
        assert path in topic_stats(bad)["storageFailure"]
        assert topic_stats(good)["storageFailure"] is None
        text = render_metrics(service)
        labels = 'cluster="standalone",namespace="public/default",topic="{}"'
        assert f"pulsar_topic_storage_failed{{{labels.format(BAD)}}} 1" in text
        assert f"pulsar_topic_storage_failed{{{labels.format(GOOD)}}} 0" in text
        # Subscribing again is refused with a clear error rather than silence.
        with pytest.raises(NotAllowedError, match="cannot be read"):
            await service.subscribe(BAD, SubscribeSpec("other", "Shared", "c2"),
                                    RecordingSink())
        # Publishing to both topics still works; the good topic still delivers.
        await _publish(service, BAD, 1)
        await _publish(service, GOOD, 1)
        await wait_for(lambda: len(good_sink.received) == MESSAGES + 1)
        assert good.failure is None
        # Unloading clears the mark (an operator who repaired or skipped the data).
        assert await service.unload_topic(BAD)
        reloaded = await service.get_topic(BAD)
        assert isinstance(reloaded, PersistentTopic)
        assert reloaded.failure is None


def test_index_lookup_error_is_a_corruption_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """LMDB reporting a damaged page on a lookup (lmdb.CorruptedError, as a flipped index
    page gives) reaches the reader as a CorruptionError naming the index, which the topic
    then reports like any other corruption. A real damaged page cannot be made reproducibly:
    depending on the page, LMDB aborts the process instead, so the lookup stands in."""
    import lmdb

    from magnetar.storage import CorruptionError, Storage

    with Storage.open(tmp_path) as store:
        ledger = store.wait(store.create_ledger())
        for i in range(3):
            store.wait(store.add_entry(ledger, b"e%d" % i))
        store.checkpoint()

        def damaged(ledger_id: int, first: int, last: int) -> list[tuple[int, int]]:
            raise lmdb.CorruptedError("mdb_cursor_get: MDB_CORRUPTED: Located page was "
                                      "wrong type")

        monkeypatch.setattr(store.index, "locations", damaged)
        with pytest.raises(CorruptionError, match="index cannot be read") as caught:
            store.read_entries(ledger, 0, 2)
        assert caught.value.path == os.path.join(str(tmp_path), "index")


# -- a full disk (item 6) -------------------------------------------------------------------


class _FullDiskEnv:
    """A real storage on the fault-injecting file system with a started service: `fill()`
    makes every write fail with ENOSPC, `make_room()` lets them through again."""

    def __init__(self, path: Path):
        self.fs = SimFileSystem(seed=11)
        self.storage = Storage.open(path, fs=self.fs)
        self.service = BrokerService(self.storage, BrokerConfig())

    def fill(self) -> None:
        self.fs.fail_writes(errno.ENOSPC)

    def make_room(self) -> None:
        self.fs.heal()

    async def close(self) -> None:
        await self.service.close()
        self.storage.close()


async def _publish_one(topic: PersistentTopic, producer: Producer, i: int) -> PublishResult:
    metadata, entry = make_entry(f"m{i}".encode(), sequence_id=i, producer_name=producer.name)
    return await topic.publish(producer, entry, i, i, metadata)


async def test_full_disk_refuses_publishes_then_resumes_by_itself(tmp_path: Path) -> None:
    env = _FullDiskEnv(tmp_path)
    await env.service.start(maintenance=False)
    try:
        service = env.service
        topic = await service.get_topic(GOOD)
        assert isinstance(topic, PersistentTopic)
        sink = RecordingSink()
        await _subscribe(service, GOOD, sink)  # holds the data (no retention)
        closed: list[str] = []
        producer = topic.add_producer(ProducerSpec("p1"))
        producer.closer = closed.append
        for i in range(5):
            await _publish_one(topic, producer, i)
        env.fill()
        # The publish is refused with the quota-style error and the producer closed (a
        # CLOSE_PRODUCER on the wire), not answered with a PersistenceError.
        with pytest.raises(DiskFullError):
            await _publish_one(topic, producer, 5)
        assert closed == ["the broker's disk is full"]
        assert "p1" not in topic.producers
        assert service.storage_full
        with pytest.raises(DiskFullError, match="disk is full"):
            topic.add_producer(ProducerSpec("p2"))
        # Stats and metrics say so.
        assert topic_stats(topic)["storageFull"] is True
        assert 'pulsar_broker_storage_full{cluster="standalone"} 1' in \
            render_metrics(service)
        # Still full: the periodic check leaves writes off.
        assert not await service.resume_writes_if_room()
        env.make_room()
        assert (await service.run_maintenance(force=True)) is not None
        assert not service.storage_full
        assert topic_stats(topic)["storageFull"] is False
        assert 'pulsar_broker_storage_full{cluster="standalone"} 0' in \
            render_metrics(service)
        producer = topic.add_producer(ProducerSpec("p1"))
        for i in range(5, 8):
            await _publish_one(topic, producer, i)
        expected = [f"m{i}".encode() for i in range(8)]
        await wait_for(lambda: len(sink.received) >= 8)
        assert [r.body for r in sink.received] == expected
    finally:
        await env.close()
    # Nothing acknowledged is lost, nothing refused comes back, after a reopen.
    async with broker_env(tmp_path) as reopened:
        sink = RecordingSink()
        await _subscribe(reopened.service, GOOD, sink)
        await wait_for(lambda: len(sink.received) >= 8)
        await settle(reopened.service)
        assert [r.body for r in sink.received] == expected


async def _publish_until_full(topic: PersistentTopic, producer: Producer) -> int:
    """Publish m0, m1, ... (checkpointing each) until DiskFullError; how many succeeded."""
    for sent in range(PUBLISHES_UNTIL_FULL_MAX):
        try:
            await _publish_one(topic, producer, sent)
        except DiskFullError:
            return sent
        topic.service.storage.checkpoint()
    raise AssertionError("the disk never filled")


async def test_deleting_a_topic_on_a_full_disk_frees_space_and_publishing_resumes(
        tmp_path: Path) -> None:
    """A disk of limited size fills up; deleting the topic that holds most of it is answered
    (204, not 500) while full, frees its entry logs, and the next periodic check resumes
    writes: health turns back to ok and the other topic publishes again."""
    import aiohttp

    from magnetar.broker.http._admin import start_admin
    from tests.storage.helpers import SmallDisk, small_config

    big, small = "persistent://public/default/big", "persistent://public/default/small"

    disk = SmallDisk(4, tmp_path, capacity_bytes=2**40)
    storage = Storage.open(tmp_path, small_config(entry_log_bytes_max=128 * 1024),
                           fs=disk)
    service = BrokerService(storage, BrokerConfig(max_message_size_bytes=64 * 1024))
    await service.start(maintenance=False)
    admin = await start_admin(service, "127.0.0.1", 0)
    try:
        sink = RecordingSink()
        await _subscribe(service, small, sink)  # holds small's data
        await _subscribe(service, big, RecordingSink())  # holds big's data
        topic_big = await service.get_topic(big)
        assert isinstance(topic_big, PersistentTopic)
        producer = topic_big.add_producer(ProducerSpec("p"))
        for i in range(100):
            metadata, entry = make_entry(bytes([i % 250]) * 4096, sequence_id=i,
                                         producer_name="p")
            await topic_big.publish(producer, entry, i, i, metadata)
        storage.checkpoint()
        disk.capacity_bytes = disk.used_bytes() + 128 * 1024
        topic_small = await service.get_topic(small)
        assert isinstance(topic_small, PersistentTopic)
        producer = topic_small.add_producer(ProducerSpec("p"))
        sent = await _publish_until_full(topic_small, producer)
        assert service.storage_full
        async with aiohttp.ClientSession() as session:
            health = f"{admin.url}/admin/v2/brokers/health"
            async with session.get(health) as answer:
                assert answer.status == 503
                assert "disk is full" in await answer.text()
            used = disk.used_bytes()
            async with session.delete(f"{admin.url}/admin/v2/persistent/public/default/"
                                      "big", params={"force": "true"}) as answer:
                assert answer.status == 204, await answer.text()
            assert disk.used_bytes() < used
            await service.run_maintenance(force=True)  # the periodic check
            assert not service.storage_full
            async with session.get(health) as answer:
                assert answer.status == 200
        assert not service.topic_exists(big)
        producer = topic_small.add_producer(ProducerSpec("p"))
        await _publish_one(topic_small, producer, sent)
        expected = [f"m{i}".encode() for i in range(sent + 1)]
        await wait_for(lambda: len(sink.received) >= sent + 1)
        assert [r.body for r in sink.received] == expected
    finally:
        await admin.close()
        await service.close()
        storage.close()


async def test_a_failed_storage_fails_a_cursors_background_write_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Once the storage failed (here a sync answered EIO), a change a cursor persists in the
    background (a redelivery count: what a consumer's close clears) is a logged warning,
    not an exception out of the consumer's close into the connection's; and the storage's
    one failure, raised to every caller, does not pile up their tracebacks."""
    fs = SimFileSystem(seed=5)
    storage = Storage.open(tmp_path, fs=fs)
    service = BrokerService(storage, BrokerConfig())
    await service.start(maintenance=False)
    try:
        topic = await _subscribe(service, GOOD, RecordingSink())
        producer = topic.add_producer(ProducerSpec("p1"))
        first = await _publish_one(topic, producer, 0)
        fs.fail_syncs(errno.EIO)
        with pytest.raises(BrokerError):
            await _publish_one(topic, producer, 1)
        assert storage.failed is not None
        cursor = topic.subscriptions["sub"].cursor
        with caplog.at_level(logging.WARNING, logger="magnetar.broker.ledger._cursor"):
            cursor.count_redelivery(Position(first.ledger_id, first.entry_id))
            await wait_for(lambda: any("persisting failed" in r.getMessage()
                                       for r in caplog.records))
        assert cursor.writes_pending
        depths = []
        for _ in range(3):
            with pytest.raises(type(storage.failed)) as caught:
                storage.create_ledger()
            depths.append(len(traceback.extract_tb(caught.value.__traceback__)))
        assert depths[0] == depths[1] == depths[2]
    finally:
        await service.close()
        storage.close()
