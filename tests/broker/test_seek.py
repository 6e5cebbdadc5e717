"""Seek (reset cursor) end to end through `BrokerService` (broker reference §4.7, §11 items
32-33; `SubscriptionSeekTest`).

* By message id: delivery restarts AT the sought entry; earliest, latest and ids outside
  the ledger range clamp to the first entry or the end: backlogs 5/10/0/10/0 on 10 entries.
* A seek disconnects every consumer of a Shared subscription but only the active one of a
  Failover subscription; consumers that reconnect receive from the sought entry.
* By time: resume at the first entry whose publish time is >= T.
* A batch id's ack set marks the indexes before it acknowledged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.broker import Consumer, PersistentTopic, Position, ProducerSpec, SubscribeSpec
from magnetar.broker._errors import SubscriptionBusyError
from magnetar.broker.ledger._position import EARLIEST, LATEST
from magnetar.broker.topics._service import BrokerService
from magnetar.codec import SingleMessage, build_batch, encode_entry

from .helpers import RecordingSink, broker_env, make_entry, now_ms, publish, settle, wait_for

TOPIC = "persistent://public/default/seek"


async def _setup(service: BrokerService, count: int = 10,
                 publish_times: list[int] | None = None) -> tuple[PersistentTopic, list[Position]]:
    topic = await service.get_topic(TOPIC)
    assert isinstance(topic, PersistentTopic)
    await topic.create_subscription("sub", "earliest")
    producer = topic.add_producer(ProducerSpec("p1"))
    positions = []
    for i in range(count):
        metadata, entry = make_entry(f"m{i}".encode(), sequence_id=i,
                                     publish_time_ms=publish_times[i] if publish_times else None)
        result = await topic.publish(producer, entry, i, i, metadata)
        positions.append(Position(result.ledger_id, result.entry_id))
    return topic, positions


async def _consume(service: BrokerService, sub_type: str, sink: RecordingSink,
                   consumer_name: str) -> Consumer:
    topic, consumer = await service.subscribe(
        TOPIC, SubscribeSpec("sub", sub_type, consumer_name, initial_position="earliest"), sink)
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions["sub"].flow(consumer, 1000)
    return consumer


async def test_seek_by_message_id_earliest_latest_and_out_of_range(tmp_path: Path) -> None:
    """testSeek: 5 / 10 / 0 / 10 / 0."""

    async with broker_env(tmp_path) as env:
        topic, positions = await _setup(env.service)
        subscription = topic.subscriptions["sub"]
        assert subscription.backlog() == 10
        ledgers = [ledger.ledger_id for ledger in topic.managed_ledger.ledgers()]
        first_ledger, last_ledger = ledgers[0], ledgers[-1]

        await subscription.reset_cursor(positions[5])
        assert subscription.backlog() == 5
        assert subscription.cursor.read_position == positions[5]
        await subscription.reset_cursor(EARLIEST)
        assert subscription.backlog() == 10
        await subscription.reset_cursor(LATEST)
        assert subscription.backlog() == 0
        await subscription.reset_cursor(Position(first_ledger - 1, 0))
        assert subscription.backlog() == 10
        await subscription.reset_cursor(Position(last_ledger + 1, 0))
        assert subscription.backlog() == 0


async def test_seek_result_survives_a_restart(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, positions = await _setup(env.service)
        await topic.subscriptions["sub"].acknowledge(None, 0, [
            (p.ledger_id, p.entry_id, None) for p in positions[7:]])
        await topic.subscriptions["sub"].reset_cursor(positions[3])  # clears the holes
        service = await env.crash()
        topic = await service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        assert topic.subscriptions["sub"].backlog() == 7
        sink = RecordingSink()
        consumer = await _consume(service, "Exclusive", sink, "c1")
        await wait_for(lambda: len(sink.received) >= 7)
        assert sink.bodies(consumer) == [f"m{i}".encode() for i in range(3, 10)]


async def test_seek_redelivers_from_the_sought_message_inclusive(tmp_path: Path) -> None:
    """testSeekIsByReceive: the broker sends message 5 again (the client drops it unless
    it is inclusive)."""

    async with broker_env(tmp_path) as env:
        service = env.service
        topic, positions = await _setup(service)
        sink = RecordingSink()
        consumer = await _consume(service, "Exclusive", sink, "c1")
        await wait_for(lambda: len(sink.received) >= 10)
        subscription = topic.subscriptions["sub"]
        await subscription.reset_cursor(positions[5])
        assert [c for c, _ in sink.closed] == [consumer]
        assert subscription.consumers == []

        again = RecordingSink()
        reconnected = await _consume(service, "Exclusive", again, "c1")
        await wait_for(lambda: len(again.received) >= 5)
        await settle(service)
        assert again.bodies(reconnected) == [f"m{i}".encode() for i in range(5, 10)]


async def test_seek_disconnects_every_shared_consumer(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, positions = await _setup(service)
        sink = RecordingSink()
        consumers = [await _consume(service, "Shared", sink, f"c{i}") for i in range(3)]
        await wait_for(lambda: len(sink.received) >= 10)
        subscription = topic.subscriptions["sub"]
        await subscription.reset_cursor(positions[2])
        assert {c.consumer_serial for c, _ in sink.closed} == {
            c.consumer_serial for c in consumers}
        assert subscription.consumers == []
        assert subscription.backlog() == 8

        again = RecordingSink()
        await _consume(service, "Shared", again, "c0")
        await wait_for(lambda: len(again.received) >= 8)
        await settle(service)
        assert again.positions() == [tuple(p) for p in positions[2:]]


async def test_seek_disconnects_only_the_active_failover_consumer(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, positions = await _setup(service)
        sink = RecordingSink()
        consumers = [await _consume(service, "Failover", sink, f"c{i}") for i in range(3)]
        subscription = topic.subscriptions["sub"]
        dispatcher = subscription.dispatcher
        active = getattr(dispatcher, "active", None)
        assert active in consumers
        await wait_for(lambda: len(sink.received) >= 10)
        assert {r.consumer.consumer_serial for r in sink.received} == {
            active.consumer_serial}

        await subscription.reset_cursor(positions[4])
        assert [c for c, _ in sink.closed] == [active]
        remaining = [c for c in consumers if c is not active]
        assert sorted(c.consumer_serial for c in subscription.consumers) == sorted(
            c.consumer_serial for c in remaining)
        # A remaining consumer takes over and receives from the sought entry.
        new_active = getattr(dispatcher, "active", None)
        assert new_active in remaining
        await wait_for(lambda: len(sink.of(new_active)) >= 6)
        await settle(service)
        assert sink.bodies(new_active) == [f"m{i}".encode() for i in range(4, 10)]


async def test_seek_by_time(tmp_path: Path) -> None:
    """testSeekTime: seek(now) -> backlog 0; seek(now - 100 s) -> 10; in between, the first
    entry at or after the time."""

    async with broker_env(tmp_path) as env:
        start = now_ms() - 10_000
        times = [start + 1000 * i for i in range(10)]  # all within the last 10 s
        topic, positions = await _setup(env.service, publish_times=times)
        subscription = topic.subscriptions["sub"]
        await subscription.reset_cursor_by_time(now_ms())
        assert subscription.backlog() == 0
        await subscription.reset_cursor_by_time(now_ms() - 100_000)
        assert subscription.backlog() == 10
        await subscription.reset_cursor_by_time(times[6])  # exactly entry 6's time
        assert subscription.backlog() == 4
        assert subscription.cursor.read_position == positions[6]
        await subscription.reset_cursor_by_time(times[6] + 1)
        assert subscription.backlog() == 3


@pytest.mark.parametrize("sub_type", ["Shared", "Key_Shared"])
async def test_seek_by_time_disconnects_shared_consumers(tmp_path: Path, sub_type: str) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, _ = await _setup(service)
        sink = RecordingSink()
        consumers = [await _consume(service, sub_type, sink, f"c{i}") for i in range(2)]
        await subscription_reset(topic, now_ms() - 100_000)
        assert {c.consumer_serial for c, _ in sink.closed} == {
            c.consumer_serial for c in consumers}
        assert topic.subscriptions["sub"].backlog() == 10


async def subscription_reset(topic: PersistentTopic, timestamp_ms: int) -> None:
    await topic.subscriptions["sub"].reset_cursor_by_time(timestamp_ms)


async def test_seek_to_a_batch_index_marks_the_earlier_indexes_acked(tmp_path: Path) -> None:
    """testSeekForBatch: seeking to index 4 of a 10-message batch redelivers the batch with
    indexes 0..3 cleared in its ack set."""

    async with broker_env(tmp_path) as env:
        service = env.service
        topic = await service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        await topic.create_subscription("sub", "earliest")
        producer = topic.add_producer(ProducerSpec("p1"))
        metadata, payload = build_batch(
            [SingleMessage(f"b{i}".encode(), sequence_id=i) for i in range(10)],
            producer_name="p1", publish_time=now_ms())
        result = await topic.publish(producer, encode_entry(metadata, payload), 0, 9,
                                     metadata)
        after = await publish(topic, producer, b"after", sequence_id=10)
        ack_set = [(1 << 10) - 1 & ~0b1111]  # indexes 0..3 acknowledged
        await topic.subscriptions["sub"].reset_cursor(
            Position(result.ledger_id, result.entry_id), ack_set)
        sink = RecordingSink()
        consumer = await _consume(service, "Exclusive", sink, "c1")
        await wait_for(lambda: len(sink.received) >= 2)
        batch, single = sink.of(consumer)
        assert (batch.ledger_id, batch.entry_id) == (result.ledger_id, result.entry_id)
        assert batch.ack_set == ack_set
        assert (single.ledger_id, single.entry_id) == after
        assert topic.subscriptions["sub"].backlog() == 2
        assert consumer.permits == 1000 - 6 - 1  # only the unacked indexes are charged


async def test_a_reset_while_another_runs_is_busy_and_subscribers_wait(tmp_path: Path) -> None:
    """Broker reference §4.7: a second reset while one runs fails with "Failed to fence
    subscription" (ConsumerBusy on the wire) and changes nothing; a consumer that subscribes
    during the reset is attached only after it and reads from the sought entry."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, positions = await _setup(service)
        subscription = topic.subscriptions["sub"]
        sink = RecordingSink()
        order: list[str] = []

        async def reset() -> None:
            await subscription.reset_cursor(positions[4])
            order.append("reset")

        async def join() -> None:
            await _consume(service, "Shared", sink, "late")
            order.append("joined")

        first = asyncio.create_task(reset())
        await wait_for(lambda: subscription._reset_done is not None)
        with pytest.raises(SubscriptionBusyError, match="Failed to fence subscription"):
            await subscription.reset_cursor(positions[8])
        with pytest.raises(SubscriptionBusyError):
            await subscription.reset_cursor_by_time(0)
        assert SubscriptionBusyError.code == 5  # ConsumerBusy
        joining = asyncio.create_task(join())
        await first
        await joining
        assert order == ["reset", "joined"]
        await wait_for(lambda: len(sink.received) >= 6)
        await settle(service)
        assert sink.positions() == [tuple(p) for p in positions[4:]]
        await subscription.reset_cursor(positions[8])  # free again once it finished
        assert subscription.backlog() == 2
