"""The admin API's guards: request size limits, odd names in the path, and authorization by
Pulsar's rules, as aiohttp middlewares kept apart from the route handlers.

Theory of operation
-------------------
`security_middlewares` gives the middlewares `admin_app` runs before its error middleware,
in this order:

1. `_limits`: a request whose headers hold more than `HEADER_BYTES_MAX` bytes is answered
   431, one that announces a body over `BODY_BYTES_MAX` 413, before anything reads it (the
   HTTP parser itself is given room above these, `PARSER_FIELD_BYTES_MAX`, so the answer is
   ours; beyond that aiohttp answers 400);
2. authentication (`_admin_auth.py`), when enabled;
3. `_names`: every name the route took from the path (tenant, namespace, topic,
   subscription, cluster, role) must hold no control character, not be "." or "..", hold no
   "/" (an encoded slash) and be at most `PATH_NAME_CHARS_MAX` characters; otherwise 412
   naming the part, before any handler reaches the metadata store;
4. `_authorize`, when authorization is enabled: the request's route (its method and path
   pattern) is looked up in `RULES`, the first matching rule says what the role needs, and
   a refusal is answered as Pulsar answers it -- 401 "This operation requires super-user
   access", 401 "Don't have permission to administrate resources on this tenant", 401
   "Unauthorized to validateTopicOperation for operation [OP] on topic [T]", 403
   "Unauthorized to validateNamespaceOperation for operation [OP] on namespace [N]" (or
   validateNamespacePolicyOperation for policies) -- and logged with the role, the operation
   and the resource. A route no rule names needs a tenant admin when its path names a
   tenant, a superuser otherwise: a new route is never open by accident.

Unauthenticated requests never get here: authentication answers 401 with
`WWW-Authenticate` first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from .._errors import AuthorizationError, BrokerError
from .._names import TopicName
from ..security._auth import AuthenticationService
from ..security._authz import AuthorizationService
from ..topics._service import BrokerService
from ._admin_auth import auth_middleware, request_role

__all__ = [
    "BODY_BYTES_MAX",
    "DEFAULT",
    "HEADER_BYTES_MAX",
    "PARSER_FIELD_BYTES_MAX",
    "PATH_NAME_CHARS_MAX",
    "RULES",
    "Rule",
    "rule_for",
    "security_middlewares",
]

log = logging.getLogger(__name__)

HEADER_BYTES_MAX: Final = 16 * 1024  # all header names and values of one request
BODY_BYTES_MAX: Final = 1024 * 1024  # aiohttp's client_max_size for the admin API
PARSER_FIELD_BYTES_MAX: Final = 64 * 1024  # aiohttp's own limit per line/field, above ours
PATH_NAME_CHARS_MAX: Final = 1024  # one name in the path (topics are bounded tighter later)
_PATH_NAMES: Final = ("tenant", "namespace", "topic", "subscription", "cluster", "role")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SUPERUSER: Final = "superuser"
TENANT_ADMIN: Final = "tenant-admin"
AUTHENTICATED: Final = "authenticated"
NAMESPACE: Final = "namespace"  # a namespace operation: tenant admin, or GET_TOPICS by grant
POLICY: Final = "policy"  # a namespace policy operation: tenant admin
TOPIC: Final = "topic"  # a topic operation, by `need`
DEFAULT: Final = "DEFAULT"  # the operation of a route no rule names


@dataclass(frozen=True)
class Rule:
    """What a route needs.

    Attributes:
        kind: SUPERUSER, TENANT_ADMIN, AUTHENTICATED, NAMESPACE, POLICY or TOPIC.
        operation: Pulsar's operation name, for the refusal's text.
        need: for TOPIC and NAMESPACE: "lookup", "consume" (with the path's subscription, if
            any), "list" (a namespace produce/consume grant) or "admin" (tenant admin only).
    """

    kind: str
    operation: str = ""
    need: str = "admin"


_NS = r"^/admin/v2/namespaces/\{tenant\}/\{namespace\}"
_DOMAIN = r"^/admin/v2/\{domain\}/\{tenant\}/\{namespace\}"  # canonical: no {name:regex}
_TOPIC = _DOMAIN + r"/\{topic\}"
_SUB = _TOPIC + r"/subscription/\{subscription\}"
_SCHEMAS = r"^/admin/v2/schemas/\{tenant\}/\{namespace\}/\{topic\}"

# (methods, "" = any; the route's canonical path pattern; the rule), first match wins.
RULES: Final[tuple[tuple[str, str, Rule], ...]] = (
    ("", r"^/metrics/?$", Rule(AUTHENTICATED)),
    ("GET", r"^/status\.html$", Rule(AUTHENTICATED)),  # open, as Pulsar's VipStatus
    ("GET", r"^/admin/v2/clusters$", Rule(AUTHENTICATED)),
    ("", r"^/admin/v2/clusters", Rule(SUPERUSER)),
    ("", r"^/admin/v2/brokers", Rule(SUPERUSER)),
    ("GET", r"^/admin/v2/tenants/\{tenant\}$", Rule(TENANT_ADMIN)),
    ("", r"^/admin/v2/tenants", Rule(SUPERUSER)),
    ("", r"^/admin/v2/namespaces/\{tenant\}$", Rule(TENANT_ADMIN)),
    ("GET", _NS + r"/topics$", Rule(NAMESPACE, "GET_TOPICS", "list")),
    ("GET", _NS + r"/permissions", Rule(NAMESPACE, "GET_PERMISSION")),
    ("POST", _NS + r"/permissions", Rule(NAMESPACE, "GRANT_PERMISSION")),
    ("DELETE", _NS + r"/permissions", Rule(NAMESPACE, "REVOKE_PERMISSION")),
    ("PUT", _NS + r"$", Rule(TENANT_ADMIN)),
    ("DELETE", _NS + r"$", Rule(TENANT_ADMIN)),
    ("GET", _NS + r"($|/)", Rule(POLICY, "READ")),
    ("", _NS + r"/", Rule(POLICY, "WRITE")),
    ("GET", _DOMAIN + r"(/partitioned)?$", Rule(NAMESPACE, "GET_TOPICS", "list")),
    ("PUT", _TOPIC + r"(/partitions)?$", Rule(NAMESPACE, "CREATE_TOPIC")),
    ("DELETE", _TOPIC + r"(/partitions)?$", Rule(NAMESPACE, "DELETE_TOPIC")),
    ("GET", _TOPIC + r"/partitions$", Rule(TOPIC, "GET_METADATA", "lookup")),
    ("POST", _TOPIC + r"/partitions$", Rule(TOPIC, "UPDATE_METADATA")),
    ("", _TOPIC + r"/permissions", Rule(TENANT_ADMIN)),
    # Topic-level policies: Pulsar's validateTopicPolicyOperation, a tenant admin's business.
    ("", _TOPIC + r"/(backlogQuotaMap|backlogQuota|retention|messageTTL|deduplicationEnabled|"
         r"delayedDelivery|maxProducers|maxConsumers|maxUnackedMessagesOnConsumer|"
         r"maxUnackedMessagesOnSubscription|maxConsumersPerSubscription|"
         r"subscriptionTypesEnabled|compactionThreshold)$", Rule(TENANT_ADMIN)),
    # Message inspection: TopicOperation.PEEK_MESSAGES, which a consume grant allows.
    ("GET", _SUB + r"/position/", Rule(TOPIC, "PEEK_MESSAGES", "consume")),
    ("GET", _TOPIC + r"/(examinemessage|ledger/\{ledger\}/entry/\{entry\}|lastMessageId)$",
     Rule(TOPIC, "PEEK_MESSAGES", "consume")),
    ("", _TOPIC + r"/terminate", Rule(TOPIC, "TERMINATE")),
    # Pulsar's TopicOperation.COMPACT: no produce/consume grant allows it.
    ("", _TOPIC + r"/compaction$", Rule(TOPIC, "COMPACT")),
    ("", _TOPIC + r"/unload$", Rule(TOPIC, "UNLOAD")),
    ("GET", _TOPIC + r"/(stats|internalStats|partitioned-stats|partitioned-internalStats)$",
     Rule(TOPIC, "GET_STATS", "lookup")),
    ("GET", _TOPIC + r"/subscriptions$", Rule(TOPIC, "GET_SUBSCRIPTIONS", "consume")),
    ("POST", _TOPIC + r"/all_subscription/expireMessages/",
     Rule(TOPIC, "EXPIRE_MESSAGES", "consume")),
    ("PUT", _SUB + r"$", Rule(TOPIC, "SUBSCRIBE", "consume")),
    ("DELETE", _SUB + r"$", Rule(TOPIC, "UNSUBSCRIBE", "consume")),
    ("POST", _SUB + r"/skip", Rule(TOPIC, "SKIP", "consume")),
    ("POST", _SUB + r"/expireMessages/", Rule(TOPIC, "EXPIRE_MESSAGES", "consume")),
    ("POST", _SUB + r"/resetcursor", Rule(TOPIC, "RESET_CURSOR", "consume")),
    ("GET", _SCHEMAS + r"/", Rule(TOPIC, "GET_SCHEMA", "lookup")),
    ("POST", _SCHEMAS + r"/schema$", Rule(TOPIC, "UPLOAD_SCHEMA")),
    ("DELETE", _SCHEMAS + r"/schema$", Rule(TOPIC, "DELETE_SCHEMA")),
    ("POST", _SCHEMAS + r"/compatibility$", Rule(TOPIC, "TEST_SCHEMA_COMPATIBILITY")),
    ("GET", r"^/lookup/v2/topic/", Rule(TOPIC, "LOOKUP", "lookup")),
)
_COMPILED: Final = tuple((method, re.compile(pattern), rule) for method, pattern, rule in RULES)


def rule_for(method: str, pattern: str, path_names: dict[str, str]) -> Rule:
    """The rule of the route `method pattern` (see the module comment for the default)."""
    if method == "HEAD":
        method = "GET"  # aiohttp answers HEAD with the GET route
    for methods, regex, rule in _COMPILED:
        if (not methods or method == methods) and regex.search(pattern):
            return rule
    return Rule(TENANT_ADMIN, DEFAULT) if "tenant" in path_names else Rule(SUPERUSER, DEFAULT)


def _reason(status: int, reason: str) -> web.Response:
    return web.json_response({"reason": reason}, status=status)


@web.middleware
async def _limits(request: web.Request, handler: Handler) -> web.StreamResponse:
    header_bytes = sum(len(name) + len(value) for name, value in request.raw_headers)
    if header_bytes > HEADER_BYTES_MAX:
        log.info("admin request %s %s from %s refused: %d bytes of headers (at most %d)",
                 request.method, request.path[:200], request.remote, header_bytes,
                 HEADER_BYTES_MAX)
        return _reason(431, f"Request headers too large: {header_bytes} bytes, at most "
                            f"{HEADER_BYTES_MAX}")
    length = request.content_length
    if length is not None and length > BODY_BYTES_MAX:
        log.info("admin request %s %s from %s refused: a body of %d bytes (at most %d)",
                 request.method, request.path[:200], request.remote, length, BODY_BYTES_MAX)
        return _reason(413, f"Request body too large: {length} bytes, at most "
                            f"{BODY_BYTES_MAX}")
    return await handler(request)


def _odd_name(part: str, value: str) -> str | None:
    """Why `value` may not be the path's `part`, or None."""
    if _CONTROL.search(value):
        return "control characters are not allowed"
    if value in (".", ".."):
        return f"{value!r} is not a name"
    if "/" in value:
        return "'/' (an encoded slash) is not allowed"
    if len(value) > PATH_NAME_CHARS_MAX:
        return f"longer than {PATH_NAME_CHARS_MAX} characters"
    return None


@web.middleware
async def _names(request: web.Request, handler: Handler) -> web.StreamResponse:
    for part in _PATH_NAMES:
        value = request.match_info.get(part)
        if value is None:
            continue
        why = _odd_name(part, value)
        if why is not None:
            log.info("admin request %s from %s refused: invalid %s name (%s)", request.method,
                     request.remote, part, why)
            return _reason(412, f"Invalid {part} name: {why}")
    return await handler(request)


def _topic_of(request: web.Request) -> TopicName:
    info = request.match_info
    domain = info.get("domain", "persistent")
    return TopicName.parse(f"{domain}://{info['tenant']}/{info['namespace']}/{info['topic']}")


def _decide(authz: AuthorizationService, rule: Rule, request: web.Request,
            role: str | None) -> tuple[int, str] | None:
    """None when allowed, else (status, reason)."""
    info = request.match_info
    tenant = info.get("tenant", "")
    if rule.kind == AUTHENTICATED or authz.is_superuser(role):
        return None
    if rule.kind == SUPERUSER:
        return 401, "This operation requires super-user access"
    if rule.kind == TENANT_ADMIN:
        if authz.is_tenant_admin(tenant, role):
            return None
        return 401, "Don't have permission to administrate resources on this tenant"
    if rule.kind in (NAMESPACE, POLICY):
        namespace = f"{tenant}/{info.get('namespace', '')}"
        if rule.need == "list" and authz.can_list_topics(namespace, role):
            return None
        if authz.is_tenant_admin(tenant, role):
            return None
        check = "validateNamespaceOperation" if rule.kind == NAMESPACE \
            else "validateNamespacePolicyOperation"
        return 403, (f"Unauthorized to {check} for operation [{rule.operation}] on namespace "
                     f"[{namespace}]")
    assert rule.kind == TOPIC, rule
    topic = _topic_of(request)
    if rule.need == "lookup":
        allowed = authz.can_lookup(topic, role)
    elif rule.need == "consume":
        allowed = authz.can_consume(topic, role, info.get("subscription"))
    else:
        allowed = authz.is_tenant_admin(topic.tenant, role)
    if allowed:
        return None
    return 401, (f"Unauthorized to validateTopicOperation for operation [{rule.operation}] on "
                 f"topic [{topic}]")


def _authorize(authz: AuthorizationService) -> Middleware:
    @web.middleware
    async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route
        if request.match_info.http_exception is not None or route.resource is None:
            return await handler(request)  # no route: the router's 404 or 405
        rule = rule_for(request.method, route.resource.canonical, dict(request.match_info))
        role = request_role(request)
        try:
            refusal = _decide(authz, rule, request, role)
        except AuthorizationError as error:
            refusal = 401, str(error)
        except BrokerError as error:  # a name that does not parse: the handler's 412
            return _reason(412, str(error))
        if refusal is None:
            return await handler(request)
        status, reason = refusal
        log.info("admin request %s %s refused to role %r (%s %s): %s", request.method,
                 request.path[:200], role, rule.kind, rule.operation, reason)
        return _reason(status, reason)

    return authorize


def security_middlewares(service: BrokerService,
                         auth: AuthenticationService | None) -> list[Middleware]:
    """The guards of the admin API, in their order (see the module comment)."""
    config = service.config
    middlewares: list[Middleware] = [_limits]
    if auth is not None:
        middlewares.append(auth_middleware(auth, config.authenticate_metrics_endpoint,
                                           config.http_auth_failures_per_connection_max))
    middlewares.append(_names)
    if config.authorization_enabled:
        middlewares.append(_authorize(AuthorizationService(service.namespaces,
                                                           config.superuser_roles)))
    return middlewares
