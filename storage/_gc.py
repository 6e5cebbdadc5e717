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
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._checkpoint import _storage_error as storage_error
from ._entry_log import RECORD_HEADER_BYTES, EntryLogWriter, location_of, scan_entry_log
from ._index import CheckpointWrite, EntryLogRecord, location_key

if TYPE_CHECKING:
    from ._storage import Storage

__all__ = ["collect_garbage"]

log = logging.getLogger(__name__)


def collect_garbage(store: Storage) -> dict[str, int]:
    """One GC pass; returns counts of what was done.

    Raises:
        StorageFailedError: a write, sync or removal failed. As after a failed checkpoint,
            the engine accepts no more writes; the step that failed left either the old
            copy or the new one referenced, and reopening removes the other.
    """
    done = {"logs_deleted": 0, "logs_compacted": 0, "entries_moved": 0}
    with store.checkpoint_lock:
        if store.failed is not None:
            return done
        try:
            _collect(store, done)
        except OSError as exc:
            error = storage_error(exc)
            store.fail_with(error)
            raise error from exc
    if any(done.values()):
        log.info("gc: %s", done)
    return done


def _collect(store: Storage, done: dict[str, int]) -> None:
    current = store.writer.log_id if store.writer is not None else None
    for log_id, record in sorted(store.entry_logs.items()):
        if log_id == current:
            continue
        live = record.live_bytes()
        if live == 0:
            _drop_log(store, log_id)
            done["logs_deleted"] += 1
        elif record.total_bytes and live / record.total_bytes < \
                store.config.compaction_live_ratio_min:
            done["entries_moved"] += _compact_log(store, record)
            done["logs_compacted"] += 1


def _drop_log(store: Storage, log_id: int) -> None:
    store.index.commit_checkpoint(CheckpointWrite(mark=None, drop_entry_logs=[log_id]))
    del store.entry_logs[log_id]
    store.fs.point("gc:after-index-drop")
    store.reader.forget(log_id)
    store.fs.remove(store.reader.path(log_id))


def _compact_log(store: Storage, record: EntryLogRecord) -> int:
    old_path = store.reader.path(record.log_id)
    # The log's committed ledger table, not the in-memory state: a ledger whose delete is
    # not yet durable (and purged by a checkpoint) may come back after a crash.
    live_ledgers = set(record.ledgers)
    writer = store.new_entry_log()
    try:
        moved = _copy_live(store, record, old_path, live_ledgers, writer)
        store.fs.point("compaction:after-copy")
        writer.sync()
        writer.seal()
        store.fs.point("compaction:after-sync")
        new_record = EntryLogRecord(writer.log_id, writer.position, sealed=True)
        for ledger_id, _entry_id, _old, _new, size in moved:
            new_record.ledgers[ledger_id] = new_record.ledgers.get(ledger_id, 0) + size
            new_record.total_bytes += size
        write = CheckpointWrite(
            mark=None, entry_logs=[new_record], drop_entry_logs=[record.log_id],
            counters={"nextLogId": store.next_log_id},
            relocations=[(location_key(ledger_id, entry_id), old, new)
                         for ledger_id, entry_id, old, new, _ in moved])
        store.index.commit_checkpoint(write)
    finally:
        writer.close()
    store.fs.point("compaction:after-index-update")
    store.entry_logs[writer.log_id] = new_record
    del store.entry_logs[record.log_id]
    store.reader.forget(record.log_id)
    store.fs.remove(old_path)
    log.info("compacted entry log %d into %d: %d entries moved", record.log_id,
             writer.log_id, len(moved))
    return len(moved)


_COPY_BATCH_RECORDS = 1000


def _copy_live(store: Storage, record: EntryLogRecord, path: str, live: set[int],
               writer: EntryLogWriter) -> list[tuple[int, int, int, int, int]]:
    """Copy still-referenced records; returns (ledger, entry, old location, new location,
    record size) for each."""
    moved: list[tuple[int, int, int, int, int]] = []
    pending: list[tuple[int, int, bytes]] = []
    olds: list[int] = []

    def flush() -> None:
        for (ledger_id, entry_id, data), old, new in zip(
                pending, olds, writer.append(pending), strict=True):
            moved.append((ledger_id, entry_id, old, new, RECORD_HEADER_BYTES + len(data)))
        pending.clear()
        olds.clear()

    handle = store.fs.open_read(path)
    try:
        for item in scan_entry_log(handle, path, record.size):
            if item.ledger_id not in live:
                continue
            old = location_of(record.log_id, item.offset)
            if store.index.location(item.ledger_id, item.entry_id) != old:
                continue  # a later copy is the live one
            pending.append((item.ledger_id, item.entry_id, item.data))
            olds.append(old)
            if len(pending) >= _COPY_BATCH_RECORDS:
                flush()
        flush()
    finally:
        handle.close()
    return moved
