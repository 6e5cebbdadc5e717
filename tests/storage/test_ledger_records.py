"""Ledger records in the index: the binary form, the JSON form of older data directories
(still loaded, and rewritten by the first checkpoint), an unreadable record (a clear error
naming the ledger), the highest indexed entries found by a scan or by seeks, and the
restart's deletion of the last run's journal segments (left to the checkpoint thread)."""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.storage import CorruptionError, Storage
from magnetar.storage._fs import OsFileSystem
from magnetar.storage._index import (
    SCAN_LOCATIONS_PER_LEDGER_MAX,
    STATES,
    CheckpointWrite,
    Index,
    LedgerRecord,
    LocationRun,
)

from .helpers import journal_files, small_config, wait_until


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    opened = Index(str(tmp_path / "index"), 64 * 1024 * 1024)
    yield opened
    opened.close()


def _put_raw(index: Index, ledger_id: int, raw: bytes) -> None:
    ledgers = index.env.open_db(b"ledgers")
    with index.env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", ledger_id), raw, db=ledgers)


def _raw(index: Index, ledger_id: int) -> bytes:
    ledgers = index.env.open_db(b"ledgers")
    with index.env.begin() as txn:
        return bytes(txn.get(struct.pack(">Q", ledger_id), db=ledgers))


@given(st.sampled_from(STATES), st.integers(-1, 2**63 - 1),
       st.dictionaries(st.text(max_size=8), st.text(max_size=40), max_size=4))
def test_binary_record_round_trip(state: str, last: int, metadata: dict[str, str]) -> None:
    record = LedgerRecord(7, state, last, metadata)
    raw = record.encode()
    assert not raw.startswith(b"{")
    assert LedgerRecord.decode(7, raw) == record


def test_binary_records_load_with_their_highest_entries(index: Index) -> None:
    records = [LedgerRecord(1, "open", -1, {}), LedgerRecord(2, "fenced", 9, {"a": "b"}),
               LedgerRecord(3, "closed", 4, {"ml": "t/n/é\ud800", "x": ""}),
               LedgerRecord(2**40, "deleted", -1, {"ml": "persistent://t/n/x"})]
    index.commit_checkpoint(CheckpointWrite(
        mark=None, ledgers=records,
        location_runs=[LocationRun(2, [0, 1, 2], [1, 1, 1]), LocationRun(2**40, [0], [1])]))
    loaded, older = index.load_ledger_table("deleted")
    assert loaded == [(1, "open", (), -1), (2, "fenced", (("a", "b"),), 2),
                      (3, "closed", (("ml", "t/n/é\ud800"), ("x", "")), -1),
                      (2**40, "deleted", (("ml", "persistent://t/n/x"),), -1)]
    assert older == []


def test_json_records_of_older_data_dirs_load_and_are_rewritten(tmp_path: Path) -> None:
    """A data directory written before the binary form: its JSON records load as they were,
    and the open's checkpoint rewrites them in the binary form."""
    data_dir = tmp_path / "data"
    store = Storage.open(data_dir, small_config())
    ledger_id = store.create_ledger({"ml": "t/n/old"}).result(5)
    store.add_entry(ledger_id, b"one").result(5)
    store.close()
    index = Index(str(data_dir / "index"), 64 * 1024 * 1024)
    old = json.dumps({"last": -1, "meta": {"ml": "t/n/old"}, "state": "open"}).encode()
    _put_raw(index, ledger_id, old)
    assert index.load_ledger_table("deleted") == ([(ledger_id, "open", (("ml", "t/n/old"),),
                                                    0)], [ledger_id])
    index.close()
    store = Storage.open(data_dir, small_config(background_threads=False))
    assert store.ledger_info(ledger_id).metadata == {"ml": "t/n/old"}
    assert store.read_entries(ledger_id, 0, 0) == [b"one"]
    raw = _raw(store.index, ledger_id)
    store.close()
    assert not raw.startswith(b"{")
    assert LedgerRecord.decode(ledger_id, raw) == LedgerRecord(ledger_id, "open", 0,
                                                               {"ml": "t/n/old"})


@pytest.mark.parametrize(("raw", "why"), [
    (b"\x02\x00" + bytes(12), "unknown form"),
    (b"\x01\x07" + bytes(12), "IndexError"),
    (b"\x01\x00" + bytes(8) + struct.pack("<I", 1) + struct.pack("<II", 1, 1) + b"abc",
     "lengths say 2"),
    (b"\x01\x00\x00", "error"),
    (b"\x01\x00" + bytes(8) + struct.pack("<I", 2**32 - 1) + b"ab", "cannot fit"),
    (b'{"state":"open","last":-1}', "KeyError"),
    (b'{"state":"gone","last":-1,"meta":{}}', "state 'gone'"),
])
def test_an_unreadable_record_stops_the_open_naming_the_ledger(tmp_path: Path, raw: bytes,
                                                                why: str) -> None:
    data_dir = tmp_path / "data"
    Storage.open(data_dir, small_config()).close()
    index = Index(str(data_dir / "index"), 64 * 1024 * 1024)
    _put_raw(index, 42, raw)
    index.close()
    with pytest.raises(CorruptionError) as caught:
        Storage.open(data_dir, small_config())
    message = str(caught.value)
    assert message.startswith("ledger 42: its record is unreadable"), message
    assert why in message
    assert caught.value.path == str(data_dir / "index")


@pytest.mark.parametrize("per_ledger", [1, SCAN_LOCATIONS_PER_LEDGER_MAX + 1])
def test_highest_entries_by_scan_and_by_seek_agree(index: Index, per_ledger: int) -> None:
    """Few locations a ledger: one scan finds the highest entries; many: a seek per ledger."""
    ledgers = [LedgerRecord(i, "open") for i in (1, 2, 5, 9)]
    entries = {1: per_ledger, 2: 0, 5: 2 * per_ledger, 9: 1}  # ledger 2 has none
    runs = [LocationRun(lid, list(range(count)), [1] * count)
            for lid, count in entries.items() if count]
    runs.append(LocationRun(7, [3], [1]))  # a ledger without a record
    index.commit_checkpoint(CheckpointWrite(mark=None, ledgers=ledgers, location_runs=runs))
    loaded, _ = index.load_ledger_table("deleted")
    assert [lac for _, _, _, lac in loaded] == [per_ledger - 1, -1, 2 * per_ledger - 1, 0]
    assert [lac for _, _, _, lac in loaded] == [index.last_indexed_entry(lid)
                                                 for lid in (1, 2, 5, 9)]


class _DeletingThreads(OsFileSystem):
    """Records the thread that deletes each journal segment."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted_by: list[str] = []

    def point(self, label: str) -> None:
        super().point(label)
        if label == "journal:delete-segment":
            self.deleted_by.append(threading.current_thread().name)


def test_the_open_leaves_the_last_runs_segments_to_the_checkpoint_thread(tmp_path: Path
                                                                        ) -> None:
    """Deleting the segments before the restart's mark (hundreds of MB) is not part of the
    open: the checkpoint thread's first checkpoint deletes them."""
    data_dir = tmp_path / "data"
    config = small_config(journal_segments_kept_max=0)
    store = Storage.open(data_dir, config)
    ledger_id = store.create_ledger({}).result(5)
    store.add_entry(ledger_id, b"x").result(5)
    store.close()
    first = journal_files(data_dir)
    fs = _DeletingThreads()
    store = Storage.open(data_dir, config, fs=fs)
    try:
        wait_until(lambda: not set(first) & set(journal_files(data_dir)),
                   "the last run's segments deleted")
        assert fs.deleted_by == ["storage-checkpoint"] * len(first)
        assert store.read_entries(ledger_id, 0, 0) == [b"x"]
    finally:
        store.close()
    assert os.path.isdir(data_dir / "journal")
