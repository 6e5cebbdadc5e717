"""The admin HTTP API (Pulsar's REST v2 paths) and `/metrics`, served by aiohttp.

Theory of operation
-------------------
`start_admin(service, host, port)` serves `admin_app(service)` on the service's own event
loop, so every handler calls the `BrokerService` and its `NamespaceRegistry` directly, with
no locking. Paths, query parameters and JSON field names are Pulsar's:

* `/admin/v2/clusters` and `/admin/v2/clusters/{cluster}`: the one cluster
  (`cluster_name`); GET answers Pulsar's ClusterData with the broker's own URLs
  (`serviceUrl[Tls]`, `brokerServiceUrl[Tls]`), PUT 409 (it exists; another cluster: 403),
  POST and DELETE 403 (its URLs are the listeners); other names 404;
* `/admin/v2/tenants[/{tenant}]` (TenantInfo: `adminRoles`, `allowedClusters`);
* `/admin/v2/namespaces/{tenant}[/{namespace}]`, the namespace's `topics`, and its policy
  endpoints (GET reads, POST sets, DELETE removes): `retention`, `messageTTL`,
  `deduplication`, `delayedDelivery`, `maxUnackedMessagesPerConsumer`,
  `maxUnackedMessagesPerSubscription`, `maxProducersPerTopic`, `maxConsumersPerTopic`,
  `maxConsumersPerSubscription`, `subscriptionTypesEnabled`, `autoTopicCreation`, and
  `backlogQuotaMap` / `backlogQuota?backlogQuotaType=…`. Each maps onto one
  `NamespaceRegistry` policy field (Pulsar's `Policies` JSON names); after a change the
  service re-applies the namespace's policies to its loaded topics;
* `/admin/v2/{persistent|non-persistent}/{tenant}/{namespace}[/partitioned]` (listings) and
  `…/{topic}` with `partitions`, `stats`, `internalStats`, `partitioned-stats`,
  `partitioned-internalStats`, `terminate` (answers the last message id),
  `terminate/partitions`, `unload`, `subscriptions`, `subscription/{sub}` (create with a message
  id body, delete) and the cursor operations `skip/{n}`, `skip_all`, `resetcursor/{ms}`,
  `resetcursor` (ResetCursorData body), `expireMessages/{s}`, and
  `all_subscription/expireMessages/{s}`. Topic and subscription names arrive URL-encoded in
  the path and are decoded by the router;
* `/admin/v2/schemas/{tenant}/{namespace}/{topic}/…` and the namespaces' schema policies:
  `_admin_schemas` (registered from here);
* `/metrics`: `render_metrics`;
* `/admin/v2/brokers/health`: "ok", or 503 with the reason while the disk is full or the
  storage failed;
* HTTP lookup for clients given an `http://` service URL (`_lookup_http.py`): `/lookup/v2/topic/…`
  and `…/partitions?checkAllowAutoCreation=true`.

A partitioned topic's base name stands for all its partitions where Pulsar allows it
(listing, creating and deleting subscriptions, `skip_all`, expiry, reset by time,
partitioned stats); skipping n entries and resetting to a position need one partition
(405, as upstream).

Errors answer as Pulsar's do, with a status and `{"reason": "…"}`: 400 a malformed body
or an out-of-range number in the path, 404 a missing tenant, namespace, topic or
subscription, 405 an operation the topic (a partitioned base, a non-persistent topic) does not
support, 406 a partition count below 1 or above `max_num_partitions_per_partitioned_topic`,
409 something that exists already or a namespace/tenant that is not empty, 412 an invalid
name or value (a name too long to store included, `_names.py`: nothing is created) or clients
still connected (409 also an incompatible schema, 422 a schema definition that does not
parse). Handlers raise `RestError`; the middleware turns it, the router's own 404/405 and any
stray `BrokerError` into that shape.

Logging. A malformed HTTP request (a line over aiohttp's limit, a bad header) is the client's
mistake: aiohttp answers 400 and closes the connection, and `_HttpServerLog` makes its ERROR
traceback one WARNING line. An unexpected exception in a handler stays an ERROR with its
traceback (a bug), answered 500.

The guards run before the error middleware (`_authz.security_middlewares`): size limits
(413/431), authentication when enabled (`_admin_auth.py`: 401 without valid credentials),
odd names in the path (412), and authorization by Pulsar's rules when enabled. The permission
endpoints are `_permissions.py`'s. `start_admin` can serve HTTPS
too, on `https_port` with the broker's TLS context.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .._errors import (
    BrokerError,
    ConsumerBusyError,
    ConsumerNotFoundError,
    IncompatibleSchemaError,
    InvalidSchemaError,
    InvalidTopicNameError,
    MetadataError,
    NotAllowedError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from .._names import (
    NamespaceName,
    TopicDomain,
    TopicName,
    advertised_url_for,
    check_subscription_name,
    check_tenant_name,
)
from .._namespaces import POLICY_FIELDS
from ..dispatch._entry import EntryInfo
from ..dispatch._subscription import Subscription
from ..ledger._position import Position, int_to_ack_set
from ..security._auth import AuthenticationService
from ..topics._dedup import DEDUP_CURSOR_NAME
from ..topics._service import BrokerService, Topic
from ..topics._topic import NonPersistentTopic, PersistentTopic
from ._admin_auth import Middleware
from ._authz import BODY_BYTES_MAX, PARSER_FIELD_BYTES_MAX, security_middlewares
from ._lookup_http import LookupUrls, lookup_routes, partitions_for_client
from ._metrics import CONTENT_TYPE, render_metrics
from ._permissions import add_permission_routes
from ._stats import internal_stats, topic_stats

__all__ = ["AdminServer", "RestError", "admin_app", "start_admin"]

log = logging.getLogger(__name__)

SERVICE: web.AppKey[BrokerService] = web.AppKey("service", BrokerService)
CONSUMER_METRICS: web.AppKey[bool] = web.AppKey("consumer_metrics", bool)
LOOKUP_URLS: web.AppKey[LookupUrls] = web.AppKey("lookup_urls", LookupUrls)
# The fields of Pulsar's ClusterData that are not URLs, at Pulsar's defaults (no TLS
# between brokers: there is one broker).
CLUSTER_DATA_DEFAULTS: dict[str, Any] = {
    "brokerClientTlsEnabled": False,
    "tlsAllowInsecureConnection": False,
    "brokerClientTlsEnabledWithKeyStore": False,
    "brokerClientTlsTrustStoreType": "JKS",
    "brokerClientTlsKeyStoreType": "JKS",
}

LONG_MAX = 2**63 - 1  # MessageId.latest is (Long.MAX_VALUE, Long.MAX_VALUE)
MB = 1024 * 1024
SHUTDOWN_GRACE_S = 5.0  # close() waits this long at most for requests in flight
_TENANT_NAME = re.compile(r"[-=:.\w]+", re.ASCII)
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
BACKLOG_QUOTA_POLICIES = ("producer_request_hold", "producer_exception",
                          "consumer_backlog_eviction")
BACKLOG_QUOTA_TYPES = ("destination_storage", "message_age")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _HttpServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger for the admin API. aiohttp logs every malformed request (a line
    longer than its limit, a bad header: the client's mistake, answered 400, connection closed)
    as an ERROR with a traceback; here it is one WARNING line without the traceback. Anything
    else aiohttp logs keeps its level and traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else None
        if isinstance(error, HttpProcessingError) and 400 <= error.code < 500:
            log.warning("bad HTTP request from %s refused with %d: %s",
                        args[0] if args else "?", error.code, error.message)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


class RestError(Exception):
    """An answer other than success: an HTTP status and Pulsar's `reason` text."""

    def __init__(self, status: int, reason: str):
        assert 400 <= status < 600
        super().__init__(reason)
        self.status = status
        self.reason = reason


# -- plumbing -------------------------------------------------------------------------------


def _reason(status: int, reason: str) -> web.Response:
    return web.json_response({"reason": reason}, status=status)


def _status_of(error: BrokerError) -> int:
    """The HTTP status for a broker error that no handler turned into a `RestError`."""
    if isinstance(error, TopicNotFoundError | SubscriptionNotFoundError
                  | ConsumerNotFoundError):
        return 404
    if isinstance(error, InvalidSchemaError):
        return 422
    if isinstance(error, MetadataError | IncompatibleSchemaError):
        return 409
    if isinstance(error, InvalidTopicNameError | NotAllowedError | ConsumerBusyError):
        return 412
    if isinstance(error, ServiceNotReadyError):
        return 503
    return 500


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RestError as error:
        return _reason(error.status, error.reason)
    except web.HTTPException as error:  # the router's 404 and 405
        if error.status < 400:
            raise
        return _reason(error.status, error.reason)
    except BrokerError as error:
        return _reason(_status_of(error), str(error))
    except Exception as error:
        log.exception("admin request %s %s failed", request.method, request.path)
        return _reason(500, f"{type(error).__name__}: {error}")


def _service(request: web.Request) -> BrokerService:
    return request.app[SERVICE]


def _ok(value: Any = None) -> web.Response:
    """200 with a JSON body, or 204 (Pulsar's answer for null and for void)."""
    if value is None:
        return web.Response(status=204)
    return web.json_response(value)


async def _body(request: web.Request) -> Any:
    """The JSON body, None when empty.

    Raises:
        RestError: 400 when it is not JSON.
    """
    text = await request.text()
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise RestError(400, f"Invalid JSON body: {error}") from error


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("true", "false"):
        raise RestError(400, f"Query parameter {name} must be true or false")
    return value == "true"


def _int_body(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RestError(400, f"The body must be {what} (an integer)")
    return value


INT_PATH_DIGITS_MAX = 19  # a path's number (the route admits digits only): a Java long


def _int_path(request: web.Request, name: str) -> int:
    text = request.match_info[name]  # the route's pattern admits digits only
    if len(text) > INT_PATH_DIGITS_MAX or int(text) > LONG_MAX:
        raise RestError(400, f"{name} is out of range: {text[:INT_PATH_DIGITS_MAX]}...")
    return int(text)


# -- names ----------------------------------------------------------------------------------


def _namespace(request: web.Request, *, must_exist: bool = True) -> str:
    """The namespace of the path, validated (412) and, by default, existing (404)."""
    text = f"{request.match_info['tenant']}/{request.match_info['namespace']}"
    try:
        NamespaceName.parse(text)
    except InvalidTopicNameError as error:
        raise RestError(412, "Namespace name is not valid") from error
    if must_exist and not _service(request).namespaces.namespace_exists(text):
        raise RestError(404, "Namespace does not exist")
    return text


def _topic_name(request: web.Request) -> TopicName:
    """The topic of the path (its namespace must exist)."""
    namespace = NamespaceName.parse(_namespace(request))
    local = request.match_info["topic"]
    if not local:
        raise RestError(412, "Topic name is not valid")
    domain = cast(TopicDomain, request.match_info["domain"])
    return TopicName(domain, namespace.tenant, namespace.namespace, local)


def _partitions(service: BrokerService, name: TopicName) -> int:
    return service.namespaces.partitions(str(name))


def _not_found(name: TopicName) -> RestError:
    return RestError(404, f"Topic {name} not found")


def _sub_not_found(name: TopicName, subscription: str) -> RestError:
    return RestError(404, f"Subscription {subscription} not found for topic {name}")


async def _topic(service: BrokerService, name: TopicName) -> Topic:
    """A non-partitioned topic or one partition, loaded on demand.

    Raises:
        RestError: 405 for a partitioned topic's base name, 404 when it does not exist.
    """
    if _partitions(service, name) > 0:
        raise RestError(405, f"{name} is a partitioned topic: use one of its partitions or "
                             "the partitioned operation")
    if not service.topic_exists(name):
        raise _not_found(name)
    return await service.get_topic(name, create=False)


async def _persistent(service: BrokerService, name: TopicName) -> PersistentTopic:
    topic = await _topic(service, name)
    if not isinstance(topic, PersistentTopic):
        raise RestError(405, "This operation needs a persistent topic")
    return topic


async def _targets(service: BrokerService, name: TopicName) -> list[Topic]:
    """The topic, or for a partitioned topic every partition that exists."""
    partitions = _partitions(service, name)
    if partitions == 0:
        return [await _topic(service, name)]
    found: list[Topic] = []
    for index in range(partitions):
        partition = name.partition(index)
        if service.topic_exists(partition):
            found.append(await service.get_topic(partition, create=False))
    return found


def _durable(topic: Topic, subscription: str) -> Subscription | None:
    if not isinstance(topic, PersistentTopic):
        raise RestError(405, "Cursor operations need a persistent topic")
    return topic.subscriptions.get(subscription)


async def _subscriptions(service: BrokerService, name: TopicName, subscription: str,
                         ) -> list[Subscription]:
    """The durable subscription on the topic or on every partition holding it (404 when
    none does)."""
    found = [s for topic in await _targets(service, name)
             if (s := _durable(topic, subscription)) is not None]
    if not found:
        raise _sub_not_found(name, subscription)
    return found


def _is_active(topic: Topic) -> bool:
    return bool(topic.producers) or topic.consumer_count() > 0


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


def _non_negative(what: str) -> Callable[[Any, dict[str, Any]], Any]:
    def check(value: Any, policies: dict[str, Any]) -> Any:
        if _int_body(value, what) < 0:
            raise RestError(412, f"Invalid value for {what}: it must be 0 or more")
        return value
    return check


def _check_ttl(value: Any, policies: dict[str, Any]) -> Any:
    if _int_body(value, "the TTL in seconds") < 0:
        raise RestError(412, "Invalid value for message TTL")
    return value


def _check_bool(value: Any, policies: dict[str, Any]) -> Any:
    if not isinstance(value, bool):
        raise RestError(400, "The body must be true or false")
    return value


def _check_retention(value: Any, policies: dict[str, Any]) -> Any:
    if not isinstance(value, dict):
        raise RestError(400, "The body must be a RetentionPolicies object")
    minutes = _int_body(value.get("retentionTimeInMinutes", 0), "retentionTimeInMinutes")
    size_mb = _int_body(value.get("retentionSizeInMB", 0), "retentionSizeInMB")
    if minutes < -1 or size_mb < -1:
        raise RestError(412, "Invalid retention policy: limits must be -1 (infinite) or more")
    if (minutes == 0) != (size_mb == 0):
        raise RestError(412, "Invalid retention policy: setting only one of time and size "
                             "to 0 is invalid; use -1 to ignore a limit, or both 0 for none")
    quota = (policies.get("backlog_quota_map") or {}).get("destination_storage") or {}
    limit = int(quota.get("limitSize", -1))
    if size_mb > 0 and limit > 0 and size_mb * MB < limit:
        raise RestError(412, "Retention Quota must exceed configured backlog quota for "
                             "namespace.")
    return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb}


def _check_delayed(value: Any, policies: dict[str, Any]) -> Any:
    if not isinstance(value, dict):
        raise RestError(400, "The body must be a DelayedDeliveryPolicies object")
    checked = {"active": _check_bool(value.get("active", False), policies),
               "tickTime": _int_body(value.get("tickTime", 1000), "tickTime"),
               "maxDeliveryDelayInMillis": _int_body(value.get("maxDeliveryDelayInMillis", 0),
                                                     "maxDeliveryDelayInMillis")}
    if checked["tickTime"] < 0 or checked["maxDeliveryDelayInMillis"] < 0:
        raise RestError(412, "Invalid delayed delivery policy: times must be 0 or more")
    return checked


def _check_types(value: Any, policies: dict[str, Any]) -> Any:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RestError(400, "The body must be a list of subscription types")
    unknown = [v for v in value if v not in SUBSCRIPTION_TYPES]
    if unknown:
        raise RestError(412, f"Unknown subscription types {unknown}")
    return sorted(set(value))


def _check_auto_creation(value: Any, policies: dict[str, Any]) -> Any:
    if not isinstance(value, dict) or not isinstance(value.get("allowAutoTopicCreation"), bool):
        raise RestError(400, "The body must be an AutoTopicCreationOverride object")
    kind = value.get("topicType", "non-partitioned")
    checked: dict[str, Any] = {"allowAutoTopicCreation": value["allowAutoTopicCreation"],
                               "topicType": kind}
    if kind == "partitioned":
        partitions = value.get("defaultNumPartitions")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise RestError(400, "Invalid configuration for autoTopicCreationOverride: "
                                 "defaultNumPartitions must be 1 or more")
        checked["defaultNumPartitions"] = partitions
    elif kind != "non-partitioned":
        raise RestError(400, "Invalid configuration for autoTopicCreationOverride: topicType "
                             "must be partitioned or non-partitioned")
    return checked


@dataclass(frozen=True)
class _Policy:
    """One namespace policy endpoint: the registry field it sets and its body check."""

    field: str
    check: Callable[[Any, dict[str, Any]], Any]


NAMESPACE_POLICIES: dict[str, _Policy] = {
    "retention": _Policy("retention_policies", _check_retention),
    "messageTTL": _Policy("message_ttl_in_seconds", _check_ttl),
    "deduplication": _Policy("deduplicationEnabled", _check_bool),
    "delayedDelivery": _Policy("delayed_delivery_policies", _check_delayed),
    "maxUnackedMessagesPerConsumer": _Policy("max_unacked_messages_per_consumer",
                                             _non_negative("maxUnackedMessagesPerConsumer")),
    "maxUnackedMessagesPerSubscription": _Policy(
        "max_unacked_messages_per_subscription",
        _non_negative("maxUnackedMessagesPerSubscription")),
    "maxProducersPerTopic": _Policy("max_producers_per_topic",
                                    _non_negative("maxProducersPerTopic")),
    "maxConsumersPerTopic": _Policy("max_consumers_per_topic",
                                    _non_negative("maxConsumersPerTopic")),
    "maxConsumersPerSubscription": _Policy("max_consumers_per_subscription",
                                           _non_negative("maxConsumersPerSubscription")),
    "subscriptionTypesEnabled": _Policy("subscription_types_enabled", _check_types),
    "autoTopicCreation": _Policy("autoTopicCreationOverride", _check_auto_creation),
}
assert all(p.field in POLICY_FIELDS for p in NAMESPACE_POLICIES.values())


async def _set_policy(service: BrokerService, namespace: str, field: str, value: Any) -> None:
    service.namespaces.set_policy(namespace, field, value)
    await service.policies_changed(namespace)


def _policy_handlers(policy: _Policy) -> tuple[Handler, Handler, Handler]:
    """GET, POST and DELETE for one policy endpoint."""

    async def get(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        return _ok(_service(request).namespaces.policies(namespace).get(policy.field))

    async def post(request: web.Request) -> web.Response:
        service = _service(request)
        namespace = _namespace(request)
        value = policy.check(await _body(request), service.namespaces.policies(namespace))
        if isinstance(value, dict) and "defaultNumPartitions" in value:
            _check_partition_limit(service, value["defaultNumPartitions"])
        await _set_policy(service, namespace, policy.field, value)
        return _ok()

    async def delete(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        await _set_policy(_service(request), namespace, policy.field, None)
        return _ok()

    return get, post, delete


def _quota_type(request: web.Request) -> str:
    kind = request.query.get("backlogQuotaType", "destination_storage")
    if kind not in BACKLOG_QUOTA_TYPES:
        raise RestError(400, f"backlogQuotaType must be one of {', '.join(BACKLOG_QUOTA_TYPES)}")
    return kind


def _backlog_quota(value: Any, kind: str, policies: dict[str, Any]) -> dict[str, Any]:
    """A BacklogQuota body (`limit`/`limitSize` bytes, `limitTime` s, `policy`) checked."""
    if not isinstance(value, dict):
        raise RestError(400, "The body must be a BacklogQuota object")
    size = _int_body(value.get("limitSize", value.get("limit", -1)), "limitSize")
    seconds = _int_body(value.get("limitTime", -1), "limitTime")
    policy = value.get("policy")
    if policy not in BACKLOG_QUOTA_POLICIES:
        raise RestError(400, f"policy must be one of {', '.join(BACKLOG_QUOTA_POLICIES)}")
    retention = policies.get("retention_policies") or {}
    retention_mb = int(retention.get("retentionSizeInMB", -1))
    if kind == "destination_storage" and size > 0 and retention_mb > 0 \
            and size > retention_mb * MB:
        raise RestError(412, "Backlog Quota exceeds configured retention quota for "
                             "namespace. Please increase retention quota and retry")
    return {"limit": size, "limitSize": size, "limitTime": seconds, "policy": policy}


async def get_backlog_quotas(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    policies = _service(request).namespaces.policies(namespace)
    return _ok(policies.get("backlog_quota_map") or {})


async def set_backlog_quota(request: web.Request) -> web.Response:
    service = _service(request)
    namespace = _namespace(request)
    kind = _quota_type(request)
    policies = service.namespaces.policies(namespace)
    quotas = dict(policies.get("backlog_quota_map") or {})
    quotas[kind] = _backlog_quota(await _body(request), kind, policies)
    await _set_policy(service, namespace, "backlog_quota_map", quotas)
    return _ok()


async def remove_backlog_quota(request: web.Request) -> web.Response:
    service = _service(request)
    namespace = _namespace(request)
    kind = _quota_type(request)
    quotas = dict(service.namespaces.policies(namespace).get("backlog_quota_map") or {})
    quotas.pop(kind, None)
    await _set_policy(service, namespace, "backlog_quota_map", quotas or None)
    return _ok()


# -- topics ---------------------------------------------------------------------------------


async def list_topics(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    mode = "PERSISTENT" if request.match_info["domain"] == "persistent" else "NON_PERSISTENT"
    return _ok(_service(request).list_topics(namespace, mode))


async def list_partitioned_topics(request: web.Request) -> web.Response:
    namespace = _namespace(request)
    prefix = request.match_info["domain"] + "://"
    names = _service(request).namespaces.partitioned_topics(namespace)
    return _ok(sorted(n for n in names if n.startswith(prefix)))


def _partition_count(service: BrokerService, value: Any) -> int:
    count = _int_body(value, "the number of partitions")
    if count <= 0:
        raise RestError(406, "Number of partitions should be more than 0")
    _check_partition_limit(service, count)
    return count


def _check_partition_limit(service: BrokerService, count: int) -> None:
    """406 beyond `max_num_partitions_per_partitioned_topic` (0: no limit), as upstream."""
    limit = service.config.max_num_partitions_per_partitioned_topic
    if 0 < limit < count:
        raise RestError(406, f"Number of partitions should be less than or equal to {limit}")


async def create_partitioned_topic(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    count = _partition_count(service, await _body(request))
    if name.is_partitioned:
        raise RestError(412, "Partitioned Topic Name should not contain '-partition-'")
    if _partitions(service, name) > 0:
        raise RestError(409, "Partitioned topic already exists")
    if service.topic_exists(name):
        raise RestError(409, "This topic already exists")
    await service.create_partitioned_topic(name, count)
    return _ok()


async def update_partitioned_topic(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    count = _partition_count(service, await _body(request))
    current = _partitions(service, name)
    if current == 0:
        raise RestError(404, f"Partitioned Topic {name} not found")
    if count <= current:
        raise RestError(409, "Number of new partitions must be greater than existing number "
                             "of partitions")
    await service.update_partitioned_topic(name, count)
    return _ok()


async def get_partitioned_metadata(request: web.Request) -> web.Response:
    service = _service(request)
    if _flag(request, "checkAllowAutoCreation"):  # a client's lookup, not an admin's question
        return await partitions_for_client(service, request)
    name = _topic_name(request)
    partitions = _partitions(service, name)
    if partitions == 0 and not service.topic_exists(name):
        raise _not_found(name)
    return _ok({"partitions": partitions})


async def delete_partitioned_topic(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    force = _flag(request, "force")
    if _partitions(service, name) == 0:
        raise RestError(404, f"Partitioned Topic {name} not found")
    if not force and any(_is_active(t) for t in await _targets(service, name)):
        raise RestError(412, "Topic has active producers/subscriptions")
    await service.delete_partitioned_topic(name, force=force)
    return _ok()


async def create_topic(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    if _partitions(service, name) > 0 or service.topic_exists(name):
        raise RestError(409, "This topic already exists")
    await service.create_topic(name)
    return _ok()


async def delete_topic(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    force = _flag(request, "force")
    topic = await _topic(service, name)
    if not force and _is_active(topic):
        raise RestError(412, "Topic has active producers/subscriptions")
    await service.delete_topic(name, force=force)
    return _ok()


def _last_message_id(position: tuple[int, int]) -> dict[str, int]:
    """Pulsar's MessageIdImpl JSON for the last message of a terminated topic."""
    return {"ledgerId": position[0], "entryId": position[1], "partitionIndex": -1}


async def terminate_topic(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    if _partitions(service, name) > 0:
        raise RestError(405, "Termination of a partitioned topic is not allowed")
    await _persistent(service, name)
    return _ok(_last_message_id(await service.terminate_topic(name)))


async def terminate_partitioned_topic(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    partitions = _partitions(service, name)
    if partitions == 0:
        raise RestError(404, f"Partitioned Topic {name} not found")
    if not name.is_persistent:
        raise RestError(405, "Termination of a non-persistent topic is not allowed")
    result = {}
    for index in range(partitions):
        partition = name.partition(index)
        if service.topic_exists(partition):
            result[str(index)] = _last_message_id(await service.terminate_topic(partition))
    return _ok(result)


async def unload_topic(request: web.Request) -> web.Response:
    """Unload the topic (every partition of a partitioned one): its clients reconnect."""
    service = _service(request)
    name = _topic_name(request)
    partitions = _partitions(service, name)
    if partitions == 0 and not service.topic_exists(name):
        raise _not_found(name)
    names = [name] if partitions == 0 else [name.partition(i) for i in range(partitions)]
    for each in names:
        await service.unload_topic(each)
    return _ok()


async def get_stats(request: web.Request) -> web.Response:
    topic = await _topic(_service(request), _topic_name(request))
    return _ok(topic_stats(topic))


async def get_internal_stats(request: web.Request) -> web.Response:
    topic = await _persistent(_service(request), _topic_name(request))
    return _ok(internal_stats(topic))


async def _partition_stats(request: web.Request,
                           one: Callable[[Topic], dict[str, Any]],
                           ) -> tuple[int, dict[str, dict[str, Any]]]:
    """(partitions, {partition name: one(partition)}) over the partitions that exist."""
    service = _service(request)
    name = _topic_name(request)
    partitions = _partitions(service, name)
    if partitions == 0:
        raise RestError(404, f"Partitioned Topic {name} not found")
    return partitions, {str(t.name): one(t) for t in await _targets(service, name)}


async def get_partitioned_stats(request: web.Request) -> web.Response:
    partitions, per_partition = await _partition_stats(request, topic_stats)
    stats = aggregate_partitioned_stats(list(per_partition.values()))
    stats["metadata"] = {"partitions": partitions}
    stats["partitions"] = per_partition if _flag_default(request, "perPartition", True) else {}
    return _ok(stats)


def _persistent_internal_stats(topic: Topic) -> dict[str, Any]:
    if not isinstance(topic, PersistentTopic):
        raise RestError(405, "This operation needs a persistent topic")
    return internal_stats(topic)


async def get_partitioned_internal_stats(request: web.Request) -> web.Response:
    partitions, per_partition = await _partition_stats(request, _persistent_internal_stats)
    return _ok({"metadata": {"partitions": partitions}, "partitions": per_partition})


def _flag_default(request: web.Request, name: str, default: bool) -> bool:
    if name not in request.query:
        return default
    return _flag(request, name)


# -- partitioned stats ----------------------------------------------------------------------

TOPIC_SUMS = ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut",
              "msgInCounter", "bytesInCounter", "msgOutCounter", "bytesOutCounter",
              "storageSize", "backlogSize", "msgDropRate", "msgDropCounter")
PUBLISHER_SUMS = ("msgRateIn", "msgThroughputIn", "msgInCounter", "bytesInCounter")
SUBSCRIPTION_SUMS = ("msgRateOut", "msgThroughputOut", "msgOutCounter", "bytesOutCounter",
                     "msgBacklog", "msgBacklogNoDelayed", "msgDelayed", "unackedMessages",
                     "msgInReplay", "totalMsgExpired", "nonContiguousDeletedMessagesRanges",
                     "msgDropRate", "msgDropCounter", "drainingHashesCount",
                     "drainingHashesClearedTotal", "drainingHashesUnackedMessages")
SUBSCRIPTION_ORS = ("isDurable", "isReplicated", "blockedSubscriptionOnUnackedMsgs")


def _sum_into(total: dict[str, Any], part: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in part:
            total[key] = total.get(key, 0) + part[key]


def aggregate_partitioned_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Upstream's PartitionedTopicStats sums over the partitions' `topic_stats`: counters
    and sizes add up, `averageMsgSize` is the mean over partitions, publishers merge by
    producer name, subscriptions by name (their counters add up, their consumers are
    listed together).

    Args:
        parts: one `topic_stats` dict per partition.

    Returns:
        The aggregate, with the fields of a topic's stats.
    """
    total: dict[str, Any] = dict.fromkeys(TOPIC_SUMS[:8], 0)
    total.update({"averageMsgSize": 0.0, "publishers": [], "subscriptions": {}})
    publishers: dict[str, dict[str, Any]] = {}
    for count, part in enumerate(parts, start=1):
        _sum_into(total, part, TOPIC_SUMS)
        total["averageMsgSize"] += (part.get("averageMsgSize", 0.0)
                                    - total["averageMsgSize"]) / count
        total.setdefault("deduplicationStatus", part.get("deduplicationStatus"))
        for publisher in part.get("publishers", []):
            merged = publishers.get(publisher["producerName"])
            if merged is None:
                publishers[publisher["producerName"]] = dict(publisher)
            else:
                _sum_into(merged, publisher, PUBLISHER_SUMS)
        for name, subscription in part.get("subscriptions", {}).items():
            merged = total["subscriptions"].get(name)
            if merged is None:
                total["subscriptions"][name] = {**subscription,
                                                "consumers": list(subscription["consumers"])}
                continue
            _sum_into(merged, subscription, SUBSCRIPTION_SUMS)
            for key in SUBSCRIPTION_ORS:
                if key in subscription:
                    merged[key] = bool(merged.get(key)) or bool(subscription[key])
            merged["consumers"].extend(subscription["consumers"])
    for publisher in publishers.values():
        messages = publisher.get("msgInCounter", 0)
        publisher["averageMsgSize"] = (publisher.get("bytesInCounter", 0) / messages
                                       if messages else 0.0)
    total["publishers"] = list(publishers.values())
    return total


# -- subscriptions --------------------------------------------------------------------------


async def list_subscriptions(request: web.Request) -> web.Response:
    service = _service(request)
    names: set[str] = set()
    for topic in await _targets(service, _topic_name(request)):
        names.update(topic.subscriptions)
        if isinstance(topic, PersistentTopic):
            names.update(topic.readers)
    return _ok(sorted(names))


def _message_id(body: Any) -> tuple[int, int, int]:
    """(ledgerId, entryId, batchIndex) of a MessageId / ResetCursorData body; None and
    MessageId.latest give (LONG_MAX, LONG_MAX, -1)."""
    if body is None:
        return LONG_MAX, LONG_MAX, -1
    if not isinstance(body, dict) or "ledgerId" not in body or "entryId" not in body:
        raise RestError(400, "The body must be a message id: {ledgerId, entryId}")
    return (_int_body(body["ledgerId"], "ledgerId"), _int_body(body["entryId"], "entryId"),
            _int_body(body.get("batchIndex", -1), "batchIndex"))


async def create_subscription(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    subscription = request.match_info["subscription"]
    if not name.is_persistent:
        raise RestError(405, "Creating a subscription needs a persistent topic")
    if subscription == DEDUP_CURSOR_NAME or subscription.startswith("pulsar.repl"):
        raise RestError(412, "Subscription name is reserved")
    try:
        check_subscription_name(subscription)
    except BrokerError as error:
        raise RestError(412, str(error)) from error
    ledger_id, entry_id, _ = _message_id(await _body(request))
    partitions = _partitions(service, name)
    targets = ([name.partition(i) for i in range(partitions)] if partitions else [name])
    topics = []
    for target in targets:
        topic = await service.get_topic(target, create=True)  # auto-creation rules apply
        assert isinstance(topic, PersistentTopic)
        if subscription in topic.subscriptions or subscription in topic.readers:
            raise RestError(409, "Subscription already exists for topic")
        topics.append(topic)
    for topic in topics:
        if (ledger_id, entry_id) == (LONG_MAX, LONG_MAX):
            await topic.create_subscription(subscription, "latest")
        elif ledger_id < 0 or entry_id < 0:
            await topic.create_subscription(subscription, "earliest")
        else:
            created = await topic.create_subscription(subscription, "latest")
            await created.reset_cursor(Position(ledger_id, entry_id))
    return _ok()


async def delete_subscription(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    subscription = request.match_info["subscription"]
    force = _flag(request, "force")
    holders = [t for t in await _targets(service, name) if subscription in t.subscriptions]
    if not holders:
        raise _sub_not_found(name, subscription)
    if not force and any(t.subscriptions[subscription].consumers for t in holders):
        raise RestError(412, "Subscription has active connected consumers")
    for topic in holders:
        if isinstance(topic, NonPersistentTopic):
            _close_non_persistent_consumers(topic, subscription)
        await topic.unsubscribe(subscription, None, force=force)
    return _ok()


def _close_non_persistent_consumers(topic: NonPersistentTopic, subscription: str) -> None:
    held = topic.subscriptions[subscription]
    for consumer in list(held.consumers):
        held.remove_consumer(consumer)
        consumer.sink.close_consumer(consumer, "subscription deleted")


async def skip(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    if _partitions(service, name) > 0:
        raise RestError(405, "Skip messages on a partitioned topic is not allowed")
    subscription = _durable(await _topic(service, name), request.match_info["subscription"])
    if subscription is None:
        raise _sub_not_found(name, request.match_info["subscription"])
    await subscription.skip(_int_path(request, "count"))
    return _ok()


async def skip_all(request: web.Request) -> web.Response:
    found = await _subscriptions(_service(request), _topic_name(request),
                                 request.match_info["subscription"])
    for subscription in found:
        await subscription.clear_backlog()
    return _ok()


async def expire_messages(request: web.Request) -> web.Response:
    found = await _subscriptions(_service(request), _topic_name(request),
                                 request.match_info["subscription"])
    for subscription in found:
        await subscription.expire_messages(_int_path(request, "seconds"))
    return _ok()


async def expire_all_subscriptions(request: web.Request) -> web.Response:
    seconds = _int_path(request, "seconds")
    for topic in await _targets(_service(request), _topic_name(request)):
        if not isinstance(topic, PersistentTopic):
            raise RestError(405, "Cursor operations need a persistent topic")
        for subscription in list(topic.subscriptions.values()):
            await subscription.expire_messages(seconds)
    return _ok()


async def reset_cursor_by_time(request: web.Request) -> web.Response:
    found = await _subscriptions(_service(request), _topic_name(request),
                                 request.match_info["subscription"])
    for subscription in found:
        await subscription.reset_cursor_by_time(_int_path(request, "timestamp"))
    return _ok()


async def reset_cursor_to_position(request: web.Request) -> web.Response:
    service = _service(request)
    name = _topic_name(request)
    if _partitions(service, name) > 0:
        raise RestError(405, "Reset-cursor at position is not allowed for partitioned-topic")
    body = await _body(request)
    ledger_id, entry_id, batch_index = _message_id(body)
    excluded = isinstance(body, dict) and body.get("isExcluded") is True
    topic = await _topic(service, name)
    subscription = _durable(topic, request.match_info["subscription"])
    if subscription is None:
        raise _sub_not_found(name, request.match_info["subscription"])
    assert isinstance(topic, PersistentTopic)
    position = Position(max(ledger_id, -1), max(entry_id, -1))
    ack_set = None
    if batch_index >= 0 and topic.managed_ledger.is_valid_position(position):
        ack_set = _batch_ack_set(topic, position, batch_index + 1 if excluded else batch_index)
    elif excluded:
        position = Position(position.ledger_id, position.entry_id + 1)  # the next valid one
    await subscription.reset_cursor(position, ack_set)
    return _ok()


def _batch_ack_set(topic: PersistentTopic, position: Position, first_unacked: int,
                   ) -> list[int] | None:
    """The ack set (set bit = unacknowledged) that restarts a batch entry at index
    `first_unacked`; None when the entry is not a batch or nothing is skipped."""
    size = EntryInfo(position, topic.managed_ledger.read_entry(position)).batch_size
    if size <= 1 or first_unacked <= 0:
        return None
    mask = ((1 << size) - 1) & ~((1 << min(first_unacked, size)) - 1)
    return int_to_ack_set(mask)


# -- metrics --------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """Pulsar's broker health check: "ok", or 503 with the reason while the storage refuses
    writes (a full disk, a failed disk)."""
    service = _service(request)
    failed = service.storage.failed
    if service.storage_full:
        raise RestError(503, f"The broker's disk is full; publishing is refused until there "
                             f"is room again: {failed}")
    if failed is not None and not service.storage.closed:
        raise RestError(503, f"The broker's storage accepts no writes: {failed}")
    return web.Response(text="ok")


async def metrics(request: web.Request) -> web.Response:
    text = render_metrics(_service(request), consumer_level=request.app[CONSUMER_METRICS])
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


# -- the application ------------------------------------------------------------------------

_NS = "/admin/v2/namespaces/{tenant}/{namespace}"
_DOMAIN = "/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}"
_TOPIC = _DOMAIN + "/{topic}"
_SUB = _TOPIC + "/subscription/{subscription}"


def admin_app(service: BrokerService, *, consumer_metrics: bool = False,
              auth: AuthenticationService | None = None,
              lookup_urls: LookupUrls | None = None) -> web.Application:
    """The admin API of `service` as an aiohttp application.

    Args:
        service: the broker the handlers drive; it must run on the serving loop.
        consumer_metrics: write the per-consumer metrics at /metrics.
        auth: require a valid bearer token (None: no authentication).
        lookup_urls: what HTTP lookups answer (default: no broker URL, lookups answer 503).

    Returns:
        The application, routes registered.
    """
    middlewares: list[Middleware] = [*security_middlewares(service, auth), _errors]
    app = web.Application(middlewares=middlewares, client_max_size=BODY_BYTES_MAX)
    app[SERVICE] = service
    app[CONSUMER_METRICS] = consumer_metrics
    urls = lookup_urls or LookupUrls()
    app[LOOKUP_URLS] = urls
    r = app.router
    r.add_get("/metrics", metrics)
    r.add_get("/metrics/", metrics)
    r.add_get("/admin/v2/brokers/health", health)
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
    r.add_get(_NS, get_namespace)
    r.add_put(_NS, create_namespace)
    r.add_delete(_NS, delete_namespace)
    r.add_get(_NS + "/topics", namespace_topics)
    r.add_get(_NS + "/backlogQuotaMap", get_backlog_quotas)
    r.add_post(_NS + "/backlogQuota", set_backlog_quota)
    r.add_delete(_NS + "/backlogQuota", remove_backlog_quota)
    for path, policy in NAMESPACE_POLICIES.items():
        get, post, delete = _policy_handlers(policy)
        r.add_get(f"{_NS}/{path}", get)
        r.add_post(f"{_NS}/{path}", post)
        r.add_delete(f"{_NS}/{path}", delete)
    r.add_get(_DOMAIN, list_topics)
    r.add_get(_DOMAIN + "/partitioned", list_partitioned_topics)
    r.add_put(_TOPIC + "/partitions", create_partitioned_topic)
    r.add_post(_TOPIC + "/partitions", update_partitioned_topic)
    r.add_get(_TOPIC + "/partitions", get_partitioned_metadata)
    r.add_delete(_TOPIC + "/partitions", delete_partitioned_topic)
    r.add_put(_TOPIC, create_topic)
    r.add_delete(_TOPIC, delete_topic)
    r.add_post(_TOPIC + "/terminate", terminate_topic)
    r.add_post(_TOPIC + "/terminate/partitions", terminate_partitioned_topic)
    r.add_put(_TOPIC + "/unload", unload_topic)
    r.add_get(_TOPIC + "/stats", get_stats)
    r.add_get(_TOPIC + "/internalStats", get_internal_stats)
    r.add_get(_TOPIC + "/partitioned-stats", get_partitioned_stats)
    r.add_get(_TOPIC + "/partitioned-internalStats", get_partitioned_internal_stats)
    r.add_get(_TOPIC + "/subscriptions", list_subscriptions)
    r.add_post(_TOPIC + "/all_subscription/expireMessages/{seconds:[0-9]+}",
               expire_all_subscriptions)
    r.add_put(_SUB, create_subscription)
    r.add_delete(_SUB, delete_subscription)
    r.add_post(_SUB + "/skip/{count:[0-9]+}", skip)
    r.add_post(_SUB + "/skip_all", skip_all)
    r.add_post(_SUB + "/expireMessages/{seconds:[0-9]+}", expire_messages)
    r.add_post(_SUB + "/resetcursor/{timestamp:[0-9]+}", reset_cursor_by_time)
    r.add_post(_SUB + "/resetcursor", reset_cursor_to_position)
    from ._admin_schemas import add_schema_routes  # it imports this module's helpers

    add_schema_routes(r)
    add_permission_routes(r, service)
    r.add_routes(lookup_routes(service, urls))
    return app


class AdminServer:
    """A running admin API; `close()` stops it."""

    def __init__(self, runner: web.AppRunner, host: str, port: int,
                 https_port: int | None = None):
        self._runner = runner
        self.host = host
        self.port = port
        self.https_port = https_port

    @property
    def url(self) -> str:
        """The base URL, e.g. `http://127.0.0.1:8080`."""
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        """Stop listening and finish the requests in flight."""
        await self._runner.cleanup()


async def start_admin(service: BrokerService, host: str, port: int, *,
                      consumer_metrics: bool = False, auth: AuthenticationService | None = None,
                      ssl_context: ssl.SSLContext | None = None,
                      https_port: int | None = None, broker_url: str | None = None,
                      broker_url_tls: str | None = None) -> AdminServer:
    """Serve the admin API of `service` on `host:port` from the running loop.

    Args:
        service: the broker, running on this loop.
        host: the address to listen on.
        port: the TCP port; 0 picks a free one (see `AdminServer.port`).
        consumer_metrics: write the per-consumer metrics at /metrics.
        auth: require bearer tokens (None: no authentication).
        ssl_context: with `https_port`: serve HTTPS there too (0: any free port).
        broker_url: the binary-protocol URL HTTP lookups answer with.
        broker_url_tls: the `pulsar+ssl://` URL they answer with (None: no TLS listener).

    Returns:
        The running server.

    Raises:
        OSError: the address cannot be bound.
    """
    assert (ssl_context is None) == (https_port is None), "HTTPS needs a context and a port"
    urls = LookupUrls(broker_url, broker_url_tls=broker_url_tls)
    runner = web.AppRunner(admin_app(service, consumer_metrics=consumer_metrics, auth=auth,
                                     lookup_urls=urls),
                           access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S,
                           logger=_HttpServerLog(logging.getLogger("aiohttp.server")),
                           max_field_size=PARSER_FIELD_BYTES_MAX,
                           max_line_size=PARSER_FIELD_BYTES_MAX)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        if ssl_context is not None:
            await web.TCPSite(runner, host, https_port, ssl_context=ssl_context).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    assert bound > 0
    bound_https = runner.addresses[1][1] if ssl_context is not None else None
    host_port = advertised_url_for(host, bound).removeprefix("pulsar://")
    urls.http_url = "http://" + host_port
    if bound_https is not None:
        urls.http_url_tls = "https://" + host_port.rsplit(":", 1)[0] + f":{bound_https}"
    log.info("admin API listening on %s:%d%s", host, bound,
             "" if bound_https is None else f", HTTPS on port {bound_https}")
    return AdminServer(runner, host, bound, bound_https)
