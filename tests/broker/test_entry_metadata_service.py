"""Broker entry metadata in the service (`broker_entry_metadata_interceptors`): stored entries
carry the 0x0e02 block, the index counts messages across ledgers, restarts and crashes, and
the entry's time for TTL and the message-age quota is the broker's timestamp (upstream's
`getEntryTimestamp`), not the producer's publish time."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.broker import BrokerService, PersistentTopic, ProducerSpec
from magnetar.codec import parse_entry, split_broker_entry_metadata

from .helpers import broker_env, make_batch_entry, make_entry, now_ms

TOPIC = "persistent://public/default/entry-metadata"
BOTH = ("timestamp", "index")
SMALL_LEDGERS = {"managed_ledger_max_entries_per_ledger": 2,
                 "managed_ledger_min_ledger_rollover_time_s": 0}


async def _publish(service: BrokerService, sizes: list[int], publish_time_ms: int | None = None,
                   ) -> PersistentTopic:
    """One entry per size (a batch when > 1), in order."""
    topic = await service.get_topic(TOPIC)
    assert isinstance(topic, PersistentTopic)
    producer = topic.producers.get("p") or topic.add_producer(ProducerSpec("p"))
    for size in sizes:
        if size == 1:
            metadata, entry = make_entry(b"x", producer_name="p", publish_time_ms=publish_time_ms)
        else:
            metadata, entry = make_batch_entry([b"y"] * size, producer_name="p",
                                               publish_time_ms=publish_time_ms)
        await topic.publish(producer, entry, 0, 0, metadata)
    return topic


def _indexes(topic: PersistentTopic) -> list[int]:
    ml = topic.managed_ledger
    found = []
    for ledger in ml.ledgers():
        for entry_id in range(ledger.entries):
            data = ml.storage.read_entry(ledger.ledger_id, entry_id)
            block = parse_entry(data).broker_entry_metadata
            assert block is not None, "every stored entry carries the block"
            found.append(block.index)
    return found


async def test_index_counts_messages_across_ledgers_restarts_and_crashes(tmp_path: Path) -> None:
    async with broker_env(tmp_path, broker_entry_metadata_interceptors=BOTH,
                          **SMALL_LEDGERS) as env:
        kept = await env.service.get_topic(TOPIC)  # a subscription keeps the ledgers
        assert isinstance(kept, PersistentTopic)
        await kept.create_subscription("keep", "earliest")
        before = now_ms()
        topic = await _publish(env.service, [3, 1, 2])
        assert _indexes(topic) == [2, 3, 5]
        ml = topic.managed_ledger
        assert len([ledger for ledger in ml.ledgers() if ledger.entries]) == 2
        first = ml.ledgers()[0]
        block, rest = split_broker_entry_metadata(ml.storage.read_entry(first.ledger_id, 0))
        assert block is not None
        assert before <= block.broker_timestamp <= now_ms()
        assert parse_entry(rest).metadata.num_messages_in_batch == 3
        topic = await _publish(await env.restart(), [1])
        assert _indexes(topic) == [2, 3, 5, 6]
        topic = await _publish(await env.crash(), [4])
        assert _indexes(topic) == [2, 3, 5, 6, 10]


@pytest.mark.parametrize(("interceptors", "expired"), [(BOTH, 0), ((), 5)])
async def test_ttl_uses_the_broker_timestamp_when_entries_carry_one(
        tmp_path: Path, interceptors: tuple[str, ...], expired: int) -> None:
    async with broker_env(tmp_path, broker_entry_metadata_interceptors=interceptors) as env:
        topic = await env.service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        await topic.create_subscription("sub", "earliest")
        # The producer's clock says two minutes ago; the broker stores them now.
        await _publish(env.service, [1, 2, 1, 1, 3], publish_time_ms=now_ms() - 120_000)
        subscription = topic.subscriptions["sub"]
        assert await subscription.expire_messages(60) == expired
        oldest = topic.oldest_unacked_publish_time()
        assert (oldest is not None) == (expired == 0)
        if oldest is not None:
            assert oldest >= now_ms() - 60_000, "the broker's time, not the producer's"
