"""The admin REST API's broker endpoints: the health check, readiness, `/status.html` and the
dynamic configuration (Pulsar's `/admin/v2/brokers/...` paths).

Health check (`GET /admin/v2/brokers/health`), as upstream's: a real round trip through the
broker. It publishes a message with a fresh UUID to the health-check topic of the broker's
heartbeat namespace (`persistent://pulsar/<host:port>/healthcheck`, upstream's v2 form;
tenant and namespace created on first use, deduplication off on the topic so every check
writes) and reads the stored entry back, comparing the body. "ok" when it matches; 503 with
the reason first when the storage refuses writes (a full or failed disk, no round trip
tried); 500 when the round trip fails or takes longer than `HEALTH_CHECK_TIMEOUT_S`.

`GET /admin/v2/brokers/ready` answers "ok" while the service runs (500 once it is closing);
`/status.html` answers "OK" likewise (503 when closing). Magnetar has no dynamic
configuration: every setting is fixed at start, so `GET …/configuration` lists no names,
`…/configuration/values` has no overrides, and setting or deleting one answers 412 as
upstream does for a setting that is not dynamic.
"""

from __future__ import annotations

import asyncio
import uuid

from aiohttp import web

from magnetar.codec import SingleMessage, build_message, encode_entry, parse_entry

from .._names import TopicName
from ..ledger._position import Position
from ..topics._producer import ProducerSpec
from ..topics._service import BrokerService
from ..topics._topic import PersistentTopic
from ._admin_messages import read_stored_entry
from ._rest import LOOKUP_URLS, RestError, _service

__all__ = ["add_broker_routes", "health_check_topic"]

HEALTH_CHECK_TENANT = "pulsar"
HEALTH_CHECK_TOPIC_SUFFIX = "healthcheck"
HEALTH_CHECK_TIMEOUT_S = 30.0


def health_check_topic(service: BrokerService, host_port: str) -> TopicName:
    """The health-check topic of the heartbeat namespace of the broker at `host_port` (its
    admin API's address; the cluster's name when unknown)."""
    local = host_port or service.config.cluster_name
    return TopicName.parse(
        f"persistent://{HEALTH_CHECK_TENANT}/{local}/{HEALTH_CHECK_TOPIC_SUFFIX}")


def _storage_refusal(service: BrokerService) -> str | None:
    """Why the storage refuses writes now (None: it accepts them)."""
    failed = service.storage.failed
    if service.storage_full:
        return (f"The broker's disk is full; publishing is refused until there is room "
                f"again: {failed}")
    if failed is not None and not service.storage.closed:
        return f"The broker's storage accepts no writes: {failed}"
    return None


async def _prepare(service: BrokerService, name: TopicName) -> PersistentTopic:
    """The health-check topic, with its tenant and namespace created when missing."""
    registry = service.namespaces
    if not registry.tenant_exists(name.tenant):
        registry.create_tenant(name.tenant)
    if not registry.namespace_exists(name.namespace_name):
        registry.create_namespace(name.namespace_name)
    if registry.topic_policies(str(name)).get("deduplicationEnabled") is not False:
        registry.set_topic_policy(str(name), "deduplicationEnabled", False)
        await service.policies_changed(name.namespace_name)
    topic = await service.get_topic(name, create=True, explicit=True)
    assert isinstance(topic, PersistentTopic)
    return topic


async def round_trip(service: BrokerService, name: TopicName) -> None:
    """Publish a fresh message to the health-check topic `name` and read it back.

    Raises:
        RestError: 500 when what was read is not what was written.
        BrokerError: the topic refused the producer or the publish (the producer is gone).
    """
    topic = await _prepare(service, name)
    body = str(uuid.uuid4()).encode()
    producer = topic.add_producer(ProducerSpec())
    try:
        metadata, payload = build_message(SingleMessage(body, sequence_id=0),
                                          producer_name=producer.name,
                                          publish_time=int(service.clock() * 1000))
        result = await topic.publish(producer, encode_entry(metadata, payload), 0, 0, metadata)
    finally:
        topic.remove_producer(producer)
    if result.entry_id < 0:
        raise RestError(500, f"The health check's message to {name} was not stored")
    stored = await read_stored_entry(topic, Position(result.ledger_id, result.entry_id))
    if bytes(parse_entry(stored).payload) != body:
        raise RestError(500, f"The health check read back something else from {name}")


async def health(request: web.Request) -> web.Response:
    """Pulsar's broker health check (see the module comment)."""
    service = _service(request)
    refusal = _storage_refusal(service)
    if refusal is not None:
        raise RestError(503, refusal)
    host_port = (request.app[LOOKUP_URLS].http_url or "").partition("://")[2]
    name = health_check_topic(service, host_port)
    try:
        await asyncio.wait_for(round_trip(service, name), HEALTH_CHECK_TIMEOUT_S)
    except TimeoutError as error:
        raise RestError(500, f"The health check did not complete within "
                             f"{HEALTH_CHECK_TIMEOUT_S:g} s on {name}") from error
    return web.Response(text="ok")


def _running(service: BrokerService) -> bool:
    return not (service.closed or service.stopping)


async def ready(request: web.Request) -> web.Response:
    if not _running(_service(request)):
        raise RestError(500, "The broker is not ready: it is shutting down")
    return web.Response(text="ok")


async def status_html(request: web.Request) -> web.Response:
    if not _running(_service(request)):
        raise RestError(503, "Service unavailable")
    return web.Response(text="OK")


async def dynamic_configuration_names(request: web.Request) -> web.Response:
    return web.json_response([])


async def dynamic_configuration_values(request: web.Request) -> web.Response:
    return web.json_response({})


async def update_dynamic_configuration(request: web.Request) -> web.Response:
    raise RestError(412, f"Cannot update non-dynamic configuration "
                         f"{request.match_info['name']}: Magnetar's settings are fixed at "
                         "start")


def add_broker_routes(router: web.UrlDispatcher) -> None:
    """Register the health check, readiness, status and configuration endpoints."""
    r = router
    r.add_get("/admin/v2/brokers/health", health)
    r.add_get("/admin/v2/brokers/ready", ready)
    r.add_get("/status.html", status_html)
    r.add_get("/admin/v2/brokers/configuration", dynamic_configuration_names)
    r.add_get("/admin/v2/brokers/configuration/values", dynamic_configuration_values)
    r.add_post("/admin/v2/brokers/configuration/{name}/{value}", update_dynamic_configuration)
    r.add_delete("/admin/v2/brokers/configuration/{name}", update_dynamic_configuration)
