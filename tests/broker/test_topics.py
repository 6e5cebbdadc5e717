"""Topics and namespaces through the in-process BrokerService (broker reference §3.1, §4.6,
§5.4, §8): automatic creation (broker setting and namespace override), missing namespaces,
partitioned topics, listings (system topics hidden, regex filter), deletion, producer names
and limits, unsubscribe rules, reserved and clashing subscription names, and readers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from magnetar.broker import (
    BrokerService,
    Consumer,
    NotAllowedError,
    PersistentTopic,
    ProducerSpec,
    SubscribeSpec,
    TopicNotFoundError,
)
from magnetar.broker._errors import MetadataError, ProducerBusyError, SubscriptionNotFoundError
from tests.broker.helpers import (
    RecordingSink,
    broker_env,
    persistent_producer,
    publish_many,
    settle,
    wait_for,
)

NS = "public/default"
INT64_MAX = 2**63 - 1


def _names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-partition-{i}" for i in range(count)]


# -- automatic creation ------------------------------------------------------------------


async def test_auto_creation_off_in_the_broker_config(tmp_path: Path) -> None:
    async with broker_env(tmp_path, allow_auto_topic_creation=False) as env:
        service = env.service
        with pytest.raises(TopicNotFoundError) as raised:
            await service.create_producer("missing", ProducerSpec("p1"))
        assert raised.value.code == 11
        with pytest.raises(TopicNotFoundError):
            await service.subscribe("missing", SubscribeSpec("sub", "Shared"),
                                    RecordingSink())
        assert not service.topic_exists("missing")
        assert await service.partitioned_metadata("missing") == 0
        created = await service.create_topic("made")  # explicit creation still works
        assert isinstance(created, PersistentTopic)
        await service.create_producer("made", ProducerSpec("p1"))
        assert service.list_topics(NS) == [f"persistent://{NS}/made"]


async def test_namespace_override_beats_the_broker_setting(tmp_path: Path) -> None:
    async with broker_env(tmp_path, allow_auto_topic_creation=False) as env:
        service = env.service
        service.namespaces.set_policy(NS, "autoTopicCreationOverride",
                                      {"allowAutoTopicCreation": True,
                                       "topicType": "non-partitioned"})
        await service.create_producer("allowed", ProducerSpec("p1"))
        assert service.topic_exists("allowed")
        service.namespaces.create_namespace("public/strict", {
            "autoTopicCreationOverride": {"allowAutoTopicCreation": False}})
    async with broker_env(tmp_path / "on") as env:
        service = env.service
        service.namespaces.create_namespace("public/strict", {
            "autoTopicCreationOverride": {"allowAutoTopicCreation": False}})
        with pytest.raises(TopicNotFoundError):
            await service.create_producer("public/strict/t", ProducerSpec("p1"))
        await service.create_producer("public/default/t", ProducerSpec("p1"))


async def test_missing_namespace_is_topic_not_found(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        with pytest.raises(TopicNotFoundError, match="public/nope"):
            await env.service.create_producer("persistent://public/nope/t",
                                              ProducerSpec("p1"))
        with pytest.raises(TopicNotFoundError):
            await env.service.get_topic("non-persistent://nobody/default/t")


# -- partitioned topics (§8.2) -----------------------------------------------------------


async def test_partitioned_topic_create_metadata_and_partitions(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        base = f"persistent://{NS}/orders"
        await service.create_partitioned_topic("orders", 3)
        assert await service.partitioned_metadata("orders") == 3
        assert await service.partitioned_metadata(f"{base}-partition-1") == 0
        with pytest.raises(MetadataError):
            await service.create_partitioned_topic("orders", 2)
        with pytest.raises(NotAllowedError):
            await service.get_topic(base)  # the base is not a topic
        # The partitions are ordinary topics; an index past the count is not one.
        for name in _names(base, 3):
            topic, producer = await persistent_producer(service, name)
            assert topic.name.partition_index == int(name[-1])
            await publish_many(topic, producer, 2)
        with pytest.raises(TopicNotFoundError):
            await service.create_producer(f"{base}-partition-3", ProducerSpec("p1"))
        assert service.list_topics(NS) == _names(base, 3)
        await service.update_partitioned_topic("orders", 4)
        assert await service.partitioned_metadata(base) == 4
        await service.create_producer(f"{base}-partition-3", ProducerSpec("p1"))
        # A non-partitioned topic cannot become partitioned.
        await service.create_producer("plain", ProducerSpec("p1"))
        with pytest.raises(MetadataError):
            await service.create_partitioned_topic("plain", 2)


async def test_partitions_are_listed_before_first_use(tmp_path: Path) -> None:
    """Creating a partitioned topic creates its partitions (upstream's admin does), so
    listings and regex subscriptions see them at once."""
    async with broker_env(tmp_path) as env:
        service = env.service
        await service.create_partitioned_topic("orders", 2)
        expected = _names(f"persistent://{NS}/orders", 2)
        assert service.list_topics(NS) == expected
        assert service.list_topics_matching(NS, f"persistent://{NS}/ord.*") == expected


async def test_auto_created_partitioned_type(tmp_path: Path) -> None:
    async with broker_env(tmp_path, allow_auto_topic_creation_type="partitioned",
                          default_num_partitions=4) as env:
        service = env.service
        assert await service.partitioned_metadata("auto") == 4
        assert await service.partitioned_metadata("auto") == 4  # stays
        assert service.namespaces.partitions(f"persistent://{NS}/auto") == 4
        # Non-persistent topics are never auto-partitioned.
        assert await service.partitioned_metadata(f"non-persistent://{NS}/np") == 0
        service.namespaces.create_namespace("public/two", {
            "autoTopicCreationOverride": {"allowAutoTopicCreation": True,
                                          "topicType": "partitioned",
                                          "defaultNumPartitions": 2}})
        assert await service.partitioned_metadata("public/two/t") == 2
        service.namespaces.create_namespace("public/flat", {
            "autoTopicCreationOverride": {"allowAutoTopicCreation": True,
                                          "topicType": "non-partitioned"}})
        assert await service.partitioned_metadata("public/flat/t") == 0


# -- listings (§8.3, §8.4) ---------------------------------------------------------------


async def test_list_topics_hides_system_topics_and_filters_by_regex(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        for name in ("orders-eu", "orders-us", "payments", "__change_events",
                     "not_really__change_events"):
            await service.create_producer(name, ProducerSpec("p1"))
        await service.create_producer(f"non-persistent://{NS}/orders-live",
                                      ProducerSpec("p1"))
        persistent = [f"persistent://{NS}/{n}" for n in (
            "not_really__change_events", "orders-eu", "orders-us", "payments")]
        assert service.list_topics(NS) == persistent
        assert f"persistent://{NS}/__change_events" in service.list_topics(
            NS, include_system=True)
        assert service.list_topics(NS, "NON_PERSISTENT") == [
            f"non-persistent://{NS}/orders-live"]
        assert service.list_topics(NS, "ALL") == sorted(
            [*persistent, f"non-persistent://{NS}/orders-live"])
        assert service.list_topics_matching(NS, f"persistent://{NS}/orders-.*") == [
            f"persistent://{NS}/orders-eu", f"persistent://{NS}/orders-us"]
        # Full match on tenant/namespace/local; the scheme is ignored.
        assert service.list_topics_matching(NS, f"{NS}/orders") == []
        assert service.list_topics_matching(NS, f"non-persistent://{NS}/.*",
                                            "NON_PERSISTENT") == [
            f"non-persistent://{NS}/orders-live"]
        assert service.list_topics("public/other") == []


# -- deletion ----------------------------------------------------------------------------


async def test_delete_topic_with_and_without_force(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, "doomed")
        await publish_many(topic, producer, 3)
        sink = RecordingSink()
        _, consumer = await service.subscribe("doomed", SubscribeSpec("sub", "Shared"),
                                              sink)
        with pytest.raises(NotAllowedError):
            await service.delete_topic("doomed")
        assert service.topic_exists("doomed")
        await service.delete_topic("doomed", force=True)
        assert not service.topic_exists("doomed")
        assert service.list_topics(NS) == []
        assert sink.closed == [(consumer, "topic deleted")]
        assert producer.closed
        with pytest.raises(TopicNotFoundError):
            await service.delete_topic("doomed")
        # A topic with the same name starts afresh.
        again, _ = await persistent_producer(service, "doomed")
        assert again is not topic
        assert again.managed_ledger.number_of_entries == 0
        assert again.subscriptions == {}
        # Without clients a plain delete works.
        await service.create_producer("idle", ProducerSpec("p1"))
        idle = await service.get_topic("idle")
        for name in list(idle.producers):
            idle.remove_producer(idle.producers[name])
        await service.delete_topic("idle")
        assert not service.topic_exists("idle")


async def test_delete_partitioned_topic(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        await service.create_partitioned_topic("parts", 2)
        await service.get_topic(f"persistent://{NS}/parts-partition-0")
        await service.delete_partitioned_topic("parts")
        assert await service.partitioned_metadata("parts") == 0
        assert service.list_topics(NS) == []
        with pytest.raises(TopicNotFoundError):
            await service.delete_partitioned_topic("parts")


# -- producers (§5.4) --------------------------------------------------------------------


async def test_producer_names_are_unique_per_topic(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, first = await persistent_producer(service, "t", "p1")
        with pytest.raises(ProducerBusyError) as raised:
            await service.create_producer("t", ProducerSpec("p1"))
        assert str(raised.value) == ("Producer with name 'p1' is already connected to "
                                     f"topic 'persistent://{NS}/t'")
        assert raised.value.code == 16
        await service.create_producer("other", ProducerSpec("p1"))  # per topic
        topic.remove_producer(first)
        await service.create_producer("t", ProducerSpec("p1"))  # free again


async def test_generated_producer_names(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        _, a = await service.create_producer("t", ProducerSpec())
        _, b = await service.create_producer("t", ProducerSpec())
        _, c = await service.create_producer(f"non-persistent://{NS}/np", ProducerSpec())
        numbers = []
        for producer in (a, b, c):
            found = re.fullmatch(r"standalone-0-(\d+)", producer.name)
            assert found is not None, producer.name
            assert not producer.user_provided_name
            numbers.append(int(found.group(1)))
        assert numbers == [numbers[0], numbers[0] + 1, numbers[0] + 2]


async def test_max_producers_per_topic(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        service.namespaces.set_policy(NS, "max_producers_per_topic", 2)
        topic, first = await persistent_producer(service, "t", "p1")
        await service.create_producer("t", ProducerSpec("p2"))
        with pytest.raises(ProducerBusyError, match=r"^Topic reached max producers limit$"):
            await service.create_producer("t", ProducerSpec("p3"))
        topic.remove_producer(first)
        await service.create_producer("t", ProducerSpec("p3"))


# -- subscriptions (§3.1) ----------------------------------------------------------------


async def test_unsubscribe_only_by_the_sole_consumer(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, _ = await persistent_producer(service, "t")
        sink = RecordingSink()
        _, c1 = await service.subscribe("t", SubscribeSpec("sub", "Shared", "c1"), sink)
        _, c2 = await service.subscribe("t", SubscribeSpec("sub", "Shared", "c2"), sink)
        with pytest.raises(MetadataError,
                           match=r"^Unconnected or shared consumer attempting to "
                                 r"unsubscribe$") as raised:
            await topic.unsubscribe("sub", c1)
        assert raised.value.code == 1
        with pytest.raises(MetadataError):
            await topic.unsubscribe("sub", None)  # not connected at all
        topic.consumer_closed(topic.subscriptions["sub"], c2)
        await topic.unsubscribe("sub", c1)
        assert "sub" not in topic.subscriptions
        assert "sub" not in topic.managed_ledger.cursors
        assert sink.closed == []
        with pytest.raises(SubscriptionNotFoundError):
            await topic.unsubscribe("sub", c1)


async def test_forced_unsubscribe_closes_the_other_consumers(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, _ = await persistent_producer(service, "t")
        sink = RecordingSink()
        _, c1 = await service.subscribe("t", SubscribeSpec("sub", "Failover", "c1"), sink)
        _, c2 = await service.subscribe("t", SubscribeSpec("sub", "Failover", "c2"), sink)
        with pytest.raises(MetadataError):
            await topic.unsubscribe("sub", c1)
        await topic.unsubscribe("sub", c1, force=True)
        assert sink.closed == [(c2, "subscription deleted")]
        assert "sub" not in topic.subscriptions


async def test_unsubscribed_cursor_does_not_come_back_after_restart(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, "t")
        _, c1 = await env.service.subscribe("t", SubscribeSpec("gone", "Shared", "c1"),
                                            RecordingSink())
        await env.service.subscribe("t", SubscribeSpec("kept", "Shared", "c2"),
                                    RecordingSink())
        await publish_many(topic, producer, 2)
        await topic.unsubscribe("gone", c1)
        service = await env.restart()
        reloaded = await service.get_topic("t")
        assert isinstance(reloaded, PersistentTopic)
        assert sorted(reloaded.subscriptions) == ["kept"]


@pytest.mark.parametrize("name", ["pulsar.dedup", "pulsar.repl.cluster-b", "pulsar.replx"])
async def test_reserved_subscription_names(tmp_path: Path, name: str) -> None:
    async with broker_env(tmp_path) as env:
        with pytest.raises(NotAllowedError,
                           match=r"^Subscription with reserved subscription name "
                                 r"attempted$"):
            await env.service.subscribe("t", SubscribeSpec(name, "Shared"),
                                        RecordingSink())
        topic = await env.service.get_topic("t")
        assert name not in topic.subscriptions


async def test_empty_subscription_name_is_refused(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        with pytest.raises(NotAllowedError):
            await env.service.subscribe("t", SubscribeSpec("", "Shared"), RecordingSink())


async def test_durable_and_non_durable_names_clash(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        await service.subscribe("t", SubscribeSpec("durable", "Exclusive", "c1"),
                                RecordingSink())
        with pytest.raises(NotAllowedError,
                           match=r"^Durable subscription with the same name already "
                                 r"exists\.$"):
            await service.subscribe("t", SubscribeSpec("durable", "Exclusive", "r1",
                                                       durable=False), RecordingSink())
        await service.subscribe("t", SubscribeSpec("reader-1", "Exclusive", "r2",
                                                   durable=False), RecordingSink())
        with pytest.raises(NotAllowedError,
                           match=r"^NonDurable subscription with the same name already "
                                 r"exists\.$"):
            await service.subscribe("t", SubscribeSpec("reader-1", "Exclusive", "c2"),
                                    RecordingSink())


async def test_auto_subscription_creation_off(tmp_path: Path) -> None:
    async with broker_env(tmp_path, allow_auto_subscription_creation=False) as env:
        service = env.service
        topic, _ = await persistent_producer(service, "t")
        with pytest.raises(SubscriptionNotFoundError):
            await service.subscribe("t", SubscribeSpec("sub", "Shared"), RecordingSink())
        await topic.create_subscription("sub")
        await service.subscribe("t", SubscribeSpec("sub", "Shared"), RecordingSink())


# -- readers (§4.6) ----------------------------------------------------------------------


async def _read(service: BrokerService, topic: PersistentTopic, reader: str,
                start: tuple[int, int, int] | None, initial: str = "latest",
                ) -> tuple[RecordingSink, Consumer]:
    sink = RecordingSink()
    _, consumer = await service.subscribe(
        str(topic.name), SubscribeSpec(reader, "Exclusive", reader, initial_position=initial,
                                       durable=False, start_message_id=start), sink)
    topic.readers[reader].flow(consumer, 1000)
    return sink, consumer


async def test_reader_starts_at_the_start_message_id(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, "t")
        positions = await publish_many(topic, producer, 10)
        sink, _ = await _read(service, topic, "r-at", (*positions[5], -1))
        await wait_for(lambda: len(sink.received) == 5)
        await settle(service)
        assert sink.messages() == [f"m{i}".encode() for i in range(5, 10)]
        assert topic.subscriptions == {}  # readers are not durable subscriptions
        assert "r-at" in topic.readers


async def test_reader_earliest_and_latest(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, "t")
        await publish_many(topic, producer, 4)
        early, _ = await _read(service, topic, "r-early", (-1, -1, -1))
        late, _ = await _read(service, topic, "r-late", (INT64_MAX, INT64_MAX, -1))
        unset, _ = await _read(service, topic, "r-unset", None, initial="earliest")
        await wait_for(lambda: len(early.received) == 4 and len(unset.received) == 4)
        await settle(service)
        assert late.received == []
        await publish_many(topic, producer, 1, prefix="new")
        await wait_for(lambda: len(late.received) == 1 and len(early.received) == 5)
        assert late.messages() == [b"new0"]
        assert early.messages() == [b"m0", b"m1", b"m2", b"m3", b"new0"]


async def test_reader_goes_away_with_its_consumer(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, "t")
        await publish_many(topic, producer, 3)
        sink, consumer = await _read(service, topic, "r1", (-1, -1, -1))
        await wait_for(lambda: len(sink.received) == 3)
        reader = topic.readers["r1"]
        assert not reader.durable
        assert reader.max_unacked_per_consumer() == 0  # readers have no unacked limits
        topic.consumer_closed(reader, consumer)
        assert "r1" not in topic.readers
        assert "r1" not in topic.managed_ledger.cursors
        service = await env.restart()
        reloaded = await service.get_topic("t")
        assert isinstance(reloaded, PersistentTopic)
        assert reloaded.readers == {}
        assert reloaded.subscriptions == {}
