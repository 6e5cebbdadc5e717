"""Delayed delivery end to end through `BrokerService` (broker reference §6, §11 items 38-39):
Shared and Key_Shared hold a message until its `deliver_at_time` (at most one tick early),
Exclusive and Failover ignore it, the maximum delay is enforced at publish, delayed messages
survive a restart, clearing the backlog clears them, and the bounded tracker loses nothing.

Timing assertions use a small tick (10 ms) and delays of a few hundred ms; "nothing before
deliver_at - tick" is checked on the recorded arrival time of every delivery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.broker import (
    Consumer,
    Delivery,
    NotAllowedError,
    PersistentTopic,
    ProducerSpec,
    SubscribeSpec,
)
from magnetar.broker.topics._service import BrokerService

from .helpers import RecordingSink, broker_env, make_entry, now_ms, publish, settle, wait_for

TOPIC = "persistent://public/default/delayed"
TICK_MS = 10
DELAY_MS = 250


class TimedSink(RecordingSink):
    """A recording sink that also notes when each delivery arrived (epoch ms)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[int] = []

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        arrived = now_ms()
        self.arrivals.extend(arrived for _ in deliveries)
        super().deliver(consumer, deliveries)


def _config(**overrides: object) -> dict[str, object]:
    settings: dict[str, object] = {"delayed_delivery_tick_time_ms": TICK_MS}
    settings.update(overrides)
    return settings


async def _subscribe(service: BrokerService, sub_type: str, sink: RecordingSink,
                     name: str = "sub", consumer_name: str = "c1",
                     ) -> tuple[PersistentTopic, Consumer]:
    topic, consumer = await service.subscribe(
        TOPIC, SubscribeSpec(name, sub_type, consumer_name, initial_position="earliest"), sink)
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions[name].flow(consumer, 1000)
    return topic, consumer


async def _wait_until(deadline_ms: int) -> None:
    """Let time pass up to an epoch-ms instant (for checks that something did not happen)."""
    await wait_for(lambda: now_ms() >= deadline_ms, timeout_s=5)


@pytest.mark.parametrize("sub_type", ["Shared", "Key_Shared"])
async def test_shared_types_hold_messages_until_deliver_at(tmp_path: Path, sub_type: str) -> None:
    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        sink = TimedSink()
        await _subscribe(service, sub_type, sink)
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + DELAY_MS
        positions = [await publish(topic, producer, f"m{i}".encode(),
                                   partition_key=f"k{i % 3}", deliver_at_ms=deliver_at)
                     for i in range(10)]
        await wait_for(lambda: len(sink.received) >= 10)
        await settle(service)
        assert len(sink.received) == 10
        assert min(sink.arrivals) >= deliver_at - TICK_MS
        if sub_type == "Shared":  # one due batch goes out in message-id order
            assert sink.positions() == positions
        else:
            assert sorted(sink.positions()) == positions


async def test_shared_delivers_delayed_messages_in_message_id_order(tmp_path: Path) -> None:
    """DelayedDeliveryTest: delayed messages on Shared arrive in strictly increasing
    message-id order (rising deliver-at times, some equal), non-delayed ones at once."""

    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        sink = TimedSink()
        await _subscribe(service, "Shared", sink)
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        base = now_ms()
        delayed = {}
        for i in range(40):
            at = base + 150 + (i // 4) * 20
            delayed[await publish(topic, producer, f"d{i}".encode(),
                                  deliver_at_ms=at)] = at
        await wait_for(lambda: len(sink.received) >= 40)
        await settle(service)
        assert len(sink.received) == 40
        assert sink.positions() == sorted(delayed)
        for position, arrived in zip(sink.positions(), sink.arrivals, strict=True):
            assert arrived >= delayed[position] - TICK_MS


async def test_non_delayed_messages_overtake_delayed_ones(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        sink = TimedSink()
        await _subscribe(service, "Shared", sink)
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + DELAY_MS
        late = await publish(topic, producer, b"late", deliver_at_ms=deliver_at)
        now = await publish(topic, producer, b"now")
        await wait_for(lambda: len(sink.received) >= 1)
        assert sink.positions() == [now]
        await wait_for(lambda: len(sink.received) >= 2)
        assert sink.positions() == [now, late]
        assert sink.arrivals[1] >= deliver_at - TICK_MS


@pytest.mark.parametrize("sub_type", ["Exclusive", "Failover"])
async def test_exclusive_and_failover_ignore_the_delay(tmp_path: Path, sub_type: str) -> None:
    """DelayedDeliveryTest: a Failover subscriber receives messages sent with deliverAfter
    5 s at once, while a Shared one on the same topic holds them."""

    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        sink, shared_sink = TimedSink(), TimedSink()
        await _subscribe(service, sub_type, sink)
        await _subscribe(service, "Shared", shared_sink, name="shared")
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + 5000
        positions = [await publish(topic, producer, f"m{i}".encode(),
                                   deliver_at_ms=deliver_at) for i in range(10)]
        await wait_for(lambda: len(sink.received) >= 10, timeout_s=3)
        await settle(service)
        assert sink.positions() == positions
        assert max(sink.arrivals) < deliver_at - TICK_MS
        assert shared_sink.received == []
        assert topic.subscriptions["shared"].backlog() == 10  # held, still backlog


async def test_delay_beyond_the_maximum_is_refused(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **_config(delayed_delivery_max_delay_ms=1000)) as env:
        topic, producer = await env.service.create_producer(TOPIC, ProducerSpec("p1"))
        assert isinstance(topic, PersistentTopic)
        published = now_ms()
        metadata, entry = make_entry(b"too late", publish_time_ms=published,
                                     deliver_at_ms=published + 1001)
        with pytest.raises(NotAllowedError,
                           match=r"^Exceeds max allowed delivery delay of 1000 milliseconds$"):
            await topic.publish(producer, entry, 0, 0, metadata)
        assert topic.managed_ledger.number_of_entries == 0
        metadata, entry = make_entry(b"just in", publish_time_ms=published,
                                     deliver_at_ms=published + 1000)
        result = await topic.publish(producer, entry, 1, 1, metadata)
        assert not result.duplicate
        assert topic.managed_ledger.number_of_entries == 1


async def test_namespace_policy_switches_delayed_delivery_off(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        service.namespaces.set_policy("public/default", "delayed_delivery_policies",
                                      {"active": False, "tickTime": TICK_MS,
                                       "maxDeliveryDelayInMillis": 0})
        sink = TimedSink()
        await _subscribe(service, "Shared", sink)
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + 5000
        await publish(topic, producer, b"m", deliver_at_ms=deliver_at)
        await wait_for(lambda: len(sink.received) == 1, timeout_s=3)
        assert sink.arrivals[0] < deliver_at - TICK_MS


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash"])
async def test_delayed_messages_survive_a_restart(tmp_path: Path, crash: bool) -> None:
    async with broker_env(tmp_path, **_config()) as env:
        sink = TimedSink()
        await _subscribe(env.service, "Shared", sink)
        topic, producer = await env.service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + 600
        positions = [await publish(topic, producer, f"m{i}".encode(),
                                   deliver_at_ms=deliver_at) for i in range(5)]
        await settle(env.service)
        assert sink.received == []

        service = await (env.crash() if crash else env.restart())
        sink = TimedSink()
        topic, _ = await _subscribe(service, "Shared", sink)
        assert topic.subscriptions["sub"].backlog() == 5
        await wait_for(lambda: len(sink.received) >= 5)
        await settle(service)
        assert sink.positions() == positions
        assert min(sink.arrivals) >= deliver_at - TICK_MS


async def test_clear_backlog_clears_the_delayed_index(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        sink = TimedSink()
        topic, _ = await _subscribe(service, "Shared", sink)
        _, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + DELAY_MS
        for i in range(5):
            await publish(topic, producer, f"m{i}".encode(), deliver_at_ms=deliver_at)
        subscription = topic.subscriptions["sub"]
        await wait_for(lambda: subscription.delayed is not None
                       and subscription.delayed.size() == 5)
        await subscription.clear_backlog()
        assert subscription.delayed is not None
        assert subscription.delayed.size() == 0
        assert subscription.backlog() == 0
        await _wait_until(deliver_at + 5 * TICK_MS)
        await settle(service)
        assert sink.received == []
        # New messages still flow.
        fresh = await publish(topic, producer, b"fresh")
        await wait_for(lambda: len(sink.received) == 1)
        assert sink.positions() == [fresh]


@pytest.mark.parametrize("sub_type", ["Shared", "Key_Shared"])
async def test_bounded_tracker_loses_nothing(tmp_path: Path, sub_type: str) -> None:
    """With room for 5 tracked messages, 20 delayed ones (and plain ones between them) all
    arrive exactly once, none before its time."""

    async with broker_env(tmp_path,
                          **_config(delayed_delivery_tracked_in_memory_max=5)) as env:
        service = env.service
        sink = TimedSink()
        topic, _ = await _subscribe(service, sub_type, sink)
        _, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        base = now_ms()
        due: dict[tuple[int, int], int] = {}
        for i in range(20):
            at = base + 100 + 10 * i
            due[await publish(topic, producer, f"d{i}".encode(), partition_key=f"k{i % 4}",
                              deliver_at_ms=at)] = at
            if i % 5 == 0:
                due[await publish(topic, producer, f"n{i}".encode(),
                                  partition_key=f"k{i % 4}")] = 0
        await wait_for(lambda: len(sink.received) >= len(due))
        await settle(service)
        assert sorted(sink.positions()) == sorted(due)  # all, exactly once
        for position, arrived in zip(sink.positions(), sink.arrivals, strict=True):
            assert arrived >= due[position] - TICK_MS
        subscription = topic.subscriptions["sub"]
        assert subscription.delayed is not None
        assert subscription.delayed.size() == 0


async def test_acked_delayed_messages_are_not_redelivered(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        sink = TimedSink()
        topic, consumer = await _subscribe(service, "Shared", sink)
        _, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + 150
        for i in range(3):
            await publish(topic, producer, f"m{i}".encode(), deliver_at_ms=deliver_at)
        await wait_for(lambda: len(sink.received) == 3)
        subscription = topic.subscriptions["sub"]
        await subscription.acknowledge(consumer, 0, [(ledger, entry, None) for ledger, entry
                                                     in sink.positions()])
        assert subscription.backlog() == 0
        topic.consumer_closed(subscription, consumer)
        sink2 = TimedSink()
        await _subscribe(service, "Shared", sink2, consumer_name="c2")
        await settle(service)
        assert sink2.received == []


async def test_delayed_index_is_rebuilt_when_consumers_come_back(tmp_path: Path) -> None:
    """The tracker is cleared when the last consumer leaves; the next consumer's reads track
    the delayed entries again, and they still wait for their time."""

    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        sink = TimedSink()
        topic, consumer = await _subscribe(service, "Shared", sink)
        _, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        deliver_at = now_ms() + 400
        positions = [await publish(topic, producer, f"m{i}".encode(),
                                   deliver_at_ms=deliver_at) for i in range(4)]
        subscription = topic.subscriptions["sub"]
        await wait_for(lambda: subscription.delayed is not None
                       and subscription.delayed.size() == 4)
        topic.consumer_closed(subscription, consumer)
        assert subscription.delayed is not None
        assert subscription.delayed.size() == 0

        sink2 = TimedSink()
        await _subscribe(service, "Shared", sink2, consumer_name="c2")
        await wait_for(lambda: subscription.delayed is not None
                       and subscription.delayed.size() == 4)
        await wait_for(lambda: len(sink2.received) >= 4)
        await settle(service)
        assert sink.received == []
        assert sink2.positions() == positions
        assert min(sink2.arrivals) >= deliver_at - TICK_MS


class AckingSink(TimedSink):
    """Acknowledges every delivery and gives the permit back, like a client consuming in a
    loop with a small receiver queue."""

    def __init__(self, topic_ref: list[PersistentTopic]) -> None:
        super().__init__()
        self._topic_ref = topic_ref
        self.tasks: set[asyncio.Task[None]] = set()

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        super().deliver(consumer, deliveries)
        task = asyncio.ensure_future(self._ack(consumer, deliveries))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _ack(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        subscription = self._topic_ref[0].subscriptions["sub"]
        await subscription.acknowledge(consumer, 0, [(d.ledger_id, d.entry_id, None)
                                                     for d in deliveries])
        subscription.flow(consumer, len(deliveries))


async def test_key_shared_with_small_permits_delivers_every_delayed_message(tmp_path: Path) -> None:
    """KeySharedSubscriptionTest.testContinueDispatchMessagesWhenMessageDelayed: delayed and
    plain messages of the same keys, consumers with few permits that ack as they go: every
    message arrives, none early."""

    async with broker_env(tmp_path, **_config()) as env:
        service = env.service
        topic = await service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        sink = AckingSink([topic])
        for name in ("c1", "c2"):
            _, consumer = await service.subscribe(TOPIC, SubscribeSpec(
                "sub", "Key_Shared", name, initial_position="earliest"), sink)
            topic.subscriptions["sub"].flow(consumer, 3)
        _, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        base = now_ms()
        due: dict[tuple[int, int], int] = {}
        for i in range(60):
            at = base + 100 + 3 * i if i % 2 else None
            position = await publish(topic, producer, f"m{i}".encode(),
                                     partition_key=f"k{i % 6}", deliver_at_ms=at)
            due[position] = at or 0
        await wait_for(lambda: len(sink.received) >= len(due))
        await settle(service)
        assert sorted(sink.positions()) == sorted(due)
        for position, arrived in zip(sink.positions(), sink.arrivals, strict=True):
            assert arrived >= due[position] - TICK_MS
        await wait_for(lambda: topic.subscriptions["sub"].backlog() == 0)
