"""`BrokerService` over `InMemoryLedgerStorage`: the whole broker runs on the `LedgerStorage`
Protocol, and storage failures that are costly to cause on a real disk are scripted in a
line: a read error that may pass (the dispatcher's retry path), publishes in flight when the
disk fills, a corrupt entry."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from magnetar.broker import (
    BrokerConfig,
    BrokerService,
    PersistentTopic,
    ProducerSpec,
    SubscribeSpec,
)
from magnetar.broker._errors import DiskFullError
from magnetar.broker.dispatch._dispatcher import DISPATCH_RETRY_DELAY_S
from magnetar.broker.topics._topic import Producer
from magnetar.storage import StorageError
from magnetar.storage.testing.memory import InMemoryLedgerStorage

from .helpers import RecordingSink, make_entry, wait_for

TOPIC = "persistent://public/default/memory"
OTHER = "persistent://public/default/other"


@asynccontextmanager
async def memory_service() -> AsyncIterator[tuple[BrokerService, InMemoryLedgerStorage]]:
    store = InMemoryLedgerStorage()
    service = BrokerService(store, BrokerConfig(active_consumer_failover_delay_ms=0))
    await service.start(maintenance=False)
    try:
        yield service, store
    finally:
        await service.close()
        store.close()


async def producer_on(service: BrokerService, name: str) -> tuple[PersistentTopic, Producer]:
    topic = await service.get_topic(name)
    assert isinstance(topic, PersistentTopic)
    return topic, topic.add_producer(ProducerSpec("p1"))


async def publish(topic: PersistentTopic, producer: Producer, i: int) -> tuple[int, int]:
    metadata, entry = make_entry(f"m{i}".encode(), sequence_id=i, producer_name="p1")
    result = await topic.publish(producer, entry, i, i, metadata)
    return result.ledger_id, result.entry_id


async def subscribe(service: BrokerService, name: str, sink: RecordingSink) -> None:
    topic, consumer = await service.subscribe(
        name, SubscribeSpec("sub", "Shared", "c1", initial_position="earliest"), sink)
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions["sub"].flow(consumer, 1000)


async def test_publish_and_consume() -> None:
    async with memory_service() as (service, _):
        topic, producer = await producer_on(service, TOPIC)
        positions = [await publish(topic, producer, i) for i in range(10)]
        assert [entry for _, entry in positions] == list(range(10))
        sink = RecordingSink()
        await subscribe(service, TOPIC, sink)
        await wait_for(lambda: len(sink.received) == 10)
        assert [r.body for r in sink.received] == [b"m%d" % i for i in range(10)]


@pytest.mark.parametrize("error", [StorageError("read timed out (scripted)"),
                                   OSError(errno.EIO, "read timed out (scripted EIO)")],
                         ids=["storage-error", "os-error"])
async def test_a_read_error_that_may_pass_is_retried_and_delivery_completes(
        error: StorageError | OSError, caplog: pytest.LogCaptureFixture) -> None:
    """Neither a storage error that may pass nor a disk's EIO fails the topic (the seeded
    simulation's crashes mid-read raise OSError): the round is retried."""
    async with memory_service() as (service, store):
        topic, producer = await producer_on(service, TOPIC)
        for i in range(5):
            await publish(topic, producer, i)
        store.fail_next_reads(1, error)
        sink = RecordingSink()
        with caplog.at_level(logging.WARNING):
            await subscribe(service, TOPIC, sink)
            await wait_for(lambda: len(sink.received) == 5,
                           timeout_s=DISPATCH_RETRY_DELAY_S + 5)
        assert [r.body for r in sink.received] == [b"m%d" % i for i in range(5)]
        assert sink.closed == []
        assert any("retrying" in r.getMessage() and "read timed out" in r.getMessage()
                   for r in caplog.records)


async def test_publishes_in_flight_when_the_disk_fills_fail_and_writes_resume() -> None:
    async with memory_service() as (service, store):
        sink = RecordingSink()
        await subscribe(service, TOPIC, sink)  # holds the data (no retention)
        topic, producer = await producer_on(service, TOPIC)
        for i in range(3):
            await publish(topic, producer, i)
        store.hold_completions()
        in_flight = [asyncio.ensure_future(publish(topic, producer, i))
                     for i in range(3, 6)]
        await wait_for(lambda: store.pending_writes >= 3)
        store.set_disk_full(True)
        store.complete_pending()
        for future in in_flight:
            with pytest.raises(DiskFullError):
                await future
        assert service.storage_full
        with pytest.raises(DiskFullError, match="disk is full"):
            topic.add_producer(ProducerSpec("p2"))
        store.set_disk_full(False)
        assert (await service.run_maintenance(force=True)) is not None
        assert not service.storage_full
        producer = topic.add_producer(ProducerSpec("p1"))
        await publish(topic, producer, 6)
        await wait_for(lambda: len(sink.received) == 4)
        assert [r.body for r in sink.received] == [b"m0", b"m1", b"m2", b"m6"]


async def test_a_corrupt_entry_closes_the_consumers_of_its_topic_only() -> None:
    async with memory_service() as (service, store):
        for name in (TOPIC, OTHER):
            topic, producer = await producer_on(service, name)
            for i in range(10):
                await publish(topic, producer, i)
        bad = await service.get_topic(TOPIC)
        assert isinstance(bad, PersistentTopic)
        store.corrupt_entry(bad.managed_ledger.ledgers()[0].ledger_id, 5)
        bad_sink, good_sink = RecordingSink(), RecordingSink()
        await subscribe(service, TOPIC, bad_sink)
        await subscribe(service, OTHER, good_sink)
        await wait_for(lambda: bool(bad_sink.closed) and len(good_sink.received) == 10)
        [(_, reason)] = bad_sink.closed
        assert "scripted corruption" in reason
        assert len(bad_sink.received) < 10
