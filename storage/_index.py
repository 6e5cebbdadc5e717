"""The LMDB environment: entry locations, ledger records, entry-log metadata, the persisted
LastLogMark, and the metadata store the broker keeps its state in.

Named databases (keys big-endian, so byte order is numeric order):

| db          | key                          | value                                          |
|-------------|------------------------------|------------------------------------------------|
| `locations` | ledger u64 ‖ entry u64       | location u64 = entry-log id << 32 ‖ offset      |
| `ledgers`   | ledger u64                   | state, last entry, metadata (binary)            |
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

import lmdb

from ._crc import crc32c
from ._errors import CorruptionError
from ._gil import HAND_OVER_ITEMS, hand_over_gil
from ._journal import JournalMark

__all__ = ["CLOSED", "DELETED", "FENCED", "OPEN", "STATES", "CheckpointWrite", "EntryLogRecord",
           "Index", "LedgerRecord", "LoadedLedger", "LocationRun", "MetaOp", "MetadataPairs",
           "decode_ledger"]

OPEN = "open"
FENCED = "fenced"
CLOSED = "closed"
DELETED = "deleted"
STATES = (OPEN, FENCED, CLOSED, DELETED)  # a ledger record's state code is the position here
_STATE_CODES = {state: code for code, state in enumerate(STATES)}

_U64 = struct.Struct(">Q")
_KEY = struct.Struct(">QQ")
_MARK = struct.Struct(">QQQ")
# An entry-log record's head: form (`_LOG_FORMAT`), committed size, total bytes, sealed;
# then u64 pairs, little-endian (`array` items, swapped on a big-endian host).
_LOG_HEAD = struct.Struct("<cQQ?")
_LOG_FORMAT = b"\x01"
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_MARK_BYTES = _MARK.size + 4
# A ledger record's head: form (`_LEDGER_FORM`), state code, last entry id, metadata pairs;
# then each pair's key and value lengths in code points (u32 each), then the keys and values
# one after the other as UTF-8 (lone surrogates passed through).
_LEDGER_HEAD = struct.Struct("<cBqI")
_LEDGER_HEAD_ONE_PAIR = struct.Struct("<cBqIII")  # the usual record: a head and one pair
_LEDGER_FORM = b"\x01"
# Below this many locations a ledger, recovery finds every ledger's highest indexed entry in
# one scan of the locations; above it, with a seek per ledger (`Index.load_ledger_table`).
SCAN_LOCATIONS_PER_LEDGER_MAX = 8
U64_MAX = 2**64 - 1
_JSON_DECODE = json.JSONDecoder().raw_decode

# A metadata-store operation: (key, value) puts, (key, None) deletes.
MetaOp = tuple[bytes, bytes | None]
# A ledger's metadata as its (key, value) pairs.
MetadataPairs = tuple[tuple[str, str], ...]
# What recovery loads of a ledger: id, state, metadata, highest indexed entry (-1: none).
LoadedLedger = tuple[int, str, MetadataPairs, int]
_LENGTHS: dict[int, struct.Struct] = {}


def _lengths(count: int) -> struct.Struct:
    """The struct of a ledger record's `count` pairs of lengths."""
    found = _LENGTHS.get(count)
    if found is None:
        found = _LENGTHS[count] = struct.Struct(f"<{2 * count}I")
    return found


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return _KEY.pack(ledger_id, entry_id)


@dataclass
class LedgerRecord:
    """What the index remembers of a ledger. `state` is open, fenced, closed or deleted
    (a tombstone, kept so that journal replay skips the ledger's old records, until a
    checkpoint's mark is past them: `LedgerTable`)."""

    ledger_id: int
    state: str = OPEN
    last_entry_id: int = -1
    metadata: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The binary form (`_LEDGER_HEAD`, lengths, text). Recovery decodes every ledger's
        record: with a ledger per topic, JSON's decode (and the dict it builds) took most of
        a restart's load of 100,000 ledgers; this form decodes in a fraction."""
        texts = [text for pair in self.metadata.items() for text in pair]
        return (_LEDGER_HEAD.pack(_LEDGER_FORM, _STATE_CODES[self.state], self.last_entry_id,
                                  len(self.metadata))
                + _lengths(len(self.metadata)).pack(*map(len, texts))
                + "".join(texts).encode("utf-8", "surrogatepass"))

    @classmethod
    def decode(cls, ledger_id: int, raw: bytes) -> LedgerRecord:
        """As `decode_ledger` (either form).

        Raises:
            ValueError: the record is not one of either form, naming the ledger.
        """
        state, last, pairs = decode_ledger(ledger_id, raw)
        return cls(ledger_id, state, last, dict(pairs))


def decode_ledger(ledger_id: int, raw: bytes) -> tuple[str, int, MetadataPairs]:
    """A ledger record's state, last entry id and metadata pairs, from the binary form of
    `LedgerRecord.encode` or the JSON form of older data directories (an object, so it starts
    with "{"; recovery has the open's checkpoint rewrite those in the binary form).

    Raises:
        ValueError: the record is not one of either form, naming the ledger.
    """
    try:
        if raw[:1] == b"{":
            return _decode_json_ledger(raw)
        form, code, last, count = _LEDGER_HEAD.unpack_from(raw)
        if form != _LEDGER_FORM:
            raise ValueError(f"unknown form {form!r}")
        state = STATES[code]
        if 8 * count > len(raw) - _LEDGER_HEAD.size:
            raise ValueError(f"{count} metadata pairs cannot fit its {len(raw)} bytes")
        lengths = _lengths(count).unpack_from(raw, _LEDGER_HEAD.size)
        text = raw[_LEDGER_HEAD.size + 8 * count:].decode("utf-8", "surrogatepass")
        if sum(lengths) != len(text):
            raise ValueError(f"its metadata holds {len(text)} characters, its lengths say "
                             f"{sum(lengths)}")
        if count == 1:  # the usual case (a managed ledger's tag)
            key_end = lengths[0]
            return state, last, ((text[:key_end], text[key_end:]),)
        pairs, at = [], 0
        for key_length, value_length in zip(lengths[0::2], lengths[1::2], strict=True):
            key_end = at + key_length
            pairs.append((text[at:key_end], text[key_end:key_end + value_length]))
            at = key_end + value_length
        return state, last, tuple(pairs)
    except (ValueError, IndexError, KeyError, TypeError, struct.error) as exc:
        raise ValueError(f"ledger {ledger_id}: its record is unreadable "
                         f"({type(exc).__name__}: {exc})") from None


def _decode_json_ledger(raw: bytes) -> tuple[str, int, MetadataPairs]:
    # From str, without json.loads' sniffing of the encoding and its whitespace checks.
    text = raw.decode()
    body, end = _JSON_DECODE(text)
    if end != len(text):
        raise ValueError("trailing bytes after the record")
    state, last, meta = body["state"], body["last"], body["meta"]
    if state not in _STATE_CODES or not isinstance(last, int) or not isinstance(meta, dict):
        raise ValueError(f"state {state!r}, last entry {last!r}, metadata {meta!r:.60}")
    return state, last, tuple(meta.items())


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

    def load_ledger_table(self, without_lac: str) -> tuple[list[LoadedLedger], list[int]]:
        """Every ledger of the index, by id, with its highest indexed entry (-1 when none, and
        for a ledger in state `without_lac`: a deleted one): what recovery starts from, read
        in one transaction; and the ids of the ledgers whose record is in the older JSON form
        (recovery has the checkpoint rewrite them).

        The highest entries come from one scan of the locations when they hold at most
        `SCAN_LOCATIONS_PER_LEDGER_MAX` a ledger (a ledger per topic: a seek per ledger cost
        more than the scan), else from a seek per ledger.

        Raises:
            CorruptionError: a ledger's record is unreadable, naming the ledger.
        """
        unpack = _U64.unpack
        one_pair, one_pair_size = _LEDGER_HEAD_ONE_PAIR.unpack_from, _LEDGER_HEAD_ONE_PAIR.size
        found: list[LoadedLedger] = []
        append = found.append
        older: list[int] = []
        with self._env.begin() as txn:
            ledger_count = txn.stat(self._ledgers)["entries"]
            location_count = txn.stat(self._locations)["entries"]
            lac_of: Callable[[int, int], int]
            if location_count <= SCAN_LOCATIONS_PER_LEDGER_MAX * ledger_count:
                lac_of = self._highest_entries_scanned(txn).get
            else:
                lac_of = self._highest_entry_seeker(txn)
            try:
                for key, value in txn.cursor(db=self._ledgers).iternext():
                    (ledger_id,) = unpack(key)
                    try:  # `decode_ledger` of a record with one pair, inlined
                        form, code, _last, count, key_end, value_length = one_pair(value)
                        text = value[one_pair_size:].decode("utf-8", "surrogatepass")
                        if form != _LEDGER_FORM or count != 1 or \
                                key_end + value_length != len(text):
                            raise ValueError
                        state = STATES[code]
                        pairs: MetadataPairs = ((text[:key_end], text[key_end:]),)
                    except (ValueError, IndexError, struct.error):
                        state, _last, pairs = decode_ledger(ledger_id, value)
                        if value[:1] == b"{":
                            older.append(ledger_id)
                    append((ledger_id, state, pairs,
                            -1 if state == without_lac else lac_of(ledger_id, -1)))
            except ValueError as exc:
                raise CorruptionError(str(exc), path=self.path, offset=0) from None
        return found, older

    def _highest_entries_scanned(self, txn: Any) -> dict[int, int]:
        """Each ledger's highest indexed entry, from one scan of every location key (in key
        order, so a ledger's last key is its highest entry)."""
        ids = array("Q", b"".join(txn.cursor(db=self._locations).iternext(values=False)))
        if not _BIG_ENDIAN_HOST:
            ids.byteswap()
        return dict(zip(ids[0::2], ids[1::2], strict=True))

    def _highest_entry_seeker(self, txn: Any) -> Callable[[int, int], int]:
        """A function of (ledger id, default) that seeks a ledger's highest indexed entry
        (`default` when it has none) with one cursor, valid while `txn` is."""
        locations = txn.cursor(db=self._locations)
        pack, key_size = _KEY.pack, _KEY.size

        def highest(ledger_id: int, default: int) -> int:
            if locations.set_range(pack(ledger_id, U64_MAX)):
                moved = locations.prev()
            else:
                moved = locations.last()
            if moved:
                found_key = locations.key()
                assert len(found_key) == key_size
                found_ledger, entry_id = _KEY.unpack(found_key)
                if found_ledger == ledger_id:
                    return int(entry_id)
            return default

        return highest

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
