"""The event loop never waits on the storage (issue 11 §4): a full write cache holds back
only the adds of the managed ledgers that meet it, and reads that need the disk run in a
worker thread, so one slow topic cannot freeze the others.

"The loop answers" is checked from another thread: it schedules a callback on the loop with
`call_soon_threadsafe` and waits for it, while the storage is still held (a held entry-log
sync, a full scripted cache, a held read). A loop stuck in a storage call cannot run it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from magnetar.broker import BrokerConfig, BrokerService, PersistentTopic, SubscribeSpec
from magnetar.broker.ledger._managed_ledger import ManagedLedger, ManagedLedgerConfig
from magnetar.storage import Storage
from magnetar.storage.testing.memory import InMemoryLedgerStorage
from magnetar.storage.testing.simfs import SimFileSystem
from tests.storage.helpers import KiB, small_config

from .helpers import RecordingSink, persistent_producer, publish, settle, wait_for

ANSWER_WAIT_S = 10.0  # generous: the loop is idle, only a loaded machine is slow
HELD_WAIT_S = 20.0
A_TOPIC = "persistent://public/default/slow-a"
B_TOPIC = "persistent://public/default/fast-b"
ONE_ENTRY_LEDGERS = ManagedLedgerConfig(max_entries_per_ledger=1, min_ledger_rollover_time_s=0,
                                        retention_time_minutes=-1, retention_size_mb=-1)


def _loop_answers(loop: asyncio.AbstractEventLoop) -> bool:
    """From a helper thread: whether the loop runs a callback within `ANSWER_WAIT_S`."""
    ran = threading.Event()
    loop.call_soon_threadsafe(ran.set)
    return ran.wait(ANSWER_WAIT_S)


async def loop_answers() -> bool:
    return await asyncio.to_thread(_loop_answers, asyncio.get_running_loop())


# -- a full write cache ------------------------------------------------------------------


def test_adds_wait_for_cache_space_on_the_loop_and_keep_their_order() -> None:
    """Before the fix the managed ledger called the blocking `add_entry`, which held the
    loop thread until the cache had room."""
    async def scenario() -> None:
        store = InMemoryLedgerStorage(small_config(write_cache_wait_ms_max=60_000))
        ml = await ManagedLedger.open(store, "ml-a")
        first = await ml.add_entry(b"before")
        store.fill_cache()
        adds = [asyncio.ensure_future(ml.add_entry(b"x%d" % i)) for i in range(3)]
        await wait_for(lambda: len(store._space_waiters) == 1, timeout_s=HELD_WAIT_S)
        assert await loop_answers(), "the loop froze while the cache was full"
        assert not any(add.done() for add in adds)
        store.free_cache()
        positions = [await add for add in adds]
        assert [p.entry_id for p in positions] == [first.entry_id + 1 + i for i in range(3)]
        assert [data for _, data in ml.read_entries(first, 10, 1 << 20)] == \
            [b"before", b"x0", b"x1", b"x2"]
        await ml.close()
        store.close()

    asyncio.run(scenario())


def test_a_full_write_cache_holds_one_topics_publishes_not_the_loop(tmp_path: Path) -> None:
    """The real engine, with the checkpoint's entry-log sync held so that the write cache
    stays full: topic A's publishes wait while the loop answers and topic B's consumer still
    receives what B holds; once the sync goes on, A's publishes finish in order."""
    async def scenario() -> None:
        fs = SimFileSystem(seed=3)
        storage = Storage.open(tmp_path, small_config(write_cache_bytes_max=512 * KiB,
                                                      write_cache_wait_ms_max=60_000), fs=fs)
        service = BrokerService(storage, BrokerConfig(max_message_size_bytes=128 * KiB,
                                                      active_consumer_failover_delay_ms=0))
        await service.start(maintenance=False)
        try:
            topic_b, producer_b = await persistent_producer(service, B_TOPIC)
            await publish(topic_b, producer_b, b"b-held")
            topic_a, producer_a = await persistent_producer(service, A_TOPIC)
            fs.hold("sync", "entrylogs")
            body = b"a" * (100 * KiB)
            for i in range(3):  # fill one half of 256 KiB: the checkpoint flushes it...
                await publish(topic_a, producer_a, body, sequence_id=i)
            await wait_for(lambda: fs.held("sync") > 0, timeout_s=HELD_WAIT_S)  # ...held
            sends = [asyncio.ensure_future(publish(topic_a, producer_a, body, sequence_id=i))
                     for i in range(3, 8)]  # fill the other half, and wait
            await wait_for(lambda: len(storage._space_waiters) > 0 and fs.held("sync") > 0,
                           timeout_s=HELD_WAIT_S)
            assert await loop_answers(), "the loop froze while the write cache was full"
            sink = RecordingSink()
            topic, consumer = await service.subscribe(
                B_TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"),
                sink)
            assert isinstance(topic, PersistentTopic)
            topic.subscriptions["sub"].flow(consumer, 10)
            await wait_for(lambda: len(sink.received) == 1, timeout_s=HELD_WAIT_S)
            assert [r.body for r in sink.received] == [b"b-held"]
            assert not all(send.done() for send in sends)
            assert fs.held("sync") > 0  # all of it happened while the cache was full
            fs.release("sync")
            receipts = [await send for send in sends]
            assert receipts == sorted(receipts)
            assert len(set(receipts)) == 5
        finally:
            fs.release("sync")
            await service.close()
            storage.close()

    asyncio.run(scenario())


# -- reads that need the disk ------------------------------------------------------------


def test_a_cold_catch_up_read_does_not_stall_another_topics_publishes(
        tmp_path: Path) -> None:
    """Topic A's backlog is only in the entry logs and every entry-log read is held: A's
    consumer waits for its read while topic B's publishes are acknowledged and the loop
    answers; released, A's consumer gets its backlog in order. Before the fix the dispatcher
    read A's entries on the loop thread, which then stopped until the read was released."""
    async def scenario() -> None:
        fs = SimFileSystem(seed=4)
        storage = Storage.open(tmp_path, small_config(), fs=fs)
        service = BrokerService(storage, BrokerConfig(max_message_size_bytes=128 * KiB,
                                                      active_consumer_failover_delay_ms=0))
        await service.start(maintenance=False)
        watchdog = _ReleaseAfterPing(asyncio.get_running_loop(),
                                     lambda: fs.held("read") > 0, lambda: fs.release("read"))
        try:
            topic_a, producer_a = await persistent_producer(service, A_TOPIC)
            for i in range(20):
                await publish(topic_a, producer_a, b"a%d" % i)
            topic_b, producer_b = await persistent_producer(service, B_TOPIC)
            await asyncio.to_thread(storage.checkpoint)  # A's entries now need the disk
            fs.hold("read", "entrylogs")
            watchdog.start()
            sink = RecordingSink()
            topic, consumer = await service.subscribe(
                A_TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"),
                sink)
            assert isinstance(topic, PersistentTopic)
            topic.subscriptions["sub"].flow(consumer, 100)
            await wait_for(lambda: fs.held("read") > 0, timeout_s=HELD_WAIT_S)
            receipt = await publish(topic_b, producer_b, b"b0")
            assert fs.held("read") > 0, "B's publish waited for A's read"
            assert receipt[1] == 0
            assert sink.received == []
            watchdog.checked.set()
            # joined off the loop: the watchdog may still be waiting for the loop to answer
            # its ping, which a join on the loop thread would itself prevent
            await asyncio.to_thread(watchdog.join)
            assert watchdog.answered, "the loop froze while A's read was held"
            await wait_for(lambda: len(sink.received) == 20, timeout_s=HELD_WAIT_S)
            assert [r.body for r in sink.received] == [b"a%d" % i for i in range(20)]
        finally:
            watchdog.checked.set()
            fs.release("read")
            await asyncio.to_thread(watchdog.join)
            await service.close()
            storage.close()

    asyncio.run(scenario())


class _ReleaseAfterPing(threading.Thread):
    """Once `held()` holds: ping the loop and wait for the answer (`answered`), then for
    the test to set `checked`, then `release()` -- whether or not they came, so that a
    frozen loop fails the test instead of hanging it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, held: Callable[[], bool],
                 release: Callable[[], None]):
        super().__init__(daemon=True)
        self.loop = loop
        self.held = held
        self.release = release
        self.answered = False
        self.checked = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + HELD_WAIT_S
        while not self.held() and time.monotonic() < deadline:
            time.sleep(0.002)
        try:
            self.answered = self.held() and _loop_answers(self.loop)
            self.checked.wait(HELD_WAIT_S)
        finally:
            self.release()

    def join(self, timeout: float | None = None) -> None:
        if self.is_alive() or self.ident is not None:
            super().join(HELD_WAIT_S + ANSWER_WAIT_S if timeout is None else timeout)


# -- order across a read in flight (in-memory storage: cold reads scripted) --------------


async def _cold_exclusive(store: InMemoryLedgerStorage, count: int,
                          ) -> tuple[BrokerService, PersistentTopic, RecordingSink]:
    service = BrokerService(store, BrokerConfig(active_consumer_failover_delay_ms=0))
    await service.start(maintenance=False)
    topic, producer = await persistent_producer(service, A_TOPIC)
    for i in range(count):
        await publish(topic, producer, b"m%d" % i)
    store.cold_reads(True)
    store.hold_reads()
    sink = RecordingSink()
    await service.subscribe(
        A_TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"), sink)
    return service, topic, sink


def test_a_rewind_while_a_read_is_in_flight_discards_its_result() -> None:
    async def scenario() -> None:
        store = InMemoryLedgerStorage()
        service, topic, sink = await _cold_exclusive(store, 10)
        subscription = topic.subscriptions["sub"]
        consumer = subscription.consumers[0]
        subscription.flow(consumer, 3)
        await wait_for(lambda: store.reads_held == 1)
        epoch = subscription.cursor.read_epoch
        subscription.redeliver(consumer, None)  # rewinds the cursor
        assert subscription.cursor.read_epoch != epoch
        store.release_reads()
        await wait_for(lambda: len(sink.received) == 3)
        subscription.flow(consumer, 100)
        await wait_for(lambda: len(sink.received) == 10)
        assert [r.body for r in sink.received] == [b"m%d" % i for i in range(10)]
        await service.close()
        store.close()

    asyncio.run(scenario())


def test_a_seek_while_a_read_is_in_flight_restarts_delivery_at_the_target() -> None:
    async def scenario() -> None:
        store = InMemoryLedgerStorage()
        service, topic, sink = await _cold_exclusive(store, 10)
        subscription = topic.subscriptions["sub"]
        subscription.flow(subscription.consumers[0], 100)
        await wait_for(lambda: store.reads_held == 1)
        target = topic.managed_ledger.position_after_n(
            topic.managed_ledger.first_position(), 6)  # the 6th entry: m5
        await subscription.reset_cursor(target)  # closes the consumer, as a seek does
        store.release_reads()
        again = RecordingSink()
        _, consumer = await service.subscribe(
            A_TOPIC, SubscribeSpec("sub", "Exclusive", "c2"), again)
        subscription.flow(consumer, 100)
        await wait_for(lambda: len(again.received) == 5)
        assert [r.body for r in again.received] == [b"m%d" % i for i in range(5, 10)]
        assert sink.received == []
        await service.close()
        store.close()

    asyncio.run(scenario())


def test_a_replay_waits_for_the_read_in_flight_and_shared_delivery_keeps_every_entry() -> None:
    """Shared: a redelivery arrives while a read of new entries is loading; nothing is
    delivered until the load is taken, and every entry arrives exactly once more."""
    async def scenario() -> None:
        store = InMemoryLedgerStorage()
        service = BrokerService(store, BrokerConfig(dispatcher_max_read_batch_size=4))
        await service.start(maintenance=False)
        topic, producer = await persistent_producer(service, A_TOPIC)
        for i in range(8):
            await publish(topic, producer, b"m%d" % i)
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            A_TOPIC, SubscribeSpec("sub", "Shared", "c1", initial_position="earliest"), sink)
        subscription = topic.subscriptions["sub"]
        subscription.flow(consumer, 4)
        await wait_for(lambda: len(sink.received) == 4)  # m0..m3, from memory
        store.cold_reads(True)
        store.hold_reads()
        subscription.flow(consumer, 4)
        await wait_for(lambda: store.reads_held == 1)  # m4..m7 loading
        subscription.redeliver(consumer, [(r.ledger_id, r.entry_id) for r in sink.received])
        subscription.flow(consumer, 100)
        await settle()
        assert len(sink.received) == 4  # the replay does not overtake the load
        store.release_reads()
        await wait_for(lambda: len(sink.received) == 12)
        bodies = [r.body for r in sink.received[4:]]
        assert sorted(bodies) == sorted(b"m%d" % i for i in range(8))
        await service.close()
        store.close()

    asyncio.run(scenario())


# -- the managed ledger's record -----------------------------------------------------------


def test_managed_ledger_records_do_not_wait_for_the_index_on_the_loop(tmp_path: Path) -> None:
    """An ML's record (its ledger list) goes through the journal, not a durable LMDB commit on
    the loop: while another thread holds the index's write transaction (as a checkpoint's
    commit does), opening an ML, adding, rolling it over and closing it all finish. Before,
    `_write_record` waited in the loop thread for LMDB's writer lock: the loop froze until
    the holder gave up."""
    async def scenario() -> None:
        storage = Storage.open(tmp_path, small_config(checkpoint_interval_ms=3_600_000))
        held, release = threading.Event(), threading.Event()
        released_by_the_test: list[bool] = []

        def hold_index_writer() -> None:
            with storage.index.env.begin(write=True):
                held.set()
                released_by_the_test.append(release.wait(HELD_WAIT_S))

        holder = threading.Thread(target=hold_index_writer)
        holder.start()
        held.wait()
        try:
            ml = await ManagedLedger.open(storage, "ml-record", ONE_ENTRY_LEDGERS)
            await ml.add_entry(b"first")  # fills the ledger: it rolls over
            await ml.add_entry(b"second")
            await ml.close()
        finally:
            release.set()
            holder.join()
        assert released_by_the_test == [True], "the loop waited for the index's writer"
        assert len(ml.ledgers()) >= 2
        reopened = await ManagedLedger.open(storage, "ml-record", ONE_ENTRY_LEDGERS)
        assert [data for _, data in reopened.read_entries(reopened.first_position(), 10,
                                                          1 << 20)] == [b"first", b"second"]
        await reopened.close()
        storage.close()

    asyncio.run(scenario())
