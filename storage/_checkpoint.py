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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice, repeat, starmap
from typing import Any

import lmdb

from ._config import StorageConfig
from ._entry_log import RECORD_HEADER_BYTES, EntryLogWriter
from ._entry_logs import EntryLogs
from ._errors import StorageError, StorageFailedError, StorageFullError
from ._fs import FileSystem
from ._gil import HAND_OVER_ITEMS, hand_over_gil
from ._index import CheckpointWrite, Index, LedgerRecord, LocationRun
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
        runs, data_bytes = _sorted_runs(half, deleted)
        self._fs.point("checkpoint:after-swap")
        write = CheckpointWrite(mark=None, ledgers=records, purge_ledgers=purge,
                                meta_ops=half.meta_ops(), drop_ledgers=drop or [])
        touched = self._append_runs(runs, data_bytes, write)
        self._drop_purged_from_logs(deleted, touched)
        write.entry_logs = [self._logs.records[i] for i in sorted(touched)]
        write.counters = {"nextLedgerId": self._ledgers.next_id, "nextLogId": self._logs.next_id}
        persisted = self._index.persisted_mark
        write.mark = mark if persisted is None or mark > persisted else None
        self._fs.point("checkpoint:before-index-commit")
        self._index.commit_checkpoint(write)
        self._fs.point("checkpoint:after-index-commit")
        log.debug("checkpoint: %d entries, %d ledgers, %d tombstones purged, mark %s in "
                  "%.1f ms", sum(len(run.entry_ids) for run in runs), len(records),
                  len(write.drop_ledgers), write.mark, (time.monotonic() - started) * 1000)
        _free_lists([run.locations for run in write.location_runs]
                    + [run.entry_ids for run in runs] + [run.datas for run in runs])
        write.location_runs.clear()

    def _append_runs(self, runs: list[_Entries], data_bytes: int,
                     write: CheckpointWrite) -> set[int]:
        """Write the runs' entries (`data_bytes` of data in all) to entry logs and sync
        them, adding their locations to `write`; returns the log ids touched."""
        touched: set[int] = set()
        if not runs:
            return touched
        limit = self._config.entry_log_bytes_max
        remaining = RECORD_HEADER_BYTES * sum(len(run.datas) for run in runs) + data_bytes
        for run in runs:
            start, count = 0, len(run.datas)
            while start < count:
                writer = self._writer_with_room(len(run.datas[start]), limit, touched)
                if writer.position + remaining <= limit:  # the rest fits: no log is full
                    stop = count
                else:
                    stop = _run_end(run.datas, start, writer.position, limit)
                whole = start == 0 and stop == count
                ids = run.entry_ids if whole else run.entry_ids[start:stop]
                position_before = writer.position
                locations = writer.append_run(run.ledger_id, ids,
                                              run.datas if whole else run.datas[start:stop])
                write.location_runs.append(LocationRun(run.ledger_id, ids, locations))
                appended = writer.position - position_before
                remaining -= appended
                self._account(writer, run.ledger_id, appended)
                touched.add(writer.log_id)
                start = stop
        self._fs.point("checkpoint:after-entrylog-write")
        current = self._logs.writer
        assert current is not None
        current.sync()
        self._fs.point("checkpoint:after-entrylog-sync")
        self._logs.records[current.log_id].size = current.position
        return touched

    def _writer_with_room(self, first_bytes: int, limit: int,
                          touched: set[int]) -> EntryLogWriter:
        """The current entry log, or a new one when the current one has no room for a
        record of `first_bytes` of data (the full one is synced and sealed first)."""
        writer = self._logs.writer
        need = RECORD_HEADER_BYTES + first_bytes
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

    def _account(self, writer: EntryLogWriter, ledger_id: int, size: int) -> None:
        """Add `size` bytes appended to the writer's log for a ledger to the log's GC
        record."""
        record = self._logs.records[writer.log_id]
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


@dataclass
class _Entries:
    """A flushed half's entries of one ledger: ids ascending, and their data."""

    ledger_id: int
    entry_ids: list[int]
    datas: list[bytes]


def _sorted_runs(half: CacheHalf, deleted: set[int]) -> tuple[list[_Entries], int]:
    """The half's entries of the ledgers not in `deleted`, by ledger, each ledger's by
    entry id, and the bytes of their data. A ledger's entries are in the cache in the
    order of their ids (adds come in order; a replayed rewrite keeps its place), so its ids
    and data are copied out as they are, by C-level slices of its dict; a ledger whose ids
    are not in order is sorted. A second of adds is thousands of entries: the copy goes
    `_COPY_ITEMS` at a time and the GIL is handed over between (`_gil.py`), as the
    entry-log append and the index commit that follow do."""
    runs: list[_Entries] = []
    data_bytes = 0
    since_hand_over = 0
    for ledger_id in sorted(half.entries):
        if ledger_id in deleted:
            continue
        ledger = half.entries[ledger_id]
        run = _Entries(ledger_id, [], [])
        keys, values = iter(ledger), iter(ledger.values())
        in_order = True
        while len(run.entry_ids) < len(ledger):
            if since_hand_over >= _COPY_ITEMS:
                hand_over_gil()
                since_hand_over = 0
            ids = list(islice(keys, _COPY_ITEMS - since_hand_over))
            in_order = (in_order and ids == sorted(ids)
                        and not (run.entry_ids and ids[0] <= run.entry_ids[-1]))
            run.entry_ids += ids
            datas = list(islice(values, len(ids)))
            data_bytes += sum(map(len, datas))
            run.datas += datas
            since_hand_over += len(ids)
        if not in_order:
            run.entry_ids.sort()
            run.datas = list(map(ledger.__getitem__, run.entry_ids))
        runs.append(run)
    return runs, data_bytes


# Items handled between two hand-overs by the loops that only move or drop references (a
# hand-over costs its thread about 16 us of CPU: these would spend more on hand-overs than on
# their work at `HAND_OVER_ITEMS`). Measured per item: copying references out of a dict 20
# ns, dropping a list's references (the ids and data the half still holds, the locations'
# ints) 5 ns, popping an entry out of a half and freeing its 1 KB of data 300 ns.
_COPY_ITEMS = HAND_OVER_ITEMS * 8
_DROP_ITEMS = HAND_OVER_ITEMS * 32
_FREE_ITEMS = HAND_OVER_ITEMS * 2


def _free_lists(lists: list[list[Any]]) -> None:
    """Empty a flush's lists (each run's entry ids, data and locations: thousands of items
    a second, hundreds of thousands in a full half of small entries) a chunk at a time,
    handing the GIL over between."""
    since_hand_over = 0
    for items in lists:
        while items:
            if since_hand_over >= _DROP_ITEMS:
                hand_over_gil()
                since_hand_over = 0
            count = min(len(items), _DROP_ITEMS - since_hand_over)
            del items[-count:]
            since_hand_over += count


def _free_half(half: CacheHalf) -> None:
    """Free a flushed half (out of the cache by now) a chunk of entries at a time, handing
    the GIL over between: dropped whole, 5,000 1 KB entries held it for about a millisecond.
    Each chunk is popped by C code (`popitem` called through `starmap`, its results dropped
    by a zero-length deque)."""
    since_hand_over = 0
    for ledger in half.entries.values():
        while ledger:
            if since_hand_over >= _FREE_ITEMS:
                hand_over_gil()
                since_hand_over = 0
            count = min(len(ledger), _FREE_ITEMS - since_hand_over)
            deque(starmap(ledger.popitem, repeat((), count)), maxlen=0)
            since_hand_over += count


def _run_end(datas: list[bytes], start: int, position: int, limit: int) -> int:
    """End of the records of `datas[start:]` that fit in a log at `position` (at least
    one)."""
    stop, size = start, position
    while stop < len(datas) and (stop == start or
                                 size + RECORD_HEADER_BYTES + len(datas[stop]) <= limit):
        size += RECORD_HEADER_BYTES + len(datas[stop])
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
