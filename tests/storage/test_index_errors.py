"""An index commit that fails (LMDB does its own I/O and raises its own errors: a full map,
a full disk) fails the engine as an entry-log I/O error does: one StorageFailedError naming
the cause, no background thread dying with a traceback, and everything acknowledged before
it is there after a reopen."""

from __future__ import annotations

import threading
from pathlib import Path

import lmdb
import pytest

from magnetar.storage import (
    Storage,
    StorageConfig,
    StorageError,
    StorageFailedError,
    StorageFullError,
)
from magnetar.storage._checkpoint import storage_error

WAIT_S = 10.0
SMALL_MAP_BYTES = 256 * 1024  # LMDB's map: a few thousand locations fill it
ENTRY = b"e" * 100
RUN = 1000  # entries per add_entries
ENTRIES = 20 * RUN
CHECKPOINT_LATER_MS = 600_000  # the test runs the checkpoint itself


def test_a_full_index_map_fails_the_checkpoint_with_one_clear_error(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, StorageConfig(lmdb_map_bytes=SMALL_MAP_BYTES,
                                                 checkpoint_interval_ms=CHECKPOINT_LATER_MS))
    died: list[threading.ExceptHookArgs] = []
    previous_hook, threading.excepthook = threading.excepthook, died.append
    try:
        ledger = store.create_ledger().result(WAIT_S)
        for _ in range(ENTRIES // RUN):  # acknowledged: in the journal, not in the index
            store.add_entries(ledger, [ENTRY] * RUN).result(WAIT_S)
        with pytest.raises(StorageFailedError, match=r"index map is full.*lmdbMapBytes"):
            store.checkpoint()
        assert isinstance(store.failed, StorageFailedError)
        with pytest.raises(StorageFailedError, match="index map is full"):
            store.add_entry(ledger, b"refused").result(WAIT_S)
        store.close()
    finally:
        threading.excepthook = previous_hook
    assert died == []
    reopened = Storage.open(tmp_path)  # the default map: the replayed entries fit
    try:
        assert reopened.last_add_confirmed(ledger) == ENTRIES - 1
        assert reopened.read_entries(ledger, 0, ENTRIES - 1) == [ENTRY] * ENTRIES
    finally:
        reopened.close()


def test_lmdb_errors_map_to_the_engine_errors() -> None:
    full = storage_error(lmdb.Error("mdb_txn_commit: No space left on device"))
    assert isinstance(full, StorageFullError)
    assert str(full) == "index commit failed: mdb_txn_commit: No space left on device"
    other = storage_error(lmdb.Error("mdb_txn_commit: Input/output error"))
    assert type(other) is StorageFailedError
    assert str(other) == "index commit failed: mdb_txn_commit: Input/output error"


def test_a_metadata_write_lmdb_refuses_is_a_storage_error_and_the_engine_goes_on(
        tmp_path: Path) -> None:
    store = Storage.open(tmp_path, StorageConfig(lmdb_map_bytes=SMALL_MAP_BYTES))
    try:
        with pytest.raises(StorageError, match=r"metadata write failed: .*MDB_MAP_FULL"):
            store.metadata.put(b"too/big", b"v" * SMALL_MAP_BYTES)
        assert store.metadata.get(b"too/big") is None
        assert store.failed is None
        store.metadata.put(b"small", b"v")
        assert store.metadata.get(b"small") == b"v"
    finally:
        store.close()
