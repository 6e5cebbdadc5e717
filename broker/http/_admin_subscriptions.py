"""The admin REST API's subscriptions: listing, creation at a message id, deletion and the
cursor operations (skip, skip all, expiry, reset by time or to a position). A partitioned
topic's base name stands for every partition holding the subscription where Pulsar allows
it. See `_admin` for the endpoints and statuses.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .._errors import BrokerError
from .._names import check_subscription_name
from ..dispatch._entry import EntryInfo
from ..ledger._position import Position, int_to_ack_set
from ..topics._dedup import DEDUP_CURSOR_NAME
from ..topics._nonpersistent_topic import NonPersistentTopic
from ..topics._topic import PersistentTopic
from ._rest import (
    LONG_MAX,
    SUBSCRIPTION_PATH,
    TOPIC_PATH,
    RestError,
    _body,
    _durable,
    _flag,
    _int_body,
    _int_path,
    _ok,
    _partitions,
    _service,
    _sub_not_found,
    _subscriptions,
    _targets,
    _topic,
    _topic_name,
)

__all__ = ["add_subscription_routes"]


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


def add_subscription_routes(router: web.UrlDispatcher) -> None:
    """Register the subscription endpoints and the cursor operations."""
    r = router
    r.add_get(TOPIC_PATH + "/subscriptions", list_subscriptions)
    r.add_post(TOPIC_PATH + "/all_subscription/expireMessages/{seconds:[0-9]+}",
               expire_all_subscriptions)
    r.add_put(SUBSCRIPTION_PATH, create_subscription)
    r.add_delete(SUBSCRIPTION_PATH, delete_subscription)
    r.add_post(SUBSCRIPTION_PATH + "/skip/{count:[0-9]+}", skip)
    r.add_post(SUBSCRIPTION_PATH + "/skip_all", skip_all)
    r.add_post(SUBSCRIPTION_PATH + "/expireMessages/{seconds:[0-9]+}", expire_messages)
    r.add_post(SUBSCRIPTION_PATH + "/resetcursor/{timestamp:[0-9]+}", reset_cursor_by_time)
    r.add_post(SUBSCRIPTION_PATH + "/resetcursor", reset_cursor_to_position)
