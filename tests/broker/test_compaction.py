"""Topic compaction through `BrokerService` on the real storage: the compacted view keeps the
latest message per key (tombstones delete, keyless messages go, batches are rewritten with
`compacted_out` flags), `read_compacted` readers and Exclusive consumers see it and then the
live topic, the view survives a restart and a crash, a crash between writing the new ledger
and switching to it leaves the old view in force, and `compactionThreshold` triggers it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.broker import BrokerService, Consumer, PersistentTopic, SubscribeSpec
from magnetar.broker._errors import NotAllowedError
from magnetar.broker.dispatch._consumer import Delivery
from magnetar.broker.ledger._compacted import COMPACTED_LEDGER_TAG
from magnetar.broker.topics._topic import Producer
from magnetar.codec import (
    SingleMessage,
    build_batch,
    build_message,
    encode_entry,
    parse_entry,
    unpack_messages,
)

from .helpers import RecordingSink, broker_env, now_ms, persistent_producer, settle, wait_for

TOPIC = "persistent://public/default/compacted"
NS = "public/default"


async def send(topic: PersistentTopic, producer: Producer, key: str | None,
               value: bytes | None) -> None:
    """One non-batched message; `value` None is a tombstone (null value)."""
    sequence = producer.msg_in_counter
    metadata, payload = build_message(SingleMessage(value, partition_key=key,
                                                    sequence_id=sequence),
                                      producer_name=producer.name, publish_time=now_ms())
    await topic.publish(producer, encode_entry(metadata, payload), sequence, sequence, metadata)


async def send_batch(topic: PersistentTopic, producer: Producer,
                     items: list[tuple[str, bytes | None]]) -> None:
    first = producer.msg_in_counter
    messages = [SingleMessage(value, partition_key=key, sequence_id=first + i)
                for i, (key, value) in enumerate(items)]
    metadata, payload = build_batch(messages, producer_name=producer.name,
                                    publish_time=now_ms())
    await topic.publish(producer, encode_entry(metadata, payload), first,
                        first + len(items) - 1, metadata)


async def compact(topic: PersistentTopic) -> None:
    assert topic.compaction.trigger()
    await topic.compaction.wait()
    assert topic.compaction.status == "SUCCESS", topic.compaction.last_error


class EntrySink(RecordingSink):
    """A `RecordingSink` that also keeps each delivery's entry bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[tuple[int, int], bytes]] = []

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        super().deliver(consumer, deliveries)
        self.entries += [((d.ledger_id, d.entry_id), d.entry) for d in deliveries]

    def live(self) -> list[tuple[str | None, bytes]]:
        """(key, value) of every delivered message that is not compacted out."""
        found = []
        for _, entry in self.entries:
            parsed = parse_entry(entry, verify_checksum=False)
            found.extend((message.partition_key, message.payload or b"")
                         for message in unpack_messages(parsed.metadata, parsed.payload)
                         if not message.compacted_out)
        return found


async def read_view(service: BrokerService, name: str = "reader", count: int = 0,
                    durable: bool = False) -> EntrySink:
    """Subscribe Exclusive with read_compacted from the earliest position (a reader unless
    `durable`) and wait until `count` live messages arrived, then until things settle."""
    sink = EntrySink()
    topic, consumer = await service.subscribe(TOPIC, SubscribeSpec(
        name, "Exclusive", initial_position="earliest", durable=durable,
        start_message_id=None if durable else (-1, -1, -1), read_compacted=True), sink)
    assert isinstance(topic, PersistentTopic)
    (topic.subscriptions if durable else topic.readers)[name].flow(consumer, 10_000)
    await wait_for(lambda: len(sink.live()) >= count)
    await quiet(service)
    return sink


async def quiet(service: BrokerService) -> None:
    """Let dispatch and the compacted reads in worker threads finish what they can."""
    for _ in range(5):
        await settle(service)
        await asyncio.sleep(0.01)


async def populate(topic: PersistentTopic, producer: Producer) -> None:
    """k0..k3 written twice; k1 deleted by a tombstone, k2 by an empty value; a keyless
    message. Latest: k0=v0b, k3=v3b."""
    for round_ in ("a", "b"):
        for i in range(4):
            await send(topic, producer, f"k{i}", f"v{i}{round_}".encode())
    await send(topic, producer, "k1", None)
    await send(topic, producer, "k2", b"")
    await send(topic, producer, None, b"no key")


EXPECTED = [("k0", b"v0b"), ("k3", b"v3b")]


def compacted_ledgers(env_storage: object) -> list[int]:
    return [info.ledger_id for info in env_storage.list_ledgers()  # type: ignore[attr-defined]
            if info.metadata.get(COMPACTED_LEDGER_TAG)]


async def test_the_view_keeps_the_latest_value_per_key_then_the_live_tail(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        assert topic.compaction.status == "NOT_RUN"
        await populate(topic, producer)
        await compact(topic)
        sink = await read_view(env.service, count=2)
        assert sink.live() == EXPECTED
        await send(topic, producer, "k0", b"live")
        await wait_for(lambda: len(sink.live()) == 3)
        assert sink.live()[-1] == ("k0", b"live")
        plain = EntrySink()  # without read_compacted: the whole topic
        _, consumer = await env.service.subscribe(TOPIC, SubscribeSpec(
            "all", "Exclusive", initial_position="earliest"), plain)
        topic.subscriptions["all"].flow(consumer, 10_000)
        await wait_for(lambda: len(plain.live()) == 12)


async def test_batches_keep_only_their_latest_messages_flagged_as_pulsar_does(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        await send_batch(topic, producer, [("a", b"a1"), ("b", b"b1"), ("c", b"c1")])
        await send_batch(topic, producer, [("a", b"a2"), ("c", None), ("d", b"d1")])
        await compact(topic)
        sink = await read_view(env.service, count=3)
        assert sink.live() == [("b", b"b1"), ("a", b"a2"), ("d", b"d1")]
        first = parse_entry(sink.entries[0][1])  # the checksum is rewritten too
        flags = [m.compacted_out for m in unpack_messages(first.metadata, first.payload)]
        assert flags == [True, False, True]  # same size and indexes, dropped ones flagged


async def test_exclusive_consumer_and_a_second_compaction_merging_the_first(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        await populate(topic, producer)
        await compact(topic)
        assert topic.compaction.view is not None
        first_ledger = topic.compaction.view.ledger_id
        await send(topic, producer, "k3", None)
        await send(topic, producer, "k5", b"v5")
        await compact(topic)
        assert topic.compaction.view.ledger_id != first_ledger
        await wait_for(lambda: compacted_ledgers(env.storage) == [
            topic.compaction.view.ledger_id if topic.compaction.view else -1])
        sink = await read_view(env.service, "durable-sub", count=2, durable=True)
        assert sink.live() == [("k0", b"v0b"), ("k5", b"v5")]


async def test_shared_subscriptions_cannot_read_compacted(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        await persistent_producer(env.service, TOPIC)
        with pytest.raises(NotAllowedError, match="exclusive or failover"):
            await env.service.subscribe(TOPIC, SubscribeSpec(
                "s", "Shared", read_compacted=True), RecordingSink())
        with pytest.raises(NotAllowedError, match="reserved"):
            await env.service.subscribe(TOPIC, SubscribeSpec("__compaction", "Exclusive"),
                                        RecordingSink())


@pytest.mark.parametrize("how", ["restart", "crash"])
async def test_the_view_survives_a_restart_and_a_crash(tmp_path: Path, how: str) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        await populate(topic, producer)
        await compact(topic)
        service = await (env.restart() if how == "restart" else env.crash())
        sink = await read_view(service, count=2)
        assert sink.live() == EXPECTED


async def test_a_crash_before_the_switch_leaves_the_old_view_and_no_orphan(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        await populate(topic, producer)
        await compact(topic)
        old = topic.compaction.view
        assert old is not None
        await send(topic, producer, "k0", b"newer")
        reached = asyncio.Event()

        async def hang() -> None:  # the new ledger is durable; the crash comes now
            reached.set()
            await asyncio.Event().wait()

        topic.compaction.before_switch = hang
        assert topic.compaction.trigger()
        await asyncio.wait_for(reached.wait(), 5)
        assert len(compacted_ledgers(env.storage)) == 2  # the old view and the new ledger
        service = await env.crash()
        reloaded = await service.get_topic(TOPIC)
        assert isinstance(reloaded, PersistentTopic)
        assert reloaded.compaction.view is not None
        assert reloaded.compaction.view.ledger_id == old.ledger_id
        assert compacted_ledgers(env.storage) == [old.ledger_id]  # the orphan is gone
        sink = await read_view(service, count=3)
        assert sink.live() == [*EXPECTED, ("k0", b"newer")]  # old view, then the tail


async def test_a_failed_compaction_reports_error_and_keeps_the_old_view(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        await populate(topic, producer)
        await compact(topic)
        old = topic.compaction.view
        assert old is not None
        await send(topic, producer, "k9", b"v9")

        async def fail() -> None:
            raise OSError("scripted failure before the switch")

        topic.compaction.before_switch = fail
        assert topic.compaction.trigger()
        assert not topic.compaction.trigger()  # one at a time
        await topic.compaction.wait()
        assert topic.compaction.stats() == {
            "status": "ERROR", "lastError": "OSError: scripted failure before the switch"}
        assert topic.compaction.view is old
        assert compacted_ledgers(env.storage) == [old.ledger_id]


async def test_trimmed_ledgers_stay_readable_through_the_view(tmp_path: Path) -> None:
    async with broker_env(tmp_path, managed_ledger_max_entries_per_ledger=3,
                          managed_ledger_min_ledger_rollover_time_s=0) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        await topic.create_subscription("holder", "earliest")  # keeps all until compacted
        await populate(topic, producer)
        first = topic.managed_ledger.ledgers()[0].ledger_id
        await compact(topic)
        await topic.unsubscribe("holder")  # trims up to the horizon
        assert topic.managed_ledger.ledgers()[0].ledger_id != first  # the compacted part went
        sink = await read_view(env.service, count=2)
        assert sink.live() == EXPECTED


async def test_the_compaction_threshold_triggers_it_in_maintenance(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic, producer = await persistent_producer(env.service, TOPIC)
        env.service.namespaces.set_policy(NS, "compaction_threshold", 300)
        await env.service.policies_changed(NS)
        await send(topic, producer, "k", b"small")
        assert (await env.service.run_maintenance(force=True))["compactions"] == 0
        await populate(topic, producer)
        assert (await env.service.run_maintenance(force=True))["compactions"] == 1
        await topic.compaction.wait()
        assert topic.compaction.status == "SUCCESS"
        assert topic.compaction.backlog_bytes() == 0
