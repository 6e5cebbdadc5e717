"""The admin REST API's topic-level policies (Pulsar's v2 paths under a topic): GET reads,
POST sets, DELETE removes, for `retention`, `messageTTL` (set by the `messageTTL` query
parameter, as upstream), `deduplicationEnabled`, `delayedDelivery`, `maxProducers`,
`maxConsumers`, `maxUnackedMessagesOnConsumer`, `maxUnackedMessagesOnSubscription`,
`maxConsumersPerSubscription`, `subscriptionTypesEnabled`, `compactionThreshold`, and the
backlog quotas (`backlogQuotaMap`, `backlogQuota?backlogQuotaType=…`).

A topic's policy overrides its namespace's (`NamespaceRegistry.effective_policies`). The
values are stored in the metadata store under the topic's name (a partitioned topic's base
name covers every partition) and checked by `broker/_policies.py`'s rules against the
policies in force for the topic, so an invalid value answers 400 (malformed) or 412 as it
does for a namespace. After a change the service re-applies the policies to its loaded
topics, so a limit, a TTL or deduplication takes effect at once (TTL at the next expiry
check).

GET answers the topic's own value, or 204 when it has none; with `applied=true` the value in
force: the topic's, else the namespace's, else the broker's default. Statuses as upstream's
`preValidation`: 404 for a missing topic (or namespace), 412 for a partition's name (its
policies are its partitioned topic's).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .._names import TopicName
from .._policies import check_backlog_quota_type
from ._rest import (
    TOPIC_PATH,
    Handler,
    RestError,
    _body,
    _flag,
    _not_found,
    _ok,
    _partitions,
    _service,
    _topic_name,
)

__all__ = ["add_topic_policy_routes"]

# The endpoint of each topic policy (its path under the topic) and its policy field.
TOPIC_POLICIES: dict[str, str] = {
    "retention": "retention_policies",
    "messageTTL": "message_ttl_in_seconds",
    "deduplicationEnabled": "deduplicationEnabled",
    "delayedDelivery": "delayed_delivery_policies",
    "maxProducers": "max_producers_per_topic",
    "maxConsumers": "max_consumers_per_topic",
    "maxUnackedMessagesOnConsumer": "max_unacked_messages_per_consumer",
    "maxUnackedMessagesOnSubscription": "max_unacked_messages_per_subscription",
    "maxConsumersPerSubscription": "max_consumers_per_subscription",
    "subscriptionTypesEnabled": "subscription_types_enabled",
    "compactionThreshold": "compaction_threshold",
}


def _policy_topic(request: web.Request) -> TopicName:
    """The topic whose policies the path names: an existing topic or partitioned topic
    (404 otherwise), not one partition (412)."""
    service = _service(request)
    name = _topic_name(request)
    if name.is_partitioned:
        raise RestError(412, "Not allowed to set/get topic policy for a partition")
    if _partitions(service, name) == 0 and not service.topic_exists(name):
        raise _not_found(name)
    return name


async def _changed(request: web.Request, name: TopicName) -> web.Response:
    await _service(request).policies_changed(name.namespace_name)
    return _ok()


async def _ttl_value(request: web.Request) -> Any:
    """The `messageTTL` query parameter (absent: None, a removal, as upstream)."""
    text = request.query.get("messageTTL")
    if text is None:
        return None
    try:
        return int(text)
    except ValueError as error:
        raise RestError(400, "Query parameter messageTTL must be an integer") from error


def _policy_handlers(endpoint: str, field: str) -> tuple[Handler, Handler, Handler]:
    """GET, POST and DELETE for one topic policy endpoint."""

    async def get(request: web.Request) -> web.Response:
        name = _policy_topic(request)
        registry = _service(request).namespaces
        if _flag(request, "applied"):
            return _ok(registry.applied_policy(str(name), field))
        return _ok(registry.topic_policies(str(name)).get(field))

    async def post(request: web.Request) -> web.Response:
        name = _policy_topic(request)
        value = await (_ttl_value(request) if endpoint == "messageTTL" else _body(request))
        if value is None and endpoint == "retention":  # upstream: no body changes nothing
            return _ok()
        _service(request).namespaces.set_topic_policy(str(name), field, value)
        return await _changed(request, name)

    async def delete(request: web.Request) -> web.Response:
        name = _policy_topic(request)
        _service(request).namespaces.set_topic_policy(str(name), field, None)
        return await _changed(request, name)

    return get, post, delete


def _quota_type(request: web.Request) -> str:
    return check_backlog_quota_type(request.query.get("backlogQuotaType",
                                                      "destination_storage"))


async def get_backlog_quotas(request: web.Request) -> web.Response:
    name = _policy_topic(request)
    registry = _service(request).namespaces
    if _flag(request, "applied"):
        return _ok(registry.applied_backlog_quotas(str(name)))
    return _ok(registry.topic_policies(str(name)).get("backlog_quota_map") or {})


async def set_backlog_quota(request: web.Request) -> web.Response:
    name = _policy_topic(request)
    kind = _quota_type(request)
    quota = await _body(request)
    if quota is None:
        raise RestError(400, "The body must be a BacklogQuota object")
    _service(request).namespaces.set_topic_backlog_quota(str(name), kind, quota)
    return await _changed(request, name)


async def remove_backlog_quota(request: web.Request) -> web.Response:
    name = _policy_topic(request)
    _service(request).namespaces.set_topic_backlog_quota(str(name), _quota_type(request), None)
    return await _changed(request, name)


def add_topic_policy_routes(router: web.UrlDispatcher) -> None:
    """Register the topic-level policy endpoints."""
    r = router
    r.add_get(TOPIC_PATH + "/backlogQuotaMap", get_backlog_quotas)
    r.add_post(TOPIC_PATH + "/backlogQuota", set_backlog_quota)
    r.add_delete(TOPIC_PATH + "/backlogQuota", remove_backlog_quota)
    for endpoint, field in TOPIC_POLICIES.items():
        get, post, delete = _policy_handlers(endpoint, field)
        r.add_get(f"{TOPIC_PATH}/{endpoint}", get)
        r.add_post(f"{TOPIC_PATH}/{endpoint}", post)
        r.add_delete(f"{TOPIC_PATH}/{endpoint}", delete)
