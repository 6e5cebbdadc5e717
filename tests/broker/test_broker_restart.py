"""The broker's durable state across a clean restart and a crash (`Storage.abandon()`: the
kill -9 model, nothing more reaches the disk), end to end through `BrokerService`.

The durability contract (DESIGN.md): a publish or an ack that returned has been fsynced. So
after a crash every returned publish is readable, every returned ack holds (only unacked
messages come back, for every subscription type), each subscription's cursor is its own,
and a topic whose data spans several ledgers recovers them, starts a new ledger for writes
and reports the right backlog."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.broker import Consumer, PersistentTopic, Position, ProducerSpec, SubscribeSpec
from magnetar.broker.topics._service import BrokerService

from .helpers import BrokerEnv, RecordingSink, broker_env, make_entry, settle, wait_for

TOPIC = "persistent://public/default/durable"
SUB_TYPES = ["Exclusive", "Failover", "Shared", "Key_Shared"]
ACK_INDIVIDUAL = 0
ACK_CUMULATIVE = 1


async def _topic(service: BrokerService) -> PersistentTopic:
    topic = await service.get_topic(TOPIC)
    assert isinstance(topic, PersistentTopic)
    return topic


async def _publish(service: BrokerService, count: int, start: int = 0) -> list[Position]:
    """Publish m<start>..m<start+count-1> with keys k0..k4 (concurrently: they are all in
    flight together and complete in order)."""
    topic = await _topic(service)
    producer = topic.producers.get("p1") or topic.add_producer(ProducerSpec("p1"))

    async def one(i: int) -> Position:
        metadata, entry = make_entry(f"m{i}".encode(), partition_key=f"k{i % 5}",
                                     sequence_id=i, producer_name="p1")
        result = await topic.publish(producer, entry, i, i, metadata)
        return Position(result.ledger_id, result.entry_id)

    positions = list(await asyncio.gather(*(one(i) for i in range(start, start + count))))
    assert positions == sorted(positions)
    return positions


async def _consume(service: BrokerService, sub_type: str, sink: RecordingSink,
                   subscription: str = "sub", consumer_name: str = "c1") -> Consumer:
    topic, consumer = await service.subscribe(
        TOPIC, SubscribeSpec(subscription, sub_type, consumer_name, initial_position="earliest"),
        sink)
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions[subscription].flow(consumer, 10_000)
    return consumer


async def _receive_all(service: BrokerService, sink: RecordingSink, consumer: Consumer,
                       count: int) -> list[bytes]:
    await wait_for(lambda: len(sink.of(consumer)) >= count)
    await settle(service)
    return sink.bodies(consumer)


def _bodies(indexes: list[int] | range) -> list[bytes]:
    return [f"m{i}".encode() for i in indexes]


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "restart"])
@pytest.mark.parametrize("sub_type", SUB_TYPES)
async def test_returned_acks_survive_and_only_unacked_messages_come_back(
        tmp_path: Path, sub_type: str, crash: bool) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        sink = RecordingSink()
        consumer = await _consume(service, sub_type, sink)
        positions = await _publish(service, 20)
        assert sorted(await _receive_all(service, sink, consumer, 20)) == sorted(
            _bodies(range(20)))
        subscription = (await _topic(service)).subscriptions["sub"]
        acked = {0, 1, 2, 3, 4, 5, 8, 11, 12, 17}
        if sub_type in ("Exclusive", "Failover"):
            await subscription.acknowledge(consumer, ACK_CUMULATIVE,
                                           [(*positions[5], None)])
            rest = sorted(acked - set(range(6)))
        else:
            rest = sorted(acked)
        await subscription.acknowledge(consumer, ACK_INDIVIDUAL,
                                       [(*positions[i], None) for i in rest])
        assert subscription.backlog() == 10

        service = await (env.crash() if crash else env.restart())
        topic = await _topic(service)
        assert topic.subscriptions["sub"].backlog() == 10
        sink = RecordingSink()
        consumer = await _consume(service, sub_type, sink)
        unacked = [i for i in range(20) if i not in acked]
        received = await _receive_all(service, sink, consumer, len(unacked))
        assert sorted(received) == sorted(_bodies(unacked))
        assert len(received) == len(unacked)  # nothing twice, nothing acked


async def test_every_returned_publish_is_readable_after_a_crash(tmp_path: Path) -> None:
    async with broker_env(tmp_path, managed_ledger_max_entries_per_ledger=40,
                          managed_ledger_min_ledger_rollover_time_s=0) as env:
        topic = await _topic(env.service)
        await topic.create_subscription("sub", "earliest")
        positions = await _publish(env.service, 150)
        assert len({p.ledger_id for p in positions}) == 4

        service = await env.crash()
        topic = await _topic(service)
        assert topic.managed_ledger.number_of_entries == 150
        assert topic.subscriptions["sub"].backlog() == 150
        sink = RecordingSink()
        consumer = await _consume(service, "Exclusive", sink)
        assert await _receive_all(service, sink, consumer, 150) == _bodies(range(150))
        assert sink.positions(consumer) == [tuple(p) for p in positions]


async def test_cursors_of_several_subscriptions_are_independent(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic = await _topic(env.service)
        for name in ("a", "b", "c"):
            await topic.create_subscription(name, "earliest")
        positions = await _publish(env.service, 12)
        subscriptions = topic.subscriptions
        await subscriptions["a"].acknowledge(None, ACK_INDIVIDUAL, [
            (*p, None) for p in positions[:6]])
        await subscriptions["b"].acknowledge(None, ACK_INDIVIDUAL, [
            (*p, None) for p in positions[1::2]])
        # "c" acknowledges nothing.

        service = await env.crash()
        topic = await _topic(service)
        expected = {"a": list(range(6, 12)), "b": list(range(0, 12, 2)),
                    "c": list(range(12))}
        assert {n: s.backlog() for n, s in topic.subscriptions.items()} == {
            n: len(v) for n, v in expected.items()}
        for name, unacked in expected.items():
            sink = RecordingSink()
            consumer = await _consume(service, "Exclusive", sink, subscription=name)
            assert await _receive_all(service, sink, consumer, len(unacked)) == _bodies(
                unacked), name


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "restart"])
async def test_topic_spanning_three_ledgers_recovers_with_a_new_ledger(tmp_path: Path,
                                                                 crash: bool) -> None:
    async with broker_env(tmp_path, managed_ledger_max_entries_per_ledger=5,
                          managed_ledger_min_ledger_rollover_time_s=0) as env:
        topic = await _topic(env.service)
        await topic.create_subscription("sub", "earliest")
        positions = await _publish(env.service, 13)
        ledgers = sorted({p.ledger_id for p in positions})
        assert len(ledgers) == 3
        await topic.subscriptions["sub"].acknowledge(None, ACK_INDIVIDUAL, [
            (*p, None) for p in positions[:3] + positions[9:11]])
        before = [ledger.ledger_id for ledger in topic.managed_ledger.ledgers()]
        assert before == ledgers  # the third ledger is the open one

        service = await _reopen(env, crash)
        topic = await _topic(service)
        after = topic.managed_ledger.ledgers()
        assert [ledger.ledger_id for ledger in after[:3]] == ledgers
        assert [ledger.entries for ledger in after[:3]] == [5, 5, 3]
        assert len(after) == 4
        assert after[3].ledger_id > ledgers[-1]
        assert after[3].entries == 0  # a new ledger for writes
        assert topic.managed_ledger.last_confirmed_position == positions[-1]
        assert topic.subscriptions["sub"].backlog() == 8

        more = await _publish(service, 2, start=13)
        assert {p.ledger_id for p in more} == {after[3].ledger_id}
        sink = RecordingSink()
        consumer = await _consume(service, "Shared", sink)
        unacked = [i for i in range(15) if i not in (0, 1, 2, 9, 10)]
        assert sorted(await _receive_all(service, sink, consumer, 10)) == sorted(
            _bodies(unacked))


async def _reopen(env: BrokerEnv, crash: bool) -> BrokerService:
    return await (env.crash() if crash else env.restart())


async def test_repeated_crashes_lose_nothing_acknowledged(tmp_path: Path) -> None:
    """Publish, ack part, crash; five times over: the backlog and the redelivered set follow
    exactly what returned before each crash."""

    async with broker_env(tmp_path, managed_ledger_max_entries_per_ledger=7,
                          managed_ledger_min_ledger_rollover_time_s=0) as env:
        service = env.service
        topic = await _topic(service)
        await topic.create_subscription("sub", "earliest")
        positions: list[Position] = []
        acked: set[int] = set()
        for round_ in range(5):
            positions += await _publish(service, 10, start=len(positions))
            topic = await _topic(service)
            chosen = [i for i in range(len(positions)) if i not in acked and i % 3 != 1]
            chosen = chosen[: 4 + round_]
            await topic.subscriptions["sub"].acknowledge(None, ACK_INDIVIDUAL, [
                (*positions[i], None) for i in chosen])
            acked.update(chosen)
            service = await env.crash()
            topic = await _topic(service)
            assert topic.subscriptions["sub"].backlog() == len(positions) - len(acked)
        sink = RecordingSink()
        consumer = await _consume(service, "Exclusive", sink)
        unacked = [i for i in range(len(positions)) if i not in acked]
        assert await _receive_all(service, sink, consumer, len(unacked)) == _bodies(unacked)


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "restart"])
async def test_crash_right_after_a_rollover(tmp_path: Path, crash: bool) -> None:
    """The last ledger filled up and a new (empty) one was started just before the stop."""

    async with broker_env(tmp_path, managed_ledger_max_entries_per_ledger=5,
                          managed_ledger_min_ledger_rollover_time_s=0) as env:
        topic = await _topic(env.service)
        await topic.create_subscription("sub", "earliest")
        positions = await _publish(env.service, 10)
        ledgers = sorted({p.ledger_id for p in positions})
        assert len(topic.managed_ledger.ledgers()) == 3  # two full, one empty

        service = await _reopen(env, crash)
        topic = await _topic(service)
        after = topic.managed_ledger.ledgers()
        assert [ledger.ledger_id for ledger in after[:2]] == ledgers
        assert [ledger.entries for ledger in after] == [5, 5, 0]
        assert topic.subscriptions["sub"].backlog() == 10
        more = await _publish(service, 1, start=10)
        assert more[0].ledger_id == after[2].ledger_id


async def test_unsubscribe_and_new_subscriptions_survive_a_crash(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic = await _topic(env.service)
        await topic.create_subscription("gone", "earliest")
        await _publish(env.service, 3)
        await topic.create_subscription("late", "latest")
        await topic.create_subscription("early", "earliest", {"tag1": "1"})
        await topic.unsubscribe("gone")

        service = await env.crash()
        topic = await _topic(service)
        assert set(topic.subscriptions) == {"late", "early"}
        assert topic.subscriptions["late"].backlog() == 0
        assert topic.subscriptions["early"].backlog() == 3
        assert topic.subscriptions["early"].cursor.cursor_properties == {"tag1": "1"}
