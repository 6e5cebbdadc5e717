"""A deleted ledger's tombstone (its DELETED record in the ledger table and in LMDB) is purged
once a persisted mark is past its delete record, and never before: a restart does not bring
the ledger back, its id is never handed out again, and a crash at any step between the
delete and the purge recovers to the same state. Real files and a real LMDB index."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from magnetar.storage import LedgerNotFoundError, Storage, StorageConfig, StorageFailedError
from magnetar.storage._index import CheckpointWrite, Index
from magnetar.storage.testing.simfs import SimFileSystem

CONFIG = StorageConfig(
    background_threads=False,
    journal_alignment_bytes=512,
    journal_prealloc_bytes=4096,
    journal_segment_bytes_max=1 << 20,
    entry_size_bytes_max=16 * 1024,
    journal_record_bytes_max=32 * 1024,
    write_cache_bytes_max=4 << 20,
    lmdb_map_bytes=64 << 20,
)


def index_records(data_dir: Path) -> dict[int, str]:
    """Ledger id -> state, as the LMDB index of a closed directory holds them."""
    index = Index(str(data_dir / "index"), CONFIG.lmdb_map_bytes)
    try:
        return {i: r.state for i, r in index.load_ledgers().items()}
    finally:
        index.close()


def ledger_with_entries(store: Storage, count: int = 3) -> int:
    ledger_id = store.wait(store.create_ledger({"topic": f"t{store.ledgers.next_id}"}))
    for entry_id in range(count):
        assert store.wait(store.add_entry(ledger_id, b"x%d" % entry_id)) == entry_id
    return ledger_id


def assert_gone_and_never_reused(data_dir: Path, gone: list[int], kept: list[int]) -> None:
    """Reopen: the deleted ledgers are neither listed nor readable nor in the index, and a
    new ledger gets an id above every id used before."""
    with Storage.open(data_dir, CONFIG) as store:
        assert [i.ledger_id for i in store.list_ledgers()] == kept
        for ledger_id in gone:
            assert store.ledgers.get(ledger_id) is None
            with pytest.raises(LedgerNotFoundError):
                store.read_entry(ledger_id, 0)
        assert all(store.index.locations(i, 0, 100) == [] for i in gone)
        fresh = store.wait(store.create_ledger({}))
        assert fresh > max(gone + kept)
        assert store.check().ok
    assert not set(gone) & set(index_records(data_dir))


def test_a_deleted_ledger_leaves_table_and_index_once_a_checkpoint_passes_its_delete(
        tmp_path: Path) -> None:
    store = Storage.open(tmp_path, CONFIG)
    kept = ledger_with_entries(store)
    gone = ledger_with_entries(store)
    store.checkpoint()
    store.wait(store.delete_ledger(gone))
    assert store.ledgers.get(gone) is not None  # the tombstone, until a checkpoint
    store.checkpoint()
    assert store.ledgers.get(gone) is None
    assert store.index.locations(gone, 0, 100) == []
    store.close()
    assert index_records(tmp_path) == {kept: "open"}
    assert_gone_and_never_reused(tmp_path, [gone], [kept])


def test_a_tombstone_stays_while_the_persisted_mark_is_before_its_delete(
        tmp_path: Path) -> None:
    """A checkpoint taken while the delete record is still unsynced persists the tombstone
    and keeps it (a replay from that mark would meet the ledger's create); the next
    checkpoint, whose mark is past the delete, purges it."""
    store = Storage.open(tmp_path, CONFIG)
    gone = ledger_with_entries(store)
    deleted = store.delete_ledger(gone)  # queued: nobody pumps the journal yet
    store.checkpoint()
    assert store.ledgers.get(gone) is not None
    assert store.index.load_ledgers()[gone].state == "deleted"  # committed, kept
    store.wait(deleted)
    store.checkpoint()
    assert store.ledgers.get(gone) is None
    store.close()
    assert_gone_and_never_reused(tmp_path, [gone], [])


def test_a_crash_between_the_delete_and_any_checkpoint_replays_the_delete(
        tmp_path: Path) -> None:
    store = Storage.open(tmp_path, CONFIG)
    kept = ledger_with_entries(store)
    store.checkpoint()
    gone = ledger_with_entries(store)  # its create and adds only in the journal
    store.wait(store.delete_ledger(gone))
    store.abandon()  # a process crash: no checkpoint after the delete
    assert_gone_and_never_reused(tmp_path, [gone], [kept])


def test_a_crash_between_the_tombstone_and_its_purge_recovers_and_purges(
        tmp_path: Path) -> None:
    """The index holds the tombstone (a checkpoint persisted it before the delete was
    synced), the delete record is in the journal after the mark: recovery loads the one,
    replays the other, and its checkpoint purges the tombstone."""
    store = Storage.open(tmp_path, CONFIG)
    gone = ledger_with_entries(store)
    deleted = store.delete_ledger(gone)
    store.checkpoint()
    store.wait(deleted)
    store.abandon()
    assert index_records(tmp_path) == {gone: "deleted"}
    assert_gone_and_never_reused(tmp_path, [gone], [])


def test_a_purged_ledger_stays_gone_when_replay_meets_its_records_again(
        tmp_path: Path) -> None:
    """After the purge the journal may still hold the ledger's create and delete (older
    segments are kept); with the mark lost, replay reads them again from the start and the
    ledger ends deleted again, not resurrected, and no id comes back."""
    store = Storage.open(tmp_path, CONFIG)
    kept = ledger_with_entries(store)
    gone = ledger_with_entries(store)
    store.wait(store.delete_ledger(gone))
    store.checkpoint()
    store.abandon()
    index = Index(str(tmp_path / "index"), CONFIG.lmdb_map_bytes)
    index.write_mark_raw(None)
    index.close()
    assert_gone_and_never_reused(tmp_path, [gone], [kept])


@pytest.mark.parametrize("point", ["checkpoint:before-index-commit",
                                   "checkpoint:after-index-commit"])
def test_a_power_loss_around_the_purging_commit_recovers(tmp_path: Path, seed: int,
                                                         point: str) -> None:
    sim = SimFileSystem(seed, crash_at_point=point, point_hits=2)  # 1: the open's checkpoint
    store = Storage.open(tmp_path, CONFIG, fs=sim)
    kept = ledger_with_entries(store)
    gone = ledger_with_entries(store)
    store.wait(store.delete_ledger(gone))
    with pytest.raises(StorageFailedError):  # the simulated machine stops
        store.checkpoint()
    assert sim.crashed_at == f"crash point {point}"
    store.abandon()
    sim.power_loss()
    assert_gone_and_never_reused(tmp_path, [gone], [kept])


def test_each_checkpoint_purges_at_most_its_limit_and_runs_for_a_backlog(
        tmp_path: Path) -> None:
    config = replace(CONFIG, tombstones_purged_per_checkpoint_max=3)
    store = Storage.open(tmp_path, config)
    ids = [store.wait(store.create_ledger({})) for _ in range(7)]
    for completion in store.delete_ledgers(ids):
        store.wait(completion)
    left = []
    for _ in range(3):
        store.checkpoint()  # the last two have nothing to flush but tombstones
        left.append(sum(1 for i in ids if store.ledgers.get(i) is not None))
    assert left == [4, 1, 0]
    store.close()
    assert index_records(tmp_path) == {}


def test_a_restart_purges_the_tombstones_an_older_run_left(tmp_path: Path) -> None:
    """Tombstones already in the index (left by a run before this fix, or by a delete while
    the disk was full) go with the open's checkpoint: the table no longer grows with every
    restart."""
    store = Storage.open(tmp_path, CONFIG)
    ids = [store.wait(store.create_ledger({})) for _ in range(5)]
    store.checkpoint()
    store.close()
    index = Index(str(tmp_path / "index"), CONFIG.lmdb_map_bytes)
    records = index.load_ledgers()
    for record in records.values():
        record.state = "deleted"
    index.commit_checkpoint(CheckpointWrite(mark=None, ledgers=list(records.values())))
    index.close()
    assert_gone_and_never_reused(tmp_path, ids, [])


def test_an_acknowledged_but_unsynced_delete_keeps_its_tombstone(tmp_path: Path) -> None:
    """With `journal_sync=False` a delete is acknowledged once written, before the sync that
    moves the mark: a checkpoint then must keep the tombstone (a power loss could still
    take the delete record and leave the create to replay); once the journal has synced
    (at close), the close's checkpoint purges it."""
    config = replace(CONFIG, background_threads=True, journal_sync=False,
                     journal_sync_interval_ms=60_000, checkpoint_interval_ms=60_000)
    store = Storage.open(tmp_path, config)
    gone = store.create_ledger({}).result(10)
    store.delete_ledger(gone).result(10)
    assert store.ledgers.tombstones  # acknowledged: queued for a purge
    store.checkpoint()
    assert store.ledgers.get(gone) is not None
    assert store.index.load_ledgers()[gone].state == "deleted"
    store.close()
    assert index_records(tmp_path) == {}
