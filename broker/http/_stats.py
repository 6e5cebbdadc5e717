"""Topic stats and internal stats as JSON-ready dicts, with Pulsar's field names.

`topic_stats` mirrors `pulsar-admin topics stats` (TopicStats → SubscriptionStats →
ConsumerStats, PublisherStats); `internal_stats` mirrors `topics stats-internal`
(PersistentTopicInternalStats: the managed ledger's ledgers and cursors). The rates
(`msgRateIn`, `msgThroughputIn`, `msgRateOut`, `msgThroughputOut`) are those of the last
stats interval (`stats_update_frequency_s`, Pulsar's statsUpdateFrequencyInSecs; see
`broker/_rates.py`): 0.0 until the first interval has passed. A non-persistent
subscription's rates are the sum of its consumers'.
"""

from __future__ import annotations

import math
from typing import Any

from ..dispatch._consumer import Consumer
from ..dispatch._dispatch_key_shared import KeySharedDispatcher
from ..dispatch._dispatch_shared import SharedDispatcher
from ..dispatch._dispatcher import SingleActiveConsumerDispatcher
from ..dispatch._nonpersistent import NonPersistentSubscription
from ..dispatch._subscription import Subscription
from ..topics._nonpersistent_topic import NonPersistentTopic
from ..topics._producer import Producer
from ..topics._topic import PersistentTopic

__all__ = ["internal_stats", "topic_stats"]


def _publisher(producer: Producer) -> dict[str, Any]:
    return {
        "producerName": producer.name,
        "accessMode": producer.spec.access_mode,
        "msgRateIn": producer.rate_in.rate,
        "msgThroughputIn": producer.rate_in.value_rate,
        "averageMsgSize": (producer.bytes_in_counter / producer.msg_in_counter
                           if producer.msg_in_counter else 0.0),
        "msgInCounter": producer.msg_in_counter,
        "bytesInCounter": producer.bytes_in_counter,
        "metadata": dict(producer.spec.metadata),
        "connectedSince": producer.connected_since,
        "address": producer.spec.address,
        "clientVersion": producer.spec.client_version,
    }


def _consumer(consumer: Consumer, subscription: Subscription | None) -> dict[str, Any]:
    dispatcher = subscription.dispatcher if subscription is not None else None
    stats: dict[str, Any] = {
        "consumerName": consumer.consumer_name,
        "msgRateOut": consumer.rate_out.rate,
        "msgThroughputOut": consumer.rate_out.value_rate,
        "msgOutCounter": consumer.msg_out_counter,
        "bytesOutCounter": consumer.bytes_out_counter,
        "msgRateRedeliver": 0.0,
        "availablePermits": consumer.permits,
        "unackedMessages": consumer.unacked_messages,
        "avgMessagesPerEntry": math.floor(consumer.avg_messages_per_entry + 0.5),  # Java round
        "blockedConsumerOnUnackedMsgs": consumer.blocked_on_unacked,
        "lastAckedTimestamp": consumer.last_acked_timestamp,
        "lastConsumedTimestamp": consumer.last_consumed_timestamp,
        "lastConsumedFlowTimestamp": consumer.last_consumed_flow_timestamp,
        "metadata": dict(consumer.spec.metadata),
        "address": consumer.spec.address,
        "connectedSince": consumer.connected_since,
        "clientVersion": consumer.spec.client_version,
        "drainingHashesCount": 0,
        "drainingHashesClearedTotal": 0,
        "drainingHashesUnackedMessages": 0,
    }
    if isinstance(dispatcher, KeySharedDispatcher):
        draining = dispatcher.draining.consumer_stats(consumer)
        stats["drainingHashesCount"] = draining.draining_hashes_count
        stats["drainingHashesClearedTotal"] = draining.draining_hashes_cleared_total
        stats["drainingHashesUnackedMessages"] = draining.draining_hashes_unacked_messages
        stats["drainingHashes"] = [h.to_json() for h in draining.draining_hashes]
        ranges = dispatcher.selector.consumer_key_hash_ranges().get(consumer, [])
        stats["keyHashRangeArrays"] = [[r.start, r.end] for r in ranges]
    return stats


def _subscription(subscription: Subscription) -> dict[str, Any]:
    dispatcher = subscription.dispatcher
    consumers = [_consumer(c, subscription) for c in subscription.consumers]
    sub_type = dispatcher.sub_type if dispatcher is not None else "None"
    backlog = subscription.backlog()
    delayed = subscription.delayed.size() if subscription.delayed is not None else 0
    stats: dict[str, Any] = {
        "type": sub_type,
        "msgRateOut": subscription.rate_out.rate,
        "msgThroughputOut": subscription.rate_out.value_rate,
        "msgOutCounter": subscription.msg_out_counter,
        "bytesOutCounter": subscription.bytes_out_counter,
        "msgBacklog": backlog,
        "msgBacklogNoDelayed": max(0, backlog - delayed),
        "msgDelayed": delayed,
        "unackedMessages": sum(c.unacked_messages for c in subscription.consumers),
        "msgInReplay": len(dispatcher.replay) if isinstance(dispatcher, SharedDispatcher) else 0,
        "blockedSubscriptionOnUnackedMsgs": (dispatcher.blocked_on_unacked if isinstance(
            dispatcher, SharedDispatcher) else False),
        "isDurable": subscription.durable,
        "isReplicated": False,
        "lastExpireTimestamp": subscription.last_expire_timestamp,
        "totalMsgExpired": subscription.total_msg_expired,
        "lastConsumedFlowTimestamp": subscription.last_consumed_flow_timestamp,
        "nonContiguousDeletedMessagesRanges": len(subscription.cursor.individually_deleted),
        "subscriptionProperties": dict(subscription.cursor.cursor_properties),
        "consumers": consumers,
        "drainingHashesCount": sum(c["drainingHashesCount"] for c in consumers),
        "drainingHashesClearedTotal": sum(c["drainingHashesClearedTotal"] for c in consumers),
        "drainingHashesUnackedMessages": sum(c["drainingHashesUnackedMessages"]
                                             for c in consumers),
    }
    if isinstance(dispatcher, KeySharedDispatcher):
        stats["keySharedMode"] = dispatcher.key_shared_mode
        stats["allowOutOfOrderDelivery"] = dispatcher.allow_out_of_order
    if isinstance(dispatcher, SingleActiveConsumerDispatcher) and dispatcher.active is not None:
        stats["activeConsumerName"] = dispatcher.active.consumer_name
    return stats


def topic_stats(topic: PersistentTopic | NonPersistentTopic) -> dict[str, Any]:
    """`pulsar-admin topics stats` for one topic (or partition)."""
    stats: dict[str, Any] = {
        "msgRateIn": topic.rate_in.rate,
        "msgThroughputIn": topic.rate_in.value_rate,
        "msgRateOut": topic.rate_out.rate,
        "msgThroughputOut": topic.rate_out.value_rate,
        "msgInCounter": topic.msg_in_counter,
        "bytesInCounter": topic.bytes_in_counter,
        "msgOutCounter": topic.msg_out_counter,
        "bytesOutCounter": topic.bytes_out_counter,
        "averageMsgSize": (topic.bytes_in_counter / topic.msg_in_counter
                           if topic.msg_in_counter else 0.0),
        "publishers": [_publisher(p) for p in topic.producers.values()],
        "deduplicationStatus": "Disabled",
    }
    if isinstance(topic, PersistentTopic):
        ml = topic.managed_ledger
        subscriptions = {s.name: _subscription(s) for s in topic.all_subscriptions()}
        stats.update({
            "storageSize": ml.total_size_bytes,
            "backlogSize": topic.estimated_backlog_bytes(),
            "subscriptions": subscriptions,
            "deduplicationStatus": "Enabled" if topic.dedup is not None else "Disabled",
            # Not Pulsar's: why the topic's entries cannot be read (None while healthy), and
            # whether the broker's disk is full (publishes are refused until space is back).
            "storageFailure": topic.failure,
            "storageFull": topic.service.storage_full,
        })
    else:
        stats["msgDropRate"] = 0.0
        stats["msgDropCounter"] = topic.msg_drop_counter
        stats["subscriptions"] = {
            name: _non_persistent_subscription(s) for name, s in topic.subscriptions.items()}
    return stats


def _non_persistent_subscription(subscription: NonPersistentSubscription) -> dict[str, Any]:
    consumers = [_consumer(c, None) for c in subscription.consumers]
    return {"type": subscription.sub_type,
            "msgRateOut": sum(c["msgRateOut"] for c in consumers),
            "msgThroughputOut": sum(c["msgThroughputOut"] for c in consumers),
            "msgDropRate": 0.0, "msgDropCounter": subscription.msg_drop_counter,
            "consumers": consumers}


def _ranges_text(ranges: list[tuple[Any, Any]]) -> str:
    parts = [f"({a.ledger_id}:{a.entry_id}..{b.ledger_id}:{b.entry_id}]" for a, b in ranges]
    return "[" + ", ".join(parts) + "]"


def internal_stats(topic: PersistentTopic) -> dict[str, Any]:
    """`pulsar-admin topics stats-internal`: the managed ledger and its cursors."""
    ml = topic.managed_ledger
    last = ml.last_confirmed_position
    ledgers = [{"ledgerId": info.ledger_id, "entries": info.entries, "size": info.size_bytes,
                "timestamp": info.timestamp_ms, "offloaded": False}
               for info in ml.ledgers()]
    cursors = {}
    for name, cursor in ml.cursors.items():
        md = cursor.mark_delete_position
        rp = cursor.read_position
        cursors[name] = {
            "markDeletePosition": f"{md.ledger_id}:{md.entry_id}",
            "readPosition": f"{rp.ledger_id}:{rp.entry_id}",
            "messagesConsumedCounter": 0,
            "cursorLedger": -1,
            "individuallyDeletedMessages": _ranges_text(cursor.individually_deleted.open_closed()),
            "numberOfEntriesSinceFirstNotAckedMessage": cursor.backlog(),
            "totalNonContiguousDeletedMessagesRange": len(cursor.individually_deleted),
            "properties": dict(cursor.properties),
            "state": "Open",
        }
    return {
        "entriesAddedCounter": ml.number_of_entries,
        "numberOfEntries": ml.number_of_entries,
        "totalSize": ml.total_size_bytes,
        "currentLedgerEntries": ml.ledger_entries(ml.current_ledger_id),
        "currentLedgerSize": 0,
        "lastConfirmedEntry": f"{last.ledger_id}:{last.entry_id}",
        "state": "Terminated" if ml.terminated_position is not None else "LedgerOpened",
        "ledgers": ledgers,
        "cursors": cursors,
    }
