"""Prometheus metrics: the text parses line by line, families are grouped under one TYPE,
and the values match a known sequence of publishes, dispatches, acks and expiries."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from magnetar.broker import BrokerService, ProducerSpec, SubscribeSpec
from magnetar.broker.http._metrics import CONTENT_TYPE, render_metrics
from magnetar.broker.http._stats import topic_stats
from magnetar.broker.ledger._position import Position

from .helpers import (
    RecordingSink,
    admin_env,
    broker_env,
    make_entry,
    now_ms,
    persistent_producer,
    publish_many,
    wait_for,
)

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = rf'({NAME})="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf"({NAME})(?:\{{((?:{LABEL},?)*)\}})? (\S+)")
COMMENT = re.compile(rf"# (HELP|TYPE) ({NAME}) (.+)")
TOPIC = "persistent://public/default/orders"
NP_TOPIC = "non-persistent://public/default/ticks"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Samples by (name, labels) and the TYPE of each family; asserts that every line is a
    comment or a sample and that each family's samples follow its own TYPE line."""
    samples: Samples = {}
    types: dict[str, str] = {}
    current = None
    assert text.endswith("\n")
    for line in text.splitlines():
        comment = COMMENT.fullmatch(line)
        if comment is not None:
            kind, name, rest = comment.groups()
            if kind == "TYPE":
                assert name not in types, f"second TYPE line for {name}"
                assert rest in ("counter", "gauge")
                types[name] = rest
                current = name
            continue
        match = SAMPLE.fullmatch(line)
        assert match is not None, f"not a sample: {line!r}"
        name, label_text, value = match.group(1), match.group(2) or "", match.group(5)
        assert name == current, f"{name} outside its family"
        labels = frozenset((k, _unescape(v)) for k, v in re.findall(LABEL, label_text))
        assert (name, labels) not in samples, f"duplicate sample {line!r}"
        samples[(name, labels)] = float(value)
    return samples, types


def labels(**values: str) -> frozenset[tuple[str, str]]:
    base = {"cluster": "standalone", "namespace": "public/default"}
    return frozenset({**base, **values}.items())


async def known_traffic(service: BrokerService) -> dict[str, Any]:
    """5 messages to `orders`: subscription `s1` (a Shared consumer) receives them all and
    acknowledges 2; `s2` has no consumer. 3 messages to a non-persistent topic with one
    consumer of permits 10."""
    topic, producer = await persistent_producer(service, TOPIC)
    await topic.create_subscription("s2", "earliest")
    sink = RecordingSink()
    _, consumer = await service.subscribe(TOPIC, SubscribeSpec(
        "s1", "Shared", "reader-1", initial_position="earliest"), sink)
    positions = await publish_many(topic, producer, 5)
    topic.subscriptions["s1"].flow(consumer, 100)
    await wait_for(lambda: len(sink.received) == 5)
    await topic.subscriptions["s1"].acknowledge(consumer, 0,
                                                [(*p, None) for p in positions[:2]])
    np_topic, np_producer = await service.create_producer(NP_TOPIC, ProducerSpec("np"))
    np_sink = RecordingSink()
    _, np_consumer = await service.subscribe(NP_TOPIC, SubscribeSpec("live", "Shared", "n1"),
                                             np_sink)
    np_topic.subscriptions["live"].flow(np_consumer, 10)
    np_bytes = 0
    for i in range(3):
        metadata, entry = make_entry(b"tick%d" % i, sequence_id=i, producer_name="np")
        np_bytes += len(entry)
        await np_topic.publish(np_producer, entry, i, i, metadata)
    await wait_for(lambda: len(np_sink.received) == 3)
    entry_bytes = sum(len(topic.managed_ledger.read_entry(Position(*p))) for p in positions)
    return {"topic": topic, "consumer": consumer, "np_bytes": np_bytes,
            "entry_bytes": entry_bytes}


def test_metrics_text_parses_and_matches_the_traffic(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with broker_env(tmp_path) as env:
            traffic = await known_traffic(env.service)
            topic = traffic["topic"]
            samples, types = parse(render_metrics(env.service))
            t = {"topic": TOPIC}
            assert samples[("pulsar_topics_count", labels())] == 2
            assert samples[("pulsar_in_messages_total", labels(**t))] == 5
            assert samples[("pulsar_in_bytes_total", labels(**t))] == topic.bytes_in_counter
            assert samples[("pulsar_producers_count", labels(**t))] == 1
            assert samples[("pulsar_consumers_count", labels(**t))] == 1
            assert samples[("pulsar_subscriptions_count", labels(**t))] == 2
            assert samples[("pulsar_storage_size", labels(**t))] == \
                topic.managed_ledger.total_size_bytes > 0
            assert samples[("pulsar_msg_backlog", labels(**t))] == 3 + 5
            assert samples[("pulsar_storage_backlog_quota_limit", labels(**t))] == -1
            s1, s2 = labels(**t, subscription="s1"), labels(**t, subscription="s2")
            assert samples[("pulsar_subscription_back_log", s1)] == 3
            assert samples[("pulsar_subscription_back_log", s2)] == 5
            assert samples[("pulsar_subscription_back_log_no_delayed", s1)] == 3
            assert samples[("pulsar_subscription_unacked_messages", s1)] == 3
            assert samples[("pulsar_subscription_consumers_count", s1)] == 1
            assert samples[("pulsar_subscription_consumers_count", s2)] == 0
            assert samples[("pulsar_subscription_blocked_on_unacked_messages", s1)] == 0
            assert samples[("pulsar_out_messages_total", s1)] == 5
            assert samples[("pulsar_out_messages_total", s2)] == 0
            assert samples[("pulsar_out_bytes_total", s1)] == traffic["entry_bytes"] > 0
            assert samples[("pulsar_in_bytes_total", labels(**t))] == traffic["entry_bytes"]
            np = {"topic": NP_TOPIC}
            assert samples[("pulsar_in_messages_total", labels(**np))] == 3
            assert samples[("pulsar_in_bytes_total", labels(**np))] == traffic["np_bytes"]
            assert samples[("pulsar_out_messages_total", labels(**np, subscription="live"))] \
                == 3
            assert ("pulsar_msg_backlog", labels(**np)) not in samples
            # Counters are the *_total families; per-consumer series only when asked for.
            assert {n for n, kind in types.items() if kind == "counter"} == {
                "pulsar_in_messages_total", "pulsar_in_bytes_total",
                "pulsar_out_messages_total", "pulsar_out_bytes_total"}
            assert not any(n.startswith("pulsar_consumer_") for n, _ in samples)

    asyncio.run(scenario())


def test_metrics_agree_with_topic_stats_after_acks_and_expiry(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with broker_env(tmp_path) as env:
            topic, producer = await persistent_producer(env.service, TOPIC)
            await topic.create_subscription("old", "earliest")
            for i in range(4):
                metadata, entry = make_entry(b"m%d" % i, sequence_id=i, producer_name="p1",
                                             publish_time_ms=now_ms() - 600_000)
                await topic.publish(producer, entry, i, i, metadata)
            expired = await topic.subscriptions["old"].expire_messages(60)
            assert expired == 4
            samples, _ = parse(render_metrics(env.service))
            stats = topic_stats(topic)["subscriptions"]["old"]
            key = labels(topic=TOPIC, subscription="old")
            assert samples[("pulsar_subscription_total_msg_expired", key)] == \
                stats["totalMsgExpired"] == 4
            assert samples[("pulsar_subscription_last_expire_timestamp", key)] == \
                stats["lastExpireTimestamp"] > 0
            assert samples[("pulsar_subscription_back_log", key)] == stats["msgBacklog"] == 0

    asyncio.run(scenario())


def test_consumer_level_metrics(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with broker_env(tmp_path) as env:
            traffic = await known_traffic(env.service)
            consumer = traffic["consumer"]
            samples, _ = parse(render_metrics(env.service, consumer_level=True))
            key = labels(topic=TOPIC, subscription="s1", consumer_name="reader-1",
                         consumer_id=str(consumer.consumer_serial))
            assert samples[("pulsar_consumer_unacked_messages", key)] == 3
            assert samples[("pulsar_consumer_available_permits", key)] == 95
            assert samples[("pulsar_consumer_blocked_on_unacked_messages", key)] == 0
            assert samples[("pulsar_out_messages_total", key)] == 5
            # The subscription-level series stay beside the consumer's.
            assert samples[("pulsar_out_messages_total",
                            labels(topic=TOPIC, subscription="s1"))] == 5

    asyncio.run(scenario())


def test_label_values_are_escaped(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with broker_env(tmp_path) as env:
            odd = 'persistent://public/default/q"uote\\back'
            topic, _ = await persistent_producer(env.service, odd)
            await topic.create_subscription('line\nbreak', "earliest")
            text = render_metrics(env.service)
            assert '\\"' in text
            assert "\\\\" in text
            assert "\\n" in text
            samples, _ = parse(text)
            assert samples[("pulsar_producers_count", labels(topic=odd))] == 1
            assert ("pulsar_subscription_back_log",
                    labels(topic=odd, subscription="line\nbreak")) in samples

    asyncio.run(scenario())


def test_no_topics_no_samples(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with broker_env(tmp_path) as env:
            assert render_metrics(env.service) == ""

    asyncio.run(scenario())


def test_metrics_endpoint_serves_the_same_text(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with admin_env(tmp_path) as (env, _, client):
            await known_traffic(env.service)
            for path in ("/metrics", "/metrics/"):
                answer = await client.call("GET", path)
                assert answer.status == 200
                assert answer.content_type == "text/plain"
                assert answer.body == render_metrics(env.service)
            raw = await client.session.get(client.base_url + "/metrics")
            assert raw.headers["Content-Type"] == CONTENT_TYPE
            raw.release()
            samples, _ = parse(answer.body)
            assert samples[("pulsar_in_messages_total", labels(topic=TOPIC))] == 5

    asyncio.run(scenario())
