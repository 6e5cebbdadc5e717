"""The metadata store: direct LMDB transactions, and journaled operations that are visible
at once, durable when their completion finishes, and folded into LMDB at checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.storage import Storage
from magnetar.storage.testing.simfs import SimFileSystem
from tests.storage.helpers import small_config

PUMPED = small_config(background_threads=False)


def lmdb_value(store: Storage, key: bytes) -> bytes | None:
    """The value LMDB itself holds, bypassing the journaled overlay."""
    with store.index.env.begin(db=store.index.kv) as txn:
        raw = txn.get(key)
        return None if raw is None else bytes(raw)


@pytest.fixture
def store(tmp_path: Path) -> Storage:
    return Storage.open(tmp_path, PUMPED)


# -- direct writes -----------------------------------------------------------------------

def test_get_put_delete(store: Storage) -> None:
    meta = store.metadata
    assert meta.get(b"missing") is None
    meta.put(b"k", b"v1")
    assert meta.get(b"k") == b"v1"
    meta.put(b"k", b"v2")
    assert meta.get(b"k") == b"v2"
    meta.put(b"empty", b"")
    assert meta.get(b"empty") == b""
    meta.delete(b"k")
    assert meta.get(b"k") is None
    meta.delete(b"never-there")  # deleting a missing key is not an error
    store.close()


def test_scan_by_prefix(store: Storage) -> None:
    meta = store.metadata
    items = {b"topic/a": b"1", b"topic/b": b"2", b"topic/b/x": b"3", b"topics": b"4",
             b"cursor/a": b"5", b"\xff\xff": b"6"}
    for key, value in items.items():
        meta.put(key, value)
    assert meta.scan(b"topic/") == [(b"topic/a", b"1"), (b"topic/b", b"2"),
                                    (b"topic/b/x", b"3")]
    assert meta.scan(b"topic") == [(b"topic/a", b"1"), (b"topic/b", b"2"),
                                   (b"topic/b/x", b"3"), (b"topics", b"4")]
    assert meta.scan(b"") == sorted(items.items())
    assert meta.scan(b"zzz") == []
    assert meta.scan(b"\xff") == [(b"\xff\xff", b"6")]
    store.close()


def test_transaction_applies_all_together(store: Storage) -> None:
    with store.metadata.transaction() as txn:
        txn.put(b"a", b"1")
        txn.put(b"b", b"2")
        assert txn.get(b"a") == b"1", "a transaction sees its own writes"
    assert store.metadata.scan(b"") == [(b"a", b"1"), (b"b", b"2")]
    store.close()


def test_exception_in_transaction_applies_nothing(store: Storage) -> None:
    store.metadata.put(b"a", b"old")

    class Boom(Exception):
        pass

    def write_then_fail() -> None:
        with store.metadata.transaction() as txn:
            txn.put(b"a", b"new")
            txn.put(b"b", b"2")
            txn.delete(b"a")
            raise Boom

    with pytest.raises(Boom):
        write_then_fail()
    assert store.metadata.get(b"a") == b"old"
    assert store.metadata.get(b"b") is None
    store.close()


def test_direct_writes_survive_reopen(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    store.metadata.put(b"ml/topic", b"ledgers=1,2,3")
    with store.metadata.transaction() as txn:
        txn.put(b"ml/other", b"ledgers=4")
    store.abandon()  # committed LMDB transactions are durable: no checkpoint needed
    reopened = Storage.open(tmp_path, PUMPED)
    assert reopened.metadata.scan(b"ml/") == [(b"ml/other", b"ledgers=4"),
                                              (b"ml/topic", b"ledgers=1,2,3")]
    reopened.close()


@pytest.mark.parametrize("key", [b"", b"x" * 512, "text"])
def test_bad_keys_are_refused(store: Storage, key: object) -> None:
    with pytest.raises(ValueError, match="metadata keys"):
        store.metadata.put(key, b"v")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="metadata keys"):
        store.metadata.apply_journaled([(b"good", b"v"), (key, b"v")])  # type: ignore[list-item]
    assert store.metadata.get(b"good") is None, "nothing of a refused batch is applied"
    assert store.journal is not None
    assert store.journal.pending() == 0
    store.close()


def test_longest_key(store: Storage) -> None:
    key = b"k" * 511
    store.metadata.put(key, b"v")
    store.wait(store.metadata.apply_journaled([(key, b"w")]))
    store.checkpoint()
    assert lmdb_value(store, key) == b"w"
    store.close()


# -- journaled writes --------------------------------------------------------------------

def test_journaled_ops_are_visible_at_once(store: Storage) -> None:
    store.metadata.put(b"cursor/gone", b"x")
    done = store.metadata.apply_journaled([(b"cursor/a", b"10"), (b"cursor/gone", None)])
    assert not done.done(), "not yet durable"
    assert store.metadata.get(b"cursor/a") == b"10"
    assert store.metadata.get(b"cursor/gone") is None
    assert store.metadata.scan(b"cursor/") == [(b"cursor/a", b"10")]
    assert lmdb_value(store, b"cursor/a") is None, "LMDB gets it only at checkpoint"
    assert store.wait(done) == 0
    store.close()


def test_journaled_ops_survive_a_crash_without_checkpoint(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    store.metadata.put(b"cursor/deleted", b"old")
    store.wait(store.metadata.apply_journaled([(b"cursor/a", b"1"), (b"cursor/b", b"2")]))
    store.wait(store.metadata.apply_journaled([(b"cursor/a", b"3"), (b"cursor/deleted", None)]))
    unsynced = store.metadata.apply_journaled([(b"cursor/c", b"never acknowledged")])
    assert not unsynced.done()
    store.abandon()  # a crash: no checkpoint, no more I/O

    reopened = Storage.open(tmp_path, PUMPED)
    assert reopened.metadata.scan(b"cursor/") == [(b"cursor/a", b"3"), (b"cursor/b", b"2")]
    assert reopened.metadata.get(b"cursor/deleted") is None
    assert reopened.metadata.get(b"cursor/c") is None, "never written, never visible"
    reopened.close()


def test_journaled_ops_survive_a_power_loss(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed)
    store = Storage.open(tmp_path, PUMPED, fs=fs)
    acknowledged = {}
    for i in range(20):
        key, value = b"cursor/%02d" % (i % 7), b"position-%d" % i
        store.wait(store.metadata.apply_journaled([(key, value)]))
        acknowledged[key] = value
    fs.crash_at_point = "journal:before-sync"  # the next batch is written, never synced
    lost = store.metadata.apply_journaled([(b"cursor/00", b"unacknowledged")])
    store.pump()
    assert fs.crashed
    assert lost.exception() is not None
    store.abandon()
    fs.power_loss()

    reopened = Storage.open(tmp_path, PUMPED)
    found = dict(reopened.metadata.scan(b"cursor/"))
    unacknowledged_survived = found.get(b"cursor/00") == b"unacknowledged"
    if unacknowledged_survived:
        found[b"cursor/00"] = acknowledged[b"cursor/00"]
    assert found == acknowledged
    reopened.close()


def test_journaled_ops_are_folded_at_checkpoint(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    store.metadata.put(b"cursor/deleted", b"old")
    store.wait(store.metadata.apply_journaled([(b"cursor/a", b"1"), (b"cursor/deleted", None)]))
    assert lmdb_value(store, b"cursor/a") is None
    assert lmdb_value(store, b"cursor/deleted") == b"old"
    store.checkpoint()
    assert lmdb_value(store, b"cursor/a") == b"1"
    assert lmdb_value(store, b"cursor/deleted") is None
    assert store.cache.get_meta(b"cursor/a") == (False, None), "the overlay is emptied"
    assert store.metadata.get(b"cursor/a") == b"1"
    store.wait(store.metadata.apply_journaled([(b"cursor/a", b"2")]))  # after the checkpoint
    store.abandon()

    reopened = Storage.open(tmp_path, PUMPED)
    assert reopened.metadata.get(b"cursor/a") == b"2"
    assert reopened.metadata.get(b"cursor/deleted") is None
    assert lmdb_value(reopened, b"cursor/a") == b"2", "recovery folded the replayed batch"
    reopened.close()


def test_later_journaled_batch_wins(store: Storage) -> None:
    for i in range(5):
        store.metadata.apply_journaled([(b"k", b"%d" % i)])
        if i == 2:
            store.pump()
            store.checkpoint()
    while store.pump():
        pass
    assert store.metadata.get(b"k") == b"4"
    store.checkpoint()
    assert lmdb_value(store, b"k") == b"4"
    store.close()


async def test_journaled_ops_from_asyncio(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, small_config())
    assert list(await asyncio.gather(*(
        _apply(store, [(b"async/%03d" % i, b"%d" % i)]) for i in range(50)))) == [0] * 50
    assert len(store.metadata.scan(b"async/")) == 50
    store.close()
    with Storage.open(tmp_path, small_config()) as reopened:
        assert reopened.metadata.scan(b"async/") == [(b"async/%03d" % i, b"%d" % i)
                                                     for i in range(50)]


async def _apply(store: Storage, ops: list[tuple[bytes, bytes | None]]) -> int:
    return await store.metadata.apply_journaled(ops)


def test_journaled_ops_refused_after_close(tmp_path: Path) -> None:
    from magnetar.storage import StorageClosedError

    store = Storage.open(tmp_path, PUMPED)
    store.close()
    with pytest.raises(StorageClosedError):
        store.metadata.apply_journaled([(b"k", b"v")])
