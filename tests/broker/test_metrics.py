"""Prometheus metrics: the exposition parses with prometheus_client's own parsers (text
0.0.4 by default, OpenMetrics when the Accept header asks for it), and the values match a
known sequence of publishes, dispatches, acks and expiries."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

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

TOPIC = "persistent://public/default/orders"
NP_TOPIC = "non-persistent://public/default/ticks"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str, *, openmetrics: bool = False) -> tuple[Samples, dict[str, str]]:
    """Samples by (sample name, labels) and the type of each family, as prometheus_client's
    parser reads them (a counter family is named without `_total`, its samples with it);
    asserts that no sample appears twice."""
    parser = openmetrics_families if openmetrics else text_string_to_metric_families
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in parser(text):
        assert family.name not in types, f"second family {family.name}"
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
    return samples, types


def pulsar_only(samples: Samples) -> Samples:
    """The broker's own series (not the process, platform and GC collectors')."""
    return {key: value for key, value in samples.items()
            if key[0].startswith(("pulsar_", "magnetar_"))}


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


async def test_metrics_text_parses_and_matches_the_traffic(tmp_path: Path) -> None:
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
        # Pulsar's counters are the *_total series (the parser names their families
        # without the suffix); per-consumer series only when asked for.
        assert {n for n, kind in types.items()
                if kind == "counter" and n.startswith("pulsar_")} == {
            "pulsar_in_messages", "pulsar_in_bytes", "pulsar_out_messages",
            "pulsar_out_bytes"}
        assert not any(n.startswith("pulsar_consumer_") for n, _ in samples)


async def test_metrics_agree_with_topic_stats_after_acks_and_expiry(tmp_path: Path) -> None:
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


async def test_consumer_level_metrics(tmp_path: Path) -> None:
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


async def test_label_values_are_escaped(tmp_path: Path) -> None:
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


async def test_no_topics_no_broker_samples(tmp_path: Path) -> None:
    """Without topics only the storage engine's and the process's series are written."""
    async with broker_env(tmp_path) as env:
        samples, types = parse(render_metrics(env.service))
        assert not any(name.startswith("pulsar_") for name, _ in samples)
        assert types["process_cpu_seconds"] == "counter"
        assert types["magnetar_journal_fsync_latency_seconds"] == "histogram"


async def test_metrics_endpoint_serves_the_same_text(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        await known_traffic(env.service)
        # The process collectors' figures move between two scrapes; the broker's not.
        expected = pulsar_only(parse(render_metrics(env.service))[0])
        for path in ("/metrics", "/metrics/"):
            answer = await client.call("GET", path)
            assert answer.status == 200
            assert answer.content_type == "text/plain"
            assert pulsar_only(parse(answer.body)[0]) == expected
        raw = await client.session.get(client.base_url + "/metrics")
        assert raw.headers["Content-Type"] == CONTENT_TYPE
        raw.release()
        samples, _ = parse(answer.body)
        assert samples[("pulsar_in_messages_total", labels(topic=TOPIC))] == 5


async def test_openmetrics_when_the_accept_header_asks(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        await known_traffic(env.service)
        expected = pulsar_only(parse(render_metrics(env.service))[0])
        accept = "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"
        async with client.session.get(client.base_url + "/metrics",
                                      headers={"Accept": accept}) as raw:
            assert raw.status == 200
            assert raw.headers["Content-Type"].startswith(
                "application/openmetrics-text; version=1.0.0")
            text = await raw.text()
        assert text.endswith("# EOF\n")
        samples, types = parse(text, openmetrics=True)
        assert pulsar_only(samples) == expected
        assert types["pulsar_in_messages"] == "counter"


# Pulsar's bucket bounds (ManagedLedgerMBeanImpl) and the gauges it writes for them.
LATENCY_BUCKETS = [("pulsar_storage_write_latency_le_0_5", 500),
                   ("pulsar_storage_write_latency_le_1", 1_000),
                   ("pulsar_storage_write_latency_le_5", 5_000),
                   ("pulsar_storage_write_latency_le_10", 10_000),
                   ("pulsar_storage_write_latency_le_20", 20_000),
                   ("pulsar_storage_write_latency_le_50", 50_000),
                   ("pulsar_storage_write_latency_le_100", 100_000),
                   ("pulsar_storage_write_latency_le_200", 200_000),
                   ("pulsar_storage_write_latency_le_1000", 1_000_000),
                   ("pulsar_storage_write_latency_overflow", None)]
SIZE_BUCKETS = [("pulsar_entry_size_le_128", 128), ("pulsar_entry_size_le_512", 512),
                ("pulsar_entry_size_le_1_kb", 1024), ("pulsar_entry_size_le_2_kb", 2084),
                ("pulsar_entry_size_le_4_kb", 4096), ("pulsar_entry_size_le_16_kb", 16_384),
                ("pulsar_entry_size_le_100_kb", 102_400),
                ("pulsar_entry_size_le_1_mb", 1_232_896),
                ("pulsar_entry_size_le_overflow", None)]


def test_bucket_bounds_are_pulsars() -> None:
    from magnetar.broker._rates import ENTRY_LATENCY_BUCKETS_US, ENTRY_SIZE_BUCKETS_BYTES
    from magnetar.broker.http._metrics import ENTRY_SIZE_BUCKET_NAMES, WRITE_LATENCY_BUCKET_NAMES

    assert list(zip(WRITE_LATENCY_BUCKET_NAMES, [*ENTRY_LATENCY_BUCKETS_US, None],
                    strict=True)) == LATENCY_BUCKETS
    assert list(zip(ENTRY_SIZE_BUCKET_NAMES, [*ENTRY_SIZE_BUCKETS_BYTES, None],
                    strict=True)) == SIZE_BUCKETS


async def test_rates_and_histograms_cover_the_last_stats_interval(tmp_path: Path) -> None:
    """Rates are what the counters gained over the interval divided by its length; the
    histograms count that interval's entries, each in the bucket Pulsar's bounds name;
    the next interval without traffic brings them back to zero."""
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        sink = RecordingSink()
        _, consumer = await service.subscribe(TOPIC, SubscribeSpec(
            "s1", "Shared", "c1", initial_position="earliest"), sink)
        start = time.monotonic()  # the meters' clock; the intervals below are made up
        service.update_stats(start)
        entry_sizes = []
        for i, size in enumerate([100, 600, 3000, 5000]):  # entries in four buckets
            metadata, entry = make_entry(b"x" * size, sequence_id=i, producer_name="p1")
            entry_sizes.append(len(entry))
            await topic.publish(producer, entry, i, i, metadata)
        topic.subscriptions["s1"].flow(consumer, 100)
        await wait_for(lambda: len(sink.received) == 4)
        service.update_stats(start + 2.0)  # a 2 s interval
        stats = topic_stats(topic)
        assert stats["msgRateIn"] == stats["publishers"][0]["msgRateIn"] == 2.0
        assert stats["msgThroughputIn"] == sum(entry_sizes) / 2
        assert stats["msgRateOut"] == 2.0
        sub = stats["subscriptions"]["s1"]
        assert sub["msgRateOut"] == sub["consumers"][0]["msgRateOut"] == 2.0
        assert sub["msgThroughputOut"] == sum(entry_sizes) / 2
        samples, _ = parse(render_metrics(service, consumer_level=True))
        t = labels(topic=TOPIC)
        assert samples[("pulsar_rate_in", t)] == samples[("pulsar_rate_out", t)] == 2.0
        assert samples[("pulsar_throughput_in", t)] == sum(entry_sizes) / 2
        assert samples[("pulsar_throughput_out", t)] == sum(entry_sizes) / 2
        assert samples[("pulsar_subscription_msg_rate_out",
                        labels(topic=TOPIC, subscription="s1"))] == 2.0
        assert samples[("pulsar_consumer_msg_rate_out", labels(
            topic=TOPIC, subscription="s1", consumer_name="c1",
            consumer_id=str(consumer.consumer_serial)))] == 2.0
        expected_sizes = {name: sum(1 for s in entry_sizes if (bound is None or s <= bound)
                                    and (low is None or s > low))
                          for (name, bound), low in zip(
                              SIZE_BUCKETS, [None] + [b for _, b in SIZE_BUCKETS[:-1]],
                              strict=True)}
        assert sum(1 for v in expected_sizes.values() if v) == 4
        for name, count in expected_sizes.items():
            assert samples[(name, t)] == count, name
        assert samples[("pulsar_entry_size_count", t)] == 4
        assert samples[("pulsar_entry_size_sum", t)] == sum(entry_sizes)
        assert sum(samples[(name, t)] for name, _ in LATENCY_BUCKETS) == 4
        assert samples[("pulsar_storage_write_latency_count", t)] == 4
        assert samples[("pulsar_storage_write_latency_sum", t)] > 0
        service.update_stats(start + 3.0)  # an idle interval
        samples, _ = parse(render_metrics(service))
        assert samples[("pulsar_rate_in", t)] == samples[("pulsar_throughput_out", t)] == 0
        assert samples[("pulsar_entry_size_count", t)] == 0
        assert samples[("pulsar_storage_write_latency_count", t)] == 0


async def test_storage_metrics_follow_the_engine(tmp_path: Path) -> None:
    """The journal's fsync histogram and group-commit sizes, the write cache, the entry
    logs and GC runs, read from the engine by the broker's collector."""
    async with broker_env(tmp_path) as env:
        before, _ = parse(render_metrics(env.service))
        topic, producer = await persistent_producer(env.service, TOPIC)
        await publish_many(topic, producer, 5)
        cache_bytes = env.storage.write_cache_bytes
        middle, types = parse(render_metrics(env.service))
        cluster = frozenset({("cluster", "standalone")})
        assert types["magnetar_journal_fsync_latency_seconds"] == "histogram"
        fsyncs = ("magnetar_journal_fsync_latency_seconds_count", cluster)
        records = ("magnetar_journal_group_commit_records_sum", cluster)
        assert middle[fsyncs] > before[fsyncs]
        assert middle[records] >= before[records] + 5  # 5 adds, plus ledger records
        assert middle[("magnetar_write_cache_bytes", cluster)] == cache_bytes > 0
        infinity = frozenset({*cluster, ("le", "+Inf")})
        assert middle[("magnetar_journal_fsync_latency_seconds_bucket", infinity)] == \
            middle[fsyncs]
        assert middle[("magnetar_storage_replay_seconds", cluster)] > 0
        await asyncio.to_thread(env.storage.checkpoint)
        await asyncio.to_thread(env.storage.gc)
        after, _ = parse(render_metrics(env.service))
        assert after[("magnetar_write_cache_bytes", cluster)] == 0
        assert after[("magnetar_entry_log_bytes", cluster)] > 0
        assert after[("magnetar_gc_runs_total", cluster)] == \
            before[("magnetar_gc_runs_total", cluster)] + 1


def test_a_closed_broker_leaves_no_registry_behind(tmp_path: Path) -> None:
    """The per-broker registries are held weakly: a broker gone is a registry gone (many
    brokers come and go in one process, e.g. in tests and restarts)."""
    import gc
    import weakref

    from magnetar.broker.http._metrics import _REGISTRIES

    async def scenario() -> weakref.ref[BrokerService]:
        async with broker_env(tmp_path) as env:
            render_metrics(env.service)
            render_metrics(env.service, consumer_level=True)
            assert env.service in _REGISTRIES
            return weakref.ref(env.service)

    gone = asyncio.run(scenario())
    gc.collect()
    assert gone() is None
