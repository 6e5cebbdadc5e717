"""The admin REST API's plumbing, shared by its route modules: `RestError` and the middleware
that answers every error as Pulsar does (`{"reason": …}` with a status), the request helpers
(JSON body, flags, numbers in the path) and the name helpers that find the path's namespace,
topic, partitions and subscriptions.

Status mapping (`_status_of`) for a `BrokerError` no handler turned into a `RestError`: 404 a
missing topic, subscription or consumer; 400 a malformed policy value; 406 a partition count
out of range; 412 an invalid name or policy value, an operation not allowed; 409 metadata
that exists already or an incompatible schema (422 a schema that does not parse); 503 a
broker not ready; anything else 500.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web

from .._errors import (
    BrokerError,
    ConsumerBusyError,
    ConsumerNotFoundError,
    IncompatibleSchemaError,
    InvalidSchemaError,
    InvalidTopicNameError,
    MalformedPolicyError,
    MetadataError,
    NotAllowedError,
    PartitionCountError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
)
from .._names import NamespaceName, TopicDomain, TopicName
from ..dispatch._subscription import Subscription
from ..topics._service import BrokerService, Topic
from ..topics._topic import PersistentTopic
from ._lookup_http import LookupUrls

__all__ = ["RestError"]

log = logging.getLogger(__name__)

SERVICE: web.AppKey[BrokerService] = web.AppKey("service", BrokerService)
CONSUMER_METRICS: web.AppKey[bool] = web.AppKey("consumer_metrics", bool)
LOOKUP_URLS: web.AppKey[LookupUrls] = web.AppKey("lookup_urls", LookupUrls)

LONG_MAX = 2**63 - 1  # MessageId.latest is (Long.MAX_VALUE, Long.MAX_VALUE)

NS_PATH = "/admin/v2/namespaces/{tenant}/{namespace}"
DOMAIN_PATH = "/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}"
TOPIC_PATH = DOMAIN_PATH + "/{topic}"
SUBSCRIPTION_PATH = TOPIC_PATH + "/subscription/{subscription}"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
    if isinstance(error, MalformedPolicyError):
        return 400
    if isinstance(error, PartitionCountError):
        return 406
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
