"""What the journal queues and writes: a request (one record, or a run of adds of one
ledger), a batch written and waiting for its sync, and the segment being written (created
and preallocated here). See `_journal.py` for how they move."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from ._completion import Completion
from ._config import StorageConfig
from ._fs import FileHandle, FileSystem
from ._journal_format import (
    ADD_IDS_BYTES,
    RECORD_HEADER_BYTES,
    AddRun,
    RecordType,
    SegmentHeader,
    add_run_parts,
    encode_record,
    pad_record,
    parse_segment_name,
    segment_file_name,
)
from ._trace import trace

__all__ = ["CountedCondition", "JournalRequest", "create_segment", "cut_after",
           "delete_segments_before", "encode_batch", "list_segments", "preallocate"]

log = logging.getLogger(__name__)

_ZERO_CHUNK_BYTES = 1024 * 1024
_FIRST_PREALLOC_BYTES = 1024 * 1024  # an open or a rollover does not wait for a full step
_ZEROS = bytes(_ZERO_CHUNK_BYTES)

_ADD = int(RecordType.ADD_ENTRY)


class JournalRequest:
    """One record to journal, or a run of ADD_ENTRY records of one ledger (`entries`: their
    data, for entry ids up to `entry_id`), with what to finish when it is durable."""

    __slots__ = ("completion", "entries", "entry_id", "kind", "ledger", "ledger_id",
                 "payload", "records", "size")

    def __init__(self, kind: int, payload: bytes, completion: Completion[int] | None,
                 ledger: object = None, entry_id: int = -1, *,
                 entries: list[bytes] | None = None, ledger_id: int = -1):
        assert entries is None or (kind == _ADD and entries and ledger_id >= 0)
        self.kind = kind
        self.payload = payload
        self.completion = completion
        self.ledger = ledger
        self.entry_id = entry_id
        self.entries = entries
        self.ledger_id = ledger_id
        if entries is None:
            self.records = 1
            self.size = len(payload)
        else:  # one entry (a single add) is the common case
            count = self.records = len(entries)
            self.size = ADD_IDS_BYTES * count + (
                len(entries[0]) if count == 1 else sum(map(len, entries)))

    @classmethod
    def add(cls, completion: Completion[int], ledger: object, ledger_id: int, entry_id: int,
            data: bytes) -> JournalRequest:
        """The request of one add (what `__init__` makes of a run of one, built for less)."""
        assert ledger_id >= 0
        request = cls.__new__(cls)
        request.kind = _ADD
        request.payload = b""
        request.completion = completion
        request.ledger = ledger
        request.entry_id = entry_id
        request.entries = [data]
        request.ledger_id = ledger_id
        request.records = 1
        request.size = ADD_IDS_BYTES + len(data)
        return request


class CountedCondition(threading.Condition):
    """A condition that counts its waiters, so that `notify_all` with nobody waiting (the
    journal's rollover and full-queue waits are rare; its notifications come once or twice
    per batch) returns at once instead of going through `Condition`'s Python-level steps."""

    def __init__(self, lock: threading.RLock):
        super().__init__(lock)
        self.waiting = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1  # (the lock is held here, as `Condition.wait` requires)
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1

    def notify_all(self) -> None:
        if self.waiting:
            super().notify_all()


@dataclass
class _Batch:
    segment: _Segment
    end_offset: int
    last_lsn: int
    requests: list[JournalRequest]
    records: int  # the records written (`requests` is emptied once acknowledged unsynced)


class _Segment:
    def __init__(self, segment_id: int, handle: FileHandle, position: int, allocated: int):
        self.segment_id = segment_id
        self.handle = handle
        self.position = position
        self.allocated = allocated

    def write(self, batch: bytearray, prealloc_bytes: int) -> None:
        """Write an encoded batch at `position` (preallocating first, in `prealloc_bytes`
        steps, so that a zero record header follows it) and move `position` past it."""
        end = self.position + len(batch)
        if end + RECORD_HEADER_BYTES > self.allocated:
            self.allocated = preallocate(self.handle, self.allocated, end + RECORD_HEADER_BYTES,
                                         prealloc_bytes)
        self.handle.pwrite(batch, self.position)
        self.position = end


def create_segment(fs: FileSystem, directory: str, config: StorageConfig, segment_id: int,
                   first_lsn: int) -> _Segment:
    """A new segment file: its header, a first step of zeros, synced with its directory."""
    path = os.path.join(directory, segment_file_name(segment_id))
    alignment = config.journal_alignment_bytes
    handle = fs.open(path, create=True)
    try:
        header = SegmentHeader(segment_id, first_lsn, alignment)
        handle.pwrite(header.encode(), 0)
        first_step = min(_FIRST_PREALLOC_BYTES, config.journal_prealloc_bytes)
        allocated = preallocate(handle, alignment, alignment, first_step)
        handle.fdatasync()
        fs.fsync_dir(directory)
    except BaseException:
        handle.close()
        raise
    log.debug("journal segment %s created (first LSN %d)", path, first_lsn)
    return _Segment(segment_id, handle, alignment, allocated)


def preallocate(handle: FileHandle, start: int, need_end: int, step: int) -> int:
    """Zeros from `start` in `step` (`journal_prealloc_bytes`) steps until `need_end`
    is covered; returns the new allocated end."""
    if trace.on:
        trace.mark("journal:prealloc", start)
    end = start
    while end < need_end or end == start:
        stop = end + step
        position = end
        while position < stop:
            chunk = min(_ZERO_CHUNK_BYTES, stop - position)
            handle.pwrite(_ZEROS[:chunk], position)
            position += chunk
        end = stop
    return end


def encode_batch(requests: list[JournalRequest], segment: _Segment, lsn: int, alignment: int,
                 synced_lsn: int) -> tuple[bytearray, int]:
    """The bytes of one batch written at `segment.position` (its records from LSN `lsn`,
    then a PAD to the alignment boundary), and the LSN after them."""
    parts: list[bytes | bytearray] = []  # the records' pieces, joined once at the end
    segment_id = segment.segment_id
    runs: list[AddRun] = []  # consecutive runs of adds, encoded together
    for request in requests:
        entries = request.entries
        if entries is None:
            if runs:
                lsn = add_run_parts(parts, segment_id, lsn, runs)
                runs = []
            record = bytearray()
            encode_record(record, segment_id, lsn, request.kind, request.payload)
            parts.append(record)
            lsn += 1
        else:
            runs.append((request.ledger_id, request.entry_id - len(entries) + 1, entries))
    if runs:
        lsn = add_run_parts(parts, segment_id, lsn, runs)
    # The PAD carries the LSN synced so far: recovery tells a torn tail (never synced) from
    # a damaged record that was synced before a later batch was written.
    pad = bytearray()
    if pad_record(pad, segment_id, lsn, segment.position + sum(map(len, parts)), alignment,
                  synced_lsn):
        parts.append(pad)
        lsn += 1
    return bytearray().join(parts), lsn


def list_segments(fs: FileSystem, directory: str) -> list[tuple[int, str]]:
    """(segment id, path) of every segment file in `directory`, oldest first."""
    found = []
    for name in fs.listdir(directory):
        segment_id = parse_segment_name(name)
        if segment_id is not None:
            found.append((segment_id, os.path.join(directory, name)))
    return sorted(found)


def delete_segments_before(fs: FileSystem, directory: str, mark_segment_id: int,
                           keep: int) -> list[int]:
    """Delete the segments older than `mark_segment_id` but the newest `keep` of them;
    returns the ids deleted."""
    older = [(sid, path) for sid, path in list_segments(fs, directory) if sid < mark_segment_id]
    doomed = older[:-keep] if keep > 0 else older
    for segment_id, path in doomed:
        fs.point("journal:delete-segment")
        fs.remove(path)
        log.debug("journal segment %d deleted (mark in segment %d)", segment_id,
                  mark_segment_id)
    return [segment_id for segment_id, _ in doomed]


def cut_after(fs: FileSystem, directory: str, segment_id: int, offset: int) -> None:
    """Truncate segment `segment_id` at `offset` and remove every later segment.

    Raises:
        OSError: the truncation failed; the directory is as a crash would leave it.
    """
    for later_id, path in list_segments(fs, directory):
        if later_id > segment_id:
            fs.remove(path)
            log.info("journal segment %s removed: it held only failed writes", path)
    handle = fs.open(os.path.join(directory, segment_file_name(segment_id)))
    try:
        if handle.size() > offset:
            handle.truncate(offset)
            handle.fdatasync()
            log.info("journal segment %d cut at offset %d, after its last acknowledged "
                     "record", segment_id, offset)
    finally:
        handle.close()
    fs.fsync_dir(directory)
