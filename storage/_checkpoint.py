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
   the id counters, and the mark (never lower than the one persisted).
6. Clear the flushed half; delete journal segments wholly before the persisted mark.

A crash before 5 leaves entry-log bytes nothing points at (reclaimed at the next start);
a crash after 5 leaves journal segments that the next start ignores or deletes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ._entry_log import RECORD_HEADER_BYTES, EntryLogWriter
from ._errors import StorageFailedError, StorageFullError
from ._index import CheckpointWrite, EntryLogRecord, LedgerRecord, location_key
from ._journal import JournalMark
from ._ledger import DELETED
from ._write_cache import CacheHalf

if TYPE_CHECKING:
    from ._storage import Storage

__all__ = ["flush_to_index", "run_checkpoint"]

log = logging.getLogger(__name__)


def run_checkpoint(store: Storage) -> None:
    assert store.journal is not None
    with store.checkpoint_lock:
        store.fs.point("checkpoint:begin")
        with store.lock:
            if store.failed is not None:
                # A failed engine writes nothing more (and a failed flush left its half
                # in the cache, so another swap is impossible anyway).
                raise store.failed
            mark = store.journal.synced_mark
            nothing_new = (not store.cache.active.entries and not store.cache.active.meta
                           and not store.dirty_ledgers
                           and store.index.persisted_mark == mark)
            if nothing_new:
                return
            half = store.cache.swap()
            records, purge = _snapshot_ledgers(store)
        try:
            flush_to_index(store, half, records, purge, mark)
        except OSError as exc:
            error = _storage_error(exc)
            store.fail_with(error)
            raise error from exc
        with store.lock:
            store.cache.clear_flushing()
            store.lock.notify_all()
        _delete_old_segments(store)


def _snapshot_ledgers(store: Storage) -> tuple[list[LedgerRecord], list[int]]:
    records = [store.ledgers[i].record() for i in sorted(store.dirty_ledgers)]
    purge = sorted(store.purge_ledgers)
    store.dirty_ledgers.clear()
    store.purge_ledgers.clear()
    return records, purge


def flush_to_index(store: Storage, half: CacheHalf, records: list[LedgerRecord],
                   purge: list[int], mark: JournalMark) -> None:
    """Steps 3 to 5 of the checkpoint for one flushed half (also used by recovery)."""
    started = time.monotonic()
    # Only deletions this commit makes durable may drop entries: a ledger deleted in
    # memory since the snapshot is not deleted on disk yet, and the mark covers its adds.
    deleted = {r.ledger_id for r in records if r.state == DELETED} | set(purge)
    entries = [(ledger_id, entry_id, data) for ledger_id in sorted(half.entries)
               if ledger_id not in deleted
               for entry_id, data in sorted(half.entries[ledger_id].items())]
    store.fs.point("checkpoint:after-swap")
    write = CheckpointWrite(mark=None, ledgers=records, purge_ledgers=purge,
                            meta_ops=half.meta_ops())
    touched = _append_entries(store, entries, write)
    _drop_purged_from_logs(store, deleted, touched)
    write.entry_logs = [store.entry_logs[i] for i in sorted(touched)]
    write.counters = {"nextLedgerId": store.next_ledger_id, "nextLogId": store.next_log_id}
    persisted = store.index.persisted_mark
    write.mark = mark if persisted is None or mark > persisted else None
    store.fs.point("checkpoint:before-index-commit")
    store.index.commit_checkpoint(write)
    store.fs.point("checkpoint:after-index-commit")
    log.debug("checkpoint: %d entries, %d ledgers, mark %s in %.1f ms", len(entries),
              len(records), write.mark, (time.monotonic() - started) * 1000)


def _append_entries(store: Storage, entries: list[tuple[int, int, bytes]],
                    write: CheckpointWrite) -> set[int]:
    """Write the entries to entry logs and sync them; returns the log ids touched."""
    touched: set[int] = set()
    if not entries:
        return touched
    limit = store.config.entry_log_bytes_max
    remaining = RECORD_HEADER_BYTES * len(entries) + sum(len(e[2]) for e in entries)
    start = 0
    while start < len(entries):
        writer = _writer_with_room(store, entries[start], limit, touched)
        stop = _run_end(entries, start, writer.position, remaining, limit)
        chunk = entries[start:stop]
        counted_before = dict(writer.ledger_bytes)
        position_before = writer.position
        keys: list[bytes] = []
        locations = writer.append(chunk, keys)
        assert len(keys) == len(locations) == len(chunk)
        assert keys[0] == location_key(chunk[0][0], chunk[0][1]), "index key layout"
        write.locations.extend(zip(keys, locations, strict=True))
        remaining -= writer.position - position_before
        _account(store, writer, counted_before)
        touched.add(writer.log_id)
        start = stop
    store.fs.point("checkpoint:after-entrylog-write")
    assert store.writer is not None
    store.writer.sync()
    store.fs.point("checkpoint:after-entrylog-sync")
    store.entry_logs[store.writer.log_id].size = store.writer.position
    return touched


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


def _writer_with_room(store: Storage, first: tuple[int, int, bytes], limit: int,
                      touched: set[int]) -> EntryLogWriter:
    """The current entry log, or a new one when the current one is full (the full one is
    synced and sealed first)."""
    writer = store.writer
    need = RECORD_HEADER_BYTES + len(first[2])
    if writer is not None and (writer.position + need <= limit
                               or writer.position == 0):
        return writer
    if writer is not None:
        writer.seal()
        record = store.entry_logs[writer.log_id]
        record.size, record.sealed = writer.position, True
        touched.add(writer.log_id)
        writer.close()
        store.fs.point("entrylog:after-seal")
    writer = store.new_entry_log()
    store.writer = writer
    store.entry_logs[writer.log_id] = EntryLogRecord(writer.log_id, writer.position)
    return writer


def _account(store: Storage, writer: EntryLogWriter, counted_before: dict[int, int]) -> None:
    """Add what the writer's last append counted per ledger to the log's GC record."""
    record = store.entry_logs[writer.log_id]
    for ledger_id, counted in writer.ledger_bytes.items():
        size = counted - counted_before.get(ledger_id, 0)
        if size:
            record.ledgers[ledger_id] = record.ledgers.get(ledger_id, 0) + size
            record.total_bytes += size
    record.size = writer.position


def _drop_purged_from_logs(store: Storage, deleted: set[int], touched: set[int]) -> None:
    if not deleted:
        return
    for log_id, record in store.entry_logs.items():
        if any(ledger_id in record.ledgers for ledger_id in deleted):
            for ledger_id in deleted:
                record.ledgers.pop(ledger_id, None)
            touched.add(log_id)


def _delete_old_segments(store: Storage) -> None:
    persisted = store.index.persisted_mark
    if persisted is None or store.journal is None:
        return
    try:
        store.journal.delete_segments_before(persisted.segment_id)
    except OSError as exc:
        log.warning("could not delete old journal segments: %s", exc)


def _storage_error(exc: OSError) -> StorageFailedError:
    if isinstance(exc, StorageFailedError):
        return exc
    path = getattr(exc, "filename", None)
    cls = StorageFullError if exc.errno == 28 else StorageFailedError
    return cls(f"checkpoint I/O failed{' on ' + str(path) if path else ''}: "
               f"{exc.strerror or exc}", path=path, errno=exc.errno)
