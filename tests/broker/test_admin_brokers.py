"""The broker endpoints of the admin REST API: the health check's real round trip through
the heartbeat namespace's health-check topic, readiness, `/status.html`, the (empty) dynamic
configuration, and a tenant's namespaces."""

from __future__ import annotations

from pathlib import Path

from magnetar.broker import PersistentTopic
from magnetar.broker.http._admin_brokers import health_check_topic

from .helpers import admin_env
from .test_admin import expect


async def test_health_check_publishes_and_reads_back(tmp_path: Path) -> None:
    async with admin_env(tmp_path, broker_deduplication_enabled=True) as (env, server, client):
        service = env.service
        answer = await client.call("GET", "/admin/v2/brokers/health")
        assert (answer.status, answer.body) == (200, "ok")
        name = health_check_topic(service, f"127.0.0.1:{server.port}")
        assert str(name) == f"persistent://pulsar/127.0.0.1:{server.port}/healthcheck"
        topic = service.topics[str(name)]
        assert isinstance(topic, PersistentTopic)
        assert topic.managed_ledger.number_of_entries == 1
        assert not topic.producers  # the check's producer is gone
        # Every check writes (deduplication is off on the topic, whatever the broker says).
        await expect(client, "GET", "/admin/v2/brokers/health", 200)
        assert topic.managed_ledger.number_of_entries == 2
        assert topic.dedup is None
        assert "pulsar" in await expect(client, "GET", "/admin/v2/tenants", 200)


async def test_health_check_fails_when_the_topic_refuses_the_publish(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, server, client):
        await expect(client, "GET", "/admin/v2/brokers/health", 200)
        name = health_check_topic(env.service, f"127.0.0.1:{server.port}")
        await env.service.terminate_topic(name)
        assert "terminated" in await expect(client, "GET", "/admin/v2/brokers/health", 500)


async def test_ready_status_and_configuration(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        answer = await client.call("GET", "/admin/v2/brokers/ready")
        assert (answer.status, answer.body) == (200, "ok")
        answer = await client.call("GET", "/status.html")
        assert (answer.status, answer.body) == (200, "OK")
        assert await expect(client, "GET", "/admin/v2/brokers/configuration", 200) == []
        assert await expect(client, "GET", "/admin/v2/brokers/configuration/values", 200) == {}
        assert "non-dynamic" in await expect(
            client, "POST", "/admin/v2/brokers/configuration/maxProducersPerTopic/3", 412)
        await expect(client, "DELETE", "/admin/v2/brokers/configuration/x", 412)
        env.service.stopping = True  # what the server's shutdown sets first
        await expect(client, "GET", "/admin/v2/brokers/ready", 500)
        await expect(client, "GET", "/status.html", 503)


async def test_a_tenants_namespaces(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (_, _, client):
        assert await expect(client, "GET", "/admin/v2/tenants/public/namespaces", 200) == [
            "public/default"]
        await expect(client, "GET", "/admin/v2/tenants/nobody/namespaces", 404)
        await expect(client, "PUT", "/admin/v2/clusters/standalone", 409,
                     {"serviceUrl": "http://127.0.0.1:1"})
