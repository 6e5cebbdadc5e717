"""Back-pressure from a full write cache (the active half full while the other is still
being flushed): `try_add_entry` refuses at once and `cache_space` says when to try again,
for event loops; `add_entry` still blocks a thread until there is room. The checkpoint is
kept flushing by holding its entry-log sync in the fault-injecting file system."""

from __future__ import annotations

import threading
from pathlib import Path

from magnetar.storage import Completion, Storage
from magnetar.storage.testing.simfs import SimFileSystem

from .helpers import WAIT_SECONDS_MAX, KiB, small_config, wait_until

ENTRY = b"e" * (64 * KiB)


def test_a_full_cache_refuses_try_add_and_signals_space_when_the_flush_ends(
        tmp_path: Path) -> None:
    fs = SimFileSystem(seed=5)
    store = Storage.open(tmp_path, small_config(write_cache_bytes_max=512 * KiB), fs=fs)
    try:
        ledger = store.create_ledger().result(WAIT_SECONDS_MAX)
        fs.hold("sync", "entrylogs")
        accepted: list[Completion[int]] = []
        refused = None
        for _ in range(64):  # two halves of 256 KiB fill long before this
            added = store.try_add_entry(ledger, ENTRY)
            if added is None:
                refused = store.cache_space()
                break
            accepted.append(added)
            if store.cache.active_full() and store.cache.flushing is None:
                wait_until(lambda: store.cache.flushing is not None, "the checkpoint to swap")
        assert refused is not None, "the cache never filled"
        assert not refused.done()
        blocked_add: list[int] = []
        adder = threading.Thread(
            target=lambda: blocked_add.append(store.add_entry(ledger, b"late").result()))
        adder.start()  # a thread's add waits for the same room
        wait_until(lambda: fs.held("sync") > 0, "the flush to reach its held sync")
        assert not refused.done()
        assert not blocked_add
        fs.release("sync")
        assert refused.result(WAIT_SECONDS_MAX) is None
        adder.join(WAIT_SECONDS_MAX)
        assert [c.result(WAIT_SECONDS_MAX) for c in accepted] == list(range(len(accepted)))
        assert blocked_add == [len(accepted)]
        retried = store.try_add_entry(ledger, b"retried")
        assert retried is not None
        assert retried.result(WAIT_SECONDS_MAX) == len(accepted) + 1
    finally:
        fs.release("sync")
        store.close()


def test_a_full_journal_queue_refuses_try_add_and_signals_room_when_the_writer_moves(
        tmp_path: Path) -> None:
    """The journal's queue is bounded (`journal_queue_requests_max`); an event loop's add
    must not wait in `Journal.submit` for room: `try_add_entry` refuses once the queue holds
    `add_requests_max` requests (a tenth stays for cursor updates and ledger closes) and
    `cache_space` finishes when the writer takes a batch."""
    fs = SimFileSystem(seed=6)
    store = Storage.open(tmp_path, small_config(journal_queue_requests_max=20), fs=fs)
    try:
        ledger = store.create_ledger().result(WAIT_SECONDS_MAX)
        assert store.journal is not None
        room = store.journal.add_requests_max
        assert room == 18
        fs.hold("write", ".jnl")  # the writer stalls on its next journal write
        first = store.try_add_entry(ledger, b"first")
        assert first is not None
        wait_until(lambda: fs.held("write") > 0, "the journal writer to stall")
        accepted = [first]
        for _ in range(room):
            added = store.try_add_entry(ledger, b"e")
            assert added is not None, "refused before the queue was full"
            accepted.append(added)
        assert store.try_add_entry(ledger, b"refused") is None  # returns at once
        space = store.cache_space()
        assert not space.done()
        closed = store.close_ledger(ledger)  # a record that must not wait behind adds
        assert not closed.done()
        fs.release("write")
        assert space.result(WAIT_SECONDS_MAX) is None
        assert [c.result(WAIT_SECONDS_MAX) for c in accepted] == list(range(room + 1))
        assert closed.result(WAIT_SECONDS_MAX) == room
    finally:
        fs.release("write")
        store.close()


def test_a_run_of_adds_waits_for_room_for_all_of_it_in_the_journal_queue(
        tmp_path: Path) -> None:
    """`try_add_entries` is all or nothing: refused (None, none written) while the queue
    lacks room for the whole run, accepted once the writer has taken a batch."""
    fs = SimFileSystem(seed=7)
    store = Storage.open(tmp_path, small_config(journal_queue_requests_max=20), fs=fs)
    try:
        ledger = store.create_ledger().result(WAIT_SECONDS_MAX)
        assert store.journal is not None
        assert store.journal.add_requests_max == 18
        fs.hold("write", ".jnl")
        first = store.try_add_entry(ledger, b"first")
        assert first is not None
        wait_until(lambda: fs.held("write") > 0, "the journal writer to stall")
        queued = store.try_add_entries(ledger, [b"q%d" % i for i in range(15)])
        assert queued is not None
        assert store.try_add_entries(ledger, [b"r%d" % i for i in range(4)]) is None
        state = store.ledgers.get(ledger)
        assert state is not None
        assert state.next_entry_id == 16  # the refused run took no entry ids
        fitting = store.try_add_entries(ledger, [b"s0", b"s1", b"s2"])  # 15 + 3 = 18: fits
        assert fitting is not None
        space = store.cache_space()
        assert not space.done()
        fs.release("write")
        assert space.result(WAIT_SECONDS_MAX) is None
        assert (first.result(WAIT_SECONDS_MAX), queued.result(WAIT_SECONDS_MAX),
                fitting.result(WAIT_SECONDS_MAX)) == (0, 15, 18)
        assert store.read_entries(ledger, 16, 18) == [b"s0", b"s1", b"s2"]
    finally:
        fs.release("write")
        store.close()
