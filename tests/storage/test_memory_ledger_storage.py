"""The scripting knobs of `InMemoryLedgerStorage` (what the shared conformance suite cannot
ask of the real engine): held completions, refused adds, failing writes, undo on resume,
scripted corruption, inline completions, and closing with writes held."""

from __future__ import annotations

import pytest

from magnetar.storage import (
    CorruptionError,
    LedgerNotFoundError,
    StorageError,
    StorageFailedError,
    StorageFullError,
)
from magnetar.storage.testing.memory import InMemoryLedgerStorage

WAIT_S = 10.0


def test_held_writes_finish_in_order_only_when_released() -> None:
    store = InMemoryLedgerStorage()
    try:
        ledger = store.create_ledger().result(WAIT_S)
        store.hold_completions()
        adds = [store.add_entry(ledger, b"%d" % i) for i in range(3)]
        assert not any(add.done() for add in adds)
        assert store.last_add_confirmed(ledger) == -1
        assert store.complete_pending(1) == 1
        assert [add.done() for add in adds] == [True, False, False]
        assert store.last_add_confirmed(ledger) == 0
        assert store.complete_pending() == 2
        assert [add.result(0) for add in adds] == [0, 1, 2]
        assert store.add_entry(ledger, b"3").result(WAIT_S) == 3  # no longer held
    finally:
        store.close()


def test_refused_adds_write_nothing() -> None:
    store = InMemoryLedgerStorage()
    try:
        ledger = store.create_ledger().result(WAIT_S)
        store.fail_next_adds(2, StorageError("cache full"))
        for _ in range(2):
            with pytest.raises(StorageError, match="cache full"):
                store.add_entry(ledger, b"x")
        assert store.add_entry(ledger, b"y").result(WAIT_S) == 0
        assert store.failed is None
    finally:
        store.close()


def test_a_failed_write_fails_everything_queued_and_stops_the_store() -> None:
    store = InMemoryLedgerStorage()
    try:
        ledger = store.create_ledger().result(WAIT_S)
        store.hold_completions()
        adds = [store.add_entry(ledger, b"%d" % i) for i in range(3)]
        error = StorageFailedError("EIO (scripted)", errno=5)
        store.fail_writes(error)
        store.complete_pending()
        assert all(add.exception() is error for add in adds)
        assert store.failed is error
        assert not store.full
        assert not store.try_resume_writes()  # only a full disk resumes
        with pytest.raises(StorageFailedError):
            store.create_ledger()
    finally:
        store.close()


def test_resuming_after_a_full_disk_undoes_what_never_became_durable() -> None:
    store = InMemoryLedgerStorage()
    try:
        kept = store.create_ledger().result(WAIT_S)
        store.add_entry(kept, b"acked").result(WAIT_S)
        store.metadata.put(b"k", b"old")
        store.hold_completions()
        lost_add = store.add_entry(kept, b"lost")
        lost_ledger = store.create_ledger()
        lost_close = store.close_ledger(kept)
        lost_meta = store.metadata.apply_journaled([(b"k", b"new")])
        assert store.metadata.get(b"k") == b"new"  # visible before durable
        store.set_disk_full(True)
        store.complete_pending()
        for completion in (lost_add, lost_ledger, lost_close, lost_meta):
            assert isinstance(completion.exception(), StorageFullError)
        store.set_disk_full(False)
        assert store.try_resume_writes()
        assert store.ledger_info(kept).state == "open"
        assert store.metadata.get(b"k") == b"old"
        assert [info.ledger_id for info in store.list_ledgers()] == [kept]
        assert store.add_entry(kept, b"again").result(WAIT_S) == 1  # the id is handed out again
        assert store.create_ledger().result(WAIT_S) == kept + 1
    finally:
        store.close()


def test_a_full_disk_switched_off_before_any_write_changes_nothing() -> None:
    store = InMemoryLedgerStorage()
    try:
        store.set_disk_full(True)
        store.set_disk_full(False)
        assert store.create_ledger().result(WAIT_S) == 1
        assert not store.full
    finally:
        store.close()


def test_scripted_corruption_fails_only_reads_that_cover_it() -> None:
    store = InMemoryLedgerStorage()
    try:
        ledger = store.create_ledger().result(WAIT_S)
        for i in range(3):
            store.add_entry(ledger, b"%d" % i).result(WAIT_S)
        store.corrupt_entry(ledger, 1)
        with pytest.raises(CorruptionError) as caught:
            store.read_entries(ledger, 0, 2)
        assert caught.value.offset == 1
        assert store.read_entry(ledger, 2) == b"2"
        with pytest.raises(LedgerNotFoundError):
            store.read_entry(ledger + 1, 0)
    finally:
        store.close()


def test_inline_completions_are_done_when_the_call_returns() -> None:
    store = InMemoryLedgerStorage(inline_completions=True)
    ledger = store.create_ledger()
    assert ledger.done()
    add = store.add_entry(ledger.result(), b"x")
    assert add.done()
    assert store.last_add_confirmed(ledger.result()) == 0
    store.close()


def test_closing_finishes_held_writes_and_is_idempotent() -> None:
    store = InMemoryLedgerStorage()
    ledger = store.create_ledger().result(WAIT_S)
    store.hold_completions()
    add = store.add_entry(ledger, b"x")
    store.close()
    store.close()
    assert add.result(0) == 0
    assert store.closed


def test_a_deleted_ledger_is_dropped_once_its_delete_is_durable() -> None:
    """As the engine purges a tombstone: the record goes once the delete is durable, not
    before (a resume after a full disk may still undo the delete)."""
    store = InMemoryLedgerStorage()
    try:
        ledger = store.create_ledger().result(WAIT_S)
        store.hold_completions()
        deleted = store.delete_ledger(ledger)
        assert ledger in store._ledgers  # the tombstone, while the delete is in flight
        store.complete_pending()
        assert deleted.result(WAIT_S) == ledger
        assert ledger not in store._ledgers
        assert store.create_ledger().result(WAIT_S) == ledger + 1
    finally:
        store.close()
