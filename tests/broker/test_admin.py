"""The admin HTTP API over real HTTP, against a real storage and broker service: Pulsar's
REST v2 paths, JSON field names and status codes, and policy changes that take effect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import PersistentTopic, ProducerSpec, SubscribeSpec
from magnetar.broker.http._admin import aggregate_partitioned_stats

from .helpers import (
    AdminClient,
    RecordingSink,
    make_entry,
    now_ms,
    persistent_producer,
    publish,
    publish_batch,
    publish_many,
    settle,
    wait_for,
)
from .helpers import (
    admin_env as _admin_env,
)

NS = "/admin/v2/namespaces/public/default"
PT = "/admin/v2/persistent/public/default"
NPT = "/admin/v2/non-persistent/public/default"
FULL = "persistent://public/default/"
HOUR_MS = 3_600_000


async def expect(client: AdminClient, method: str, path: str, status: int,
                 body: Any = None, **kwargs: Any) -> Any:
    """Call, check the status, return the decoded body; error answers must carry
    Pulsar's `{"reason": ...}`."""
    answer = await client.call(method, path, body, **kwargs)
    assert answer.status == status, (method, path, answer.status, answer.body)
    if status >= 400:
        assert answer.content_type == "application/json"
        assert isinstance(answer.body, dict)
        assert set(answer.body) == {"reason"}
        return answer.body["reason"]
    if status == 204:
        assert answer.body is None
    return answer.body


async def publish_old(topic: PersistentTopic, producer: Any, count: int, age_ms: int,
                      ) -> None:
    """Publish `count` messages whose publish time is `age_ms` in the past."""
    for i in range(count):
        sequence = producer.msg_in_counter
        metadata, entry = make_entry(b"old%d" % i, sequence_id=sequence,
                                     producer_name=producer.name,
                                     publish_time_ms=now_ms() - age_ms)
        await topic.publish(producer, entry, sequence, sequence, metadata)


# -- clusters and tenants -------------------------------------------------------------------


async def test_tenants_lifecycle_and_errors(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        assert await expect(client, "GET", "/admin/v2/clusters", 200) == ["standalone"]
        assert await expect(client, "GET", "/admin/v2/tenants", 200) == ["public"]
        info = {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
        await expect(client, "PUT", "/admin/v2/tenants/acme", 204, info)
        assert await expect(client, "GET", "/admin/v2/tenants", 200) == ["acme", "public"]
        assert await expect(client, "GET", "/admin/v2/tenants/acme", 200) == info
        assert "already exist" in await expect(client, "PUT", "/admin/v2/tenants/acme",
                                               409, info)
        # Upstream's validation of TenantInfo and of the name.
        assert await expect(client, "PUT", "/admin/v2/tenants/other", 412,
                            {"allowedClusters": []}) == "Clusters can not be empty"
        assert await expect(client, "PUT", "/admin/v2/tenants/other", 412,
                            {"allowedClusters": ["elsewhere"]}) == "Clusters do not exist"
        assert await expect(client, "PUT", "/admin/v2/tenants/bad%20name", 412,
                            info) == "Tenant name is not valid"
        assert await expect(client, "PUT", "/admin/v2/tenants/other", 400,
                            ["not", "an", "object"]) == "The body must be a TenantInfo object"
        # Update replaces roles and clusters.
        await expect(client, "POST", "/admin/v2/tenants/acme", 204,
                     {"adminRoles": [], "allowedClusters": ["standalone"]})
        assert env.service.namespaces.tenant_info("acme")["adminRoles"] == []
        await expect(client, "POST", "/admin/v2/tenants/ghost", 404, info)
        # A tenant with namespaces cannot go; forced deletion is refused like upstream's
        # default (forceDeleteTenantAllowed=false).
        await expect(client, "PUT", "/admin/v2/namespaces/acme/ns", 204)
        assert await expect(client, "DELETE", "/admin/v2/tenants/acme", 409) == \
            "The tenant still has active namespaces"
        await expect(client, "DELETE", "/admin/v2/tenants/acme", 405,
                     query={"force": "true"})
        await expect(client, "DELETE", "/admin/v2/namespaces/acme/ns", 204)
        await expect(client, "DELETE", "/admin/v2/tenants/acme", 204)
        assert await expect(client, "GET", "/admin/v2/tenants/acme", 404) == \
            "Tenant does not exist"
        await expect(client, "DELETE", "/admin/v2/tenants/acme", 404)
        assert not env.service.namespaces.tenant_exists("acme")


# -- namespaces -----------------------------------------------------------------------------


async def test_the_cluster_exists_and_shows_its_data(tmp_path: Path) -> None:
    import aiohttp

    from magnetar.broker.http._admin import start_admin

    from .helpers import AdminClient, broker_env

    clusters = "/admin/v2/clusters"
    data = {"serviceUrl": "http://pulsar.example.com:8080",
            "brokerServiceUrl": "pulsar://pulsar.example.com:6650"}

    async with broker_env(tmp_path) as env:
        server = await start_admin(env.service, "127.0.0.1", 0,
                                   broker_url="pulsar://127.0.0.1:6650",
                                   broker_url_tls="pulsar+ssl://127.0.0.1:6651")
        try:
            async with aiohttp.ClientSession() as session:
                client = AdminClient(session, server.url)
                assert await expect(client, "GET", clusters, 200) == ["standalone"]
                # Pulsar's ClusterData: the broker's own URLs, nulls left out.
                assert await expect(client, "GET", f"{clusters}/standalone", 200) == {
                    "serviceUrl": server.url,
                    "brokerServiceUrl": "pulsar://127.0.0.1:6650",
                    "brokerServiceUrlTls": "pulsar+ssl://127.0.0.1:6651",
                    "brokerClientTlsEnabled": False,
                    "tlsAllowInsecureConnection": False,
                    "brokerClientTlsEnabledWithKeyStore": False,
                    "brokerClientTlsTrustStoreType": "JKS",
                    "brokerClientTlsKeyStoreType": "JKS"}
                assert await expect(client, "GET", f"{clusters}/elsewhere", 404) == \
                    "Cluster does not exist"
                # Creating it again: Pulsar's 409, after its name and body checks.
                assert await expect(client, "PUT", f"{clusters}/standalone", 409,
                                    data) == "Cluster already exists"
                assert await expect(client, "PUT", f"{clusters}/standalone",
                                    400) == "cluster data is required"
                assert await expect(client, "PUT", f"{clusters}/bad%20name", 412,
                                    data) == "Cluster name is not valid"
                # One cluster only; its URLs are the listeners.
                await expect(client, "PUT", f"{clusters}/elsewhere", 403, data)
                await expect(client, "POST", f"{clusters}/standalone", 403, data)
                await expect(client, "POST", f"{clusters}/elsewhere", 404, data)
                await expect(client, "DELETE", f"{clusters}/standalone", 403)
                assert await expect(client, "GET", clusters, 200) == ["standalone"]
        finally:
            await server.close()


async def test_namespaces_lifecycle_and_errors(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        assert await expect(client, "GET", "/admin/v2/namespaces/public", 200) == \
            ["public/default"]
        # Fields Magnetar does not implement (bundles) are ignored, known ones stored.
        await expect(client, "PUT", "/admin/v2/namespaces/public/ns1", 204,
                     {"message_ttl_in_seconds": 30, "bundles": {"numBundles": 4},
                      "retention_policies": None})
        policies = await expect(client, "GET", "/admin/v2/namespaces/public/ns1", 200)
        assert policies["message_ttl_in_seconds"] == 30
        assert policies["retention_policies"] is None
        assert policies["backlog_quota_map"] == {}
        assert policies["replication_clusters"] == ["standalone"]
        assert "bundles" not in policies
        assert await expect(client, "GET", "/admin/v2/namespaces/public", 200) == \
            ["public/default", "public/ns1"]
        assert await expect(client, "PUT", "/admin/v2/namespaces/public/ns1", 409) == \
            "Namespace already exists"
        assert await expect(client, "PUT", "/admin/v2/namespaces/nobody/ns", 404) == \
            "Tenant does not exist"
        await expect(client, "GET", "/admin/v2/namespaces/nobody", 404)
        assert await expect(client, "PUT", "/admin/v2/namespaces/public/b%20d", 412) == \
            "Namespace name is not valid"
        assert await expect(client, "GET", "/admin/v2/namespaces/public/nope", 404) == \
            "Namespace does not exist"
        # Not empty while a topic lives in it; forced deletion is not allowed.
        await expect(client, "PUT", "/admin/v2/persistent/public/ns1/t", 204)
        non_persistent = "/admin/v2/non-persistent/public/ns1/np"
        await expect(client, "PUT", non_persistent, 204)
        topics = await expect(client, "GET", "/admin/v2/namespaces/public/ns1/topics", 200,
                              query={"mode": "ALL"})
        assert topics == ["non-persistent://public/ns1/np", "persistent://public/ns1/t"]
        assert await expect(client, "GET", "/admin/v2/namespaces/public/ns1/topics",
                            200) == ["persistent://public/ns1/t"]
        await expect(client, "GET", "/admin/v2/namespaces/public/ns1/topics", 400,
                     query={"mode": "SOME"})
        assert await expect(client, "DELETE", "/admin/v2/namespaces/public/ns1", 409) == \
            "Cannot delete non empty namespace"
        await expect(client, "DELETE", "/admin/v2/namespaces/public/ns1", 405,
                     query={"force": "true"})
        await expect(client, "DELETE", "/admin/v2/persistent/public/ns1/t", 204)
        await expect(client, "DELETE", non_persistent, 204)
        await expect(client, "DELETE", "/admin/v2/namespaces/public/ns1", 204)
        assert not env.service.namespaces.namespace_exists("public/ns1")
        await expect(client, "DELETE", "/admin/v2/namespaces/public/ns1", 404)


# endpoint, a body to set, the registry field, what the registry then holds
POLICY_CASES: list[tuple[str, Any, str, Any]] = [
    ("retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100},
     "retention_policies", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}),
    ("messageTTL", 120, "message_ttl_in_seconds", 120),
    ("deduplication", True, "deduplicationEnabled", True),
    ("delayedDelivery", {"active": False, "tickTime": 500},
     "delayed_delivery_policies", {"active": False, "tickTime": 500,
                                   "maxDeliveryDelayInMillis": 0}),
    ("maxUnackedMessagesPerConsumer", 7, "max_unacked_messages_per_consumer", 7),
    ("maxUnackedMessagesPerSubscription", 70, "max_unacked_messages_per_subscription", 70),
    ("maxProducersPerTopic", 3, "max_producers_per_topic", 3),
    ("maxConsumersPerTopic", 4, "max_consumers_per_topic", 4),
    ("maxConsumersPerSubscription", 5, "max_consumers_per_subscription", 5),
    ("subscriptionTypesEnabled", ["Shared", "Exclusive"], "subscription_types_enabled",
     ["Exclusive", "Shared"]),
    ("autoTopicCreation", {"allowAutoTopicCreation": True, "topicType": "partitioned",
                           "defaultNumPartitions": 2},
     "autoTopicCreationOverride", {"allowAutoTopicCreation": True,
                                   "topicType": "partitioned", "defaultNumPartitions": 2}),
]


@pytest.mark.parametrize(("endpoint", "body", "field", "stored"), POLICY_CASES,
                         ids=[c[0] for c in POLICY_CASES])
async def test_policy_endpoint_round_trip(tmp_path: Path, endpoint: str, body: Any, field: str,
                                    stored: Any) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        path = f"{NS}/{endpoint}"
        await expect(client, "GET", path, 204)  # unset: null, as upstream answers it
        await expect(client, "POST", path, 204, body)
        assert env.service.namespaces.policies("public/default")[field] == stored
        assert await expect(client, "GET", path, 200) == stored
        assert (await expect(client, "GET", NS, 200))[field] == stored
        await expect(client, "DELETE", path, 204)
        assert field not in env.service.namespaces.policies("public/default")
        await expect(client, "GET", path, 204)
        await expect(client, "GET", "/admin/v2/namespaces/public/nope/" + endpoint, 404)


@pytest.mark.parametrize(("endpoint", "body", "status"), [
    ("messageTTL", -1, 412),
    ("messageTTL", "ten", 400),
    ("deduplication", 1, 400),
    ("retention", {"retentionTimeInMinutes": -2, "retentionSizeInMB": 10}, 412),
    ("retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 10}, 412),
    ("retention", 5, 400),
    ("maxUnackedMessagesPerConsumer", -1, 412),
    ("subscriptionTypesEnabled", ["Shared", "Broadcast"], 412),
    ("autoTopicCreation", {"allowAutoTopicCreation": True, "topicType": "partitioned"}, 400),
    ("delayedDelivery", {"active": "yes"}, 400),
])
async def test_policy_endpoint_rejects_invalid_values(tmp_path: Path, endpoint: str, body: Any,
                                                status: int) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        await expect(client, "POST", f"{NS}/{endpoint}", status, body)
        assert env.service.namespaces.policies("public/default") == {}


async def test_backlog_quotas_by_type(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        assert await expect(client, "GET", f"{NS}/backlogQuotaMap", 200) == {}
        await expect(client, "POST", f"{NS}/backlogQuota", 204,
                     {"limitSize": 10 * 1024 * 1024, "policy": "producer_exception"})
        await expect(client, "POST", f"{NS}/backlogQuota", 204,
                     {"limitTime": 3600, "policy": "consumer_backlog_eviction"},
                     query={"backlogQuotaType": "message_age"})
        quotas = await expect(client, "GET", f"{NS}/backlogQuotaMap", 200)
        assert quotas == {
            "destination_storage": {"limit": 10485760, "limitSize": 10485760,
                                    "limitTime": -1, "policy": "producer_exception"},
            "message_age": {"limit": -1, "limitSize": -1, "limitTime": 3600,
                            "policy": "consumer_backlog_eviction"}}
        topic, _ = await persistent_producer(env.service, "quota-topic")
        assert topic.policies.backlog_quota_limit_bytes == 10 * 1024 * 1024
        assert topic.policies.backlog_quota_policy == "producer_exception"
        assert topic.policies.backlog_quota_limit_s == 3600
        # Retention must not be smaller than the size quota, nor the quota above it.
        await expect(client, "POST", f"{NS}/retention", 412,
                     {"retentionTimeInMinutes": 10, "retentionSizeInMB": 5})
        await expect(client, "POST", f"{NS}/retention", 204,
                     {"retentionTimeInMinutes": 10, "retentionSizeInMB": 20})
        assert "exceeds configured retention" in await expect(
            client, "POST", f"{NS}/backlogQuota", 412,
            {"limitSize": 30 * 1024 * 1024, "policy": "producer_exception"})
        await expect(client, "POST", f"{NS}/backlogQuota", 400,
                     {"limitSize": 1, "policy": "drop_everything"})
        await expect(client, "POST", f"{NS}/backlogQuota", 400, {"limitSize": 1,
                     "policy": "producer_exception"}, query={"backlogQuotaType": "x"})
        # Removing one type keeps the other; the loaded topic follows at once.
        await expect(client, "DELETE", f"{NS}/backlogQuota", 204)
        assert list(await expect(client, "GET", f"{NS}/backlogQuotaMap", 200)) == \
            ["message_age"]
        assert topic.policies.backlog_quota_limit_bytes == -1
        await expect(client, "DELETE", f"{NS}/backlogQuota", 204,
                     query={"backlogQuotaType": "message_age"})
        assert await expect(client, "GET", f"{NS}/backlogQuotaMap", 200) == {}
        assert topic.policies.backlog_quota_limit_s == -1


async def test_message_ttl_set_over_http_expires_old_messages(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        service = env.service
        topic, producer = await persistent_producer(service, "ttl-topic")
        await topic.create_subscription("sub", "earliest")
        await publish_old(topic, producer, 3, age_ms=2 * HOUR_MS)
        await publish_many(topic, producer, 2)  # fresh ones
        await service.run_maintenance(force=True)
        assert topic.subscriptions["sub"].backlog() == 5  # no TTL yet
        await expect(client, "POST", f"{NS}/messageTTL", 204, 3600)
        await service.run_maintenance(force=True)
        stats = await expect(client, "GET", f"{PT}/ttl-topic/stats", 200)
        assert stats["subscriptions"]["sub"]["msgBacklog"] == 2
        assert stats["subscriptions"]["sub"]["totalMsgExpired"] == 3
        assert stats["subscriptions"]["sub"]["lastExpireTimestamp"] > 0


async def test_retention_set_over_http_keeps_consumed_ledgers(tmp_path: Path) -> None:
    async with _admin_env(tmp_path, managed_ledger_max_entries_per_ledger=2,
                          managed_ledger_min_ledger_rollover_time_s=0) as (env, _, client):
        service = env.service
        await expect(client, "POST", f"{NS}/retention", 204,
                     {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
        topic, producer = await persistent_producer(service, "kept")
        await topic.create_subscription("sub", "earliest")
        await publish_many(topic, producer, 6)
        await topic.managed_ledger.rollover_if_full()
        ledgers_before = len(topic.managed_ledger.ledgers())
        assert ledgers_before >= 3
        await expect(client, "POST", f"{PT}/kept/subscription/sub/skip_all", 204)
        assert topic.subscriptions["sub"].backlog() == 0
        await service.run_maintenance(force=True)
        internal = await expect(client, "GET", f"{PT}/kept/internalStats", 200)
        assert len(internal["ledgers"]) == ledgers_before  # infinite retention
        # Back to the broker default (no retention): consumed ledgers go.
        await expect(client, "DELETE", f"{NS}/retention", 204)
        await service.run_maintenance(force=True)
        internal = await expect(client, "GET", f"{PT}/kept/internalStats", 200)
        assert len(internal["ledgers"]) < ledgers_before
        assert internal["ledgers"][-1]["ledgerId"] == topic.managed_ledger.current_ledger_id


async def test_max_unacked_per_consumer_set_over_http_limits_dispatch(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        service = env.service
        topic, producer = await persistent_producer(service, "limited")
        await expect(client, "POST", f"{NS}/maxUnackedMessagesPerConsumer", 204, 2)
        assert topic.policies.max_unacked_messages_per_consumer == 2
        sink = RecordingSink()
        _, consumer = await service.subscribe("limited", SubscribeSpec(
            "sub", "Shared", "c1", initial_position="earliest"), sink)
        await publish_many(topic, producer, 5)
        topic.subscriptions["sub"].flow(consumer, 100)
        await wait_for(lambda: len(sink.received) >= 2)
        await settle(service)
        assert len(sink.received) == 2
        stats = await expect(client, "GET", f"{PT}/limited/stats", 200)
        assert stats["subscriptions"]["sub"]["consumers"][0][
            "blockedConsumerOnUnackedMsgs"] is True


async def test_deduplication_set_over_http_drops_resent_messages(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, "dedup")
        assert (await expect(client, "GET", f"{PT}/dedup/stats", 200)
                )["deduplicationStatus"] == "Disabled"
        await expect(client, "POST", f"{NS}/deduplication", 204, True)
        assert (await expect(client, "GET", f"{PT}/dedup/stats", 200)
                )["deduplicationStatus"] == "Enabled"
        assert await publish(topic, producer, b"once", sequence_id=7) != (-1, -1)
        assert await publish(topic, producer, b"once", sequence_id=7) == (-1, -1)
        stats = await expect(client, "GET", f"{PT}/dedup/stats", 200)
        assert stats["msgInCounter"] == 1


# -- topics ---------------------------------------------------------------------------------


async def test_partitioned_topic_lifecycle(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        await expect(client, "PUT", f"{PT}/orders/partitions", 204, 3)
        assert await expect(client, "GET", f"{PT}/orders/partitions", 200) == \
            {"partitions": 3}
        assert await expect(client, "GET", PT, 200) == [
            f"{FULL}orders-partition-{i}" for i in range(3)]
        assert await expect(client, "GET", f"{PT}/partitioned", 200) == [f"{FULL}orders"]
        assert await expect(client, "GET", f"{NPT}/partitioned", 200) == []
        assert await expect(client, "PUT", f"{PT}/orders/partitions", 409, 3) == \
            "Partitioned topic already exists"
        assert await expect(client, "PUT", f"{PT}/orders", 409) == \
            "This topic already exists"
        assert await expect(client, "PUT", f"{PT}/zero/partitions", 406, 0) == \
            "Number of partitions should be more than 0"
        await expect(client, "PUT", f"{PT}/bad/partitions", 400, raw="three")
        await expect(client, "PUT", f"{PT}/bad/partitions", 400, raw="{not json")
        await expect(client, "PUT", f"{PT}/x-partition-1/partitions", 412, 2)
        # Grow only.
        await expect(client, "POST", f"{PT}/orders/partitions", 204, 5)
        assert len(await expect(client, "GET", PT, 200)) == 5
        assert "must be greater" in await expect(client, "POST", f"{PT}/orders/partitions",
                                                 409, 2)
        await expect(client, "POST", f"{PT}/ghost/partitions", 404, 2)
        # Stats of the base name are the partitioned stats' business.
        await expect(client, "GET", f"{PT}/orders/stats", 405)
        # Delete refuses with a producer on a partition unless forced.
        await persistent_producer(env.service, f"{FULL}orders-partition-2")
        assert await expect(client, "DELETE", f"{PT}/orders/partitions", 412) == \
            "Topic has active producers/subscriptions"
        await expect(client, "DELETE", f"{PT}/orders/partitions", 204,
                     query={"force": "true"})
        assert await expect(client, "GET", f"{PT}/orders/partitions", 404) == \
            f"Topic {FULL}orders not found"
        assert await expect(client, "GET", PT, 200) == []
        await expect(client, "DELETE", f"{PT}/orders/partitions", 404)


async def test_non_partitioned_topic_lifecycle(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        await expect(client, "PUT", f"{PT}/plain", 204)
        assert await expect(client, "PUT", f"{PT}/plain", 409) == "This topic already exists"
        assert await expect(client, "GET", f"{PT}/plain/partitions", 200) == \
            {"partitions": 0}
        assert await expect(client, "GET", f"{PT}/ghost/partitions", 404) == \
            f"Topic {FULL}ghost not found"
        assert await expect(client, "GET", f"{PT}/ghost/stats", 404) == \
            f"Topic {FULL}ghost not found"
        assert await expect(client, "PUT", "/admin/v2/persistent/public/nope/t", 404) == \
            "Namespace does not exist"
        _, producer = await persistent_producer(env.service, "plain")
        assert await expect(client, "DELETE", f"{PT}/plain", 412) == \
            "Topic has active producers/subscriptions"
        await expect(client, "DELETE", f"{PT}/plain", 204, query={"force": "true"})
        assert producer.closed
        await expect(client, "GET", f"{PT}/plain/stats", 404)
        await expect(client, "DELETE", f"{PT}/plain", 404)
        assert await expect(client, "GET", PT, 200) == []


async def test_url_encoded_topic_names(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        await expect(client, "PUT", f"{PT}/a%20b%3Ac%25d", 204)
        assert await expect(client, "GET", PT, 200) == [f"{FULL}a b:c%d"]
        assert env.service.topic_exists(f"{FULL}a b:c%d")
        stats = await expect(client, "GET", f"{PT}/a%20b%3Ac%25d/stats", 200)
        assert stats["msgInCounter"] == 0
        await expect(client, "PUT", f"{PT}/a%20b%3Ac%25d/subscription/s%20one", 204)
        assert await expect(client, "GET", f"{PT}/a%20b%3Ac%25d/subscriptions", 200) == \
            ["s one"]


TOPIC_STATS_FIELDS = {"msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut",
                      "msgInCounter", "bytesInCounter", "msgOutCounter", "bytesOutCounter",
                      "averageMsgSize", "storageSize", "backlogSize", "publishers",
                      "subscriptions", "deduplicationStatus"}


async def test_stats_and_internal_stats_field_names_and_values(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, "st", name="prod-1")
        await topic.create_subscription("sub", "earliest")
        positions = await publish_many(topic, producer, 3)
        stats = await expect(client, "GET", f"{PT}/st/stats", 200)
        assert set(stats) >= TOPIC_STATS_FIELDS
        assert stats["msgInCounter"] == 3
        assert stats["bytesInCounter"] == topic.bytes_in_counter > 0
        assert stats["storageSize"] == topic.managed_ledger.total_size_bytes
        assert [p["producerName"] for p in stats["publishers"]] == ["prod-1"]
        assert stats["subscriptions"]["sub"]["msgBacklog"] == 3
        internal = await expect(client, "GET", f"{PT}/st/internalStats", 200)
        assert internal["numberOfEntries"] == 3
        last = positions[-1]
        assert internal["lastConfirmedEntry"] == f"{last[0]}:{last[1]}"
        assert set(internal["cursors"]) == {"sub"}
        assert internal["cursors"]["sub"]["markDeletePosition"] == \
            f"{positions[0][0]}:{positions[0][1] - 1}"


async def test_partitioned_stats_sum_the_partitions(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        await expect(client, "PUT", f"{PT}/ps/partitions", 204, 2)
        await expect(client, "PUT", f"{PT}/ps/subscription/sub", 204,
                     {"ledgerId": -1, "entryId": -1, "partitionIndex": -1})
        p0, prod0 = await persistent_producer(env.service, f"{FULL}ps-partition-0", "pp")
        p1, prod1 = await persistent_producer(env.service, f"{FULL}ps-partition-1", "pp")
        await publish_many(p0, prod0, 2)
        await publish_many(p1, prod1, 3)
        stats = await expect(client, "GET", f"{PT}/ps/partitioned-stats", 200)
        assert stats["metadata"] == {"partitions": 2}
        assert stats["msgInCounter"] == 5
        assert stats["bytesInCounter"] == p0.bytes_in_counter + p1.bytes_in_counter
        assert stats["storageSize"] == (p0.managed_ledger.total_size_bytes
                                        + p1.managed_ledger.total_size_bytes)
        assert stats["subscriptions"]["sub"]["msgBacklog"] == 5
        assert len(stats["publishers"]) == 1  # the same producer name on both partitions
        assert stats["publishers"][0]["msgInCounter"] == 5
        assert set(stats["partitions"]) == {f"{FULL}ps-partition-0", f"{FULL}ps-partition-1"}
        assert stats["partitions"][f"{FULL}ps-partition-1"]["msgInCounter"] == 3
        brief = await expect(client, "GET", f"{PT}/ps/partitioned-stats", 200,
                             query={"perPartition": "false"})
        assert brief["partitions"] == {}
        assert brief["msgInCounter"] == 5
        internal = await expect(client, "GET", f"{PT}/ps/partitioned-internalStats", 200)
        assert internal["metadata"] == {"partitions": 2}
        assert internal["partitions"][f"{FULL}ps-partition-0"]["numberOfEntries"] == 2
        await expect(client, "PUT", f"{PT}/single", 204)
        assert await expect(client, "GET", f"{PT}/single/partitioned-stats", 404) == \
            f"Partitioned Topic {FULL}single not found"


def test_aggregate_partitioned_stats_merges_by_name() -> None:
    def part(msgs: int, avg: float, backlog: int, consumer: str) -> dict[str, Any]:
        return {"msgInCounter": msgs, "bytesInCounter": msgs * 10, "averageMsgSize": avg,
                "publishers": [{"producerName": "p", "msgInCounter": msgs,
                                "bytesInCounter": msgs * 10, "averageMsgSize": 10.0}],
                "subscriptions": {"s": {"msgBacklog": backlog, "isDurable": True,
                                        "blockedSubscriptionOnUnackedMsgs": backlog > 5,
                                        "lastExpireTimestamp": 99,
                                        "consumers": [{"consumerName": consumer}]}}}

    total = aggregate_partitioned_stats([part(2, 10.0, 1, "a"), part(4, 20.0, 7, "b")])
    assert total["msgInCounter"] == 6
    assert total["bytesInCounter"] == 60
    assert total["averageMsgSize"] == 15.0  # the mean over partitions
    assert total["publishers"] == [{"producerName": "p", "msgInCounter": 6,
                                    "bytesInCounter": 60, "averageMsgSize": 10.0}]
    merged = total["subscriptions"]["s"]
    assert merged["msgBacklog"] == 8
    assert merged["blockedSubscriptionOnUnackedMsgs"] is True
    assert merged["lastExpireTimestamp"] == 99  # not summed
    assert [c["consumerName"] for c in merged["consumers"]] == ["a", "b"]
    assert aggregate_partitioned_stats([])["msgInCounter"] == 0


# -- subscriptions --------------------------------------------------------------------------


async def test_subscription_create_positions_and_cursor_operations(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, "subs")
        positions = await publish_many(topic, producer, 4)
        base = f"{PT}/subs/subscription"
        await expect(client, "PUT", f"{base}/latest", 204)  # no body: MessageId.latest
        await expect(client, "PUT", f"{base}/first", 204, {"ledgerId": -1, "entryId": -1})
        second = positions[1]
        await expect(client, "PUT", f"{base}/from-second", 204,
                     {"ledgerId": second[0], "entryId": second[1], "partitionIndex": -1})
        subs = topic.subscriptions
        assert (subs["latest"].backlog(), subs["first"].backlog(),
                subs["from-second"].backlog()) == (0, 4, 3)
        assert await expect(client, "PUT", f"{base}/first", 409) == \
            "Subscription already exists for topic"
        await expect(client, "PUT", f"{base}/pulsar.dedup", 412)
        await expect(client, "PUT", f"{base}/bad", 400, {"ledgerId": 1})
        assert await expect(client, "GET", f"{PT}/subs/subscriptions", 200) == \
            ["first", "from-second", "latest"]
        # skip n, skip all, reset by time, reset to a position (included or not).
        await expect(client, "POST", f"{base}/first/skip/1", 204)
        assert subs["first"].backlog() == 3
        await expect(client, "POST", f"{base}/first/skip_all", 204)
        assert subs["first"].backlog() == 0
        await expect(client, "POST", f"{base}/first/resetcursor/0", 204)
        assert subs["first"].backlog() == 4
        await expect(client, "POST", f"{base}/first/resetcursor/{now_ms() + HOUR_MS}", 204)
        assert subs["first"].backlog() == 0
        third = positions[2]
        await expect(client, "POST", f"{base}/first/resetcursor", 204,
                     {"ledgerId": third[0], "entryId": third[1]})
        assert subs["first"].backlog() == 2
        await expect(client, "POST", f"{base}/first/resetcursor", 204,
                     {"ledgerId": third[0], "entryId": third[1], "isExcluded": True})
        assert subs["first"].backlog() == 1
        # Missing subscriptions, and names that are not numbers.
        assert await expect(client, "POST", f"{base}/ghost/skip_all", 404) == \
            f"Subscription ghost not found for topic {FULL}subs"
        await expect(client, "POST", f"{base}/ghost/skip/2", 404)
        await expect(client, "POST", f"{base}/first/skip/two", 404)
        await expect(client, "POST", f"{PT}/ghost-topic/subscription/s/skip_all", 404)


async def test_expire_messages_per_subscription_and_all(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, "exp")
        for name in ("a", "b", "c"):
            await topic.create_subscription(name, "earliest")
        await publish_old(topic, producer, 2, age_ms=HOUR_MS)
        await publish_many(topic, producer, 1)
        base = f"{PT}/exp/subscription"
        await expect(client, "POST", f"{base}/a/expireMessages/7200", 204)
        assert topic.subscriptions["a"].backlog() == 3  # nothing that old
        await expect(client, "POST", f"{base}/a/expireMessages/60", 204)
        assert topic.subscriptions["a"].backlog() == 1
        assert topic.subscriptions["a"].total_msg_expired == 2
        await expect(client, "POST", f"{PT}/exp/all_subscription/expireMessages/60", 204)
        assert [topic.subscriptions[n].backlog() for n in "abc"] == [1, 1, 1]


async def test_reset_cursor_into_a_batch(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, "batches")
        await topic.create_subscription("sub", "latest")
        ledger_id, entry_id = await publish_batch(topic, producer,
                                                  [b"b0", b"b1", b"b2", b"b3"])
        base = f"{PT}/batches/subscription/sub/resetcursor"
        await expect(client, "POST", base, 204,
                     {"ledgerId": ledger_id, "entryId": entry_id, "batchIndex": 2})
        subscription = topic.subscriptions["sub"]
        position = subscription.cursor.read_position
        assert (position.ledger_id, position.entry_id) == (ledger_id, entry_id)
        # Set bits are the indexes still to deliver: 2 and 3.
        assert subscription.cursor.batch_deleted[position] == 0b1100
        await expect(client, "POST", base, 204, {"ledgerId": ledger_id,
                                                  "entryId": entry_id, "batchIndex": 2,
                                                  "isExcluded": True})
        assert subscription.cursor.batch_deleted[position] == 0b1000


async def test_delete_subscription_with_and_without_force(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        service = env.service
        await expect(client, "PUT", f"{PT}/del", 204)
        sink = RecordingSink()
        _, consumer = await service.subscribe("del", SubscribeSpec("sub", "Shared", "c1"),
                                              sink)
        path = f"{PT}/del/subscription/sub"
        assert await expect(client, "DELETE", path, 412) == \
            "Subscription has active connected consumers"
        await expect(client, "DELETE", path, 204, query={"force": "true"})
        assert sink.closed == [(consumer, "subscription deleted")]
        assert await expect(client, "GET", f"{PT}/del/subscriptions", 200) == []
        assert await expect(client, "DELETE", path, 404) == \
            f"Subscription sub not found for topic {FULL}del"


async def test_subscription_operations_on_a_partitioned_topic(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        service = env.service
        await expect(client, "PUT", f"{PT}/multi/partitions", 204, 2)
        await expect(client, "PUT", f"{PT}/multi/subscription/s", 204,
                     {"ledgerId": -1, "entryId": -1})
        partitions = [await service.get_topic(f"{FULL}multi-partition-{i}")
                      for i in range(2)]
        assert all(isinstance(p, PersistentTopic) and "s" in p.subscriptions
                   for p in partitions)
        assert await expect(client, "GET", f"{PT}/multi/subscriptions", 200) == ["s"]
        for i, partition in enumerate(partitions):
            _, producer = await service.create_producer(partition.name, ProducerSpec("p"))
            await publish_many(partition, producer, i + 1)
        base = f"{PT}/multi/subscription/s"
        await expect(client, "POST", f"{base}/skip/1", 405)
        await expect(client, "POST", f"{base}/resetcursor", 405, {"ledgerId": 1,
                                                                  "entryId": 0})
        await expect(client, "POST", f"{base}/skip_all", 204)
        backlogs = [p.subscriptions["s"].backlog() for p in partitions]
        assert backlogs == [0, 0]
        await expect(client, "POST", f"{base}/resetcursor/0", 204)
        backlogs = [p.subscriptions["s"].backlog() for p in partitions]
        assert backlogs == [1, 2]
        await expect(client, "PUT", f"{base}", 409)
        await expect(client, "DELETE", base, 204)
        assert all("s" not in p.subscriptions for p in partitions)
        await expect(client, "DELETE", base, 404)


async def test_non_persistent_topics(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (env, _, client):
        service = env.service
        await expect(client, "PUT", f"{NPT}/live", 204)
        assert await expect(client, "GET", NPT, 200) == ["non-persistent://public/default/live"]
        assert await expect(client, "GET", PT, 200) == []
        await expect(client, "GET", f"{NPT}/ghost/stats", 404)
        sink = RecordingSink()
        _, consumer = await service.subscribe("non-persistent://public/default/live",
                                              SubscribeSpec("sub", "Shared", "c1"), sink)
        stats = await expect(client, "GET", f"{NPT}/live/stats", 200)
        assert stats["msgDropCounter"] == 0
        assert list(stats["subscriptions"]) == ["sub"]
        assert await expect(client, "GET", f"{NPT}/live/subscriptions", 200) == ["sub"]
        await expect(client, "GET", f"{NPT}/live/internalStats", 405)
        await expect(client, "PUT", f"{NPT}/live/subscription/other", 405)
        await expect(client, "POST", f"{NPT}/live/subscription/sub/skip_all", 405)
        await expect(client, "DELETE", f"{NPT}/live/subscription/sub", 412)
        await expect(client, "DELETE", f"{NPT}/live", 412)
        await expect(client, "DELETE", f"{NPT}/live", 204, query={"force": "true"})
        assert sink.closed == [(consumer, "topic deleted")]
        assert await expect(client, "GET", NPT, 200) == []


async def test_unknown_paths_methods_and_bodies_answer_with_a_reason(tmp_path: Path) -> None:
    async with _admin_env(tmp_path) as (_, _, client):
        await expect(client, "GET", "/admin/v2/nothing-here", 404)
        await expect(client, "PATCH", "/admin/v2/tenants", 405)
        await expect(client, "POST", f"{NS}/messageTTL", 400, raw="{broken")
        await expect(client, "DELETE", f"{PT}/x", 400, query={"force": "maybe"})
