"""Non-persistent topics through the in-process BrokerService (broker reference §3.7): a
message goes at once to a consumer that has permits, or is dropped and counted
(msgDropCounter); ids are (0, 0); Shared round robin; Exclusive and Failover use the
active consumer; nothing is stored or redelivered."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.broker import BrokerService, Consumer, ProducerSpec, SubscribeSpec
from magnetar.broker._errors import ConsumerBusyError
from magnetar.broker.dispatch._dispatcher import failover_ring_choice
from magnetar.broker.dispatch._nonpersistent import NonPersistentSubscription
from magnetar.broker.http._stats import topic_stats
from magnetar.broker.topics._nonpersistent_topic import NonPersistentTopic
from magnetar.broker.topics._producer import Producer
from tests.broker.helpers import RecordingSink, broker_env, publish, publish_batch

TOPIC = "non-persistent://public/default/live"


async def _producer(service: BrokerService) -> tuple[NonPersistentTopic, Producer]:
    topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
    assert isinstance(topic, NonPersistentTopic)
    return topic, producer


async def _subscribe(service: BrokerService, sink: RecordingSink, name: str, sub_type: str,
                     permits: int, subscription: str = "sub") -> Consumer:
    topic, consumer = await service.subscribe(TOPIC, SubscribeSpec(subscription, sub_type, name),
                                              sink)
    assert isinstance(topic, NonPersistentTopic)
    _subscription(topic, subscription).flow(consumer, permits)
    return consumer


def _subscription(topic: NonPersistentTopic, name: str = "sub") -> NonPersistentSubscription:
    return topic.subscriptions[name]


async def test_delivered_with_permits_dropped_without(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await _producer(service)
        assert await publish(topic, producer, b"nobody") == (0, 0)  # no subscription
        sink = RecordingSink()
        consumer = await _subscribe(service, sink, "c1", "Exclusive", 2)
        # Delivery is synchronous with the publish: no waiting needed.
        assert await publish(topic, producer, b"m0") == (0, 0)
        assert await publish(topic, producer, b"m1") == (0, 0)
        assert await publish(topic, producer, b"m2") == (0, 0)  # no permit left
        assert sink.bodies(consumer) == [b"m0", b"m1"]
        assert {(r.ledger_id, r.entry_id) for r in sink.received} == {(0, 0)}
        assert consumer.permits == 0
        stats = topic_stats(topic)
        assert stats["msgDropCounter"] == 1
        assert stats["subscriptions"]["sub"]["msgDropCounter"] == 1
        assert stats["msgInCounter"] == 4
        assert stats["msgOutCounter"] == 2
        # Nothing was kept: new permits do not bring m2 back.
        _subscription(topic).flow(consumer, 5)
        assert await publish(topic, producer, b"m3") == (0, 0)
        assert sink.bodies(consumer) == [b"m0", b"m1", b"m3"]


async def test_every_subscription_gets_its_own_copy(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await _producer(service)
        sink = RecordingSink()
        a = await _subscribe(service, sink, "a", "Exclusive", 10, subscription="sub-a")
        b = await _subscribe(service, sink, "b", "Shared", 0, subscription="sub-b")
        await publish(topic, producer, b"x")
        assert sink.bodies(a) == [b"x"]
        assert sink.bodies(b) == []
        stats = topic_stats(topic)
        assert stats["subscriptions"]["sub-a"]["msgDropCounter"] == 0
        assert stats["subscriptions"]["sub-b"]["msgDropCounter"] == 1
        assert stats["msgDropCounter"] == 1


async def test_shared_round_robin_over_consumers_with_permits(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await _producer(service)
        sink = RecordingSink()
        c1 = await _subscribe(service, sink, "c1", "Shared", 100)
        c2 = await _subscribe(service, sink, "c2", "Shared", 2)
        c3 = await _subscribe(service, sink, "c3", "Shared", 100)
        for index in range(9):
            await publish(topic, producer, f"m{index}".encode())
        assert [r.consumer for r in sink.received] == [c1, c2, c3, c1, c2, c3, c1, c3, c1]
        assert topic_stats(topic)["msgDropCounter"] == 0


async def test_a_batch_counts_its_messages(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await _producer(service)
        sink = RecordingSink()
        consumer = await _subscribe(service, sink, "c1", "Shared", 1)
        await publish_batch(topic, producer, [b"a", b"b", b"c"])
        assert sink.messages(consumer) == [b"a", b"b", b"c"]
        assert consumer.permits == -2
        await publish_batch(topic, producer, [b"d", b"e"])
        assert topic_stats(topic)["msgDropCounter"] == 2
        assert topic_stats(topic)["msgInCounter"] == 5


async def test_exclusive_and_type_rules(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await _producer(service)
        sink = RecordingSink()
        first = await _subscribe(service, sink, "c1", "Exclusive", 10)
        with pytest.raises(ConsumerBusyError, match="Exclusive consumer is already"):
            await _subscribe(service, sink, "c2", "Exclusive", 10)
        with pytest.raises(ConsumerBusyError, match="Subscription is of different type"):
            await _subscribe(service, sink, "c3", "Shared", 10)
        await publish(topic, producer, b"m0")
        assert sink.bodies(first) == [b"m0"]
        topic.consumer_closed(_subscription(topic), first)
        assert "sub" not in topic.subscriptions  # in-memory only: gone with its consumers
        shared = await _subscribe(service, sink, "c4", "Shared", 10)
        await publish(topic, producer, b"m1")
        assert sink.bodies(shared) == [b"m1"]


async def test_failover_delivers_to_the_ring_choice(tmp_path: Path) -> None:
    """On `non-persistent://public/default/live` the active consumer follows the same ring as
    persistent topics; only it receives."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await _producer(service)
        sink = RecordingSink()
        consumers = [await _subscribe(service, sink, name, "Failover", 10)
                     for name in ("c1", "c2", "c3")]
        active = failover_ring_choice(consumers, TOPIC)
        assert active is not None
        for index in range(3):
            await publish(topic, producer, f"m{index}".encode())
        assert {r.consumer for r in sink.received} == {active}
        assert len(sink.received) == 3


async def test_failover_consumers_are_told_who_is_active(tmp_path: Path) -> None:
    """Every Failover consumer hears ACTIVE_CONSUMER_CHANGE when the active one changes: on
    join (each consumer's latest notice names the ring's choice) and when the active one
    leaves (the survivors hear the new choice); a Shared subscription hears nothing."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, _unused = await _producer(service)
        sink = RecordingSink()
        consumers = [await _subscribe(service, sink, name, "Failover", 10)
                     for name in ("c1", "c2", "c3")]
        active = failover_ring_choice(consumers, TOPIC)
        latest = dict(sink.active_changes)
        assert set(latest) == set(consumers)
        assert [c for c, is_active in latest.items() if is_active] == [active]
        assert active is not None
        sink.active_changes.clear()
        topic.consumer_closed(_subscription(topic), active)
        survivors = [c for c in consumers if c is not active]
        successor = failover_ring_choice(survivors, TOPIC)
        latest = dict(sink.active_changes)
        assert set(latest) == set(survivors)
        assert [c for c, is_active in latest.items() if is_active] == [successor]
        shared_sink = RecordingSink()
        await _subscribe(service, shared_sink, "s1", "Shared", 10, subscription="other")
        await _subscribe(service, shared_sink, "s2", "Shared", 10, subscription="other")
        assert shared_sink.active_changes == []


async def test_non_persistent_topics_are_not_stored(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await _producer(service)
        await publish(topic, producer, b"gone")
        assert service.list_topics("public/default", "NON_PERSISTENT") == [TOPIC]
        assert service.list_topics("public/default", "PERSISTENT") == []
        assert topic.last_sequence_id(producer) == -1
        service = await env.restart()
        assert service.list_topics("public/default", "ALL") == []
