"""Message deduplication end to end through `BrokerService` (broker reference §5, §11 items
35-37): duplicates answered (-1, -1) and not stored, UNKNOWN while in flight, the client's
discontinuous-sequence example, `last_sequence_id` for a reconnecting producer, and the state
surviving a clean restart and a crash (snapshot in the `pulsar.dedup` cursor plus a replay of
the tail). Entries are counted in the managed ledger, so a second copy cannot hide."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.broker import PersistenceError, PersistentTopic, Position, ProducerSpec, SubscribeSpec
from magnetar.broker.topics._dedup import DEDUP_CURSOR_NAME
from magnetar.broker.topics._service import BrokerService

from .helpers import RecordingSink, broker_env, make_batch_entry, publish, settle, wait_for

NAMESPACE = "public/default"
TOPIC = "persistent://public/default/dedup"


async def _topic(service: BrokerService, name: str = TOPIC) -> PersistentTopic:
    topic = await service.get_topic(name)
    assert isinstance(topic, PersistentTopic)
    return topic


def _entries(topic: PersistentTopic) -> int:
    return topic.managed_ledger.number_of_entries


async def _keep(topic: PersistentTopic) -> None:
    """A durable subscription at the start, so that no ledger is trimmed and every stored
    copy stays countable (without one, retention 0 may delete consumed ledgers)."""
    await topic.create_subscription("keep", "earliest")


async def _send(topic: PersistentTopic, producer: object, sequence_id: int) -> tuple[int, int]:
    return await publish(topic, producer, f"m{sequence_id}".encode(),  # type: ignore[arg-type]
                         sequence_id=sequence_id)


async def test_duplicates_are_answered_minus_one_and_not_stored(tmp_path: Path) -> None:
    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        topic, producer = await env.service.create_producer(TOPIC, ProducerSpec("p1"))
        receipts = [await _send(topic, producer, i) for i in range(5)]
        assert all(r[0] >= 0 and r[1] >= 0 for r in receipts)
        assert len(set(receipts)) == 5
        for sequence_id in (0, 2, 4):
            assert await _send(topic, producer, sequence_id) == (-1, -1)
        assert _entries(topic) == 5
        assert await _send(topic, producer, 5) != (-1, -1)
        assert _entries(topic) == 6
        assert topic.last_sequence_id(producer) == 5


async def test_dedup_off_by_default_stores_every_copy(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await env.service.create_producer(TOPIC, ProducerSpec("p1"))
        for _ in range(3):
            assert await _send(topic, producer, 0) != (-1, -1)
        assert _entries(topic) == 3
        assert topic.last_sequence_id(producer) == -1  # always -1 without dedup
        assert DEDUP_CURSOR_NAME not in topic.managed_ledger.cursors


async def test_namespace_policy_switches_dedup_on_and_off(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        await _send(topic, producer, 0)
        service.namespaces.set_policy(NAMESPACE, "deduplicationEnabled", True)
        await service.policies_changed(NAMESPACE)
        assert topic.dedup is not None
        assert DEDUP_CURSOR_NAME in topic.managed_ledger.cursors
        assert DEDUP_CURSOR_NAME not in topic.subscriptions  # never a user subscription
        # The state was recovered from the entries already written.
        assert await _send(topic, producer, 0) == (-1, -1)
        assert await _send(topic, producer, 1) != (-1, -1)
        assert _entries(topic) == 2

        service.namespaces.set_policy(NAMESPACE, "deduplicationEnabled", False)
        await service.policies_changed(NAMESPACE)
        assert topic.dedup is None
        assert DEDUP_CURSOR_NAME not in topic.managed_ledger.cursors
        assert await _send(topic, producer, 1) != (-1, -1)
        assert _entries(topic) == 3


async def test_in_flight_sequence_id_is_unknown_persistence_error(tmp_path: Path) -> None:
    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        topic, producer = await env.service.create_producer(TOPIC, ProducerSpec("p1"))
        await _send(topic, producer, 0)
        first = asyncio.ensure_future(_send(topic, producer, 1))
        await asyncio.sleep(0)  # the first send is checked and waits for its write
        assert topic.dedup is not None
        assert topic.dedup.highest_pushed("p1") == 1
        assert topic.dedup.highest_persisted("p1") == 0
        with pytest.raises(PersistenceError,
                           match="Cannot determine whether the message is a duplicate"):
            await _send(topic, producer, 1)
        assert (await first) != (-1, -1)
        assert await _send(topic, producer, 1) == (-1, -1)  # now known: a duplicate
        assert _entries(topic) == 2


async def test_discontinuous_sequence_ids_then_restart(tmp_path: Path) -> None:
    """ClientDeduplicationTest.testProducerDeduplicationWithDiscontinuousSequenceId: batch
    {2, 3, 5} accepted; then 2 (dup), 4 (dup, 4 <= 5) and 6 (new): the consumer sees 4
    messages, and after a restart the producer's last sequence id is 6."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        service = env.service
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"), sink)
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        metadata, entry = make_batch_entry([b"m2", b"m3", b"m5"], sequence_id=2,
                                           producer_name="p1")
        batch = await topic.publish(producer, entry, 2, 5, metadata)
        assert not batch.duplicate
        assert await _send(topic, producer, 2) == (-1, -1)
        assert await _send(topic, producer, 4) == (-1, -1)
        assert await _send(topic, producer, 6) != (-1, -1)
        assert _entries(topic) == 2
        topic.subscriptions["sub"].flow(consumer, 100)
        await wait_for(lambda: len(sink.messages(consumer)) >= 4)
        await settle(service)
        # The batch was built with consecutive ids; what matters is 3 + 1 messages.
        assert len(sink.messages(consumer)) == 4
        assert sink.messages(consumer)[-1] == b"m6"

        service = await env.restart()
        topic = await _topic(service)
        producer = topic.add_producer(ProducerSpec("p1"))
        assert topic.last_sequence_id(producer) == 6
        assert await _send(topic, producer, 6) == (-1, -1)
        assert _entries(topic) == 2


async def test_reconnecting_producer_learns_its_last_sequence_id(tmp_path: Path) -> None:
    """testProducerSequenceAfterReconnect: after 0..9 a producer with the same name sees 9."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        service = env.service
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        assert topic.last_sequence_id(producer) == -1
        for i in range(10):
            await _send(topic, producer, i)
        topic.remove_producer(producer)
        _, again = await service.create_producer(TOPIC, ProducerSpec("p1"))
        assert topic.last_sequence_id(again) == 9
        _, other = await service.create_producer(TOPIC, ProducerSpec("p2"))
        assert topic.last_sequence_id(other) == -1


async def test_dedup_state_survives_a_clean_restart(tmp_path: Path) -> None:
    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        topic, producer = await env.service.create_producer(TOPIC, ProducerSpec("p1"))
        await _keep(topic)
        for i in range(10):
            await _send(topic, producer, i)
        service = await env.restart()
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        assert topic.last_sequence_id(producer) == 9
        for i in range(10):
            assert await _send(topic, producer, i) == (-1, -1)
        assert _entries(topic) == 10
        assert await _send(topic, producer, 10) != (-1, -1)
        assert _entries(topic) == 11


async def test_dedup_state_survives_a_crash(tmp_path: Path) -> None:
    """Every send that returned before the crash is a duplicate after it, never a second
    copy, whether it is covered by a snapshot or only by the replayed tail."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True,
                          broker_deduplication_entries_interval=7) as env:
        topic, producer = await env.service.create_producer(TOPIC, ProducerSpec("p1"))
        await _keep(topic)
        for i in range(10):
            await _send(topic, producer, i)
        service = await env.crash()
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        assert topic.last_sequence_id(producer) == 9
        for i in range(10):
            assert await _send(topic, producer, i) == (-1, -1)
        assert _entries(topic) == 10
        assert await _send(topic, producer, 10) != (-1, -1)

        service = await env.crash()
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        assert topic.last_sequence_id(producer) == 10
        assert await _send(topic, producer, 10) == (-1, -1)
        assert _entries(topic) == 11


async def test_crash_after_concurrent_sends_across_snapshots_never_stores_twice(
        tmp_path: Path) -> None:
    """Many sends in flight at once, several snapshots taken meanwhile, then a crash: a
    resend of every acknowledged id is a duplicate."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True,
                          broker_deduplication_entries_interval=50) as env:
        service = env.service
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        _, other = await service.create_producer(TOPIC, ProducerSpec("p2"))
        await _keep(topic)
        sends = []
        for i in range(400):
            sends.append(_send(topic, producer, i))
            sends.append(_send(topic, other, i))
        receipts = await asyncio.gather(*sends)
        assert all(r != (-1, -1) for r in receipts)
        await settle(service)
        service = await env.crash()
        topic = await _topic(service)
        assert _entries(topic) == 800
        again = topic.add_producer(ProducerSpec("p1"))
        again_other = topic.add_producer(ProducerSpec("p2"))
        assert topic.last_sequence_id(again) == 399
        assert topic.last_sequence_id(again_other) == 399
        for i in range(0, 400, 7):
            assert await _send(topic, again, i) == (-1, -1)
            assert await _send(topic, again_other, i) == (-1, -1)
        assert _entries(topic) == 800


async def test_system_topics_never_deduplicate(tmp_path: Path) -> None:
    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        name = "persistent://public/default/__change_events"
        topic, producer = await env.service.create_producer(name, ProducerSpec("p1"))
        assert isinstance(topic, PersistentTopic)
        assert topic.name.is_system_topic
        assert topic.dedup is None
        assert await _send(topic, producer, 0) != (-1, -1)
        assert await _send(topic, producer, 0) != (-1, -1)
        assert _entries(topic) == 2
        assert DEDUP_CURSOR_NAME not in topic.managed_ledger.cursors
        assert topic.last_sequence_id(producer) == -1


async def test_snapshot_every_1000_entries_and_restart_replays_the_tail(tmp_path: Path) -> None:
    """§5.3: after `broker_deduplication_entries_interval` (1000) persisted entries the
    pulsar.dedup cursor is mark-deleted at the entry just written, with the per-producer
    state as its properties; recovery replays only the entries after it."""

    async with broker_env(tmp_path, broker_deduplication_enabled=True) as env:
        service = env.service
        assert service.config.broker_deduplication_entries_interval == 1000
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        await _keep(topic)
        dedup_cursor = topic.managed_ledger.cursors[DEDUP_CURSOR_NAME]
        start = dedup_cursor.mark_delete_position
        positions = [await _send(topic, producer, i) for i in range(999)]
        await settle(service)
        assert dedup_cursor.mark_delete_position == start  # no snapshot yet
        positions.append(await _send(topic, producer, 999))
        thousandth = Position(*positions[-1])
        await wait_for(lambda: dedup_cursor.mark_delete_position == thousandth)
        assert dedup_cursor.properties == {"p1": 999}
        for i in range(1000, 1005):
            await _send(topic, producer, i)
        await settle(service)
        assert dedup_cursor.mark_delete_position == thousandth

        service = await env.crash()
        topic = await _topic(service)
        assert topic.dedup is not None
        recovered_cursor = topic.managed_ledger.cursors[DEDUP_CURSOR_NAME]
        assert recovered_cursor.mark_delete_position == thousandth
        assert topic.dedup.entries_since_snapshot == 5  # only the tail was replayed
        assert topic.dedup.highest_persisted("p1") == 1004
        again = topic.add_producer(ProducerSpec("p1"))
        assert await _send(topic, again, 1004) == (-1, -1)
        assert await _send(topic, again, 3) == (-1, -1)
        assert _entries(topic) == 1005

        # A clean close snapshots at the last entry: nothing left to replay.
        service = await env.restart()
        topic = await _topic(service)
        assert topic.dedup is not None
        assert topic.dedup.entries_since_snapshot == 0
        assert topic.managed_ledger.cursors[DEDUP_CURSOR_NAME].properties == {"p1": 1004}


async def test_topic_policy_beats_the_namespace_policy(tmp_path: Path) -> None:
    """TopicDuplicationTest: topic > namespace > broker."""

    async with broker_env(tmp_path) as env:
        service = env.service
        other = "persistent://public/default/other"
        service.namespaces.set_policy(NAMESPACE, "deduplicationEnabled", True)
        service.namespaces.set_topic_policy(TOPIC, "deduplicationEnabled", False)
        topic, producer = await service.create_producer(TOPIC, ProducerSpec("p1"))
        other_topic, other_producer = await service.create_producer(other,
                                                                    ProducerSpec("p1"))
        assert isinstance(topic, PersistentTopic)
        assert isinstance(other_topic, PersistentTopic)
        assert topic.dedup is None
        assert other_topic.dedup is not None
        await _send(topic, producer, 0)
        assert await _send(topic, producer, 0) != (-1, -1)
        await _send(other_topic, other_producer, 0)
        assert await _send(other_topic, other_producer, 0) == (-1, -1)

        service.namespaces.set_topic_policy(TOPIC, "deduplicationEnabled", None)
        await service.policies_changed(NAMESPACE)
        assert topic.dedup is not None  # the namespace's value applies again
        assert await _send(topic, producer, 0) == (-1, -1)
