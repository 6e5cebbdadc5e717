"""Garbage collection and compaction of entry logs.

Deleting a ledger removes its locations at the next checkpoint and drops its bytes from
each entry log's live count. GC then, for every entry log except the one being written:

* no live bytes: forget the log in LMDB, then delete the file;
* live ratio below `compaction_live_ratio_min`: copy the records the index still points
  at into a new log, fsync and seal it, then in ONE LMDB transaction repoint those
  locations (only where they still point at the old copy), register the new log and
  forget the old one, and only then delete the old file.

A crash at any step leaves either the old copy referenced (the new file is unregistered
and removed at the next start) or the new one (the old file is unregistered and removed
at the next start). GC runs under the checkpoint lock, so no checkpoint runs beside it.

A `GarbageCollector` (one per engine state, as BookKeeper's GC thread) is built with the
entry-log manager, the index, the checkpoint lock and the failure callbacks it shares with
the `Checkpointer`; `collect` runs one pass.
"""

from __future__ import annotations

import logging
import threading

from ._checkpoint import WRITE_ERRORS, FailureProbe, FailureSink, storage_error
from ._config import StorageConfig
from ._entry_log import RECORD_HEADER_BYTES, EntryLogWriter, location_of, scan_entry_log
from ._entry_logs import EntryLogs
from ._errors import StorageFailedError
from ._fs import FileSystem
from ._index import CheckpointWrite, EntryLogRecord, Index, LedgerRecord, location_key
from ._stats import StorageMetrics

__all__ = ["GarbageCollector"]

log = logging.getLogger(__name__)

_COPY_BATCH_RECORDS = 1000


class GarbageCollector:
    """Drops and compacts the entry logs of one engine state (see the module comment)."""

    def __init__(self, *, fs: FileSystem, config: StorageConfig, logs: EntryLogs,
                 index: Index, checkpoint_lock: threading.Lock, failure: FailureProbe,
                 on_failure: FailureSink, metrics: StorageMetrics | None = None):
        self._fs = fs
        self._config = config
        self._logs = logs
        self._index = index
        self._checkpoint_lock = checkpoint_lock
        self._failure = failure
        self._on_failure = on_failure
        # GC runs and what they removed, counted under the checkpoint lock.
        self._metrics = metrics if metrics is not None else StorageMetrics()

    def rebind(self, failure: FailureProbe, on_failure: FailureSink) -> None:
        """Serve another owner's failure state (see `Checkpointer.rebind`)."""
        self._failure, self._on_failure = failure, on_failure

    def delete_while_full(self, ledger: LedgerRecord) -> list[int]:
        """A ledger deleted while the disk is full (`Storage.delete_ledger`, storage lock
        held): commit its tombstone, the purge of its locations and the entry logs' live
        counts straight to the index, then forget and remove every entry log it leaves
        without live data. Returns their ids.

        Raises:
            StorageFailedError: removing a dead entry log failed (it stays referenced or is
                removed at the next start); the deletion itself is committed.
        """
        logs, ledger_id = self._logs, ledger.ledger_id
        touched = [record for record in logs.records.values()
                   if record.ledgers.pop(ledger_id, None) is not None]
        self._index.commit_checkpoint(CheckpointWrite(
            mark=None, ledgers=[ledger], purge_ledgers=[ledger_id], entry_logs=touched))
        dead = sorted(r.log_id for r in touched if r.live_bytes() == 0)
        if logs.writer is not None and logs.writer.log_id in dead:
            logs.close_current()  # writes are off; a resume starts a new log
        for log_id in dead:
            self._index.commit_checkpoint(CheckpointWrite(mark=None, drop_entry_logs=[log_id]))
            path = logs.path(log_id)
            logs.forget(log_id)
            try:
                self._fs.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageFailedError(f"removing entry log {log_id} failed: {exc}",
                                         path=path, errno=exc.errno) from exc
        return dead

    def collect(self) -> dict[str, int]:
        """One GC pass; returns counts of what was done.

        Raises:
            StorageFailedError: a write, sync or removal failed. As after a failed
                checkpoint, the engine accepts no more writes; the step that failed left
                either the old copy or the new one referenced, and reopening removes the
                other.
        """
        done = {"logs_deleted": 0, "logs_compacted": 0, "entries_moved": 0}
        with self._checkpoint_lock:
            if self._failure() is not None:
                return done
            try:
                self._collect(done)
            except WRITE_ERRORS as exc:
                error = storage_error(exc)
                self._on_failure(error)
                raise error from exc
            self._metrics.gc_runs += 1
            self._metrics.gc_entry_logs_deleted += done["logs_deleted"]
            self._metrics.gc_entry_logs_compacted += done["logs_compacted"]
        if any(done.values()):
            log.info("gc: %s", done)
        return done

    def _collect(self, done: dict[str, int]) -> None:
        current = self._logs.writer.log_id if self._logs.writer is not None else None
        for log_id, record in sorted(self._logs.records.items()):
            if log_id == current:
                continue
            live = record.live_bytes()
            if live == 0:
                self._drop_log(log_id)
                done["logs_deleted"] += 1
            elif record.total_bytes and live / record.total_bytes < \
                    self._config.compaction_live_ratio_min:
                done["entries_moved"] += self._compact_log(record)
                done["logs_compacted"] += 1

    def _drop_log(self, log_id: int) -> None:
        self._index.commit_checkpoint(CheckpointWrite(mark=None, drop_entry_logs=[log_id]))
        path = self._logs.path(log_id)
        self._logs.forget(log_id)
        self._fs.point("gc:after-index-drop")
        self._fs.remove(path)

    def _compact_log(self, record: EntryLogRecord) -> int:
        old_path = self._logs.path(record.log_id)
        # The log's committed ledger table, not the in-memory state: a ledger whose delete
        # is not yet durable (and purged by a checkpoint) may come back after a crash.
        live_ledgers = set(record.ledgers)
        writer = self._logs.new_writer()
        try:
            moved = self._copy_live(record, old_path, live_ledgers, writer)
            self._fs.point("compaction:after-copy")
            writer.sync()
            writer.seal()
            self._fs.point("compaction:after-sync")
            new_record = EntryLogRecord(writer.log_id, writer.position, sealed=True)
            for ledger_id, _entry_id, _old, _new, size in moved:
                new_record.ledgers[ledger_id] = new_record.ledgers.get(ledger_id, 0) + size
                new_record.total_bytes += size
            write = CheckpointWrite(
                mark=None, entry_logs=[new_record], drop_entry_logs=[record.log_id],
                counters={"nextLogId": self._logs.next_id},
                relocations=[(location_key(ledger_id, entry_id), old, new)
                             for ledger_id, entry_id, old, new, _ in moved])
            self._index.commit_checkpoint(write)
        finally:
            writer.close()
        self._fs.point("compaction:after-index-update")
        self._logs.records[writer.log_id] = new_record
        self._logs.forget(record.log_id)
        self._fs.remove(old_path)
        log.info("compacted entry log %d into %d: %d entries moved", record.log_id,
                 writer.log_id, len(moved))
        return len(moved)

    def _copy_live(self, record: EntryLogRecord, path: str, live: set[int],
                   writer: EntryLogWriter) -> list[tuple[int, int, int, int, int]]:
        """Copy still-referenced records; returns (ledger, entry, old location, new
        location, record size) for each."""
        moved: list[tuple[int, int, int, int, int]] = []
        pending: list[tuple[int, int, bytes]] = []
        olds: list[int] = []

        def flush() -> None:
            for (ledger_id, entry_id, data), old, new in zip(
                    pending, olds, writer.append(pending), strict=True):
                moved.append((ledger_id, entry_id, old, new, RECORD_HEADER_BYTES + len(data)))
            pending.clear()
            olds.clear()

        handle = self._fs.open_read(path)
        try:
            for item in scan_entry_log(handle, path, record.size):
                if item.ledger_id not in live:
                    continue
                old = location_of(record.log_id, item.offset)
                if self._index.location(item.ledger_id, item.entry_id) != old:
                    continue  # a later copy is the live one
                pending.append((item.ledger_id, item.entry_id, item.data))
                olds.append(old)
                if len(pending) >= _COPY_BATCH_RECORDS:
                    flush()
            flush()
        finally:
            handle.close()
        return moved
