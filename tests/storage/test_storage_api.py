"""The `Storage` API: ledgers, adds, reads and the LAC, fencing, closing, deleting, limits,
where reads are served from, entry-log rotation, concurrency, and reopening."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from pathlib import Path

import pytest

from magnetar.storage import (
    CorruptionError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerInfo,
    LedgerNotFoundError,
    NoSuchEntryError,
    Storage,
    StorageClosedError,
    StorageConfig,
)
from magnetar.storage._entry_log import ENTRY_LOG_HEADER_BYTES, read_header, split_location
from magnetar.storage._index import Index
from magnetar.storage._ledger import LedgerState
from tests.storage.helpers import KiB, entry_log_files, journal_files, small_config

PUMPED = small_config(background_threads=False)


def entry(ledger_id: int, number: int, size: int = 50) -> bytes:
    return f"L{ledger_id}E{number}:".encode().ljust(size, b".")


def add_all(store: Storage, ledger_id: int, datas: list[bytes]) -> list[int]:
    completions = [store.add_entry(ledger_id, data) for data in datas]
    return [store.wait(c, 30) for c in completions]


# -- the basics --------------------------------------------------------------------------

def test_create_add_read(tmp_path: Path) -> None:
    with Storage.open(tmp_path, small_config()) as store:
        ledger = store.create_ledger({"topic": "t"}).result(10)
        assert store.last_add_confirmed(ledger) == -1
        datas = [entry(ledger, i) for i in range(10)]
        assert add_all(store, ledger, datas) == list(range(10))
        assert store.last_add_confirmed(ledger) == 9
        assert store.read_entries(ledger, 0, 9) == datas
        assert store.read_entries(ledger, 3, 5) == datas[3:6]
        assert store.read_entry(ledger, 7) == datas[7]
        assert store.ledger_info(ledger) == LedgerInfo(ledger, "open", 9, {"topic": "t"})


def test_entry_ids_are_dense_from_zero_per_ledger(tmp_path: Path) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        first = store.wait(store.create_ledger())
        second = store.wait(store.create_ledger())
        assert second == first + 1
        completions = []
        for i in range(6):
            completions.append((first, store.add_entry(first, entry(first, i))))
            if i % 2 == 0:
                completions.append((second, store.add_entry(second, entry(second, i))))
        ids = [(ledger, store.wait(c)) for ledger, c in completions]
        assert [e for ledger, e in ids if ledger == first] == list(range(6))
        assert [e for ledger, e in ids if ledger == second] == list(range(3))


def test_empty_and_binary_entries(tmp_path: Path) -> None:
    datas = [b"", bytes(range(256)), b"\x00" * 1000, b""]
    with Storage.open(tmp_path, PUMPED) as store:
        ledger = store.wait(store.create_ledger())
        add_all(store, ledger, datas)
        assert store.read_entries(ledger, 0, 3) == datas
        store.checkpoint()
        assert store.read_entries(ledger, 0, 3) == datas
    with Storage.open(tmp_path, PUMPED) as store:
        assert store.read_entries(ledger, 0, 3) == datas


def test_entry_is_invisible_until_durable(tmp_path: Path) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        ledger = store.wait(store.create_ledger())
        pending = store.add_entry(ledger, b"not yet")
        assert not pending.done()
        assert store.last_add_confirmed(ledger) == -1
        with pytest.raises(NoSuchEntryError):
            store.read_entry(ledger, 0)
        assert store.wait(pending) == 0
        assert store.read_entry(ledger, 0) == b"not yet"


@pytest.mark.parametrize(("first", "last"), [(0, 3), (3, 3), (2, 1), (-1, 0), (5, 9)])
def test_read_beyond_the_lac(tmp_path: Path, first: int, last: int) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        ledger = store.wait(store.create_ledger())
        add_all(store, ledger, [b"a", b"b", b"c"])
        with pytest.raises(NoSuchEntryError, match=f"ledger {ledger} has entries 0..2"):
            store.read_entries(ledger, first, last)


def test_read_of_an_empty_ledger(tmp_path: Path) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        ledger = store.wait(store.create_ledger())
        with pytest.raises(NoSuchEntryError):
            store.read_entry(ledger, 0)


def test_unknown_ledger(tmp_path: Path) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        for call in (lambda: store.add_entry(42, b"x"), lambda: store.read_entry(42, 0),
                     lambda: store.last_add_confirmed(42), lambda: store.fence(42),
                     lambda: store.close_ledger(42), lambda: store.delete_ledger(42),
                     lambda: store.ledger_info(42)):
            with pytest.raises(LedgerNotFoundError, match="ledger 42"):
                call()


def test_closed_storage_refuses_calls(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    ledger = store.wait(store.create_ledger())
    store.close()
    store.close()  # idempotent
    with pytest.raises(StorageClosedError):
        store.add_entry(ledger, b"late")
    with pytest.raises(StorageClosedError):
        store.create_ledger()


# -- fence, close, delete ----------------------------------------------------------------

def test_fence(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    ledger = store.wait(store.create_ledger())
    add_all(store, ledger, [b"0"])
    in_flight = [store.add_entry(ledger, b"%d" % i) for i in (1, 2)]
    fenced = store.fence(ledger)
    with pytest.raises(LedgerFencedError, match=f"ledger {ledger} is fenced"):
        store.add_entry(ledger, b"after the fence")
    assert store.ledger_info(ledger).state == "fenced"
    assert [store.wait(c) for c in in_flight] == [1, 2], "adds accepted before still complete"
    assert store.wait(fenced) == 2
    assert store.last_add_confirmed(ledger) == 2
    assert store.wait(store.fence(ledger)) == 2, "fencing again is a no-op"
    assert store.read_entries(ledger, 0, 2) == [b"0", b"1", b"2"]
    store.close()

    reopened = Storage.open(tmp_path, PUMPED)
    assert reopened.ledger_info(ledger).state == "fenced"
    with pytest.raises(LedgerFencedError):
        reopened.add_entry(ledger, b"after reopen")
    assert reopened.read_entries(ledger, 0, 2) == [b"0", b"1", b"2"]
    reopened.close()


def test_fence_survives_a_crash_without_checkpoint(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    ledger = store.wait(store.create_ledger())
    add_all(store, ledger, [b"x"])
    store.wait(store.fence(ledger))
    store.abandon()
    reopened = Storage.open(tmp_path, PUMPED)
    assert reopened.ledger_info(ledger).state == "fenced"
    with pytest.raises(LedgerFencedError):
        reopened.add_entry(ledger, b"y")
    reopened.close()


def test_runs_of_adds_replay_after_a_crash_without_checkpoint(tmp_path: Path) -> None:
    """A run of adds is journaled as one ADD_ENTRY record per entry: recovery restores
    every entry of every acknowledged run, interleaved with single adds and other ledgers."""
    store = Storage.open(tmp_path, PUMPED)
    ledger = store.wait(store.create_ledger())
    other = store.wait(store.create_ledger())
    runs = [[entry(ledger, i) for i in range(3)], [entry(ledger, 4)],
            [entry(ledger, i) for i in range(5, 12)]]
    assert store.wait(store.add_entries(ledger, runs[0])) == 2
    assert store.wait(store.add_entries(other, [b"o0", b"o1"])) == 1
    assert store.wait(store.add_entry(ledger, entry(ledger, 3))) == 3
    pending = [store.add_entries(ledger, run) for run in runs[1:]]
    assert [store.wait(c) for c in pending] == [4, 11]
    store.abandon()
    reopened = Storage.open(tmp_path, PUMPED)
    try:
        assert reopened.read_entries(ledger, 0, 11) == [entry(ledger, i) for i in range(12)]
        assert reopened.read_entries(other, 0, 1) == [b"o0", b"o1"]
        assert reopened.wait(reopened.add_entries(ledger, [b"next"])) == 12
    finally:
        reopened.close()


def test_close_ledger(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    ledger = store.wait(store.create_ledger())
    add_all(store, ledger, [b"a", b"b"])
    pending = store.add_entry(ledger, b"c")
    closing = store.close_ledger(ledger)
    with pytest.raises(LedgerClosedError, match=f"ledger {ledger} is closed"):
        store.add_entry(ledger, b"d")
    assert store.wait(closing) == 2
    assert pending.result(0) == 2
    assert store.wait(store.close_ledger(ledger)) == 2, "closing again is a no-op"
    assert store.ledger_info(ledger) == LedgerInfo(ledger, "closed", 2, {})
    store.close()
    reopened = Storage.open(tmp_path, PUMPED)
    assert reopened.ledger_info(ledger) == LedgerInfo(ledger, "closed", 2, {})
    with pytest.raises(LedgerClosedError):
        reopened.add_entry(ledger, b"e")
    assert reopened.read_entries(ledger, 0, 2) == [b"a", b"b", b"c"]
    reopened.close()


@pytest.mark.parametrize("checkpointed", [True, False])
def test_delete_ledger(tmp_path: Path, checkpointed: bool) -> None:
    store = Storage.open(tmp_path, PUMPED)
    doomed = store.wait(store.create_ledger({"name": "doomed"}))
    kept = store.wait(store.create_ledger({"name": "kept"}))
    add_all(store, doomed, [entry(doomed, i) for i in range(5)])
    add_all(store, kept, [entry(kept, i) for i in range(5)])
    if checkpointed:
        store.checkpoint()
    assert store.wait(store.delete_ledger(doomed)) == doomed
    with pytest.raises(LedgerNotFoundError):
        store.read_entry(doomed, 0)
    with pytest.raises(LedgerNotFoundError):
        store.add_entry(doomed, b"x")
    assert [info.ledger_id for info in store.list_ledgers()] == [kept]
    store.checkpoint()
    assert store.index.locations(doomed, 0, 100) == [], "locations purged at checkpoint"
    store.abandon()  # a crash after the delete was acknowledged

    reopened = Storage.open(tmp_path, PUMPED)
    assert [info.ledger_id for info in reopened.list_ledgers()] == [kept]
    with pytest.raises(LedgerNotFoundError):
        reopened.read_entry(doomed, 0)
    assert reopened.read_entries(kept, 0, 4) == [entry(kept, i) for i in range(5)]
    new = reopened.wait(reopened.create_ledger())
    assert new > kept, "ledger ids are never reused"
    assert reopened.check().ok
    reopened.close()


def test_deleted_ledger_space_is_reclaimed_by_gc(tmp_path: Path) -> None:
    config = small_config(background_threads=False, entry_log_bytes_max=8 * KiB)
    with Storage.open(tmp_path, config) as store:
        doomed = store.wait(store.create_ledger())
        add_all(store, doomed, [entry(doomed, i, 1000) for i in range(30)])
        store.checkpoint()
        kept = store.wait(store.create_ledger())
        add_all(store, kept, [entry(kept, i, 1000) for i in range(3)])
        store.checkpoint()
        logs_before = len(entry_log_files(tmp_path))
        store.wait(store.delete_ledger(doomed))
        store.checkpoint()
        done = store.gc()
        assert done["logs_deleted"] >= 3
        assert len(entry_log_files(tmp_path)) == logs_before - done["logs_deleted"]
        assert store.read_entries(kept, 0, 2) == [entry(kept, i, 1000) for i in range(3)]
        assert store.check().ok


def test_list_ledgers_with_metadata(tmp_path: Path) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        a = store.wait(store.create_ledger({"topic": "persistent://public/default/a"}))
        b = store.wait(store.create_ledger({"topic": "b", "role": "cursor"}))
        c = store.wait(store.create_ledger())
        d = store.wait(store.create_ledger({"topic": "d"}))
        add_all(store, a, [b"1", b"2"])
        store.wait(store.fence(b))
        store.wait(store.close_ledger(c))
        store.wait(store.delete_ledger(d))
        expected = [LedgerInfo(a, "open", 1, {"topic": "persistent://public/default/a"}),
                    LedgerInfo(b, "fenced", -1, {"topic": "b", "role": "cursor"}),
                    LedgerInfo(c, "closed", -1, {})]
        assert store.list_ledgers() == expected
        assert expected[0].entries == 2
    with Storage.open(tmp_path, PUMPED) as store:
        assert store.list_ledgers() == expected


def test_list_ledgers_tagged(tmp_path: Path) -> None:
    """`list_ledgers(tagged=...)`: the ledgers holding one metadata pair, deleted ones left
    out, after a replay of the journal and after a checkpointed restart alike."""
    with Storage.open(tmp_path, PUMPED) as store:
        a1 = store.wait(store.create_ledger({"ml": "a"}))
        b1 = store.wait(store.create_ledger({"ml": "b", "x": "1"}))
        a2 = store.wait(store.create_ledger({"ml": "a"}))
        a3 = store.wait(store.create_ledger({"ml": "a"}))
        store.wait(store.delete_ledger(a2))
        assert [i.ledger_id for i in store.list_ledgers(tagged=("ml", "a"))] == [a1, a3]
        assert [i.ledger_id for i in store.list_ledgers(tagged=("x", "1"))] == [b1]
        assert store.list_ledgers(tagged=("ml", "c")) == []
        a4 = store.wait(store.create_ledger({"ml": "a"}))  # the index: one id, then a list
        store.wait(store.delete_ledger(a4))
        store.wait(store.delete_ledger(b1))
        assert [i.ledger_id for i in store.list_ledgers(tagged=("ml", "a"))] == [a1, a3]
        assert store.list_ledgers(tagged=("x", "1")) == []
        b1 = store.wait(store.create_ledger({"ml": "b", "x": "1"}))
        assert [i.ledger_id for i in store.list_ledgers(tagged=("x", "1"))] == [b1]
    for _ in range(2):  # reopened: replayed from the journal, then loaded from the index
        with Storage.open(tmp_path, PUMPED) as store:
            assert [i.ledger_id for i in store.list_ledgers(tagged=("ml", "a"))] == [a1, a3]
            assert [i.ledger_id for i in store.list_ledgers(tagged=("ml", "b"))] == [b1]
            store.wait(store.delete_ledger(b1))
            b1 = store.wait(store.create_ledger({"ml": "b"}))


def test_list_ledgers_tagged_reads_only_the_tagged(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding one tag's ledgers among many reads only those (an index, not a scan of
    every ledger's metadata: a managed ledger's open did that, one ledger per topic)."""
    with Storage.open(tmp_path, PUMPED) as store:
        for index in range(200):
            store.wait(store.create_ledger({"ml": f"topic-{index}"}))
        reads = 0
        info = LedgerState.info

        def counted(ledger: LedgerState) -> LedgerInfo:
            nonlocal reads
            reads += 1
            return info(ledger)

        monkeypatch.setattr(LedgerState, "info", counted)
        assert len(store.list_ledgers(tagged=("ml", "topic-150"))) == 1
        assert reads == 1


def test_metadata_is_a_copy(tmp_path: Path) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        given = {"k": "v"}
        ledger = store.wait(store.create_ledger(given))
        given["k"] = "changed"
        store.ledger_info(ledger).metadata["k"] = "changed too"
        assert store.ledger_info(ledger).metadata == {"k": "v"}


# -- limits ------------------------------------------------------------------------------

def test_entry_too_large(tmp_path: Path) -> None:
    config = small_config(background_threads=False, entry_size_bytes_max=1000)
    store = Storage.open(tmp_path, config)
    ledger = store.wait(store.create_ledger())
    with pytest.raises(EntryTooLargeError) as caught:
        store.add_entry(ledger, b"x" * 1001)
    message = str(caught.value)
    assert "1001 bytes" in message
    assert f"ledger {ledger}" in message
    assert "entry_size_bytes_max=1000" in message
    assert store.journal is not None
    assert store.journal.pending() == 0, "nothing queued"
    assert store.last_add_confirmed(ledger) == -1
    assert store.wait(store.add_entry(ledger, b"y" * 1000)) == 0, "the id was not consumed"
    store.close()
    reopened = Storage.open(tmp_path, config)
    assert reopened.last_add_confirmed(ledger) == 0
    assert reopened.read_entry(ledger, 0) == b"y" * 1000
    reopened.close()


# -- where reads come from ---------------------------------------------------------------

def test_reads_from_the_cache_then_from_entry_logs(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, PUMPED)
    ledger = store.wait(store.create_ledger())
    datas = [entry(ledger, i, 80) for i in range(10)]
    add_all(store, ledger, datas[:5])
    assert store.index.location(ledger, 0) is None, "not indexed before a checkpoint"
    assert store.read_entries(ledger, 0, 4) == datas[:5]
    store.checkpoint()
    assert store.cache.get(ledger, 0) is None, "flushed out of the cache"
    assert store.index.location(ledger, 4) is not None
    add_all(store, ledger, datas[5:])
    assert store.read_entries(ledger, 0, 9) == datas, "a range across logs and cache"

    # Prove the checkpointed entries come from the file: damage one and read it.
    location = store.index.location(ledger, 2)
    assert location is not None
    log_id, offset = split_location(location)
    path = store.logs.path(log_id)
    with open(path, "r+b") as f:
        f.seek(offset + 30)
        byte = f.read(1)
        f.seek(offset + 30)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptionError) as caught:
        store.read_entries(ledger, 0, 4)
    assert caught.value.path == path
    assert caught.value.offset == offset
    assert path in str(caught.value)
    assert store.read_entries(ledger, 5, 9) == datas[5:], "cached entries are unaffected"
    report = store.check()
    assert not report.ok
    assert any(path in problem for problem in report.problems)
    store.abandon()


def test_entry_log_rotation_at_entry_log_bytes_max(tmp_path: Path) -> None:
    limit = 16 * KiB
    config = small_config(background_threads=False, entry_log_bytes_max=limit)
    store = Storage.open(tmp_path, config)
    ledgers = [store.wait(store.create_ledger()) for _ in range(3)]
    datas = {ledger: [entry(ledger, i, 1000) for i in range(40)] for ledger in ledgers}
    for i in range(40):
        for ledger in ledgers:
            store.wait(store.add_entry(ledger, datas[ledger][i]))
        if i % 10 == 9:
            store.checkpoint()
    paths = entry_log_files(tmp_path)
    assert len(paths) >= 120 * 1024 // limit
    assert store.logs.writer is not None
    current = store.logs.writer.path
    for path in paths:
        handle = store.fs.open_read(path)
        try:
            _log_id, map_offset, map_count = read_header(handle, path)
        finally:
            handle.close()
        if path == current:
            assert map_offset == 0
            assert os.path.getsize(path) <= limit
        else:
            assert 0 < map_count <= 3, "sealed with its ledgers map"
            assert ENTRY_LOG_HEADER_BYTES < map_offset <= limit
    for ledger in ledgers:
        assert store.read_entries(ledger, 0, 39) == datas[ledger]
    assert store.check().ok
    store.close()
    reopened = Storage.open(tmp_path, config)
    for ledger in ledgers:
        assert reopened.read_entries(ledger, 0, 39) == datas[ledger]
    reopened.close()


def test_entry_larger_than_entry_log_bytes_max_gets_a_log_of_its_own(tmp_path: Path) -> None:
    config = small_config(background_threads=False, entry_log_bytes_max=4 * KiB)
    with Storage.open(tmp_path, config) as store:
        ledger = store.wait(store.create_ledger())
        datas = [b"s" * 100, b"B" * 10_000, b"t" * 100]
        add_all(store, ledger, datas)
        store.checkpoint()
        assert store.read_entries(ledger, 0, 2) == datas
        assert store.check().ok


# -- concurrency -------------------------------------------------------------------------

def test_many_threads_at_once(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, small_config(checkpoint_interval_ms=20))
    shared = store.create_ledger().result(10)
    own = [store.create_ledger().result(10) for _ in range(6)]
    by_id: dict[int, bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(number: int) -> None:
        try:
            mine = own[number]
            for i in range(150):
                data = f"t{number}-{i}".encode()
                entry_id = store.add_entry(shared, data).result(30)
                with lock:
                    by_id[entry_id] = data
                assert store.add_entry(mine, data).result(30) == i
                if i % 25 == 0:
                    assert store.read_entry(mine, i) == data
                    store.read_entries(shared, 0, store.last_add_confirmed(shared))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(by_id) == list(range(900))
    assert store.read_entries(shared, 0, 899) == [by_id[i] for i in range(900)]
    for number, ledger in enumerate(own):
        assert store.read_entries(ledger, 0, 149) == [f"t{number}-{i}".encode()
                                                      for i in range(150)]
    assert store.check().ok
    store.close()


def test_write_cache_pressure_triggers_checkpoints(tmp_path: Path) -> None:
    # Halves of 4 KiB and no timed checkpoint: only a full cache makes the checkpoint
    # thread flush, while adds keep coming from several threads.
    config = small_config(entry_size_bytes_max=4 * KiB, write_cache_bytes_max=8 * KiB,
                          checkpoint_interval_ms=600_000, journal_alignment_bytes=512,
                          journal_segment_bytes_max=16 * KiB, journal_prealloc_bytes=16 * KiB)
    store = Storage.open(tmp_path, config)
    ledgers = [store.create_ledger().result(10) for _ in range(3)]

    def writer(ledger: int) -> None:
        for i in range(100):
            assert store.add_entry(ledger, entry(ledger, i, 1000)).result(30) == i

    threads = [threading.Thread(target=writer, args=(ledger,)) for ledger in ledgers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(not thread.is_alive() for thread in threads)
    assert entry_log_files(tmp_path), "the full cache was flushed to entry logs"
    assert store.index.persisted_mark is not None
    assert store.index.persisted_mark.segment_id > 1, "the journal rolled over meanwhile"
    for ledger in ledgers:
        assert store.read_entries(ledger, 0, 99) == [entry(ledger, i, 1000) for i in range(100)]
    store.abandon()
    with Storage.open(tmp_path, config) as reopened:
        for ledger in ledgers:
            assert reopened.read_entries(ledger, 0, 99) == [entry(ledger, i, 1000)
                                                            for i in range(100)]
        assert reopened.check().ok


async def test_asyncio_awaits_completions(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, small_config())
    ledger = await store.create_ledger({"from": "asyncio"})
    ids = await asyncio.gather(*(_add(store, ledger, b"%d" % i) for i in range(200)))
    fenced = await store.fence(ledger)
    assert ids == list(range(200))
    assert fenced == 199
    assert store.read_entries(ledger, 0, 199) == [b"%d" % i for i in range(200)]
    store.close()


async def _add(store: Storage, ledger: int, data: bytes) -> int:
    return await store.add_entry(ledger, data)


# -- reopening ---------------------------------------------------------------------------

def test_reopen_persists_everything(tmp_path: Path) -> None:
    config = small_config()
    store = Storage.open(tmp_path, config)
    open_l = store.create_ledger({"kind": "open"}).result(10)
    fenced_l = store.create_ledger({"kind": "fenced"}).result(10)
    closed_l = store.create_ledger({"kind": "closed"}).result(10)
    deleted_l = store.create_ledger({"kind": "deleted"}).result(10)
    for ledger in (open_l, fenced_l, closed_l, deleted_l):
        for i in range(20):
            store.add_entry(ledger, entry(ledger, i)).result(10)
    store.fence(fenced_l).result(10)
    store.close_ledger(closed_l).result(10)
    store.delete_ledger(deleted_l).result(10)
    store.metadata.put(b"topic/a", b"1")
    store.metadata.apply_journaled([(b"cursor/a", b"5")]).result(10)
    listed = store.list_ledgers()
    store.close()

    for _ in range(2):  # a second reopen changes nothing either
        reopened = Storage.open(tmp_path, config)
        assert reopened.list_ledgers() == listed
        for ledger in (open_l, fenced_l, closed_l):
            assert reopened.read_entries(ledger, 0, 19) == [entry(ledger, i) for i in range(20)]
        assert reopened.metadata.get(b"topic/a") == b"1"
        assert reopened.metadata.get(b"cursor/a") == b"5"
        assert reopened.check().ok
        reopened.close()
    with Storage.open(tmp_path, config) as reopened:
        assert reopened.add_entry(open_l, b"more").result(10) == 20
        assert reopened.create_ledger().result(10) > deleted_l


def test_checkpointed_entries_survive_losing_the_journal(tmp_path: Path) -> None:
    """Checkpoint with several entry logs, stop, delete the journal segments and the mark:
    every checkpointed entry is read from the entry logs alone (BookKeeper
    LedgerStorageCheckpointTest testCheckPointForEntryLoggerWithMultipleActiveEntryLogs)."""
    config = small_config(entry_log_bytes_max=8 * KiB)
    store = Storage.open(tmp_path, config)
    ledgers = [store.create_ledger({"n": str(n)}).result(10) for n in range(4)]
    datas = {ledger: [entry(ledger, i, 700) for i in range(30)] for ledger in ledgers}
    for i in range(30):
        for ledger in ledgers:
            store.add_entry(ledger, datas[ledger][i]).result(10)
    store.checkpoint()
    store.close()
    assert len(entry_log_files(tmp_path)) >= 8
    for path in journal_files(tmp_path):
        os.remove(path)
    index = Index(str(tmp_path / "index"), config.lmdb_map_bytes)
    index.write_mark_raw(None)
    index.close()

    reopened = Storage.open(tmp_path, config)
    assert [info.ledger_id for info in reopened.list_ledgers()] == ledgers
    for ledger in ledgers:
        assert reopened.last_add_confirmed(ledger) == 29
        assert reopened.read_entries(ledger, 0, 29) == datas[ledger]
    assert reopened.check().ok
    assert reopened.add_entry(ledgers[0], b"after").result(10) == 30
    reopened.close()


def test_missing_marked_segment_refuses_to_start(tmp_path: Path) -> None:
    config = small_config(background_threads=False)
    store = Storage.open(tmp_path, config)
    ledger = store.wait(store.create_ledger())
    add_all(store, ledger, [b"a"])
    store.close()
    segments = journal_files(tmp_path)
    for path in segments:
        os.remove(path)
    with pytest.raises(CorruptionError, match="LastLogMark is missing") as caught:
        Storage.open(tmp_path, config)
    assert caught.value.path == segments[-1]
    assert journal_files(tmp_path) == [], "the directory is left as found"
    skipping = Storage.open(tmp_path, small_config(background_threads=False,
                                                   skip_corrupt_journal_segments=True))
    assert skipping.read_entry(ledger, 0) == b"a", "the entry was checkpointed"
    skipping.close()


def test_config_rejects_inconsistent_limits() -> None:
    with pytest.raises(AssertionError):
        StorageConfig(journal_alignment_bytes=1000)
    with pytest.raises(AssertionError):
        StorageConfig(entry_size_bytes_max=10 * 1024 * 1024)  # above the record maximum
    with pytest.raises(AssertionError):
        StorageConfig(entry_log_bytes_max=2**32)


def test_inspect_describes_the_directory(tmp_path: Path) -> None:
    with Storage.open(tmp_path, PUMPED) as store:
        ledger = store.wait(store.create_ledger({"t": "x"}))
        add_all(store, ledger, [b"abc"] * 3)
        store.checkpoint()
        report = store.inspect()
        assert report.ledgers == [(ledger, "open", 2, {"t": "x"})]
        assert report.mark == store.index.persisted_mark
        assert len(report.segments) >= 1
        assert len(report.entry_logs) == 1
        assert report.entry_logs[0][2] == 3 * (24 + 3)
        assert f"{ledger}  open  lac=2" in report.render()


def test_entry_bytes_are_stored_verbatim_in_the_journal(tmp_path: Path) -> None:
    # ADD_ENTRY payload: ledger u64 ‖ entry u64 ‖ the entry's bytes, unchanged.
    with Storage.open(tmp_path, PUMPED) as store:
        ledger = store.wait(store.create_ledger())
        add_all(store, ledger, [b"verbatim-bytes"])
    raw = b"".join(Path(p).read_bytes() for p in journal_files(tmp_path))
    assert struct.pack(">QQ", ledger, 0) + b"verbatim-bytes" in raw
