"""The namespace-policy rules at the namespace layer (`broker/_policies.py`, applied by
`NamespaceRegistry.set_policy`): an embedded caller meets the same rules as the admin REST
API (tests/broker/test_admin.py checks the statuses those errors answer). A refused value
leaves the stored policies as they were. Real storage (LMDB metadata) in a temporary
directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import BrokerConfig, NotAllowedError
from magnetar.broker._errors import InvalidPolicyError, MalformedPolicyError, PartitionCountError
from magnetar.broker._namespaces import NamespaceRegistry
from magnetar.broker._policies import check_partition_count, check_policy
from magnetar.storage import Storage

NS = "public/default"
MB = 1024 * 1024


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[NamespaceRegistry]:
    storage = Storage.open(tmp_path)
    try:
        namespaces = NamespaceRegistry(storage.metadata,
                                       BrokerConfig(max_num_partitions_per_partitioned_topic=8))
        namespaces.bootstrap()
        yield namespaces
    finally:
        storage.close()


def _quota(limit_bytes: int) -> dict[str, Any]:
    return {"limitSize": limit_bytes, "limitTime": -1, "policy": "producer_request_hold"}


def test_retention_must_exceed_the_backlog_quota(registry: NamespaceRegistry) -> None:
    registry.set_backlog_quota(NS, "destination_storage", _quota(10 * MB))
    with pytest.raises(InvalidPolicyError, match="Retention Quota must exceed"):
        registry.set_policy(NS, "retention_policies",
                            {"retentionTimeInMinutes": 60, "retentionSizeInMB": 5})
    assert "retention_policies" not in registry.policies(NS)
    registry.set_policy(NS, "retention_policies",
                        {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10})
    assert registry.policies(NS)["retention_policies"]["retentionSizeInMB"] == 10


def test_backlog_quota_may_not_exceed_the_retention(registry: NamespaceRegistry) -> None:
    registry.set_policy(NS, "retention_policies",
                        {"retentionTimeInMinutes": 60, "retentionSizeInMB": 1})
    with pytest.raises(InvalidPolicyError, match="Backlog Quota exceeds"):
        registry.set_backlog_quota(NS, "destination_storage", _quota(2 * MB))
    # The same rule when the whole map is set, as an embedded caller may.
    with pytest.raises(InvalidPolicyError, match="Backlog Quota exceeds"):
        registry.set_policy(NS, "backlog_quota_map", {"destination_storage": _quota(2 * MB)})
    assert "backlog_quota_map" not in registry.policies(NS)
    registry.set_backlog_quota(NS, "destination_storage", _quota(MB))
    stored = registry.policies(NS)["backlog_quota_map"]["destination_storage"]
    assert stored == {"limit": MB, "limitSize": MB, "limitTime": -1,
                      "policy": "producer_request_hold"}
    registry.remove_backlog_quota(NS, "destination_storage")
    assert "backlog_quota_map" not in registry.policies(NS)


@pytest.mark.parametrize(("field", "value", "error"), [
    ("retention_policies", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 5},
     InvalidPolicyError),
    ("retention_policies", {"retentionTimeInMinutes": -2, "retentionSizeInMB": -1},
     InvalidPolicyError),
    ("retention_policies", [1, 2], MalformedPolicyError),
    ("message_ttl_in_seconds", -1, InvalidPolicyError),
    ("message_ttl_in_seconds", "60", MalformedPolicyError),
    ("deduplicationEnabled", "yes", MalformedPolicyError),
    ("max_producers_per_topic", -3, InvalidPolicyError),
    ("max_consumers_per_topic", True, MalformedPolicyError),
    ("delayed_delivery_policies", {"active": True, "tickTime": -1}, InvalidPolicyError),
    ("subscription_types_enabled", ["Exclusive", "Broadcast"], InvalidPolicyError),
    ("autoTopicCreationOverride", {"allowAutoTopicCreation": True, "topicType": "other"},
     MalformedPolicyError),
    ("autoTopicCreationOverride", {"allowAutoTopicCreation": True, "topicType": "partitioned",
                                   "defaultNumPartitions": 9}, PartitionCountError),
    ("backlog_quota_map", {"size_quota": _quota(1)}, MalformedPolicyError),
    ("backlog_quota_map", {"message_age": {"limitTime": 5, "policy": "drop"}},
     MalformedPolicyError),
    ("schema_validation_enforced", 1, MalformedPolicyError),
    ("no_such_policy", 1, NotAllowedError),
])
def test_a_value_breaking_a_rule_is_refused_and_nothing_stored(
        registry: NamespaceRegistry, field: str, value: Any, error: type[Exception]) -> None:
    before = registry.policies(NS)
    with pytest.raises(error):
        registry.set_policy(NS, field, value)
    assert registry.policies(NS) == before


def test_topic_policies_follow_the_same_rules(registry: NamespaceRegistry) -> None:
    topic = "persistent://public/default/t"
    with pytest.raises(InvalidPolicyError):
        registry.set_topic_policy(topic, "max_unacked_messages_per_consumer", -1)
    assert registry.topic_policies(topic) == {}
    registry.set_topic_policy(topic, "max_unacked_messages_per_consumer", 5)
    assert registry.topic_policies(topic) == {"max_unacked_messages_per_consumer": 5}


def test_values_are_stored_normalised(registry: NamespaceRegistry) -> None:
    registry.set_policy(NS, "subscription_types_enabled", ["Shared", "Exclusive", "Shared"])
    registry.set_policy(NS, "delayed_delivery_policies", {"active": True})
    registry.set_policy(NS, "retention_policies", {"retentionTimeInMinutes": 0})
    policies = registry.policies(NS)
    assert policies["subscription_types_enabled"] == ["Exclusive", "Shared"]
    assert policies["delayed_delivery_policies"] == {"active": True, "tickTime": 1000,
                                                     "maxDeliveryDelayInMillis": 0}
    assert policies["retention_policies"] == {"retentionTimeInMinutes": 0,
                                              "retentionSizeInMB": 0}


def test_none_removes_unless_a_value_was_required(registry: NamespaceRegistry) -> None:
    registry.set_policy(NS, "message_ttl_in_seconds", 30)
    registry.set_policy(NS, "message_ttl_in_seconds", None)
    assert "message_ttl_in_seconds" not in registry.policies(NS)
    config = BrokerConfig()
    with pytest.raises(MalformedPolicyError, match="true or false"):
        check_policy("deduplicationEnabled", None, {}, config, none_removes=False)


@pytest.mark.parametrize(("count", "error"), [(0, PartitionCountError),
                                               (9, PartitionCountError),
                                               ("3", MalformedPolicyError)])
def test_partition_counts(count: Any, error: type[Exception]) -> None:
    config = BrokerConfig(max_num_partitions_per_partitioned_topic=8)
    assert check_partition_count(8, config) == 8
    with pytest.raises(error):
        check_partition_count(count, config)
