"""Authorization: what a role may do, by Pulsar's rules (PulsarAuthorizationProvider).

Theory of operation
-------------------
`AuthorizationService` answers questions about one role and one resource from the grants
stored with each namespace (`NamespaceRegistry.auth_policies`, persisted in the metadata
store, so they survive a restart) and the broker's superuser roles. It keeps no cache: every
answer reads the namespace's record, so a grant or a revoke counts from the next request.

The rules, as Pulsar's default provider has them:

* a superuser (`superuser_roles`) may do everything;
* a tenant admin (a role in the tenant's `adminRoles`) may do everything in the tenant's
  namespaces and topics, including producing and consuming;
* `produce` on a topic: the role holds `produce` on the namespace, or on the topic (topic
  grants are kept under the partitioned topic's base name, so they cover every partition);
* `consume` on a topic with a subscription: when the namespace lists roles for that
  subscription (`subscription_auth_roles`), the role must be among them; with
  `subscription_auth_mode` "Prefix" the subscription name must start with the role (refused
  with Pulsar's explanation, not a plain no); then the role needs `consume` as for produce;
* lookup (LOOKUP, PARTITIONED_METADATA, topic stats): produce or consume permission;
* listing a namespace's topics: a namespace-level `produce` or `consume` grant;
* `functions`, `sources`, `sinks`, `packages`: a namespace-level grant of that action;
* anything else (creating and deleting topics, policies, permissions): tenant admin.

A role of None (no authentication) holds nothing. With `authorization_enabled` off nothing
calls this service to enforce anything; grants can still be made and read.

Grants (`grant_*`, `revoke_*`) change the namespace's record in one durable transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final

from .._errors import AuthorizationError, MetadataError, NotAllowedError
from .._names import TopicName
from .._namespaces import NamespaceRegistry

__all__ = [
    "ACTIONS",
    "GET_PARTITIONS_REFUSED",
    "GET_SCHEMA_REFUSED",
    "GET_TOPICS_REFUSED",
    "LOOKUP_REFUSED",
    "PRODUCE_REFUSED",
    "SUBSCRIBE_REFUSED",
    "SUBSCRIPTION_AUTH_MODES",
    "AuthorizationService",
    "check_actions",
]

log = logging.getLogger(__name__)

# Pulsar's AuthAction names.
ACTIONS: Final = ("produce", "consume", "functions", "sources", "sinks", "packages")
SUBSCRIPTION_AUTH_MODES: Final = ("None", "Prefix")
# The texts Pulsar's broker answers a refused binary-protocol request with (AuthorizationError).
PRODUCE_REFUSED: Final = "Client is not authorized to Produce"
SUBSCRIBE_REFUSED: Final = "Client is not authorized to subscribe"
LOOKUP_REFUSED: Final = "Client is not authorized to Lookup"
GET_PARTITIONS_REFUSED: Final = "Client is not authorized to Get Partition Metadata"
GET_TOPICS_REFUSED: Final = "Client is not authorized to GetTopicsOfNamespace"
# Pulsar's broker serves GET_SCHEMA without a check; Magnetar asks for lookup permission (a
# schema tells what a topic carries) and refuses as Pulsar refuses a LOOKUP: AuthorizationError
# in the response, with a text of the same form (the official client raises AuthorizationError).
GET_SCHEMA_REFUSED: Final = "Client is not authorized to Get Schema"


def check_actions(actions: Any) -> list[str]:
    """The actions of a grant's body, sorted and without repeats.

    Raises:
        NotAllowedError: not a list of Pulsar's action names (the message names the bad one).
    """
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        raise NotAllowedError(f"Permissions must be a list of actions among {', '.join(ACTIONS)}")
    unknown = [action for action in actions if action not in ACTIONS]
    if unknown:
        raise NotAllowedError(f"Unknown action {unknown[0][:40]!r}; actions are "
                              f"{', '.join(ACTIONS)}")
    return sorted(set(actions))


class AuthorizationService:
    """Pulsar's authorization rules over the grants in `registry` (see the module comment).

    Args:
        registry: the tenants and namespaces, where grants are stored.
        superuser_roles: roles that may do everything.
    """

    def __init__(self, registry: NamespaceRegistry, superuser_roles: Iterable[str] = ()):
        self.registry = registry
        self.superuser_roles = frozenset(superuser_roles)

    # -- roles -----------------------------------------------------------------------------

    def is_superuser(self, role: str | None) -> bool:
        return role is not None and role in self.superuser_roles

    def is_tenant_admin(self, tenant: str, role: str | None) -> bool:
        """A superuser, or a role among the tenant's `adminRoles` (False for a missing
        tenant)."""
        if role is None:
            return False
        if self.is_superuser(role):
            return True
        try:
            info = self.registry.tenant_info(tenant)
        except MetadataError:
            return False
        return role in (info.get("adminRoles") or [])

    # -- topics ----------------------------------------------------------------------------

    def _auth(self, namespace: str) -> dict[str, Any] | None:
        try:
            return self.registry.auth_policies(namespace)
        except MetadataError:
            return None  # no namespace: no grants

    def _granted(self, topic: TopicName, role: str, action: str) -> bool:
        auth = self._auth(topic.namespace_name)
        if auth is None:
            return False
        if action in (auth["namespace_auth"].get(role) or ()):
            return True
        topic_roles = auth["destination_auth"].get(str(topic.partitioned_base)) or {}
        return action in (topic_roles.get(role) or ())

    def can_produce(self, topic: TopicName, role: str | None) -> bool:
        if role is None:
            return False
        return self.is_tenant_admin(topic.tenant, role) or self._granted(topic, role, "produce")

    def can_consume(self, topic: TopicName, role: str | None,
                    subscription: str | None = None) -> bool:
        """Whether `role` may consume from `topic` (on `subscription`, when given).

        Raises:
            AuthorizationError: the namespace's subscription_auth_mode is "Prefix" and the
                subscription does not start with the role (Pulsar's text).
        """
        if role is None:
            return False
        if self.is_tenant_admin(topic.tenant, role):
            return True
        if subscription:
            auth = self._auth(topic.namespace_name)
            roles = (auth or {}).get("subscription_auth_roles", {}).get(subscription) or []
            if roles and role not in roles:
                return False
            if self._subscription_auth_mode(topic) == "Prefix" \
                    and not subscription.startswith(role):
                raise AuthorizationError(
                    "Failed to create consumer - The subscription name needs to be prefixed "
                    f"by the authentication role, like {role}-xxxx for topic: {topic}")
        return self._granted(topic, role, "consume")

    def _subscription_auth_mode(self, topic: TopicName) -> str:
        try:
            policies = self.registry.policies(topic.namespace_name)
        except MetadataError:
            return "None"
        return str(policies.get("subscription_auth_mode") or "None")

    def can_lookup(self, topic: TopicName, role: str | None) -> bool:
        """Produce or consume permission (consume without a subscription)."""
        return self.can_produce(topic, role) or self.can_consume(topic, role)

    # -- namespaces ------------------------------------------------------------------------

    def can_list_topics(self, namespace: str, role: str | None) -> bool:
        """Tenant admin, or a namespace-level produce or consume grant."""
        if role is None:
            return False
        if self.is_tenant_admin(namespace.split("/", 1)[0], role):
            return True
        auth = self._auth(namespace)
        actions = (auth or {}).get("namespace_auth", {}).get(role) or ()
        return "produce" in actions or "consume" in actions

    def can_namespace_action(self, namespace: str, role: str | None, action: str) -> bool:
        """Tenant admin, or a namespace-level grant of `action` (functions, sources, sinks,
        packages)."""
        assert action in ACTIONS
        if role is None:
            return False
        if self.is_tenant_admin(namespace.split("/", 1)[0], role):
            return True
        auth = self._auth(namespace)
        return action in ((auth or {}).get("namespace_auth", {}).get(role) or ())

    # -- grants ----------------------------------------------------------------------------

    def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        """role -> actions granted on the namespace.

        Raises:
            MetadataError: the namespace does not exist.
        """
        return {role: sorted(actions) for role, actions
                in self.registry.auth_policies(namespace)["namespace_auth"].items()}

    def grant_namespace(self, namespace: str, role: str, actions: list[str]) -> None:
        """Replace `role`'s actions on the namespace (Pulsar's grant semantics).

        Raises:
            MetadataError: the namespace does not exist; NotAllowedError: a bad action.
        """
        granted = check_actions(actions)

        def change(auth: dict[str, Any]) -> None:
            auth["namespace_auth"][role] = granted

        self.registry.update_auth_policies(namespace, change)
        log.info("granted %s on namespace %s to role %r", granted, namespace, role)

    def revoke_namespace(self, namespace: str, role: str) -> None:
        """Remove `role`'s namespace grant (nothing when it has none).

        Raises:
            MetadataError: the namespace does not exist.
        """
        self.registry.update_auth_policies(
            namespace, lambda auth: auth["namespace_auth"].pop(role, None))
        log.info("revoked the permissions of role %r on namespace %s", role, namespace)

    def topic_permissions(self, topic: TopicName) -> dict[str, list[str]]:
        """role -> actions on the topic: namespace grants merged with the topic's own (what
        Pulsar's getPermissionsOnTopic answers).

        Raises:
            MetadataError: the namespace does not exist.
        """
        auth = self.registry.auth_policies(topic.namespace_name)
        merged: dict[str, set[str]] = {role: set(actions) for role, actions
                                       in auth["namespace_auth"].items()}
        own = auth["destination_auth"].get(str(topic.partitioned_base)) or {}
        for role, actions in own.items():
            merged.setdefault(role, set()).update(actions)
        return {role: sorted(actions) for role, actions in merged.items()}

    def grant_topic(self, topic: TopicName, role: str, actions: list[str]) -> None:
        """Replace `role`'s actions on the topic (all its partitions).

        Raises:
            MetadataError: the namespace does not exist; NotAllowedError: a bad action.
        """
        granted = check_actions(actions)
        key = str(topic.partitioned_base)

        def change(auth: dict[str, Any]) -> None:
            auth["destination_auth"].setdefault(key, {})[role] = granted

        self.registry.update_auth_policies(topic.namespace_name, change)
        log.info("granted %s on topic %s to role %r", granted, key, role)

    def revoke_topic(self, topic: TopicName, role: str) -> None:
        """Remove `role`'s grant on the topic.

        Raises:
            MetadataError: the namespace does not exist.
            NotAllowedError: the role has no grant on the topic itself (Pulsar's 412).
        """
        key = str(topic.partitioned_base)

        def change(auth: dict[str, Any]) -> None:
            roles = auth["destination_auth"].get(key) or {}
            if role not in roles:
                raise NotAllowedError("Permissions are not set at the topic level")
            del roles[role]
            if roles:
                auth["destination_auth"][key] = roles
            else:
                auth["destination_auth"].pop(key, None)

        self.registry.update_auth_policies(topic.namespace_name, change)
        log.info("revoked the permissions of role %r on topic %s", role, key)

    def subscription_permissions(self, namespace: str) -> dict[str, list[str]]:
        """subscription -> roles allowed on it (an unlisted subscription: any role with
        consume).

        Raises:
            MetadataError: the namespace does not exist.
        """
        auth = self.registry.auth_policies(namespace)
        return {sub: sorted(roles) for sub, roles in auth["subscription_auth_roles"].items()}

    def grant_subscription(self, namespace: str, subscription: str, roles: list[str]) -> None:
        """Set the roles allowed on `subscription` (Pulsar replaces the list).

        Raises:
            MetadataError: the namespace does not exist.
        """
        allowed = sorted(set(roles))

        def change(auth: dict[str, Any]) -> None:
            auth["subscription_auth_roles"][subscription] = allowed

        self.registry.update_auth_policies(namespace, change)
        log.info("subscription %r of namespace %s: roles %s", subscription, namespace, allowed)

    def revoke_subscription(self, namespace: str, subscription: str, role: str) -> None:
        """Remove `role` from the roles allowed on `subscription`.

        Raises:
            MetadataError: the namespace does not exist.
            NotAllowedError: the subscription has no roles listed ("couldn't find
                subscription", as Pulsar says).
        """
        def change(auth: dict[str, Any]) -> None:
            roles = auth["subscription_auth_roles"].get(subscription)
            if roles is None:
                raise NotAllowedError("couldn't find subscription")
            auth["subscription_auth_roles"][subscription] = [r for r in roles if r != role]

        self.registry.update_auth_policies(namespace, change)
        log.info("revoked role %r on subscription %r of namespace %s", role, subscription,
                 namespace)
