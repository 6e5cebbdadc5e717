"""Shared subscriptions (and the ack paths they share with Exclusive) through the in-process
BrokerService (broker reference §3.3-§3.5, §4.3-§4.5; §11 items 21, 26, 29, 31): priority
round robin, the round-robin cap, redelivery on disconnect / nack / redeliver-all with the
redelivery count, the unacked-message limits, cumulative acks ignored, batch-index acks
with ack sets, and acknowledgements that survive a clean restart and a crash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from magnetar.broker import BrokerService, Consumer, PersistentTopic, Position, SubscribeSpec
from magnetar.broker.dispatch._dispatch_shared import SharedDispatcher
from magnetar.broker.http._stats import topic_stats
from magnetar.broker.ledger._position import int_to_ack_set
from tests.broker.helpers import (
    BrokerEnv,
    Received,
    RecordingSink,
    broker_env,
    persistent_producer,
    publish,
    publish_batch,
    publish_many,
    settle,
    wait_for,
)

TOPIC = "persistent://public/default/shared-topic"
INDIVIDUAL = 0
CUMULATIVE = 1


async def _subscribe(service: BrokerService, sink: RecordingSink, name: str, *,
                     sub_type: str = "Shared", priority: int = 0, topic: str = TOPIC,
                     ) -> tuple[PersistentTopic, Consumer]:
    loaded, consumer = await service.subscribe(
        topic, SubscribeSpec("sub", sub_type, name, initial_position="earliest",
                             priority_level=priority), sink)
    assert isinstance(loaded, PersistentTopic)
    return loaded, consumer


def _received(sink: RecordingSink, count: int) -> Callable[[], bool]:
    return lambda: len(sink.received) == count


def _dispatcher(topic: PersistentTopic) -> SharedDispatcher:
    dispatcher = topic.subscriptions["sub"].dispatcher
    assert isinstance(dispatcher, SharedDispatcher)
    return dispatcher


def _ack_set(batch_size: int, unacked: set[int]) -> list[int]:
    """The wire ack set of a batch: bit i set = index i still unacknowledged."""
    return int_to_ack_set(sum(1 << i for i in unacked if i < batch_size))


def _unacked_indexes(received: Received) -> set[int]:
    """The indexes a client would hand to the application (all without an ack set)."""
    if received.ack_set is None:
        return set(range(received.batch_size))
    mask = 0
    for index, word in enumerate(received.ack_set):
        mask |= (word & (2**64 - 1)) << (64 * index)
    return {i for i in range(received.batch_size) if mask >> i & 1}


# -- round robin (§3.3, item 21) ---------------------------------------------------------


async def test_priority_round_robin_order(tmp_path: Path) -> None:
    """C1(p0, 2 permits), C2(p0, 1), C3(p0, 1), C4(p1, 2), C5(p1, 1), one message at a time:
    C1, C2, C3, C1, C4, C5, C4; a permit back on the higher level wins at once."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        consumers = {}
        for name, priority, permits in (("C1", 0, 2), ("C2", 0, 1), ("C3", 0, 1),
                                        ("C4", 1, 2), ("C5", 1, 1)):
            _, consumer = await _subscribe(service, sink, name, priority=priority)
            topic.subscriptions["sub"].flow(consumer, permits)
            consumers[name] = consumer
        for index in range(7):
            await publish(topic, producer, f"m{index}".encode())
            await wait_for(_received(sink, index + 1))
        assert [r.consumer.consumer_name for r in sink.received] == [
            "C1", "C2", "C3", "C1", "C4", "C5", "C4"]
        topic.subscriptions["sub"].flow(consumers["C2"], 1)
        topic.subscriptions["sub"].flow(consumers["C5"], 1)
        await publish(topic, producer, b"m7")
        await wait_for(lambda: len(sink.received) == 8)
        assert sink.received[-1].consumer is consumers["C2"]


async def test_round_robin_cap_per_turn(tmp_path: Path) -> None:
    """One read of 30 entries, two consumers with plenty of permits: turns of at most
    `dispatcher_max_round_robin_batch_size` entries (#24092)."""
    async with broker_env(tmp_path, dispatcher_max_round_robin_batch_size=5) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        positions = await publish_many(topic, producer, 30)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        _, c2 = await _subscribe(service, sink, "c2")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)  # both before the loop runs a round
        subscription.flow(c2, 1000)
        await wait_for(lambda: len(sink.received) == 30)
        turns = [(consumer.consumer_name, len(deliveries))
                 for kind, consumer, deliveries in _delivery_calls(sink)]
        assert turns == [("c1", 5), ("c2", 5)] * 3
        assert sink.positions(c1) == positions[0:5] + positions[10:15] + positions[20:25]
        assert sink.positions(c2) == positions[5:10] + positions[15:20] + positions[25:30]


def _delivery_calls(sink: RecordingSink) -> list[tuple[str, Consumer, list[Received]]]:
    """Consecutive deliveries to one consumer grouped as one turn."""
    calls: list[tuple[str, Consumer, list[Received]]] = []
    for kind, consumer, payload in sink.events:
        if kind != "deliver":
            continue
        assert isinstance(payload, Received)
        if calls and calls[-1][1] is consumer:
            calls[-1][2].append(payload)
        else:
            calls.append((kind, consumer, [payload]))
    return calls


# -- redelivery (§3.4, item 26) ----------------------------------------------------------


async def test_disconnect_hands_unacked_to_the_others_without_counting(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        _, c2 = await _subscribe(service, sink, "c2")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 5)
        subscription.flow(c2, 1000)
        positions = await publish_many(topic, producer, 10)
        await wait_for(lambda: len(sink.received) == 10)
        held_by_c1 = sink.positions(c1)
        assert len(held_by_c1) == 5
        await subscription.acknowledge(c1, INDIVIDUAL, [(*held_by_c1[0], None)])
        c2_before = len(sink.of(c2))
        topic.consumer_closed(subscription, c1)
        await wait_for(lambda: len(sink.of(c2)) == c2_before + 4)
        again = sink.of(c2)[c2_before:]
        assert [(r.ledger_id, r.entry_id) for r in again] == held_by_c1[1:]
        assert [r.redelivery_count for r in again] == [0, 0, 0, 0]
        assert c2.unacked_messages == 9
        assert _dispatcher(topic).total_unacked == 9
        assert set(sink.positions(c2)) == set(positions) - {held_by_c1[0]}


async def test_nack_and_redeliver_all_raise_the_redelivery_count(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        _, c2 = await _subscribe(service, sink, "c2")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)
        positions = await publish_many(topic, producer, 5)
        await wait_for(lambda: len(sink.of(c1)) == 5)
        subscription.redeliver(c2, [positions[0]])  # not c2's: ignored
        subscription.redeliver(c1, [positions[1], positions[3]])
        await wait_for(lambda: len(sink.of(c1)) == 7)
        assert [(r.ledger_id, r.entry_id, r.redelivery_count)
                for r in sink.of(c1)[5:]] == [(*positions[1], 1), (*positions[3], 1)]
        subscription.redeliver(c1, None)
        await wait_for(lambda: len(sink.of(c1)) == 12)
        await settle(service)
        assert [(r.ledger_id, r.entry_id, r.redelivery_count)
                for r in sink.of(c1)[7:]] == [
            (*positions[0], 1), (*positions[1], 2), (*positions[2], 1),
            (*positions[3], 2), (*positions[4], 1)]
        assert sink.of(c2) == []
        assert c1.unacked_messages == 5
        await subscription.acknowledge(c1, INDIVIDUAL, [(*p, None) for p in positions])
        assert c1.unacked_messages == 0
        assert subscription.backlog() == 0
        assert subscription.redelivery_count(Position(*positions[1])) == 0  # cleared


async def test_last_consumer_gone_then_everything_unacked_again_from_the_mark_delete(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)
        positions = await publish_many(topic, producer, 5)
        await wait_for(lambda: len(sink.received) == 5)
        subscription.redeliver(c1, [positions[4]])
        await wait_for(lambda: len(sink.received) == 6)
        await subscription.acknowledge(c1, INDIVIDUAL, [(*positions[1], None),
                                                        (*positions[3], None)])
        topic.consumer_closed(subscription, c1)
        assert _dispatcher(topic).replay == set()
        _, c2 = await _subscribe(service, sink, "c2")
        subscription.flow(c2, 1000)
        await wait_for(lambda: len(sink.of(c2)) == 3)
        await settle(service)
        assert sink.bodies(c2) == [b"m0", b"m2", b"m4"]
        assert [r.redelivery_count for r in sink.of(c2)] == [0, 0, 0]  # counts dropped


async def test_acks_are_credited_to_the_consumer_holding_the_entry(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        _, c2 = await _subscribe(service, sink, "c2")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)
        single = await publish(topic, producer, b"one")
        batch = await publish_batch(topic, producer, [b"a", b"b", b"c", b"d"])
        await wait_for(lambda: len(sink.of(c1)) == 2)
        assert c1.unacked_messages == 5
        await subscription.acknowledge(c2, INDIVIDUAL, [(*single, None)])
        assert c1.unacked_messages == 4
        await subscription.acknowledge(c2, INDIVIDUAL, [(*batch, _ack_set(4, {1, 2, 3}))])
        assert c1.unacked_messages == 3
        assert c2.unacked_messages == 0
        await subscription.acknowledge(c2, INDIVIDUAL, [(*batch, None)])
        assert c1.unacked_messages == 0
        assert _dispatcher(topic).total_unacked == 0
        assert subscription.backlog() == 0


# -- unacked limits (§3.5) ---------------------------------------------------------------


async def test_consumer_blocked_at_max_unacked_and_unblocked_at_half(tmp_path: Path) -> None:
    async with broker_env(tmp_path, max_unacked_messages_per_consumer=10) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        await publish_many(topic, producer, 30)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)
        await wait_for(lambda: len(sink.received) == 10)
        await settle(service)
        assert len(sink.received) == 10
        assert c1.blocked_on_unacked
        stats = topic_stats(topic)["subscriptions"]["sub"]["consumers"][0]
        assert stats["blockedConsumerOnUnackedMsgs"] is True
        assert stats["unackedMessages"] == 10
        first = sink.positions(c1)
        await subscription.acknowledge(c1, INDIVIDUAL, [(*p, None) for p in first[:4]])
        await settle(service)
        assert len(sink.received) == 10  # 6 unacked > 10 / 2
        assert c1.blocked_on_unacked
        await subscription.acknowledge(c1, INDIVIDUAL, [(*first[4], None)])
        await wait_for(lambda: len(sink.received) == 15)  # 5 ≤ 5: room for 5 more
        await settle(service)
        assert len(sink.received) == 15
        assert c1.unacked_messages == 10
        assert c1.blocked_on_unacked


async def test_subscription_blocked_at_max_unacked_until_below_half(tmp_path: Path) -> None:
    async with broker_env(tmp_path, max_unacked_messages_per_subscription=10) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        _, c2 = await _subscribe(service, sink, "c2")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)
        subscription.flow(c2, 1000)
        for index in range(10):
            await publish(topic, producer, f"m{index}".encode())
            await wait_for(_received(sink, index + 1))
        assert _dispatcher(topic).blocked_on_unacked
        assert topic_stats(topic)["subscriptions"]["sub"][
            "blockedSubscriptionOnUnackedMsgs"] is True
        await publish(topic, producer, b"held")
        await settle(service)
        assert len(sink.received) == 10
        delivered = sink.positions()
        await subscription.acknowledge(c1, INDIVIDUAL, [(*p, None) for p in delivered[:5]])
        await settle(service)
        assert len(sink.received) == 10  # 5 unacked: not below 10 / 2
        await subscription.acknowledge(c1, INDIVIDUAL, [(*delivered[5], None)])
        await wait_for(lambda: len(sink.received) == 11)
        assert sink.received[-1].body == b"held"
        assert not _dispatcher(topic).blocked_on_unacked


# -- acks (§3.1, §4.3, §4.4, items 29-31) ------------------------------------------------


async def test_cumulative_ack_is_ignored_on_shared(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)
        positions = await publish_many(topic, producer, 5)
        await wait_for(lambda: len(sink.received) == 5)
        await subscription.acknowledge(c1, CUMULATIVE, [(*positions[4], None)])
        assert subscription.backlog() == 5
        assert subscription.cursor.mark_delete_position < positions[0]
        assert c1.unacked_messages == 5


async def test_shared_batch_index_acks_redeliver_exactly_the_nacked_indexes(tmp_path: Path) -> None:
    """`BatchMessageIndexAckTest` (Shared): 10 batches of 10; ack the even messages, nack the
    odd ones → exactly the 50 odd ones come back (ack sets mark the acked indexes); once all
    are acked the mark-delete is the last batch, and permits still work."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 150)
        positions = [await publish_batch(topic, producer,
                                         [f"m{b * 10 + i}".encode() for i in range(10)])
                     for b in range(10)]
        await wait_for(lambda: len(sink.received) == 10)
        assert c1.unacked_messages == 100
        evens, odds = set(range(0, 10, 2)), set(range(1, 10, 2))
        for position in positions:
            for index in sorted(evens):
                await subscription.acknowledge(
                    c1, INDIVIDUAL, [(*position, _ack_set(10, set(range(10)) - {index}))])
        assert c1.unacked_messages == 50
        assert subscription.backlog() == 10
        # The nacks of the odd messages, in two goes: only unacked indexes are uncounted.
        subscription.redeliver(c1, positions[:5])
        await wait_for(lambda: len(sink.received) == 15)
        assert c1.unacked_messages == 50
        subscription.redeliver(c1, positions[5:])
        await wait_for(lambda: len(sink.received) == 20)
        again = sink.received[10:]
        assert [(r.ledger_id, r.entry_id) for r in again] == positions
        assert all(_unacked_indexes(r) == odds for r in again)
        assert all(r.redelivery_count == 1 for r in again)
        visible = [body for r in again for i, body in enumerate(r.bodies)
                   if i in _unacked_indexes(r)]
        assert visible == [f"m{n}".encode() for n in range(100) if n % 2 == 1]
        assert c1.unacked_messages == 50
        assert c1.permits == 0  # 100 + 50 messages charged
        for number, position in enumerate(positions):
            for index in sorted(odds):
                await subscription.acknowledge(
                    c1, INDIVIDUAL, [(*position, _ack_set(10, set(range(10)) - {index}))])
            assert c1.unacked_messages == 50 - 5 * (number + 1)
        assert subscription.cursor.mark_delete_position == positions[-1]
        assert subscription.backlog() == 0
        after = await publish(topic, producer, b"new")
        await settle(service)
        assert len(sink.received) == 20
        subscription.flow(c1, 1)
        await wait_for(lambda: len(sink.received) == 21)
        assert sink.positions()[-1] == after


async def test_exclusive_cumulative_batch_index_ack_then_new_consumer_gets_the_other_50(
        tmp_path: Path) -> None:
    """Cumulative ack at message 49 of 100 (batches of 20: index 9 of the third batch) → a new
    consumer receives exactly the 50 others."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, c1 = await _subscribe(service, sink, "c1", sub_type="Exclusive")
        subscription = topic.subscriptions["sub"]
        subscription.flow(c1, 1000)
        positions = [await publish_batch(topic, producer,
                                         [f"m{b * 20 + i}".encode() for i in range(20)])
                     for b in range(5)]
        await wait_for(lambda: len(sink.of(c1)) == 5)
        await subscription.acknowledge(c1, CUMULATIVE,
                                       [(*positions[2], _ack_set(20, set(range(10, 20))))])
        topic.consumer_closed(subscription, c1)
        _, c2 = await _subscribe(service, sink, "c2", sub_type="Exclusive")
        subscription.flow(c2, 1000)
        await wait_for(lambda: len(sink.of(c2)) == 3)
        await settle(service)
        visible = [body for r in sink.of(c2) for i, body in enumerate(r.bodies)
                   if i in _unacked_indexes(r)]
        assert visible == [f"m{n}".encode() for n in range(50, 100)]
        assert c2.permits == 1000 - 50


async def _ack_some_then(env: BrokerEnv, reopen: str) -> list[bytes]:
    """`testOutOfOrderDeletePersistence` through the service: 20 messages, acks of 2, 5, 7,
    8 and 9, then a clean restart or a crash; returns what a new consumer receives."""
    service = env.service
    topic, producer = await persistent_producer(service, TOPIC)
    sink = RecordingSink()
    _, c1 = await _subscribe(service, sink, "c1")
    subscription = topic.subscriptions["sub"]
    subscription.flow(c1, 1000)
    positions = await publish_many(topic, producer, 20)
    await wait_for(lambda: len(sink.received) == 20)
    await subscription.acknowledge(c1, INDIVIDUAL, [(*positions[i], None)
                                                    for i in (2, 5, 7, 8, 9)])
    service = await (env.restart() if reopen == "restart" else env.crash())
    reloaded = await service.get_topic(TOPIC)
    assert isinstance(reloaded, PersistentTopic)
    assert reloaded.subscriptions["sub"].backlog() == 15
    after = RecordingSink()
    _, c2 = await _subscribe(service, after, "c2")
    reloaded.subscriptions["sub"].flow(c2, 1000)
    await wait_for(lambda: len(after.received) == 15)
    await settle(service)
    return after.bodies(c2)


async def test_acks_survive_a_clean_restart(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        received = await _ack_some_then(env, "restart")
        assert received == [f"m{i}".encode() for i in range(20)
                            if i not in (2, 5, 7, 8, 9)]


async def test_acks_survive_a_crash(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        received = await _ack_some_then(env, "crash")
        assert received == [f"m{i}".encode() for i in range(20)
                            if i not in (2, 5, 7, 8, 9)]
