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
* `/metrics`: `encode_metrics` (the format the Accept header asks for);
* `/admin/v2/brokers/health` (a publish and read-back round trip; 503 with the reason while
  the disk is full or the storage failed), `…/brokers/ready`, `/status.html` and the
  (empty) dynamic configuration: `_admin_brokers`;
* topic-level policies under `…/{topic}/` (`retention`, `messageTTL`, `maxProducers`, ...):
  `_admin_topic_policies`; message inspection (`…/subscription/{sub}/position/{n}`,
  `examinemessage`, `ledger/{l}/entry/{e}`, `lastMessageId`): `_admin_messages`;
  compaction (`PUT|GET …/{topic}/compaction`): `_admin_compaction`;
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

Layout: this module builds the application (`admin_app`) and serves it (`start_admin`); the
routes live in `_admin_namespaces` (clusters, tenants, namespaces and their policies, whose
rules are `broker/_policies.py`'s, applied by the `NamespaceRegistry`), `_admin_topics`,
`_admin_subscriptions` and `_admin_schemas`, over the shared plumbing of `_rest` (`RestError`,
the error middleware, the request and name helpers).

The guards run before the error middleware (`_authz.security_middlewares`): size limits
(413/431), authentication when enabled (`_admin_auth.py`: 401 without valid credentials),
odd names in the path (412), and authorization by Pulsar's rules when enabled. The permission
endpoints are `_permissions.py`'s. `start_admin` can serve HTTPS
too, on `https_port` with the broker's TLS context.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .._names import advertised_url_for
from ..security._auth import AuthenticationService
from ..topics._service import BrokerService
from ._admin_auth import Middleware
from ._admin_brokers import add_broker_routes
from ._admin_compaction import add_compaction_routes
from ._admin_messages import add_message_routes
from ._admin_namespaces import add_namespace_routes
from ._admin_schemas import add_schema_routes
from ._admin_subscriptions import add_subscription_routes
from ._admin_topic_policies import add_topic_policy_routes
from ._admin_topics import add_topic_routes, aggregate_partitioned_stats
from ._authz import BODY_BYTES_MAX, PARSER_FIELD_BYTES_MAX, security_middlewares
from ._lookup_http import LookupUrls, lookup_routes
from ._metrics import encode_metrics
from ._permissions import add_permission_routes
from ._rest import CONSUMER_METRICS, LOOKUP_URLS, SERVICE, RestError, _errors, _service

__all__ = ["AdminServer", "RestError", "admin_app", "aggregate_partitioned_stats",
           "start_admin"]

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 5.0  # close() waits this long at most for requests in flight


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


# -- metrics --------------------------------------------------------------------------------


async def metrics(request: web.Request) -> web.Response:
    body, content_type = encode_metrics(_service(request), request.headers.get("Accept", ""),
                                        consumer_level=request.app[CONSUMER_METRICS])
    return web.Response(body=body, headers={"Content-Type": content_type})


# -- the application ------------------------------------------------------------------------


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
    add_broker_routes(r)
    add_namespace_routes(r)
    add_topic_routes(r)
    add_compaction_routes(r)
    add_topic_policy_routes(r)
    add_message_routes(r)
    add_subscription_routes(r)
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
