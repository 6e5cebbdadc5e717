"""Tenants, namespaces, their policies, topic policies and partitioned-topic metadata.

Everything lives in the storage's metadata store, one JSON record per key, written with a
durable transaction (these change rarely):

| key                                | value                                                |
|------------------------------------|------------------------------------------------------|
| `tenant/<tenant>`                  | TenantInfo: `adminRoles`, `allowedClusters`          |
| `ns/<tenant>/<namespace>`          | namespace Policies (Pulsar's JSON field names)       |
| `partitioned/<full topic name>`    | `{"partitions": n}`                                  |
| `topicpolicy/<full topic name>`    | topic-level policies (the same field names)          |

The schema policies (`schema_compatibility_strategy`, `is_allow_auto_update_schema`,
`schema_validation_enforced`) resolve the same way, into a `SchemaPolicy` (`schema_policy`).

Policy resolution follows Pulsar: a topic-level value beats the namespace's, which beats the
broker configuration. `Policies` keeps the fields users script against through the admin
API; the effective values are computed by `effective_policies`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from magnetar.storage import LedgerMetadata

from ._config import BrokerConfig
from ._errors import MetadataError, NotAllowedError

__all__ = ["EffectivePolicies", "NamespaceRegistry", "SchemaPolicy"]

_NAME = re.compile(r"^[-=:.\w]+$")

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
)


@dataclass(frozen=True)
class SchemaPolicy:
    """The schema policies in force for one topic (see `_schema_compat` for strategies)."""

    compatibility_strategy: str  # never UNDEFINED: that resolves to the broker's default
    allow_auto_update: bool  # False: a producer may only use a registered schema
    validation_enforced: bool  # True: a producer without a schema is refused on a topic
    #                            that has one


@dataclass(frozen=True)
class EffectivePolicies:
    """The policies in force for one topic after topic > namespace > broker resolution."""

    retention_time_minutes: int
    retention_size_mb: int
    message_ttl_s: int
    deduplication_enabled: bool
    backlog_quota_limit_bytes: int
    backlog_quota_policy: str
    backlog_quota_limit_s: int  # the message_age quota: oldest unacked message's age
    backlog_quota_age_policy: str
    delayed_delivery_enabled: bool
    delayed_delivery_tick_ms: int
    delayed_delivery_max_delay_ms: int
    max_unacked_messages_per_consumer: int
    max_unacked_messages_per_subscription: int
    max_producers_per_topic: int
    max_consumers_per_topic: int
    max_consumers_per_subscription: int
    subscription_types_enabled: tuple[str, ...]


def _check_name(kind: str, name: str) -> None:
    if not name or not _NAME.match(name):
        raise MetadataError(f"Invalid {kind} name '{name}': use letters, digits and -=:._")


class NamespaceRegistry:
    """Tenants, namespaces and policies, persisted in the metadata store."""

    def __init__(self, metadata: LedgerMetadata, config: BrokerConfig):
        self._meta = metadata
        self._config = config

    def bootstrap(self) -> None:
        """Create the namespaces the broker starts with (public/default) if missing."""
        for full in self._config.initial_namespaces:
            tenant, _, _ = full.partition("/")
            if not self.tenant_exists(tenant):
                self.create_tenant(tenant, {"adminRoles": [], "allowedClusters":
                                            [self._config.cluster_name]})
            if not self.namespace_exists(full):
                self.create_namespace(full)

    # -- tenants ---------------------------------------------------------------------------

    def tenants(self) -> list[str]:
        return [k.decode()[len("tenant/"):] for k, _ in self._meta.scan(b"tenant/")]

    def tenant_exists(self, tenant: str) -> bool:
        return self._meta.get(b"tenant/" + tenant.encode()) is not None

    def tenant_info(self, tenant: str) -> dict[str, Any]:
        raw = self._meta.get(b"tenant/" + tenant.encode())
        if raw is None:
            raise MetadataError(f"Tenant {tenant} does not exist")
        info: dict[str, Any] = json.loads(raw)
        return info

    def create_tenant(self, tenant: str, info: dict[str, Any] | None = None) -> None:
        _check_name("tenant", tenant)
        with self._meta.transaction() as txn:
            key = b"tenant/" + tenant.encode()
            if txn.get(key) is not None:
                raise MetadataError(f"Tenant {tenant} already exists")
            body = {"adminRoles": [], "allowedClusters": [self._config.cluster_name]}
            body.update(info or {})
            txn.put(key, json.dumps(body).encode())

    def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        current = self.tenant_info(tenant)
        current.update(info)
        self._meta.put(b"tenant/" + tenant.encode(), json.dumps(current).encode())

    def delete_tenant(self, tenant: str) -> None:
        if not self.tenant_exists(tenant):
            raise MetadataError(f"Tenant {tenant} does not exist")
        if self.namespaces(tenant):
            raise NotAllowedError(f"Tenant {tenant} still has namespaces")
        self._meta.delete(b"tenant/" + tenant.encode())

    # -- namespaces ------------------------------------------------------------------------

    def namespaces(self, tenant: str) -> list[str]:
        prefix = b"ns/" + tenant.encode() + b"/"
        return [k.decode()[len("ns/"):] for k, _ in self._meta.scan(prefix)]

    def namespace_exists(self, namespace: str) -> bool:
        return self._meta.get(b"ns/" + namespace.encode()) is not None

    def create_namespace(self, namespace: str, policies: dict[str, Any] | None = None) -> None:
        tenant, slash, local = namespace.partition("/")
        if not slash:
            raise MetadataError(f"Invalid namespace name '{namespace}': use tenant/namespace")
        _check_name("namespace", local)
        if not self.tenant_exists(tenant):
            raise MetadataError(f"Tenant {tenant} does not exist")
        with self._meta.transaction() as txn:
            key = b"ns/" + namespace.encode()
            if txn.get(key) is not None:
                raise MetadataError(f"Namespace {namespace} already exists")
            txn.put(key, json.dumps(self._clean(policies or {})).encode())

    def delete_namespace(self, namespace: str) -> None:
        if not self.namespace_exists(namespace):
            raise MetadataError(f"Namespace {namespace} does not exist")
        self._meta.delete(b"ns/" + namespace.encode())

    def policies(self, namespace: str) -> dict[str, Any]:
        raw = self._meta.get(b"ns/" + namespace.encode())
        if raw is None:
            raise MetadataError(f"Namespace {namespace} does not exist")
        policies: dict[str, Any] = json.loads(raw)
        return policies

    def set_policy(self, namespace: str, field: str, value: Any) -> None:
        """Set (or with value None remove) one namespace policy field."""
        policies = self.policies(namespace)
        self._set(policies, field, value)
        self._meta.put(b"ns/" + namespace.encode(), json.dumps(policies).encode())

    # -- topics ----------------------------------------------------------------------------

    def topic_policies(self, topic: str) -> dict[str, Any]:
        raw = self._meta.get(b"topicpolicy/" + topic.encode())
        return {} if raw is None else dict(json.loads(raw))

    def set_topic_policy(self, topic: str, field: str, value: Any) -> None:
        policies = self.topic_policies(topic)
        self._set(policies, field, value)
        self._meta.put(b"topicpolicy/" + topic.encode(), json.dumps(policies).encode())

    def partitions(self, topic: str) -> int:
        """The partition count of a partitioned topic, 0 when it is not partitioned."""
        raw = self._meta.get(b"partitioned/" + topic.encode())
        return 0 if raw is None else int(json.loads(raw)["partitions"])

    def set_partitions(self, topic: str, partitions: int, *, create: bool) -> None:
        assert partitions >= 0
        with self._meta.transaction() as txn:
            key = b"partitioned/" + topic.encode()
            existing = txn.get(key)
            if create and existing is not None:
                raise MetadataError(f"Partitioned topic {topic} already exists")
            if not create and existing is None:
                raise MetadataError(f"Partitioned topic {topic} does not exist")
            if partitions == 0:
                txn.delete(key)
            else:
                txn.put(key, json.dumps({"partitions": partitions}).encode())

    def partitioned_topics(self, namespace: str) -> list[str]:
        found = []
        for key, _ in self._meta.scan(b"partitioned/"):
            name = key.decode()[len("partitioned/"):]
            if name.split("://", 1)[-1].startswith(namespace + "/"):
                found.append(name)
        return found

    # -- resolution ------------------------------------------------------------------------

    def effective_policies(self, topic: str, namespace: str) -> EffectivePolicies:
        namespace_policies = self.policies(namespace) if self.namespace_exists(namespace) else {}
        merged = dict(namespace_policies)
        merged.update(self.topic_policies(topic))
        return self._resolve(merged)

    def _resolve(self, p: dict[str, Any]) -> EffectivePolicies:
        c = self._config
        retention = p.get("retention_policies") or {}
        quota = (p.get("backlog_quota_map") or {}).get("destination_storage") or {}
        age_quota = (p.get("backlog_quota_map") or {}).get("message_age") or {}
        delayed = p.get("delayed_delivery_policies") or {}
        return EffectivePolicies(
            retention_time_minutes=int(retention.get("retentionTimeInMinutes",
                                                     c.default_retention_time_minutes)),
            retention_size_mb=int(retention.get("retentionSizeInMB",
                                                c.default_retention_size_mb)),
            message_ttl_s=int(p.get("message_ttl_in_seconds") or c.ttl_duration_default_s),
            deduplication_enabled=bool(p.get("deduplicationEnabled",
                                             c.broker_deduplication_enabled)),
            backlog_quota_limit_bytes=int(quota.get("limitSize",
                                                    c.backlog_quota_default_limit_bytes)),
            backlog_quota_policy=str(quota.get("policy",
                                               c.backlog_quota_default_retention_policy)),
            backlog_quota_limit_s=int(age_quota.get("limitTime",
                                                    c.backlog_quota_default_limit_s)),
            backlog_quota_age_policy=str(age_quota.get(
                "policy", c.backlog_quota_default_retention_policy)),
            delayed_delivery_enabled=bool(delayed.get("active", c.delayed_delivery_enabled)),
            delayed_delivery_tick_ms=int(delayed.get("tickTime", c.delayed_delivery_tick_time_ms)),
            delayed_delivery_max_delay_ms=int(delayed.get("maxDeliveryDelayInMillis",
                                                          c.delayed_delivery_max_delay_ms)),
            max_unacked_messages_per_consumer=int(p.get(
                "max_unacked_messages_per_consumer", c.max_unacked_messages_per_consumer)),
            max_unacked_messages_per_subscription=int(p.get(
                "max_unacked_messages_per_subscription",
                c.max_unacked_messages_per_subscription)),
            max_producers_per_topic=int(p.get("max_producers_per_topic",
                                              c.max_producers_per_topic)),
            max_consumers_per_topic=int(p.get("max_consumers_per_topic",
                                              c.max_consumers_per_topic)),
            max_consumers_per_subscription=int(p.get("max_consumers_per_subscription",
                                                     c.max_consumers_per_subscription)),
            subscription_types_enabled=tuple(p.get("subscription_types_enabled")
                                             or c.subscription_types_enabled),
        )

    def schema_policy(self, topic: str, namespace: str) -> SchemaPolicy:
        """The schema policies of a topic: topic > namespace > broker configuration."""
        merged = self.policies(namespace) if self.namespace_exists(namespace) else {}
        merged.update(self.topic_policies(topic))
        c = self._config
        strategy = merged.get("schema_compatibility_strategy")
        if strategy in (None, "UNDEFINED"):
            strategy = c.schema_compatibility_strategy
        return SchemaPolicy(
            compatibility_strategy=str(strategy),
            allow_auto_update=bool(merged.get("is_allow_auto_update_schema",
                                              c.is_allow_auto_update_schema_enabled)),
            validation_enforced=bool(merged.get("schema_validation_enforced",
                                                c.is_schema_validation_enforced)))

    def auto_topic_creation(self, namespace: str) -> tuple[bool, str, int]:
        """(allowed, "partitioned"|"non-partitioned", default partitions) for a namespace."""
        override: dict[str, Any] = {}
        if self.namespace_exists(namespace):
            override = self.policies(namespace).get("autoTopicCreationOverride") or {}
        c = self._config
        return (bool(override.get("allowAutoTopicCreation", c.allow_auto_topic_creation)),
                str(override.get("topicType", c.allow_auto_topic_creation_type)),
                int(override.get("defaultNumPartitions", c.default_num_partitions)))

    @staticmethod
    def _set(policies: dict[str, Any], field: str, value: Any) -> None:
        if field not in POLICY_FIELDS:
            raise NotAllowedError(f"Unknown policy {field}; known: {', '.join(POLICY_FIELDS)}")
        if value is None:
            policies.pop(field, None)
        else:
            policies[field] = value

    @staticmethod
    def _clean(policies: dict[str, Any]) -> dict[str, Any]:
        unknown = set(policies) - set(POLICY_FIELDS)
        if unknown:
            raise NotAllowedError(f"Unknown policies {sorted(unknown)}")
        return dict(policies)
