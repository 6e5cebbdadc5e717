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
from pathlib import Path

from broker import BrokerConfig, BrokerService, PersistentTopic, SubscribeSpec
from broker.ledger._managed_ledger import ManagedLedger
from storage import Storage
from storage.testing.memory import InMemoryLedgerStorage
from storage.testing.simfs import SimFileSystem
from tests.storage.helpers import KiB, small_config

from .helpers import RecordingSink, persistent_producer, publish, wait_for

ANSWER_WAIT_S = 10.0  # generous: the loop is idle, only a loaded machine is slow
HELD_WAIT_S = 20.0
A_TOPIC = "persistent://public/default/slow-a"
B_TOPIC = "persistent://public/default/fast-b"


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
            sends = [asyncio.ensure_future(publish(topic_a, producer_a, body, sequence_id=i))
                     for i in range(12)]
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
            assert len(set(receipts)) == 12
        finally:
            fs.release("sync")
            await service.close()
            storage.close()

    asyncio.run(scenario())
