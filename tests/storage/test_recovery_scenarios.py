"""Named crash and recovery scenarios (storage design §10 and §12).

Each test builds a real data directory with the engine, stops it the way a crash would
(`abandon()`: no more I/O), damages the files directly as the scenario says, reopens the
directory and checks what recovery made of it. The names follow BookKeeper's own journal
tests where one exists (`test_truncated_in_length` ~ testTruncatedInLenJournal, ...).

Journal records are located with the engine's own scanner before the damage is done, so
that a test cuts exactly inside a record header or payload; the damage itself is plain
`open()`/`os.truncate`.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from magnetar.storage import (
    CorruptionError,
    JournalCorruptionError,
    LedgerFencedError,
    LedgerNotFoundError,
    NoSuchEntryError,
    Storage,
    StorageConfig,
    StorageError,
    check_data_dir,
    inspect_data_dir,
)
from magnetar.storage._fs import OsFileSystem
from magnetar.storage._index import Index, encode_mark
from magnetar.storage._journal import JournalMark
from magnetar.storage._journal_format import (
    RecordType,
    ScanResult,
    SegmentHeader,
    encode_record,
    pad_record,
    scan_segment,
)
from magnetar.storage._recovery import ReplayStats
from magnetar.storage._write_cache import CacheHalf
from magnetar.storage.testing.simfs import SimFileSystem

ALIGNMENT_BYTES = 512
ENTRY_BYTES = 200


def make_config(**overrides: object) -> StorageConfig:
    """A small, deterministic configuration: no background threads, 512-byte journal
    blocks, small preallocation, a small LMDB map."""
    settings: dict[str, object] = {
        "background_threads": False,
        "journal_alignment_bytes": ALIGNMENT_BYTES,
        "journal_prealloc_bytes": 4096,
        "journal_segment_bytes_max": 1 << 20,
        "entry_size_bytes_max": 16 * 1024,
        "journal_record_bytes_max": 32 * 1024,
        "write_cache_bytes_max": 4 << 20,
        "lmdb_map_bytes": 64 << 20,
    }
    settings.update(overrides)
    return StorageConfig(**settings)  # type: ignore[arg-type]


def entry_data(rng: random.Random, ledger_id: int, entry_id: int,
               size: int = ENTRY_BYTES) -> bytes:
    prefix = f"L{ledger_id}E{entry_id}:".encode()
    return prefix + rng.randbytes(size - len(prefix))


def write_entries(store: Storage, ledger_id: int, datas: list[bytes]) -> None:
    """Add each entry and wait for it (one journal batch per add)."""
    first = store.last_add_confirmed(ledger_id) + 1
    for offset, data in enumerate(datas):
        assert store.wait(store.add_entry(ledger_id, data)) == first + offset


def new_ledger(store: Storage, rng: random.Random, count: int) -> tuple[int, list[bytes]]:
    ledger_id = store.wait(store.create_ledger({"test": "recovery"}))
    datas = [entry_data(rng, ledger_id, e) for e in range(count)]
    write_entries(store, ledger_id, datas)
    return ledger_id, datas


def assert_ledger_holds(store: Storage, ledger_id: int, datas: list[bytes]) -> None:
    """The ledger's entries are exactly `datas`: LAC, bytes, and nothing beyond."""
    assert store.last_add_confirmed(ledger_id) == len(datas) - 1
    if datas:
        assert store.read_entries(ledger_id, 0, len(datas) - 1) == datas
    with pytest.raises(NoSuchEntryError):
        store.read_entry(ledger_id, len(datas))


def replay_stats(store: Storage) -> ReplayStats:
    stats = store.replay_stats
    assert isinstance(stats, ReplayStats)
    return stats


def segment_paths(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "journal").glob("*.jnl"))


def segment_ids(data_dir: Path) -> set[int]:
    return {int(p.stem, 16) for p in segment_paths(data_dir)}


@dataclass(frozen=True)
class JournalRecord:
    offset: int
    lsn: int
    kind: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + 24 + self.length


def journal_records(path: Path) -> list[JournalRecord]:
    """The valid records of a segment, read with the engine's scanner."""
    handle = OsFileSystem().open_read(str(path))
    try:
        header = SegmentHeader.decode(handle.pread(ALIGNMENT_BYTES, 0), str(path))
        result = ScanResult(0, -1, 0, True)
        return [JournalRecord(r.offset, r.lsn, r.kind, len(r.payload))
                for r in scan_segment(handle, header, header.alignment, None, 1 << 20,
                                      result)]
    finally:
        handle.close()


def last_add(path: Path) -> JournalRecord:
    return [r for r in journal_records(path) if r.kind == RecordType.ADD_ENTRY][-1]


def zero_from(path: Path, offset: int) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(size - offset))


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def directory_digest(root: Path) -> dict[str, str]:
    """Name → SHA-256 of every journal segment and entry log (what a refused open must
    leave as found)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for sub in ("journal", "entrylogs") for p in sorted((root / sub).iterdir())}


def set_raw_mark(data_dir: Path, raw: bytes | None) -> None:
    index = Index(str(data_dir / "index"), 64 << 20)
    try:
        index.write_mark_raw(raw)
    finally:
        index.close()


def read_mark(data_dir: Path) -> JournalMark | None:
    index = Index(str(data_dir / "index"), 64 << 20)
    try:
        return index.persisted_mark
    finally:
        index.close()


def open_until_crash(data_dir: Path, config: StorageConfig, sim: SimFileSystem) -> None:
    """Open with a SimFileSystem that crashes during recovery. The crash surfaces as
    `SimulatedCrash` or as the `StorageFailedError` it caused; or not at all when the
    engine tolerates that failure (a journal segment it could not delete), and then the
    store is abandoned like any crashed process."""
    try:
        Storage.open(data_dir, config, fs=sim).abandon()
    except (OSError, StorageError):
        pass
    assert sim.crashed, "the crash was never reached"


@pytest.fixture
def rng(seed: int) -> random.Random:
    return random.Random(seed)


@pytest.fixture
def crashed_ledger(tmp_path: Path, rng: random.Random) -> tuple[int, list[bytes]]:
    """Ten acknowledged entries, never checkpointed (they live only in the journal's one
    segment), then a crash."""
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 10)
    store.abandon()
    return ledger_id, datas


def reopen_and_expect(data_dir: Path, ledger_id: int, datas: list[bytes],
                      **overrides: object) -> Storage:
    store = Storage.open(data_dir, make_config(**overrides))
    assert_ledger_holds(store, ledger_id, datas)
    assert store.check().ok, store.check().render()
    return store


def assert_writable_after(store: Storage, ledger_id: int, datas: list[bytes],
                          rng: random.Random, data_dir: Path) -> None:
    """New adds continue the dense entry ids, and a clean restart keeps them all."""
    more = [entry_data(rng, ledger_id, len(datas) + i) for i in range(3)]
    write_entries(store, ledger_id, more)
    store.close()
    with Storage.open(data_dir, make_config()) as again:
        assert_ledger_holds(again, ledger_id, datas + more)
        assert replay_stats(again).torn_tail == ""


# -- torn tails in the newest segment -----------------------------------------------------

def test_truncated_in_length(tmp_path: Path, rng: random.Random,
                             crashed_ledger: tuple[int, list[bytes]]) -> None:
    ledger_id, datas = crashed_ledger
    (segment,) = segment_paths(tmp_path)
    torn = last_add(segment)
    os.truncate(segment, torn.offset + 6)  # inside the length field of the record header
    store = reopen_and_expect(tmp_path, ledger_id, datas[:-1])
    assert_writable_after(store, ledger_id, datas[:-1], rng, tmp_path)


def test_truncated_in_payload(tmp_path: Path, rng: random.Random,
                              crashed_ledger: tuple[int, list[bytes]]) -> None:
    ledger_id, datas = crashed_ledger
    (segment,) = segment_paths(tmp_path)
    torn = last_add(segment)
    os.truncate(segment, torn.offset + 24 + torn.length // 2)
    store = reopen_and_expect(tmp_path, ledger_id, datas[:-1])
    assert str(segment) in replay_stats(store).torn_tail
    assert_writable_after(store, ledger_id, datas[:-1], rng, tmp_path)


def test_junk_at_end(tmp_path: Path, rng: random.Random,
                     crashed_ledger: tuple[int, list[bytes]]) -> None:
    ledger_id, datas = crashed_ledger
    (segment,) = segment_paths(tmp_path)
    end = journal_records(segment)[-1].end  # where the next batch would have gone
    with open(segment, "r+b") as f:
        f.seek(end)
        f.write(rng.randbytes(700))
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    stats = replay_stats(store)
    assert str(segment) in stats.torn_tail  # the junk is detected, not replayed
    assert f"offset {end}" in stats.torn_tail
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


@pytest.mark.parametrize("where", ["record-start", "in-length", "in-payload"])
def test_zeroed_tail(tmp_path: Path, rng: random.Random,
                     crashed_ledger: tuple[int, list[bytes]], where: str) -> None:
    ledger_id, datas = crashed_ledger
    (segment,) = segment_paths(tmp_path)
    torn = last_add(segment)
    start = {"record-start": torn.offset, "in-length": torn.offset + 6,
             "in-payload": torn.offset + 24 + torn.length // 2}[where]
    zero_from(segment, start)
    store = reopen_and_expect(tmp_path, ledger_id, datas[:-1])
    if where != "record-start":  # a whole zero header is a clean end, the rest is torn
        assert str(segment) in replay_stats(store).torn_tail
    assert_writable_after(store, ledger_id, datas[:-1], rng, tmp_path)


# -- a damaged record with valid records after it (issue 10 item 1) ----------------------

def test_bit_flip_mid_newest_segment_refuses(tmp_path: Path, rng: random.Random,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """A record in the middle of the segment recovery replays is damaged; the acknowledged
    records after it prove it is no torn tail. Recovery refuses (naming file, offset and
    how many valid records follow) and leaves the directory as found; the operator's flag
    accepts the loss and the log says how much was lost."""
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 60)
    store.abandon()
    (segment,) = segment_paths(tmp_path)
    adds = [r for r in journal_records(segment) if r.kind == RecordType.ADD_ENTRY]
    victim = adds[20]
    next_batch = (victim.offset // ALIGNMENT_BYTES + 1) * ALIGNMENT_BYTES
    after = [r for r in journal_records(segment) if r.offset >= next_batch]
    flip_bit(segment, victim.offset + 24 + 50, bit=5)
    before = directory_digest(tmp_path)
    with pytest.raises(JournalCorruptionError) as caught:
        Storage.open(tmp_path, make_config())
    error = caught.value
    assert isinstance(error, StorageError)
    assert error.code != 0
    assert error.path == str(segment)
    assert error.offset == victim.offset
    assert error.records_after == len(after)
    assert error.bytes_after == sum(24 + r.length for r in after)
    assert f"followed by {len(after)} valid records" in str(error)
    assert f"at offset {victim.offset}" in str(error)
    assert directory_digest(tmp_path) == before
    caplog.set_level("WARNING", logger="magnetar.storage")
    with Storage.open(tmp_path, make_config(skip_corrupt_journal_segments=True)) as store:
        assert_ledger_holds(store, ledger_id, datas[:20])
        stats = replay_stats(store)
        assert (stats.dropped_records, stats.dropped_bytes) == (error.records_after,
                                                                error.bytes_after)
        write_entries(store, ledger_id, [b"after the skip"])
    lost = [r for r in caplog.records if r.levelname == "ERROR" and "LOST" in r.getMessage()]
    assert len(lost) == 1
    assert f"{len(after)} journal records" in lost[0].getMessage()
    with Storage.open(tmp_path, make_config()) as store:
        assert_ledger_holds(store, ledger_id, [*datas[:20], b"after the skip"])


def write_unsynced_batches(store: Storage, ledger_id: int, datas: list[bytes]) -> None:
    """Write one journal batch per add without syncing any (what the writer does while
    the syncer waits on the disk), then crash."""
    journal = store.journal
    assert journal is not None
    for data in datas:
        store.add_entry(ledger_id, data)
        assert journal._write_once()
    store.abandon()


def test_torn_group_commit_with_later_unsynced_batches(tmp_path: Path, rng: random.Random,
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    """A power loss can keep a later unsynced batch and tear an earlier one. The later
    batch's PAD says the torn record was never synced, so it was never acknowledged:
    a torn tail, not corruption."""
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 5)
    unsynced = [entry_data(rng, ledger_id, 5 + i) for i in range(3)]
    write_unsynced_batches(store, ledger_id, unsynced)
    (segment,) = segment_paths(tmp_path)
    adds = [r for r in journal_records(segment) if r.kind == RecordType.ADD_ENTRY]
    assert len(adds) == 8
    flip_bit(segment, adds[5].offset + 24 + 30)  # the first unsynced batch is torn
    caplog.set_level("WARNING", logger="magnetar.storage")
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    assert "never synced" in replay_stats(store).torn_tail
    assert any("torn group commit" in r.getMessage() for r in caplog.records)
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


def test_torn_tail_then_records_of_another_segment(tmp_path: Path, rng: random.Random,
                                                   crashed_ledger: tuple[int, list[bytes]]
                                                   ) -> None:
    """After a torn record, a block holding a record that would be valid in ANOTHER
    segment (its CRC is seeded with that segment's id) is garbage, not a record after
    it: still a torn tail."""
    ledger_id, datas = crashed_ledger
    (segment,) = segment_paths(tmp_path)
    torn = last_add(segment)
    end = journal_records(segment)[-1].end
    with open(segment, "r+b") as f:
        f.seek(torn.offset + 24 + torn.length // 2)
        f.write(rng.randbytes(30))  # torn inside the last record's payload
    stranger = bytearray()
    payload = struct.pack(">QQ", ledger_id, len(datas)) + b"x" * 100
    encode_record(stranger, 99, torn.lsn + 2, RecordType.ADD_ENTRY, payload)
    pad_record(stranger, 99, torn.lsn + 3, end, ALIGNMENT_BYTES, torn.lsn)
    with open(segment, "r+b") as f:
        f.seek(end)
        f.write(bytes(stranger))
    store = reopen_and_expect(tmp_path, ledger_id, datas[:-1])
    assert str(segment) in replay_stats(store).torn_tail
    assert "never synced" not in replay_stats(store).torn_tail
    assert_writable_after(store, ledger_id, datas[:-1], rng, tmp_path)


def test_check_data_dir_says_what_recovery_would_do(tmp_path: Path, rng: random.Random,
                                                    crashed_ledger: tuple[int, list[bytes]]
                                                    ) -> None:
    """`check_data_dir` reads only, and its plan matches what recovery then does: the torn
    tail it would ignore, the unregistered entry log it would remove, the LAC."""
    ledger_id, datas = crashed_ledger
    (segment,) = segment_paths(tmp_path)
    torn = last_add(segment)
    os.truncate(segment, torn.offset + 24 + torn.length // 2)
    stray = tmp_path / "entrylogs" / "000000ff.log"
    stray.write_bytes(b"never committed")
    before = directory_digest(tmp_path)
    report = check_data_dir(str(tmp_path), make_config())
    assert directory_digest(tmp_path) == before
    assert report.ok, report.render()
    notes = "\n".join(report.notes)
    assert f"would ignore the torn tail of {segment} at offset {torn.offset}" in notes
    assert f"would remove entry log {stray}" in notes
    assert f"would replay {len(journal_records(segment))} journal records" in notes
    inspected = inspect_data_dir(str(tmp_path), make_config())
    assert [(i, lac) for i, _, lac, _ in inspected.ledgers] == [(ledger_id, len(datas) - 2)]
    reopen_and_expect(tmp_path, ledger_id, datas[:-1]).close()
    assert not stray.exists()


# -- the LastLogMark ----------------------------------------------------------------------

def build_three_runs(data_dir: Path, rng: random.Random) -> tuple[int, list[bytes]]:
    """Three runs of one ledger: each checkpoints half its entries and crashes with the
    other half only in the journal. Every segment is kept."""
    config = make_config(journal_segments_kept_max=10)
    store = Storage.open(data_dir, config)
    ledger_id = store.wait(store.create_ledger({}))
    datas: list[bytes] = []
    for run in range(3):
        if run:
            store = Storage.open(data_dir, config)
        for half in range(2):
            batch = [entry_data(rng, ledger_id, len(datas) + i) for i in range(4)]
            write_entries(store, ledger_id, batch)
            datas += batch
            if half == 0:
                store.checkpoint()
        store.abandon()
    return ledger_id, datas


def replay_everything_case(data_dir: Path, rng: random.Random, corrupt: bool) -> None:
    """Remove the persisted mark (or break its CRC): recovery must replay every segment
    present, from the oldest, and lose nothing."""
    ledger_id, datas = build_three_runs(data_dir, rng)
    present = segment_ids(data_dir)
    assert len(present) == 3
    raw: bytes | None = None
    if corrupt:
        mark = read_mark(data_dir)
        assert mark is not None
        broken = bytearray(encode_mark(mark))
        broken[-1] ^= 0x40  # the CRC no longer matches
        raw = bytes(broken)
    set_raw_mark(data_dir, raw)
    assert read_mark(data_dir) is None
    store = reopen_and_expect(data_dir, ledger_id, datas, journal_segments_kept_max=10)
    stats = replay_stats(store)
    assert stats.segments == len(present)  # every segment, from the oldest
    assert stats.skipped_adds == 0
    # Replay started at LSN 1: the create, every add and every PAD of the three runs.
    assert stats.records >= 1 + len(datas)
    mark = store.inspect().mark
    assert mark is not None
    assert mark.segment_id == max(present) + 1
    assert_writable_after(store, ledger_id, datas, rng, data_dir)


def test_missing_mark(tmp_path: Path, rng: random.Random) -> None:
    replay_everything_case(tmp_path, rng, corrupt=False)


def test_corrupt_mark(tmp_path: Path, rng: random.Random) -> None:
    replay_everything_case(tmp_path, rng, corrupt=True)


def test_mark_beyond_segment_end(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 6)
    store.checkpoint()
    lost = [entry_data(rng, ledger_id, 6 + i) for i in range(2)]
    write_entries(store, ledger_id, lost)  # after the mark, in the marked segment
    store.abandon()
    mark = read_mark(tmp_path)
    assert mark is not None
    size = (tmp_path / "journal" / f"{mark.segment_id:016x}.jnl").stat().st_size
    set_raw_mark(tmp_path, encode_mark(JournalMark(mark.segment_id, size + 8192, mark.lsn)))
    # Nothing to replay in that segment: the two adds after the real mark stay unread.
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    assert replay_stats(store).records == 0
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


def test_marked_segment_missing(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    new_ledger(store, rng, 3)
    store.checkpoint()
    store.abandon()
    mark = read_mark(tmp_path)
    assert mark is not None
    marked = tmp_path / "journal" / f"{mark.segment_id:016x}.jnl"
    marked.unlink()
    before = directory_digest(tmp_path)
    for _ in range(2):  # refused each time, and the directory is left as found
        with pytest.raises(CorruptionError) as caught:
            Storage.open(tmp_path, make_config())
        assert caught.value.path == str(marked)
        assert str(marked) in str(caught.value)
        assert directory_digest(tmp_path) == before


# -- corruption in older segments ---------------------------------------------------------

def rolled_journal(data_dir: Path, rng: random.Random, count: int) -> tuple[int, list[bytes]]:
    """`count` acknowledged adds across several small journal segments, with the mark
    still in the first one (no checkpoint since the open), then a crash."""
    store = Storage.open(data_dir, rolling_config())
    ledger_id, datas = new_ledger(store, rng, count)
    store.abandon()
    assert len(segment_paths(data_dir)) >= 3
    return ledger_id, datas


def rolling_config(**overrides: object) -> StorageConfig:
    settings: dict[str, object] = {"journal_segment_bytes_max": 4096,
                                   "journal_prealloc_bytes": 1024}
    settings.update(overrides)
    return make_config(**settings)


def test_bit_flip_in_older_segment(tmp_path: Path, rng: random.Random) -> None:
    ledger_id, datas = rolled_journal(tmp_path, rng, 30)
    oldest = segment_paths(tmp_path)[0]
    adds = [r for r in journal_records(oldest) if r.kind == RecordType.ADD_ENTRY]
    victim = adds[2]  # entry 2 of the ledger
    flip_bit(oldest, victim.offset + 24 + 40, bit=3)
    before = directory_digest(tmp_path)
    with pytest.raises(CorruptionError) as caught:
        Storage.open(tmp_path, rolling_config())
    assert caught.value.path == str(oldest)
    assert caught.value.offset == victim.offset
    assert f"at offset {victim.offset}" in str(caught.value)
    assert directory_digest(tmp_path) == before
    # The operator's way out: skip the bad part and lose what follows it.
    with Storage.open(tmp_path, rolling_config(skip_corrupt_journal_segments=True)) as store:
        assert_ledger_holds(store, ledger_id, datas[:2])
        assert store.check().ok, store.check().render()
        assert replay_stats(store).skipped_adds > 0
        write_entries(store, ledger_id, [b"after the skip"])
    with Storage.open(tmp_path, rolling_config()) as store:
        assert_ledger_holds(store, ledger_id, [*datas[:2], b"after the skip"])


def test_torn_tail_in_older_segment_from_earlier_run(tmp_path: Path,
                                                     rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 8)
    store.abandon()
    (first,) = segment_paths(tmp_path)
    torn = last_add(first)
    os.truncate(first, torn.offset + 24 + torn.length // 3)
    # The next run replays up to the torn record, opens a fresh segment, and crashes
    # before its checkpoint persists a mark there: the torn segment is now an older one.
    sim = SimFileSystem(0, crash_at_point="checkpoint:before-index-commit")
    open_until_crash(tmp_path, make_config(), sim)
    sim.power_loss(keep_all=True)
    assert len(segment_paths(tmp_path)) == 2
    second = segment_paths(tmp_path)[1]
    assert journal_records(second) == []
    # The fresh segment's first LSN follows the torn segment's last good record, so the
    # tail is an earlier run's torn tail, not corruption.
    store = reopen_and_expect(tmp_path, ledger_id, datas[:-1])
    assert replay_stats(store).segments == 2
    assert_writable_after(store, ledger_id, datas[:-1], rng, tmp_path)


# -- segments whose creation did not finish -----------------------------------------------

def add_newest_segment(data_dir: Path, content: bytes) -> Path:
    path = data_dir / "journal" / f"{max(segment_ids(data_dir)) + 1:016x}.jnl"
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("header", ["truncated", "zeroed", "garbage", "bad-crc"])
def test_newest_segment_header_never_completed(tmp_path: Path, rng: random.Random,
                                               crashed_ledger: tuple[int, list[bytes]],
                                               header: str) -> None:
    ledger_id, datas = crashed_ledger
    good = SegmentHeader(max(segment_ids(tmp_path)) + 1, 99, ALIGNMENT_BYTES).encode()
    content = {"truncated": good[:20], "zeroed": bytes(4096),
               "garbage": rng.randbytes(4096),
               "bad-crc": good[:8] + b"\xff" + good[9:]}[header]
    broken = add_newest_segment(tmp_path, content)
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    assert not broken.exists()
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


def test_bit_flip_in_newest_segment_header(tmp_path: Path,
                                           crashed_ledger: tuple[int, list[bytes]]) -> None:
    """A header damaged after the segment was in use is not a segment whose creation
    was cut short: it holds acknowledged records, so recovery must refuse rather than
    remove it (design §12.1: remove only a bad header with no valid record behind it)."""
    ledger_id, datas = crashed_ledger
    (segment,) = segment_paths(tmp_path)
    flip_bit(segment, 12)  # inside the segment id field; the header CRC fails
    before = directory_digest(tmp_path)
    with pytest.raises(CorruptionError) as caught:
        Storage.open(tmp_path, make_config())
    assert caught.value.path == str(segment)
    assert caught.value.offset == 0
    assert directory_digest(tmp_path) == before
    flip_bit(segment, 12)  # repaired, everything is there
    reopen_and_expect(tmp_path, ledger_id, datas).close()


def test_empty_journal(tmp_path: Path, rng: random.Random,
                       crashed_ledger: tuple[int, list[bytes]]) -> None:
    """A crash between creating a segment file and writing its header."""
    ledger_id, datas = crashed_ledger
    empty = add_newest_segment(tmp_path, b"")
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    assert not empty.exists()
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


def test_header_only_journal(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 4)
    store.close()
    store = Storage.open(tmp_path, make_config())
    store.abandon()  # a segment with a header and nothing else
    newest = segment_paths(tmp_path)[-1]
    os.truncate(newest, ALIGNMENT_BYTES)  # not even the preallocated zeros
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    stats = replay_stats(store)
    assert stats.records == 0
    assert stats.torn_tail == ""
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


def test_fresh_directory_with_no_journal(tmp_path: Path) -> None:
    with Storage.open(tmp_path, make_config()) as store:
        assert store.list_ledgers() == []
        assert replay_stats(store).segments == 0
        assert store.check().ok


# -- crash during recovery ----------------------------------------------------------------

RECOVERY_POINTS = [
    "checkpoint:begin",
    "checkpoint:after-swap",
    "checkpoint:after-entrylog-write",
    "checkpoint:after-entrylog-sync",
    "checkpoint:before-index-commit",
    "checkpoint:after-index-commit",
    "journal:delete-segment",
]


def journal_only_state(data_dir: Path, rng: random.Random) -> dict[int, list[bytes]]:
    """Two ledgers over several runs and segments; the last run's adds are only in the
    journal. Returns the acknowledged entries per ledger."""
    config = rolling_config(journal_segments_kept_max=0)
    store = Storage.open(data_dir, config)
    first, first_datas = new_ledger(store, rng, 6)
    store.checkpoint()
    store.abandon()
    store = Storage.open(data_dir, config)
    second, second_datas = new_ledger(store, rng, 12)
    more = [entry_data(rng, first, 6 + i) for i in range(5)]
    write_entries(store, first, more)
    store.abandon()
    return {first: first_datas + more, second: second_datas}


def assert_state(store: Storage, expected: dict[int, list[bytes]]) -> None:
    assert [i.ledger_id for i in store.list_ledgers()] == sorted(expected)
    for ledger_id, datas in expected.items():
        assert_ledger_holds(store, ledger_id, datas)
    report = store.check()
    assert report.ok, report.render()


@pytest.mark.parametrize("point", RECOVERY_POINTS)
def test_crash_during_recovery(tmp_path: Path, rng: random.Random, seed: int,
                               point: str) -> None:
    expected = journal_only_state(tmp_path, rng)
    mark_before = read_mark(tmp_path)
    sim = SimFileSystem(seed, crash_at_point=point)
    open_until_crash(tmp_path, rolling_config(journal_segments_kept_max=0), sim)
    assert sim.crashed_at == f"crash point {point}"
    sim.power_loss()
    mark_after = read_mark(tmp_path)
    assert mark_before is not None
    assert mark_after is not None
    assert mark_after >= mark_before
    with Storage.open(tmp_path, rolling_config()) as store:
        assert_state(store, expected)
    with Storage.open(tmp_path, rolling_config()) as store:  # converged: nothing to redo
        assert_state(store, expected)
        assert replay_stats(store).records == 0


def test_crash_during_recovery_at_every_operation(tmp_path: Path, seed: int) -> None:
    """Crash a recovery at each of its file operations, crash the next recovery early
    too, and let a third one finish: every run converges to the same state."""
    rng = random.Random(seed)
    base = tmp_path / "base"
    expected = journal_only_state(base, rng)
    counter = SimFileSystem(seed)
    Storage.open(copy_tree(base, tmp_path / "count"), rolling_config(), fs=counter).abandon()
    assert counter.ops > 5
    for op in range(1, counter.ops + 1):
        run = copy_tree(base, tmp_path / f"op{op}")
        sim = SimFileSystem(seed + op, crash_at_op=op)
        open_until_crash(run, rolling_config(), sim)
        sim.power_loss()
        # Every recovery creates a journal segment (at least five operations), so this
        # one crashes too.
        again = SimFileSystem(seed - op, crash_at_op=1 + op % 5)
        open_until_crash(run, rolling_config(), again)
        again.power_loss()
        with Storage.open(run, rolling_config()) as store:
            assert_state(store, expected)


def copy_tree(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


# -- restarts and rolling journals --------------------------------------------------------

def test_restarts_in_a_row_create_one_segment_each(tmp_path: Path, rng: random.Random) -> None:
    """BookKeeper's testJournalReplayForBookieRestartInReadOnlyMode: crash before any
    checkpoint of the data, restart three times; only the first replays."""
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 10)
    store.abandon()
    marks = []
    for restart in range(3):
        before = segment_ids(tmp_path)
        store = Storage.open(tmp_path, make_config())
        created = segment_ids(tmp_path) - before
        assert created == {max(before) + 1}
        stats = replay_stats(store)
        assert (stats.records > len(datas)) if restart == 0 else (stats.records == 0)
        assert_ledger_holds(store, ledger_id, datas)
        mark = store.inspect().mark
        assert mark is not None
        assert mark.segment_id == max(before) + 1
        marks.append(mark)
        store.abandon()
    assert marks == sorted(marks)
    assert len({m.segment_id for m in marks}) == 3


def test_replay_skips_deleted_ledger(tmp_path: Path, rng: random.Random) -> None:
    """Adds journaled for ledgers that are later deleted: replay neither fails nor brings
    the ledgers back, whether the delete is in the replayed journal or already a
    tombstone in the index."""
    store = Storage.open(tmp_path, make_config())
    checkpointed, _ = new_ledger(store, rng, 5)
    kept, kept_datas = new_ledger(store, rng, 5)
    journaled, _ = new_ledger(store, rng, 5)
    store.checkpoint()
    store.wait(store.delete_ledger(checkpointed))
    store.checkpoint()  # this tombstone is in the index
    store.wait(store.delete_ledger(journaled))  # this delete only in the journal
    store.abandon()

    def reopen_and_check() -> ReplayStats:
        store = Storage.open(tmp_path, make_config())
        assert [i.ledger_id for i in store.list_ledgers()] == [kept]
        assert_ledger_holds(store, kept, kept_datas)
        for gone in (checkpointed, journaled):
            with pytest.raises(LedgerNotFoundError):
                store.read_entry(gone, 0)
        assert store.check().ok, store.check().render()
        stats = replay_stats(store)
        store.abandon()
        return stats

    reopen_and_check()
    # Without a mark, replay starts at LSN 1 and meets both ledgers' records again. The
    # first reopen's checkpoint purged their tombstones (its mark was past them), so each
    # is created, filled and deleted again by the replay (no add skipped), and stays gone.
    set_raw_mark(tmp_path, None)
    assert reopen_and_check().skipped_adds == 0


def test_rolling_journal_with_checkpoints(tmp_path: Path, rng: random.Random) -> None:
    kept_max = 2
    config = rolling_config(journal_segments_kept_max=kept_max)
    store = Storage.open(tmp_path, config)
    ledger_id = store.wait(store.create_ledger({}))
    datas: list[bytes] = []
    for _ in range(12):
        batch = [entry_data(rng, ledger_id, len(datas) + i) for i in range(8)]
        write_entries(store, ledger_id, batch)
        datas += batch
        store.checkpoint()
        mark = store.inspect().mark
        assert mark is not None
        older = [s for s in segment_ids(tmp_path) if s < mark.segment_id]
        assert len(older) <= kept_max
    assert max(segment_ids(tmp_path)) >= 10  # it did roll over many times
    store.abandon()
    with Storage.open(tmp_path, config) as store:
        assert_ledger_holds(store, ledger_id, datas)
        assert len(segment_ids(tmp_path)) <= kept_max + 2
        assert store.check().ok


def test_rolling_journal_without_checkpoints(tmp_path: Path, rng: random.Random) -> None:
    config = rolling_config(checkpoint_interval_ms=10**9)
    store = Storage.open(tmp_path, config)
    ledgers = {}
    for _ in range(3):
        ledger_id, datas = new_ledger(store, rng, 20)
        ledgers[ledger_id] = datas
    store.abandon()
    present = segment_ids(tmp_path)
    assert len(present) >= 10
    with Storage.open(tmp_path, config) as store:
        assert replay_stats(store).segments == len(present)
        assert_state(store, ledgers)


# -- entry logs ---------------------------------------------------------------------------

def test_entry_log_uncommitted_tail_trimmed(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 6)
    store.checkpoint()
    ((log_id, committed, *_),) = store.inspect().entry_logs
    store.abandon()
    path = tmp_path / "entrylogs" / f"{log_id:08x}.log"
    assert path.stat().st_size == committed
    with open(path, "ab") as f:
        f.write(rng.randbytes(1000))  # a checkpoint's append that never committed
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    assert path.stat().st_size == committed
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


def test_unregistered_entry_log_removed(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    ledger_id, datas = new_ledger(store, rng, 6)
    store.checkpoint()
    registered = {i for i, *_ in store.inspect().entry_logs}
    store.abandon()
    orphan = tmp_path / "entrylogs" / f"{max(registered) + 1:08x}.log"
    orphan.write_bytes(rng.randbytes(3000))
    store = reopen_and_expect(tmp_path, ledger_id, datas)
    assert not orphan.exists()
    assert {i for i, *_ in store.inspect().entry_logs} == registered
    assert_writable_after(store, ledger_id, datas, rng, tmp_path)


def test_registered_entry_log_missing(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    new_ledger(store, rng, 6)
    store.checkpoint()
    ((log_id, *_),) = store.inspect().entry_logs
    store.abandon()
    path = tmp_path / "entrylogs" / f"{log_id:08x}.log"
    path.unlink()
    before = directory_digest(tmp_path)
    with pytest.raises(CorruptionError) as caught:
        Storage.open(tmp_path, make_config())
    assert caught.value.path == str(path)
    assert directory_digest(tmp_path) == before


# -- ledger state and the mark ------------------------------------------------------------

@pytest.mark.parametrize("checkpointed", [False, True])
def test_acknowledged_fence_survives(tmp_path: Path, rng: random.Random, seed: int,
                                     checkpointed: bool) -> None:
    sim = SimFileSystem(seed)
    store = Storage.open(tmp_path, make_config(), fs=sim)
    fenced, fenced_datas = new_ledger(store, rng, 4)
    other, other_datas = new_ledger(store, rng, 4)
    assert store.wait(store.fence(fenced)) == 3
    if checkpointed:
        store.checkpoint()
    sim.crash()
    store.abandon()
    sim.power_loss()
    with Storage.open(tmp_path, make_config()) as store:
        assert store.ledger_info(fenced).state == "fenced"
        assert store.ledger_info(other).state == "open"
        with pytest.raises(LedgerFencedError):
            store.add_entry(fenced, b"refused")
        assert_ledger_holds(store, fenced, fenced_datas)
        write_entries(store, other, [b"still open"])
        assert_ledger_holds(store, other, [*other_datas, b"still open"])


def test_persisted_mark_never_regresses(tmp_path: Path, rng: random.Random, seed: int) -> None:
    config = rolling_config()
    store = Storage.open(tmp_path, config)
    ledger_id = store.wait(store.create_ledger({}))
    seen: list[JournalMark] = []
    for run in range(6):
        if run:
            sim = SimFileSystem(seed + run)
            store = Storage.open(tmp_path, config, fs=sim)
        mark = store.inspect().mark
        assert mark is not None
        seen.append(mark)
        write_entries(store, ledger_id, [entry_data(rng, ledger_id, 100 + i)[:50]
                                         for i in range(run * 3)])
        if run % 2:
            store.checkpoint()
        stale = seen[0]
        # A stale checkpoint completion (an older mark) must not move the mark back.
        with store.checkpointer.lock:
            store.checkpointer.flush(CacheHalf(), [], [], stale)
        after = store.inspect().mark
        assert after is not None
        assert after >= mark
        seen.append(after)
        store.abandon()
        if run:
            sim.power_loss()
        assert read_mark(tmp_path) == after
    assert seen == sorted(seen)


def test_damaged_header_of_older_segment(tmp_path: Path, rng: random.Random) -> None:
    ledger_id, datas = rolled_journal(tmp_path, rng, 30)
    middle = segment_paths(tmp_path)[1]
    flip_bit(middle, 10)
    with pytest.raises(CorruptionError) as caught:
        Storage.open(tmp_path, rolling_config())
    assert caught.value.path == str(middle)
    assert caught.value.offset == 0
    # Skipping loses the damaged segment and every later add of the ledger (ids stay dense).
    with Storage.open(tmp_path, rolling_config(skip_corrupt_journal_segments=True)) as store:
        kept = store.last_add_confirmed(ledger_id) + 1
        assert 0 < kept < len(datas)
        assert_ledger_holds(store, ledger_id, datas[:kept])
        assert store.check().ok, store.check().render()


def test_read_from_a_missing_entry_log_names_the_file(tmp_path: Path,
                                                      rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    ledger_id, _ = new_ledger(store, rng, 5)
    store.checkpoint()
    log_file = next((tmp_path / "entrylogs").glob("*.log"))
    log_file.unlink()
    store.logs.reader.close()  # no cached handle may hide the loss
    with pytest.raises(CorruptionError) as caught:
        store.read_entries(ledger_id, 0, 4)
    assert caught.value.path == str(log_file)
    store.abandon()
