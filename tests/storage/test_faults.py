"""Disk errors (ENOSPC on writes, EIO on syncs) on the journal and on the checkpoint path.

In every case: the adds waiting on the failed I/O fail with `StorageFullError` or
`StorageFailedError` naming the file, later writes are refused at once, what was
acknowledged before survives a reopen with the plain file system, and that reopen recovers
cleanly (design §12.6, crash point 21).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from magnetar.storage import (
    Completion,
    Storage,
    StorageConfig,
    StorageFailedError,
    StorageFullError,
)
from magnetar.storage.testing.simfs import SimFileSystem
from tests.storage.helpers import WAIT_SECONDS_MAX, small_config

PUMPED = small_config(background_threads=False)


def entry(number: int) -> bytes:
    return f"entry-{number}".encode().ljust(300, b"~")


def acknowledged_store(tmp_path: Path, fs: SimFileSystem, config: StorageConfig = PUMPED,
                       count: int = 10) -> tuple[Storage, int]:
    """A store on `fs` with one ledger holding `count` acknowledged entries."""
    store = Storage.open(tmp_path, config, fs=fs)
    ledger = store.wait(store.create_ledger({"name": "faulty"}))
    for i in range(count):
        assert store.wait(store.add_entry(ledger, entry(i))) == i
    return store, ledger


def assert_refuses_writes(store: Storage, ledger: int, error_type: type[Exception]) -> None:
    with pytest.raises(error_type):
        store.add_entry(ledger, b"refused")
    with pytest.raises(error_type):
        store.create_ledger()
    with pytest.raises(error_type):
        store.fence(ledger)
    with pytest.raises(error_type):
        store.metadata.apply_journaled([(b"k", b"v")])


def failure_of(completion: Completion[int]) -> BaseException:
    assert completion.done()
    error = completion.exception()
    assert error is not None
    return error


def reopen_and_verify(tmp_path: Path, ledger: int, acknowledged: int,
                      submitted: list[bytes]) -> int:
    """Reopen with the plain file system and return the recovered LAC. Every acknowledged
    entry must be there, any entry beyond them (written but never acknowledged) must be
    whole, the check must pass, and the store must take new writes."""
    store = Storage.open(tmp_path, PUMPED)
    try:
        lac = store.last_add_confirmed(ledger)
        assert lac >= acknowledged - 1
        assert store.read_entries(ledger, 0, lac) == submitted[:lac + 1]
        report = store.check()
        assert report.ok, report.render()
        assert store.wait(store.add_entry(ledger, b"after recovery")) == lac + 1
    finally:
        store.close()
    return lac


# -- the journal -------------------------------------------------------------------------

def test_disk_full_on_journal_write(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed)
    store, ledger = acknowledged_store(tmp_path, fs)
    fs.fail_writes(errno.ENOSPC)
    pending = [store.add_entry(ledger, entry(i)) for i in range(10, 15)]
    store.pump()
    for completion in pending:
        error = failure_of(completion)
        assert isinstance(error, StorageFullError)
        assert error.errno == errno.ENOSPC
        assert error.path is not None
        assert error.path.endswith(".jnl")
        assert error.path in str(error)
    assert_refuses_writes(store, ledger, StorageFullError)
    assert store.read_entries(ledger, 0, 9) == [entry(i) for i in range(10)], \
        "acknowledged entries stay readable"
    store.close()
    lac = reopen_and_verify(tmp_path, ledger, 10, [entry(i) for i in range(15)])
    assert lac == 9, "the failed writes never happened"


def test_io_error_on_journal_sync(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed)
    store, ledger = acknowledged_store(tmp_path, fs)
    fs.fail_syncs(errno.EIO)
    pending = [store.add_entry(ledger, entry(i)) for i in range(10, 15)]
    store.pump()
    for completion in pending:
        error = failure_of(completion)
        assert type(error) is StorageFailedError
        assert error.errno == errno.EIO
        assert error.path is not None
        assert error.path.endswith(".jnl")
        assert os.path.basename(error.path) in str(error)
    assert store.last_add_confirmed(ledger) == 9
    assert_refuses_writes(store, ledger, StorageFailedError)
    store.close()
    # The records reached the page cache before the failed sync: they may reappear, whole.
    reopen_and_verify(tmp_path, ledger, 10, [entry(i) for i in range(15)])


def test_io_error_on_journal_sync_then_power_loss(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed)
    store, ledger = acknowledged_store(tmp_path, fs)
    fs.fail_syncs(errno.EIO)
    pending = [store.add_entry(ledger, entry(i)) for i in range(10, 15)]
    store.pump()
    assert all(isinstance(failure_of(c), StorageFailedError) for c in pending)
    store.abandon()
    fs.power_loss()
    reopen_and_verify(tmp_path, ledger, 10, [entry(i) for i in range(15)])


def test_io_error_on_journal_sync_with_background_threads(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed)
    store, ledger = acknowledged_store(tmp_path, fs, small_config(checkpoint_interval_ms=60_000))
    fs.fail_syncs(errno.EIO)
    pending = [store.add_entry(ledger, entry(i)) for i in range(10, 60)]
    for completion in pending:
        with pytest.raises(StorageFailedError, match=r"\.jnl"):
            completion.result(20)
    assert_refuses_writes(store, ledger, StorageFailedError)
    store.close()
    reopen_and_verify(tmp_path, ledger, 10, [entry(i) for i in range(60)])


def test_disk_full_on_journal_write_after_some_batches(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed)
    store, ledger = acknowledged_store(tmp_path, fs, count=3)
    fs.fail_writes(errno.ENOSPC, after=2)  # two more batches fit, then the disk is full
    completions = []
    for i in range(3, 10):
        if store.failed is not None:
            with pytest.raises(StorageFullError):
                store.add_entry(ledger, entry(i))
            continue
        completions.append(store.add_entry(ledger, entry(i)))
        store.pump()
    assert [c.result(0) for c in completions[:2]] == [3, 4]
    assert len(completions) == 3
    assert isinstance(failure_of(completions[2]), StorageFullError)
    store.close()
    assert reopen_and_verify(tmp_path, ledger, 5, [entry(i) for i in range(10)]) == 4


# -- the checkpoint ----------------------------------------------------------------------

@pytest.mark.parametrize(("fail", "code", "error_type"), [
    ("writes", errno.ENOSPC, StorageFullError),
    ("syncs", errno.EIO, StorageFailedError),
])
def test_disk_error_on_checkpoint(tmp_path: Path, seed: int, fail: str, code: int,
                                  error_type: type[StorageFailedError]) -> None:
    fs = SimFileSystem(seed)
    store, ledger = acknowledged_store(tmp_path, fs)
    pending = [store.add_entry(ledger, entry(i)) for i in range(10, 13)]  # queued, unwritten
    if fail == "writes":
        fs.fail_writes(code)
    else:
        fs.fail_syncs(code)
    with pytest.raises(error_type) as caught:
        store.checkpoint()
    error = caught.value
    assert error.errno == code
    assert error.path is not None
    assert "entrylogs" in error.path
    assert error.path in str(error)
    for completion in pending:
        assert failure_of(completion) is error, "queued adds fail with the checkpoint's error"
    assert_refuses_writes(store, ledger, error_type)
    assert store.read_entries(ledger, 0, 9) == [entry(i) for i in range(10)]
    store.close()
    assert reopen_and_verify(tmp_path, ledger, 10, [entry(i) for i in range(13)]) == 9


def test_disk_error_on_checkpoint_into_an_existing_entry_log(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed)
    store, ledger = acknowledged_store(tmp_path, fs)
    store.checkpoint()  # entries 0..9 now in entry log 1
    for i in range(10, 20):
        store.wait(store.add_entry(ledger, entry(i)))
    fs.fail_syncs(errno.EIO)
    with pytest.raises(StorageFailedError, match=r"\.log"):
        store.checkpoint()
    store.abandon()
    fs.power_loss()  # the unsynced entry-log append may be torn
    assert reopen_and_verify(tmp_path, ledger, 20, [entry(i) for i in range(20)]) == 19


class EntryLogDiskFull(SimFileSystem):
    """Once armed, writes to entry logs fail with ENOSPC; the journal still works."""

    armed = False

    def tick(self, kind: str, path: str) -> None:
        if self.armed and kind == "write" and f"{os.sep}entrylogs{os.sep}" in path:
            raise OSError(errno.ENOSPC, "injected ENOSPC", path)
        super().tick(kind, path)


def test_background_checkpoint_failure_stops_the_engine(tmp_path: Path, seed: int) -> None:
    fs = EntryLogDiskFull(seed)
    store, ledger = acknowledged_store(tmp_path, fs, small_config(checkpoint_interval_ms=5),
                                       count=0)
    fs.armed = True
    acknowledged: list[int] = []
    for i in range(100_000):  # bounded: the checkpoint thread fails within milliseconds
        try:
            acknowledged.append(store.add_entry(ledger, entry(i)).result(20))
        except StorageFullError as exc:
            failure = exc
            break
    else:
        raise AssertionError("the engine never stopped")
    assert store.failed is failure
    assert failure.path is not None
    assert failure.path.endswith(".log")
    assert acknowledged == list(range(len(acknowledged)))
    assert_refuses_writes(store, ledger, StorageFullError)
    store.close()
    count = len(acknowledged)
    reopen_and_verify(tmp_path, ledger, count, [entry(i) for i in range(count + 1)])


class GatedJournalWrite(SimFileSystem):
    """Holds the next journal write until `release` is set (after setting `writing`), and
    can fail every entry-log write with ENOSPC: the seam to fail the engine while a batch
    is between the writer and the syncer."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.gate_armed = False
        self.writing = threading.Event()
        self.release = threading.Event()
        self.entry_logs_full = False

    def tick(self, kind: str, path: str) -> None:
        if kind == "write" and path.endswith(".jnl") and self.gate_armed:
            self.gate_armed = False
            self.writing.set()
            assert self.release.wait(WAIT_SECONDS_MAX)
        if self.entry_logs_full and kind == "write" and f"{os.sep}entrylogs{os.sep}" in path:
            raise OSError(errno.ENOSPC, "injected ENOSPC", path)
        super().tick(kind, path)


def test_batch_being_written_when_the_checkpoint_fails(tmp_path: Path, seed: int) -> None:
    """The engine fails (a checkpoint hits ENOSPC) while the journal writer holds a batch it
    took from the queue: that batch's adds must fail too, not wait forever."""
    fs = GatedJournalWrite(seed)
    store, ledger = acknowledged_store(tmp_path, fs, small_config(checkpoint_interval_ms=60_000),
                                       count=3)
    fs.gate_armed = True
    # (try_add_entry: an add_entry nobody waits on yet need not wake the writer)
    in_flight = store.try_add_entry(ledger, entry(3))
    assert in_flight is not None
    assert fs.writing.wait(WAIT_SECONDS_MAX)
    fs.entry_logs_full = True
    with pytest.raises(StorageFullError) as caught:
        store.checkpoint()
    fs.release.set()
    with pytest.raises(StorageFullError) as failed:
        in_flight.result(WAIT_SECONDS_MAX)
    assert failed.value is caught.value
    assert_refuses_writes(store, ledger, StorageFullError)
    store.close()
    assert reopen_and_verify(tmp_path, ledger, 3, [entry(i) for i in range(4)]) >= 2


def test_sync_failure_while_the_writer_waits_to_roll_over(tmp_path: Path, seed: int) -> None:
    """A batch fills the segment; the writer waits for the syncer before rolling over, and
    that sync fails: the adds fail and the writer thread stops cleanly (an exception
    escaping a thread fails the test through pytest's thread-exception hook)."""
    fs = SimFileSystem(seed)
    config = small_config(journal_alignment_bytes=512, journal_segment_bytes_max=4096,
                          journal_prealloc_bytes=4096, checkpoint_interval_ms=60_000)
    store, ledger = acknowledged_store(tmp_path, fs, config, count=2)
    fs.fail_syncs(errno.EIO)
    big = store.add_entry(ledger, b"B" * 5000)  # one batch past journal_segment_bytes_max
    with pytest.raises(StorageFailedError, match=r"\.jnl"):
        big.result(WAIT_SECONDS_MAX)
    assert store.journal is not None
    store.close()
    assert reopen_and_verify(tmp_path, ledger, 2, [entry(0), entry(1), b"B" * 5000]) >= 1
