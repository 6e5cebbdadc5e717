"""Authentication of admin HTTP requests: an aiohttp middleware in front of the admin API.

Theory of operation
-------------------
With authentication enabled, every admin request must carry `Authorization: Bearer <token>`
that the broker's `AuthenticationService` accepts; otherwise the answer is 401 with Pulsar's
`{"reason": "..."}` body and a `WWW-Authenticate: Bearer` header, and the handler never runs.
`/metrics` is exempt unless `authenticate_metrics_endpoint` is set (Pulsar's broker default
is not to authenticate it). The role of an accepted request is logged at DEBUG; nothing is
authorized by role.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from .._errors import AuthenticationError
from ..security._auth import AuthenticationService

__all__ = ["METRICS_PATHS", "Middleware", "auth_middleware"]

log = logging.getLogger(__name__)

METRICS_PATHS: Final = frozenset({"/metrics", "/metrics/"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(auth: AuthenticationService, authenticate_metrics: bool) -> Middleware:
    """The middleware that authenticates requests (see the module comment)."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in METRICS_PATHS and not authenticate_metrics:
            return await handler(request)
        try:
            principal = auth.authenticate_http(request.headers.get("Authorization"))
        except AuthenticationError as exc:
            log.info("admin request %s %s refused: %s", request.method, request.path, exc)
            return web.json_response({"reason": f"Authentication required: {exc}"},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        log.debug("admin request %s %s by %r", request.method, request.path, principal.role)
        return await handler(request)

    return authenticate
