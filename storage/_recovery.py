"""Recovery: bring a data directory back to the state its journal and index describe.

Theory of operation
-------------------
1. Load the ledger records, entry-log metadata and counters from LMDB. A ledger's LAC
   starts at its highest indexed entry.
2. Tidy the entry logs: a log file the index does not know was created by a checkpoint or
   a compaction that never committed, and is deleted; a log the index knows but that is
   missing means data loss, and recovery refuses to go on.
3. Replay the journal from the persisted mark (or from the oldest segment when the mark
   is missing or corrupt). Every record's effect is an assignment, so replay can be
   repeated after a crash during recovery and converges:

   | record        | effect                                                        |
   |---------------|---------------------------------------------------------------|
   | ADD_ENTRY     | into the write cache if above the ledger's LAC; LAC = entry   |
   | LEDGER_CREATE | create the ledger if it does not exist                        |
   | FENCE         | open → fenced                                                 |
   | LEDGER_CLOSE  | → closed                                                      |
   | LEDGER_DELETE | → deleted (a tombstone; later ADDs for it are skipped)        |
   | META_BATCH    | into the metadata overlay                                     |

   Where a scan stops on a bad record, recovery first looks for valid records after it
   (`scan_after_bad_record`: a record header at every alignment boundary up to the end
   of the segment file, CRC good, LSN above the last good one). Then:

   | segment            | what follows the bad record                  | verdict               |
   |--------------------|----------------------------------------------|-----------------------|
   | newest             | no valid record                              | torn tail: stop, go on |
   | newest             | valid records; no PAD claims the bad LSN was | torn tail of a group  |
   |                    | synced (batches written while it was being   | never synced (power   |
   |                    | synced, torn by a power loss)                | loss): stop, go on    |
   | newest             | valid records; a PAD claims it was synced    | corruption: refuse    |
   | older              | next segment's first LSN = last good LSN + 1 | torn tail, earlier run |
   | older              | anything else                                | corruption: refuse    |
   | newest, bad header | no valid record after it                     | crash while creating:  |
   |                    |                                              | remove the segment    |
   | newest, bad header | a valid record after it                      | corruption: refuse    |
   | older, bad header  | —                                            | corruption: refuse    |

   A refusal (`JournalCorruptionError` for a bad record) names the file, the offset and
   how many valid records (and bytes) follow, and leaves the directory as found.
   `skip_corrupt_journal_segments=True` (`magnetar standalone
   --skip-corrupt-journal-segments`) turns "refuse" into "log at ERROR what is lost
   (records and bytes), skip the rest of that segment, and go on": acknowledged entries in
   the skipped part are lost, and so are later adds to a ledger that lost entries there
   (entry ids stay dense).
4. Open a fresh journal segment (its first LSN follows the last replayed one) and run a
   checkpoint, which persists a mark at the start of that segment.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ._entry_log import parse_entry_log_name
from ._errors import CorruptionError, JournalCorruptionError
from ._fs import FileHandle
from ._journal import JournalMark, parse_segment_name
from ._journal_format import (
    Record,
    RecordType,
    ScanResult,
    SegmentHeader,
    Survivors,
    scan_after_bad_record,
    scan_segment,
)
from ._ledger import CLOSED, DELETED, FENCED, OPEN, LedgerState
from ._metadata import decode_meta_ops

if TYPE_CHECKING:
    from ._index import LedgerRecord
    from ._storage import Storage
    from ._write_cache import CacheHalf

__all__ = ["ReplayStats", "recover"]

log = logging.getLogger(__name__)

_IDS = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_CLOSE = struct.Struct(">Qq")


@dataclass
class ReplayStats:
    segments: int = 0
    records: int = 0
    bytes: int = 0
    skipped_adds: int = 0
    torn_tail: str = ""
    # Valid records (and their bytes) after a corrupt one, dropped because
    # skip_corrupt_journal_segments accepted the loss.
    dropped_records: int = 0
    dropped_bytes: int = 0


def recover(store: Storage) -> ReplayStats:
    _load_ledgers(store)
    _load_entry_logs(store)
    stats, last_lsn, next_segment = _replay_journal(store)
    store.start_journal(next_segment, last_lsn)
    store.checkpoint()
    log.info("recovered %s: %d ledgers, replayed %d records (%d bytes) from %d segments%s",
             store.data_dir, len(store.ledgers), stats.records, stats.bytes, stats.segments,
             f"; {stats.torn_tail}" if stats.torn_tail else "")
    store.replay_stats = stats
    return stats


def _load_ledgers(store: Storage) -> None:
    records = store.index.load_ledgers()
    for ledger_id, record in records.items():
        lac = -1 if record.state == DELETED else store.index.last_indexed_entry(ledger_id)
        store.ledgers[ledger_id] = LedgerState(ledger_id, record.metadata, record.state, lac)
    highest = max(records, default=0)
    store.next_ledger_id = max(store.index.counter("nextLedgerId"), highest + 1, 1)


def _load_entry_logs(store: Storage) -> None:
    store.entry_logs = store.index.load_entry_logs()
    on_disk = {}
    for name in store.fs.listdir(store.entry_log_dir):
        log_id = parse_entry_log_name(name)
        if log_id is None:
            log.warning("ignoring unexpected file %s in %s", name, store.entry_log_dir)
            continue
        on_disk[log_id] = os.path.join(store.entry_log_dir, name)
    for log_id, record in store.entry_logs.items():
        if log_id not in on_disk:
            raise CorruptionError(f"entry log {log_id} is in the index but missing on disk",
                                  path=os.path.join(store.entry_log_dir, f"{log_id:08x}.log"),
                                  offset=0)
        if not record.sealed:
            _trim_uncommitted_tail(store, on_disk[log_id], record.size)
    for log_id, path in sorted(on_disk.items()):
        if log_id not in store.entry_logs:
            store.fs.remove(path)
            log.info("removed entry log %s: no committed checkpoint refers to it", path)
    highest = max(list(store.entry_logs) + list(on_disk), default=0)
    store.next_log_id = max(store.index.counter("nextLogId"), highest + 1, 1)


def _trim_uncommitted_tail(store: Storage, path: str, committed: int) -> None:
    handle = store.fs.open(path)
    try:
        if handle.size() > committed:
            handle.truncate(committed)
            handle.fsync()
            log.info("trimmed %s to its committed %d bytes", path, committed)
    finally:
        handle.close()


# -- journal replay -----------------------------------------------------------------------

def _segments(store: Storage) -> list[tuple[int, str]]:
    found = []
    for name in store.fs.listdir(store.journal_dir):
        segment_id = parse_segment_name(name)
        if segment_id is not None:
            found.append((segment_id, os.path.join(store.journal_dir, name)))
    return sorted(found)


def _replay_journal(store: Storage) -> tuple[ReplayStats, int, int]:
    """Replay; returns (stats, last LSN, id for the fresh segment)."""
    stats = ReplayStats()
    mark = store.index.persisted_mark
    if mark is None and store.index.raw_mark() is not None:
        log.warning("the persisted LastLogMark is corrupt; replaying every journal segment")
    segments = _segments(store)
    next_segment = max([s for s, _ in segments] + [mark.segment_id if mark else 0]) + 1
    if mark is not None:
        if mark.segment_id not in {s for s, _ in segments}:
            _refuse_or_skip(store, f"journal segment {mark.segment_id} holding the "
                            "LastLogMark is missing", os.path.join(
                                store.journal_dir, f"{mark.segment_id:016x}.jnl"), 0)
        segments = [(s, p) for s, p in segments if s >= mark.segment_id]
    expected: int | None = None if mark is None else mark.lsn
    flusher = _ReplayFlusher(store)
    try:
        for position, (segment_id, path) in enumerate(segments):
            newest = position == len(segments) - 1
            start = mark.offset if mark is not None and segment_id == mark.segment_id else None
            expected = _replay_segment(store, stats, flusher, segment_id, path, start,
                                       expected, newest,
                                       segments[position + 1][1] if not newest else None)
    except BaseException:
        flusher.wait_quietly()
        raise
    flusher.wait()
    last_lsn = expected if expected is not None else (mark.lsn if mark else 0)
    return stats, max(last_lsn, 0), next_segment


def _replay_segment(store: Storage, stats: ReplayStats, flusher: _ReplayFlusher,
                    segment_id: int, path: str, start: int | None, expected: int | None,
                    newest: bool, next_path: str | None) -> int | None:
    """Replay one segment; returns the last LSN seen (or `expected` when none)."""
    handle = store.fs.open_read(path)
    try:
        try:
            header = SegmentHeader.decode(
                handle.pread(store.config.journal_alignment_bytes, 0), path)
        except CorruptionError:
            if newest and not _holds_records(store, handle, segment_id):
                handle.close()
                store.fs.remove(path)
                log.warning("removed journal segment %s: its header was never completed", path)
                return expected
            _refuse_or_skip(store, "journal segment header is damaged", path, 0)
            return None  # skipped: the next segment's first LSN starts the sequence again
        if header.segment_id != segment_id:
            raise CorruptionError(f"segment header says id {header.segment_id}", path=path,
                                  offset=0)
        if start is None:
            if expected is not None and header.first_lsn != expected + 1:
                _refuse_or_skip(store, f"journal segment starts at LSN {header.first_lsn}, "
                                f"expected {expected + 1}: records are missing", path, 0)
            expected = header.first_lsn - 1
            start = header.alignment
        stats.segments += 1
        result = ScanResult(start, -1, 0, True)
        for record in scan_segment(handle, header, start, expected,
                                   store.config.journal_record_bytes_max, result):
            _apply_record(store, stats, record, path)
            stats.records += 1
            stats.bytes += len(record.payload) + 24
            if store.cache.active_full():
                flusher.flush(JournalMark(segment_id, record.offset + 24 + len(record.payload),
                                          record.lsn))
        if not result.clean:
            _judge_stop(store, stats, result, path, newest, next_path, handle, header)
        return result.last_lsn if result.records else expected
    finally:
        handle.close()


def _holds_records(store: Storage, handle: FileHandle, segment_id: int) -> bool:
    """Whether a segment with an unreadable header holds a valid record after it. Records
    are written only once the segment's creation was synced, so then the header was
    damaged later (corruption), not torn while the segment was created. Assumes the
    configured alignment, the header block's size when the segment was made."""
    alignment = store.config.journal_alignment_bytes
    guess = SegmentHeader(segment_id, 0, alignment)
    result = ScanResult(alignment, -1, 0, True)
    records = scan_segment(handle, guess, alignment, None,
                           store.config.journal_record_bytes_max, result)
    return next(records, None) is not None


def _judge_stop(store: Storage, stats: ReplayStats, result: ScanResult, path: str,
                newest: bool, next_path: str | None, handle: FileHandle,
                header: SegmentHeader) -> None:
    where = f"{path} at offset {result.end_offset}: {result.problem}"
    after = scan_after_bad_record(handle, header, result.end_offset, result.last_lsn,
                                  store.config.journal_record_bytes_max)
    bad_lsn = result.last_lsn + 1
    if newest:
        if after.records == 0:
            stats.torn_tail = f"torn tail in {where}"
            log.warning("journal ends in a torn record (%s); no valid record follows it, so "
                        "it was never acknowledged", where)
            return
        if after.synced_lsn_max < bad_lsn:
            stats.torn_tail = (f"torn tail in {where}; {after.records} later records "
                               f"({after.bytes} bytes) were never synced")
            log.warning("journal ends in a torn group commit (%s): %d valid records "
                        "(%d bytes) follow it, but none was written after it was synced, so "
                        "none was acknowledged (a power loss); dropped", where,
                        after.records, after.bytes)
            return
        _refuse_or_skip_record(store, stats, result, path, after)
        return
    assert next_path is not None
    follows = _first_lsn(store, next_path)
    if follows == result.last_lsn + 1:
        log.info("journal segment %s ends in a torn tail of an earlier run", path)
        return
    _refuse_or_skip_record(store, stats, result, path, after)


def _refuse_or_skip_record(store: Storage, stats: ReplayStats, result: ScanResult, path: str,
                           after: Survivors) -> None:
    """A bad record that is not a torn tail: refuse, or with skip_corrupt_journal_segments
    drop the rest of the segment and say how much that loses."""
    what = (f"corrupt journal record ({result.problem}) after LSN {result.last_lsn}, "
            f"followed by {after.records} valid records ({after.bytes} bytes"
            + (f", LSN {after.first_lsn}..{after.last_lsn}" if after.records else "") + ")")
    if not store.config.skip_corrupt_journal_segments:
        raise JournalCorruptionError(
            f"{what}; refusing to start: starting would lose them "
            "(skip_corrupt_journal_segments=true accepts the loss)",
            path=path, offset=result.end_offset, records_after=after.records,
            bytes_after=after.bytes)
    stats.dropped_records += after.records
    stats.dropped_bytes += after.bytes
    log.error("%s (%s at %d): skipped as configured (skip_corrupt_journal_segments); "
              "LOST: %d journal records (%d bytes) after it, and later adds to the ledgers "
              "that lost entries there", what, path, result.end_offset, after.records,
              after.bytes)


def _first_lsn(store: Storage, path: str) -> int | None:
    handle = store.fs.open_read(path)
    try:
        return SegmentHeader.decode(
            handle.pread(store.config.journal_alignment_bytes, 0), path).first_lsn
    except CorruptionError:
        return None
    finally:
        handle.close()


def _refuse_or_skip(store: Storage, message: str, path: str, offset: int) -> None:
    if not store.config.skip_corrupt_journal_segments:
        raise CorruptionError(message + "; refusing to start (skip_corrupt_journal_segments "
                              "would skip it and lose what follows)", path=path, offset=offset)
    log.error("%s (%s at %d): skipped as configured; data after it is lost", message, path,
              offset)


class _ReplayFlusher:
    """Flushes the write-cache halves that fill up during replay: in order, one at a time,
    each committing the mark just past its last record.

    With background threads a flush runs in a helper thread while replay goes on into
    the other half; its entry-log writes, fdatasync and LMDB commit release the GIL, so
    the disk works while the journal is parsed. Without them (deterministic simulations)
    every flush runs in line, as all other I/O does.
    """

    def __init__(self, store: Storage):
        self._store = store
        self._thread: threading.Thread | None = None
        self._pending = False
        self._error: BaseException | None = None

    def flush(self, mark: JournalMark) -> None:
        """Wait for the previous flush, then flush the active half, covered by `mark`.

        Raises the previous flush's error (an OSError, a StorageError).
        """
        self.wait()
        store = self._store
        half = store.cache.swap()
        records = [store.ledgers[i].record() for i in sorted(store.dirty_ledgers)]
        purge = sorted(store.purge_ledgers)
        store.dirty_ledgers.clear()
        store.purge_ledgers.clear()
        self._pending = True
        job = partial(self._run, half, records, purge, mark)
        if not store.config.background_threads:
            job()
            self.wait()
            return
        self._thread = threading.Thread(target=job, name="storage-replay-flush", daemon=True)
        self._thread.start()

    def _run(self, half: CacheHalf, records: list[LedgerRecord], purge: list[int],
             mark: JournalMark) -> None:
        from ._checkpoint import flush_to_index

        try:
            flush_to_index(self._store, half, records, purge, mark)
        except BaseException as exc:  # raised in the replaying thread by `wait`
            self._error = exc

    def wait(self) -> None:
        """Wait for the flush under way, if any; once it succeeded its half leaves the
        cache. Raises its error (the half then stays, as after a failed checkpoint)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        if self._pending:
            self._pending = False
            self._store.cache.clear_flushing()

    def wait_quietly(self) -> None:
        """`wait` while another error is on its way out: a flush error is only logged."""
        try:
            self.wait()
        except BaseException as exc:
            log.error("journal replay stopped; the flush under way failed too: %s", exc)


# -- applying records ---------------------------------------------------------------------

def _apply_record(store: Storage, stats: ReplayStats, record: Record, path: str) -> None:
    kind, payload = record.kind, record.payload
    if kind == RecordType.ADD_ENTRY:
        _apply_add(store, stats, record, path)
    elif kind == RecordType.LEDGER_CREATE:
        (ledger_id,) = _U64.unpack_from(payload)
        if ledger_id not in store.ledgers:
            metadata = json.loads(bytes(payload[8:]))
            store.ledgers[ledger_id] = LedgerState(ledger_id, metadata)
            store.dirty_ledgers.add(ledger_id)
        store.next_ledger_id = max(store.next_ledger_id, ledger_id + 1)
    elif kind == RecordType.FENCE:
        _set_state(store, _U64.unpack_from(payload)[0], FENCED, only_from=OPEN)
    elif kind == RecordType.LEDGER_CLOSE:
        ledger_id, _last = _CLOSE.unpack_from(payload)
        _set_state(store, ledger_id, CLOSED, only_from=None)
    elif kind == RecordType.LEDGER_DELETE:
        (ledger_id,) = _U64.unpack_from(payload)
        if _set_state(store, ledger_id, DELETED, only_from=None):
            store.purge_ledgers.add(ledger_id)
    elif kind == RecordType.META_BATCH:
        for key, value in decode_meta_ops(bytes(payload)):
            store.cache.put_meta(key, value)
    elif kind != RecordType.PAD:
        log.warning("skipping journal record of unknown type %d at %s:%d", kind, path,
                    record.offset)


def _apply_add(store: Storage, stats: ReplayStats, record: Record, path: str) -> None:
    ledger_id, entry_id = _IDS.unpack_from(record.payload)
    ledger = store.ledgers.get(ledger_id)
    if ledger is None or ledger.state == DELETED:
        stats.skipped_adds += 1
        return
    if entry_id <= ledger.lac:
        return  # already indexed by a checkpoint after the mark
    if entry_id != ledger.lac + 1:
        if store.config.skip_corrupt_journal_segments:
            # The entries before it were in a skipped part of the journal: entry ids
            # stay dense, so this one is lost with them.
            stats.skipped_adds += 1
            return
        raise CorruptionError(f"journal adds entry {entry_id} to ledger {ledger_id} whose "
                              f"last entry is {ledger.lac}", path=path, offset=record.offset)
    store.cache.put(ledger_id, entry_id, bytes(record.payload[16:]))
    ledger.lac = entry_id
    ledger.next_entry_id = entry_id + 1


def _set_state(store: Storage, ledger_id: int, state: str, only_from: str | None) -> bool:
    ledger = store.ledgers.get(ledger_id)
    if ledger is None or ledger.state == DELETED:
        return False
    if only_from is not None and ledger.state != only_from:
        return False
    ledger.state = state
    store.dirty_ledgers.add(ledger_id)
    return True

