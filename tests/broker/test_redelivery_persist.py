"""Redelivery counts persisted with the cursor: a clean restart and a crash keep them (once
their background write is durable), acks clear them, the persisted share is bounded, and a
consumer that really leaves still resets them (Pulsar's rule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from magnetar.broker import Consumer, PersistentTopic, Position, SubscribeSpec
from magnetar.broker.ledger._ml_records import cursor_key
from magnetar.broker.ledger._redelivery import RedeliveryCounts
from magnetar.broker.topics._service import BrokerService

from .helpers import (
    BrokerEnv,
    RecordingSink,
    broker_env,
    persistent_producer,
    publish_many,
    wait_for,
)

TOPIC = "persistent://public/default/redelivered"
INDIVIDUAL = 0


async def _consumer(service: BrokerService, sink: RecordingSink,
                    ) -> tuple[PersistentTopic, Consumer]:
    topic, consumer = await service.subscribe(
        TOPIC, SubscribeSpec("sub", "Shared", "c1", initial_position="earliest"), sink)
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions["sub"].flow(consumer, 1000)
    return topic, consumer


async def _nack_times(env: BrokerEnv, times: int, count: int = 3) -> list[Position]:
    """Publish `count` messages and nack the first two `times` times each."""
    topic, producer = await persistent_producer(env.service, TOPIC)
    sink = RecordingSink()
    _, consumer = await _consumer(env.service, sink)
    positions = [Position(*p) for p in await publish_many(topic, producer, count)]
    await wait_for(lambda: len(sink.received) == count)
    subscription = topic.subscriptions["sub"]
    for round_ in range(times):
        subscription.redeliver(consumer, positions[:2])
        await wait_for(lambda r=round_: len(sink.received) == count + 2 * (r + 1))
    assert [subscription.redelivery_count(p) for p in positions] == [times, times, 0]
    cursor = subscription.cursor
    await wait_for(lambda: not cursor.writes_pending)
    return positions


def _record(env: BrokerEnv) -> dict[str, object]:
    raw = env.storage.metadata.get(cursor_key("public/default/persistent/redelivered", "sub"))
    assert raw is not None
    decoded: dict[str, object] = json.loads(raw)
    return decoded


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash"])
async def test_counts_survive_a_restart(tmp_path: Path, crash: bool) -> None:
    async with broker_env(tmp_path) as env:
        positions = await _nack_times(env, 3)
        assert _record(env)["redel"] == [[*positions[0], 3], [*positions[1], 3]]
        service = await (env.crash() if crash else env.restart())
        sink = RecordingSink()
        await _consumer(service, sink)
        await wait_for(lambda: len(sink.received) == 3)
        assert [(r.ledger_id, r.entry_id, r.redelivery_count) for r in sink.received] == [
            (*positions[0], 3), (*positions[1], 3), (*positions[2], 0)]


async def test_acks_clear_counts_in_memory_and_on_disk(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        positions = await _nack_times(env, 1)
        topic = env.service.topics[TOPIC]
        assert isinstance(topic, PersistentTopic)
        subscription = topic.subscriptions["sub"]
        consumer = subscription.consumers[0]
        await subscription.acknowledge(consumer, INDIVIDUAL, [(*positions[0], None)])
        assert subscription.redelivery_count(positions[0]) == 0
        assert _record(env)["redel"] == [[*positions[1], 1]]
        await subscription.acknowledge(consumer, INDIVIDUAL, [(*positions[1], None)])
        assert _record(env)["redel"] == []


async def test_only_the_lowest_counts_are_persisted(tmp_path: Path) -> None:
    async with broker_env(tmp_path, managed_ledger_max_redelivery_counts_to_persist=1,
                          ) as env:
        positions = await _nack_times(env, 2)
        assert _record(env)["redel"] == [[*positions[0], 2]]
        service = await env.crash()
        sink = RecordingSink()
        await _consumer(service, sink)
        await wait_for(lambda: len(sink.received) == 3)
        assert [r.redelivery_count for r in sink.received] == [2, 0, 0]  # beyond: lost


def test_record_bound_and_malformed_input() -> None:
    counts = RedeliveryCounts(persist_max=2, memory_max=3)
    for ledger_id, entry_id in [(1, 5), (1, 1), (1, 3), (1, 1)]:
        assert counts.increment(Position(ledger_id, entry_id))
    assert not counts.increment(Position(1, 9))  # memory full: not counted
    assert counts.get(Position(1, 9)) == 0
    assert counts.to_record(lambda p: False) == [[1, 1, 2], [1, 3, 1]]
    assert counts.to_record(lambda p: p == Position(1, 1)) == [[1, 3, 1], [1, 5, 1]]
    restored = RedeliveryCounts()
    restored.restore([[1, 1, 2], [1, 3, 1]], lambda p: p != Position(1, 3))
    assert (restored.get(Position(1, 1)), restored.get(Position(1, 3))) == (2, 0)
    with pytest.raises(ValueError, match="bad redelivery count"):
        restored.restore([[1, 1]], lambda p: True)
    assert restored.get(Position(1, 1)) == 2  # nothing loaded from the bad record


async def test_last_consumer_leaving_resets_counts_but_unload_keeps_them(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        positions = await _nack_times(env, 2)
        assert await env.service.unload_topic(TOPIC)  # consumers closed by the broker
        sink = RecordingSink()
        topic, consumer = await _consumer(env.service, sink)
        await wait_for(lambda: len(sink.received) == 3)
        assert [r.redelivery_count for r in sink.received] == [2, 2, 0]
        subscription = topic.subscriptions["sub"]
        topic.consumer_closed(subscription, consumer)
        assert subscription.redelivery_count(positions[0]) == 0
        await wait_for(lambda: not subscription.cursor.writes_pending)
        assert _record(env)["redel"] == []
