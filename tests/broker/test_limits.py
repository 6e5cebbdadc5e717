"""Names and requests without limits, against a real storage and service: a subscription whose
cursor cannot be stored leaves no cursor behind (unload works after it), the admin API and the
HTTP lookup refuse over-long names with a 4xx and create nothing, and a malformed HTTP request
is one WARNING line, never aiohttp's ERROR traceback."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from magnetar.broker import BrokerConfig, PersistentTopic, ProducerSpec
from magnetar.broker._names import (
    NAMED_ENTITY_CHARS_MAX,
    SUBSCRIPTION_NAME_BYTES_MAX,
    TopicName,
)

from .helpers import admin_env, broker_env

LONG_LOCAL = "x" * 600  # well over the topic limit, as the issue's ~480 characters
LONG_SUB = "s" * 600
PT = "/admin/v2/persistent/public/default"


async def test_a_subscription_that_cannot_be_stored_leaves_no_cursor(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        name = TopicName.parse("persistent://public/default/zombie")
        topic = await env.service.get_topic(name, create=True)
        assert isinstance(topic, PersistentTopic)
        # Past the handler's name check: the store itself refuses the cursor's key.
        with pytest.raises(ValueError, match="metadata keys"):
            await topic.create_subscription(LONG_SUB)
        assert LONG_SUB not in topic.managed_ledger.cursors
        assert LONG_SUB not in topic.subscriptions
        assert await env.service.unload_topic(name)  # no zombie cursor to flush
        topic = await env.service.get_topic(name, create=True)
        assert isinstance(topic, PersistentTopic)
        await topic.create_subscription("fine")
        assert list(topic.managed_ledger.cursors) == ["fine"]


async def test_admin_and_http_lookup_refuse_over_long_names(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        for method, path in [
            ("PUT", f"{PT}/{LONG_LOCAL}"),
            ("PUT", f"{PT}/{LONG_LOCAL}/partitions"),
            ("GET", f"{PT}/{LONG_LOCAL}/stats"),
            ("PUT", f"{PT}/{LONG_LOCAL}/subscription/sub"),
            ("GET", f"/lookup/v2/topic/persistent/public/default/{LONG_LOCAL}"),
            ("GET", f"{PT}/{LONG_LOCAL}/partitions?checkAllowAutoCreation=true"),
        ]:
            body = 1 if path.endswith("/partitions") and method == "PUT" else None
            answer = await client.call(method, path, body)
            assert answer.status == 412, (method, path[:80], answer.status)
            assert "too long" in answer.body["reason"]
        answer = await client.call("PUT", f"{PT}/short/subscription/{LONG_SUB}")
        assert answer.status == 412, answer.body
        assert "too long" in answer.body["reason"]
        tenant = "t" * (NAMED_ENTITY_CHARS_MAX + 1)
        answer = await client.call("PUT", f"/admin/v2/tenants/{tenant}", {})
        assert answer.status == 412
        answer = await client.call("PUT", f"/admin/v2/namespaces/public/{tenant}")
        assert answer.status == 412
        assert env.service.list_topics("public/default", "ALL") == []  # nothing created
        assert env.service.topics == {}
        assert not env.service.namespaces.tenant_exists(tenant)
        # the longest subscription name still works
        answer = await client.call("PUT", f"{PT}/short/subscription/"
                                   + "s" * SUBSCRIPTION_NAME_BYTES_MAX)
        assert answer.status == 204, answer.body


async def test_an_out_of_range_number_in_a_path_is_a_400(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with admin_env(tmp_path) as (_, _, client):
        await client.call("PUT", f"{PT}/t/subscription/s")
        for digits in ("9" * 20, "9" * 5000):
            answer = await client.call("POST", f"{PT}/t/subscription/s/skip/{digits}")
            assert answer.status == 400, answer.body
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_malformed_http_requests_are_one_warning_each_without_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    requests = [
        b"GET /admin/v2/persistent/public/default/" + b"a" * 9000 + b"/stats HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX-Big: " + b"h" * 10_000 + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nBad Header\r\n\r\n",
    ]

    caplog.set_level(logging.DEBUG)
    async with admin_env(tmp_path) as (_, server, _):
        for request in requests * 2:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(request)
            answer = await reader.read()  # the server answers and closes
            assert answer.startswith(b"HTTP/1."), answer[:60]
            assert b" 400 " in answer[:20], answer[:60]
            writer.close()
            await writer.wait_closed()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(requests) * 2  # one per request, and each closed its connection
    assert all("bad HTTP request" in r.getMessage() for r in warnings)


async def test_partition_counts_beyond_the_limit_are_refused(tmp_path: Path) -> None:
    async with admin_env(tmp_path, max_num_partitions_per_partitioned_topic=8) as (
            env, _, client):
        answer = await client.call("PUT", f"{PT}/many/partitions", 9)
        assert (answer.status, answer.body["reason"]) == (
            406, "Number of partitions should be less than or equal to 8")
        assert env.service.namespaces.partitions("persistent://public/default/many") == 0
        assert (await client.call("PUT", f"{PT}/many/partitions", 8)).status == 204
        assert (await client.call("POST", f"{PT}/many/partitions", 9)).status == 406
        assert env.service.namespaces.partitions("persistent://public/default/many") == 8
        override = {"allowAutoTopicCreation": True, "topicType": "partitioned",
                    "defaultNumPartitions": 9}
        answer = await client.call("POST", "/admin/v2/namespaces/public/default/"
                                   "autoTopicCreation", override)
        assert answer.status == 406
    with pytest.raises(ValueError, match="max_num_partitions_per_partitioned_topic"):
        BrokerConfig(default_num_partitions=9, max_num_partitions_per_partitioned_topic=8)


async def test_a_producer_whose_initial_subscription_fails_is_not_left_behind(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        name = TopicName.parse("persistent://public/default/initial")
        spec = ProducerSpec(producer_name="p", initial_subscription_name=LONG_SUB)
        with pytest.raises(ValueError, match="metadata keys"):  # the store refuses it
            await env.service.create_producer(name, spec)
        topic = env.service.topics[str(name)]
        assert isinstance(topic, PersistentTopic)
        assert not topic.producers
        assert LONG_SUB not in topic.managed_ledger.cursors
        assert await env.service.unload_topic(name)


async def test_a_stored_topic_whose_name_no_longer_parses_is_left_out_of_listings(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An earlier build could store names between the current limit and the store's; listing
    the namespace still works, without them."""
    async with broker_env(tmp_path) as env:
        await env.service.get_topic(TopicName.parse("persistent://public/default/ok"),
                                    create=True)
        old = "o" * 420
        env.service.storage.metadata.put(
            f"ml/public/default/persistent/{old}".encode(), b"{}")
        with caplog.at_level(logging.WARNING, logger="magnetar.broker.topics._service"):
            listed = env.service.list_topics("public/default")
        assert listed == ["persistent://public/default/ok"]
        assert "not listing stored topic" in caplog.text
