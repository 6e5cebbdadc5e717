"""Garbage collection and compaction of entry logs (storage design §12.5, BookKeeper's
CompactionTest): dead logs are deleted, mostly-dead logs are compacted, live entries stay
byte-identical, and a crash at any GC step leaves a directory that reopens with every live
entry and no orphan files.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from magnetar.storage import (
    LedgerNotFoundError,
    OsFileSystem,
    Storage,
    StorageConfig,
    StorageError,
    StorageFullError,
)
from magnetar.storage._entry_log import split_location
from magnetar.storage.testing.simfs import SimFileSystem

ENTRY_LOG_BYTES_MAX = 16 * 1024

COMPACTION_POINTS = [
    "compaction:after-copy",
    "compaction:after-sync",
    "compaction:after-index-update",
    "gc:after-index-drop",
]


def make_config(**overrides: object) -> StorageConfig:
    settings: dict[str, object] = {
        "background_threads": False,
        "journal_alignment_bytes": 512,
        "journal_prealloc_bytes": 4096,
        "entry_size_bytes_max": 8 * 1024,
        "journal_record_bytes_max": 16 * 1024,
        "entry_log_bytes_max": ENTRY_LOG_BYTES_MAX,
        "write_cache_bytes_max": 4 << 20,
        "lmdb_map_bytes": 64 << 20,
    }
    settings.update(overrides)
    return StorageConfig(**settings)  # type: ignore[arg-type]


Ledgers = dict[int, list[bytes]]


def add_all(store: Storage, ledger_id: int, datas: list[bytes]) -> None:
    completions = [store.add_entry(ledger_id, data) for data in datas]
    for completion in completions:
        store.wait(completion)


def interleaved(store: Storage, rng: random.Random, sizes: dict[str, int],
                count: int) -> dict[str, tuple[int, list[bytes]]]:
    """Create one ledger per name and add `count` entries to each, alternating, with the
    name's entry size; then checkpoint, so they share entry logs."""
    made: dict[str, tuple[int, list[bytes]]] = {}
    for name in sizes:
        made[name] = (store.wait(store.create_ledger({"name": name})), [])
    for entry_id in range(count):
        for name, size in sizes.items():
            ledger_id, datas = made[name]
            data = f"{name}{entry_id}:".encode() + rng.randbytes(size)
            datas.append(data)
            add_all(store, ledger_id, [data])
    store.checkpoint()
    return made


def assert_holds(store: Storage, ledgers: Ledgers) -> None:
    for ledger_id, datas in ledgers.items():
        assert store.last_add_confirmed(ledger_id) == len(datas) - 1
        assert store.read_entries(ledger_id, 0, len(datas) - 1) == datas


def assert_gone(store: Storage, ledger_ids: list[int]) -> None:
    for ledger_id in ledger_ids:
        with pytest.raises(LedgerNotFoundError):
            store.read_entry(ledger_id, 0)


def log_files(data_dir: Path) -> set[int]:
    return {int(p.stem, 16) for p in (data_dir / "entrylogs").glob("*.log")}


def registered_logs(store: Storage) -> set[int]:
    """The entry logs LMDB knows (read from the index itself, not the memory copy)."""
    return set(store.index.load_entry_logs())


def logs_holding(store: Storage, ledger_id: int) -> set[int]:
    return {log_id for log_id, record in store.logs.records.items()
            if ledger_id in record.ledgers}


def log_of_entry(store: Storage, ledger_id: int, entry_id: int) -> int:
    location = store.index.location(ledger_id, entry_id)
    assert location is not None
    return split_location(location)[0]


def assert_clean_directory(store: Storage, data_dir: Path) -> None:
    """No orphan entry logs, index and memory agree, and `check()` finds nothing."""
    assert log_files(data_dir) == registered_logs(store) == set(store.logs.records)
    report = store.check()
    assert report.ok, report.render()


@pytest.fixture
def rng(seed: int) -> random.Random:
    return random.Random(seed)


def test_gc_deletes_logs_without_live_data(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config())
    dead = interleaved(store, rng, {"dead": 900}, 40)["dead"][0]
    live_id, live_datas = interleaved(store, rng, {"live": 900}, 40)["live"]
    dead_only = logs_holding(store, dead) - logs_holding(store, live_id)
    assert store.logs.writer is not None
    dead_only.discard(store.logs.writer.log_id)
    assert len(dead_only) >= 2
    store.wait(store.delete_ledger(dead))
    store.checkpoint()  # purges the ledger's locations and its bytes from the logs
    done = store.gc()
    assert done["logs_deleted"] >= len(dead_only)
    assert not dead_only & log_files(tmp_path)  # the files are gone
    assert not dead_only & registered_logs(store)  # and so are their index records
    assert_holds(store, {live_id: live_datas})
    assert_gone(store, [dead])
    assert_clean_directory(store, tmp_path)
    store.close()
    with Storage.open(tmp_path, make_config()) as store:
        assert_holds(store, {live_id: live_datas})
        assert_clean_directory(store, tmp_path)
        assert store.gc() == {"logs_deleted": 0, "logs_compacted": 0, "entries_moved": 0}


def mostly_dead_log(data_dir: Path, rng: random.Random) -> tuple[Ledgers, list[int], int]:
    """One sealed-or-closed entry log holding a big deleted ledger and two small live
    ones, after a restart (so that no log is the one being written). Returns the live
    ledgers, the deleted ones, and the log id."""
    store = Storage.open(data_dir, make_config(entry_log_bytes_max=1 << 20))
    made = interleaved(store, rng, {"big": 1500, "small": 120, "tiny": 40}, 12)
    store.wait(store.delete_ledger(made["big"][0]))
    store.close()
    (log_id,) = log_files(data_dir)
    live = {made[n][0]: made[n][1] for n in ("small", "tiny")}
    return live, [made["big"][0]], log_id


def test_gc_compacts_logs_below_live_ratio(tmp_path: Path, rng: random.Random) -> None:
    live, dead, old_log = mostly_dead_log(tmp_path, rng)
    store = Storage.open(tmp_path, make_config())
    record = store.logs.records[old_log]
    assert record.live_bytes() / record.total_bytes < store.config.compaction_live_ratio_min
    done = store.gc()
    assert done["logs_compacted"] == 1
    assert done["entries_moved"] == sum(len(d) for d in live.values())
    assert old_log not in log_files(tmp_path)
    assert old_log not in registered_logs(store)
    (new_log,) = log_files(tmp_path)
    assert new_log > old_log
    for ledger_id, datas in live.items():
        for entry_id in range(len(datas)):
            assert log_of_entry(store, ledger_id, entry_id) == new_log
    assert_holds(store, live)
    assert_gone(store, dead)
    new_record = store.logs.records[new_log]
    assert new_record.sealed
    assert new_record.live_bytes() == new_record.total_bytes
    assert_clean_directory(store, tmp_path)
    assert store.gc()["logs_compacted"] == 0  # the copy is all live
    store.close()
    with Storage.open(tmp_path, make_config()) as store:
        assert_holds(store, live)
        assert_gone(store, dead)
        assert_clean_directory(store, tmp_path)


def test_gc_keeps_logs_above_live_ratio(tmp_path: Path, rng: random.Random) -> None:
    store = Storage.open(tmp_path, make_config(entry_log_bytes_max=1 << 20))
    made = interleaved(store, rng, {"dead": 100, "live": 900}, 12)
    store.wait(store.delete_ledger(made["dead"][0]))
    store.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "entrylogs").iterdir()}
    with Storage.open(tmp_path, make_config()) as store:
        assert store.gc() == {"logs_deleted": 0, "logs_compacted": 0, "entries_moved": 0}
        assert_holds(store, {made["live"][0]: made["live"][1]})
    assert {p.name: p.read_bytes() for p in (tmp_path / "entrylogs").iterdir()} == before


class PointHooks(OsFileSystem):
    """The real file system, running an action when the engine passes a named point (a
    way to act in the middle of a GC without threads)."""

    def __init__(self) -> None:
        self.hooks: dict[str, Callable[[], None]] = {}
        self.passed: list[str] = []

    def point(self, label: str) -> None:
        self.passed.append(label)
        hook = self.hooks.pop(label, None)
        if hook is not None:
            hook()


@pytest.mark.parametrize("point", ["compaction:after-copy", "compaction:after-sync",
                                   "compaction:after-index-update"])
def test_ledger_deleted_during_compaction(tmp_path: Path, rng: random.Random,
                                          point: str) -> None:
    live, dead, _ = mostly_dead_log(tmp_path, rng)
    victim, survivor = sorted(live)
    fs = PointHooks()
    store = Storage.open(tmp_path, make_config(), fs=fs)

    def delete_victim() -> None:
        store.wait(store.delete_ledger(victim))

    fs.hooks[point] = delete_victim
    assert store.gc()["logs_compacted"] == 1
    assert point in fs.passed
    assert point not in fs.hooks  # the hook ran
    assert_holds(store, {survivor: live[survivor]})
    assert_gone(store, [*dead, victim])
    assert_clean_directory(store, tmp_path)
    store.checkpoint()  # purges the victim's relocated entries
    (new_log,) = log_files(tmp_path)
    assert victim not in store.logs.records[new_log].ledgers
    assert_clean_directory(store, tmp_path)
    store.close()
    with Storage.open(tmp_path, make_config()) as store:
        assert_holds(store, {survivor: live[survivor]})
        assert_gone(store, [*dead, victim])
        assert_clean_directory(store, tmp_path)


def gc_workload(data_dir: Path, rng: random.Random) -> tuple[Ledgers, list[int]]:
    """A directory where GC has both kinds of work: logs holding only a deleted ledger
    (dropped) and logs where a deleted ledger shares room with live ones (compacted)."""
    store = Storage.open(data_dir, make_config())
    alone = interleaved(store, rng, {"alone": 1200}, 30)["alone"][0]
    made = interleaved(store, rng, {"shared": 1500, "keep": 150, "keep2": 60}, 30)
    for ledger_id in (alone, made["shared"][0]):
        store.wait(store.delete_ledger(ledger_id))
    store.close()
    live = {made[n][0]: made[n][1] for n in ("keep", "keep2")}
    return live, [alone, made["shared"][0]]


@pytest.mark.parametrize("point", COMPACTION_POINTS)
def test_crash_during_gc(tmp_path: Path, seed: int, point: str) -> None:
    for attempt in range(3):
        rng = random.Random(seed + attempt)
        data_dir = tmp_path / f"run{attempt}"
        live, dead = gc_workload(data_dir, rng)
        sim = SimFileSystem(seed + attempt, crash_at_point=point)
        store = Storage.open(data_dir, make_config(), fs=sim)
        with pytest.raises((OSError, StorageError)):
            store.gc()
        assert sim.crashed_at == f"crash point {point}"
        store.abandon()
        sim.power_loss()
        with Storage.open(data_dir, make_config()) as store:
            assert_holds(store, live)
            assert_gone(store, dead)
            assert_clean_directory(store, data_dir)
            store.gc()  # finishes what the crashed run left
            assert_holds(store, live)
            assert_clean_directory(store, data_dir)
        with Storage.open(data_dir, make_config()) as store:
            assert_holds(store, live)
            assert_clean_directory(store, data_dir)


def test_gc_disk_full_fails_cleanly(tmp_path: Path, rng: random.Random, seed: int) -> None:
    live, dead = gc_workload(tmp_path, rng)
    sim = SimFileSystem(seed)
    store = Storage.open(tmp_path, make_config(), fs=sim)
    sim.fail_writes(errno.ENOSPC, after=3)  # part-way through the first compaction
    with pytest.raises(StorageFullError):
        store.gc()
    assert isinstance(store.failed, StorageFullError)
    with pytest.raises(StorageFullError):
        store.add_entry(min(live), b"refused")
    assert_holds(store, live)  # reads still work
    store.abandon()
    sim.heal()
    sim.power_loss()
    with Storage.open(tmp_path, make_config()) as store:
        assert_holds(store, live)
        assert_gone(store, dead)
        assert_clean_directory(store, tmp_path)
        done = store.gc()
        assert done["logs_compacted"] + done["logs_deleted"] >= 1
        assert_clean_directory(store, tmp_path)


def test_gc_with_delete_in_flight_then_crash(tmp_path: Path, rng: random.Random,
                                             seed: int) -> None:
    """A delete that is not yet durable when GC compacts the ledger's log, then a crash
    that loses the delete: the ledger is back, so its entries must be too."""
    live, dead, old_log = mostly_dead_log(tmp_path, rng)
    victim = min(live)
    sim = SimFileSystem(seed)
    store = Storage.open(tmp_path, make_config(), fs=sim)
    in_flight = store.delete_ledger(victim)  # queued, never written: no pump
    assert store.gc()["logs_compacted"] == 1
    assert old_log not in log_files(tmp_path)
    assert not in_flight.done()
    sim.crash()
    store.abandon()
    sim.power_loss()
    with Storage.open(tmp_path, make_config()) as store:
        assert_holds(store, live)  # the delete was lost, the ledger and entries were not
        assert_gone(store, dead)
        assert_clean_directory(store, tmp_path)
