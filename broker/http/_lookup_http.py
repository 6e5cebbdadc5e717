"""HTTP lookup: what a client given an `http://` service URL asks the admin server.

Theory of operation
-------------------
With `pulsar.Client("http://host:8080")` the official client does its discovery over HTTP and
only then opens a binary-protocol connection to the broker URL it was given:

* `GET /lookup/v2/topic/{persistent|non-persistent}/{tenant}/{namespace}/{topic}` answers
  Pulsar's LookupData JSON: `brokerUrl` (our binary `pulsar://` URL), `brokerUrlTls`,
  `httpUrl`, `httpUrlTls`, `nativeUrl`. The C++ client requires both `brokerUrl` and
  `brokerUrlTls` keys to be present; without TLS the latter is null, as upstream sends it.
  A listener named by the `listenerName` query parameter (else the `X-Pulsar-ListenerName`
  header) gets that advertised listener's URLs in `brokerUrl`/`brokerUrlTls`/`nativeUrl`, a
  name the broker does not have a 500 with Pulsar's reason (`_listeners.py`).
* `GET /admin/v2/{domain}/{tenant}/{namespace}/{topic}/partitions?checkAllowAutoCreation=true`
  answers `{"partitions": N}` exactly as the binary PARTITIONED_METADATA does
  (`BrokerService.partitioned_metadata`): 0 for a missing topic, a partitioned topic created
  on the spot when the namespace's auto-creation type says "partitioned". (Without the query
  flag the admin API's own handler answers, and a missing topic is a 404.)
* `GET /admin/v2/namespaces/{tenant}/{namespace}/topics?mode=…` (regex consumers) is the admin
  API's namespace listing, unchanged.

Auto-creation follows the binary lookup: the lookup itself creates nothing and answers for any
valid name (the topic is created, or refused, when the producer or consumer attaches over the
binary protocol). An invalid name is a 412 with Pulsar's `{"reason": …}`, a missing namespace a
404 -- the admin API's error middleware does that from the `BrokerError`s raised here.

`LookupUrls` holds what the answers name; `start_admin` fills `http_url` once it has bound its
port. Until a broker URL is known (an admin server without a binary server) lookups answer 503.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from .._errors import ServiceNotReadyError, TopicNotFoundError
from .._listeners import ListenerNotFoundError, listeners_of
from .._names import NamespaceName, TopicName
from ..topics._service import BrokerService

__all__ = ["LOOKUP_PATH", "LookupUrls", "lookup_routes", "partitions_for_client"]

LOOKUP_PATH = "/lookup/v2/topic/{domain:persistent|non-persistent}/{tenant}/{namespace}/{topic}"
LISTENER_NAME_PARAM = "listenerName"  # wins over the header when both are given
LISTENER_NAME_HEADER = "X-Pulsar-ListenerName"


@dataclass
class LookupUrls:
    """The URLs HTTP lookups answer with.

    Attributes:
        broker_url: the binary-protocol URL (`pulsar://host:port`), None when unknown.
        http_url: the admin server's own URL (`http://host:port`).
        broker_url_tls: the `pulsar+ssl://` URL when the broker has a TLS listener.
        http_url_tls: the admin server's HTTPS URL when it serves HTTPS.
    """

    broker_url: str | None = None
    http_url: str = ""
    broker_url_tls: str | None = None
    http_url_tls: str | None = None


def _path_topic(request: web.Request) -> TopicName:
    """The topic named by the path; its namespace must exist.

    Raises:
        InvalidTopicNameError: the name is not valid.
        TopicNotFoundError: the namespace does not exist.
    """
    info = request.match_info
    namespace = NamespaceName.parse(f"{info['tenant']}/{info['namespace']}")
    return TopicName.parse(f"{info['domain']}://{namespace}/{info['topic']}")


def _check_namespace(service: BrokerService, name: TopicName) -> None:
    if not service.namespaces.namespace_exists(str(name.namespace_name)):
        raise TopicNotFoundError(f"Namespace {name.namespace_name} does not exist")


async def partitions_for_client(service: BrokerService, request: web.Request) -> web.Response:
    """`…/partitions?checkAllowAutoCreation=true`: the binary PARTITIONED_METADATA's answer.

    Raises:
        InvalidTopicNameError, TopicNotFoundError: as `_path_topic`; nothing is created.
    """
    name = _path_topic(request)
    _check_namespace(service, name)
    return web.json_response({"partitions": await service.partitioned_metadata(name)})


def lookup_routes(service: BrokerService, urls: LookupUrls) -> list[web.RouteDef]:
    """The HTTP lookup route of `service`, answering with `urls`."""

    async def lookup(request: web.Request) -> web.Response:
        name = _path_topic(request)
        _check_namespace(service, name)
        if urls.broker_url is None:
            raise ServiceNotReadyError("The binary protocol server is not running")
        listener = (request.query.get(LISTENER_NAME_PARAM, "")
                    or request.headers.get(LISTENER_NAME_HEADER, ""))
        try:
            broker_url, broker_url_tls = listeners_of(service.config).lookup(
                listener, urls.broker_url, urls.broker_url_tls)
        except ListenerNotFoundError as exc:  # Pulsar: a 500 with the lookup's reason
            return web.json_response({"reason": str(exc)}, status=500)
        return web.json_response({
            "brokerUrl": broker_url,
            "brokerUrlTls": broker_url_tls,
            "httpUrl": urls.http_url,
            "httpUrlTls": urls.http_url_tls,
            "nativeUrl": broker_url,
        })

    return [web.get(LOOKUP_PATH, lookup)]
