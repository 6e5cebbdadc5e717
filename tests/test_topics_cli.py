"""`magnetar topics` topic-level policy and message inspection commands against an
in-process admin API (the CLI runs in a worker thread while the test's loop serves it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.broker.helpers import admin_env, persistent_producer, publish, publish_batch
from tests.test_admin_cli import Cli

TOPIC = "persistent://public/default/cli-pol"


async def test_topic_policy_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     ) -> None:
    async with admin_env(tmp_path) as (env, server, _):
        cli = Cli(server.url, capsys)
        registry = env.service.namespaces
        topic, _ = await persistent_producer(env.service, TOPIC)
        assert await cli("topics", "get-retention", TOPIC) == "null\n"
        await cli("topics", "set-retention", TOPIC, "-t", "2h", "-s", "10M")
        assert json.loads(await cli("topics", "get-retention", TOPIC)) == {
            "retentionTimeInMinutes": 120, "retentionSizeInMB": 10}
        await cli("topics", "set-message-ttl", TOPIC, "-t", "1h")
        assert await cli("topics", "get-message-ttl", TOPIC) == "3600\n"
        assert topic.policies.message_ttl_s == 3600
        await cli("topics", "set-deduplication", TOPIC, "--enable")
        await cli("topics", "set-max-producers", TOPIC, "-m", "3")
        await cli("topics", "set-max-consumers", TOPIC, "-m", "4")
        await cli("topics", "set-delayed-delivery", TOPIC, "-d")
        await cli("topics", "set-compaction-threshold", TOPIC, "-t", "100M")
        await cli("topics", "set-backlog-quota", TOPIC, "-l", "1M", "-p", "producer_exception")
        stored = registry.topic_policies(TOPIC)
        assert stored["deduplicationEnabled"] is True
        assert stored["max_producers_per_topic"] == 3
        assert stored["max_consumers_per_topic"] == 4
        assert stored["delayed_delivery_policies"]["active"] is False
        assert stored["compaction_threshold"] == 100 * 1024 * 1024
        assert stored["backlog_quota_map"]["destination_storage"]["limitSize"] == 1024**2
        assert topic.policies.max_producers_per_topic == 3
        assert json.loads(await cli("topics", "get-backlog-quotas", TOPIC))[
            "destination_storage"]["policy"] == "producer_exception"
        for name in ("retention", "message-ttl", "deduplication", "max-producers",
                     "max-consumers", "delayed-delivery", "compaction-threshold"):
            await cli("topics", f"remove-{name}", TOPIC)
        await cli("topics", "remove-backlog-quota", TOPIC)
        assert registry.topic_policies(TOPIC) == {}
        assert await cli("topics", "get-max-producers", TOPIC, "--applied") == "0\n"
        assert await cli("topics", "set-max-producers", TOPIC, "-m", "-1", ok=False) == (
            "magnetar topics set-max-producers: HTTP 412: Invalid value for "
            "maxProducersPerTopic: it must be 0 or more\n")
        assert "HTTP 404" in await cli("topics", "get-retention",
                                       "persistent://public/default/none", ok=False)


async def test_message_inspection_commands(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    async with admin_env(tmp_path) as (env, server, _):
        cli = Cli(server.url, capsys)
        topic, producer = await persistent_producer(env.service, TOPIC)
        await topic.create_subscription("sub", "earliest")
        first = await publish(topic, producer, b"hello", partition_key="k1",
                              properties={"color": "red"})
        batch = await publish_batch(topic, producer, [b"b0", b"b1", b"b2"])
        out = await cli("topics", "peek-messages", TOPIC, "-s", "sub", "-n", "3")
        assert f"Message ID: {first[0]}:{first[1]}" in out
        assert "Key: k1" in out
        assert "  color: red" in out
        assert "|hello|" in out
        assert f"Batch Message ID: {batch[0]}:{batch[1]}:0" in out
        assert f"Batch Message ID: {batch[0]}:{batch[1]}:1" in out
        assert ":2\n" not in out  # three messages asked for: the third of the batch is left
        assert topic.subscriptions["sub"].backlog() == 2  # nothing consumed
        # More than the backlog holds: what there is.
        assert (await cli("topics", "peek-messages", TOPIC, "-s", "sub", "-n", "10")
                ).count("Message ID:") == 4
        out = await cli("topics", "examine-message", TOPIC, "-i", "earliest", "-m", "1")
        assert "|hello|" in out
        out = await cli("topics", "get-message-by-id", TOPIC, "-l", str(batch[0]),
                        "-e", str(batch[1]))
        assert out.count("Batch Message ID:") == 3
        assert json.loads(await cli("topics", "last-message-id", TOPIC)) == {
            "ledgerId": batch[0], "entryId": batch[1], "partitionIndex": -1, "batchIndex": 2}
        assert await cli("topics", "peek-messages", TOPIC, "-s", "nope", ok=False) == (
            f"magnetar topics peek-messages: HTTP 404: Subscription nope not found for topic "
            f"{TOPIC}\n")
        assert "HTTP 404: Message not found" in await cli(
            "topics", "get-message-by-id", TOPIC, "-l", str(batch[0]), "-e", "99", ok=False)
