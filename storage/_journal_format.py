"""Journal segment and record formats, and the scanner that reads them back.

Segment file `journal/<016x segment id>.jnl`. The first block is the header:

| offset | size | field                                   |
|--------|------|-----------------------------------------|
| 0      | 4    | magic "PJNL"                            |
| 4      | 2    | format version (1)                      |
| 6      | 2    | flags (0)                               |
| 8      | 8    | segment id (u64)                        |
| 16     | 8    | first LSN expected in this segment      |
| 24     | 4    | alignment A in bytes                    |
| 28     | 4    | CRC32C of bytes 0..27                   |
| 32     | A-32 | zeros                                   |

Records follow, each with a 24-byte header (all integers big-endian):

| offset | size | field                                                        |
|--------|------|--------------------------------------------------------------|
| 0      | 4    | CRC32C over segment id (8 B) ‖ bytes 4..23 ‖ payload         |
| 4      | 4    | payload length L (0 only for PAD)                            |
| 8      | 8    | LSN: +1 per record, PAD included, continuous across segments |
| 16     | 1    | record type                                                  |
| 17     | 1    | flags (0)                                                    |
| 18     | 2    | reserved (0)                                                 |
| 20     | 4    | L XOR 0xFFFFFFFF, a torn-length check before the payload     |
| 24     | L    | payload                                                      |

Seeding the CRC with the segment id rejects records left over from another segment. Every
group-commit batch ends with a PAD record that reaches the next alignment boundary, so a
later batch never rewrites a block that holds acknowledged records, and every batch starts
at an alignment boundary. The journal writes the LSN synced before the batch was encoded
(u64) in the first 8 bytes of that PAD's payload (0, or a payload shorter than 8 bytes:
no claim): a later batch thus proves that the records up to that LSN were durable, and so
possibly acknowledged, before it was written.

The scanner reads records in order and stops at the first one that is not valid: a zero
header is the clean end of the preallocated region; anything else (bad length check, bad
CRC, wrong LSN, short read) is reported with its offset, and the caller decides whether it
is a torn tail (allowed) or corruption (refused); see `_recovery.py`. To decide, the
caller looks for valid records after the bad one with `scan_after_bad_record`: it tries a
record header at every alignment boundary after the bad record up to the end of the
segment file (bounded by `journal_segment_bytes_max` plus one preallocation step), and
follows each run of valid records (CRC good, LSN above every one found before) it finds.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ._crc import crc32c, crc32c_native
from ._errors import CorruptionError
from ._fs import FileHandle

__all__ = [
    "ADD_IDS_BYTES",
    "RECORD_HEADER_BYTES",
    "AddRun",
    "JournalMark",
    "RecordType",
    "ScanResult",
    "SegmentHeader",
    "Survivors",
    "add_run_parts",
    "encode_add_runs",
    "encode_adds",
    "encode_record",
    "pad_record",
    "parse_segment_name",
    "scan_after_bad_record",
    "scan_segment",
    "segment_file_name",
]

MAGIC = b"PJNL"
VERSION = 1
HEADER_FMT = ">4sHHQQI"
HEADER_CRC_FMT = ">I"
HEADER_FIELDS_BYTES = struct.calcsize(HEADER_FMT)
assert HEADER_FIELDS_BYTES == 28

RECORD_HEADER_FMT = ">IIQBBHI"
RECORD_HEADER_BYTES = struct.calcsize(RECORD_HEADER_FMT)
assert RECORD_HEADER_BYTES == 24
_RECORD_HEADER = struct.Struct(RECORD_HEADER_FMT)
_RECORD_TAIL = struct.Struct(">IQBBHI")  # bytes 4..23
_U32 = struct.Struct(">I")
_SEGMENT_ID = struct.Struct(">Q")
_ZERO_HEADER = bytes(RECORD_HEADER_BYTES)
_PAD_SYNCED_LSN = struct.Struct(">Q")  # the first bytes of a PAD payload written by the journal
_ADD_IDS = struct.Struct(">QQ")  # an ADD_ENTRY payload starts with ledger id and entry id
ADD_IDS_BYTES = _ADD_IDS.size
_ADD_HEAD = struct.Struct(">IQBBHIQQ")  # an ADD_ENTRY's tail and ids: one pack, one CRC call
assert _ADD_HEAD.size == _RECORD_TAIL.size + ADD_IDS_BYTES


class RecordType(enum.IntEnum):
    ADD_ENTRY = 1  # ledger u64 ‖ entry u64 ‖ data
    LEDGER_CREATE = 2  # ledger u64 ‖ metadata (JSON object, UTF-8)
    FENCE = 3  # ledger u64
    LEDGER_CLOSE = 4  # ledger u64 ‖ last entry i64
    LEDGER_DELETE = 5  # ledger u64
    META_BATCH = 6  # metadata-store operations, see _index.encode_meta_ops
    PAD = 0xFF  # L zero bytes


_ADD_KIND = int(RecordType.ADD_ENTRY)  # an enum member's value costs a lookup per use


@dataclass(frozen=True)
class SegmentHeader:
    segment_id: int
    first_lsn: int
    alignment: int

    def encode(self) -> bytes:
        fields = struct.pack(HEADER_FMT, MAGIC, VERSION, 0, self.segment_id, self.first_lsn,
                             self.alignment)
        block = fields + _U32.pack(crc32c(fields))
        return block + bytes(self.alignment - len(block))

    @classmethod
    def decode(cls, data: bytes, path: str) -> SegmentHeader:
        """Raises CorruptionError (offset 0) when the header is short, has the wrong magic
        or version, or fails its CRC."""
        if len(data) < HEADER_FIELDS_BYTES + 4:
            raise CorruptionError("journal segment header is truncated", path=path, offset=0)
        fields = data[:HEADER_FIELDS_BYTES]
        (stored,) = _U32.unpack_from(data, HEADER_FIELDS_BYTES)
        if crc32c(fields) != stored:
            raise CorruptionError("journal segment header fails its CRC", path=path, offset=0)
        magic, version, _flags, segment_id, first_lsn, alignment = struct.unpack(
            HEADER_FMT, fields)
        if magic != MAGIC or version != VERSION:
            raise CorruptionError(f"not a journal segment (magic {magic!r}, version {version})",
                                  path=path, offset=0)
        return cls(segment_id, first_lsn, alignment)


def encode_record(out: bytearray, segment_id: int, lsn: int, kind: int,
                  payload: bytes | bytearray | memoryview) -> None:
    """Append one record to `out`."""
    length = len(payload)
    assert length > 0 or kind == RecordType.PAD
    tail = _RECORD_TAIL.pack(length, lsn, kind, 0, 0, length ^ 0xFFFFFFFF)
    crc = crc32c_native(_SEGMENT_ID.pack(segment_id), 0)  # (the C function: every PAD)
    crc = crc32c_native(payload, crc32c_native(tail, crc))
    out += _U32.pack(crc)
    out += tail
    out += payload


def encode_adds(out: bytearray, segment_id: int, lsn: int, ledger_id: int, first_entry_id: int,
                entries: Sequence[bytes]) -> int:
    """Append one ADD_ENTRY record per entry (entry ids from `first_entry_id`, LSNs from
    `lsn`), each exactly as `encode_record` would write it; returns the next LSN."""
    return encode_add_runs(out, segment_id, lsn, [(ledger_id, first_entry_id, entries)])


AddRun = tuple[int, int, Sequence[bytes]]  # ledger id, first entry id, entries


def encode_add_runs(out: bytearray, segment_id: int, lsn: int, runs: Iterable[AddRun]) -> int:
    """`encode_adds` for each run in turn (LSNs continue from run to run); returns the next
    LSN."""
    parts: list[bytes | bytearray] = []
    lsn = add_run_parts(parts, segment_id, lsn, runs)
    out += b"".join(parts)
    return lsn


def add_run_parts(parts: list[bytes | bytearray], segment_id: int, lsn: int,
                  runs: Iterable[AddRun]) -> int:
    """`encode_add_runs` that appends each record's pieces (CRC, head, data) to `parts`
    instead of copying them into a buffer; returns the next LSN.

    The journal writer's hot loop: the payload (ids ‖ data) is never built, its CRC chains
    over the pieces, the batch's pieces are joined once (appending each to a growing buffer
    costs more), and the segment seed and the loop's set-up are paid once per batch, not
    once per run (a batch of single adds is hundreds of runs of one)."""
    crc, pack_head, pack_crc = crc32c_native, _ADD_HEAD.pack, _U32.pack
    seed = crc(_SEGMENT_ID.pack(segment_id), 0)
    kind, ids_bytes, append = _ADD_KIND, ADD_IDS_BYTES, parts.append
    for ledger_id, entry_id, entries in runs:
        for data in entries:
            length = ids_bytes + len(data)
            head = pack_head(length, lsn, kind, 0, 0, length ^ 0xFFFFFFFF, ledger_id, entry_id)
            append(pack_crc(crc(data, crc(head, seed))))
            append(head)
            append(data)
            lsn += 1
            entry_id += 1
    return lsn


def pad_record(out: bytearray, segment_id: int, lsn: int, position: int, alignment: int,
               synced_lsn: int | None = None) -> bool:
    """Append a PAD record so that `position + len(out)` reaches an alignment boundary.
    Returns False (appending nothing) when already aligned. With `synced_lsn` the PAD's
    payload starts with it (the PAD then has at least 8 payload bytes)."""
    end = position + len(out)
    gap = -end % alignment
    if gap == 0:
        return False
    least = RECORD_HEADER_BYTES + (0 if synced_lsn is None else _PAD_SYNCED_LSN.size)
    while gap < least:
        gap += alignment
    payload = bytearray(gap - RECORD_HEADER_BYTES)
    if synced_lsn is not None:
        _PAD_SYNCED_LSN.pack_into(payload, 0, synced_lsn)
    encode_record(out, segment_id, lsn, RecordType.PAD, payload)
    assert (position + len(out)) % alignment == 0
    return True


def pad_synced_lsn(payload: memoryview | bytes) -> int:
    """The synced LSN a PAD record's payload claims (0: none)."""
    if len(payload) < _PAD_SYNCED_LSN.size:
        return 0
    return int(_PAD_SYNCED_LSN.unpack_from(payload)[0])


@dataclass
class ScanResult:
    """How a segment scan ended.

    `end_offset` is the offset just past the last valid record, `last_lsn` that record's
    LSN (or the LSN before the scan when none). `clean` is True when the scan reached a zero
    header or the end of the file; otherwise `problem` says what was found at `end_offset`.
    """

    end_offset: int
    last_lsn: int
    records: int
    clean: bool
    problem: str = ""


class Record(NamedTuple):
    """One valid record as the scanner found it (a tuple: cheap to create per record)."""

    lsn: int
    kind: int
    payload: memoryview
    offset: int


_READ_CHUNK_BYTES = 4 * 1024 * 1024


def scan_segment(handle: FileHandle, header: SegmentHeader, start_offset: int,
                 previous_lsn: int | None, record_bytes_max: int,
                 result: ScanResult) -> Iterator[Record]:
    """Yield the valid records of a segment from `start_offset`, in order.

    `previous_lsn` is the LSN the first record must follow (None: accept any). The scan
    stops at the first invalid record and fills `result`; it never raises on bad data.
    """
    file_size = handle.size()
    offset = start_offset
    last_lsn = -1 if previous_lsn is None else previous_lsn
    result.end_offset, result.last_lsn, result.records, result.clean = offset, last_lsn, 0, True
    seed = crc32c(_SEGMENT_ID.pack(header.segment_id))
    # The hot loop of recovery: it indexes one read buffer by offset instead of slicing
    # views for every header.
    unpack_header = _RECORD_HEADER.unpack_from
    crc_of, new_record = crc32c_native, tuple.__new__  # (no Python-level call per record)
    pad = RecordType.PAD
    buffer = b""
    view = memoryview(buffer)
    buffer_start = offset
    records = 0
    try:
        while offset + RECORD_HEADER_BYTES <= file_size:
            at = offset - buffer_start
            if at + RECORD_HEADER_BYTES > len(buffer):
                buffer, buffer_start, at = handle.pread(_READ_CHUNK_BYTES, offset), offset, 0
                view = memoryview(buffer)
                if len(buffer) < RECORD_HEADER_BYTES:
                    break
            crc, length, lsn, kind, _flags, _reserved, check = unpack_header(buffer, at)
            if check == 0 and buffer[at:at + RECORD_HEADER_BYTES] == _ZERO_HEADER:
                break
            problem = ""
            if length ^ 0xFFFFFFFF != check:
                problem = "record length check fails"
            elif length > record_bytes_max:
                problem = f"record length {length} exceeds the maximum {record_bytes_max}"
            elif last_lsn >= 0 and lsn != last_lsn + 1:
                problem = f"record LSN {lsn} does not follow {last_lsn}"
            elif length == 0 and kind != pad:
                problem = "empty record"
            else:
                end = at + RECORD_HEADER_BYTES + length
                if end > len(buffer):
                    want = max(RECORD_HEADER_BYTES + length, _READ_CHUNK_BYTES)
                    buffer, buffer_start, at = handle.pread(want, offset), offset, 0
                    view = memoryview(buffer)
                    end = RECORD_HEADER_BYTES + length
                if end > len(buffer):
                    problem = "record runs past the end of the file"
                else:
                    payload = view[at + RECORD_HEADER_BYTES:end]
                    # Bytes 4..23 and the payload are contiguous: one CRC call covers both.
                    if crc_of(view[at + 4:end], seed) != crc:
                        problem = "record CRC mismatch"
            if problem:
                result.clean, result.problem = False, problem
                break
            record: Record = new_record(Record, (lsn, kind, payload, offset))
            offset += RECORD_HEADER_BYTES + length
            last_lsn = lsn
            records += 1
            yield record
    finally:  # also when the caller stops early (the generator is closed)
        result.end_offset, result.last_lsn, result.records = offset, last_lsn, records


@dataclass
class Survivors:
    """Valid records found after a bad one (see `scan_after_bad_record`).

    `records`/`bytes` count them (headers included), `first_offset`/`first_lsn` locate
    the first (-1 when none), `last_lsn` is the highest LSN found, and `synced_lsn_max` is
    the highest synced LSN their PAD records claim: when it reaches the bad record's LSN,
    the bad record was durable before a later batch was written.
    """

    records: int = 0
    bytes: int = 0
    first_offset: int = -1
    first_lsn: int = -1
    last_lsn: int = -1
    synced_lsn_max: int = 0


def scan_after_bad_record(handle: FileHandle, header: SegmentHeader, bad_offset: int,
                          last_lsn: int, record_bytes_max: int) -> Survivors:
    """Find the valid records after a bad record at `bad_offset`.

    Batches start at alignment boundaries, so a batch written after the bad record starts
    at one: every boundary after `bad_offset` up to the end of the file is tried. A
    header whose length check holds, within `record_bytes_max`, with an LSN above
    `last_lsn` (the last good LSN) and above every record found so far starts a run of
    records read with `scan_segment` (which checks the CRC); the search goes on after the
    run. Reads the rest of the file once, in `_READ_CHUNK_BYTES` pieces; never raises on
    bad data.
    """
    alignment = header.alignment
    file_size = handle.size()
    found = Survivors()
    floor = max(last_lsn, 0)
    boundary = (bad_offset // alignment + 1) * alignment
    unpack_header = _RECORD_HEADER.unpack_from
    while boundary + RECORD_HEADER_BYTES <= file_size:
        chunk = handle.pread(min(max(_READ_CHUNK_BYTES, alignment), file_size - boundary),
                             boundary)
        if len(chunk) < RECORD_HEADER_BYTES:
            break
        start = start_lsn = -1
        for at in range(0, len(chunk) - RECORD_HEADER_BYTES + 1, alignment):
            _crc, length, lsn, kind, _flags, _reserved, check = unpack_header(chunk, at)
            if (check == length ^ 0xFFFFFFFF and length <= record_bytes_max and lsn > floor
                    and (length > 0 or kind == RecordType.PAD)):
                start, start_lsn = boundary + at, lsn
                break
        if start < 0:
            boundary += -(-len(chunk) // alignment) * alignment
            continue
        result = ScanResult(start, -1, 0, True)
        for record in scan_segment(handle, header, start, start_lsn - 1, record_bytes_max,
                                   result):
            if found.records == 0:
                found.first_offset, found.first_lsn = record.offset, record.lsn
            found.records += 1
            found.bytes += RECORD_HEADER_BYTES + len(record.payload)
            found.last_lsn = record.lsn
            if record.kind == RecordType.PAD:
                found.synced_lsn_max = max(found.synced_lsn_max, pad_synced_lsn(record.payload))
        if result.records:
            floor = result.last_lsn
        boundary = (max(result.end_offset, start) // alignment + 1) * alignment
    return found


class JournalMark(NamedTuple):
    """A position in the journal: everything before (segment_id, offset) — the records
    up to `lsn` — is durable."""

    segment_id: int
    offset: int
    lsn: int


def segment_file_name(segment_id: int) -> str:
    return f"{segment_id:016x}.jnl"


def parse_segment_name(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    if ext != "jnl" or not dot or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None
