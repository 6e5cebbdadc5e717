"""TDMQ message tag filtering end to end through `BrokerService` (the "Message Tag Filtering"
section of the TDMQ developer guide).

A tag is a message property whose value is "TAGS"; a subscription subscribes to tags through
its subscription properties (key = tag, value = a version with no meaning yet). Several tags
are OR-ed; untagged messages go to every subscription; a subscription without tags receives
everything. The broker acknowledges the messages it filters out on the subscription's behalf,
and the tags are stored with the subscription, so they survive a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.broker import Consumer, PersistentTopic, ProducerSpec, SubscribeSpec
from magnetar.broker.topics._service import BrokerService

from .helpers import RecordingSink, broker_env, publish, settle, wait_for

TOPIC = "persistent://public/default/tagged"

# body -> message properties, in publish order.
MESSAGES: list[tuple[bytes, dict[str, str]]] = [
    (b"t1", {"tag1": "TAGS"}),
    (b"t2", {"tag2": "TAGS"}),
    (b"t12", {"tag1": "TAGS", "tag2": "TAGS"}),
    (b"t3", {"tag3": "TAGS"}),
    (b"plain", {}),
    (b"props", {"xxx": "yyy"}),  # properties but no tag: untagged
    (b"t1x", {"tag1": "TAGS", "xxx": "yyy"}),  # "Mix tags and properties"
    (b"t3x", {"tag3": "TAGS", "xxx": "yyy"}),
]

EXPECTED = {
    "tag1": [b"t1", b"t12", b"plain", b"props", b"t1x"],
    "tag1+tag2": [b"t1", b"t2", b"t12", b"plain", b"props", b"t1x"],
    "none": [body for body, _ in MESSAGES],
}
SUBSCRIPTION_PROPERTIES = {"tag1": {"tag1": "1"}, "tag1+tag2": {"tag1": "1", "tag2": "1"},
                           "none": {}}


async def _subscribe(service: BrokerService, name: str, sub_type: str, sink: RecordingSink,
                     properties: dict[str, str], consumer_name: str = "c1",
                     ) -> tuple[PersistentTopic, Consumer]:
    topic, consumer = await service.subscribe(
        TOPIC, SubscribeSpec(name, sub_type, consumer_name, initial_position="earliest",
                             subscription_properties=properties), sink)
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions[name].flow(consumer, 1000)
    return topic, consumer


async def _publish_all(service: BrokerService) -> PersistentTopic:
    topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
    assert isinstance(topic, PersistentTopic)
    for body, properties in MESSAGES:
        await publish(topic, producer, body, properties=properties)
    return topic


@pytest.mark.parametrize("sub_type", ["Shared", "Key_Shared", "Exclusive", "Failover"])
async def test_subscription_receives_its_tags_and_untagged_messages(tmp_path: Path,
                                                              sub_type: str) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        sinks = {name: RecordingSink() for name in EXPECTED}
        consumers = {}
        for name, sink in sinks.items():
            _, consumers[name] = await _subscribe(service, name, sub_type, sink,
                                                  SUBSCRIPTION_PROPERTIES[name])
        await _publish_all(service)
        await wait_for(lambda: all(len(sink.received) >= len(EXPECTED[name])
                                   for name, sink in sinks.items()))
        await settle(service)
        for name, sink in sinks.items():
            assert sink.bodies(consumers[name]) == EXPECTED[name], name


async def test_filtered_messages_are_acknowledged_for_the_subscription(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        sink = RecordingSink()
        topic, consumer = await _subscribe(service, "tag1", "Shared", sink, {"tag1": "1"})
        await _publish_all(service)
        subscription = topic.subscriptions["tag1"]
        wanted = len(EXPECTED["tag1"])
        await wait_for(lambda: len(sink.received) >= wanted)
        # Only the delivered (unacked) messages are left in the backlog.
        await wait_for(lambda: subscription.backlog() == wanted)
        await subscription.acknowledge(consumer, 0, [(r.ledger_id, r.entry_id, None)
                                                     for r in sink.received])
        assert subscription.backlog() == 0
        last = topic.managed_ledger.last_confirmed_position
        assert subscription.cursor.mark_delete_position == last


async def test_subscription_with_only_filtered_messages_has_no_backlog(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        sink = RecordingSink()
        topic, _ = await _subscribe(service, "tag9", "Exclusive", sink, {"tag9": "1"})
        _, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        for i in range(5):
            await publish(topic, producer, f"m{i}".encode(), properties={"tag1": "TAGS"})
        subscription = topic.subscriptions["tag9"]
        await wait_for(lambda: subscription.backlog() == 0)
        await settle(service)
        assert sink.received == []


async def test_tags_are_kept_with_the_subscription_across_a_restart(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        sink = RecordingSink()
        topic, consumer = await _subscribe(env.service, "tag1", "Shared", sink,
                                           {"tag1": "1"})
        topic.consumer_closed(topic.subscriptions["tag1"], consumer)

        service = await env.restart()
        topic = await _publish_all(service)
        assert topic.subscriptions["tag1"].cursor.cursor_properties == {"tag1": "1"}
        # The consumer comes back without properties: the stored tags still apply.
        sink = RecordingSink()
        _, consumer = await _subscribe(service, "tag1", "Shared", sink, {})
        await wait_for(lambda: len(sink.received) >= len(EXPECTED["tag1"]))
        await settle(service)
        assert sink.bodies(consumer) == EXPECTED["tag1"]

        # And after a crash, too.
        service = await env.crash()
        topic = await service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        assert topic.subscriptions["tag1"].tags == frozenset({"tag1"})
