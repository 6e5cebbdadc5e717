"""Authentication of admin HTTP requests: an aiohttp middleware in front of the admin API.

Theory of operation
-------------------
With authentication enabled, every admin request must prove a role the broker's
`AuthenticationService` accepts: `Authorization: Bearer <token>`, `Authorization: Basic
<base64 user:password>`, a verified client certificate on the HTTPS port (method "tls"), or,
when an anonymous role is configured, nothing at all. Otherwise the answer is 401 with
Pulsar's `{"reason": "..."}` body and a `WWW-Authenticate` header, and the handler never
runs. The accepted principal is kept on the request (`request_role`) for the authorization
middleware (`_authz.py`). `/metrics` is exempt unless `authenticate_metrics_endpoint` is set
(Pulsar's broker default is not to authenticate it).

Each refusal is logged with the method and the reason, never the credential. Failures are
counted per connection (its peer address and port, `FAILING_CONNECTIONS_MAX` connections
remembered): after `http_auth_failures_per_connection_max` of them the connection is answered
429 and closed, so one client guessing passwords over a kept-alive connection is cut off while
every other connection goes on.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from .._errors import AuthenticationError
from ..security._auth import AuthenticationService
from ..security._basic import peer_common_name

__all__ = ["FAILING_CONNECTIONS_MAX", "METRICS_PATHS", "Middleware", "auth_middleware",
           "request_role"]

log = logging.getLogger(__name__)

METRICS_PATHS: Final = frozenset({"/metrics", "/metrics/"})
OPEN_PATHS: Final = frozenset({"/status.html"})  # a load balancer's probe: never authenticated
FAILING_CONNECTIONS_MAX: Final = 4096  # connections whose failures are counted at once
# The request's accepted role (absent: no authentication).
ROLE_KEY: Final = web.RequestKey("role", str)
AUTH_METHOD_HEADER: Final = "X-Pulsar-Auth-Method-Name"  # Pulsar's admin client may send it

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def request_role(request: web.Request) -> str | None:
    """The role the authentication middleware accepted (None: authentication is off)."""
    return request.get(ROLE_KEY)


def _connection_key(request: web.Request) -> Any:
    transport = request.transport
    return None if transport is None else transport.get_extra_info("peername")


def auth_middleware(auth: AuthenticationService, authenticate_metrics: bool,
                    failures_per_connection_max: int = 5) -> Middleware:
    """The middleware that authenticates requests (see the module comment)."""
    failures: OrderedDict[Any, int] = OrderedDict()

    def failed(request: web.Request) -> int:
        key = _connection_key(request)
        count = failures.pop(key, 0) + 1
        failures[key] = count
        while len(failures) > FAILING_CONNECTIONS_MAX:
            failures.popitem(last=False)
        return count

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or (request.path in METRICS_PATHS
                                          and not authenticate_metrics):
            return await handler(request)
        transport = request.transport
        common_name = peer_common_name(
            None if transport is None else transport.get_extra_info("peercert"))
        method = request.headers.get(AUTH_METHOD_HEADER)
        try:
            principal = await auth.authenticate_http(request.headers.get("Authorization"),
                                                     common_name, method)
        except AuthenticationError as exc:
            count = failed(request)
            log.info("admin request %s %s from %s refused (method %r, failure %d on this "
                     "connection): %s", request.method, request.path[:200], request.remote,
                     (method or "")[:40], count, exc.logged())
            if count > failures_per_connection_max:
                response = web.json_response(
                    {"reason": "Too many authentication failures on this connection"},
                    status=429)
                response.force_close()  # aiohttp closes the connection once it is sent
                return response
            return web.json_response({"reason": f"Authentication required: {exc}"},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        request[ROLE_KEY] = principal.role
        log.debug("admin request %s %s by %r", request.method, request.path, principal.role)
        return await handler(request)

    return authenticate
