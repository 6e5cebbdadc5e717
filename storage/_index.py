"""The LMDB environment: entry locations, ledger records, entry-log metadata, the persisted
LastLogMark, and the metadata store the broker keeps its state in.

Named databases (keys big-endian, so byte order is numeric order):

| db          | key                          | value                                          |
|-------------|------------------------------|------------------------------------------------|
| `locations` | ledger u64 ‖ entry u64       | location u64 = entry-log id << 32 ‖ offset      |
| `ledgers`   | ledger u64                   | JSON: state, last entry, metadata               |
| `entrylogs` | entry-log id u64             | committed size, live bytes per ledger (binary)  |
| `meta`      | b"lastMark"                  | segment u64 ‖ offset u64 ‖ LSN u64 ‖ CRC32C u32 |
| `meta`      | b"nextLedgerId", ...         | u64 counters                                    |
| `kv`        | the caller's key             | the caller's value (the metadata store)         |

LMDB commits are atomic, and with `sync=True` durable once `commit()` returns. A checkpoint
writes the locations of a whole write-cache flush, the ledger records, the entry-log
metadata and the new mark in ONE transaction, so the index and the mark never disagree.
The persisted mark never goes backwards: `commit_checkpoint` asserts it.
"""

from __future__ import annotations

import json
import struct
import sys
import threading
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

import lmdb

from ._crc import crc32c
from ._gil import HAND_OVER_ITEMS, hand_over_gil
from ._journal import JournalMark

__all__ = ["CheckpointWrite", "EntryLogRecord", "Index", "LedgerRecord", "LocationRun",
           "MetaOp"]

_U64 = struct.Struct(">Q")
_KEY = struct.Struct(">QQ")
_MARK = struct.Struct(">QQQ")
# An entry-log record's head: form (`_LOG_FORMAT`), committed size, total bytes, sealed;
# then u64 pairs, little-endian (`array` items, swapped on a big-endian host).
_LOG_HEAD = struct.Struct("<cQQ?")
_LOG_FORMAT = b"\x01"
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_MARK_BYTES = _MARK.size + 4
U64_MAX = 2**64 - 1
_JSON_DECODE = json.JSONDecoder().raw_decode

# A metadata-store operation: (key, value) puts, (key, None) deletes.
MetaOp = tuple[bytes, bytes | None]


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return _KEY.pack(ledger_id, entry_id)


@dataclass
class LedgerRecord:
    """What the index remembers of a ledger. `state` is open, fenced, closed or deleted
    (a tombstone, kept so that journal replay skips the ledger's old records, until a
    checkpoint's mark is past them: `LedgerTable`)."""

    ledger_id: int
    state: str = "open"
    last_entry_id: int = -1
    metadata: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        body = {"state": self.state, "last": self.last_entry_id, "meta": self.metadata}
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, ledger_id: int, raw: bytes) -> LedgerRecord:
        # From str, without json.loads' sniffing of the encoding and its whitespace checks
        # (they cost as much as the parse, and recovery decodes every ledger's record).
        text = raw.decode()
        body, end = _JSON_DECODE(text)
        if end != len(text):
            raise ValueError(f"ledger {ledger_id}: trailing bytes after its record")
        return cls(ledger_id, body["state"], body["last"], body["meta"])


@dataclass
class EntryLogRecord:
    """GC metadata of one entry log: bytes committed so far and live bytes per ledger."""

    log_id: int
    size: int
    ledgers: dict[int, int] = field(default_factory=dict)
    total_bytes: int = 0
    sealed: bool = False

    def encode(self) -> bytes:
        """The binary form (`_LOG_HEAD`, then each ledger's id and live bytes as u64 pairs):
        a checkpoint writes the current log's record each time, and with a ledger per topic
        the map holds one for every topic written since the log began (JSON took ~1 µs a
        ledger to write and ~2 to read, holding the GIL; this a small fraction)."""
        pairs = array("Q", chain.from_iterable(self.ledgers.items()))
        if _BIG_ENDIAN_HOST:
            pairs.byteswap()
        return _LOG_HEAD.pack(_LOG_FORMAT, self.size, self.total_bytes,
                              self.sealed) + pairs.tobytes()

    @classmethod
    def decode(cls, log_id: int, raw: bytes) -> EntryLogRecord:
        """A record in the binary form of `encode`, or in the JSON form of older data
        directories (an object, so it starts with "{")."""
        if raw[:1] == b"{":
            body = json.loads(raw)
            ledgers = {int(k): int(v) for k, v in body["ledgers"].items()}
            return cls(log_id, body["size"], ledgers, body["total"], body["sealed"])
        form, size, total, sealed = _LOG_HEAD.unpack_from(raw)
        if form != _LOG_FORMAT:
            raise ValueError(f"entry-log record of log {log_id}: unknown form {form!r}")
        pairs = array("Q")
        pairs.frombytes(raw[_LOG_HEAD.size:])
        if _BIG_ENDIAN_HOST:
            pairs.byteswap()
        return cls(log_id, size, dict(zip(pairs[0::2], pairs[1::2], strict=True)), total,
                   sealed)

    def live_bytes(self) -> int:
        return sum(self.ledgers.values())


@dataclass
class LocationRun:
    """The locations of entries of one ledger, as a checkpoint's append returns them."""

    ledger_id: int
    entry_ids: list[int]
    locations: list[int]


@dataclass
class CheckpointWrite:
    """Everything one checkpoint commits, in one transaction."""

    mark: JournalMark | None
    location_runs: list[LocationRun] = field(default_factory=list)
    ledgers: list[LedgerRecord] = field(default_factory=list)
    purge_ledgers: list[int] = field(default_factory=list)
    drop_ledgers: list[int] = field(default_factory=list)  # tombstones to remove
    entry_logs: list[EntryLogRecord] = field(default_factory=list)
    drop_entry_logs: list[int] = field(default_factory=list)
    meta_ops: list[MetaOp] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    relocations: list[tuple[bytes, int, int]] = field(default_factory=list)


def encode_mark(mark: JournalMark) -> bytes:
    body = _MARK.pack(mark.segment_id, mark.offset, mark.lsn)
    return body + struct.pack(">I", crc32c(body))


def decode_mark(raw: bytes | None) -> JournalMark | None:
    """The mark, or None when missing or corrupt (then recovery replays every segment)."""
    if raw is None or len(raw) != _MARK_BYTES:
        return None
    body = raw[: _MARK.size]
    (stored,) = struct.unpack_from(">I", raw, _MARK.size)
    if crc32c(body) != stored:
        return None
    return JournalMark(*_MARK.unpack(body))


class Index:
    """The LMDB environment of a data directory."""

    def __init__(self, path: str, map_bytes: int, *, readonly: bool = False):
        """Open (creating when missing) the environment at `path`. `readonly` opens an
        existing one without writing anything, not even LMDB's lock file (for
        `magnetar storage check|inspect`; the caller makes sure no writer runs).

        Raises:
            lmdb.Error: the environment cannot be opened (readonly: also when it or one
                of its databases does not exist).
        """
        self.path = path
        if readonly:
            self._env = lmdb.open(path, max_dbs=8, readonly=True, lock=False,
                                  readahead=False, subdir=True, create=False)
        else:
            self._env = lmdb.open(path, map_size=map_bytes, max_dbs=8, sync=True,
                                  metasync=True, writemap=False, readahead=False, subdir=True)
        create = not readonly
        self._locations = self._env.open_db(b"locations", create=create)
        self._ledgers = self._env.open_db(b"ledgers", create=create)
        self._entrylogs = self._env.open_db(b"entrylogs", create=create)
        self._meta = self._env.open_db(b"meta", create=create)
        self.kv = self._env.open_db(b"kv", create=create)
        self._write_lock = threading.Lock()
        self.persisted_mark = self.load_mark()

    @property
    def env(self) -> lmdb.Environment:
        return self._env

    def close(self) -> None:
        self._env.close()

    # -- reads ---------------------------------------------------------------------------

    def load_mark(self) -> JournalMark | None:
        with self._env.begin(db=self._meta) as txn:
            return decode_mark(txn.get(b"lastMark"))

    def raw_mark(self) -> bytes | None:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(b"lastMark")
            return None if raw is None else bytes(raw)

    def counter(self, name: str) -> int:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(name.encode())
            return 0 if raw is None else int(_U64.unpack(raw)[0])

    def load_ledgers(self) -> dict[int, LedgerRecord]:
        found = {}
        with self._env.begin(db=self._ledgers) as txn:
            for key, value in txn.cursor():
                ledger_id = _U64.unpack(key)[0]
                found[ledger_id] = LedgerRecord.decode(ledger_id, value)
        return found

    def load_ledgers_and_lacs(self, without_lac: str) -> list[tuple[LedgerRecord, int]]:
        """Every ledger record, by id, with its highest indexed entry (-1 when none, and for
        a ledger in state `without_lac`: a deleted one): what recovery starts from, read in
        one transaction with one cursor over the locations (a transaction per ledger cost
        as much as the rest)."""
        found = []
        unpack, pack, key_size = _U64.unpack, _KEY.pack, _KEY.size
        decode = LedgerRecord.decode
        with self._env.begin() as txn:
            locations = txn.cursor(db=self._locations)
            for key, value in txn.cursor(db=self._ledgers):
                ledger_id = unpack(key)[0]
                record = decode(ledger_id, value)
                lac = -1
                if record.state != without_lac:
                    if locations.set_range(pack(ledger_id, U64_MAX)):
                        moved = locations.prev()
                    else:
                        moved = locations.last()
                    if moved:
                        found_key = locations.key()
                        assert len(found_key) == key_size
                        found_ledger, entry_id = _KEY.unpack(found_key)
                        if found_ledger == ledger_id:
                            lac = entry_id
                found.append((record, lac))
        return found

    def load_entry_logs(self) -> dict[int, EntryLogRecord]:
        found = {}
        with self._env.begin(db=self._entrylogs) as txn:
            for key, value in txn.cursor():
                log_id = _U64.unpack(key)[0]
                found[log_id] = EntryLogRecord.decode(log_id, value)
        return found

    def location(self, ledger_id: int, entry_id: int) -> int | None:
        with self._env.begin(db=self._locations) as txn:
            raw = txn.get(_KEY.pack(ledger_id, entry_id))
            return None if raw is None else int(_U64.unpack(raw)[0])

    def locations(self, ledger_id: int, first: int, last: int) -> list[tuple[int, int]]:
        """(entry id, location) for the indexed entries of a ledger in [first, last]."""
        keys: list[bytes] = []
        values: list[bytes] = []
        end_key = _KEY.pack(ledger_id, last)
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(_KEY.pack(ledger_id, first)):
                return []
            for key, value in cursor:
                if key > end_key:
                    break
                keys.append(key)
                values.append(value)
        # Unpacked all at once: a catch-up read asks for a thousand locations a call.
        count = len(keys)
        raw_keys, raw_values = b"".join(keys), b"".join(values)
        assert len(raw_keys) == _KEY.size * count
        assert len(raw_values) == _U64.size * count
        ids = struct.unpack(f">{2 * count}Q", raw_keys)[1::2]
        return list(zip(ids, struct.unpack(f">{count}Q", raw_values), strict=True))

    def last_indexed_entry(self, ledger_id: int) -> int:
        """Highest indexed entry id of a ledger, -1 when none."""
        with self._env.begin(db=self._locations) as txn:
            cursor = txn.cursor()
            if cursor.set_range(_KEY.pack(ledger_id, U64_MAX)):
                if not cursor.prev():
                    return -1
            elif not cursor.last():
                return -1
            found_ledger, entry_id = _KEY.unpack(cursor.key())
            return int(entry_id) if found_ledger == ledger_id else -1

    def iter_locations(self) -> Iterator[tuple[int, int, int]]:
        """Every (ledger, entry, location), in key order."""
        with self._env.begin(db=self._locations) as txn:
            for key, value in txn.cursor():
                ledger_id, entry_id = _KEY.unpack(key)
                yield ledger_id, entry_id, _U64.unpack(value)[0]

    # -- the checkpoint commit -----------------------------------------------------------

    def commit_checkpoint(self, write: CheckpointWrite) -> None:
        """Apply one checkpoint atomically and durably.

        On error nothing of it is applied (LMDB aborts the transaction).
        """
        with self._write_lock, self._env.begin(write=True) as txn:
            self._apply(txn, write)
        if write.mark is not None:
            self.persisted_mark = write.mark

    def _apply(self, txn: Any, write: CheckpointWrite) -> None:
        if write.location_runs:
            self._put_locations(txn, write)
        for key, old, new in write.relocations:
            current = txn.get(key, db=self._locations)
            if current is not None and _U64.unpack(current)[0] == old:
                txn.put(key, _U64.pack(new), db=self._locations)
        for ledger_id in write.purge_ledgers:
            self._delete_ledger_range(txn, ledger_id)
        for record in write.ledgers:
            txn.put(_U64.pack(record.ledger_id), record.encode(), db=self._ledgers)
        for ledger_id in write.drop_ledgers:  # after the puts: a tombstone may be in both
            self._delete_ledger_range(txn, ledger_id)  # (normally purged already)
            txn.delete(_U64.pack(ledger_id), db=self._ledgers)
        for log_record in write.entry_logs:
            txn.put(_U64.pack(log_record.log_id), log_record.encode(), db=self._entrylogs)
        for log_id in write.drop_entry_logs:
            txn.delete(_U64.pack(log_id), db=self._entrylogs)
        for key, value in write.meta_ops:
            if value is None:
                txn.delete(key, db=self.kv)
            else:
                txn.put(key, value, db=self.kv)
        for name, count in write.counters.items():
            raw = txn.get(name.encode(), db=self._meta)
            if raw is None or _U64.unpack(raw)[0] < count:
                txn.put(name.encode(), _U64.pack(count), db=self._meta)
        if write.mark is not None:
            persisted = decode_mark(txn.get(b"lastMark", db=self._meta))
            assert persisted is None or write.mark >= persisted, (
                f"mark would regress from {persisted} to {write.mark}")
            txn.put(b"lastMark", encode_mark(write.mark), db=self._meta)

    def _put_locations(self, txn: Any, write: CheckpointWrite) -> None:
        """The locations' puts: C loops (putmulti over maps of the keys' and values'
        packing) of `HAND_OVER_ITEMS` puts; between them the GIL is handed over, as the
        checkpoint's append does (`_gil.py`): packing a second's locations in one go held
        it for a millisecond or more."""
        pack, pack_key = _U64.pack, _KEY.pack
        cursor = txn.cursor(db=self._locations)
        since_hand_over = 0
        for run in write.location_runs:
            start = 0
            while start < len(run.entry_ids):
                if since_hand_over >= HAND_OVER_ITEMS:
                    hand_over_gil()
                    since_hand_over = 0
                stop = start + HAND_OVER_ITEMS - since_hand_over
                ids = run.entry_ids[start:stop]
                cursor.putmulti(zip(map(pack_key, repeat(run.ledger_id), ids),
                                    map(pack, run.locations[start:stop]), strict=True))
                since_hand_over += len(ids)
                start = stop

    def _delete_ledger_range(self, txn: Any, ledger_id: int) -> None:
        cursor = txn.cursor(db=self._locations)
        prefix = _U64.pack(ledger_id)
        if not cursor.set_range(prefix):
            return
        while cursor.key()[:8] == prefix:
            if not cursor.delete():
                break

    def write_mark_raw(self, raw: bytes | None) -> None:
        """Overwrite or remove the stored mark as is (crash tests and operator repair)."""
        with self._write_lock, self._env.begin(write=True, db=self._meta) as txn:
            if raw is None:
                txn.delete(b"lastMark")
            else:
                txn.put(b"lastMark", raw)
        self.persisted_mark = self.load_mark()
