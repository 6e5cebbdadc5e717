"""The admin REST API's topics: listings, partitioned topics, creation and deletion,
termination, unloading and stats, with upstream's sums over a partitioned topic's partitions
(`aggregate_partitioned_stats`). See `_admin` for the endpoints and statuses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from .._policies import check_partition_count
from ..topics._service import BrokerService, Topic
from ..topics._topic import PersistentTopic
from ._lookup_http import partitions_for_client
from ._rest import (
    DOMAIN_PATH,
    TOPIC_PATH,
    RestError,
    _body,
    _flag,
    _is_active,
    _namespace,
    _not_found,
    _ok,
    _partitions,
    _persistent,
    _service,
    _targets,
    _topic,
    _topic_name,
)
from ._stats import internal_stats, topic_stats

__all__ = ["add_topic_routes", "aggregate_partitioned_stats"]


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
    """400 for a body that is no integer, 406 below 1 or beyond
    `max_num_partitions_per_partitioned_topic` (0: no limit), as upstream."""
    return check_partition_count(value, service.config)


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


def add_topic_routes(router: web.UrlDispatcher) -> None:
    """Register the topic endpoints (listings, partitions, terminate, unload, stats)."""
    r = router
    r.add_get(DOMAIN_PATH, list_topics)
    r.add_get(DOMAIN_PATH + "/partitioned", list_partitioned_topics)
    r.add_put(TOPIC_PATH + "/partitions", create_partitioned_topic)
    r.add_post(TOPIC_PATH + "/partitions", update_partitioned_topic)
    r.add_get(TOPIC_PATH + "/partitions", get_partitioned_metadata)
    r.add_delete(TOPIC_PATH + "/partitions", delete_partitioned_topic)
    r.add_put(TOPIC_PATH, create_topic)
    r.add_delete(TOPIC_PATH, delete_topic)
    r.add_post(TOPIC_PATH + "/terminate", terminate_topic)
    r.add_post(TOPIC_PATH + "/terminate/partitions", terminate_partitioned_topic)
    r.add_put(TOPIC_PATH + "/unload", unload_topic)
    r.add_get(TOPIC_PATH + "/stats", get_stats)
    r.add_get(TOPIC_PATH + "/internalStats", get_internal_stats)
    r.add_get(TOPIC_PATH + "/partitioned-stats", get_partitioned_stats)
    r.add_get(TOPIC_PATH + "/partitioned-internalStats", get_partitioned_internal_stats)
