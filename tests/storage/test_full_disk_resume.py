"""A full disk stops writes until there is room again, then they resume without a restart
(issue 10, item 6): `Storage.try_resume_writes` recovers in place.

The fault-injecting file system scripts ENOSPC on the journal's writes (the journal path) and
on the entry logs' writes (the checkpoint path); `heal()` gives the room back. Every
acknowledged entry must survive the failure, the resume and a reopen; failed adds must not
come back; and the resumed engine takes new writes in the same ledgers.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from magnetar.storage import Storage, StorageConfig, StorageFailedError, StorageFullError
from magnetar.storage.testing.simfs import SimFileSystem
from tests.storage.helpers import SmallDisk, small_config

PUMPED = small_config(background_threads=False)
THREADED = small_config()


def entry(number: int) -> bytes:
    return f"entry-{number}".encode().ljust(300, b"~")


class EntryLogDiskFull(SimFileSystem):
    """Once `full` is set, writes to entry logs fail with ENOSPC; the journal still works."""

    full = False

    def tick(self, kind: str, path: str) -> None:
        if self.full and kind == "write" and "entrylogs" in path:
            raise OSError(errno.ENOSPC, "injected ENOSPC", path)
        super().tick(kind, path)


def _fill(store: Storage, ledger: int, first: int, count: int) -> list[bytes]:
    datas = [entry(first + i) for i in range(count)]
    for i, data in enumerate(datas):
        assert store.wait(store.add_entry(ledger, data), 10) == first + i
    return datas


@pytest.mark.parametrize("config", [PUMPED, THREADED], ids=["pumped", "threads"])
def test_journal_enospc_then_room_again_resumes_writes(tmp_path: Path,
                                                       config: StorageConfig) -> None:
    fs = SimFileSystem(seed=7)
    store = Storage.open(tmp_path, config, fs=fs)
    try:
        ledger = store.wait(store.create_ledger({"name": "full"}), 10)
        acknowledged = _fill(store, ledger, 0, 10)
        fs.fail_writes(errno.ENOSPC)
        with pytest.raises(StorageFullError):
            store.wait(store.add_entry(ledger, b"refused"), 10)
        assert store.full
        with pytest.raises(StorageFullError):
            store.add_entry(ledger, b"refused again")
        assert not store.try_resume_writes()  # still no room: nothing changes
        assert store.full
        fs.heal()
        assert store.try_resume_writes()
        assert not store.full
        assert store.failed is None
        # The failed add's id is handed out again; everything acknowledged is readable.
        assert store.last_add_confirmed(ledger) == 9
        acknowledged += _fill(store, ledger, 10, 5)
        assert store.read_entries(ledger, 0, 14) == acknowledged
        other = store.wait(store.create_ledger(), 10)
        assert store.wait(store.add_entry(other, b"x"), 10) == 0
        store.checkpoint()
    finally:
        store.close()
    with Storage.open(tmp_path, PUMPED) as reopened:
        assert reopened.last_add_confirmed(ledger) == 14
        assert reopened.read_entries(ledger, 0, 14) == acknowledged
        report = reopened.check()
        assert report.ok, report.render()


def test_checkpoint_enospc_then_room_again_resumes_writes(tmp_path: Path) -> None:
    fs = EntryLogDiskFull(seed=3)
    store = Storage.open(tmp_path, PUMPED, fs=fs)
    try:
        ledger = store.wait(store.create_ledger())
        acknowledged = _fill(store, ledger, 0, 20)
        fs.full = True
        with pytest.raises(StorageFullError):
            store.checkpoint()
        assert store.full
        with pytest.raises(StorageFullError):
            store.add_entry(ledger, b"refused")
        assert not store.try_resume_writes()  # the recovery's checkpoint still fails
        assert store.full
        assert store.read_entries(ledger, 0, 19) == acknowledged  # reads go on meanwhile
        fs.full = False
        assert store.try_resume_writes()
        acknowledged += _fill(store, ledger, 20, 3)
        store.checkpoint()
        assert store.read_entries(ledger, 0, 22) == acknowledged
    finally:
        store.close()
    with Storage.open(tmp_path, PUMPED) as reopened:
        assert reopened.read_entries(ledger, 0, 22) == acknowledged
        report = reopened.check()
        assert report.ok, report.render()


def test_resume_is_a_no_op_unless_the_disk_was_full(tmp_path: Path) -> None:
    fs = SimFileSystem(seed=1)
    with Storage.open(tmp_path, PUMPED, fs=fs) as store:
        assert not store.full
        assert not store.try_resume_writes()
        ledger = store.wait(store.create_ledger())
        fs.fail_syncs(errno.EIO)
        with pytest.raises(StorageFailedError):
            store.wait(store.add_entry(ledger, b"lost"))
        assert not store.full  # an I/O error is not a full disk: no resume
        fs.heal()
        assert not store.try_resume_writes()
        assert store.failed is not None


SMALL_LOGS = small_config(background_threads=False, entry_log_bytes_max=128 * 1024)
BIG_ENTRY_BYTES = 4096
FILL_ADDS_MAX = 1000


def _fill_until_full(store: Storage, ledger: int) -> list[bytes]:
    """Add (checkpointing now and then) until the disk is full; the acknowledged entries."""
    acknowledged: list[bytes] = []
    for i in range(FILL_ADDS_MAX):
        data = entry(i).ljust(BIG_ENTRY_BYTES, b"k")
        try:
            store.wait(store.add_entry(ledger, data))
            acknowledged.append(data)
            if i % 10 == 9:
                store.checkpoint()
        except StorageFullError:
            return acknowledged
    raise AssertionError("the disk never filled")


def test_deleting_on_a_full_disk_frees_space_and_writes_resume(tmp_path: Path) -> None:
    disk = SmallDisk(9, tmp_path, capacity_bytes=2**40)
    store = Storage.open(tmp_path, SMALL_LOGS, fs=disk)
    try:
        doomed = store.wait(store.create_ledger())
        for i in range(100):  # ~400 KiB: whole entry logs of its own
            store.wait(store.add_entry(doomed, bytes([i]) * BIG_ENTRY_BYTES))
        store.checkpoint()
        kept = store.wait(store.create_ledger())
        acknowledged: list[bytes] = []
        disk.capacity_bytes = disk.used_bytes() + 256 * 1024
        acknowledged += _fill_until_full(store, kept)
        assert store.full
        assert not store.try_resume_writes()
        used = disk.used_bytes()
        store.delete_ledger(doomed).result(0)  # answered at once, while full
        assert disk.used_bytes() < used - 256 * 1024
        with pytest.raises(Exception, match="does not exist"):
            store.read_entry(doomed, 0)
        # A deletes-only metadata batch works while full too.
        store.metadata.apply_journaled([(b"k", None)]).result(0)
        assert store.try_resume_writes()
        count = len(acknowledged)
        assert store.read_entries(kept, 0, count - 1) == acknowledged
        assert store.wait(store.add_entry(kept, b"after")) == count
        store.checkpoint()
    finally:
        store.close()
    with Storage.open(tmp_path, SMALL_LOGS) as reopened:
        assert reopened.read_entries(kept, 0, count - 1) == acknowledged
        assert [info.ledger_id for info in reopened.list_ledgers()] == [kept]
        report = reopened.check()
        assert report.ok, report.render()
