"""The admin API with authentication (token, basic, anonymous) and authorization on, in
process over real HTTP: each role allowed and refused as Pulsar answers (401/403 and its
texts), the permission endpoints, odd names in the path, size limits and the per-connection
limit on authentication failures."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
from yarl import URL

from magnetar.broker._config import BrokerConfig
from magnetar.broker.http._admin import admin_app, start_admin
from magnetar.broker.http._authz import BODY_BYTES_MAX, DEFAULT, HEADER_BYTES_MAX, rule_for
from magnetar.broker.security._auth import AuthenticationService
from magnetar.broker.security._jwt import encode_token

from .helpers import broker_env

SECRET = b"admin-authz-test-secret-key-32by"
NS = "/admin/v2/namespaces/acme/ns"
TOPIC = "/admin/v2/persistent/acme/ns/t"
SUPERUSER_ONLY = "This operation requires super-user access"
NOT_TENANT_ADMIN = "Don't have permission to administrate resources on this tenant"


def _bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {encode_token({'sub': role}, SECRET)}"}


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


class Api:
    def __init__(self, session: aiohttp.ClientSession, base: str):
        self.session = session
        self.base = base

    async def __call__(self, method: str, path: str, headers: dict[str, str] | None = None,
                       body: Any = None, *, encoded: bool = False) -> tuple[int, Any]:
        url = URL(self.base + path, encoded=True) if encoded else self.base + path
        async with self.session.request(method, url, json=body, headers=headers) as answer:
            try:
                decoded = await answer.json(content_type=None)
            except ValueError:
                decoded = await answer.text()
            return answer.status, decoded


@asynccontextmanager
async def _admin(tmp_path: Path) -> AsyncIterator[Api]:
    key = tmp_path / "secret.key"
    key.write_bytes(SECRET)
    users = tmp_path / "users"
    users.write_text(f"bob:{bcrypt.hashpw(b'pw', bcrypt.gensalt(rounds=4)).decode()}\n")
    config = BrokerConfig(authentication_enabled=True,
                          authentication_providers=("token", "basic"),
                          token_secret_key=str(key), basic_auth_conf=str(users),
                          anonymous_user_role="anon", authorization_enabled=True,
                          superuser_roles=("root",), http_auth_failures_per_connection_max=3)
    auth = AuthenticationService.from_config(config)
    async with broker_env(tmp_path / "data", config) as env:
        server = await start_admin(env.service, "127.0.0.1", 0, auth=auth)
        try:
            async with aiohttp.ClientSession() as session:
                yield Api(session, server.url)
        finally:
            await server.close()


async def test_roles_on_the_admin_api(tmp_path: Path) -> None:
    async with _admin(tmp_path) as api:
        root, admin, app = _bearer("root"), _bearer("acme-admin"), _bearer("app")
        assert await api("GET", "/admin/v2/tenants") == (401, {"reason": SUPERUSER_ONLY})
        tenant = {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}
        assert await api("PUT", "/admin/v2/tenants/acme", admin, tenant) \
            == (401, {"reason": SUPERUSER_ONLY})
        assert (await api("PUT", "/admin/v2/tenants/acme", root, tenant))[0] == 204
        assert await api("GET", "/admin/v2/namespaces/acme", _basic("bob", "pw")) \
            == (401, {"reason": NOT_TENANT_ADMIN})
        assert (await api("PUT", NS, admin))[0] == 204
        assert (await api("PUT", TOPIC, admin))[0] == 204
        assert (await api("POST", NS + "/permissions/app", admin, ["produce"]))[0] == 204
        assert await api("GET", NS + "/permissions", admin) == (200, {"app": ["produce"]})
        # app: a namespace produce grant lists topics and looks them up, nothing more
        status, topics = await api("GET", NS + "/topics", app)
        assert (status, topics) == (200, ["persistent://acme/ns/t"])
        assert (await api("GET", TOPIC + "/stats", app))[0] == 200
        assert await api("GET", TOPIC + "/subscriptions", app) == (401, {
            "reason": "Unauthorized to validateTopicOperation for operation "
                      "[GET_SUBSCRIPTIONS] on topic [persistent://acme/ns/t]"})
        assert await api("POST", NS + "/permissions/app", app, ["consume"]) == (403, {
            "reason": "Unauthorized to validateNamespaceOperation for operation "
                      "[GRANT_PERMISSION] on namespace [acme/ns]"})
        assert (await api("GET", NS + "/retention", app))[0] == 403
        assert (await api("GET", NS + "/retention", _bearer("stranger")))[0] == 403
        assert (await api("DELETE", TOPIC, app))[0] == 403
        # a topic grant and the subscription permissions
        assert (await api("POST", TOPIC + "/permissions/reader", admin, ["consume"]))[0] \
            == 204
        assert await api("GET", TOPIC + "/permissions", admin) == (
            200, {"app": ["produce"], "reader": ["consume"]})
        reader = _bearer("reader")
        assert await api("GET", TOPIC + "/subscriptions", reader) == (200, [])
        assert (await api("POST", NS + "/permissions/subscription/locked", admin,
                          ["someone-else"]))[0] == 204
        assert (await api("PUT", TOPIC + "/subscription/locked", reader))[0] == 401
        assert (await api("PUT", TOPIC + "/subscription/free", reader))[0] == 204
        assert (await api("DELETE", NS + "/permissions/locked/someone-else", admin))[0] \
            == 204
        assert (await api("PUT", TOPIC + "/subscription/locked", reader))[0] == 204
        assert (await api("POST", TOPIC + "/permissions/x", admin, ["fly"]))[0] == 412
        assert (await api("DELETE", TOPIC + "/permissions/reader", admin))[0] == 204
        assert (await api("GET", TOPIC + "/subscriptions", reader))[0] == 401
        # the anonymous role: authenticated, holds nothing until granted
        assert (await api("GET", TOPIC + "/stats"))[0] == 401
        assert (await api("POST", NS + "/permissions/anon", admin, ["consume"]))[0] == 204
        assert (await api("GET", TOPIC + "/stats"))[0] == 200


@pytest.mark.parametrize(("path", "why"), [
    ("/admin/v2/persistent/public/default/a%2Fb/stats", "topic name: '/' (an encoded slash)"),
    ("/admin/v2/namespaces/public/%2E%2E/topics", "namespace name: '..' is not a name"),
    ("/admin/v2/tenants/a%01b", "tenant name: control characters"),
    ("/admin/v2/tenants/" + "t" * 2000, "tenant name: longer than 1024"),
    ("/admin/v2/persistent/public/default/x/subscription/s%00/skip_all",
     "subscription name: control characters"),
])
async def test_odd_names_are_refused_before_any_handler(tmp_path: Path, path: str,
                                                        why: str) -> None:
    async with _admin(tmp_path) as api:
        method = "POST" if path.endswith("skip_all") else "GET"
        status, body = await api(method, path, _bearer("root"), encoded=True)
        assert status == 412, body
        assert why in body["reason"]


async def test_oversized_headers_and_bodies(tmp_path: Path) -> None:
    async with _admin(tmp_path) as api:
        big = {**_bearer("root"), "X-Padding": "p" * (HEADER_BYTES_MAX + 1)}
        status, body = await api("GET", "/admin/v2/tenants", big)
        assert status == 431
        assert "headers too large" in body["reason"]
        payload = io.BytesIO(b'{"adminRoles": ["' + b"x" * BODY_BYTES_MAX + b'"]}')
        async with api.session.put(api.base + "/admin/v2/tenants/big", data=payload,
                                   headers=_bearer("root")) as answer:
            assert answer.status == 413
            assert "body too large" in (await answer.json())["reason"]
        assert (await api("GET", "/admin/v2/tenants", _bearer("root")))[0] == 200


async def test_authentication_failures_are_limited_per_connection(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    async with _admin(tmp_path) as api:
        # naming the method: without it, credentials no provider accepts would be anonymous
        guess = {**_basic("bob", "guess-hunter2"), "X-Pulsar-Auth-Method-Name": "basic"}
        one = aiohttp.TCPConnector(limit=1)  # every request on one kept-alive connection
        async with aiohttp.ClientSession(connector=one) as session:
            guesser = Api(session, api.base)
            statuses = [(await guesser("GET", "/admin/v2/tenants", guess))[0]
                        for _ in range(4)]
        assert statuses == [401, 401, 401, 429]
        assert (await api("GET", "/admin/v2/tenants", _bearer("root")))[0] == 200
        assert (await api("GET", "/admin/v2/tenants", guess))[0] == 401  # a new connection
    assert "wrong password for 'bob'" in caplog.text
    assert "hunter2" not in caplog.text


async def test_every_admin_route_has_a_rule(tmp_path: Path) -> None:
    """A route added without a rule still needs a tenant admin or a superuser (the default);
    this names it so that it gets the rule Pulsar gives it."""
    async with broker_env(tmp_path) as env:
        app = admin_app(env.service)
        unclassified = []
        for route in app.router.routes():
            info = route.get_info()
            pattern = info.get("formatter") or info.get("path") or ""
            names = dict.fromkeys(re.findall(r"\{(\w+)", pattern), "x")
            if rule_for(route.method, pattern, names).operation == DEFAULT:
                unclassified.append(f"{route.method} {pattern}")
        assert unclassified == []
        topic = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}"
        assert rule_for("GET", topic + "/stats", {}).need == "lookup"
        assert rule_for("PUT", topic + "/subscription/{subscription}", {}).need == "consume"


async def test_authorization_is_off_by_default(tmp_path: Path) -> None:
    """As Pulsar's authorizationEnabled=false: authentication alone, any role may do anything
    (a request without credentials is still refused)."""
    assert BrokerConfig().authorization_enabled is False
    key = tmp_path / "secret.key"
    key.write_bytes(SECRET)
    config = BrokerConfig(authentication_enabled=True, authentication_providers=("token",),
                          token_secret_key=str(key))
    async with broker_env(tmp_path / "data", config) as env:
        server = await start_admin(env.service, "127.0.0.1", 0,
                                   auth=AuthenticationService.from_config(config))
        try:
            async with aiohttp.ClientSession() as session:
                api = Api(session, server.url)
                stranger = _bearer("stranger")
                assert (await api("PUT", "/admin/v2/tenants/acme", stranger,
                                  {"allowedClusters": ["standalone"]}))[0] == 204
                assert (await api("PUT", NS, stranger))[0] == 204
                assert await api("GET", "/admin/v2/namespaces/acme", stranger) == (200, ["acme/ns"])
                assert (await api("GET", "/admin/v2/tenants"))[0] == 401
        finally:
            await server.close()
