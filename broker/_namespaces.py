"""Tenants, namespaces, their policies, topic policies and partitioned-topic metadata.

Everything lives in the storage's metadata store, one JSON record per key, written with a
durable transaction (these change rarely):

| key                                | value                                                |
|------------------------------------|------------------------------------------------------|
| `tenant/<tenant>`                  | TenantInfo: `adminRoles`, `allowedClusters`          |
| `ns/<tenant>/<namespace>`          | namespace Policies (Pulsar's JSON field names)       |
| `partitioned/<full topic name>`    | `{"partitions": n}`                                  |
| `topicpolicy/<full topic name>`    | topic-level policies (the same field names)          |

A namespace's permissions live in its Policies record too, under Pulsar's names:
`auth_policies` = `{"namespace_auth": {role: [action]}, "destination_auth": {topic: {role:
[action]}}, "subscription_auth_roles": {subscription: [role]}}` and `subscription_auth_mode`
("None" or "Prefix"); `update_auth_policies` changes them in one durable transaction, and they
go when the namespace goes. `security/_authz.py` reads and interprets them.

The schema policies (`schema_compatibility_strategy`, `is_allow_auto_update_schema`,
`schema_validation_enforced`) resolve the same way, into a `SchemaPolicy` (`schema_policy`).

Policy resolution follows Pulsar: a topic-level value beats the namespace's, which beats the
broker configuration. `Policies` keeps the fields users script against through the admin
API; the effective values are computed by `effective_policies`. Every value set is first
checked by `_policies.check_policy` (the rules the admin API enforces too).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from magnetar.storage import LedgerMetadata

from ._config import BrokerConfig
from ._errors import MetadataError, NotAllowedError
from ._names import TopicName
from ._policies import BACKLOG_QUOTA_TYPES, POLICY_FIELDS, check_backlog_quota_type, check_policy

__all__ = ["AUTH_POLICIES", "AUTH_POLICY_MAPS", "EffectivePolicies", "NamespaceRegistry",
           "SchemaPolicy"]

_NAME = re.compile(r"^[-=:.\w]+$")

RESOLVED_POLICIES_MAX = 1024  # distinct resolved policies kept for sharing
AUTH_POLICIES = "auth_policies"  # the permissions' field of a namespace's Policies
AUTH_POLICY_MAPS = ("namespace_auth", "destination_auth", "subscription_auth_roles")


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
    compaction_threshold_bytes: int  # the `__compaction` backlog that triggers one; 0: never


def _check_name(kind: str, name: str) -> None:
    if not name or not _NAME.match(name):
        raise MetadataError(f"Invalid {kind} name '{name}': use letters, digits and -=:._")


class NamespaceRegistry:
    """Tenants, namespaces and policies, persisted in the metadata store."""

    def __init__(self, metadata: LedgerMetadata, config: BrokerConfig):
        self._meta = metadata
        self._config = config
        # Resolved policies by their merged JSON: topics with the same policies share one
        # (immutable) object, rather than one each.
        self._resolved: dict[str, EffectivePolicies] = {}

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
        """Set (or with value None remove) one namespace policy field, the value checked and
        normalised by `check_policy` against the namespace's other policies.

        Raises:
            MetadataError: the namespace does not exist.
            NotAllowedError: an unknown field, or (its subclasses `InvalidPolicyError`,
                `MalformedPolicyError`, `PartitionCountError`) a value that breaks a policy
                rule. Nothing is stored then.
        """
        policies = self.policies(namespace)
        self._set(policies, field, value)
        self._meta.put(b"ns/" + namespace.encode(), json.dumps(policies).encode())

    def auth_policies(self, namespace: str) -> dict[str, Any]:
        """The namespace's permissions (`AUTH_POLICY_MAPS`, each present, maybe empty).

        Raises:
            MetadataError: the namespace does not exist.
        """
        stored = self.policies(namespace).get(AUTH_POLICIES) or {}
        return {name: dict(stored.get(name) or {}) for name in AUTH_POLICY_MAPS}

    def update_auth_policies(self, namespace: str,
                             change: Callable[[dict[str, Any]], None]) -> None:
        """Apply `change` to the namespace's permissions (as `auth_policies` gives them) and
        store the result durably, in one transaction.

        Raises:
            MetadataError: the namespace does not exist; nothing changed.
            Whatever `change` raises: nothing changed.
        """
        key = b"ns/" + namespace.encode()
        with self._meta.transaction() as txn:
            raw = txn.get(key)
            if raw is None:
                raise MetadataError(f"Namespace {namespace} does not exist")
            policies: dict[str, Any] = json.loads(raw)
            stored = policies.get(AUTH_POLICIES) or {}
            current = {name: dict(stored.get(name) or {}) for name in AUTH_POLICY_MAPS}
            change(current)
            policies[AUTH_POLICIES] = current
            txn.put(key, json.dumps(policies).encode())

    def set_backlog_quota(self, namespace: str, kind: str, quota: Any) -> None:
        """Set the namespace's backlog quota of one type (`destination_storage` or
        `message_age`); raises as `set_policy` does."""
        check_backlog_quota_type(kind)
        quotas = dict(self.policies(namespace).get("backlog_quota_map") or {})
        quotas[kind] = quota
        self.set_policy(namespace, "backlog_quota_map", quotas)

    def remove_backlog_quota(self, namespace: str, kind: str) -> None:
        """Remove the namespace's backlog quota of one type (none set: nothing changes)."""
        check_backlog_quota_type(kind)
        quotas = dict(self.policies(namespace).get("backlog_quota_map") or {})
        quotas.pop(kind, None)
        self.set_policy(namespace, "backlog_quota_map", quotas or None)

    # -- topics ----------------------------------------------------------------------------

    def topic_policies(self, topic: str) -> dict[str, Any]:
        """The policies stored for exactly this topic name (none inherited)."""
        raw = self._meta.get(b"topicpolicy/" + topic.encode())
        return {} if raw is None else dict(json.loads(raw))

    def topic_policies_in_force(self, topic: str) -> dict[str, Any]:
        """A topic's own policies: a partition has its partitioned topic's (Pulsar keeps them
        on the base name), overridden by any stored for the partition itself."""
        name = TopicName.parse(topic)
        base = str(name.partitioned_base)
        if base == str(name):
            return self.topic_policies(topic)
        return _merged(self.topic_policies(base), self.topic_policies(str(name)))

    def set_topic_policy(self, topic: str, field: str, value: Any) -> None:
        """Set (or with None remove) one topic-level policy, checked as `set_policy` does
        against the policies in force for the topic (its own over its namespace's).
        Raises as `set_policy` does (but a missing namespace is not checked); nothing is
        stored then."""
        stored = self.topic_policies(topic)
        context = _merged(self._namespace_policies(TopicName.parse(topic).namespace_name),
                          self.topic_policies_in_force(topic))
        self._set(stored, field, value, context)
        key = b"topicpolicy/" + topic.encode()
        if stored:
            self._meta.put(key, json.dumps(stored).encode())
        else:
            self._meta.delete(key)

    def set_topic_backlog_quota(self, topic: str, kind: str, quota: Any) -> None:
        """Set (quota None: remove) a topic's backlog quota of one type; raises as
        `set_topic_policy` does."""
        check_backlog_quota_type(kind)
        quotas = dict(self.topic_policies(topic).get("backlog_quota_map") or {})
        if quota is None:
            quotas.pop(kind, None)
        else:
            quotas[kind] = quota
        self.set_topic_policy(topic, "backlog_quota_map", quotas or None)

    def delete_topic_policies(self, topic: str) -> None:
        """Forget a topic's policies (the topic was deleted; nothing happens without any)."""
        self._meta.delete(b"topicpolicy/" + topic.encode())

    def applied_policy(self, topic: str, field: str) -> Any:
        """The value of one policy in force for a topic, as Pulsar's `applied=true` answers:
        the topic's, else its namespace's, else the broker's default (None when the broker
        has none for the field)."""
        own = self.topic_policies_in_force(topic).get(field)
        if own is not None:
            return own
        namespace = self._namespace_policies(TopicName.parse(topic).namespace_name)
        if namespace.get(field) is not None:
            return namespace[field]
        default = _BROKER_DEFAULTS.get(field)
        return None if default is None else default(self._config)

    def applied_backlog_quotas(self, topic: str) -> dict[str, Any]:
        """The backlog quotas in force for a topic as Pulsar's `applied=true` answers them:
        the topic's map, else its namespace's, else the broker's default of every type."""
        own = self.topic_policies_in_force(topic).get("backlog_quota_map")
        if own:
            return dict(own)
        namespace = self._namespace_policies(TopicName.parse(topic).namespace_name)
        if namespace.get("backlog_quota_map"):
            return dict(namespace["backlog_quota_map"])
        c = self._config
        size = c.backlog_quota_default_limit_bytes
        return {kind: {"limit": size, "limitSize": size,
                       "limitTime": c.backlog_quota_default_limit_s,
                       "policy": c.backlog_quota_default_retention_policy}
                for kind in BACKLOG_QUOTA_TYPES}

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

    def _namespace_policies(self, namespace: str) -> dict[str, Any]:
        return self.policies(namespace) if self.namespace_exists(namespace) else {}

    def effective_policies(self, topic: str, namespace: str) -> EffectivePolicies:
        merged = _merged(self._namespace_policies(namespace), self.topic_policies_in_force(topic))
        merged.pop(AUTH_POLICIES, None)  # not a policy resolved here, and it grows with topics
        key = json.dumps(merged, sort_keys=True, separators=(",", ":"))
        resolved = self._resolved.get(key)
        if resolved is None:
            if len(self._resolved) >= RESOLVED_POLICIES_MAX:
                self._resolved.clear()
            resolved = self._resolved[key] = self._resolve(merged)
        return resolved

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
            compaction_threshold_bytes=int(p.get(
                "compaction_threshold", c.broker_service_compaction_threshold_bytes)),
        )

    def schema_policy(self, topic: str, namespace: str) -> SchemaPolicy:
        """The schema policies of a topic: topic > namespace > broker configuration."""
        merged = _merged(self._namespace_policies(namespace), self.topic_policies_in_force(topic))
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

    def _set(self, policies: dict[str, Any], field: str, value: Any,
             context: dict[str, Any] | None = None) -> None:
        """Check `value` against `context` (default: `policies` itself) and store it in
        `policies` (None removes the field)."""
        value = check_policy(field, value, policies if context is None else context,
                             self._config)
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


def _merged(lower: dict[str, Any], upper: dict[str, Any]) -> dict[str, Any]:
    """`upper`'s policies over `lower`'s; backlog quotas merge by type (a topic's quota of
    one type leaves its namespace's of the other in force, as Pulsar's do)."""
    merged = {**lower, **upper}
    quotas = {**(lower.get("backlog_quota_map") or {}), **(upper.get("backlog_quota_map") or {})}
    if quotas:
        merged["backlog_quota_map"] = quotas
    return merged


# What `applied_policy` answers for a field neither the topic nor its namespace sets, in the
# policy's JSON shape (the same configuration values `_resolve` falls back to).
_BROKER_DEFAULTS: dict[str, Callable[[BrokerConfig], Any]] = {
    "retention_policies": lambda c: {"retentionTimeInMinutes": c.default_retention_time_minutes,
                                     "retentionSizeInMB": c.default_retention_size_mb},
    "message_ttl_in_seconds": lambda c: c.ttl_duration_default_s,
    "deduplicationEnabled": lambda c: c.broker_deduplication_enabled,
    "delayed_delivery_policies": lambda c: {
        "active": c.delayed_delivery_enabled, "tickTime": c.delayed_delivery_tick_time_ms,
        "maxDeliveryDelayInMillis": c.delayed_delivery_max_delay_ms},
    "max_unacked_messages_per_consumer": lambda c: c.max_unacked_messages_per_consumer,
    "max_unacked_messages_per_subscription": lambda c: c.max_unacked_messages_per_subscription,
    "max_producers_per_topic": lambda c: c.max_producers_per_topic,
    "max_consumers_per_topic": lambda c: c.max_consumers_per_topic,
    "max_consumers_per_subscription": lambda c: c.max_consumers_per_subscription,
    "subscription_types_enabled": lambda c: sorted(c.subscription_types_enabled),
}
assert set(_BROKER_DEFAULTS) <= set(POLICY_FIELDS)
