"""The checkpoint: make everything the journal mark covers durable outside the journal.

Steps, in the only safe order (storage design §12.4):

1. Capture the journal's synced mark. Every record up to it was applied in memory before
   it was journaled, so everything the mark covers is already in the cache or the ledger
   table.
2. Swap the write-cache halves and snapshot the dirty ledger records.
3. Append the flushing half, sorted by (ledger, entry), to the current entry log, rolling
   to a new log at `entry_log_bytes_max` (the full one is sealed with its ledgers map).
4. fsync the entry log.
5. Commit, in ONE LMDB transaction: the locations, the ledger records, the purge of deleted
   ledgers' locations, the entry-log GC metadata, the journaled metadata-store operations,
   the id counters, the mark (never lower than the one persisted), and the removal of the
   tombstones that mark covers (at most `tombstones_purged_per_checkpoint_max`; see
   `LedgerTable`): from then on no replay can meet their records.
6. Clear the flushed half and forget the purged tombstones; delete journal segments wholly
   before the persisted mark.

A crash before 5 leaves entry-log bytes nothing points at (reclaimed at the next start)
and the tombstones in the index (the next start purges them once its checkpoint persists a
mark in its fresh segment); a crash after 5 leaves journal segments that the next start
ignores or deletes. A tombstone's entry-log bytes were dropped from the logs' live counts
and its locations purged when the deletion itself was checkpointed, so GC never needs it.

A `Checkpointer` (one per engine state, as BookKeeper's checkpointer) is built with what it
works on: the storage lock (a `Condition`: the cache swap and the ledger snapshot happen
under it, and adds waiting for cache space are woken after a flush), the write cache, the
ledger table, the entry-log manager, the index and the file system; the journal is attached
once recovery has started it. It owns the checkpoint lock, which GC and `check` take too.
A fatal I/O error is reported through `on_failure` (the engine then accepts no writes), and
`failure` tells it whether the engine has already failed.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import lmdb

from ._config import StorageConfig
from ._entry_log import RECORD_HEADER_BYTES, EntryLogWriter
from ._entry_logs import EntryLogs
from ._errors import StorageError, StorageFailedError, StorageFullError
from ._fs import FileSystem
from ._gil import HAND_OVER_ITEMS, hand_over_gil
from ._index import CheckpointWrite, Index, LedgerRecord, location_key
from ._journal import Journal, JournalMark
from ._ledger import DELETED, LedgerTable
from ._trace import trace
from ._write_cache import CacheHalf, WriteCache

__all__ = ["WRITE_ERRORS", "Checkpointer", "storage_error"]

log = logging.getLogger(__name__)

FailureProbe = Callable[[], StorageError | None]
FailureSink = Callable[[StorageFailedError], None]
# What a checkpoint's or GC's writes can raise: the entry logs' I/O, and the index's commit
# (LMDB does its own I/O and raises its own errors: a full disk, a full map, EIO).
WRITE_ERRORS: tuple[type[Exception], ...] = (OSError, lmdb.Error)


class Checkpointer:
    """Runs checkpoints of one engine state (see the module comment)."""

    def __init__(self, *, fs: FileSystem, config: StorageConfig, lock: threading.Condition,
                 cache: WriteCache, ledgers: LedgerTable, logs: EntryLogs, index: Index,
                 failure: FailureProbe, on_failure: FailureSink):
        self.lock = threading.Lock()  # the checkpoint lock: one checkpoint, GC or check
        self._fs = fs
        self._config = config
        self._state_lock = lock
        self._cache = cache
        self._ledgers = ledgers
        self._logs = logs
        self._index = index
        self._failure = failure
        self._on_failure = on_failure
        self._journal: Journal | None = None
        # Segments a checkpoint left for the next one to delete (`checkpoint(keep_segments)`).
        self._segments_left = False

    def attach(self, journal: Journal) -> None:
        """The journal whose synced mark checkpoints persist (recovery started it)."""
        self._journal = journal

    def rebind(self, lock: threading.Condition, failure: FailureProbe,
               on_failure: FailureSink) -> None:
        """Serve another owner's lock and failure state (a `Storage` adopting a recovered
        state after a full disk)."""
        self._state_lock, self._failure, self._on_failure = lock, failure, on_failure

    def fail(self, exc: BaseException) -> None:
        """A flush made outside `checkpoint` (recovery's, once the open no longer waits for
        it) failed: the engine accepts no writes, as after a failed checkpoint."""
        if isinstance(exc, StorageFailedError):
            error = exc
        elif isinstance(exc, WRITE_ERRORS):
            error = storage_error(exc)
        else:
            error = StorageFailedError(f"flush of replayed entries failed: {exc!r}")
        log.error("flush of replayed journal records failed: %s", error)
        self._on_failure(error)

    def checkpoint(self, *, keep_segments: bool = False) -> None:
        """Steps 1 to 6 (module comment). With `keep_segments`, step 6 leaves the journal
        segments before the mark for the next checkpoint to delete, even one with nothing new
        (recovery's: unlinking the last run's segments, hundreds of MB after a day of
        traffic, took a fifth of a second of a restart; the checkpoint thread does it).

        Raises:
            StorageError: the engine had already failed; nothing was written.
            StorageFailedError: an entry-log write or sync or the index commit failed; the
                flushed half stays in the cache and the engine accepts no writes.
        """
        journal = self._journal
        assert journal is not None
        with self.lock:
            failed = self._failure()
            if failed is not None:  # e.g. a replay flush that held this lock failed
                raise failed
            self._fs.point("checkpoint:begin")
            with self._state_lock:
                failed = self._failure()
                if failed is not None:
                    # A failed engine writes nothing more (and a failed flush left its half
                    # in the cache, so another swap is impossible anyway).
                    raise failed
                mark = journal.synced_mark
                covered = (mark.segment_id, mark.offset)
                cache = self._cache
                nothing_new = (not cache.active.entries and not cache.active.meta
                               and not self._ledgers.has_changes()
                               and self._index.persisted_mark == mark
                               and not self._ledgers.purgeable(covered))
                if nothing_new:
                    if self._segments_left:
                        self._segments_left = False
                        self._delete_old_segments(journal)
                    return
                half = cache.swap()
                records, purge = self._ledgers.take_changes()
                drop = self._ledgers.take_purgeable(
                    covered, self._config.tombstones_purged_per_checkpoint_max)
            try:
                self.flush(half, records, purge, mark, drop)
            except WRITE_ERRORS as exc:
                error = storage_error(exc)
                self._on_failure(error)
                raise error from exc
            with self._state_lock:
                self._cache.clear_flushing()
                self._ledgers.forget(drop)
                self._state_lock.notify_all()
            if trace.on:
                trace.mark("checkpoint:flushed")
            self._segments_left = keep_segments
            if not keep_segments:
                self._delete_old_segments(journal)
            _free_half(half)
            if trace.on:
                trace.mark("checkpoint:freed")

    def flush(self, half: CacheHalf, records: list[LedgerRecord], purge: list[int],
              mark: JournalMark, drop: list[int] | None = None) -> None:
        """Steps 3 to 5 for one flushed half (also used by recovery's replay); `drop` are
        the tombstones `mark` covers. Raises OSError as it comes; the half is left in the
        cache, and the tombstones stay in the index (the next start purges them)."""
        started = time.monotonic()
        # Only deletions this commit makes durable may drop entries: a ledger deleted in
        # memory since the snapshot is not deleted on disk yet, and the mark covers its adds.
        deleted = {r.ledger_id for r in records if r.state == DELETED} | set(purge)
        entries, data_bytes = _sorted_entries(half, deleted)
        self._fs.point("checkpoint:after-swap")
        write = CheckpointWrite(mark=None, ledgers=records, purge_ledgers=purge,
                                meta_ops=half.meta_ops(), drop_ledgers=drop or [])
        touched = self._append_entries(entries, data_bytes, write)
        self._drop_purged_from_logs(deleted, touched)
        write.entry_logs = [self._logs.records[i] for i in sorted(touched)]
        write.counters = {"nextLedgerId": self._ledgers.next_id, "nextLogId": self._logs.next_id}
        persisted = self._index.persisted_mark
        write.mark = mark if persisted is None or mark > persisted else None
        self._fs.point("checkpoint:before-index-commit")
        self._index.commit_checkpoint(write)
        self._fs.point("checkpoint:after-index-commit")
        log.debug("checkpoint: %d entries, %d ledgers, %d tombstones purged, mark %s in "
                  "%.1f ms", len(entries), len(records), len(write.drop_ledgers), write.mark,
                  (time.monotonic() - started) * 1000)
        _free_list(entries)
        _free_list(write.locations)

    def _append_entries(self, entries: list[tuple[int, int, bytes]], data_bytes: int,
                        write: CheckpointWrite) -> set[int]:
        """Write the entries (`data_bytes` of data in all) to entry logs and sync them;
        returns the log ids touched."""
        touched: set[int] = set()
        if not entries:
            return touched
        limit = self._config.entry_log_bytes_max
        remaining = RECORD_HEADER_BYTES * len(entries) + data_bytes
        start = 0
        while start < len(entries):
            writer = self._writer_with_room(entries[start], limit, touched)
            stop = _run_end(entries, start, writer.position, remaining, limit)
            chunk = entries[start:stop]
            position_before = writer.position
            keys: list[bytes] = []
            locations = writer.append(chunk, keys)
            assert len(keys) == len(locations) == len(chunk)
            assert keys[0] == location_key(chunk[0][0], chunk[0][1]), "index key layout"
            write.locations.extend(zip(keys, locations, strict=True))
            remaining -= writer.position - position_before
            self._account(writer)
            touched.add(writer.log_id)
            start = stop
        self._fs.point("checkpoint:after-entrylog-write")
        current = self._logs.writer
        assert current is not None
        current.sync()
        self._fs.point("checkpoint:after-entrylog-sync")
        self._logs.records[current.log_id].size = current.position
        return touched

    def _writer_with_room(self, first: tuple[int, int, bytes], limit: int,
                          touched: set[int]) -> EntryLogWriter:
        """The current entry log, or a new one when the current one is full (the full one
        is synced and sealed first)."""
        writer = self._logs.writer
        need = RECORD_HEADER_BYTES + len(first[2])
        if writer is not None and (writer.position + need <= limit
                                   or writer.position == 0):
            return writer
        if writer is not None:
            writer.seal()
            record = self._logs.records[writer.log_id]
            record.size, record.sealed = writer.position, True
            touched.add(writer.log_id)
            self._logs.close_current()
            self._fs.point("entrylog:after-seal")
        return self._logs.start_current()

    def _account(self, writer: EntryLogWriter) -> None:
        """Add what the writer's last append counted per ledger to the log's GC record."""
        record = self._logs.records[writer.log_id]
        for ledger_id, size in writer.appended_bytes.items():
            record.ledgers[ledger_id] = record.ledgers.get(ledger_id, 0) + size
            record.total_bytes += size
        record.size = writer.position

    def _drop_purged_from_logs(self, deleted: set[int], touched: set[int]) -> None:
        if not deleted:
            return
        for log_id, record in self._logs.records.items():
            if any(ledger_id in record.ledgers for ledger_id in deleted):
                for ledger_id in deleted:
                    record.ledgers.pop(ledger_id, None)
                touched.add(log_id)

    def _delete_old_segments(self, journal: Journal) -> None:
        persisted = self._index.persisted_mark
        if persisted is None:
            return
        try:
            journal.delete_segments_before(persisted.segment_id)
        except OSError as exc:
            log.warning("could not delete old journal segments: %s", exc)


def _sorted_entries(half: CacheHalf,
                    deleted: set[int]) -> tuple[list[tuple[int, int, bytes]], int]:
    """The half's entries of the ledgers not in `deleted` as (ledger, entry, data) sorted by
    (ledger, entry), and the bytes of their data. A second of adds is thousands of entries:
    the list grows `HAND_OVER_ITEMS` at a time and the GIL is handed over between (`_gil.py`),
    as the entry-log append and the index commit that follow do."""
    entries: list[tuple[int, int, bytes]] = []
    data_bytes = 0
    since_hand_over = 0
    for ledger_id in sorted(half.entries):
        if ledger_id in deleted:
            continue
        ledger = half.entries[ledger_id]
        ids = sorted(ledger)
        for start in range(0, len(ids), HAND_OVER_ITEMS):
            if since_hand_over >= HAND_OVER_ITEMS:
                hand_over_gil()
                since_hand_over = 0
            run = [(ledger_id, entry_id, ledger[entry_id])
                   for entry_id in ids[start:start + HAND_OVER_ITEMS]]
            data_bytes += sum([len(entry[2]) for entry in run])
            entries += run
            since_hand_over += len(run)
    return entries, data_bytes


# Items freed between two hand-overs: freeing an entry costs a fraction of encoding it.
_FREE_ITEMS = HAND_OVER_ITEMS * 4


def _free_list(items: list[Any]) -> None:
    """Empty a flush's list of a second's entries (or their locations) a chunk at a time,
    handing the GIL over between: freed at once when the flush returned, 5,000 of them held
    it for a few tenths of a millisecond."""
    while items:
        del items[-_FREE_ITEMS:]
        if items:
            hand_over_gil()


def _free_half(half: CacheHalf) -> None:
    """Free a flushed half (out of the cache by now) a chunk of entries at a time, handing
    the GIL over between: dropped whole, 5,000 1 KB entries held it for about a millisecond."""
    since_hand_over = 0
    for ledger in half.entries.values():
        while ledger:
            if since_hand_over >= _FREE_ITEMS:
                hand_over_gil()
                since_hand_over = 0
            count = min(len(ledger), _FREE_ITEMS - since_hand_over)
            for _ in range(count):
                ledger.popitem()
            since_hand_over += count


def _run_end(entries: list[tuple[int, int, bytes]], start: int, position: int,
             remaining: int, limit: int) -> int:
    """End of the run of entries from `start` that fits in a log at `position` (at least
    one entry); `remaining` is the record bytes of all of `entries[start:]`."""
    if position + remaining <= limit:
        return len(entries)
    stop, size = start, position
    while stop < len(entries) and (stop == start or
                                   size + RECORD_HEADER_BYTES + len(entries[stop][2])
                                   <= limit):
        size += RECORD_HEADER_BYTES + len(entries[stop][2])
        stop += 1
    return stop


def storage_error(exc: Exception) -> StorageFailedError:
    """The engine's error for a `WRITE_ERRORS` error of a checkpoint or GC (a full disk:
    StorageFullError)."""
    if isinstance(exc, StorageFailedError):
        return exc
    if isinstance(exc, lmdb.Error):
        return _index_error(exc)
    assert isinstance(exc, OSError), exc
    path = getattr(exc, "filename", None)
    cls = StorageFullError if exc.errno == 28 else StorageFailedError
    return cls(f"checkpoint I/O failed{' on ' + str(path) if path else ''}: "
               f"{exc.strerror or exc}", path=path, errno=exc.errno)


def _index_error(exc: lmdb.Error) -> StorageFailedError:
    """An index commit's LMDB error: py-lmdb names the C error in the text only (a full
    disk reads as the C library's ENOSPC message)."""
    reason = str(exc)
    if isinstance(exc, lmdb.MapFullError):
        return StorageFailedError(f"index commit failed: the index map is full ({reason}); "
                                  f"raise lmdbMapBytes")
    if os.strerror(errno.ENOSPC) in reason:
        return StorageFullError(f"index commit failed: {reason}", errno=errno.ENOSPC)
    return StorageFailedError(f"index commit failed: {reason}")
