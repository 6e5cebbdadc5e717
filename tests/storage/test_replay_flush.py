"""`Storage.open` with background threads returns once the journal is replayed into memory,
without waiting for the replayed records to be flushed to entry logs and the index (the
storage's checkpoint thread does that next). Until that flush commits, the old journal
segments still hold the records: a crash in that window must recover everything again, and
a flush that fails then must fail the engine like a failed checkpoint.

The flush is kept in progress by holding its entry-log sync in the fault-injecting file
system; the replay is large enough to fill a cache half, so both the replay's own flush of a
full half and the checkpoint of the rest are caught in the window.
"""

from __future__ import annotations

import errno
import random
import threading
from pathlib import Path

import pytest

from magnetar.storage import (
    LedgerClosedError,
    NoSuchEntryError,
    OsFileSystem,
    Storage,
    StorageConfig,
    StorageFailedError,
)
from magnetar.storage._index import Index
from magnetar.storage._journal import JournalMark
from magnetar.storage.testing.simfs import SimFileSystem

from .helpers import WAIT_SECONDS_MAX, KiB, small_config, wait_until

# Cache halves of 256 KiB; the crashed run (its caller pumps the journal: no checkpoint
# runs behind its back) leaves 400 KiB of adds in the journal only.
CONFIG = small_config(write_cache_bytes_max=512 * KiB, checkpoint_interval_ms=600_000)
CRASHED_RUN = small_config(background_threads=False)
ENTRY_BYTES = 4 * KiB
JOURNALED = 100


def entry(rng: random.Random, ledger_id: int, entry_id: int) -> bytes:
    prefix = f"L{ledger_id}E{entry_id}:".encode()
    return prefix + rng.randbytes(ENTRY_BYTES - len(prefix))


def crashed_run(data_dir: Path, rng: random.Random) -> dict[int, list[bytes]]:
    """Two ledgers (one closed) and a metadata key, all only in the journal when the
    process dies. Returns the acknowledged entries per ledger."""
    store = Storage.open(data_dir, CRASHED_RUN)
    expected: dict[int, list[bytes]] = {}
    for _ in range(2):
        ledger_id = store.wait(store.create_ledger({"test": "replay-flush"}))
        datas = [entry(rng, ledger_id, e) for e in range(JOURNALED // 2)]
        completions = [store.add_entry(ledger_id, data) for data in datas]
        assert [store.wait(c) for c in completions] == list(range(len(datas)))
        expected[ledger_id] = datas
    store.wait(store.close_ledger(min(expected)))
    store.wait(store.metadata.apply_journaled([(b"key", b"journaled")]))
    store.abandon()
    return expected


def open_in_thread(data_dir: Path, config: StorageConfig, fs: SimFileSystem) -> Storage:
    """Open in another thread; fail (not hang) when the open waits for the held flush."""
    opened: list[Storage] = []
    opener = threading.Thread(target=lambda: opened.append(Storage.open(data_dir, config,
                                                                        fs=fs)))
    opener.start()
    opener.join(WAIT_SECONDS_MAX / 2)
    if not opened:
        fs.release("sync")
        opener.join(WAIT_SECONDS_MAX)
        if opened:
            opened[0].close()
        pytest.fail("Storage.open waited for the flush of the replayed records")
    return opened[0]


def read_mark(data_dir: Path) -> JournalMark | None:
    index = Index(str(data_dir / "index"), 64 << 20)
    try:
        return index.persisted_mark
    finally:
        index.close()


def assert_holds(store: Storage, expected: dict[int, list[bytes]]) -> None:
    for ledger_id, datas in expected.items():
        assert store.last_add_confirmed(ledger_id) == len(datas) - 1
        assert store.read_entries(ledger_id, 0, len(datas) - 1) == datas
        with pytest.raises(NoSuchEntryError):
            store.read_entry(ledger_id, len(datas))


def test_a_crash_before_the_replayed_records_are_flushed_recovers_them_all(
        tmp_path: Path) -> None:
    rng = random.Random(7)
    expected = crashed_run(tmp_path, rng)
    mark_before = read_mark(tmp_path)
    fs = SimFileSystem(seed=7)
    fs.hold("sync", "entrylogs")
    store = open_in_thread(tmp_path, CONFIG, fs)
    try:
        wait_until(lambda: fs.held("sync") > 0, "the replay's flush to reach its held sync")
        assert store.replay_stats is not None
        assert store.replay_stats.records >= JOURNALED
        assert_holds(store, expected)  # served from the write cache meanwhile
        assert store.metadata.get(b"key") == b"journaled"
        # New adds are acknowledged (fsynced in the new journal segment) in the window.
        open_ledger = max(expected)
        more = [entry(rng, open_ledger, JOURNALED // 2 + i) for i in range(5)]
        completions = [store.add_entry(open_ledger, data) for data in more]
        assert [c.result(WAIT_SECONDS_MAX) for c in completions] == [
            JOURNALED // 2 + i for i in range(5)]
        expected[open_ledger] += more
        assert store.index.persisted_mark == mark_before, "nothing replayed was committed"
        fs.crash("before the replayed records were committed")
    finally:
        fs.release("sync")
        store.abandon()
    fs.power_loss()
    assert read_mark(tmp_path) == mark_before
    with Storage.open(tmp_path, CONFIG, fs=OsFileSystem()) as again:
        assert again.replay_stats is not None
        assert again.replay_stats.records > JOURNALED, "the old segments were replayed again"
        assert_holds(again, expected)
        assert again.metadata.get(b"key") == b"journaled"
        with pytest.raises(LedgerClosedError):
            again.add_entry(min(expected), b"closed")
        report = again.check()
        assert report.ok, report.render()


def test_a_replay_flush_failing_after_the_open_fails_the_engine(tmp_path: Path) -> None:
    rng = random.Random(8)
    expected = crashed_run(tmp_path, rng)
    fs = SimFileSystem(seed=8)
    fs.hold("sync", "entrylogs")
    store = open_in_thread(tmp_path, CONFIG, fs)
    try:
        wait_until(lambda: fs.held("sync") > 0, "the replay's flush to reach its held sync")
        fs.fail_syncs(errno.EIO)
        fs.release("sync")
        wait_until(lambda: store.failed is not None, "the failed flush to fail the engine")
        assert isinstance(store.failed, StorageFailedError)
        with pytest.raises(StorageFailedError):
            store.add_entry(max(expected), b"refused")
    finally:
        fs.release("sync")
        store.close()
    with Storage.open(tmp_path, CONFIG) as again:
        assert_holds(again, expected)
        report = again.check()
        assert report.ok, report.render()


def test_records_replayed_from_the_page_cache_are_synced_before_the_open_returns(
        tmp_path: Path) -> None:
    """A process crash leaves journal records written but never synced (in the page cache);
    replay shows them, and new adds follow them. Were they not synced before the open
    returns, a power loss before the flush could drop them under the new, synced records
    (recovery would then refuse: adds beyond a ledger's last entry)."""
    rng = random.Random(9)
    fs = SimFileSystem(seed=9)
    crashed = Storage.open(tmp_path, CRASHED_RUN, fs=fs)
    ledger_id = crashed.wait(crashed.create_ledger())
    datas = [entry(rng, ledger_id, e) for e in range(JOURNALED)]
    for data in datas:
        crashed.add_entry(ledger_id, data)
    assert crashed.journal is not None
    assert crashed.journal._write_once()  # written (page cache), never synced: a kill
    crashed.abandon()
    fs.hold("sync", "entrylogs")
    store = open_in_thread(tmp_path, CONFIG, fs)
    try:
        wait_until(lambda: fs.held("sync") > 0, "the replay's flush to reach its held sync")
        assert_holds(store, {ledger_id: datas})  # shown, though never acknowledged
        more = [entry(rng, ledger_id, JOURNALED + i) for i in range(3)]
        assert [store.add_entry(ledger_id, d).result(WAIT_SECONDS_MAX) for d in more] == [
            JOURNALED, JOURNALED + 1, JOURNALED + 2]
        fs.crash("power loss before the replayed records were committed")
    finally:
        fs.release("sync")
        store.abandon()
    fs.power_loss()
    with Storage.open(tmp_path, CONFIG, fs=OsFileSystem()) as again:
        assert_holds(again, {ledger_id: datas + more})
        report = again.check()
        assert report.ok, report.render()
