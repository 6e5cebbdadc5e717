"""Topic-level policies over the admin REST API (Pulsar's v2 paths under a topic): set, get
(own and `applied=true`), remove; they override the namespace's, are checked by the same
rules, survive a restart and take effect on loaded topics at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import ProducerSpec
from magnetar.broker._errors import ProducerBusyError

from .helpers import admin_env, persistent_producer, publish
from .test_admin import NS, PT, expect

TOPIC = "persistent://public/default/pol"
TP = f"{PT}/pol"

# (endpoint, body, field, stored)
CASES: list[tuple[str, Any, str, Any]] = [
    ("retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100},
     "retention_policies", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}),
    ("deduplicationEnabled", True, "deduplicationEnabled", True),
    ("delayedDelivery", {"active": False, "tickTime": 500}, "delayed_delivery_policies",
     {"active": False, "tickTime": 500, "maxDeliveryDelayInMillis": 0}),
    ("maxProducers", 3, "max_producers_per_topic", 3),
    ("maxConsumers", 4, "max_consumers_per_topic", 4),
    ("maxUnackedMessagesOnConsumer", 10, "max_unacked_messages_per_consumer", 10),
    ("maxUnackedMessagesOnSubscription", 20, "max_unacked_messages_per_subscription", 20),
    ("maxConsumersPerSubscription", 2, "max_consumers_per_subscription", 2),
    ("subscriptionTypesEnabled", ["Shared", "Exclusive"], "subscription_types_enabled",
     ["Exclusive", "Shared"]),
    ("compactionThreshold", 1048576, "compaction_threshold", 1048576),
]


@pytest.mark.parametrize(("endpoint", "body", "field", "stored"), CASES,
                         ids=[c[0] for c in CASES])
async def test_topic_policy_round_trip(tmp_path: Path, endpoint: str, body: Any, field: str,
                                       stored: Any) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        await persistent_producer(env.service, TOPIC)
        path = f"{TP}/{endpoint}"
        await expect(client, "GET", path, 204)  # unset: null, as upstream answers it
        await expect(client, "POST", path, 204, body)
        assert env.service.namespaces.topic_policies(TOPIC)[field] == stored
        assert await expect(client, "GET", path, 200) == stored
        assert await expect(client, "GET", path, 200, query={"applied": "true"}) == stored
        await expect(client, "DELETE", path, 204)
        assert env.service.namespaces.topic_policies(TOPIC) == {}
        await expect(client, "GET", path, 204)


async def test_message_ttl_is_set_by_query_parameter(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        topic, _ = await persistent_producer(env.service, TOPIC)
        await expect(client, "POST", f"{TP}/messageTTL", 204, query={"messageTTL": "120"})
        assert await expect(client, "GET", f"{TP}/messageTTL", 200) == 120
        assert topic.policies.message_ttl_s == 120
        assert "Invalid value for message TTL" in await expect(
            client, "POST", f"{TP}/messageTTL", 412, query={"messageTTL": "-1"})
        await expect(client, "POST", f"{TP}/messageTTL", 400, query={"messageTTL": "x"})
        assert await expect(client, "GET", f"{TP}/messageTTL", 200) == 120
        await expect(client, "DELETE", f"{TP}/messageTTL", 204)
        await expect(client, "GET", f"{TP}/messageTTL", 204)
        assert topic.policies.message_ttl_s == 0


async def test_applied_falls_back_to_the_namespace_then_the_broker(tmp_path: Path) -> None:
    async with admin_env(tmp_path, max_producers_per_topic=7) as (env, _, client):
        await persistent_producer(env.service, TOPIC)
        applied = {"applied": "true"}
        assert await expect(client, "GET", f"{TP}/maxProducers", 200, query=applied) == 7
        assert await expect(client, "GET", f"{TP}/retention", 200, query=applied) == {
            "retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
        assert await expect(client, "GET", f"{TP}/deduplicationEnabled", 200,
                            query=applied) is False
        await expect(client, "POST", f"{NS}/maxProducersPerTopic", 204, 5)
        assert await expect(client, "GET", f"{TP}/maxProducers", 200, query=applied) == 5
        await expect(client, "GET", f"{TP}/maxProducers", 204)  # the topic's own: none
        await expect(client, "POST", f"{TP}/maxProducers", 204, 2)
        assert await expect(client, "GET", f"{TP}/maxProducers", 200, query=applied) == 2


async def test_topic_policy_overrides_the_namespace_and_is_enforced(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        service = env.service
        topic, _ = await persistent_producer(service, TOPIC)
        await expect(client, "POST", f"{NS}/maxProducersPerTopic", 204, 5)
        await expect(client, "POST", f"{TP}/maxProducers", 204, 1)
        assert topic.policies.max_producers_per_topic == 1
        with pytest.raises(ProducerBusyError, match="max producers"):
            await service.create_producer(TOPIC, ProducerSpec("p2"))
        await expect(client, "DELETE", f"{TP}/maxProducers", 204)
        assert topic.policies.max_producers_per_topic == 5
        await service.create_producer(TOPIC, ProducerSpec("p2"))
        # Deduplication at topic level only: the namespace's stays off.
        await expect(client, "POST", f"{TP}/deduplicationEnabled", 204, True)
        assert (await expect(client, "GET", f"{TP}/stats", 200))["deduplicationStatus"] == \
            "Enabled"
        producer = topic.producers["p1"]
        assert await publish(topic, producer, b"x", sequence_id=3) != (-1, -1)
        assert await publish(topic, producer, b"x", sequence_id=3) == (-1, -1)


async def test_partitioned_topic_policies_cover_its_partitions(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        await expect(client, "PUT", f"{PT}/parts/partitions", 204, 2)
        await expect(client, "POST", f"{PT}/parts/maxConsumers", 204, 3)
        partition = await env.service.get_topic("persistent://public/default/parts-partition-1")
        assert partition.policies.max_consumers_per_topic == 3
        assert "for a partition" in await expect(
            client, "POST", f"{PT}/parts-partition-1/maxConsumers", 412, 1)
        assert "for a partition" in await expect(
            client, "GET", f"{PT}/parts-partition-0/maxConsumers", 412)


async def test_errors_and_validation(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        assert "not found" in await expect(client, "POST", f"{PT}/missing/maxProducers", 404, 1)
        await expect(client, "GET", f"{PT}/missing/retention", 404)
        await expect(client, "GET", "/admin/v2/persistent/public/nope/t/retention", 404)
        await persistent_producer(env.service, TOPIC)
        await expect(client, "POST", f"{TP}/maxProducers", 412, -1)
        await expect(client, "POST", f"{TP}/maxProducers", 400, "many")
        await expect(client, "POST", f"{TP}/deduplicationEnabled", 400, 1)
        await expect(client, "POST", f"{TP}/compactionThreshold", 412, -5)
        await expect(client, "POST", f"{TP}/retention", 412,
                     {"retentionTimeInMinutes": 0, "retentionSizeInMB": 10})
        await expect(client, "POST", f"{TP}/retention", 204)  # no body: nothing changes
        assert env.service.namespaces.topic_policies(TOPIC) == {}


async def test_backlog_quotas_and_retention_checked_with_the_namespace(tmp_path: Path) -> None:
    async with admin_env(tmp_path, backlog_quota_default_limit_bytes=-1) as (env, _, client):
        topic, _ = await persistent_producer(env.service, TOPIC)
        applied = await expect(client, "GET", f"{TP}/backlogQuotaMap", 200,
                               query={"applied": "true"})
        assert set(applied) == {"destination_storage", "message_age"}
        assert applied["destination_storage"]["limitSize"] == -1
        assert await expect(client, "GET", f"{TP}/backlogQuotaMap", 200) == {}
        # The namespace's retention (20 MB) bounds the topic's quota.
        await expect(client, "POST", f"{NS}/retention", 204,
                     {"retentionTimeInMinutes": 10, "retentionSizeInMB": 20})
        assert "exceeds configured retention" in await expect(
            client, "POST", f"{TP}/backlogQuota", 412,
            {"limitSize": 30 * 1024 * 1024, "policy": "producer_exception"})
        await expect(client, "POST", f"{TP}/backlogQuota", 204,
                     {"limitSize": 10 * 1024 * 1024, "policy": "producer_exception"})
        assert topic.policies.backlog_quota_limit_bytes == 10 * 1024 * 1024
        # ... and the topic's quota bounds the topic's retention.
        await expect(client, "POST", f"{TP}/retention", 412,
                     {"retentionTimeInMinutes": 10, "retentionSizeInMB": 5})
        # A namespace quota of the other type stays in force beside the topic's.
        await expect(client, "POST", f"{NS}/backlogQuota", 204,
                     {"limitTime": 60, "policy": "producer_exception"},
                     query={"backlogQuotaType": "message_age"})
        assert topic.policies.backlog_quota_limit_s == 60
        assert topic.policies.backlog_quota_limit_bytes == 10 * 1024 * 1024
        await expect(client, "DELETE", f"{TP}/backlogQuota", 204)
        assert await expect(client, "GET", f"{TP}/backlogQuotaMap", 200) == {}
        assert topic.policies.backlog_quota_limit_bytes == -1


async def test_topic_policies_survive_a_restart_and_go_with_the_topic(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        await persistent_producer(env.service, TOPIC)
        await expect(client, "POST", f"{TP}/maxConsumers", 204, 9)
        await expect(client, "POST", f"{TP}/messageTTL", 204, query={"messageTTL": "30"})
        service = await env.restart()
        topic = await service.get_topic(TOPIC, create=False)
        assert topic.policies.max_consumers_per_topic == 9
        assert topic.policies.message_ttl_s == 30
        await service.delete_topic(TOPIC, force=True)
        assert service.namespaces.topic_policies(TOPIC) == {}
