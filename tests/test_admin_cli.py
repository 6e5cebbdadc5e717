"""`magnetar produce|consume|topics|namespaces|tenants`: every command's help, the value
parsers, and the admin commands against an in-process admin API (the CLI runs in a worker
thread while the test's loop serves the requests)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from magnetar.broker import PersistentTopic
from magnetar.broker.cli import build_parser, main
from magnetar.broker.cli._admin_cli import parse_duration_s, parse_size_bytes
from tests.broker.helpers import admin_env, make_entry, now_ms, persistent_producer, wait_for

ADMIN_GROUPS = ("topics", "namespaces", "tenants", "clusters")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def _help_argvs() -> list[list[str]]:
    top = _subcommands(build_parser())
    argvs = [["produce", "--help"], ["consume", "--help"]]
    for group in ADMIN_GROUPS:
        argvs.append([group, "--help"])
        argvs.extend([group, command, "--help"] for command in _subcommands(top[group]))
    return argvs


HELP_ARGVS = _help_argvs()


def test_every_admin_group_has_its_commands() -> None:
    top = _subcommands(build_parser())
    assert {"produce", "consume", *ADMIN_GROUPS} <= set(top)
    assert {"storage", "crashtest", "bench"} <= set(top)  # still there
    topics = set(_subcommands(top["topics"]))
    assert {"list", "create-partitioned-topic", "stats", "stats-internal",
            "partitioned-stats", "create-subscription", "reset-cursor", "terminate",
            "partitioned-terminate", "unload"} <= topics
    namespaces = set(_subcommands(top["namespaces"]))
    assert {"create", "list", "set-retention", "get-retention", "set-message-ttl",
            "set-backlog-quota", "set-deduplication"} <= namespaces
    assert set(_subcommands(top["clusters"])) == {"list", "get"}
    assert len(HELP_ARGVS) == 2 + len(ADMIN_GROUPS) + len(topics) + len(namespaces) + len(
        _subcommands(top["tenants"])) + 2


@pytest.mark.parametrize("argv", HELP_ARGVS, ids=[" ".join(a[:-1]) for a in HELP_ARGVS])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: magnetar {' '.join(argv[:-1])}")
    assert len(out.splitlines()) > 3


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("10m", 600), ("3h", 10_800), ("2d", 172_800),
    ("1w", 604_800), ("-1", -1), ("0", 0), ("5M", 300),
])
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize(("text", "size"), [
    ("4096", 4096), ("10k", 10 * 1024), ("10M", 10 * 1024**2), ("16G", 16 * 1024**3),
    ("3T", 3 * 1024**4), ("-1", -1),
])
def test_parse_size(text: str, size: int) -> None:
    assert parse_size_bytes(text) == size


@pytest.mark.parametrize("text", ["", "ten", "10x", "1.5h", "h"])
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration_s(text)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size_bytes(text)


class Cli:
    """Runs `magnetar` in a worker thread against the admin server of the test's loop."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]):
        self.url = url
        self.capsys = capsys

    async def __call__(self, *argv: str, ok: bool = True) -> str:
        """Run; returns stdout, or stderr when the command is expected to fail."""
        group, *rest = argv
        full = [group, "--admin-url", self.url, *rest] if group in ADMIN_GROUPS else list(argv)
        loop = asyncio.get_running_loop()
        code = await loop.run_in_executor(None, main, full)
        out, err = self.capsys.readouterr()
        assert (code == 0) is ok, (argv, code, out, err)
        return out if ok else err


async def test_tenant_and_namespace_commands(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    async with admin_env(tmp_path) as (env, server, _):
        cli = Cli(server.url, capsys)
        registry = env.service.namespaces
        await cli("tenants", "create", "acme", "-r", "ops,dev")
        assert registry.tenant_info("acme") == {"adminRoles": ["ops", "dev"],
                                                "allowedClusters": ["standalone"]}
        assert (await cli("tenants", "list")).split() == ["acme", "public"]
        assert json.loads(await cli("tenants", "get", "acme"))["adminRoles"] == \
            ["ops", "dev"]
        await cli("tenants", "update", "acme", "-c", "standalone")
        assert registry.tenant_info("acme")["adminRoles"] == []
        await cli("namespaces", "create", "acme/orders")
        # --admin-url is accepted after the command too.
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, main, [
            "namespaces", "list", "acme", "--admin-url", server.url]) == 0
        assert capsys.readouterr().out.split() == ["acme/orders"]
        await cli("namespaces", "set-retention", "acme/orders", "-t", "2h", "-s", "10M")
        assert registry.policies("acme/orders")["retention_policies"] == {
            "retentionTimeInMinutes": 120, "retentionSizeInMB": 10}
        assert json.loads(await cli("namespaces", "get-retention", "acme/orders")) == {
            "retentionTimeInMinutes": 120, "retentionSizeInMB": 10}
        await cli("namespaces", "set-message-ttl", "acme/orders", "-ttl", "1h")
        assert await cli("namespaces", "get-message-ttl", "acme/orders") == "3600\n"
        await cli("namespaces", "set-deduplication", "acme/orders", "--enable")
        await cli("namespaces", "set-max-unacked-messages-per-consumer", "acme/orders",
                  "-m", "10")
        await cli("namespaces", "set-delayed-delivery", "acme/orders", "-d")
        await cli("namespaces", "set-backlog-quota", "acme/orders", "-l", "1M",
                  "-p", "producer_exception")
        await cli("namespaces", "set-backlog-quota", "acme/orders", "-t", "message_age",
                  "-lt", "30m", "-p", "consumer_backlog_eviction")
        policies = json.loads(await cli("namespaces", "policies", "acme/orders"))
        assert policies["deduplicationEnabled"] is True
        assert policies["message_ttl_in_seconds"] == 3600
        assert policies["max_unacked_messages_per_consumer"] == 10
        assert policies["delayed_delivery_policies"]["active"] is False
        assert policies["backlog_quota_map"]["destination_storage"]["limitSize"] == 1024**2
        assert policies["backlog_quota_map"]["message_age"]["limitTime"] == 1800
        await cli("namespaces", "remove-backlog-quota", "acme/orders", "-t", "message_age")
        await cli("namespaces", "remove-message-ttl", "acme/orders")
        assert await cli("namespaces", "get-message-ttl", "acme/orders") == ""
        assert list(registry.policies("acme/orders")["backlog_quota_map"]) == \
            ["destination_storage"]
        # The cluster, as pulsar-admin clusters shows it.
        assert await cli("clusters", "list") == "standalone\n"
        assert json.loads(await cli("clusters", "get", "standalone"))["serviceUrl"] == \
            server.url
        assert await cli("clusters", "get", "elsewhere", ok=False) == \
            "magnetar clusters get: HTTP 404: Cluster does not exist\n"
        # Errors: exit 1 with the API's reason.
        assert await cli("namespaces", "create", "acme/orders", ok=False) == \
            "magnetar namespaces create: HTTP 409: Namespace already exists\n"
        assert await cli("namespaces", "set-message-ttl", "acme/orders", "-ttl", "-5",
                         ok=False) == (
            "magnetar namespaces set-message-ttl: HTTP 412: Invalid value for message TTL\n")
        assert "HTTP 409" in await cli("tenants", "delete", "acme", ok=False)
        await cli("namespaces", "delete", "acme/orders")
        await cli("tenants", "delete", "acme")
        assert not registry.tenant_exists("acme")


async def test_topic_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with admin_env(tmp_path) as (env, server, _):
        cli = Cli(server.url, capsys)
        service = env.service
        await cli("topics", "create-partitioned-topic", "persistent://public/default/orders",
                  "-p", "3")
        assert (await cli("topics", "list", "public/default")).split() == [
            f"persistent://public/default/orders-partition-{i}" for i in range(3)]
        assert (await cli("topics", "list-partitioned-topics", "public/default")).split() \
            == ["persistent://public/default/orders"]
        assert json.loads(await cli("topics", "get-partitioned-topic-metadata",
                                    "orders")) == {"partitions": 3}
        await cli("topics", "update-partitioned-topic", "orders", "-p", "4")
        assert service.namespaces.partitions("persistent://public/default/orders") == 4
        stats = json.loads(await cli("topics", "partitioned-stats", "orders",
                                     "--per-partition"))
        assert stats["metadata"] == {"partitions": 4}
        assert len(stats["partitions"]) == 4
        await cli("topics", "delete-partitioned-topic", "orders")
        assert await cli("topics", "list", "public/default") == ""

        await cli("topics", "create", "public/default/plain")
        topic, producer = await persistent_producer(service, "plain")
        for i in range(4):  # published an hour ago
            metadata, entry = make_entry(b"m%d" % i, sequence_id=i, producer_name="p1",
                                         publish_time_ms=now_ms() - 3_600_000)
            await topic.publish(producer, entry, i, i, metadata)
        await cli("topics", "create-subscription", "plain", "-s", "s1", "-m", "earliest")
        await cli("topics", "create-subscription", "plain", "-s", "s2")
        assert (await cli("topics", "subscriptions", "plain")).split() == ["s1", "s2"]
        backlog = topic.subscriptions["s1"].backlog
        assert (backlog(), topic.subscriptions["s2"].backlog()) == (4, 0)
        await cli("topics", "skip", "plain", "-s", "s1", "-n", "1")
        assert backlog() == 3
        await cli("topics", "clear-backlog", "plain", "-s", "s1")
        assert backlog() == 0
        await cli("topics", "reset-cursor", "plain", "-s", "s1", "-t", "2h")
        assert backlog() == 4
        await cli("topics", "reset-cursor", "plain", "-s", "s1", "--timestamp",
                  str(now_ms()))
        assert backlog() == 0
        first = topic.managed_ledger.first_entry_at_or_after(
            topic.managed_ledger.first_position())
        await cli("topics", "reset-cursor", "plain", "-s", "s1", "-m",
                  f"{first.ledger_id}:{first.entry_id + 1}")
        assert backlog() == 3
        await cli("topics", "expire-messages", "plain", "-s", "s1", "-t", "30m")
        assert backlog() == 0
        await cli("topics", "reset-cursor", "plain", "-s", "s1", "-t", "2h")
        await cli("topics", "expire-messages-all-subscriptions", "plain", "-t", "30m")
        assert backlog() == 0
        stats = json.loads(await cli("topics", "stats", "plain"))
        assert stats["msgInCounter"] == 4
        assert stats["subscriptions"]["s1"]["totalMsgExpired"] == 7
        internal = json.loads(await cli("topics", "stats-internal", "plain"))
        assert set(internal["cursors"]) == {"s1", "s2"}
        await cli("topics", "unsubscribe", "plain", "-s", "s2")
        assert list(topic.subscriptions) == ["s1"]
        assert "HTTP 412: Topic has active producers/subscriptions" in await cli(
            "topics", "delete", "plain", ok=False)
        await cli("topics", "delete", "plain", "-f")
        assert not service.topic_exists("plain")
        assert await cli("topics", "stats", "plain", ok=False) == \
            ("magnetar topics stats: HTTP 404: Topic persistent://public/default/plain "
             "not found\n")


async def test_terminate_and_unload_commands(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    async with admin_env(tmp_path) as (env, server, _):
        cli = Cli(server.url, capsys)
        service = env.service
        topic, producer = await persistent_producer(service, "ending")
        metadata, entry = make_entry(b"last", sequence_id=0, producer_name="p1")
        result = await topic.publish(producer, entry, 0, 0, metadata)
        answer = json.loads(await cli("topics", "terminate", "ending"))
        assert answer == {"ledgerId": result.ledger_id, "entryId": result.entry_id,
                          "partitionIndex": -1}
        assert topic.terminated
        await cli("topics", "unload", "ending")
        assert "persistent://public/default/ending" not in service.topics
        await cli("topics", "create-partitioned-topic", "parts", "-p", "2")
        assert set(json.loads(await cli("topics", "partitioned-terminate", "parts"))) \
            == {"0", "1"}
        assert "HTTP 405" in await cli("topics", "terminate", "parts", ok=False)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_unreachable_admin_api(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    assert main(["topics", "list", "public/default", "--admin-url", url]) == 1
    assert f"cannot reach the admin API at {url}" in capsys.readouterr().err


@pytest.mark.interop
@pytest.mark.parametrize("argv", [
    ["produce", "t", "-m", "hello"],
    ["consume", "t", "-s", "sub"],
])
def test_produce_and_consume_report_an_unreachable_broker(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code = main([*argv, "--url", f"pulsar://127.0.0.1:{_closed_port()}", "--timeout-s", "1"])
    assert code == 1
    assert f"{argv[0]} failed" in capsys.readouterr().err
    assert time.monotonic() - started < 15


def test_produce_needs_messages(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["produce", "t", "--url", "pulsar://127.0.0.1:1"]) == 1
    assert "nothing to produce" in capsys.readouterr().err



@pytest.mark.interop
async def test_produce_and_consume_through_the_broker(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from magnetar.broker.wire._server import serve

    async with admin_env(tmp_path) as (env, admin, _):
        server = await serve(env.service, "127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        url = f"pulsar://127.0.0.1:{server.port}"
        try:
            code = await loop.run_in_executor(None, main, [
                "produce", "cli-topic", "-m", "a,b,c", "-s", ",", "-k", "k1",
                "-p", "origin=cli", "--url", url, "--timeout-s", "10"])
            assert code == 0
            assert "3 messages successfully produced" in capsys.readouterr().out
            code = await loop.run_in_executor(None, main, [
                "consume", "cli-topic", "-s", "sub", "-p", "Earliest", "-n", "3",
                "--url", url, "--timeout-s", "10"])
            assert code == 0
            out = capsys.readouterr().out
            bodies = [line for line in out.splitlines() if line in ("a", "b", "c")]
            assert bodies == ["a", "b", "c"]
            assert out.count("key: k1  properties: {'origin': 'cli'}") == 3
            assert "3 messages successfully consumed" in out
            topic = await env.service.get_topic("cli-topic", create=False)
            assert isinstance(topic, PersistentTopic)
            await wait_for(lambda: topic.subscriptions["sub"].backlog() == 0)
            stats = json.loads(await Cli(admin.url, capsys)("topics", "stats",
                                                             "cli-topic"))
            assert stats["msgInCounter"] == 3
            assert stats["subscriptions"]["sub"]["msgOutCounter"] == 3
        finally:
            await server.shutdown()
