"""Entry logs: where entries live once a checkpoint has flushed them from the write cache.

File `entrylogs/<08x log id>.log`. Header, the first 1024 bytes:

| offset | size | field                                             |
|--------|------|---------------------------------------------------|
| 0      | 4    | magic "PELG"                                      |
| 4      | 4    | version (1)                                       |
| 8      | 8    | ledgers-map offset (0 until the log is sealed)    |
| 16     | 4    | ledgers-map count                                 |
| 20     | 8    | log id                                            |
| 28     | 4    | CRC32C of bytes 0..27                             |

Records follow back to back:

| offset | size | field                                             |
|--------|------|---------------------------------------------------|
| 0      | 4    | size S of what follows the CRC (16 + data length) |
| 4      | 4    | CRC32C of the S bytes that follow                 |
| 8      | 8    | ledger id                                         |
| 16     | 8    | entry id                                          |
| 24     | S-16 | the entry's bytes                                 |

A location is `log id << 32 | offset of the record`. When a log is sealed, a ledgers map is
appended as one more record with ledger id 2**64-1 and entry id 2**64-2, whose data is a
count u32 and `count` pairs (ledger u64, bytes u64); then the header is rewritten to point
at it. The LMDB `entrylogs` table is the authority on how much of a log is committed: bytes
past that size were written by a checkpoint that never committed, and nothing points at
them.
"""

from __future__ import annotations

import os
import struct
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, groupby, islice, repeat
from operator import add, itemgetter

from ._crc import crc32c, crc32c_native
from ._errors import CorruptionError
from ._fs import FileHandle, FileSystem
from ._gil import HAND_OVER_BYTES, HAND_OVER_ITEMS, hand_over_gil

__all__ = [
    "ENTRY_LOG_HEADER_BYTES",
    "EntryLogReader",
    "EntryLogWriter",
    "LogRecord",
    "entry_log_name",
    "location_of",
    "parse_entry_log_name",
    "scan_entry_log",
    "split_location",
]

ENTRY_LOG_HEADER_BYTES = 1024
MAGIC = b"PELG"
VERSION = 1
_HEADER = struct.Struct(">4sIQIQ")
assert _HEADER.size == 28
_RECORD = struct.Struct(">IIQQ")
RECORD_HEADER_BYTES = _RECORD.size
assert RECORD_HEADER_BYTES == 24
_SIZE_CRC = struct.Struct(">II")
_SIZE = struct.Struct(">I")
_IDS = struct.Struct(">QQ")
MAP_LEDGER_ID = 2**64 - 1
MAP_ENTRY_ID = 2**64 - 2
OFFSET_BITS = 32
_OFFSET_MASK = 2**OFFSET_BITS - 1
_RUN_TAIL_BYTES = 64 * 1024  # read past a run's last location: its record, most often
# A writer starts the writeback of what it appended every this many bytes (`FileHandle.
# start_writeback`), so that a checkpoint's entry-log fdatasync finds at most about this much
# still to write: one big sync (5 MB after a second at 5,000 1 KB msg/s, 64 MB after a full
# write cache) made the journal's fdatasyncs that overlap it wait behind it on the disk.
WRITEBACK_BYTES = 1024 * 1024


def entry_log_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


def parse_entry_log_name(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    if ext != "log" or not dot or len(stem) != 8:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def location_of(log_id: int, offset: int) -> int:
    assert 0 <= offset < 2**OFFSET_BITS
    assert log_id >= 1
    return (log_id << OFFSET_BITS) | offset


def split_location(location: int) -> tuple[int, int]:
    return location >> OFFSET_BITS, location & (2**OFFSET_BITS - 1)


def _encode_header(log_id: int, map_offset: int, map_count: int) -> bytes:
    fields = _HEADER.pack(MAGIC, VERSION, map_offset, map_count, log_id)
    block = fields + struct.pack(">I", crc32c(fields))
    return block + bytes(ENTRY_LOG_HEADER_BYTES - len(block))


def encode_entry(out: bytearray, ledger_id: int, entry_id: int, data: bytes) -> None:
    ids = _IDS.pack(ledger_id, entry_id)
    out += _SIZE_CRC.pack(16 + len(data), crc32c(data, crc32c(ids)))
    out += ids
    out += data


class EntryLogWriter:
    """Appends to one entry log. Not thread-safe: the checkpoint owns it."""

    def __init__(self, fs: FileSystem, directory: str, log_id: int):
        self.log_id = log_id
        self.path = os.path.join(directory, entry_log_name(log_id))
        self._fs = fs
        self._handle = fs.open(self.path, create=True)
        try:
            self._handle.pwrite(_encode_header(log_id, 0, 0), 0)
            self._handle.fdatasync()
            fs.fsync_dir(directory)
        except BaseException:
            self._handle.close()
            raise
        self.position = ENTRY_LOG_HEADER_BYTES
        self._writeback_from = self.position  # the first byte no writeback was started for
        self.ledger_bytes: dict[int, int] = {}
        # Records and bytes written since the GIL was last handed over (`append_run`).
        self._records_unhanded = self._bytes_unhanded = 0

    def append(self, entries: list[tuple[int, int, bytes]]) -> list[int]:
        """Write records for (ledger, entry, data) triples; returns their locations. Not
        durable until `sync`. Each stretch of one ledger goes to `append_run`.

        Raises:
            OSError: as `append_run`.
        """
        locations: list[int] = []
        for ledger_id, group in groupby(entries, key=itemgetter(0)):
            items = list(group)
            locations += self.append_run(ledger_id, [item[1] for item in items],
                                         [item[2] for item in items])
        return locations

    def append_run(self, ledger_id: int, entry_ids: Sequence[int],
                   datas: Sequence[bytes]) -> list[int]:
        """Write records for entries `entry_ids` of one ledger, whose data are `datas`;
        returns their locations. Not durable until `sync`.

        The checkpoint's hot path, with no Python code per record: a chunk of records is
        encoded by maps of C functions (the ids' packing, the CRCs, the heads' packing)
        joined into one buffer, and its locations are a running sum. No object per record
        outlives the call (a tuple per record cost as much again in cyclic-GC passes, which
        hold the GIL). It writes and hands the GIL over (`_gil.py`) every `HAND_OVER_ITEMS`
        records or `HAND_OVER_BYTES` bytes, counted across calls, so that the event loop
        never waits long for it behind a big flush.

        Raises:
            OSError: a write failed; the records of the chunks before it are in the file
                (nothing points at them: the index commit that would is not made).
        """
        count = len(entry_ids)
        assert self.log_id >= 1
        assert len(datas) == count
        locations: list[int] = []
        pack_ids, pack_size_crc, crc = _IDS.pack, _SIZE_CRC.pack, crc32c_native
        start = 0
        while start < count:
            if (self._records_unhanded >= HAND_OVER_ITEMS
                    or self._bytes_unhanded >= HAND_OVER_BYTES):
                hand_over_gil()
                self._records_unhanded = self._bytes_unhanded = 0
            stop = start + HAND_OVER_ITEMS - self._records_unhanded
            chunk = datas[start:stop]
            sizes = list(map(len, chunk))
            # At least one record; no more than the bytes left before the next hand-over.
            fitting = max(1, bisect_right(list(accumulate(sizes)),
                                          HAND_OVER_BYTES - self._bytes_unhanded))
            if fitting < len(chunk):
                chunk, sizes = chunk[:fitting], sizes[:fitting]
            stop = start + len(chunk)
            blocks = list(map(pack_ids, repeat(ledger_id), entry_ids[start:stop]))
            heads = map(pack_size_crc, map(add, sizes, repeat(16)),
                        map(crc, chunk, map(crc, blocks, repeat(0))))
            out = b"".join(chain.from_iterable(zip(heads, blocks, chunk, strict=True)))
            # A location is log id << 32 | offset, and an offset is < 2**32: the running
            # sum of the record sizes from the first location.
            first = (self.log_id << OFFSET_BITS) | self.position
            locations += islice(accumulate(map(add, sizes, repeat(RECORD_HEADER_BYTES)),
                                           initial=first), len(chunk))
            self._write(out)
            self._records_unhanded += len(chunk)
            self._bytes_unhanded += len(out)
            self.ledger_bytes[ledger_id] = self.ledger_bytes.get(ledger_id, 0) + len(out)
            start = stop
        if count:
            assert locations[-1] & _OFFSET_MASK == self.position - RECORD_HEADER_BYTES - len(
                datas[-1])
            assert locations[-1] >> OFFSET_BITS == self.log_id, "a location keeps a 32-bit offset"
        return locations

    def _write(self, out: bytes | bytearray) -> None:
        self._handle.pwrite(out, self.position)
        self.position += len(out)
        if self.position - self._writeback_from >= WRITEBACK_BYTES:
            self._handle.start_writeback(self._writeback_from,
                                         self.position - self._writeback_from)
            self._writeback_from = self.position

    def sync(self) -> None:
        self._handle.fdatasync()

    def seal(self) -> None:
        """Append the ledgers map, sync, then point the header at it and sync again."""
        pairs = sorted(self.ledger_bytes.items())
        body = struct.pack(">I", len(pairs)) + b"".join(struct.pack(">QQ", k, v)
                                                        for k, v in pairs)
        out = bytearray()
        encode_entry(out, MAP_LEDGER_ID, MAP_ENTRY_ID, body)
        map_offset = self.position
        self._handle.pwrite(out, map_offset)
        self.position += len(out)
        self._handle.fdatasync()
        self._handle.pwrite(_encode_header(self.log_id, map_offset, len(pairs)), 0)
        self._handle.fdatasync()

    def close(self) -> None:
        self._handle.close()


@dataclass(frozen=True)
class LogRecord:
    offset: int
    ledger_id: int
    entry_id: int
    data: bytes

    @property
    def record_bytes(self) -> int:
        return RECORD_HEADER_BYTES + len(self.data)


def _parse_record(buffer: bytes | memoryview, at: int, path: str, file_offset: int,
                  ) -> tuple[int, int, bytes, int]:
    """Parse the record at `buffer[at:]`; returns (ledger, entry, data, next position).

    Raises CorruptionError naming `path` and `file_offset` on any inconsistency.
    """
    if len(buffer) - at < RECORD_HEADER_BYTES:
        raise CorruptionError("entry-log record is truncated", path=path, offset=file_offset)
    size, crc, ledger_id, entry_id = _RECORD.unpack_from(buffer, at)
    end = at + 8 + size
    if size < 16 or end > len(buffer):
        raise CorruptionError(f"entry-log record size {size} is invalid", path=path,
                              offset=file_offset)
    body = buffer[at + 8:end]
    if crc32c(body) != crc:
        raise CorruptionError("entry-log record fails its CRC", path=path, offset=file_offset)
    return ledger_id, entry_id, bytes(body[16:]), end


def scan_entry_log(handle: FileHandle, path: str, end: int | None = None,
                   chunk_bytes: int = 4 * 1024 * 1024) -> Iterator[LogRecord]:
    """Yield the valid records of a log up to `end` (default: the file's size), skipping
    the ledgers map. Stops quietly at the first short or invalid record (a tail a
    checkpoint wrote but never committed)."""
    limit = handle.size() if end is None else min(end, handle.size())
    offset = ENTRY_LOG_HEADER_BYTES
    while offset + RECORD_HEADER_BYTES <= limit:
        buffer = handle.pread(min(chunk_bytes, limit - offset), offset)
        at = 0
        while at + RECORD_HEADER_BYTES <= len(buffer):
            (size,) = struct.unpack_from(">I", buffer, at)
            if at + 8 + size > len(buffer):
                if at == 0:  # one record larger than the chunk
                    buffer = handle.pread(8 + size, offset)
                    if len(buffer) < 8 + size:
                        return
                    continue
                break
            try:
                ledger_id, entry_id, data, nxt = _parse_record(buffer, at, path, offset + at)
            except CorruptionError:
                return
            if ledger_id != MAP_LEDGER_ID:
                yield LogRecord(offset + at, ledger_id, entry_id, data)
            at = nxt
        if at == 0:
            return
        offset += at


def _run_read_bytes(wanted: list[tuple[int, int]], index: int, log_id: int, offset: int,
                    read_bytes_max: int) -> int:
    """How much to read at `offset` for the run from `wanted[index]`: up to the last
    wanted location plus room for its record (twice the run's mean record spacing), when
    that location is in the same log after `offset`; else `read_bytes_max`. A record that
    does not fit is read again by itself."""
    last_log, last_offset = split_location(wanted[-1][1])
    if last_log != log_id or last_offset < offset:
        return read_bytes_max
    spacing = (last_offset - offset) // max(1, len(wanted) - index - 1)
    return min(read_bytes_max, last_offset - offset + max(_RUN_TAIL_BYTES, 2 * spacing))


def read_header(handle: FileHandle, path: str) -> tuple[int, int, int]:
    """(log id, map offset, map count) from a log's header.

    Raises CorruptionError (offset 0) on a short header, bad magic, version or CRC.
    """
    raw = handle.pread(_HEADER.size + 4, 0)
    if len(raw) < _HEADER.size + 4:
        raise CorruptionError("entry-log header is truncated", path=path, offset=0)
    (stored,) = struct.unpack_from(">I", raw, _HEADER.size)
    if crc32c(raw[: _HEADER.size]) != stored:
        raise CorruptionError("entry-log header fails its CRC", path=path, offset=0)
    magic, version, map_offset, map_count, log_id = _HEADER.unpack_from(raw)
    if magic != MAGIC or version != VERSION:
        raise CorruptionError("not an entry log", path=path, offset=0)
    return log_id, map_offset, map_count


class EntryLogReader:
    """Reads entries by location, keeping up to `open_logs_max` logs open (LRU)."""

    def __init__(self, fs: FileSystem, directory: str, open_logs_max: int):
        assert open_logs_max >= 1
        self._fs = fs
        self._dir = directory
        self._open_logs_max = open_logs_max
        self._handles: OrderedDict[int, FileHandle] = OrderedDict()
        self._lock = threading.Lock()

    def path(self, log_id: int) -> str:
        return os.path.join(self._dir, entry_log_name(log_id))

    def _handle(self, log_id: int) -> FileHandle:
        with self._lock:
            handle = self._handles.get(log_id)
            if handle is not None:
                self._handles.move_to_end(log_id)
                return handle
            handle = self._fs.open_read(self.path(log_id))
            self._handles[log_id] = handle
            while len(self._handles) > self._open_logs_max:
                _, evicted = self._handles.popitem(last=False)
                evicted.close()
            return handle

    def forget(self, log_id: int) -> None:
        """Close a log's handle (before the log is deleted)."""
        with self._lock:
            handle = self._handles.pop(log_id, None)
        if handle is not None:
            handle.close()

    def read(self, location: int, ledger_id: int, entry_id: int) -> bytes:
        """The entry at `location`, checked against its CRC and ids.

        Raises CorruptionError naming the log file and offset.
        """
        log_id, offset = split_location(location)
        handle = self._handle(log_id)
        head = handle.pread(8, offset)
        if len(head) < 8:
            raise CorruptionError("entry-log record is truncated", path=handle.path,
                                  offset=offset)
        (size,) = struct.unpack_from(">I", head)
        raw = handle.pread(8 + size, offset) if 16 <= size < 2**31 else head
        found_ledger, found_entry, data, _ = _parse_record(raw, 0, handle.path, offset)
        self._check_ids(handle.path, offset, (ledger_id, entry_id), (found_ledger, found_entry))
        return data

    def read_run(self, ledger_id: int, wanted: list[tuple[int, int]],
                 read_bytes_max: int) -> list[bytes]:
        """Entries for (entry id, location) pairs, in order. Locations that follow each
        other in one log are fetched with one read of up to `read_bytes_max` bytes."""
        out: list[bytes] = []
        index = 0
        while index < len(wanted):
            log_id, offset = split_location(wanted[index][1])
            handle = self._handle(log_id)
            buffer = handle.pread(
                _run_read_bytes(wanted, index, log_id, offset, read_bytes_max), offset)
            taken = self._parse_run(handle.path, buffer, log_id, offset, ledger_id,
                                    wanted, index, out)
            if taken == 0:  # larger than one read: fall back to a single read
                entry_id, location = wanted[index]
                out.append(self.read(location, ledger_id, entry_id))
                taken = 1
            index += taken
        return out

    def _parse_run(self, path: str, buffer: bytes, log_id: int, offset: int, ledger_id: int,
                   wanted: list[tuple[int, int]], index: int, out: list[bytes]) -> int:
        """Append to `out` the data of `wanted[index:]` records that follow each other in
        `buffer`, read at `offset` of log `log_id`, and that fit in it whole; returns how
        many. The catch-up read's hot loop: views instead of copies, checks inlined.

        Raises CorruptionError naming `path` and the record's offset.
        """
        view = memoryview(buffer)
        size_of, unpack_record = _SIZE.unpack_from, _RECORD.unpack_from
        at, first = 0, index
        while index < len(wanted):
            entry_id, location = wanted[index]
            if location >> OFFSET_BITS != log_id or location & _OFFSET_MASK != offset + at:
                break
            if at + 8 > len(buffer):
                break
            end = at + 8 + size_of(buffer, at)[0]
            if end > len(buffer):
                break
            if end - at < RECORD_HEADER_BYTES:  # shorter than its header: say how
                _parse_record(buffer, at, path, offset + at)
                raise AssertionError("_parse_record accepted a record shorter than a header")
            _, crc, found_ledger, found_entry = unpack_record(buffer, at)
            if crc32c(view[at + 8:end]) != crc:
                raise CorruptionError("entry-log record fails its CRC", path=path,
                                      offset=offset + at)
            if found_ledger != ledger_id or found_entry != entry_id:
                self._check_ids(path, offset + at, (ledger_id, entry_id),
                                (found_ledger, found_entry))
            out.append(bytes(view[at + RECORD_HEADER_BYTES:end]))
            at = end
            index += 1
        return index - first

    @staticmethod
    def _check_ids(path: str, offset: int, wanted: tuple[int, int],
                   found: tuple[int, int]) -> None:
        if wanted != found:
            raise CorruptionError(
                f"entry-log record holds ledger {found[0]} entry {found[1]}, "
                f"index expects ledger {wanted[0]} entry {wanted[1]}", path=path, offset=offset)

    def close(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            handle.close()
