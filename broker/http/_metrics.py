"""The broker's counters in the Prometheus text exposition format (version 0.0.4).

Theory of operation
-------------------
`render_metrics` walks the loaded topics and reads every value from `topic_stats`, so a
scrape and `topics stats` always agree. It writes Pulsar's metric names with Pulsar's
labels (with topic-level metrics exposed, as `exposeTopicLevelMetricsInPrometheus=true`):

* per namespace, `{cluster, namespace}`: `pulsar_topics_count`;
* per topic, `{cluster, namespace, topic}`: `pulsar_subscriptions_count`,
  `pulsar_producers_count`, `pulsar_consumers_count`, `pulsar_in_messages_total`,
  `pulsar_in_bytes_total`, and for persistent topics `pulsar_storage_size`,
  `pulsar_storage_backlog_size`, `pulsar_storage_backlog_quota_limit`,
  `pulsar_msg_backlog` (the sum of its subscriptions' backlogs, in entries) and
  `pulsar_topic_storage_failed` (1 once its entries cannot be read);
* per broker, `{cluster}`: `pulsar_broker_storage_full` (1 while the disk is full), and the
  binary protocol server's `ConnectionCounters`: `pulsar_active_connections`,
  `pulsar_connection_create_fail_count` (refused for a connection limit),
  `magnetar_connections_closed_for_incomplete_frames_count` and
  `magnetar_incomplete_frames_bytes` (all written when a topic is loaded, the disk is full
  or a counter is not zero);
* per subscription, the topic labels plus `subscription`: `pulsar_subscription_back_log`
  and the other `pulsar_subscription_*` gauges, and `pulsar_out_messages_total` /
  `pulsar_out_bytes_total` (what the subscription has dispatched);
* per consumer, only with `consumer_level=True` (upstream's
  `exposeConsumerLevelMetricsInPrometheus`, off by default), the subscription labels plus
  `consumer_name` and `consumer_id`: `pulsar_consumer_*` and again
  `pulsar_out_messages_total` / `pulsar_out_bytes_total`.

Rates are not tracked (the stats report them as 0.0), so no rate metric is written.
Samples are grouped by metric name, each family after one `# HELP` and one `# TYPE` line,
as the format requires. Names ending in `_total` are counters, the rest gauges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..topics._nonpersistent_topic import NonPersistentTopic
from ..topics._service import ConnectionCounters
from ..topics._topic import PersistentTopic
from ._stats import topic_stats

if TYPE_CHECKING:
    from ..dispatch._consumer import Consumer
    from ..topics._service import BrokerService

__all__ = ["CONTENT_TYPE", "ConnectionCounters", "render_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name -> help text; every name written must be here.
METRICS: dict[str, str] = {
    "pulsar_topics_count": "Topics of the namespace loaded by this broker",
    "pulsar_subscriptions_count": "Subscriptions of the topic (readers included)",
    "pulsar_producers_count": "Producers connected to the topic",
    "pulsar_consumers_count": "Consumers connected to the topic",
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
}

Labels = tuple[tuple[str, str], ...]


class _Families:
    """Samples grouped by metric name, in first-seen order."""

    def __init__(self) -> None:
        self._samples: dict[str, list[tuple[Labels, float | int]]] = {}

    def add(self, name: str, labels: Labels, value: float | int | bool) -> None:
        assert name in METRICS, f"undocumented metric {name}"
        self._samples.setdefault(name, []).append((labels, int(value) if isinstance(
            value, bool) else value))

    def render(self) -> str:
        lines: list[str] = []
        for name, samples in self._samples.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines.append(f"# HELP {name} {METRICS[name]}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{_labels_text(labels)} {_value_text(value)}"
                         for labels, value in samples)
        return "\n".join(lines) + "\n" if lines else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels_text(labels: Labels) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"


def _value_text(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def render_metrics(service: BrokerService, *, consumer_level: bool = False) -> str:
    """The metrics of every loaded topic as Prometheus text.

    Args:
        service: the broker.
        consumer_level: also write the per-consumer metrics.

    Returns:
        The exposition text, one sample per line, ending with a newline (empty when no
        topic is loaded and the disk is not full).
    """
    families = _Families()
    cluster = service.config.cluster_name
    topics = sorted(service.topics.values(), key=lambda t: str(t.name))
    per_namespace: dict[str, int] = {}
    for topic in topics:
        namespace = topic.name.namespace_name
        per_namespace[namespace] = per_namespace.get(namespace, 0) + 1
    for namespace, count in sorted(per_namespace.items()):
        families.add("pulsar_topics_count",
                     (("cluster", cluster), ("namespace", namespace)), count)
    connections = service.connections
    if topics or service.storage_full or connections.any():
        broker = (("cluster", cluster),)
        families.add("pulsar_broker_storage_full", broker, service.storage_full)
        families.add("pulsar_active_connections", broker, connections.active)
        families.add("pulsar_connection_create_fail_count", broker, connections.refused)
        families.add("magnetar_connections_closed_for_incomplete_frames_count", broker,
                     connections.closed_for_incomplete_frames)
        families.add("magnetar_incomplete_frames_bytes", broker,
                     connections.incomplete_frames_bytes)
    for topic in topics:
        labels = (("cluster", cluster), ("namespace", topic.name.namespace_name),
                  ("topic", str(topic.name)))
        _topic_metrics(families, topic, labels, consumer_level)
    return families.render()


def _topic_metrics(families: _Families, topic: PersistentTopic | NonPersistentTopic,
                   labels: Labels, consumer_level: bool) -> None:
    stats = topic_stats(topic)
    subscriptions: dict[str, dict[str, Any]] = stats["subscriptions"]
    families.add("pulsar_subscriptions_count", labels, len(subscriptions))
    families.add("pulsar_producers_count", labels, len(stats["publishers"]))
    families.add("pulsar_consumers_count", labels, topic.consumer_count())
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
    for name in sorted(subscriptions):
        sub_labels = (*labels, ("subscription", name))
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
                consumer_labels = (*sub_labels, ("consumer_name", consumer.consumer_name),
                                   ("consumer_id", str(consumer.consumer_serial)))
                _consumer_metrics(families, consumer_stats, consumer_labels)


def _subscription_metrics(families: _Families, stats: dict[str, Any], labels: Labels) -> None:
    families.add("pulsar_subscription_back_log", labels, stats["msgBacklog"])
    families.add("pulsar_subscription_back_log_no_delayed", labels,
                 stats["msgBacklogNoDelayed"])
    families.add("pulsar_subscription_delayed", labels, stats["msgDelayed"])
    families.add("pulsar_subscription_unacked_messages", labels, stats["unackedMessages"])
    families.add("pulsar_subscription_blocked_on_unacked_messages", labels,
                 bool(stats["blockedSubscriptionOnUnackedMsgs"]))
    families.add("pulsar_subscription_consumers_count", labels, len(stats["consumers"]))
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
    # Nothing outlives a non-persistent subscription's consumers: its totals are theirs.
    families.add("pulsar_out_messages_total", labels,
                 sum(c["msgOutCounter"] for c in consumers))
    families.add("pulsar_out_bytes_total", labels, sum(c["bytesOutCounter"] for c in consumers))


def _consumer_metrics(families: _Families, stats: dict[str, Any], labels: Labels) -> None:
    families.add("pulsar_consumer_unacked_messages", labels, stats["unackedMessages"])
    families.add("pulsar_consumer_blocked_on_unacked_messages", labels,
                 bool(stats["blockedConsumerOnUnackedMsgs"]))
    families.add("pulsar_consumer_available_permits", labels, stats["availablePermits"])
    families.add("pulsar_out_messages_total", labels, stats["msgOutCounter"])
    families.add("pulsar_out_bytes_total", labels, stats["bytesOutCounter"])


def _consumers_of(topic: PersistentTopic | NonPersistentTopic, subscription: str,
                  ) -> list[Consumer]:
    """The consumers of a subscription in the order `topic_stats` lists them."""
    if isinstance(topic, PersistentTopic):
        found = topic.subscriptions.get(subscription) or topic.readers.get(subscription)
        return found.consumers if found is not None else []
    return list(topic.subscriptions[subscription].consumers)
