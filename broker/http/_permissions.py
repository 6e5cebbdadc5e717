"""The admin API's permission endpoints (Pulsar's REST v2 paths).

Theory of operation
-------------------
`add_permission_routes` registers, on the admin application's router:

* `GET  /admin/v2/namespaces/{tenant}/{namespace}/permissions`: role -> actions;
* `POST .../permissions/{role}` with a JSON list of actions (produce, consume, functions,
  sources, sinks, packages): the role's actions become those; `DELETE` revokes them;
* `GET  .../permissions/subscription`: subscription -> roles allowed on it;
  `POST .../permissions/subscription/{subscription}` with a JSON list of roles; `DELETE
  .../permissions/{subscription}/{role}` removes one role;
* `GET|POST|DELETE .../subscriptionAuthMode` ("None" or "Prefix");
* `GET  /admin/v2/{persistent|non-persistent}/{tenant}/{namespace}/{topic}/permissions`
  (namespace grants merged with the topic's), `POST|DELETE .../permissions/{role}`.

Each handler works through a `security._authz.AuthorizationService` over the service's
`NamespaceRegistry`, so grants are stored durably with the namespace whether or not
authorization is enforced (Pulsar lets grants be made with authorizationEnabled=false). Who
may call them is `_authz.py`'s business (tenant admins and superusers). Answers: 204 on a
change, 200 with JSON on a read, 404 a missing namespace, 400 a malformed body, 412 an unknown
action or mode, or a revoke of what is not granted.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from .._errors import InvalidTopicNameError, MetadataError, NotAllowedError
from .._names import NamespaceName, TopicName
from ..security._authz import SUBSCRIPTION_AUTH_MODES, AuthorizationService
from ..topics._service import BrokerService

__all__ = ["add_permission_routes"]

_NS: Final = "/admin/v2/namespaces/{tenant}/{namespace}"
_TOPIC: Final = "/admin/v2/{domain:persistent|non-persistent}/{tenant}/{namespace}/{topic}"
ROLE_CHARS_MAX: Final = 256  # a role named in a grant

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Refused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _guarded(work: Callable[[web.Request, AuthorizationService], Awaitable[Any]],
             service: BrokerService) -> Handler:
    """A handler running `work`; its value is the JSON answer (None: 204)."""
    authz = AuthorizationService(service.namespaces, service.config.superuser_roles)

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            value = await work(request, authz)
        except _Refused as refused:
            return web.json_response({"reason": refused.reason}, status=refused.status)
        except MetadataError:
            return web.json_response({"reason": "Namespace does not exist"}, status=404)
        except (NotAllowedError, InvalidTopicNameError) as error:
            return web.json_response({"reason": str(error)}, status=412)
        if value is None:
            return web.Response(status=204)
        return web.json_response(value)

    return handler


def _namespace(request: web.Request) -> str:
    text = f"{request.match_info['tenant']}/{request.match_info['namespace']}"
    try:
        NamespaceName.parse(text)
    except InvalidTopicNameError:
        raise _Refused(412, "Namespace name is not valid") from None
    return text


def _topic(request: web.Request) -> TopicName:
    info = request.match_info
    namespace = _namespace(request)
    return TopicName.parse(f"{info['domain']}://{namespace}/{info['topic']}")


def _role(request: web.Request, key: str = "role") -> str:
    role = request.match_info[key]
    if not role or len(role) > ROLE_CHARS_MAX:
        raise _Refused(412, f"Invalid {key}: 1 to {ROLE_CHARS_MAX} characters")
    return role


async def _json_list(request: web.Request, what: str) -> list[str]:
    text = await request.text()
    try:
        body = json.loads(text) if text.strip() else None
    except ValueError as error:
        raise _Refused(400, f"Invalid JSON body: {error}") from None
    if not isinstance(body, list) or not all(isinstance(item, str) for item in body):
        raise _Refused(400, f"The body must be a JSON list of {what}")
    return body


# -- namespaces -----------------------------------------------------------------------------


async def _ns_permissions(request: web.Request, authz: AuthorizationService) -> Any:
    return authz.namespace_permissions(_namespace(request))


async def _ns_grant(request: web.Request, authz: AuthorizationService) -> Any:
    namespace, role = _namespace(request), _role(request)
    authz.grant_namespace(namespace, role, await _json_list(request, "actions"))


async def _ns_revoke(request: web.Request, authz: AuthorizationService) -> Any:
    authz.revoke_namespace(_namespace(request), _role(request))


async def _sub_permissions(request: web.Request, authz: AuthorizationService) -> Any:
    return authz.subscription_permissions(_namespace(request))


async def _sub_grant(request: web.Request, authz: AuthorizationService) -> Any:
    namespace, subscription = _namespace(request), _role(request, "subscription")
    roles = await _json_list(request, "roles")
    if any(not role or len(role) > ROLE_CHARS_MAX for role in roles):
        raise _Refused(412, f"Invalid role: 1 to {ROLE_CHARS_MAX} characters")
    authz.grant_subscription(namespace, subscription, roles)


async def _sub_revoke(request: web.Request, authz: AuthorizationService) -> Any:
    authz.revoke_subscription(_namespace(request), _role(request, "subscription"),
                              _role(request))


async def _get_auth_mode(request: web.Request, authz: AuthorizationService) -> Any:
    return authz.registry.policies(_namespace(request)).get("subscription_auth_mode") or "None"


async def _set_auth_mode(request: web.Request, authz: AuthorizationService) -> Any:
    namespace = _namespace(request)
    text = (await request.text()).strip()
    try:
        mode = json.loads(text) if text else "None"
    except ValueError:
        mode = text  # Pulsar's admin client sends the bare name too
    if mode not in SUBSCRIPTION_AUTH_MODES:
        raise _Refused(412, f"subscriptionAuthMode must be one of "
                            f"{', '.join(SUBSCRIPTION_AUTH_MODES)}")
    authz.registry.set_policy(namespace, "subscription_auth_mode", mode)


async def _remove_auth_mode(request: web.Request, authz: AuthorizationService) -> Any:
    authz.registry.set_policy(_namespace(request), "subscription_auth_mode", None)


# -- topics ---------------------------------------------------------------------------------


async def _topic_permissions(request: web.Request, authz: AuthorizationService) -> Any:
    return authz.topic_permissions(_topic(request))


async def _topic_grant(request: web.Request, authz: AuthorizationService) -> Any:
    topic, role = _topic(request), _role(request)
    authz.grant_topic(topic, role, await _json_list(request, "actions"))


async def _topic_revoke(request: web.Request, authz: AuthorizationService) -> Any:
    authz.revoke_topic(_topic(request), _role(request))


def add_permission_routes(router: web.UrlDispatcher, service: BrokerService) -> None:
    """Register the permission endpoints (see the module comment)."""
    routes: list[tuple[str, str, Callable[[web.Request, AuthorizationService],
                                          Awaitable[Any]]]] = [
        ("GET", _NS + "/permissions", _ns_permissions),
        ("GET", _NS + "/permissions/subscription", _sub_permissions),
        ("POST", _NS + "/permissions/subscription/{subscription}", _sub_grant),
        ("DELETE", _NS + "/permissions/{subscription}/{role}", _sub_revoke),
        ("POST", _NS + "/permissions/{role}", _ns_grant),
        ("DELETE", _NS + "/permissions/{role}", _ns_revoke),
        ("GET", _NS + "/subscriptionAuthMode", _get_auth_mode),
        ("POST", _NS + "/subscriptionAuthMode", _set_auth_mode),
        ("DELETE", _NS + "/subscriptionAuthMode", _remove_auth_mode),
        ("GET", _TOPIC + "/permissions", _topic_permissions),
        ("POST", _TOPIC + "/permissions/{role}", _topic_grant),
        ("DELETE", _TOPIC + "/permissions/{role}", _topic_revoke),
    ]
    for method, path, work in routes:
        router.add_route(method, path, _guarded(work, service))
