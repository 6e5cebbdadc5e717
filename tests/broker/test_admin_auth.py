"""The admin API with authentication, in process: 401 with a reason without a valid bearer
token, 200 with one; /metrics open or authenticated by the setting."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from magnetar.broker import AuthenticationService
from magnetar.broker.http._admin import start_admin
from magnetar.broker.security._jwt import encode_token
from magnetar.broker.security._token import TokenAuthenticationProvider

from .helpers import broker_env

SECRET = b"admin-auth-test-secret-key-32byt"


async def _get(session: aiohttp.ClientSession, url: str,
               token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.get(url, headers=headers) as answer:
        return answer.status, await answer.text()


@pytest.mark.parametrize("authenticate_metrics", [False, True])
async def test_admin_requests_need_a_bearer_token(tmp_path: Path,
                                                  authenticate_metrics: bool) -> None:
    auth = AuthenticationService([TokenAuthenticationProvider(SECRET)])
    good = encode_token({"sub": "ops"}, SECRET)
    async with broker_env(tmp_path, authenticate_metrics_endpoint=authenticate_metrics,
                          ) as env:
        server = await start_admin(env.service, "127.0.0.1", 0, auth=auth)
        try:
            async with aiohttp.ClientSession() as session:
                tenants = f"{server.url}/admin/v2/tenants"
                status, body = await _get(session, tenants)
                assert status == 401
                assert "Authentication required" in body
                status, body = await _get(session, tenants, "x.y.z")
                assert status == 401
                assert "not base64url" in body or "not JSON" in body
                assert await _get(session, tenants, good) == (200, '["public"]')
                metrics = f"{server.url}/metrics"
                status, _ = await _get(session, metrics)
                assert status == (401 if authenticate_metrics else 200)
                assert (await _get(session, metrics, good))[0] == 200
                # a load balancer's probe needs no credentials, as Pulsar's VipStatus
                assert await _get(session, f"{server.url}/status.html") == (200, "OK")
        finally:
            await server.close()
