"""The broker's metrics, exposed through `prometheus_client`.

Theory of operation
-------------------
Each broker has its own `CollectorRegistry` (never the library's global one), holding
`prometheus_client`'s process, platform and GC collectors and `BrokerCollector`, a custom
collector that builds its families at scrape time: it walks the loaded topics and reads
every value from `topic_stats`, so a scrape and `topics stats` always agree, and reads the
storage engine's own figures (`storage.StorageMetrics`). `encode_metrics` lets the library
pick the format from the Accept header (the Prometheus text format 0.0.4 by default,
OpenMetrics 1.0 when asked for). Nothing is counted here: the counters live where the work
happens (topics, dispatch, the managed ledger, storage) and cost an integer add there.

Pulsar's metric names and labels (topic-level metrics exposed, as with
`exposeTopicLevelMetricsInPrometheus=true`):

* per namespace, `{cluster, namespace}`: `pulsar_topics_count`;
* per topic, `{cluster, namespace, topic}`: `pulsar_subscriptions_count`,
  `pulsar_producers_count`, `pulsar_consumers_count`, `pulsar_rate_in`, `pulsar_rate_out`
  (messages/s), `pulsar_throughput_in`, `pulsar_throughput_out` (bytes/s) -- the rates of
  the last stats interval, see `broker/_rates.py` --, `pulsar_in_messages_total`,
  `pulsar_in_bytes_total`; for persistent topics also `pulsar_storage_size`,
  `pulsar_storage_backlog_size`, `pulsar_storage_backlog_quota_limit`, `pulsar_msg_backlog`
  (the sum of its subscriptions' backlogs, in entries), `pulsar_topic_storage_failed` (1
  once its entries cannot be read), and the managed ledger's histograms of the last stats
  interval as Pulsar writes them, one gauge per bucket (not Prometheus histograms):
  `pulsar_storage_write_latency_le_0_5` ... `_le_1000`, `_overflow`, `_count`, `_sum` (µs)
  and `pulsar_entry_size_le_128` ... `_le_1_mb`, `_le_overflow`, `_count`, `_sum` (bytes);
* per broker, `{cluster}`: `pulsar_broker_storage_full` (1 while the disk is full), and the
  binary protocol server's `ConnectionCounters`: `pulsar_active_connections`,
  `pulsar_connection_create_fail_count` (refused for a connection limit),
  `magnetar_connections_closed_for_incomplete_frames_count` and
  `magnetar_incomplete_frames_bytes` (all written when a topic is loaded, the disk is full
  or a counter is not zero);
* per subscription, the topic labels plus `subscription`: `pulsar_subscription_back_log`
  and the other `pulsar_subscription_*` gauges (`pulsar_subscription_msg_rate_out` and
  `pulsar_subscription_msg_throughput_out` among them), and `pulsar_out_messages_total` /
  `pulsar_out_bytes_total` (what the subscription has dispatched);
* per consumer, only with `consumer_level=True` (upstream's
  `exposeConsumerLevelMetricsInPrometheus`, off by default), the subscription labels plus
  `consumer_name` and `consumer_id`: `pulsar_consumer_*` and again
  `pulsar_out_messages_total` / `pulsar_out_bytes_total`.

Magnetar's storage engine, `{cluster}`, written whenever the broker runs on it
(`storage/_stats.py`): Prometheus histograms `magnetar_journal_fsync_latency_seconds` and
`magnetar_journal_group_commit_records` (records made durable by one fsync), the counters
`magnetar_journal_written_bytes_total`, `magnetar_gc_runs_total`,
`magnetar_gc_entry_logs_deleted_total` and `magnetar_gc_entry_logs_compacted_total`, and
the gauges `magnetar_write_cache_bytes`, `magnetar_entry_log_bytes`,
`magnetar_storage_replay_seconds` and `magnetar_storage_replay_records` (the recovery at
start).

Names ending in `_total` are counters, the other `pulsar_`/`magnetar_` names gauges (a
family's samples may carry different label sets: subscription and consumer series share
`pulsar_out_messages_total`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Metric,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from magnetar.storage import Buckets, BucketsSnapshot, Storage

from ..topics._nonpersistent_topic import NonPersistentTopic
from ..topics._service import ConnectionCounters
from ..topics._topic import PersistentTopic
from ._stats import topic_stats

if TYPE_CHECKING:
    from ..dispatch._consumer import Consumer
    from ..topics._service import BrokerService

__all__ = ["CONTENT_TYPE", "BrokerCollector", "ConnectionCounters", "broker_registry",
           "encode_metrics", "render_metrics"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes

# name -> help text; every name written must be here.
METRICS: dict[str, str] = {
    "pulsar_topics_count": "Topics of the namespace loaded by this broker",
    "pulsar_subscriptions_count": "Subscriptions of the topic (readers included)",
    "pulsar_producers_count": "Producers connected to the topic",
    "pulsar_consumers_count": "Consumers connected to the topic",
    "pulsar_rate_in": "Messages published per second over the last stats interval",
    "pulsar_rate_out": "Messages dispatched per second over the last stats interval",
    "pulsar_throughput_in": "Bytes published per second over the last stats interval",
    "pulsar_throughput_out": "Bytes dispatched per second over the last stats interval",
    "pulsar_in_messages_total": "Messages published to the topic",
    "pulsar_in_bytes_total": "Bytes published to the topic",
    "pulsar_storage_size": "Bytes the topic's ledgers hold",
    "pulsar_storage_backlog_size": "Estimated bytes from the slowest subscription to the end",
    "pulsar_storage_backlog_quota_limit": "The size backlog quota in bytes (-1: none)",
    "pulsar_msg_backlog": "Backlog of the topic: the sum of its subscriptions' (entries)",
    "pulsar_topic_storage_failed":
        "1 when the topic's stored entries cannot be read (corrupt entry log or index)",
    "pulsar_broker_storage_full": "1 while the disk is full and publishes are refused",
    "pulsar_active_connections": "Open binary-protocol connections",
    "pulsar_connection_create_fail_count":
        "Connections refused for broker_max_connections or max_connections_per_ip",
    "magnetar_connections_closed_for_incomplete_frames_count":
        "Connections closed for pushing max_incomplete_frames_bytes over",
    "magnetar_incomplete_frames_bytes": "Bytes of frames not yet complete, all connections",
    "pulsar_subscription_back_log": "Entries not yet acknowledged by the subscription",
    "pulsar_subscription_back_log_no_delayed": "The backlog without delayed messages",
    "pulsar_subscription_delayed": "Messages held back for delayed delivery",
    "pulsar_subscription_unacked_messages": "Messages dispatched and not yet acknowledged",
    "pulsar_subscription_blocked_on_unacked_messages":
        "1 when the subscription is blocked on its unacked-messages limit",
    "pulsar_subscription_consumers_count": "Consumers connected to the subscription",
    "pulsar_subscription_msg_rate_out":
        "Messages dispatched per second over the last stats interval",
    "pulsar_subscription_msg_throughput_out":
        "Bytes dispatched per second over the last stats interval",
    "pulsar_subscription_total_msg_expired": "Messages expired by the message TTL",
    "pulsar_subscription_last_expire_timestamp": "When messages last expired (ms)",
    "pulsar_subscription_last_consumed_flow_timestamp": "When a consumer last asked for "
                                                        "messages (ms)",
    "pulsar_out_messages_total": "Messages dispatched (per subscription, or per consumer)",
    "pulsar_out_bytes_total": "Bytes dispatched (per subscription, or per consumer)",
    "pulsar_consumer_unacked_messages": "Messages the consumer has not acknowledged",
    "pulsar_consumer_blocked_on_unacked_messages":
        "1 when the consumer is blocked on its unacked-messages limit",
    "pulsar_consumer_available_permits": "Permits the consumer has granted",
    "pulsar_consumer_msg_rate_out":
        "Messages sent to the consumer per second over the last stats interval",
    "pulsar_consumer_msg_throughput_out":
        "Bytes sent to the consumer per second over the last stats interval",
}

# Pulsar's names for the buckets of broker/_rates.py's bounds, then count and sum.
WRITE_LATENCY_BUCKET_NAMES: Final = tuple(f"pulsar_storage_write_latency_{suffix}" for suffix in (
    "le_0_5", "le_1", "le_5", "le_10", "le_20", "le_50", "le_100", "le_200", "le_1000",
    "overflow"))
ENTRY_SIZE_BUCKET_NAMES: Final = tuple(f"pulsar_entry_size_{suffix}" for suffix in (
    "le_128", "le_512", "le_1_kb", "le_2_kb", "le_4_kb", "le_16_kb", "le_100_kb", "le_1_mb",
    "le_overflow"))
for _name in WRITE_LATENCY_BUCKET_NAMES:
    METRICS[_name] = "Entries whose add latency fell in this bucket, last stats interval"
for _name in ENTRY_SIZE_BUCKET_NAMES:
    METRICS[_name] = "Entries whose size fell in this bucket, last stats interval"
METRICS["pulsar_storage_write_latency_count"] = "Entries added, last stats interval"
METRICS["pulsar_storage_write_latency_sum"] = "Add latency of those entries (µs)"
METRICS["pulsar_entry_size_count"] = "Entries added, last stats interval"
METRICS["pulsar_entry_size_sum"] = "Bytes of those entries"

Labels = dict[str, str]


class _Families:
    """Families by metric name, in first-seen order; samples may differ in labels."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, name: str, labels: Labels, value: float | int | bool) -> None:
        family = self._families.get(name)
        if family is None:
            assert name in METRICS, f"undocumented metric {name}"
            family = (CounterMetricFamily(name, METRICS[name]) if name.endswith("_total")
                      else GaugeMetricFamily(name, METRICS[name]))
            self._families[name] = family
        family.add_sample(name, labels, float(value))

    def extend(self, families: Iterable[Metric]) -> None:
        for family in families:
            assert family.name not in self._families
            self._families[family.name] = family

    def metrics(self) -> list[Metric]:
        return list(self._families.values())


class BrokerCollector(Collector):
    """The broker's and its storage's families, built at each scrape (module comment).
    It holds the broker weakly (`_REGISTRIES` is keyed by it), and yields nothing once the
    broker is gone."""

    def __init__(self, service: BrokerService, *, consumer_level: bool):
        self._service = weakref.ref(service)
        self._consumer_level = consumer_level

    def collect(self) -> Iterator[Metric]:
        service = self._service()
        if service is None:
            return
        families = _Families()
        _broker_metrics(families, service, self._consumer_level)
        if isinstance(service.storage, Storage):
            families.extend(_storage_metrics(service.storage, service.config.cluster_name))
        yield from families.metrics()


# Registries by broker and by whether consumer-level series are written; a broker's go
# away with it.
_REGISTRIES: weakref.WeakKeyDictionary[BrokerService, dict[bool, CollectorRegistry]] = \
    weakref.WeakKeyDictionary()


def broker_registry(service: BrokerService, *, consumer_level: bool = False,
                    ) -> CollectorRegistry:
    """The broker's private registry: its collector plus the process, platform and GC
    collectors of `prometheus_client` (built on first use, then reused)."""
    per_broker = _REGISTRIES.setdefault(service, {})
    registry = per_broker.get(consumer_level)
    if registry is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(service, consumer_level=consumer_level))
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        per_broker[consumer_level] = registry
    return registry


def render_metrics(service: BrokerService, *, consumer_level: bool = False) -> str:
    """Every metric in the Prometheus text format 0.0.4 (`CONTENT_TYPE`).

    Args:
        service: the broker.
        consumer_level: also write the per-consumer metrics.
    """
    registry = broker_registry(service, consumer_level=consumer_level)
    return generate_latest(registry).decode()


def encode_metrics(service: BrokerService, accept: str, *, consumer_level: bool = False,
                   ) -> tuple[bytes, str]:
    """(body, Content-Type) of a scrape, in the format the Accept header asks for
    (`prometheus_client`'s choice: OpenMetrics when asked for, else text 0.0.4)."""
    encoder, content_type = choose_encoder(accept)
    return encoder(broker_registry(service, consumer_level=consumer_level)), content_type


# -- the broker's families ------------------------------------------------------------------


def _broker_metrics(families: _Families, service: BrokerService, consumer_level: bool) -> None:
    cluster = service.config.cluster_name
    topics = sorted(service.topics.values(), key=lambda t: str(t.name))
    per_namespace: dict[str, int] = {}
    for topic in topics:
        namespace = topic.name.namespace_name
        per_namespace[namespace] = per_namespace.get(namespace, 0) + 1
    for namespace, count in sorted(per_namespace.items()):
        families.add("pulsar_topics_count", {"cluster": cluster, "namespace": namespace}, count)
    connections = service.connections
    if topics or service.storage_full or connections.any():
        broker = {"cluster": cluster}
        families.add("pulsar_broker_storage_full", broker, service.storage_full)
        families.add("pulsar_active_connections", broker, connections.active)
        families.add("pulsar_connection_create_fail_count", broker, connections.refused)
        families.add("magnetar_connections_closed_for_incomplete_frames_count", broker,
                     connections.closed_for_incomplete_frames)
        families.add("magnetar_incomplete_frames_bytes", broker,
                     connections.incomplete_frames_bytes)
    for topic in topics:
        labels = {"cluster": cluster, "namespace": topic.name.namespace_name,
                  "topic": str(topic.name)}
        _topic_metrics(families, topic, labels, consumer_level)


def _topic_metrics(families: _Families, topic: PersistentTopic | NonPersistentTopic,
                   labels: Labels, consumer_level: bool) -> None:
    stats = topic_stats(topic)
    subscriptions: dict[str, dict[str, Any]] = stats["subscriptions"]
    families.add("pulsar_subscriptions_count", labels, len(subscriptions))
    families.add("pulsar_producers_count", labels, len(stats["publishers"]))
    families.add("pulsar_consumers_count", labels, topic.consumer_count())
    families.add("pulsar_rate_in", labels, stats["msgRateIn"])
    families.add("pulsar_rate_out", labels, stats["msgRateOut"])
    families.add("pulsar_throughput_in", labels, stats["msgThroughputIn"])
    families.add("pulsar_throughput_out", labels, stats["msgThroughputOut"])
    families.add("pulsar_in_messages_total", labels, stats["msgInCounter"])
    families.add("pulsar_in_bytes_total", labels, stats["bytesInCounter"])
    if isinstance(topic, PersistentTopic):
        families.add("pulsar_storage_size", labels, stats["storageSize"])
        families.add("pulsar_storage_backlog_size", labels, stats["backlogSize"])
        families.add("pulsar_storage_backlog_quota_limit", labels,
                     topic.policies.backlog_quota_limit_bytes)
        families.add("pulsar_msg_backlog", labels,
                     sum(s["msgBacklog"] for s in subscriptions.values()))
        families.add("pulsar_topic_storage_failed", labels, stats["storageFailure"] is not None)
        _pulsar_buckets(families, "pulsar_storage_write_latency", WRITE_LATENCY_BUCKET_NAMES,
                        topic.add_interval.latency_us, labels)
        _pulsar_buckets(families, "pulsar_entry_size", ENTRY_SIZE_BUCKET_NAMES,
                        topic.add_interval.size_bytes, labels)
    for name in sorted(subscriptions):
        sub_labels = {**labels, "subscription": name}
        sub_stats = subscriptions[name]
        if isinstance(topic, PersistentTopic):
            _subscription_metrics(families, sub_stats, sub_labels)
        else:
            _non_persistent_subscription_metrics(families, sub_stats, sub_labels)
        if consumer_level:
            consumers = _consumers_of(topic, name)
            assert len(consumers) == len(sub_stats["consumers"])
            for consumer, consumer_stats in zip(consumers, sub_stats["consumers"],
                                                strict=True):
                consumer_labels = {**sub_labels, "consumer_name": consumer.consumer_name,
                                   "consumer_id": str(consumer.consumer_serial)}
                _consumer_metrics(families, consumer_stats, consumer_labels)


def _pulsar_buckets(families: _Families, prefix: str, names: tuple[str, ...],
                    window: BucketsSnapshot, labels: Labels) -> None:
    """One gauge per bucket, then `_count` and `_sum`, as Pulsar writes them."""
    assert len(names) == len(window.counts)
    for name, count in zip(names, window.counts, strict=True):
        families.add(name, labels, count)
    families.add(f"{prefix}_count", labels, window.count)
    families.add(f"{prefix}_sum", labels, window.sum)


def _subscription_metrics(families: _Families, stats: dict[str, Any], labels: Labels) -> None:
    families.add("pulsar_subscription_back_log", labels, stats["msgBacklog"])
    families.add("pulsar_subscription_back_log_no_delayed", labels,
                 stats["msgBacklogNoDelayed"])
    families.add("pulsar_subscription_delayed", labels, stats["msgDelayed"])
    families.add("pulsar_subscription_unacked_messages", labels, stats["unackedMessages"])
    families.add("pulsar_subscription_blocked_on_unacked_messages", labels,
                 bool(stats["blockedSubscriptionOnUnackedMsgs"]))
    families.add("pulsar_subscription_consumers_count", labels, len(stats["consumers"]))
    families.add("pulsar_subscription_msg_rate_out", labels, stats["msgRateOut"])
    families.add("pulsar_subscription_msg_throughput_out", labels, stats["msgThroughputOut"])
    families.add("pulsar_subscription_total_msg_expired", labels, stats["totalMsgExpired"])
    families.add("pulsar_subscription_last_expire_timestamp", labels,
                 stats["lastExpireTimestamp"])
    families.add("pulsar_subscription_last_consumed_flow_timestamp", labels,
                 stats["lastConsumedFlowTimestamp"])
    families.add("pulsar_out_messages_total", labels, stats["msgOutCounter"])
    families.add("pulsar_out_bytes_total", labels, stats["bytesOutCounter"])


def _non_persistent_subscription_metrics(families: _Families, stats: dict[str, Any],
                                         labels: Labels) -> None:
    consumers: list[dict[str, Any]] = stats["consumers"]
    families.add("pulsar_subscription_consumers_count", labels, len(consumers))
    families.add("pulsar_subscription_msg_rate_out", labels, stats["msgRateOut"])
    families.add("pulsar_subscription_msg_throughput_out", labels, stats["msgThroughputOut"])
    # Nothing outlives a non-persistent subscription's consumers: its totals are theirs.
    families.add("pulsar_out_messages_total", labels,
                 sum(c["msgOutCounter"] for c in consumers))
    families.add("pulsar_out_bytes_total", labels, sum(c["bytesOutCounter"] for c in consumers))


def _consumer_metrics(families: _Families, stats: dict[str, Any], labels: Labels) -> None:
    families.add("pulsar_consumer_unacked_messages", labels, stats["unackedMessages"])
    families.add("pulsar_consumer_blocked_on_unacked_messages", labels,
                 bool(stats["blockedConsumerOnUnackedMsgs"]))
    families.add("pulsar_consumer_available_permits", labels, stats["availablePermits"])
    families.add("pulsar_consumer_msg_rate_out", labels, stats["msgRateOut"])
    families.add("pulsar_consumer_msg_throughput_out", labels, stats["msgThroughputOut"])
    families.add("pulsar_out_messages_total", labels, stats["msgOutCounter"])
    families.add("pulsar_out_bytes_total", labels, stats["bytesOutCounter"])


def _consumers_of(topic: PersistentTopic | NonPersistentTopic, subscription: str,
                  ) -> list[Consumer]:
    """The consumers of a subscription in the order `topic_stats` lists them."""
    if isinstance(topic, PersistentTopic):
        found = topic.subscriptions.get(subscription) or topic.readers.get(subscription)
        return found.consumers if found is not None else []
    return list(topic.subscriptions[subscription].consumers)


# -- the storage engine's families ----------------------------------------------------------


def _histogram(name: str, documentation: str, buckets: Buckets, divisor: int,
               cluster: str) -> HistogramMetricFamily:
    """A Prometheus histogram (cumulative buckets) of a storage `Buckets`, its bounds and
    sum divided by `divisor` (µs to seconds: 10**6)."""
    snapshot = buckets.snapshot()
    family = HistogramMetricFamily(name, documentation, labels=["cluster"])
    cumulative, points = 0, []
    for bound, count in zip((*snapshot.bounds, None), snapshot.counts, strict=True):
        cumulative += count
        points.append(("+Inf" if bound is None else repr(bound / divisor), cumulative))
    family.add_metric([cluster], points, snapshot.sum / divisor)
    return family


def _storage_metrics(storage: Storage, cluster: str) -> list[Metric]:
    figures = storage.metrics
    labels = [cluster]

    def counter(name: str, documentation: str, value: float) -> Metric:
        family = CounterMetricFamily(name, documentation, labels=["cluster"])
        family.add_metric(labels, value)
        return family

    def gauge(name: str, documentation: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, documentation, labels=["cluster"])
        family.add_metric(labels, value)
        return family

    return [
        _histogram("magnetar_journal_fsync_latency_seconds",
                   "Latency of the journal's fdatasync, one per group commit",
                   figures.journal_fsync_us, 1_000_000, cluster),
        _histogram("magnetar_journal_group_commit_records",
                   "Journal records made durable by one fdatasync",
                   figures.group_commit_records, 1, cluster),
        counter("magnetar_journal_written_bytes", "Bytes written to the journal",
                figures.journal_bytes_written),
        gauge("magnetar_write_cache_bytes", "Entry bytes in the write cache (both halves)",
              storage.write_cache_bytes),
        gauge("magnetar_entry_log_bytes", "Bytes of the entry logs (committed data)",
              storage.entry_log_bytes),
        counter("magnetar_gc_runs", "Garbage-collection passes over the entry logs",
                figures.gc_runs),
        counter("magnetar_gc_entry_logs_deleted", "Entry logs removed by GC (no live data)",
                figures.gc_entry_logs_deleted),
        counter("magnetar_gc_entry_logs_compacted",
                "Entry logs compacted by GC (live entries copied out)",
                figures.gc_entry_logs_compacted),
        gauge("magnetar_storage_replay_seconds",
              "How long the storage's recovery (journal replay) took at start",
              figures.replay_seconds),
        gauge("magnetar_storage_replay_records", "Journal records replayed at start",
              figures.replay_records),
    ]
