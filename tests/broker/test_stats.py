"""Topic stats and internal stats through the in-process BrokerService (broker reference
§2.7.6, §4.8; §11 item 19): the field names per subscription type (the three draining
counters everywhere, `drainingHashes` and `keyHashRangeArrays` only on Key_Shared), the
backlog in entries, publishers, and the values after a known run of publishes and acks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import BrokerService, PersistentTopic, SubscribeSpec
from magnetar.broker.http._stats import internal_stats, topic_stats
from tests.broker.helpers import (
    RecordingSink,
    broker_env,
    now_ms,
    persistent_producer,
    publish,
    publish_batch,
    publish_many,
    settle,
    wait_for,
)

TOPIC = "persistent://public/default/stats"

CONSUMER_FIELDS = {
    "consumerName", "msgRateOut", "msgThroughputOut", "msgOutCounter", "bytesOutCounter",
    "msgRateRedeliver", "availablePermits", "unackedMessages", "avgMessagesPerEntry",
    "blockedConsumerOnUnackedMsgs", "lastAckedTimestamp", "lastConsumedTimestamp",
    "lastConsumedFlowTimestamp", "metadata", "address", "connectedSince", "clientVersion",
    "drainingHashesCount", "drainingHashesClearedTotal", "drainingHashesUnackedMessages",
}
KEY_SHARED_CONSUMER_FIELDS = {"drainingHashes", "keyHashRangeArrays"}
SUBSCRIPTION_FIELDS = {
    "type", "msgRateOut", "msgThroughputOut", "msgBacklog", "msgBacklogNoDelayed",
    "msgDelayed", "unackedMessages", "msgInReplay", "blockedSubscriptionOnUnackedMsgs",
    "isDurable", "nonContiguousDeletedMessagesRanges", "consumers", "drainingHashesCount",
    "drainingHashesClearedTotal", "drainingHashesUnackedMessages",
}
KEY_SHARED_SUBSCRIPTION_FIELDS = {"keySharedMode", "allowOutOfOrderDelivery"}
PUBLISHER_FIELDS = {"producerName", "msgRateIn", "msgThroughputIn", "averageMsgSize",
                    "msgInCounter", "bytesInCounter", "metadata", "connectedSince", "address",
                    "clientVersion", "accessMode"}
TOPIC_FIELDS = {"msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut",
                "msgInCounter", "bytesInCounter", "msgOutCounter", "bytesOutCounter",
                "averageMsgSize", "storageSize", "backlogSize", "publishers", "subscriptions",
                "deduplicationStatus"}


async def _subscribed(service: BrokerService, sub_type: str, subscription: str,
                      ) -> dict[str, Any]:
    topic, consumer = await service.subscribe(
        TOPIC, SubscribeSpec(subscription, sub_type, f"{subscription}-c1",
                             initial_position="earliest"), RecordingSink())
    assert isinstance(topic, PersistentTopic)
    topic.subscriptions[subscription].flow(consumer, 10)
    stats: dict[str, Any] = topic_stats(topic)["subscriptions"][subscription]
    return stats


@pytest.mark.parametrize("sub_type", ["Exclusive", "Shared", "Failover", "Key_Shared"])
async def test_field_names_per_subscription_type(tmp_path: Path, sub_type: str) -> None:
    async with broker_env(tmp_path) as env:
        await persistent_producer(env.service, TOPIC)
        stats = await _subscribed(env.service, sub_type, "sub")
        assert stats["type"] == sub_type
        key_shared = sub_type == "Key_Shared"
        assert set(stats) >= SUBSCRIPTION_FIELDS
        assert (set(stats) >= KEY_SHARED_SUBSCRIPTION_FIELDS) is key_shared
        assert not KEY_SHARED_SUBSCRIPTION_FIELDS & set(stats) or key_shared
        assert "consumersAfterMarkDeletePosition" not in stats  # classic dispatcher only
        (consumer,) = stats["consumers"]
        assert set(consumer) >= CONSUMER_FIELDS
        assert (set(consumer) >= KEY_SHARED_CONSUMER_FIELDS) is key_shared
        assert not KEY_SHARED_CONSUMER_FIELDS & set(consumer) or key_shared
        assert "keyHashRanges" not in consumer  # the classic Key_Shared format
        for field in ("drainingHashesCount", "drainingHashesClearedTotal",
                      "drainingHashesUnackedMessages"):
            assert consumer[field] == 0
            assert stats[field] == 0
        assert consumer["availablePermits"] == 10
        assert consumer["lastConsumedFlowTimestamp"] > 0
        if key_shared:
            assert stats["keySharedMode"] == "AUTO_SPLIT"
            assert stats["allowOutOfOrderDelivery"] is False
            assert consumer["drainingHashes"] == []
            # A lone consumer owns the whole consistent-hashing range.
            assert consumer["keyHashRangeArrays"] == [[1, 65535]]


async def test_topic_and_publisher_fields(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, _ = await persistent_producer(env.service, TOPIC)
        stats = topic_stats(topic)
        assert set(stats) >= TOPIC_FIELDS
        (publisher,) = stats["publishers"]
        assert set(publisher) >= PUBLISHER_FIELDS
        assert publisher["producerName"] == "p1"
        assert publisher["accessMode"] == "Shared"
        assert stats["subscriptions"] == {}
        assert stats["deduplicationStatus"] == "Disabled"


async def test_values_after_publishes_dispatch_and_acks(tmp_path: Path) -> None:
    """3 messages and a batch of 5 (4 entries, 8 messages) to a Shared subscription; then
    acks of the first and third entries."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            TOPIC, SubscribeSpec("sub", "Shared", "c1", initial_position="earliest"), sink)
        positions = await publish_many(topic, producer, 3)
        positions.append(await publish_batch(topic, producer, [b"b"] * 5))
        ledger = positions[0][0]
        entry_bytes = topic.bytes_in_counter
        stats = topic_stats(topic)
        assert stats["msgInCounter"] == 8
        assert stats["publishers"][0]["msgInCounter"] == 8
        assert stats["publishers"][0]["bytesInCounter"] == entry_bytes
        assert stats["averageMsgSize"] == pytest.approx(entry_bytes / 8)
        sub = stats["subscriptions"]["sub"]
        assert sub["msgBacklog"] == 4  # entries, not messages
        assert sub["msgBacklogNoDelayed"] == 4
        assert sub["unackedMessages"] == 0

        topic.subscriptions["sub"].flow(consumer, 100)
        await wait_for(lambda: len(sink.received) == 4)
        await settle(service)
        stats = topic_stats(topic)
        assert stats["msgOutCounter"] == 8
        assert stats["bytesOutCounter"] == entry_bytes
        sub = stats["subscriptions"]["sub"]
        (c1,) = sub["consumers"]
        assert c1["msgOutCounter"] == 8
        assert c1["bytesOutCounter"] == entry_bytes
        assert c1["unackedMessages"] == 8
        assert sub["unackedMessages"] == 8
        assert c1["availablePermits"] == 92
        assert c1["lastConsumedTimestamp"] > 0
        assert c1["lastAckedTimestamp"] == 0
        assert sub["msgBacklog"] == 4  # delivered is not acknowledged
        internal = internal_stats(topic)
        assert internal["entriesAddedCounter"] == 4
        assert internal["numberOfEntries"] == 4
        assert internal["lastConfirmedEntry"] == f"{ledger}:3"
        cursor = internal["cursors"]["sub"]
        assert cursor["markDeletePosition"] == f"{ledger}:-1"
        assert cursor["readPosition"] == f"{ledger}:4"
        assert cursor["individuallyDeletedMessages"] == "[]"

        subscription = topic.subscriptions["sub"]
        await subscription.acknowledge(consumer, 0, [(*positions[0], None),
                                                     (*positions[2], None)])
        stats = topic_stats(topic)
        sub = stats["subscriptions"]["sub"]
        assert sub["msgBacklog"] == 2
        assert sub["unackedMessages"] == 6
        assert sub["nonContiguousDeletedMessagesRanges"] == 1
        assert sub["consumers"][0]["lastAckedTimestamp"] > 0
        cursor = internal_stats(topic)["cursors"]["sub"]
        assert cursor["markDeletePosition"] == f"{ledger}:0"
        assert cursor["individuallyDeletedMessages"] == f"[({ledger}:1..{ledger}:2]]"
        assert cursor["totalNonContiguousDeletedMessagesRange"] == 1

        await subscription.acknowledge(consumer, 0, [(*positions[1], None),
                                                     (*positions[3], None)])
        sub = topic_stats(topic)["subscriptions"]["sub"]
        assert sub["msgBacklog"] == 0
        assert sub["unackedMessages"] == 0
        assert sub["nonContiguousDeletedMessagesRanges"] == 0
        assert internal_stats(topic)["cursors"]["sub"]["markDeletePosition"] == \
            f"{ledger}:3"


async def test_delayed_messages_in_backlog_stats(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            TOPIC, SubscribeSpec("sub", "Shared", "c1", initial_position="earliest"), sink)
        topic.subscriptions["sub"].flow(consumer, 100)
        await publish(topic, producer, b"later", deliver_at_ms=now_ms() + 600_000)
        await publish(topic, producer, b"now")
        await wait_for(lambda: len(sink.received) == 1)
        await settle(service)
        sub = topic_stats(topic)["subscriptions"]["sub"]
        assert sink.bodies(consumer) == [b"now"]
        assert sub["msgBacklog"] == 2
        assert sub["msgDelayed"] == 1
        assert sub["msgBacklogNoDelayed"] == 1


async def test_failover_reports_the_active_consumer(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        await persistent_producer(env.service, TOPIC)
        await _subscribed(env.service, "Failover", "sub")
        stats = await _subscribed(env.service, "Failover", "sub")
        assert stats["activeConsumerName"] == "sub-c1"
        assert len(stats["consumers"]) == 2


async def test_avg_messages_per_entry(tmp_path: Path) -> None:
    """The first dispatch sets the average; later ones move it by a tenth; stats report it
    rounded (`testAvgMessagesPerEntry`: a 10-message batch, then single messages)."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"),
            sink)
        topic.subscriptions["sub"].flow(consumer, 1000)
        await publish_batch(topic, producer, [b"x"] * 10)
        await wait_for(lambda: len(sink.received) == 1)
        assert topic_stats(topic)["subscriptions"]["sub"]["consumers"][0][
            "avgMessagesPerEntry"] == 10
        await publish(topic, producer, b"one")
        await wait_for(lambda: len(sink.received) == 2)
        value = topic_stats(topic)["subscriptions"]["sub"]["consumers"][0][
            "avgMessagesPerEntry"]
        assert value == 9  # round(10 * 0.9 + 1 * 0.1)
        assert isinstance(value, int)


async def test_reader_appears_as_a_non_durable_subscription(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        await publish_many(topic, producer, 2)
        await service.subscribe(TOPIC, SubscribeSpec("reader-x", "Exclusive", "r",
                                                     durable=False,
                                                     start_message_id=(-1, -1, -1)),
                                RecordingSink())
        sub = topic_stats(topic)["subscriptions"]["reader-x"]
        assert sub["isDurable"] is False
        assert sub["msgBacklog"] == 2
        assert "reader-x" not in internal_stats(topic)["cursors"]
