"""Creating a topic costs the same however many exist (issue 14, target 5): what the broker
reads or writes when the N-th topic is created or loaded is counted, and must not grow with
N. Deterministic counts, not timings (the timings: benchmarks/e2e_many_topics.py, run by
bench_e2e.py)."""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import BrokerService, PersistentTopic
from magnetar.broker._names import topics_hash
from magnetar.broker._rates import RateMeter
from magnetar.broker.ledger._managed_ledger import ml_key
from magnetar.broker.wire import _topic_watchers
from magnetar.codec import pb
from magnetar.storage import Storage
from magnetar.storage._ledger import LedgerInfo, LedgerState
from tests.broker.helpers import broker_env, persistent_producer, publish_many

NS = "public/default"
EXISTING = 40  # topics created before the one whose cost is counted


class _Counter:
    def __init__(self) -> None:
        self.calls = 0


def _count_ledger_reads(monkeypatch: pytest.MonkeyPatch) -> _Counter:
    """Count the storage's reads of one ledger's state (`LedgerState.info`)."""
    counter = _Counter()
    info = LedgerState.info

    def counted(ledger: LedgerState) -> LedgerInfo:
        counter.calls += 1
        return info(ledger)

    monkeypatch.setattr(LedgerState, "info", counted)
    return counter


async def _create(service: BrokerService, index: int) -> None:
    await service.get_topic(f"persistent://{NS}/t-{index}")


async def test_creating_a_topic_reads_no_other_topics_ledgers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic's load looks for its orphan ledgers (its managed ledger's and its compacted
    ones) among its own, not among every topic's (it read all N ledgers twice)."""
    async with broker_env(tmp_path) as env:
        for index in range(EXISTING):
            await _create(env.service, index)
        reads = _count_ledger_reads(monkeypatch)
        await _create(env.service, EXISTING)
        assert reads.calls <= 2


async def test_the_stats_interval_walks_only_topics_that_may_have_moved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle topics (no producer, no consumer, zero rates) leave the stats pass after one
    interval; a producer brings its topic back (every loaded topic's meters were updated
    each interval)."""
    async with broker_env(tmp_path) as env:
        service = env.service
        for index in range(EXISTING):
            await _create(service, index)
        start = time.monotonic()
        service.update_stats(start + 1)
        assert len(service.stats_interval) == 0
        topic, producer = await persistent_producer(service, f"persistent://{NS}/t-0")
        assert len(service.stats_interval) == 1
        updates = 0
        update = RateMeter.update

        def counted(meter: RateMeter, now: float, count: int, value: int) -> None:
            nonlocal updates
            updates += 1
            update(meter, now, count, value)

        monkeypatch.setattr(RateMeter, "update", counted)
        service.update_stats(start + 2)
        assert updates == 3  # the topic's in and out, its producer's in
        assert len(service.stats_interval) == 1  # it has a producer
        topic.remove_producer(producer)


async def test_a_topic_busy_again_is_measured_over_one_interval(tmp_path: Path) -> None:
    """A topic left out of the stats pass while idle, then busy again, shows the rate of
    the last interval only (not its messages spread over the time it was idle)."""
    async with broker_env(tmp_path) as env:
        service = env.service
        name = f"persistent://{NS}/busy-again"
        topic, producer = await persistent_producer(service, name)
        start = time.monotonic()
        service.update_stats(start)
        topic.remove_producer(producer)
        service.update_stats(start + 1)  # idle: left out from now on
        service.update_stats(start + 2)
        service.update_stats(start + 3)
        assert len(service.stats_interval) == 0
        topic, producer = await persistent_producer(service, name)
        await publish_many(topic, producer, 4)
        service.update_stats(start + 5)
        assert topic.rate_in.rate == 2.0  # 4 messages over the 2 s interval since start + 3
        assert producer.rate_in.rate > 0


async def test_topics_with_the_same_policies_share_their_resolved_policies(
        tmp_path: Path) -> None:
    """Two topics of one namespace hold one `EffectivePolicies` and one managed-ledger
    config between them; a topic-level policy gives its topic its own."""
    async with broker_env(tmp_path) as env:
        service = env.service
        service.namespaces.set_topic_policy(f"persistent://{NS}/own", "message_ttl_in_seconds",
                                            60)
        a, b, own = [await service.get_topic(f"persistent://{NS}/{name}")
                     for name in ("a", "b", "own")]
        assert isinstance(a, PersistentTopic)
        assert isinstance(b, PersistentTopic)
        assert isinstance(own, PersistentTopic)
        assert a.policies is b.policies
        assert a.managed_ledger.config is b.managed_ledger.config
        assert own.policies is not a.policies
        assert own.policies.message_ttl_s == 60


TOPIC_BYTES_MAX = 6 * 1024  # Python heap per idle loaded topic (about 5.1 KB measured)


async def test_an_idle_loaded_topic_holds_a_bounded_heap(tmp_path: Path) -> None:
    """The Python heap a loaded topic holds (its subscription, one message published, no
    producer or consumer left), traced over many topics: a guard against per-topic buffers
    and preallocated containers (an empty deque, set and copied policies took 2 KB)."""
    count = 50
    async with broker_env(tmp_path) as env:
        service = env.service
        for index in range(10):  # caches and pools warm
            await _create_with_message(service, f"warm-{index}")
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for index in range(count):
                await _create_with_message(service, f"t-{index}")
            for _ in range(2):  # the first interval measures the publishes, the second none
                service.stats_interval.close(time.monotonic(), service.topics)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert grown / count <= TOPIC_BYTES_MAX


async def _create_with_message(service: BrokerService, local: str) -> None:
    name = f"persistent://{NS}/{local}"
    topic = await service.get_topic(name)
    assert isinstance(topic, PersistentTopic)
    await topic.create_subscription("s", "earliest")
    topic, producer = await persistent_producer(service, name, f"p-{local}")
    await publish_many(topic, producer, 1)
    topic.remove_producer(producer)


async def test_closing_the_broker_commits_the_records_of_its_topics_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's close journals every closed managed ledger's record in one metadata
    write (it took one durable commit per topic), and the records are there after a
    restart: each lists the ledger its message went to, closed with that one entry."""
    async with broker_env(tmp_path) as env:
        for index in range(EXISTING):
            await _create_with_message(env.service, f"t-{index}")
        storage = env.service.storage
        record_writes: list[int] = []
        apply_journaled = type(storage.metadata).apply_journaled

        def counted(metadata: Any, ops: list[tuple[bytes, bytes | None]]) -> Any:
            records = sum(key.startswith(b"ml/") for key, _ in ops)
            if records:
                record_writes.append(records)
            return apply_journaled(metadata, ops)

        monkeypatch.setattr(type(storage.metadata), "apply_journaled", counted)
        await env.service.close()
        monkeypatch.undo()
        assert record_writes == [EXISTING]
    with Storage.open(tmp_path) as storage:
        for index in range(EXISTING):
            raw = storage.metadata.get(ml_key(f"{NS}/persistent/t-{index}"))
            assert raw is not None
            ledgers = json.loads(raw)["ledgers"]
            assert [ledger["entries"] for ledger in ledgers] == [1]
            assert ledgers[0]["timestamp_ms"] > 0  # closed


async def test_closing_the_broker_runs_no_cyclic_collection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's close keeps the cyclic GC off while it closes its topics (each full
    collection walked every loaded topic's objects: seconds at 100,000 topics), and turns it
    back on after."""
    closing = [0]
    collections: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and closing[0]:
            collections.append(info["generation"])

    close_topic = BrokerService._close_topic

    async def counted(topic: Any) -> None:
        closing[0] += 1
        try:
            await close_topic(topic)
        finally:
            closing[0] -= 1

    async with broker_env(tmp_path) as env:
        for index in range(3):
            await _create_with_message(env.service, f"t-{index}")
        monkeypatch.setattr(BrokerService, "_close_topic", staticmethod(counted))
        thresholds = gc.get_threshold()
        gc.set_threshold(1, 1, 1)  # a collection at nearly every allocation
        gc.callbacks.append(record)
        try:
            await env.service.close()
        finally:
            gc.callbacks.remove(record)
            gc.set_threshold(*thresholds)
        assert gc.isenabled()
    assert collections == []


async def test_a_topic_list_watcher_hashes_without_sorting_every_topic_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic created under a watcher costs the watcher a few order-key computations (an
    insertion into its ordered list), not one per topic it lists (it sorted them all for
    the hash of each update); the hash is still that of the whole sorted list."""
    async with broker_env(tmp_path) as env:
        for index in range(EXISTING):
            await _create(env.service, index)
        sent: list[object] = []
        watchers = _topic_watchers.TopicListWatchers(env.service, lambda m: sent.append(m) or True,
                                                    "test")
        watchers.watch(pb.CommandWatchTopicList(request_id=1, watcher_id=1, namespace=NS,
                                                topics_pattern=f"persistent://{NS}/t-.*"))
        keys = 0
        order = _topic_watchers._java_string_order

        def counted(name: str) -> bytes:
            nonlocal keys
            keys += 1
            return order(name)

        monkeypatch.setattr(_topic_watchers, "_java_string_order", counted)
        await _create(env.service, EXISTING)
        assert keys <= 10  # log2 of 41, and the new name's own
        update = sent[-1]
        assert isinstance(update, pb.CommandWatchTopicUpdate)
        assert list(update.new_topics) == [f"persistent://{NS}/t-{EXISTING}"]
        assert update.topics_hash == topics_hash(
            f"persistent://{NS}/t-{index}" for index in range(EXISTING + 1))
        watchers.close_all()
