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
        assert fs.held("sync") > 0
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
