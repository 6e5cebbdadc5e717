"""Retention, message TTL and backlog quotas end to end through `BrokerService` (broker
reference §7, §11 items 40-41).

* Retention (§7.1): with the default 0/0, ledgers every durable cursor has passed are deleted
  once closed; a retention time or size keeps them until it is exceeded; readers hold nothing.
* TTL (§7.2): the namespace's `message_ttl_in_seconds` moves a subscription's mark-delete over
  the entries published longer ago, never over fresh ones, also after a restart.
* Backlog quotas (§7.3, `BacklogQuotaManagerTest`): producer_request_hold and
  producer_exception refuse new producers and drop connected ones on the periodic check;
  consumer_backlog_eviction skips the slowest subscription's backlog below the limit; readers
  do not count.

Ledgers are kept small (`managed_ledger_max_entries_per_ledger`) with no minimum rollover
time, so a few entries span several ledgers. Policies change through the namespace registry,
followed by `policies_changed`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import (
    PersistentTopic,
    Position,
    ProducerSpec,
    SubscribeSpec,
    TopicTerminatedError,
)
from magnetar.broker._errors import (
    ProducerBlockedQuotaExceededError,
    ProducerBlockedQuotaExceededException,
)
from magnetar.broker.topics._service import BrokerService

from .helpers import RecordingSink, broker_env, make_entry, now_ms, publish

NAMESPACE = "public/default"
TOPIC = "persistent://public/default/retention"
ENTRIES_PER_LEDGER = 5
SMALL_LEDGERS = {"managed_ledger_max_entries_per_ledger": ENTRIES_PER_LEDGER,
                 "managed_ledger_min_ledger_rollover_time_s": 0}
MiB = 1024 * 1024


async def _set_policy(service: BrokerService, field: str, value: Any) -> None:
    service.namespaces.set_policy(NAMESPACE, field, value)
    await service.policies_changed(NAMESPACE)


async def _topic_with_subscription(service: BrokerService, name: str = "sub",
                                   ) -> PersistentTopic:
    topic = await service.get_topic(TOPIC)
    assert isinstance(topic, PersistentTopic)
    await topic.create_subscription(name, "earliest")
    return topic


async def _fill(service: BrokerService, count: int, body: bytes = b"x" * 100,
                publish_time_ms: int | None = None) -> list[Position]:
    topic = await service.get_topic(TOPIC)
    assert isinstance(topic, PersistentTopic)
    producer = topic.producers.get("filler") or topic.add_producer(ProducerSpec("filler"))
    positions = []
    for _ in range(count):
        metadata, entry = make_entry(body, producer_name="filler",
                                     publish_time_ms=publish_time_ms)
        result = await topic.publish(producer, entry, 0, 0, metadata)
        positions.append(Position(result.ledger_id, result.entry_id))
    return positions


def _ledger_ids(topic: PersistentTopic) -> list[int]:
    return [ledger.ledger_id for ledger in topic.managed_ledger.ledgers()]


# -- retention --------------------------------------------------------------------------------


async def test_consumed_ledgers_are_trimmed_with_default_retention(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        topic = await _topic_with_subscription(service)
        positions = await _fill(service, 20)
        ledgers = sorted({p.ledger_id for p in positions})
        assert len(ledgers) == 4
        assert _ledger_ids(topic)[:4] == ledgers  # plus the (empty) current one
        subscription = topic.subscriptions["sub"]

        # Acknowledge into the third ledger: the first two go.
        await subscription.acknowledge(None, 0, [(p.ledger_id, p.entry_id, None)
                                                 for p in positions[:12]])
        await service.run_maintenance(force=True)
        assert _ledger_ids(topic)[:2] == ledgers[2:]
        assert len(_ledger_ids(topic)) == 3
        assert subscription.backlog() == 8
        assert topic.managed_ledger.number_of_entries == 10

        # Everything acknowledged: only the current ledger is left, never deleted.
        await subscription.acknowledge(None, 0, [(p.ledger_id, p.entry_id, None)
                                                 for p in positions[12:]])
        await service.run_maintenance(force=True)
        assert len(_ledger_ids(topic)) == 1
        assert _ledger_ids(topic)[0] not in ledgers
        assert subscription.backlog() == 0


async def test_unconsumed_ledgers_are_kept_with_default_retention(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        topic = await _topic_with_subscription(service, "slow")
        await topic.create_subscription("fast", "earliest")
        positions = await _fill(service, 15)
        await topic.subscriptions["fast"].acknowledge(
            None, 0, [(p.ledger_id, p.entry_id, None) for p in positions])
        await service.run_maintenance(force=True)
        assert topic.managed_ledger.number_of_entries == 15  # "slow" holds them all
        assert topic.subscriptions["slow"].backlog() == 15


async def test_retention_time_keeps_consumed_ledgers_until_it_expires(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "retention_policies",
                          {"retentionTimeInMinutes": 10, "retentionSizeInMB": -1})
        topic = await _topic_with_subscription(service)
        positions = await _fill(service, 15)
        await topic.subscriptions["sub"].acknowledge(
            None, 0, [(p.ledger_id, p.entry_id, None) for p in positions])
        await service.run_maintenance(force=True)
        assert topic.managed_ledger.number_of_entries == 15  # retained

        ml = topic.managed_ledger
        assert ml.trim_consumed_ledgers(now_ms() + 9 * 60_000) == []
        trimmed = ml.trim_consumed_ledgers(now_ms() + 11 * 60_000)
        assert trimmed == sorted({p.ledger_id for p in positions})
        assert ml.number_of_entries == 0


async def test_retention_size_keeps_the_newest_consumed_ledgers(tmp_path: Path) -> None:
    async with broker_env(tmp_path, managed_ledger_max_entries_per_ledger=3,
                          managed_ledger_min_ledger_rollover_time_s=0) as env:
        service = env.service
        await _set_policy(service, "retention_policies",
                          {"retentionTimeInMinutes": -1, "retentionSizeInMB": 1})
        topic = await _topic_with_subscription(service)
        positions = await _fill(service, 15, body=b"r" * (100 * 1024))  # 5 x ~300 KiB
        await topic.subscriptions["sub"].acknowledge(
            None, 0, [(p.ledger_id, p.entry_id, None) for p in positions])
        await service.run_maintenance(force=True)
        ml = topic.managed_ledger
        kept = [ledger for ledger in ml.ledgers() if ledger.entries > 0]
        kept_bytes = sum(ledger.size_bytes for ledger in kept)
        # A ledger goes while what is left without it still reaches the quota (§7.1).
        assert len(kept) == 4
        assert kept_bytes - kept[0].size_bytes < MiB <= kept_bytes
        assert kept[0].ledger_id == positions[3].ledger_id


async def test_readers_do_not_hold_back_trimming(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        topic = await _topic_with_subscription(service)
        sink = RecordingSink()
        await service.subscribe(TOPIC, SubscribeSpec(
            "reader-1", "Exclusive", "r", initial_position="earliest", durable=False), sink)
        positions = await _fill(service, 12)
        await topic.subscriptions["sub"].acknowledge(
            None, 0, [(p.ledger_id, p.entry_id, None) for p in positions])
        await service.run_maintenance(force=True)
        assert topic.managed_ledger.number_of_entries == 2  # the open ledger's
        reader = topic.readers["reader-1"]
        assert reader.cursor.mark_delete_position >= Position(positions[10].ledger_id, -1)


# -- TTL ----------------------------------------------------------------------------------------


async def test_ttl_expires_old_messages_and_keeps_fresh_ones(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "message_ttl_in_seconds", 60)
        topic = await _topic_with_subscription(service)
        old = await _fill(service, 7, publish_time_ms=now_ms() - 120_000)
        await _fill(service, 6)
        subscription = topic.subscriptions["sub"]
        assert subscription.backlog() == 13
        done = await service.run_maintenance(force=True)
        assert done["expired"] == 7
        assert subscription.cursor.mark_delete_position == old[-1]
        assert subscription.backlog() == 6
        assert subscription.total_msg_expired == 7
        # Nothing more is old enough.
        done = await service.run_maintenance(force=True)
        assert done["expired"] == 0
        assert subscription.backlog() == 6


async def test_ttl_expires_over_acknowledgement_holes_and_after_a_restart(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "message_ttl_in_seconds", 60)
        topic = await _topic_with_subscription(service)
        old = await _fill(service, 8, publish_time_ms=now_ms() - 3_600_000)
        fresh = await _fill(service, 4)
        subscription = topic.subscriptions["sub"]
        await subscription.acknowledge(None, 0, [(p.ledger_id, p.entry_id, None)
                                                 for p in (old[2], old[5], fresh[1])])
        assert subscription.backlog() == 9

        service = await env.restart()  # the topic is loaded again (MessageTTLTest)
        topic = await service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        subscription = topic.subscriptions["sub"]
        assert subscription.backlog() == 9
        await service.run_maintenance(force=True)
        assert subscription.cursor.mark_delete_position == old[-1]
        assert subscription.backlog() == 3  # fresh ones, one of them acked


async def test_ttl_expires_whole_closed_ledgers_by_their_close_time(tmp_path: Path) -> None:
    """§7.2's first step: closed ledgers whose close time is older than the TTL expire as a
    whole, even when the publish times inside claim to be fresh (a producer clock running
    ahead); the open ledger is left to the publish-time search."""
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "message_ttl_in_seconds", 60)
        topic = await _topic_with_subscription(service)
        ahead = now_ms() + 3 * 3_600_000  # publish times three hours in the future
        positions = await _fill(service, 12, publish_time_ms=ahead)
        closed = [ledger for ledger in topic.managed_ledger.ledgers()[:-1]
                  if ledger.entries > 0]
        assert len(closed) == 2  # 5 + 5 entries closed, 2 in the open ledger
        subscription = topic.subscriptions["sub"]
        done = await service.run_maintenance(force=True)
        assert done["expired"] == 0  # by the service's clock nothing is old yet
        real_clock = service.clock
        service.clock = lambda: real_clock() + 2 * 3600  # two hours pass
        done = await service.run_maintenance(force=True)
        assert done["expired"] == 10
        assert subscription.cursor.mark_delete_position == positions[9]
        assert subscription.backlog() == 2


async def test_ttl_off_expires_nothing(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic = await _topic_with_subscription(service)
        await _fill(service, 3, publish_time_ms=now_ms() - 3_600_000)
        done = await service.run_maintenance(force=True)
        assert done["expired"] == 0
        assert topic.subscriptions["sub"].backlog() == 3


# -- backlog quotas ---------------------------------------------------------------------------


def _quota(limit_bytes: int, policy: str) -> dict[str, Any]:
    return {"destination_storage": {"limitSize": limit_bytes, "limitTime": -1,
                                    "policy": policy}}


@pytest.mark.parametrize(("policy", "error"), [
    ("producer_request_hold", ProducerBlockedQuotaExceededError),
    ("producer_exception", ProducerBlockedQuotaExceededException),
])
async def test_producer_quota_policies_block_and_drop_producers(tmp_path: Path, policy: str,
                                                          error: type[Exception]) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "backlog_quota_map", _quota(1000, policy))
        topic = await _topic_with_subscription(service)
        _, connected = await service.create_producer(TOPIC, ProducerSpec("connected"))
        positions = await _fill(service, 20)
        assert topic.estimated_backlog_bytes() > 1000
        assert topic.backlog_quota_exceeded()

        with pytest.raises(error, match="backlog quota exceeded"):
            await service.create_producer(TOPIC, ProducerSpec("newcomer"))
        assert "newcomer" not in topic.producers

        done = await service.run_maintenance(force=True)
        assert done["producers_disconnected"] == 2  # "connected" and the filler
        assert topic.producers == {}
        with pytest.raises(TopicTerminatedError):
            await publish(topic, connected, b"after")

        # Once the backlog is consumed, producers are admitted again.
        await topic.subscriptions["sub"].acknowledge(
            None, 0, [(p.ledger_id, p.entry_id, None) for p in positions])
        assert not topic.backlog_quota_exceeded()
        _, again = await service.create_producer(TOPIC, ProducerSpec("connected"))
        assert (await publish(topic, again, b"ok"))[0] >= 0


async def test_consumer_backlog_eviction_keeps_the_backlog_under_the_limit(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        limit = 1500
        await _set_policy(service, "backlog_quota_map",
                          _quota(limit, "consumer_backlog_eviction"))
        topic = await _topic_with_subscription(service, "slow")
        await topic.create_subscription("fast", "earliest")
        positions = await _fill(service, 40)
        fast = topic.subscriptions["fast"]
        await fast.acknowledge(None, 0, [(p.ledger_id, p.entry_id, None)
                                         for p in positions[:30]])
        assert topic.estimated_backlog_bytes() > limit
        # Eviction does not block producers.
        await service.create_producer(TOPIC, ProducerSpec("still-welcome"))

        done = await service.run_maintenance(force=True)
        assert done["evicted"] > 0
        assert done["producers_disconnected"] == 0
        assert topic.estimated_backlog_bytes() <= limit
        slow = topic.subscriptions["slow"]
        assert 0 < slow.backlog() < 40
        # The newest entries are kept; the "fast" subscription's own position is untouched.
        assert slow.cursor.mark_delete_position < positions[-1]
        assert fast.backlog() == 10
        assert "still-welcome" in topic.producers


async def test_readers_do_not_count_toward_the_backlog_quota(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "backlog_quota_map",
                          _quota(500, "producer_request_hold"))
        sink = RecordingSink()
        topic, _ = await service.subscribe(TOPIC, SubscribeSpec(
            "reader-1", "Exclusive", "r", initial_position="earliest", durable=False), sink)
        assert isinstance(topic, PersistentTopic)
        await _fill(service, 20)
        assert topic.estimated_backlog_bytes() == 0
        assert not topic.backlog_quota_exceeded()
        await service.create_producer(TOPIC, ProducerSpec("welcome"))
        done = await service.run_maintenance(force=True)
        assert done["producers_disconnected"] == 0
        assert set(topic.producers) == {"filler", "welcome"}


async def test_ttl_boundary_is_strictly_older_than_the_ttl(tmp_path: Path) -> None:
    """§7.2: an entry expires when now > publish_time + ttl; one published a little less
    than the TTL ago stays."""

    async with broker_env(tmp_path) as env:
        service = env.service
        await _set_policy(service, "message_ttl_in_seconds", 60)
        topic = await _topic_with_subscription(service)
        old = await _fill(service, 2, publish_time_ms=now_ms() - 60_001)
        await _fill(service, 2, publish_time_ms=now_ms() - 55_000)
        await service.run_maintenance(force=True)
        subscription = topic.subscriptions["sub"]
        assert subscription.cursor.mark_delete_position == old[-1]
        assert subscription.backlog() == 2


# -- the message_age backlog quota ------------------------------------------------------------


def _age_quota(limit_s: int, policy: str) -> dict[str, Any]:
    return {"message_age": {"limitTime": limit_s, "policy": policy}}


async def test_message_age_quota_blocks_producers_only_while_old_messages_wait(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "backlog_quota_map",
                          _age_quota(60, "producer_exception"))
        topic = await _topic_with_subscription(service)
        assert not topic.backlog_quota_exceeded()  # nothing waits
        await service.create_producer(TOPIC, ProducerSpec("before-backlog"))
        old = await _fill(service, 2, publish_time_ms=now_ms() - 120_000)
        await _fill(service, 3)  # fresh ones behind the old ones
        assert topic.exceeded_backlog_quota() == "producer_exception"
        with pytest.raises(ProducerBlockedQuotaExceededException):
            await service.create_producer(TOPIC, ProducerSpec("blocked"))
        # Acknowledge everything: no unacknowledged message is old any more.
        subscription = topic.subscriptions["sub"]
        await subscription.clear_backlog()
        assert topic.oldest_unacked_publish_time() is None
        await service.create_producer(TOPIC, ProducerSpec("after-catch-up"))
        assert old  # the old entries existed and were acknowledged by the clear


async def test_message_age_quota_eviction_expires_old_messages(tmp_path: Path) -> None:
    async with broker_env(tmp_path, **SMALL_LEDGERS) as env:
        service = env.service
        await _set_policy(service, "backlog_quota_map",
                          _age_quota(60, "consumer_backlog_eviction"))
        topic = await _topic_with_subscription(service)
        await _fill(service, 4, publish_time_ms=now_ms() - 120_000)
        await _fill(service, 3)
        subscription = topic.subscriptions["sub"]
        assert subscription.backlog() == 7
        done = await service.run_maintenance(force=True)
        assert done["evicted"] == 4
        assert subscription.backlog() == 3
        assert not topic.backlog_quota_exceeded()
