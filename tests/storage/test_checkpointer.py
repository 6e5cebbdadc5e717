"""The checkpointer and the garbage collector stand on their own (issue 11, section 3): built
from the parts they work on (a real LMDB index, real entry-log files, the ledger table and a
write cache), with no `Storage` around them, they flush, account and collect as the engine
relies on, and report a fatal I/O error through their failure callback.
"""

from __future__ import annotations

import errno
import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.storage import StorageConfig, StorageFailedError, StorageFullError
from magnetar.storage import _checkpoint as _checkpoint_module
from magnetar.storage import _entry_log as _entry_log_module
from magnetar.storage import _index as _index_module
from magnetar.storage._checkpoint import Checkpointer
from magnetar.storage._entry_logs import EntryLogs
from magnetar.storage._errors import StorageError
from magnetar.storage._fs import FileSystem, OsFileSystem
from magnetar.storage._gc import GarbageCollector
from magnetar.storage._gil import HAND_OVER_ITEMS
from magnetar.storage._index import Index
from magnetar.storage._journal import Journal, JournalMark
from magnetar.storage._ledger import DELETED, LedgerState, LedgerTable
from magnetar.storage._write_cache import WriteCache
from magnetar.storage.testing.simfs import SimFileSystem

LMDB_MAP_BYTES = 64 * 1024 * 1024


class Parts:
    """The parts a checkpointer and a collector are built from, on one directory."""

    def __init__(self, root: Path, fs: FileSystem | None = None):
        self.fs = fs or OsFileSystem()
        self.config = StorageConfig(background_threads=False)
        for sub in ("entrylogs", "index", "journal"):
            os.makedirs(root / sub, exist_ok=True)
        self.index = Index(str(root / "index"), LMDB_MAP_BYTES)
        self.lock = threading.Condition()
        self.cache = WriteCache(self.config.write_cache_bytes_max // 2)
        self.ledgers = LedgerTable()
        self.logs = EntryLogs(self.fs, str(root / "entrylogs"), self.config)
        self.failures: list[StorageFailedError] = []
        self.checkpointer = Checkpointer(
            fs=self.fs, config=self.config, lock=self.lock, cache=self.cache,
            ledgers=self.ledgers, logs=self.logs, index=self.index, failure=self.failure,
            on_failure=self.failures.append)
        self.journal = Journal(self.fs, str(root / "journal"), self.config, segment_id=1,
                               last_lsn=0, on_durable=lambda requests: None,
                               on_failed=lambda requests, error: None)
        self.checkpointer.attach(self.journal)
        self.collector = GarbageCollector(
            fs=self.fs, config=self.config, logs=self.logs, index=self.index,
            checkpoint_lock=self.checkpointer.lock, failure=self.failure,
            on_failure=self.failures.append)

    def failure(self) -> StorageError | None:
        return self.failures[-1] if self.failures else None

    def flush(self, mark: JournalMark) -> None:
        half = self.cache.swap()
        records, purge = self.ledgers.take_changes()
        with self.checkpointer.lock:
            self.checkpointer.flush(half, records, purge, mark)
        self.cache.clear_flushing()

    def close(self) -> None:
        self.journal.abandon()
        self.logs.close()
        self.index.close()


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    built = Parts(tmp_path)
    yield built
    built.close()


def test_flush_indexes_entries_and_ledgers_and_gc_drops_a_dead_log(parts: Parts) -> None:
    parts.ledgers.add(LedgerState(1, {"name": "a"}))
    for entry_id in range(3):
        parts.cache.put(1, entry_id, f"entry {entry_id}".encode())
    parts.flush(JournalMark(1, 4096, 4))

    assert parts.index.persisted_mark == JournalMark(1, 4096, 4)
    assert parts.index.load_ledgers()[1].metadata == {"name": "a"}
    location = parts.index.location(1, 2)
    assert location is not None
    assert parts.logs.reader.read(location, 1, 2) == b"entry 2"
    (log_id,) = parts.logs.records
    assert parts.index.load_entry_logs()[log_id].ledgers == parts.logs.records[log_id].ledgers
    assert not parts.ledgers.has_changes()

    # The ledger is deleted; the next flush purges it, and a new current log leaves the
    # old one to the collector.
    ledger = parts.ledgers.get(1)
    assert ledger is not None
    ledger.state = DELETED
    parts.ledgers.changed(1, deleted=True)
    parts.flush(JournalMark(1, 8192, 5))
    assert parts.index.location(1, 2) is None
    assert parts.logs.records[log_id].live_bytes() == 0
    parts.logs.close_current()
    assert parts.collector.collect() == {"logs_deleted": 1, "logs_compacted": 0,
                                         "entries_moved": 0}
    assert parts.logs.records == {}
    assert not os.path.exists(parts.logs.path(log_id))
    assert parts.failures == []


def test_a_flush_writes_each_ledgers_entries_in_id_order_even_if_cached_out_of_order(
        parts: Parts) -> None:
    """A ledger's entries reach the cache in id order (the copy out of the half relies on
    it), but a flush does not assume it: a ledger cached out of order is sorted, and every
    entry is indexed at the record that holds it; the ledgers' runs follow each other."""
    parts.ledgers.add(LedgerState(1, {}))
    parts.ledgers.add(LedgerState(2, {}))
    order = [5, 0, 3, 1, 4, 2]
    for entry_id in order:
        parts.cache.put(2, entry_id, b"two %d" % entry_id)
    for entry_id in range(3):
        parts.cache.put(1, entry_id, b"one %d" % entry_id)
    parts.flush(JournalMark(1, 4096, 9))
    located = {(ledger_id, entry_id): parts.index.location(ledger_id, entry_id)
               for ledger_id, count in ((1, 3), (2, 6)) for entry_id in range(count)}
    offsets = [location for _, location in sorted(located.items())]
    assert None not in offsets
    assert offsets == sorted(offsets), "ledger 1's run, then ledger 2's, each by entry id"
    for (ledger_id, entry_id), location in located.items():
        assert location is not None
        name = b"one" if ledger_id == 1 else b"two"
        assert parts.logs.reader.read(location, ledger_id, entry_id) == b"%s %d" % (name,
                                                                                    entry_id)


def test_checkpoint_persists_the_journal_mark(parts: Parts) -> None:
    parts.ledgers.add(LedgerState(1, {}))
    parts.cache.put(1, 0, b"x")
    parts.checkpointer.checkpoint()
    assert parts.index.persisted_mark == parts.journal.synced_mark
    assert parts.index.location(1, 0) is not None
    assert parts.cache.flushing is None, "the flushed half left the cache"


def test_a_full_disk_during_a_checkpoint_reaches_the_failure_callback(tmp_path: Path) -> None:
    fs = SimFileSystem(seed=1)
    parts = Parts(tmp_path, fs)
    try:
        parts.ledgers.add(LedgerState(1, {}))
        parts.cache.put(1, 0, b"x")
        fs.fail_syncs(errno.ENOSPC)
        with pytest.raises(StorageFullError):
            parts.checkpointer.checkpoint()
        assert [type(error) for error in parts.failures] == [StorageFullError]
        assert parts.cache.flushing is not None, "the half stays for the journal's replay"
        # The engine has failed: another checkpoint raises that error, GC does nothing.
        with pytest.raises(StorageFullError):
            parts.checkpointer.checkpoint()
        assert parts.collector.collect() == {"logs_deleted": 0, "logs_compacted": 0,
                                             "entries_moved": 0}
    finally:
        fs.heal()
        parts.close()


class _PointsSeen(OsFileSystem):
    """The OS file system, remembering the last crash point the engine passed."""

    last_point = ""

    def point(self, label: str) -> None:
        self.last_point = label


def test_a_big_checkpoint_hands_the_gil_over_in_every_loop_over_its_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copying a second's entries out of the cache, appending them, putting their index
    locations and freeing them are each a loop over every entry: each hands the GIL over as
    it goes (`_gil.py`), so an event loop waiting for it never waits behind a whole loop
    (issue 14's publish latency). The phase of each hand-over is the crash point passed
    last: once only the append handed it over."""
    fs = _PointsSeen()
    parts = Parts(tmp_path, fs)
    phases: list[str] = []

    def hand_over() -> None:
        phases.append(fs.last_point)

    for module in (_checkpoint_module, _entry_log_module, _index_module):
        monkeypatch.setattr(module, "hand_over_gil", hand_over, raising=False)
    per_ledger = HAND_OVER_ITEMS * 16
    try:
        parts.ledgers.add(LedgerState(1, {}))
        parts.ledgers.add(LedgerState(2, {}))
        for entry_id in range(per_ledger):
            parts.cache.put(1, entry_id, b"a" * 100)
            parts.cache.put(2, entry_id, b"b" * 100)
        parts.checkpointer.checkpoint()
        assert parts.index.location(2, per_ledger - 1) is not None
    finally:
        parts.close()
    counts = {phase: phases.count(phase) for phase in set(phases)}
    entries = 2 * per_ledger

    def between(items: int, chunk: int) -> int:  # hand-overs between chunks
        return -(-items // chunk) - 1

    copy, drop, free = (_checkpoint_module._COPY_ITEMS, _checkpoint_module._DROP_ITEMS,
                        _checkpoint_module._FREE_ITEMS)
    assert counts.get("checkpoint:begin") == between(entries, copy), counts
    assert counts.get("checkpoint:after-swap") == between(entries, HAND_OVER_ITEMS), counts
    assert counts.get("checkpoint:before-index-commit") == between(entries, HAND_OVER_ITEMS)
    # Freeing: the runs' locations, entry ids and data, then the flushed half.
    assert counts.get("checkpoint:after-index-commit") == (between(3 * entries, drop)
                                                           + between(entries, free)), counts


def test_a_big_checkpoint_makes_no_object_per_entry_for_the_cyclic_gc(tmp_path: Path) -> None:
    """A checkpoint's loops over its entries create no container object per entry that
    outlives a step (a tuple per entry for its sorted list and per location did): each one
    counted toward a cyclic-GC collection, which then ran in the checkpoint thread holding
    the GIL (a generation-1 pass about a millisecond) -- about 9 collections per checkpoint
    of 5,000 entries (issue 14's publish latency). With the first threshold at 100, a
    checkpoint of 4,000 entries made over 80 collections before; now at most a few."""
    parts = Parts(tmp_path)
    parts.ledgers.add(LedgerState(1, {}))
    parts.ledgers.add(LedgerState(2, {}))
    for entry_id in range(2000):
        parts.cache.put(1, entry_id, b"a" * 100)
        parts.cache.put(2, entry_id, b"b" * 100)
    generations: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.enable()
    gc.callbacks.append(count)
    gc.set_threshold(100, threshold[1], threshold[2])
    try:
        parts.checkpointer.checkpoint()
        gc.set_threshold(*threshold)
        assert parts.index.location(2, 1999) is not None
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(count)
        if not enabled:
            gc.disable()
        parts.close()
    assert len(generations) <= 5, generations
