"""The admin REST API's clusters, tenants, namespaces and namespace policies (Pulsar's v2
paths; see `_admin` for the endpoints and statuses).

The namespace policy endpoints only parse the body and hand it to
`NamespaceRegistry.set_policy` (or `set_backlog_quota`), which checks it with the rules in
`broker/_policies.py`, the same an embedded caller of the registry meets; then the service
re-applies the namespace's policies to its loaded topics.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from .._errors import InvalidTopicNameError
from .._names import check_tenant_name
from .._policies import POLICY_FIELDS, check_backlog_quota_type, check_policy
from ..topics._service import BrokerService
from ._rest import (
    LOOKUP_URLS,
    NS_PATH,
    Handler,
    RestError,
    _body,
    _flag,
    _namespace,
    _ok,
    _service,
)

__all__ = ["add_namespace_routes"]

# The fields of Pulsar's ClusterData that are not URLs, at Pulsar's defaults (no TLS
# between brokers: there is one broker).
CLUSTER_DATA_DEFAULTS: dict[str, Any] = {
    "brokerClientTlsEnabled": False,
    "tlsAllowInsecureConnection": False,
    "brokerClientTlsEnabledWithKeyStore": False,
    "brokerClientTlsTrustStoreType": "JKS",
    "brokerClientTlsKeyStoreType": "JKS",
}
_TENANT_NAME = re.compile(r"[-=:.\w]+", re.ASCII)


# -- clusters and tenants -------------------------------------------------------------------


async def list_clusters(request: web.Request) -> web.Response:
    return _ok([_service(request).config.cluster_name])


def _our_cluster(request: web.Request) -> str:
    """The cluster the path names, which must be this broker's.

    Raises:
        RestError: 404 for any other name (Pulsar's "Cluster does not exist").
    """
    cluster = request.match_info["cluster"]
    if cluster != _service(request).config.cluster_name:
        raise RestError(404, "Cluster does not exist")
    return cluster


async def get_cluster(request: web.Request) -> web.Response:
    """Pulsar's ClusterData of the one cluster: its URLs are the broker's own listeners
    (unset fields left out, as Pulsar's JSON leaves out nulls)."""
    _our_cluster(request)
    urls = request.app[LOOKUP_URLS]
    data: dict[str, Any] = {"serviceUrl": urls.http_url or None,
                            "serviceUrlTls": urls.http_url_tls,
                            "brokerServiceUrl": urls.broker_url,
                            "brokerServiceUrlTls": urls.broker_url_tls}
    data = {key: value for key, value in data.items() if value is not None}
    data.update(CLUSTER_DATA_DEFAULTS)
    return _ok(data)


async def create_cluster(request: web.Request) -> web.Response:
    """PUT: Pulsar's checks in its order (name, body, existence); the one cluster exists,
    and Magnetar cannot add another (403, as Pulsar answers read-only policies)."""
    cluster = request.match_info["cluster"]
    if _TENANT_NAME.fullmatch(cluster) is None:
        raise RestError(412, "Cluster name is not valid")
    body = await _body(request)
    if body is None:
        raise RestError(400, "cluster data is required")
    if not isinstance(body, dict):
        raise RestError(400, "The body must be a ClusterData object")
    if cluster == _service(request).config.cluster_name:
        raise RestError(409, "Cluster already exists")
    raise RestError(403, f"Magnetar serves one cluster "
                         f"({_service(request).config.cluster_name}); it cannot add {cluster}")


async def update_cluster(request: web.Request) -> web.Response:
    """POST/DELETE: the one cluster's data follows the broker's listeners (403)."""
    cluster = _our_cluster(request)
    raise RestError(403, f"Cluster {cluster} is the broker's own: its URLs are the "
                         "listeners the broker was started with")


def _tenant_info(body: Any, cluster: str) -> dict[str, Any]:
    """A TenantInfo from a request body, validated as upstream does."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise RestError(400, "The body must be a TenantInfo object")
    roles = body.get("adminRoles") or []
    clusters = body.get("allowedClusters") or []
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise RestError(400, "adminRoles must be a list of strings")
    if not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters):
        raise RestError(400, "allowedClusters must be a list of strings")
    if not clusters or any(not c.strip() for c in clusters):
        raise RestError(412, "Clusters can not be empty")
    if any(c != cluster for c in clusters):
        raise RestError(412, "Clusters do not exist")
    return {"adminRoles": roles, "allowedClusters": clusters}


async def list_tenants(request: web.Request) -> web.Response:
    return _ok(sorted(_service(request).namespaces.tenants()))


async def get_tenant(request: web.Request) -> web.Response:
    registry = _service(request).namespaces
    tenant = request.match_info["tenant"]
    if not registry.tenant_exists(tenant):
        raise RestError(404, "Tenant does not exist")
    return _ok(registry.tenant_info(tenant))


async def create_tenant(request: web.Request) -> web.Response:
    service = _service(request)
    tenant = request.match_info["tenant"]
    info = _tenant_info(await _body(request), service.config.cluster_name)
    if _TENANT_NAME.fullmatch(tenant) is None:
        raise RestError(412, "Tenant name is not valid")
    try:
        check_tenant_name(tenant)
    except InvalidTopicNameError as error:
        raise RestError(412, f"Tenant name is not valid: {error}") from error
    if service.namespaces.tenant_exists(tenant):
        raise RestError(409, "Tenant already exists")
    service.namespaces.create_tenant(tenant, info)
    return _ok()


async def update_tenant(request: web.Request) -> web.Response:
    service = _service(request)
    tenant = request.match_info["tenant"]
    info = _tenant_info(await _body(request), service.config.cluster_name)
    if not service.namespaces.tenant_exists(tenant):
        raise RestError(404, f"Tenant {tenant} not found")
    service.namespaces.update_tenant(tenant, info)
    return _ok()


async def delete_tenant(request: web.Request) -> web.Response:
    registry = _service(request).namespaces
    tenant = request.match_info["tenant"]
    if _flag(request, "force"):
        raise RestError(405, "Broker doesn't allow forced deletion of tenants")
    if not registry.tenant_exists(tenant):
        raise RestError(404, "Tenant doesn't exist")
    if registry.namespaces(tenant):
        raise RestError(409, "The tenant still has active namespaces")
    registry.delete_tenant(tenant)
    return _ok()


# -- namespaces -----------------------------------------------------------------------------


async def list_namespaces(request: web.Request) -> web.Response:
    registry = _service(request).namespaces
    tenant = request.match_info["tenant"]
    if not registry.tenant_exists(tenant):
        raise RestError(404, "Tenant does not exist")
    return _ok(sorted(registry.namespaces(tenant)))


def _policies_view(service: BrokerService, namespace: str) -> dict[str, Any]:
    """The namespace's Policies with every field Magnetar knows (null when unset)."""
    view: dict[str, Any] = dict.fromkeys(POLICY_FIELDS)
    view["backlog_quota_map"] = {}
    view["subscription_types_enabled"] = []
    view["schema_compatibility_strategy"] = "UNDEFINED"  # Pulsar's Policies defaults
    view["schema_validation_enforced"] = False
    view.update(service.namespaces.policies(namespace))
    view["replication_clusters"] = [service.config.cluster_name]
    return view


async def get_namespace(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    return _ok(_policies_view(_service(request), namespace))


async def create_namespace(request: web.Request) -> web.Response:
    service = _service(request)
    namespace = _namespace(request, must_exist=False)
    body = await _body(request)
    if body is not None and not isinstance(body, dict):
        raise RestError(400, "The body must be a Policies object")
    # Fields Magnetar does not implement (bundles, replication, ...) are ignored; unset
    # ones arrive as null or empty.
    policies = {k: v for k, v in (body or {}).items()
                if k in POLICY_FIELDS and v is not None and v != {} and v != []}
    if not service.namespaces.tenant_exists(request.match_info["tenant"]):
        raise RestError(404, "Tenant does not exist")
    if service.namespaces.namespace_exists(namespace):
        raise RestError(409, "Namespace already exists")
    service.namespaces.create_namespace(namespace, policies)
    return _ok()


async def delete_namespace(request: web.Request) -> web.Response:
    service = _service(request)
    if _flag(request, "force"):
        raise RestError(405, "Broker doesn't allow forced deletion of namespaces")
    namespace = _namespace(request)
    topics = service.list_topics(namespace, "ALL", include_system=True)
    if topics or service.namespaces.partitioned_topics(namespace):
        raise RestError(409, "Cannot delete non empty namespace")
    service.namespaces.delete_namespace(namespace)
    return _ok()


async def namespace_topics(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    mode = request.query.get("mode", "PERSISTENT").upper()
    if mode not in ("PERSISTENT", "NON_PERSISTENT", "ALL"):
        raise RestError(400, "mode must be PERSISTENT, NON_PERSISTENT or ALL")
    return _ok(_service(request).list_topics(namespace, mode))


# -- namespace policies ---------------------------------------------------------------------
# The rules are `_policies.check_policy`'s, applied by `NamespaceRegistry.set_policy`; its
# errors answer 400 (malformed), 412 (invalid) or 406 (a partition count), see `_rest`.

# The endpoint of each namespace policy (its path under the namespace) and its field.
NAMESPACE_POLICIES: dict[str, str] = {
    "retention": "retention_policies",
    "messageTTL": "message_ttl_in_seconds",
    "deduplication": "deduplicationEnabled",
    "delayedDelivery": "delayed_delivery_policies",
    "maxUnackedMessagesPerConsumer": "max_unacked_messages_per_consumer",
    "maxUnackedMessagesPerSubscription": "max_unacked_messages_per_subscription",
    "maxProducersPerTopic": "max_producers_per_topic",
    "maxConsumersPerTopic": "max_consumers_per_topic",
    "maxConsumersPerSubscription": "max_consumers_per_subscription",
    "subscriptionTypesEnabled": "subscription_types_enabled",
    "autoTopicCreation": "autoTopicCreationOverride",
}
assert all(field in POLICY_FIELDS for field in NAMESPACE_POLICIES.values())


async def _set_policy(service: BrokerService, namespace: str, field: str, value: Any) -> None:
    """Set one policy (checked by the registry) and re-apply the namespace's policies."""
    service.namespaces.set_policy(namespace, field, value)
    await service.policies_changed(namespace)


def _policy_handlers(field: str) -> tuple[Handler, Handler, Handler]:
    """GET, POST and DELETE for one policy endpoint."""

    async def get(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        return _ok(_service(request).namespaces.policies(namespace).get(field))

    async def post(request: web.Request) -> web.Response:
        service = _service(request)
        namespace = _namespace(request)
        value = await _body(request)
        if value is None:  # an empty body removes nothing: refused as the policy's check does
            check_policy(field, value, {}, service.config, none_removes=False)
        await _set_policy(service, namespace, field, value)
        return _ok()

    async def delete(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        await _set_policy(_service(request), namespace, field, None)
        return _ok()

    return get, post, delete


def _quota_type(request: web.Request) -> str:
    return check_backlog_quota_type(request.query.get("backlogQuotaType",
                                                      "destination_storage"))


async def get_backlog_quotas(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    policies = _service(request).namespaces.policies(namespace)
    return _ok(policies.get("backlog_quota_map") or {})


async def set_backlog_quota(request: web.Request) -> web.Response:
    service = _service(request)
    namespace = _namespace(request)
    kind = _quota_type(request)
    service.namespaces.set_backlog_quota(namespace, kind, await _body(request))
    await service.policies_changed(namespace)
    return _ok()


async def remove_backlog_quota(request: web.Request) -> web.Response:
    service = _service(request)
    namespace = _namespace(request)
    service.namespaces.remove_backlog_quota(namespace, _quota_type(request))
    await service.policies_changed(namespace)
    return _ok()


def add_namespace_routes(router: web.UrlDispatcher) -> None:
    """Register the cluster, tenant, namespace and namespace-policy endpoints."""
    r = router
    r.add_get("/admin/v2/clusters", list_clusters)
    r.add_get("/admin/v2/clusters/{cluster}", get_cluster)
    r.add_put("/admin/v2/clusters/{cluster}", create_cluster)
    r.add_post("/admin/v2/clusters/{cluster}", update_cluster)
    r.add_delete("/admin/v2/clusters/{cluster}", update_cluster)
    r.add_get("/admin/v2/tenants", list_tenants)
    r.add_get("/admin/v2/tenants/{tenant}", get_tenant)
    r.add_put("/admin/v2/tenants/{tenant}", create_tenant)
    r.add_post("/admin/v2/tenants/{tenant}", update_tenant)
    r.add_delete("/admin/v2/tenants/{tenant}", delete_tenant)
    r.add_get("/admin/v2/namespaces/{tenant}", list_namespaces)
    r.add_get("/admin/v2/tenants/{tenant}/namespaces", list_namespaces)
    r.add_get(NS_PATH, get_namespace)
    r.add_put(NS_PATH, create_namespace)
    r.add_delete(NS_PATH, delete_namespace)
    r.add_get(NS_PATH + "/topics", namespace_topics)
    r.add_get(NS_PATH + "/backlogQuotaMap", get_backlog_quotas)
    r.add_post(NS_PATH + "/backlogQuota", set_backlog_quota)
    r.add_delete(NS_PATH + "/backlogQuota", remove_backlog_quota)
    for path, field in NAMESPACE_POLICIES.items():
        get, post, delete = _policy_handlers(field)
        r.add_get(f"{NS_PATH}/{path}", get)
        r.add_post(f"{NS_PATH}/{path}", post)
        r.add_delete(f"{NS_PATH}/{path}", delete)
