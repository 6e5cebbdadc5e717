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
   checkpoint, which persists a mark at the start of that segment. With background threads
   the replayed segments, now before the mark, are deleted by the checkpoint thread's next
   checkpoint, not during the open (`Checkpointer.checkpoint(keep_segments=True)`).

   With `flush_in_background` (`Storage.open` with background threads) the open does not
   wait for step 4's checkpoint, nor for a flush of a full cache half still under way: the
   engine accepts writes and reads (from the write cache) at once, and the storage's
   checkpoint thread runs that checkpoint straight away. Until it commits, the replayed
   records are durable where they were, in the journal segments that recovery read: no
   segment is deleted before a checkpoint persists a mark past it, and the fresh segment's
   first LSN follows the last record replayed. A crash in that window therefore recovers
   the same way again: the older segments replay to the same state (every effect is an
   assignment; a torn tail of theirs is passed over as an earlier run's, since the next
   segment starts right after its last good record), then the fresh segment's own records.
   What the replay read is synced first (a process crash leaves records written but never
   synced in the page cache, and replay shows them): the open does not return, nor does a
   new record follow them, while a power loss could still take them away.
   A flush that fails after the open returned fails the engine like a failed checkpoint.

Recovery works on a `RecoveryTarget` (a fresh `Storage`): it fills the ledger table and the
entry-log manager, puts replayed entries in the write cache, flushes through the
checkpointer, and starts the journal; it never imports `Storage`.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ._config import StorageConfig
from ._entry_log import parse_entry_log_name
from ._entry_logs import EntryLogs
from ._errors import CorruptionError, JournalCorruptionError
from ._fs import FileHandle, FileSystem
from ._index import EntryLogRecord, Index
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
from ._replay_flush import FlushTarget, ReplayFlusher

if TYPE_CHECKING:
    pass

__all__ = ["RecoveryPlan", "RecoveryTarget", "ReplayStats", "plan_recovery", "recover"]

log = logging.getLogger(__name__)

_IDS = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_CLOSE = struct.Struct(">Qq")


class _Place(Protocol):
    """Where journal files are read from: a `Storage` or a read-only `_Dir`."""

    fs: FileSystem
    config: StorageConfig


class RecoveryTarget(FlushTarget, Protocol):
    """The engine state recovery fills (`Storage` is one)."""

    fs: FileSystem
    data_dir: str
    journal_dir: str
    index: Index
    logs: EntryLogs
    replay_stats: ReplayStats | None

    def start_journal(self, segment_id: int, last_lsn: int) -> None: ...


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


def recover(store: RecoveryTarget, *, flush_in_background: bool = False) -> ReplayStats:
    """Steps 1 to 4 (module comment); with `flush_in_background` the checkpoint of step 4
    (and a flush still under way) is left to the caller's checkpoint thread, unless the
    replay left nothing to flush (the checkpoint then only persists the new mark, at once).

    Raises:
        CorruptionError: as `Storage.open`; an OSError or StorageError of a flush.
    """
    _load_ledgers(store)
    _load_entry_logs(store)
    flusher = ReplayFlusher(store)
    stats, last_lsn, next_segment = _replay_journal(store, flusher)
    cache = store.cache
    defer = flush_in_background and (flusher.busy or bool(cache.active.entries)
                                     or bool(cache.active.meta) or store.ledgers.has_changes())
    if not defer:  # nothing replayed to flush: the checkpoint only persists the new mark
        flusher.wait()
    else:
        _sync_replayed_segments(store)
    store.start_journal(next_segment, last_lsn)
    if defer:
        flusher.detach()
    else:  # the checkpoint thread deletes the replayed segments
        store.checkpointer.checkpoint(keep_segments=flush_in_background)
    log.info("recovered %s: %d ledgers, replayed %d records (%d bytes) from %d segments%s",
             store.data_dir, len(store.ledgers), stats.records, stats.bytes, stats.segments,
             f"; {stats.torn_tail}" if stats.torn_tail else "")
    store.replay_stats = stats
    return stats


def _sync_replayed_segments(store: RecoveryTarget) -> None:
    """Make what the replay read durable before anything is shown or added after it: a
    process crash leaves records written but never synced in the page cache, and replay
    applies them; the open must not return (nor the new segment's records follow them)
    while a power loss could still take them away."""
    mark = store.index.persisted_mark
    for segment_id, path in _segments(store):
        if mark is None or segment_id >= mark.segment_id:
            handle = store.fs.open(path)
            try:
                handle.fdatasync()
            finally:
                handle.close()


def _load_ledgers(store: RecoveryTarget) -> None:
    # The cyclic GC paused meanwhile: the table is new long-lived objects (several a ledger),
    # and the collections their allocation sets off walked them again and again for nothing
    # (a quarter of the load's time at 10,000 ledgers).
    collecting = gc.isenabled()
    gc.disable()
    try:
        loaded, older = store.index.load_ledger_table(DELETED)
        store.ledgers.load_many([LedgerState(ledger_id, pairs, state, lac)
                                 for ledger_id, state, pairs, lac in loaded])
        store.ledgers.dirty.update(older)  # rewritten in the binary form by the checkpoint
    finally:
        if collecting:
            gc.enable()
    highest = loaded[-1][0] if loaded else 0
    store.ledgers.next_id = max(store.index.counter("nextLedgerId"), highest + 1, 1)


def _load_entry_logs(store: RecoveryTarget) -> None:
    logs = store.logs
    logs.records = store.index.load_entry_logs()
    on_disk = {}
    for name in store.fs.listdir(logs.directory):
        log_id = parse_entry_log_name(name)
        if log_id is None:
            log.warning("ignoring unexpected file %s in %s", name, logs.directory)
            continue
        on_disk[log_id] = os.path.join(logs.directory, name)
    for log_id, record in logs.records.items():
        if log_id not in on_disk:
            raise CorruptionError(f"entry log {log_id} is in the index but missing on disk",
                                  path=os.path.join(logs.directory, f"{log_id:08x}.log"),
                                  offset=0)
        if not record.sealed:
            _trim_uncommitted_tail(store, on_disk[log_id], record.size)
    for log_id, path in sorted(on_disk.items()):
        if log_id not in logs.records:
            store.fs.remove(path)
            log.info("removed entry log %s: no committed checkpoint refers to it", path)
    highest = max(list(logs.records) + list(on_disk), default=0)
    logs.next_id = max(store.index.counter("nextLogId"), highest + 1, 1)


def _trim_uncommitted_tail(store: RecoveryTarget, path: str, committed: int) -> None:
    handle = store.fs.open(path)
    try:
        if handle.size() > committed:
            handle.truncate(committed)
            handle.fsync()
            log.info("trimmed %s to its committed %d bytes", path, committed)
    finally:
        handle.close()


# -- journal replay -----------------------------------------------------------------------

def _segments(store: RecoveryTarget) -> list[tuple[int, str]]:
    found = []
    for name in store.fs.listdir(store.journal_dir):
        segment_id = parse_segment_name(name)
        if segment_id is not None:
            found.append((segment_id, os.path.join(store.journal_dir, name)))
    return sorted(found)


def _replay_journal(store: RecoveryTarget,
                    flusher: ReplayFlusher) -> tuple[ReplayStats, int, int]:
    """Replay; returns (stats, last LSN, id for the fresh segment). A flush of the last
    full cache half may still be under way (`flusher`)."""
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
    last_lsn = expected if expected is not None else (mark.lsn if mark else 0)
    return stats, max(last_lsn, 0), next_segment


def _replay_segment(store: RecoveryTarget, stats: ReplayStats, flusher: ReplayFlusher,
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
        records = scan_segment(handle, header, start, expected,
                               store.config.journal_record_bytes_max, result)
        _apply_records(store, stats, flusher, segment_id, records, path)
        if not result.clean:
            _judge_stop(store, stats, result, path, newest, next_path, handle, header)
        return result.last_lsn if result.records else expected
    finally:
        handle.close()


def _apply_records(store: RecoveryTarget, stats: ReplayStats, flusher: ReplayFlusher,
                   segment_id: int, records: Iterator[Record], path: str) -> None:
    """Apply a segment's records in order, flushing each cache half that fills once
    another record comes (a half that fills with the journal's last record is left to the
    checkpoint that follows the replay: the open need not wait for it). The hot loop of
    replay: an add that extends its ledger (nearly every record) is applied here, every
    other record by `_apply_record`."""
    add, ids_size, unpack_ids = int(RecordType.ADD_ENTRY), _IDS.size, _IDS.unpack_from
    ledgers, cache = store.ledgers.ledgers, store.cache
    count = size = 0
    end = (0, 0)  # offset past the last record applied in this segment, and its LSN
    # The half, ledger and dict the last add went to (a run of adds: no call or lookup each);
    # an entry goes in as its ledger's next, into a half that started empty: it replaces none.
    half, entries, current = cache.active, {}, -1  # (-1: no ledger yet)
    try:
        for record in records:
            if count and cache.active.entry_bytes >= cache.half_bytes_max:
                flusher.flush(JournalMark(segment_id, *end))  # covers the half exactly
            payload = record.payload
            length = len(payload)
            ledger = None
            if record.kind == add and length >= ids_size:
                ledger_id, entry_id = unpack_ids(payload)
                ledger = ledgers.get(ledger_id)
            if ledger is not None and ledger.state != DELETED and entry_id == ledger.lac + 1:
                if cache.active is not half or ledger_id != current:
                    half, current = cache.active, ledger_id
                    entries = half.entries.setdefault(ledger_id, {})
                entries[entry_id] = data = bytes(payload[ids_size:])
                half.entry_bytes += len(data)
                ledger.lac = entry_id
                ledger.next_entry_id = entry_id + 1
            else:
                _apply_record(store, stats, record, path)
            count += 1
            size += length + 24
            end = (record.offset + 24 + length, record.lsn)
    finally:
        stats.records += count
        stats.bytes += size


def _holds_records(store: _Place, handle: FileHandle, segment_id: int) -> bool:
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


def _verdict(result: ScanResult, after: Survivors, newest: bool,
             follows: int | None) -> str:
    """What a scan that stopped on a bad record means (the module's decision table):
    'torn' (nothing valid follows), 'unsynced' (what follows never saw it synced),
    'earlier-run' (an older segment's torn tail), or 'corrupt'."""
    if newest:
        if after.records == 0:
            return "torn"
        return "unsynced" if after.synced_lsn_max <= result.last_lsn else "corrupt"
    return "earlier-run" if follows == result.last_lsn + 1 else "corrupt"


def _corrupt_record_text(result: ScanResult, after: Survivors) -> str:
    return (f"corrupt journal record ({result.problem}) after LSN {result.last_lsn}, "
            f"followed by {after.records} valid records ({after.bytes} bytes"
            + (f", LSN {after.first_lsn}..{after.last_lsn}" if after.records else "") + ")")


def _judge_stop(store: RecoveryTarget, stats: ReplayStats, result: ScanResult, path: str,
                newest: bool, next_path: str | None, handle: FileHandle,
                header: SegmentHeader) -> None:
    where = f"{path} at offset {result.end_offset}: {result.problem}"
    after = scan_after_bad_record(handle, header, result.end_offset, result.last_lsn,
                                  store.config.journal_record_bytes_max)
    follows = None if next_path is None else _first_lsn(store, next_path)
    verdict = _verdict(result, after, newest, follows)
    if verdict == "torn":
        stats.torn_tail = f"torn tail in {where}"
        log.warning("journal ends in a torn record (%s); no valid record follows it, so "
                    "it was never acknowledged", where)
    elif verdict == "unsynced":
        stats.torn_tail = (f"torn tail in {where}; {after.records} later records "
                           f"({after.bytes} bytes) were never synced")
        log.warning("journal ends in a torn group commit (%s): %d valid records (%d bytes) "
                    "follow it, but none was written after it was synced, so none was "
                    "acknowledged (a power loss); dropped", where, after.records, after.bytes)
    elif verdict == "earlier-run":
        log.info("journal segment %s ends in a torn tail of an earlier run", path)
    else:
        _refuse_or_skip_record(store, stats, result, path, after)


def _refuse_or_skip_record(store: RecoveryTarget, stats: ReplayStats, result: ScanResult, path: str,
                           after: Survivors) -> None:
    """A bad record that is not a torn tail: refuse, or with skip_corrupt_journal_segments
    drop the rest of the segment and say how much that loses."""
    what = _corrupt_record_text(result, after)
    if not store.config.skip_corrupt_journal_segments:
        raise JournalCorruptionError(
            f"{what}; refusing to start: starting would lose them "
            "(skip_corrupt_journal_segments=true, or magnetar standalone "
            "--skip-corrupt-journal-segments, accepts the loss)",
            path=path, offset=result.end_offset, records_after=after.records,
            bytes_after=after.bytes)
    stats.dropped_records += after.records
    stats.dropped_bytes += after.bytes
    log.error("%s (%s at %d): skipped as configured (skip_corrupt_journal_segments); "
              "LOST: %d journal records (%d bytes) after it, and later adds to the ledgers "
              "that lost entries there", what, path, result.end_offset, after.records,
              after.bytes)


def _first_lsn(store: _Place, path: str) -> int | None:
    handle = store.fs.open_read(path)
    try:
        return SegmentHeader.decode(
            handle.pread(store.config.journal_alignment_bytes, 0), path).first_lsn
    except CorruptionError:
        return None
    finally:
        handle.close()


def _refuse_or_skip(store: RecoveryTarget, message: str, path: str, offset: int) -> None:
    if not store.config.skip_corrupt_journal_segments:
        raise CorruptionError(message + "; refusing to start (skip_corrupt_journal_segments "
                              "would skip it and lose what follows)", path=path, offset=offset)
    log.error("%s (%s at %d): skipped as configured; data after it is lost", message, path,
              offset)


# -- applying records ---------------------------------------------------------------------

def _apply_record(store: RecoveryTarget, stats: ReplayStats, record: Record, path: str) -> None:
    kind, payload = record.kind, record.payload
    if kind == RecordType.ADD_ENTRY:
        _apply_add(store, stats, record, path)
    elif kind == RecordType.LEDGER_CREATE:
        (ledger_id,) = _U64.unpack_from(payload)
        if store.ledgers.get(ledger_id) is None:
            metadata = json.loads(bytes(payload[8:]))
            store.ledgers.add(LedgerState(ledger_id, metadata))
        store.ledgers.next_id = max(store.ledgers.next_id, ledger_id + 1)
    elif kind == RecordType.FENCE:
        _set_state(store, _U64.unpack_from(payload)[0], FENCED, only_from=OPEN)
    elif kind == RecordType.LEDGER_CLOSE:
        ledger_id, _last = _CLOSE.unpack_from(payload)
        _set_state(store, ledger_id, CLOSED, only_from=None)
    elif kind == RecordType.LEDGER_DELETE:
        (ledger_id,) = _U64.unpack_from(payload)
        if _set_state(store, ledger_id, DELETED, only_from=None):
            store.ledgers.changed(ledger_id, deleted=True)
    elif kind == RecordType.META_BATCH:
        for key, value in decode_meta_ops(bytes(payload)):
            store.cache.put_meta(key, value)
    elif kind != RecordType.PAD:
        log.warning("skipping journal record of unknown type %d at %s:%d", kind, path,
                    record.offset)


def _apply_add(store: RecoveryTarget, stats: ReplayStats, record: Record, path: str) -> None:
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


def _set_state(store: RecoveryTarget, ledger_id: int, state: str, only_from: str | None) -> bool:
    ledger = store.ledgers.get(ledger_id)
    if ledger is None or ledger.state == DELETED:
        return False
    if only_from is not None and ledger.state != only_from:
        return False
    ledger.state = state
    store.ledgers.changed(ledger_id)
    return True



# -- what recovery would do (read-only) ---------------------------------------------------

@dataclass
class PlannedLedger:
    state: str
    lac: int
    metadata: dict[str, str]


@dataclass
class RecoveryPlan:
    """What `recover` would do to a data directory, found without writing anything
    (`plan_recovery`). `actions` are "would ..." lines; `problems` are what would make
    recovery refuse to start (or, with skip_corrupt_journal_segments, lose data), each
    naming the file and offset. `ledgers` are the ledgers after the replay, `replayed`
    the entry ids the replay would add per ledger."""

    actions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    records: int = 0
    bytes: int = 0
    segments: int = 0
    entry_bytes: int = 0
    ledgers: dict[int, PlannedLedger] = field(default_factory=dict)
    replayed: dict[int, set[int]] = field(default_factory=dict)
    entry_logs: dict[int, EntryLogRecord] = field(default_factory=dict)


@dataclass
class _Dir:
    fs: FileSystem
    config: StorageConfig
    journal_dir: str
    entry_log_dir: str


def plan_recovery(data_dir: str, config: StorageConfig, fs: FileSystem,
                  index: Index) -> RecoveryPlan:
    """Walk the steps of `recover` over `data_dir` reading only: the ledgers and entry
    logs of `index` (which may be opened read-only), the entry-log files, and a scan of
    the journal from the persisted mark with the same decisions as the replay.

    Raises:
        OSError: a file cannot be read.
        lmdb.Error: the index cannot be read.
    """
    place = _Dir(fs, config, os.path.join(data_dir, "journal"),
                 os.path.join(data_dir, "entrylogs"))
    plan = RecoveryPlan()
    for ledger_id, state, pairs, lac in index.load_ledger_table(DELETED)[0]:
        plan.ledgers[ledger_id] = PlannedLedger(state, lac, dict(pairs))
    _plan_entry_logs(place, index, plan)
    _plan_journal(place, index, plan)
    return plan


def _plan_entry_logs(place: _Dir, index: Index, plan: RecoveryPlan) -> None:
    plan.entry_logs = index.load_entry_logs()
    on_disk = {}
    for name in place.fs.listdir(place.entry_log_dir):
        log_id = parse_entry_log_name(name)
        if log_id is not None:
            on_disk[log_id] = os.path.join(place.entry_log_dir, name)
    for log_id, record in sorted(plan.entry_logs.items()):
        path = on_disk.get(log_id)
        if path is None:
            plan.problems.append(f"entry log {log_id} is in the index but missing on disk "
                                 f"({os.path.join(place.entry_log_dir, f'{log_id:08x}.log')} "
                                 "at offset 0)")
            continue
        size = os.path.getsize(path)
        if size < record.size:
            plan.problems.append(f"entry log {path} holds {size} bytes, the index says "
                                 f"{record.size} were committed ({path} at offset {size})")
        elif not record.sealed and size > record.size:
            plan.actions.append(f"would trim {path} from {size} to its committed "
                                f"{record.size} bytes")
    for log_id, path in sorted(on_disk.items()):
        if log_id not in plan.entry_logs:
            plan.actions.append(f"would remove entry log {path}: no committed checkpoint "
                                "refers to it")


def _plan_journal(place: _Dir, index: Index, plan: RecoveryPlan) -> None:
    mark = index.persisted_mark
    if mark is None and index.raw_mark() is not None:
        plan.actions.append("the persisted LastLogMark is corrupt: would replay every "
                            "journal segment")
    segments = []
    for name in place.fs.listdir(place.journal_dir):
        segment_id = parse_segment_name(name)
        if segment_id is not None:
            segments.append((segment_id, os.path.join(place.journal_dir, name)))
    segments.sort()
    next_segment = max([s for s, _ in segments] + [mark.segment_id if mark else 0]) + 1
    if mark is not None:
        if mark.segment_id not in {s for s, _ in segments}:
            path = os.path.join(place.journal_dir, f"{mark.segment_id:016x}.jnl")
            plan.problems.append(f"journal segment {mark.segment_id} holding the LastLogMark "
                                 f"is missing ({path} at offset 0)")
        segments = [(s, p) for s, p in segments if s >= mark.segment_id]
    expected: int | None = None if mark is None else mark.lsn
    for position, (segment_id, path) in enumerate(segments):
        newest = position == len(segments) - 1
        start = mark.offset if mark is not None and segment_id == mark.segment_id else None
        expected = _plan_segment(place, plan, segment_id, path, start, expected, newest,
                                 segments[position + 1][1] if not newest else None)
    last_lsn = max(expected if expected is not None else (mark.lsn if mark else 0), 0)
    origin = (f"the mark (segment {mark.segment_id}, offset {mark.offset}, LSN {mark.lsn})"
              if mark is not None else "the oldest segment")
    plan.actions.append(f"would replay {plan.records} journal records ({plan.bytes} bytes, "
                        f"{plan.entry_bytes} bytes of entries) from {plan.segments} segments, "
                        f"starting at {origin}")
    plan.actions.append(f"would start journal segment {next_segment:016x}.jnl at LSN "
                        f"{last_lsn + 1} and checkpoint, after which older segments are "
                        "deleted")


def _plan_segment(place: _Dir, plan: RecoveryPlan, segment_id: int, path: str,
                  start: int | None, expected: int | None, newest: bool,
                  next_path: str | None) -> int | None:
    """`_replay_segment` without effects; returns the last LSN seen (or `expected`)."""
    config = place.config
    handle = place.fs.open_read(path)
    try:
        try:
            header = SegmentHeader.decode(handle.pread(config.journal_alignment_bytes, 0),
                                          path)
        except CorruptionError as exc:
            if newest and not _holds_records(place, handle, segment_id):
                plan.actions.append(f"would remove journal segment {path}: its header was "
                                    "never completed")
                return expected
            plan.problems.append(f"journal segment header is damaged: {exc}")
            return None
        if header.segment_id != segment_id:
            plan.problems.append(f"segment header says id {header.segment_id} ({path} at "
                                 "offset 0)")
            return None
        if start is None:
            if expected is not None and header.first_lsn != expected + 1:
                plan.problems.append(f"journal segment starts at LSN {header.first_lsn}, "
                                     f"expected {expected + 1}: records are missing ({path} "
                                     "at offset 0)")
            expected = header.first_lsn - 1
            start = header.alignment
        plan.segments += 1
        result = ScanResult(start, -1, 0, True)
        for record in scan_segment(handle, header, start, expected,
                                   config.journal_record_bytes_max, result):
            _plan_record(plan, record, path)
            plan.records += 1
            plan.bytes += len(record.payload) + 24
        if not result.clean:
            after = scan_after_bad_record(handle, header, result.end_offset, result.last_lsn,
                                          config.journal_record_bytes_max)
            follows = None if next_path is None else _first_lsn(place, next_path)
            verdict = _verdict(result, after, newest, follows)
            where = f"{path} at offset {result.end_offset}"
            if verdict == "torn":
                plan.actions.append(f"would ignore the torn tail of {where} "
                                    f"({result.problem}; no valid record follows it)")
            elif verdict == "unsynced":
                plan.actions.append(f"would drop the torn group commit at {where} "
                                    f"({result.problem}): {after.records} later records "
                                    f"({after.bytes} bytes) were never synced")
            elif verdict == "earlier-run":
                plan.actions.append(f"would pass over the torn tail of an earlier run at "
                                    f"{where}")
            else:
                plan.problems.append(f"{_corrupt_record_text(result, after)}: recovery "
                                     f"would refuse to start ({where})")
        return result.last_lsn if result.records else expected
    finally:
        handle.close()


def _plan_record(plan: RecoveryPlan, record: Record, path: str) -> None:
    kind, payload = record.kind, record.payload
    if kind == RecordType.ADD_ENTRY:
        ledger_id, entry_id = _IDS.unpack_from(payload)
        ledger = plan.ledgers.get(ledger_id)
        if ledger is None or ledger.state == DELETED or entry_id <= ledger.lac:
            return
        if entry_id != ledger.lac + 1:
            plan.problems.append(f"journal adds entry {entry_id} to ledger {ledger_id} whose "
                                 f"last entry is {ledger.lac} ({path} at offset "
                                 f"{record.offset})")
            return
        ledger.lac = entry_id
        plan.replayed.setdefault(ledger_id, set()).add(entry_id)
        plan.entry_bytes += len(payload) - 16
    elif kind == RecordType.LEDGER_CREATE:
        (ledger_id,) = _U64.unpack_from(payload)
        if ledger_id not in plan.ledgers:
            plan.ledgers[ledger_id] = PlannedLedger(OPEN, -1, json.loads(bytes(payload[8:])))
    elif kind in (RecordType.FENCE, RecordType.LEDGER_CLOSE, RecordType.LEDGER_DELETE):
        (ledger_id,) = _U64.unpack_from(payload)
        ledger = plan.ledgers.get(ledger_id)
        if ledger is None or ledger.state == DELETED:
            return
        if kind == RecordType.FENCE:
            if ledger.state == OPEN:
                ledger.state = FENCED
        else:
            ledger.state = CLOSED if kind == RecordType.LEDGER_CLOSE else DELETED
