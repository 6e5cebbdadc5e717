"""The LMDB index: locations, last indexed entry, the persisted mark, and checkpoint
commits (atomic, never regressing the mark, conditional relocations)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.storage import JournalMark
from magnetar.storage._index import (
    CheckpointWrite,
    EntryLogRecord,
    Index,
    LedgerRecord,
    LocationRun,
    decode_mark,
    encode_mark,
    location_key,
)

U64_MAX = 2**64 - 1


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    opened = Index(str(tmp_path / "index"), 64 * 1024 * 1024)
    yield opened
    opened.close()


def put_locations(index: Index, items: dict[tuple[int, int], int]) -> None:
    index.commit_checkpoint(CheckpointWrite(mark=None, location_runs=[
        LocationRun(lid, [e], [loc]) for (lid, e), loc in items.items()]))


# -- locations ---------------------------------------------------------------------------

def test_locations_round_trip(index: Index) -> None:
    items = {(1, e): 1000 + e for e in range(10)}
    items |= {(2, e): 2000 + e for e in range(5)}
    items[(2**63, 0)] = 77
    put_locations(index, items)
    for (ledger_id, entry_id), location in items.items():
        assert index.location(ledger_id, entry_id) == location
    assert index.location(1, 10) is None
    assert index.location(3, 0) is None
    assert index.locations(1, 3, 6) == [(e, 1000 + e) for e in range(3, 7)]
    assert index.locations(1, 8, 100) == [(8, 1008), (9, 1009)]
    assert index.locations(2, 0, U64_MAX) == [(e, 2000 + e) for e in range(5)]
    assert index.locations(3, 0, U64_MAX) == []
    assert index.locations(2**63 + 1, 0, 10) == []
    assert list(index.iter_locations()) == sorted((lid, e, loc) for (lid, e), loc in items.items())


def test_keys_sort_numerically() -> None:
    assert location_key(1, 255) < location_key(1, 256) < location_key(2, 0)
    assert location_key(2**40, 0) > location_key(2**39, U64_MAX)


def test_last_indexed_entry(index: Index) -> None:
    put_locations(index, {(1, e): e + 1 for e in range(4)}
                  | {(3, e): e + 1 for e in (0, 1, 7)}
                  | {(5, U64_MAX - 1): 9})
    assert index.last_indexed_entry(1) == 3
    assert index.last_indexed_entry(3) == 7
    assert index.last_indexed_entry(5) == U64_MAX - 1
    assert index.last_indexed_entry(0) == -1, "before the first ledger"
    assert index.last_indexed_entry(2) == -1, "between ledgers"
    assert index.last_indexed_entry(4) == -1
    assert index.last_indexed_entry(6) == -1, "after the last ledger"


def test_last_indexed_entry_of_an_empty_index(index: Index) -> None:
    assert index.last_indexed_entry(1) == -1


def test_purge_deletes_one_ledger_only(index: Index) -> None:
    put_locations(index, {(lid, e): lid * 100 + e for lid in (1, 2, 3) for e in range(20)})
    index.commit_checkpoint(CheckpointWrite(mark=None, purge_ledgers=[2, 9]))
    assert index.locations(2, 0, U64_MAX) == []
    assert index.last_indexed_entry(2) == -1
    assert len(index.locations(1, 0, U64_MAX)) == 20
    assert len(index.locations(3, 0, U64_MAX)) == 20


def test_purge_of_the_last_ledger(index: Index) -> None:
    put_locations(index, {(lid, e): 1 for lid in (1, 2) for e in range(3)})
    index.commit_checkpoint(CheckpointWrite(mark=None, purge_ledgers=[2]))
    assert [lid for lid, _, _ in index.iter_locations()] == [1, 1, 1]


# -- the mark ----------------------------------------------------------------------------

@given(st.integers(0, U64_MAX), st.integers(0, U64_MAX), st.integers(0, U64_MAX))
def test_mark_round_trip(segment_id: int, offset: int, lsn: int) -> None:
    mark = JournalMark(segment_id, offset, lsn)
    raw = encode_mark(mark)
    assert len(raw) == 28
    assert decode_mark(raw) == mark


@given(st.integers(0, 27), st.integers(1, 255))
def test_corrupt_mark_decodes_to_none(at: int, mask: int) -> None:
    raw = bytearray(encode_mark(JournalMark(3, 8192, 41)))
    raw[at] ^= mask
    assert decode_mark(bytes(raw)) is None


def test_missing_or_wrong_length_mark_decodes_to_none() -> None:
    raw = encode_mark(JournalMark(3, 8192, 41))
    assert decode_mark(None) is None
    assert decode_mark(raw[:-1]) is None
    assert decode_mark(raw + b"\x00") is None
    assert decode_mark(b"") is None


def test_mark_persists_across_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "index")
    first = Index(path, 64 * 1024 * 1024)
    assert first.persisted_mark is None
    first.commit_checkpoint(CheckpointWrite(mark=JournalMark(2, 4096, 10)))
    assert first.persisted_mark == JournalMark(2, 4096, 10)
    first.close()
    second = Index(path, 64 * 1024 * 1024)
    assert second.persisted_mark == JournalMark(2, 4096, 10)
    assert second.load_mark() == JournalMark(2, 4096, 10)
    second.close()


def test_corrupt_stored_mark_loads_as_none(index: Index) -> None:
    index.commit_checkpoint(CheckpointWrite(mark=JournalMark(2, 4096, 10)))
    raw = bytearray(encode_mark(JournalMark(2, 4096, 10)))
    raw[3] ^= 1
    index.write_mark_raw(bytes(raw))
    assert index.persisted_mark is None
    assert index.raw_mark() == bytes(raw)
    index.write_mark_raw(None)
    assert index.raw_mark() is None
    assert index.persisted_mark is None


def test_commit_refuses_to_regress_the_mark(index: Index) -> None:
    index.commit_checkpoint(CheckpointWrite(mark=JournalMark(3, 8192, 50)))
    stale = CheckpointWrite(mark=JournalMark(3, 4096, 20),
                            location_runs=[LocationRun(1, [0], [5])],
                            ledgers=[LedgerRecord(1, "open", 0, {})])
    with pytest.raises(AssertionError, match="regress"):
        index.commit_checkpoint(stale)
    assert index.persisted_mark == JournalMark(3, 8192, 50)
    assert index.load_mark() == JournalMark(3, 8192, 50)
    assert index.location(1, 0) is None, "the refused commit applied nothing"
    assert index.load_ledgers() == {}


def test_commit_refuses_an_older_segment(index: Index) -> None:
    index.commit_checkpoint(CheckpointWrite(mark=JournalMark(4, 4096, 50)))
    with pytest.raises(AssertionError):
        index.commit_checkpoint(CheckpointWrite(mark=JournalMark(3, 1 << 30, 60)))
    assert index.load_mark() == JournalMark(4, 4096, 50)


def test_commit_accepts_an_equal_or_later_mark(index: Index) -> None:
    index.commit_checkpoint(CheckpointWrite(mark=JournalMark(4, 4096, 50)))
    index.commit_checkpoint(CheckpointWrite(mark=JournalMark(4, 4096, 50)))
    index.commit_checkpoint(CheckpointWrite(mark=JournalMark(5, 4096, 51)))
    assert index.load_mark() == JournalMark(5, 4096, 51)


def test_commit_without_a_mark_keeps_it(index: Index) -> None:
    index.commit_checkpoint(CheckpointWrite(mark=JournalMark(4, 4096, 50)))
    put_locations(index, {(1, 0): 1})
    assert index.load_mark() == JournalMark(4, 4096, 50)


# -- relocations, records, counters ------------------------------------------------------

def test_relocations_apply_only_where_the_old_copy_is_referenced(index: Index) -> None:
    put_locations(index, {(1, 0): 100, (1, 1): 101, (1, 2): 555})
    index.commit_checkpoint(CheckpointWrite(mark=None, relocations=[
        (location_key(1, 0), 100, 900),   # still points at the old copy: moved
        (location_key(1, 1), 999, 901),   # points elsewhere (rewritten since): kept
        (location_key(1, 3), 103, 903),   # deleted since: not resurrected
    ]))
    assert index.location(1, 0) == 900
    assert index.location(1, 1) == 101
    assert index.location(1, 2) == 555
    assert index.location(1, 3) is None


def test_relocation_after_purge_in_the_same_commit_does_nothing(index: Index) -> None:
    put_locations(index, {(4, 0): 100})
    index.commit_checkpoint(CheckpointWrite(mark=None, purge_ledgers=[4],
                                            relocations=[(location_key(4, 0), 100, 200)]))
    # Relocations run before the purge; either way the purged ledger has no locations.
    assert index.location(4, 0) is None


def test_ledger_records_round_trip(index: Index) -> None:
    records = [LedgerRecord(1, "open", -1, {}), LedgerRecord(2, "fenced", 9, {"a": "b"}),
               LedgerRecord(2**40, "deleted", -1, {"topic": "persistent://t/n/x"})]
    index.commit_checkpoint(CheckpointWrite(mark=None, ledgers=records))
    assert index.load_ledgers() == {r.ledger_id: r for r in records}
    for record in records:
        assert LedgerRecord.decode(record.ledger_id, record.encode()) == record


def test_entry_log_records_round_trip(index: Index) -> None:
    first = EntryLogRecord(1, 5000, {1: 300, 2: 400}, 700, sealed=True)
    second = EntryLogRecord(2, 2048, {}, 0)
    index.commit_checkpoint(CheckpointWrite(mark=None, entry_logs=[first, second]))
    assert index.load_entry_logs() == {1: first, 2: second}
    assert first.live_bytes() == 700
    index.commit_checkpoint(CheckpointWrite(mark=None, drop_entry_logs=[1]))
    assert index.load_entry_logs() == {2: second}


def test_entry_log_records_of_older_data_dirs_still_load(index: Index) -> None:
    """A record written in the JSON form of older versions loads as it was; the next
    checkpoint rewrites it in the binary form (16 bytes a ledger, 2**64 - 1 fits)."""
    old = b'{"size":5000,"total":700,"sealed":true,"ledgers":{"1":300,"2":400}}'
    entrylogs = index.env.open_db(b"entrylogs")
    with index.env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", 1), old, db=entrylogs)
    loaded = index.load_entry_logs()
    assert loaded == {1: EntryLogRecord(1, 5000, {1: 300, 2: 400}, 700, sealed=True)}
    big = EntryLogRecord(3, 2**40, {2**64 - 1: 2**63, 5: 1}, 2**63 + 1)
    assert not big.encode().startswith(b"{")
    assert len(big.encode()) == len(EntryLogRecord(3, 0).encode()) + 2 * 16
    assert EntryLogRecord.decode(3, big.encode()) == big


def test_counters_never_decrease(index: Index) -> None:
    assert index.counter("nextLedgerId") == 0
    index.commit_checkpoint(CheckpointWrite(mark=None, counters={"nextLedgerId": 9}))
    index.commit_checkpoint(CheckpointWrite(mark=None, counters={"nextLedgerId": 4}))
    assert index.counter("nextLedgerId") == 9
    index.commit_checkpoint(CheckpointWrite(mark=None, counters={"nextLedgerId": 12}))
    assert index.counter("nextLedgerId") == 12


def test_meta_ops_put_and_delete(index: Index) -> None:
    index.commit_checkpoint(CheckpointWrite(mark=None, meta_ops=[(b"a", b"1"), (b"b", b"2")]))
    index.commit_checkpoint(CheckpointWrite(mark=None, meta_ops=[(b"a", None), (b"c", b"3")]))
    with index.env.begin(db=index.kv) as txn:
        assert dict(txn.cursor()) == {b"b": b"2", b"c": b"3"}


def test_checkpoint_commit_is_atomic_and_durable(tmp_path: Path) -> None:
    path = str(tmp_path / "index")
    index = Index(path, 64 * 1024 * 1024)
    index.commit_checkpoint(CheckpointWrite(
        mark=JournalMark(1, 4096, 3),
        location_runs=[LocationRun(1, [0, 1, 2], [0, 1, 2])],
        ledgers=[LedgerRecord(1, "open", 2, {})],
        entry_logs=[EntryLogRecord(1, 1200, {1: 100}, 100)],
        counters={"nextLedgerId": 2, "nextLogId": 2}))
    index.close()
    reopened = Index(path, 64 * 1024 * 1024)
    assert reopened.load_mark() == JournalMark(1, 4096, 3)
    assert reopened.locations(1, 0, 10) == [(0, 0), (1, 1), (2, 2)]
    assert reopened.load_ledgers()[1].last_entry_id == 2
    assert reopened.load_entry_logs()[1].size == 1200
    assert reopened.counter("nextLogId") == 2
    reopened.close()


def test_location_value_is_a_big_endian_u64(index: Index) -> None:
    put_locations(index, {(1, 0): (7 << 32) | 1024})
    with index.env.begin() as txn:
        db = index.env.open_db(b"locations", txn=txn)
        raw = txn.get(location_key(1, 0), db=db)
    assert raw == struct.pack(">Q", (7 << 32) | 1024)
