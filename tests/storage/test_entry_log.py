"""Entry logs: record and ledgers-map round trips, scans of damaged logs, and the reader's
single and coalesced reads."""

from __future__ import annotations

import struct
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magnetar.storage import CorruptionError, OsFileSystem
from magnetar.storage._entry_log import (
    ENTRY_LOG_HEADER_BYTES,
    MAP_ENTRY_ID,
    MAP_LEDGER_ID,
    RECORD_HEADER_BYTES,
    WRITEBACK_BYTES,
    EntryLogReader,
    EntryLogWriter,
    entry_log_name,
    location_of,
    parse_entry_log_name,
    read_header,
    scan_entry_log,
    split_location,
)
from magnetar.storage._gil import HAND_OVER_BYTES, HAND_OVER_ITEMS
from tests.storage.helpers import CountingFileSystem

Entry = tuple[int, int, bytes]


def make_log(directory: Path, log_id: int, entries: list[Entry], *,
             fs: OsFileSystem | CountingFileSystem | None = None,
             seal: bool = False) -> tuple[EntryLogWriter, list[int]]:
    writer = EntryLogWriter(fs or OsFileSystem(), str(directory), log_id)
    locations = writer.append(entries)
    writer.sync()
    if seal:
        writer.seal()
    writer.close()
    return writer, locations


def scan_all(path: Path, **kwargs: int) -> list[Entry]:
    handle = OsFileSystem().open_read(str(path))
    try:
        return [(r.ledger_id, r.entry_id, r.data)
                for r in scan_entry_log(handle, str(path), **kwargs)]
    finally:
        handle.close()


def sample(count: int, ledger_id: int = 1, size: int = 40) -> list[Entry]:
    return [(ledger_id, i, bytes([i % 251]) * (size + i % 7)) for i in range(count)]


# -- names and locations -----------------------------------------------------------------

def test_names_round_trip() -> None:
    assert entry_log_name(0x1A) == "0000001a.log"
    assert parse_entry_log_name("0000001a.log") == 0x1A
    for bad in ("1a.log", "0000001a.jnl", "0000001a", "zzzzzzzz.log", "0000001a.log.tmp"):
        assert parse_entry_log_name(bad) is None


@given(st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_location_round_trip(log_id: int, offset: int) -> None:
    assert split_location(location_of(log_id, offset)) == (log_id, offset)


def test_location_refuses_offsets_beyond_32_bits() -> None:
    with pytest.raises(AssertionError):
        location_of(1, 2**32)


# -- writing and scanning ----------------------------------------------------------------

@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(entries=st.lists(st.tuples(st.integers(0, 2**64 - 3), st.integers(0, 2**64 - 3),
                                  st.binary(max_size=2000)), max_size=40),
       seal=st.booleans())
def test_records_round_trip(tmp_path: Path, entries: list[Entry], seal: bool) -> None:
    for old in tmp_path.glob("*.log"):
        old.unlink()
    _, locations = make_log(tmp_path, 3, entries, seal=seal)
    path = tmp_path / entry_log_name(3)
    assert scan_all(path) == entries, "the ledgers map is not an entry"
    offsets = [ENTRY_LOG_HEADER_BYTES]
    for _, _, data in entries[:-1]:
        offsets.append(offsets[-1] + RECORD_HEADER_BYTES + len(data))
    assert locations == [location_of(3, o) for o in offsets[:len(entries)]]
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 4)
    try:
        for (ledger_id, entry_id, data), location in zip(entries, locations, strict=True):
            assert reader.read(location, ledger_id, entry_id) == data
    finally:
        reader.close()


def test_ledgers_map_round_trip(tmp_path: Path) -> None:
    entries = sample(10, ledger_id=5) + sample(3, ledger_id=2) + sample(4, ledger_id=9)
    writer, _ = make_log(tmp_path, 1, entries, seal=False)
    path = tmp_path / entry_log_name(1)
    handle = OsFileSystem().open_read(str(path))
    try:
        assert read_header(handle, str(path)) == (1, 0, 0), "no map before sealing"
    finally:
        handle.close()

    writer = EntryLogWriter(OsFileSystem(), str(tmp_path), 2)
    writer.append(entries)
    map_offset = writer.position
    writer.seal()
    writer.close()
    expected: dict[int, int] = {}
    for ledger_id, _, data in entries:
        expected[ledger_id] = expected.get(ledger_id, 0) + RECORD_HEADER_BYTES + len(data)
    assert writer.ledger_bytes == expected

    path = tmp_path / entry_log_name(2)
    handle = OsFileSystem().open_read(str(path))
    try:
        assert read_header(handle, str(path)) == (2, map_offset, 3)
        size, _crc, ledger_id, entry_id = struct.unpack(">IIQQ", handle.pread(24, map_offset))
        assert (ledger_id, entry_id) == (MAP_LEDGER_ID, MAP_ENTRY_ID)
        body = handle.pread(size - 16, map_offset + 24)
        (count,) = struct.unpack_from(">I", body)
        pairs = [struct.unpack_from(">QQ", body, 4 + 16 * i) for i in range(count)]
        assert dict(pairs) == expected
        assert [k for k, _ in pairs] == sorted(expected), "the map is sorted by ledger"
        assert map_offset + 8 + size == handle.size()
    finally:
        handle.close()
    assert scan_all(path) == entries


def test_header_with_a_flipped_bit_is_refused(tmp_path: Path) -> None:
    make_log(tmp_path, 4, sample(2))
    path = tmp_path / entry_log_name(4)
    data = bytearray(path.read_bytes())
    data[9] ^= 0x40
    path.write_bytes(bytes(data))
    handle = OsFileSystem().open_read(str(path))
    try:
        with pytest.raises(CorruptionError) as caught:
            read_header(handle, str(path))
    finally:
        handle.close()
    assert caught.value.path == str(path)
    assert caught.value.offset == 0


def test_scan_stops_at_a_truncated_tail(tmp_path: Path) -> None:
    # The last record truncated by 10 bytes (BookKeeper DefaultEntryLogTest
    # testCorruptEntryLog): complete entries are kept, the partial one dropped.
    entries = sample(20)
    make_log(tmp_path, 1, entries)
    path = tmp_path / entry_log_name(1)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)
    assert scan_all(path) == entries[:-1]


def test_scan_stops_inside_a_record_header(tmp_path: Path) -> None:
    entries = sample(5)
    make_log(tmp_path, 1, entries)
    path = tmp_path / entry_log_name(1)
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x30\x01\x02")
    assert scan_all(path) == entries


def test_scan_stops_at_a_corrupt_record(tmp_path: Path) -> None:
    entries = sample(10)
    _, locations = make_log(tmp_path, 1, entries)
    path = tmp_path / entry_log_name(1)
    data = bytearray(path.read_bytes())
    data[split_location(locations[6])[1] + 30] ^= 0x01
    path.write_bytes(bytes(data))
    assert scan_all(path) == entries[:6]


def test_scan_stops_at_the_committed_end(tmp_path: Path) -> None:
    entries = sample(10)
    _, locations = make_log(tmp_path, 1, entries)
    committed = split_location(locations[4])[1]
    assert scan_all(tmp_path / entry_log_name(1), end=committed) == entries[:4]


def test_scan_of_records_larger_than_the_chunk(tmp_path: Path) -> None:
    entries = [(1, 0, b"a" * 10), (1, 1, b"b" * 5000), (1, 2, b"c" * 3), (1, 3, b"d" * 9000)]
    make_log(tmp_path, 1, entries)
    path = tmp_path / entry_log_name(1)
    assert scan_all(path, chunk_bytes=256) == entries
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)
    assert scan_all(path, chunk_bytes=256) == entries[:3]


def test_scan_of_a_header_only_log(tmp_path: Path) -> None:
    make_log(tmp_path, 1, [])
    assert scan_all(tmp_path / entry_log_name(1)) == []


# -- the reader --------------------------------------------------------------------------

@pytest.fixture
def reader_setup(tmp_path: Path) -> tuple[CountingFileSystem, EntryLogReader, list[Entry],
                                          list[int]]:
    entries = sample(50, ledger_id=8, size=60)
    _, locations = make_log(tmp_path, 1, entries)
    fs = CountingFileSystem()
    return fs, EntryLogReader(fs, str(tmp_path), 4), entries, locations


def test_read_returns_the_entry(reader_setup: tuple[CountingFileSystem, EntryLogReader,
                                                    list[Entry], list[int]]) -> None:
    _, reader, entries, locations = reader_setup
    for (ledger_id, entry_id, data), location in zip(entries, locations, strict=True):
        assert reader.read(location, ledger_id, entry_id) == data
    reader.close()


def test_read_with_wrong_ids_names_file_and_offset(tmp_path: Path) -> None:
    _, locations = make_log(tmp_path, 1, sample(3, ledger_id=8))
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 2)
    offset = split_location(locations[1])[1]
    with pytest.raises(CorruptionError) as caught:
        reader.read(locations[1], 8, 2)
    assert caught.value.path == str(tmp_path / entry_log_name(1))
    assert caught.value.offset == offset
    assert "index expects ledger 8 entry 2" in str(caught.value)
    assert str(tmp_path / entry_log_name(1)) in str(caught.value)
    with pytest.raises(CorruptionError):
        reader.read(locations[1], 9, 1)
    reader.close()


def test_read_of_a_corrupt_record(tmp_path: Path) -> None:
    entries = sample(3)
    _, locations = make_log(tmp_path, 1, entries)
    path = tmp_path / entry_log_name(1)
    offset = split_location(locations[2])[1]
    data = bytearray(path.read_bytes())
    data[offset + RECORD_HEADER_BYTES + 2] ^= 0x08
    path.write_bytes(bytes(data))
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 2)
    with pytest.raises(CorruptionError, match="fails its CRC") as caught:
        reader.read(locations[2], 1, 2)
    assert (caught.value.path, caught.value.offset) == (str(path), offset)
    assert reader.read(locations[1], 1, 1) == entries[1][2]
    reader.close()


def test_read_beyond_the_end_of_the_log(tmp_path: Path) -> None:
    _, locations = make_log(tmp_path, 1, sample(3))
    path = tmp_path / entry_log_name(1)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 5)
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 2)
    with pytest.raises(CorruptionError) as caught:
        reader.read(locations[2], 1, 2)
    assert caught.value.offset == split_location(locations[2])[1]
    with pytest.raises(CorruptionError, match="truncated"):
        reader.read(location_of(1, size + 100), 1, 3)
    reader.close()


def test_read_run_coalesces_neighbours(
        reader_setup: tuple[CountingFileSystem, EntryLogReader, list[Entry], list[int]]) -> None:
    fs, reader, entries, locations = reader_setup
    wanted = [(e, loc) for (_, e, _), loc in zip(entries, locations, strict=True)]
    assert reader.read_run(8, wanted, 1 << 20) == [d for _, _, d in entries]
    assert fs.total("pread") == 1, "fifty neighbouring records in one read"
    reader.close()


def test_read_run_with_a_small_read_size(
        reader_setup: tuple[CountingFileSystem, EntryLogReader, list[Entry], list[int]]) -> None:
    fs, reader, entries, locations = reader_setup
    wanted = [(e, loc) for (_, e, _), loc in zip(entries, locations, strict=True)]
    read_bytes_max = 500  # about six records per read
    assert reader.read_run(8, wanted, read_bytes_max) == [d for _, _, d in entries]
    total = sum(RECORD_HEADER_BYTES + len(d) for _, _, d in entries)
    assert total // read_bytes_max <= fs.total("pread") <= len(entries) // 2
    reader.close()


def test_read_run_with_gaps(
        reader_setup: tuple[CountingFileSystem, EntryLogReader, list[Entry], list[int]]) -> None:
    fs, reader, entries, locations = reader_setup
    picked = [0, 1, 2, 10, 11, 30, 49]
    wanted = [(entries[i][1], locations[i]) for i in picked]
    assert reader.read_run(8, wanted, 1 << 20) == [entries[i][2] for i in picked]
    assert fs.total("pread") == 4, "one read per run of neighbours"
    reader.close()


def test_read_run_of_a_record_bigger_than_read_bytes_max(tmp_path: Path) -> None:
    entries = [(2, 0, b"s" * 10), (2, 1, b"L" * 10_000), (2, 2, b"t" * 10), (2, 3, b"M" * 7000)]
    _, locations = make_log(tmp_path, 1, entries)
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 2)
    wanted = [(e, loc) for (_, e, _), loc in zip(entries, locations, strict=True)]
    assert reader.read_run(2, wanted, 4096) == [d for _, _, d in entries]
    assert reader.read_run(2, wanted[1:2], 64) == [entries[1][2]]
    reader.close()


def test_read_run_across_logs(tmp_path: Path) -> None:
    first, second = sample(5, ledger_id=3), [(3, 5 + i, b"z" * i) for i in range(5)]
    _, locations_1 = make_log(tmp_path, 1, first)
    _, locations_2 = make_log(tmp_path, 2, second)
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 1)  # forces eviction
    wanted = [(e, loc) for (_, e, _), loc in zip(first + second, locations_1 + locations_2,
                                                 strict=True)]
    assert reader.read_run(3, wanted, 1 << 20) == [d for _, _, d in first + second]
    assert reader.read_run(3, wanted[::-1], 1 << 20) == [d for _, _, d in (first + second)[::-1]]
    reader.close()


def test_read_run_with_wrong_ids_names_file_and_offset(tmp_path: Path) -> None:
    entries = sample(6, ledger_id=4)
    _, locations = make_log(tmp_path, 1, entries)
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 2)
    wanted = [(e, loc) for (_, e, _), loc in zip(entries, locations, strict=True)]
    wanted[3] = (99, wanted[3][1])
    with pytest.raises(CorruptionError) as caught:
        reader.read_run(4, wanted, 1 << 20)
    assert caught.value.path == str(tmp_path / entry_log_name(1))
    assert caught.value.offset == split_location(locations[3])[1]
    with pytest.raises(CorruptionError, match="index expects ledger 5"):
        reader.read_run(5, wanted[:2], 1 << 20)
    reader.close()


def test_read_run_of_a_corrupt_record(tmp_path: Path) -> None:
    entries = sample(6, ledger_id=4)
    _, locations = make_log(tmp_path, 1, entries)
    path = tmp_path / entry_log_name(1)
    bad = split_location(locations[4])[1]
    data = bytearray(path.read_bytes())
    data[bad + RECORD_HEADER_BYTES] ^= 0xFF
    path.write_bytes(bytes(data))
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 2)
    wanted = [(e, loc) for (_, e, _), loc in zip(entries, locations, strict=True)]
    with pytest.raises(CorruptionError) as caught:
        reader.read_run(4, wanted, 1 << 20)
    assert (caught.value.path, caught.value.offset) == (str(path), bad)
    reader.close()


def test_reader_forget_closes_the_handle(tmp_path: Path) -> None:
    entries = sample(2)
    _, locations = make_log(tmp_path, 1, entries)
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 2)
    assert reader.read(locations[0], 1, 0) == entries[0][2]
    reader.forget(1)
    (tmp_path / entry_log_name(1)).unlink()
    with pytest.raises(FileNotFoundError):
        reader.read(locations[0], 1, 0)
    reader.close()


def test_a_long_append_lets_other_threads_run(tmp_path: Path) -> None:
    """A checkpoint's append of many entries writes in chunks and hands the GIL over between
    them (`_gil.py`): with a switch interval far too long to force a switch, another thread
    still runs while the append is under way, and sees it part-written."""
    writer = EntryLogWriter(OsFileSystem(), str(tmp_path), 1)
    # 64 hand-overs: the watcher needs to be awake at two of them, on a machine that may be
    # busy with other work (with 8 it missed all but one once, under a parallel suite).
    entries = [(7, i, bytes(1000)) for i in range(HAND_OVER_ITEMS * 64)]
    seen: list[int] = []
    started, done = threading.Event(), threading.Event()

    def watch() -> None:
        started.set()
        while not done.is_set():
            seen.append(writer.position)
            time.sleep(0.0001)  # the GIL is free meanwhile: the append may take it

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)  # no forced switch: only a hand-over lets `watch` run
    try:
        watcher = threading.Thread(target=watch)
        watcher.start()
        started.wait()
        first = writer.position
        writer.append(entries)
        done.set()
        watcher.join()
    finally:
        sys.setswitchinterval(interval)
        writer.close()
    assert [first < position < writer.position for position in seen].count(True) >= 2


def test_a_big_append_starts_its_writeback_in_chunks(tmp_path: Path) -> None:
    """A checkpoint-sized append hands its bytes to the disk's writeback as it goes, so the
    sync after it finds at most about `WRITEBACK_BYTES` not yet started; the sync still makes
    everything durable and readable."""
    fs = CountingFileSystem()
    entries = [(7, i, bytes([i % 251]) * 1024) for i in range(4096)]  # about 4 MiB
    writer, locations = make_log(tmp_path, 1, entries, fs=fs)  # appends, then syncs
    path = writer.path
    assert fs.counts[("writeback", path)] >= 3
    assert fs.unstarted_bytes_max[path] <= WRITEBACK_BYTES + HAND_OVER_BYTES
    reader = EntryLogReader(OsFileSystem(), str(tmp_path), 4)
    for (ledger_id, entry_id, data), location in zip(entries[::500], locations[::500],
                                                     strict=True):
        assert reader.read(location, ledger_id, entry_id) == data
    reader.close()
