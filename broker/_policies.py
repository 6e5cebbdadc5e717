"""The rules a namespace or topic policy value must follow before it is stored.

`NamespaceRegistry.set_policy` (and `set_topic_policy`) pass every value through
`check_policy` (a topic's value against the policies in force for the topic: its own over
its namespace's), so an embedded caller of `BrokerService` and the admin REST API, which
only parses the request and maps the errors to statuses, enforce the same rules. A value is
checked for its JSON shape (`MalformedPolicyError`, the API's 400), its range and its
agreement with the policies already set (`InvalidPolicyError`, 412): the retention size must
not fall below the `destination_storage` backlog quota, nor the quota exceed the retention.
Partition counts (`defaultNumPartitions`, a partitioned topic's) must lie within
`max_num_partitions_per_partitioned_topic` (`PartitionCountError`, 406). A check returns the
value to store, normalised (defaults filled in, a set of subscription types sorted).

The error texts are Pulsar's admin API reasons, so they speak of "the body".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._config import BrokerConfig
from ._errors import InvalidPolicyError, MalformedPolicyError, NotAllowedError, PartitionCountError

__all__ = ["BACKLOG_QUOTA_TYPES", "POLICY_FIELDS", "check_backlog_quota_type",
           "check_partition_count", "check_policy"]

MB = 1024 * 1024

# Namespace policy fields (Pulsar's JSON names) that Magnetar honours.
POLICY_FIELDS = (
    "retention_policies",  # {"retentionTimeInMinutes": int, "retentionSizeInMB": int}
    "message_ttl_in_seconds",  # int
    "deduplicationEnabled",  # bool
    "backlog_quota_map",  # {"destination_storage": {"limitSize", "policy"},
    #                        "message_age": {"limitTime", "policy"}}
    "delayed_delivery_policies",  # {"active": bool, "tickTime": int, "maxDeliveryDelayInMillis"}
    "max_unacked_messages_per_consumer",  # int
    "max_unacked_messages_per_subscription",  # int
    "max_producers_per_topic",  # int
    "max_consumers_per_topic",  # int
    "max_consumers_per_subscription",  # int
    "subscription_types_enabled",  # [str]
    "autoTopicCreationOverride",  # {"allowAutoTopicCreation", "topicType", "defaultNumPartitions"}
    "schema_compatibility_strategy",  # str, a SchemaCompatibilityStrategy name
    "is_allow_auto_update_schema",  # bool
    "schema_validation_enforced",  # bool
    "compaction_threshold",  # int, backlog bytes that trigger compaction (0: never)
    "subscription_auth_mode",  # "None" or "Prefix" (security/_authz.py)
)

SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
BACKLOG_QUOTA_POLICIES = ("producer_request_hold", "producer_exception",
                          "consumer_backlog_eviction")
BACKLOG_QUOTA_TYPES = ("destination_storage", "message_age")

Check = Callable[[Any, dict[str, Any], BrokerConfig], Any]


def check_policy(field: str, value: Any, policies: dict[str, Any], config: BrokerConfig, *,
                 none_removes: bool = True) -> Any:
    """The value to store for `field`, given the `policies` already set beside it. None is
    a removal, always allowed for a known field, unless `none_removes` is False (a request
    that gave no value): then it is checked like any other value and refused.

    Raises:
        NotAllowedError: `field` is not a policy Magnetar knows.
        MalformedPolicyError, InvalidPolicyError, PartitionCountError: the value breaks a
            rule (see the module comment). Nothing is stored by the caller in either case.
    """
    if field not in POLICY_FIELDS:
        raise NotAllowedError(f"Unknown policy {field}; known: {', '.join(POLICY_FIELDS)}")
    check = _CHECKS.get(field)
    if check is None or (value is None and none_removes):
        return value
    return check(value, policies, config)


def check_partition_count(count: Any, config: BrokerConfig) -> int:
    """A partition count: an integer from 1 to `max_num_partitions_per_partitioned_topic`
    (0 there: no limit), as Pulsar's admin API requires."""
    count = _int(count, "the number of partitions")
    if count <= 0:
        raise PartitionCountError("Number of partitions should be more than 0")
    limit = config.max_num_partitions_per_partitioned_topic
    if 0 < limit < count:
        raise PartitionCountError(f"Number of partitions should be less than or equal to "
                                  f"{limit}")
    return int(count)


def check_backlog_quota_type(kind: str) -> str:
    if kind not in BACKLOG_QUOTA_TYPES:
        raise MalformedPolicyError(f"backlogQuotaType must be one of "
                                   f"{', '.join(BACKLOG_QUOTA_TYPES)}")
    return kind


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedPolicyError(f"The body must be {what} (an integer)")
    return value


def _non_negative(what: str) -> Check:
    def check(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
        if _int(value, what) < 0:
            raise InvalidPolicyError(f"Invalid value for {what}: it must be 0 or more")
        return value
    return check


def _check_ttl(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
    if _int(value, "the TTL in seconds") < 0:
        raise InvalidPolicyError("Invalid value for message TTL")
    return value


def _check_bool(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
    if not isinstance(value, bool):
        raise MalformedPolicyError("The body must be true or false")
    return value


def _check_retention(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
    """Both limits -1 (infinite) or more, both 0 or neither, and the size not below the
    backlog quota's."""
    if not isinstance(value, dict):
        raise MalformedPolicyError("The body must be a RetentionPolicies object")
    minutes = _int(value.get("retentionTimeInMinutes", 0), "retentionTimeInMinutes")
    size_mb = _int(value.get("retentionSizeInMB", 0), "retentionSizeInMB")
    if minutes < -1 or size_mb < -1:
        raise InvalidPolicyError("Invalid retention policy: limits must be -1 (infinite) or "
                                 "more")
    if (minutes == 0) != (size_mb == 0):
        raise InvalidPolicyError("Invalid retention policy: setting only one of time and "
                                 "size to 0 is invalid; use -1 to ignore a limit, or both 0 "
                                 "for none")
    quota = (policies.get("backlog_quota_map") or {}).get("destination_storage") or {}
    limit = int(quota.get("limitSize", -1))
    if size_mb > 0 and limit > 0 and size_mb * MB < limit:
        raise InvalidPolicyError("Retention Quota must exceed configured backlog quota for "
                                 "namespace.")
    return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb}


def _check_backlog_quota(value: Any, kind: str, policies: dict[str, Any]) -> dict[str, Any]:
    """A BacklogQuota (`limit`/`limitSize` bytes, `limitTime` s, `policy`) of one type; a
    `destination_storage` limit may not exceed the retention size."""
    if not isinstance(value, dict):
        raise MalformedPolicyError("The body must be a BacklogQuota object")
    size = _int(value.get("limitSize", value.get("limit", -1)), "limitSize")
    seconds = _int(value.get("limitTime", -1), "limitTime")
    policy = value.get("policy")
    if policy not in BACKLOG_QUOTA_POLICIES:
        raise MalformedPolicyError(f"policy must be one of {', '.join(BACKLOG_QUOTA_POLICIES)}")
    retention = policies.get("retention_policies") or {}
    retention_mb = int(retention.get("retentionSizeInMB", -1))
    if kind == "destination_storage" and size > 0 and retention_mb > 0 \
            and size > retention_mb * MB:
        raise InvalidPolicyError("Backlog Quota exceeds configured retention quota for "
                                 "namespace. Please increase retention quota and retry")
    return {"limit": size, "limitSize": size, "limitTime": seconds, "policy": policy}


def _check_quota_map(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
    if not isinstance(value, dict):
        raise MalformedPolicyError("The backlog quota map must be an object of BacklogQuota "
                                   "objects by backlogQuotaType")
    return {check_backlog_quota_type(kind): _check_backlog_quota(quota, kind, policies)
            for kind, quota in value.items()}


def _check_delayed(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
    if not isinstance(value, dict):
        raise MalformedPolicyError("The body must be a DelayedDeliveryPolicies object")
    checked = {"active": _check_bool(value.get("active", False), policies, config),
               "tickTime": _int(value.get("tickTime", 1000), "tickTime"),
               "maxDeliveryDelayInMillis": _int(value.get("maxDeliveryDelayInMillis", 0),
                                                "maxDeliveryDelayInMillis")}
    if checked["tickTime"] < 0 or checked["maxDeliveryDelayInMillis"] < 0:
        raise InvalidPolicyError("Invalid delayed delivery policy: times must be 0 or more")
    return checked


def _check_types(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MalformedPolicyError("The body must be a list of subscription types")
    unknown = [v for v in value if v not in SUBSCRIPTION_TYPES]
    if unknown:
        raise InvalidPolicyError(f"Unknown subscription types {unknown}")
    return sorted(set(value))


def _check_auto_creation(value: Any, policies: dict[str, Any], config: BrokerConfig) -> Any:
    if not isinstance(value, dict) or not isinstance(value.get("allowAutoTopicCreation"), bool):
        raise MalformedPolicyError("The body must be an AutoTopicCreationOverride object")
    kind = value.get("topicType", "non-partitioned")
    checked: dict[str, Any] = {"allowAutoTopicCreation": value["allowAutoTopicCreation"],
                               "topicType": kind}
    if kind == "partitioned":
        partitions = value.get("defaultNumPartitions")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise MalformedPolicyError("Invalid configuration for autoTopicCreationOverride: "
                                       "defaultNumPartitions must be 1 or more")
        checked["defaultNumPartitions"] = check_partition_count(partitions, config)
    elif kind != "non-partitioned":
        raise MalformedPolicyError("Invalid configuration for autoTopicCreationOverride: "
                                   "topicType must be partitioned or non-partitioned")
    return checked


# The schema compatibility strategy's names are the schema wing's; its admin route checks them.
_CHECKS: dict[str, Check] = {
    "retention_policies": _check_retention,
    "message_ttl_in_seconds": _check_ttl,
    "deduplicationEnabled": _check_bool,
    "backlog_quota_map": _check_quota_map,
    "delayed_delivery_policies": _check_delayed,
    "max_unacked_messages_per_consumer": _non_negative("maxUnackedMessagesPerConsumer"),
    "max_unacked_messages_per_subscription": _non_negative(
        "maxUnackedMessagesPerSubscription"),
    "max_producers_per_topic": _non_negative("maxProducersPerTopic"),
    "max_consumers_per_topic": _non_negative("maxConsumersPerTopic"),
    "max_consumers_per_subscription": _non_negative("maxConsumersPerSubscription"),
    "subscription_types_enabled": _check_types,
    "autoTopicCreationOverride": _check_auto_creation,
    "is_allow_auto_update_schema": _check_bool,
    "schema_validation_enforced": _check_bool,
    "compaction_threshold": _non_negative("compactionThreshold"),
}
assert set(_CHECKS) <= set(POLICY_FIELDS)
