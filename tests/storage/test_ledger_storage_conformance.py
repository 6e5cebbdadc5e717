"""One suite, two implementations of `LedgerStorage`: the real engine (`Storage` on a
temporary directory, through the fault-injecting file system so that a full disk can be
scripted) and `InMemoryLedgerStorage`. Every test makes the same assertions against both,
so the in-memory store that broker tests may use behaves like the engine where it matters:
ids, the LAC, fencing and closing, deletes, refusals and their error classes, metadata,
completions (blocking and awaited), and a full disk that clears."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from magnetar.storage import (
    Completion,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotFoundError,
    LedgerStorage,
    NoSuchEntryError,
    Storage,
    StorageClosedError,
    StorageError,
    StorageFullError,
)
from magnetar.storage._metadata import META_KEY_BYTES_MAX
from magnetar.storage.testing.memory import InMemoryLedgerStorage
from magnetar.storage.testing.simfs import SimFileSystem
from tests.storage.helpers import small_config

WAIT_S = 10.0
CONFIG = small_config()


@dataclass
class Impl:
    """An implementation under test, with the one knob the suite needs to script."""

    store: LedgerStorage
    set_disk_full: Callable[[bool], None]
    close: Callable[[], None]


def _real(tmp_path: Path) -> Impl:
    fs = SimFileSystem(seed=11)
    store = Storage.open(tmp_path, CONFIG, fs=fs)

    def set_disk_full(full: bool) -> None:
        if full:
            fs.fail_writes(errno.ENOSPC)
        else:
            fs.heal()

    return Impl(store, set_disk_full, store.close)


def _memory(tmp_path: Path) -> Impl:
    store = InMemoryLedgerStorage(CONFIG)
    return Impl(store, store.set_disk_full, store.close)


@pytest.fixture(params=[_real, _memory], ids=["real", "memory"])
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    made: Impl = request.param(tmp_path)
    yield made
    made.close()


def done(completion: Completion[int]) -> int:
    return completion.result(WAIT_S)


def new_ledger(store: LedgerStorage, **metadata: str) -> int:
    return done(store.create_ledger(metadata))


def fill(store: LedgerStorage, ledger: int, first: int, count: int) -> list[bytes]:
    datas = [b"entry-%d" % (first + i) for i in range(count)]
    for i, data in enumerate(datas):
        assert done(store.add_entry(ledger, data)) == first + i
    return datas


# -- ledgers and entries ---------------------------------------------------------------------


def test_ledgers_get_increasing_ids_and_start_open_and_empty(impl: Impl) -> None:
    store = impl.store
    first = new_ledger(store, ml="a")
    second = new_ledger(store)
    assert 0 < first < second
    info = store.ledger_info(first)
    assert (info.ledger_id, info.state, info.last_add_confirmed, info.entries) == \
        (first, "open", -1, 0)
    assert info.metadata == {"ml": "a"}
    assert store.ledger_info(second).metadata == {}
    assert [i.ledger_id for i in store.list_ledgers()] == [first, second]
    assert store.last_add_confirmed(first) == -1


def test_entry_ids_are_dense_from_zero_and_the_lac_follows(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    other = new_ledger(store)
    datas = fill(store, ledger, 0, 5)
    assert done(store.add_entry(other, b"x")) == 0  # ids are per ledger
    assert store.last_add_confirmed(ledger) == 4
    assert store.ledger_info(ledger).entries == 5
    assert store.read_entries(ledger, 0, 4) == datas
    assert store.read_entries(ledger, 1, 2) == datas[1:3]
    assert store.read_entry(ledger, 3) == datas[3]
    assert store.read_entry(other, 0) == b"x"


@pytest.mark.parametrize(("first", "last"), [(0, 3), (3, 3), (-1, 0), (2, 1)])
def test_reads_outside_zero_to_lac_raise_no_such_entry(impl: Impl, first: int,
                                                        last: int) -> None:
    store = impl.store
    ledger = new_ledger(store)
    fill(store, ledger, 0, 3)
    with pytest.raises(NoSuchEntryError):
        store.read_entries(ledger, first, last)


def test_an_empty_ledger_has_nothing_to_read(impl: Impl) -> None:
    ledger = new_ledger(impl.store)
    with pytest.raises(NoSuchEntryError):
        impl.store.read_entry(ledger, 0)


def test_unknown_ledgers_raise_not_found_everywhere(impl: Impl) -> None:
    store = impl.store
    calls: list[Callable[[], object]] = [
        lambda: store.add_entry(999, b"x"), lambda: store.read_entry(999, 0),
        lambda: store.read_entries(999, 0, 0), lambda: store.last_add_confirmed(999),
        lambda: store.ledger_info(999), lambda: store.fence(999),
        lambda: store.close_ledger(999), lambda: store.delete_ledger(999)]
    for call in calls:
        with pytest.raises(LedgerNotFoundError):
            call()


def test_closing_many_ledgers_at_once_closes_each_and_fails_only_the_missing(
        impl: Impl) -> None:
    store = impl.store
    full, empty, fenced, closed = (new_ledger(store) for _ in range(4))
    fill(store, full, 0, 3)
    fill(store, fenced, 0, 1)
    done(store.fence(fenced))
    done(store.close_ledger(closed))
    completions = store.close_ledgers([full, 999, empty, fenced, closed])
    assert [done(c) for i, c in enumerate(completions) if i != 1] == [2, -1, 0, -1]
    with pytest.raises(LedgerNotFoundError):
        done(completions[1])
    assert {store.ledger_info(i).state for i in (full, empty, fenced, closed)} == {"closed"}
    with pytest.raises(LedgerClosedError):
        store.add_entry(full, b"late")
    assert store.close_ledgers([]) == []


def test_deleting_many_ledgers_at_once_deletes_each_and_fails_only_the_missing(
        impl: Impl) -> None:
    store = impl.store
    kept, first, second = (new_ledger(store) for _ in range(3))
    fill(store, first, 0, 2)
    completions = store.delete_ledgers([first, 999, second])
    assert (done(completions[0]), done(completions[2])) == (first, second)
    with pytest.raises(LedgerNotFoundError):
        done(completions[1])
    assert [info.ledger_id for info in store.list_ledgers()] == [kept]
    with pytest.raises(LedgerNotFoundError):
        store.read_entry(first, 0)


def test_an_entry_above_the_size_limit_is_refused_and_nothing_is_written(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    with pytest.raises(EntryTooLargeError):
        store.add_entry(ledger, b"x" * (CONFIG.entry_size_bytes_max + 1))
    assert done(store.add_entry(ledger, b"x" * CONFIG.entry_size_bytes_max)) == 0


def test_fencing_refuses_later_adds_and_keeps_what_was_accepted(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    datas = fill(store, ledger, 0, 3)
    assert done(store.fence(ledger)) == 2
    with pytest.raises(LedgerFencedError):
        store.add_entry(ledger, b"late")
    assert store.ledger_info(ledger).state == "fenced"
    assert done(store.fence(ledger)) == 2  # again: a no-op
    assert store.read_entries(ledger, 0, 2) == datas
    assert done(store.close_ledger(ledger)) == 2  # a fenced ledger can still be closed


def test_closing_gives_the_last_entry_and_refuses_later_adds(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    empty = new_ledger(store)
    fill(store, ledger, 0, 4)
    assert done(store.close_ledger(ledger)) == 3
    assert done(store.close_ledger(ledger)) == 3  # idempotent
    assert done(store.close_ledger(empty)) == -1
    with pytest.raises(LedgerClosedError):
        store.add_entry(ledger, b"late")
    assert store.ledger_info(ledger).state == "closed"
    assert store.ledger_info(ledger).last_add_confirmed == 3
    assert done(store.fence(ledger)) == 3  # fencing a closed ledger: a no-op


def test_a_deleted_ledger_is_gone(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    kept = new_ledger(store)
    fill(store, ledger, 0, 2)
    done(store.delete_ledger(ledger))
    assert [info.ledger_id for info in store.list_ledgers()] == [kept]
    for call in (lambda: store.read_entry(ledger, 0), lambda: store.ledger_info(ledger),
                 lambda: store.delete_ledger(ledger), lambda: store.add_entry(ledger, b"x")):
        with pytest.raises(LedgerNotFoundError):
            call()


def test_ids_of_deleted_ledgers_are_never_handed_out_again(impl: Impl) -> None:
    """Both stores drop a deleted ledger's record once the delete is durable (the engine
    once a checkpoint is past it); the id counter never goes back for it."""
    store = impl.store
    used = [new_ledger(store) for _ in range(3)]
    fill(store, used[0], 0, 2)
    done(store.delete_ledger(used[0]))
    for completion in store.delete_ledgers(used[1:]):
        done(completion)
    if isinstance(store, Storage):
        store.checkpoint()
    assert store.list_ledgers() == []
    again = new_ledger(store)
    assert again > max(used)
    with pytest.raises(LedgerNotFoundError):
        store.ledger_info(used[0])


def test_adds_from_threads_get_dense_ids_and_complete_in_order(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    results: list[int] = []
    lock = threading.Lock()

    def writer(number: int) -> None:
        completions = [store.add_entry(ledger, b"w%d-%d" % (number, i)) for i in range(25)]
        ids = [done(c) for c in completions]
        assert ids == sorted(ids)
        with lock:
            results.extend(ids)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert sorted(results) == list(range(100))
    assert store.last_add_confirmed(ledger) == 99


async def test_completions_can_be_awaited_from_asyncio(impl: Impl) -> None:
    store = impl.store
    ledger = await store.create_ledger()
    assert await store.add_entry(ledger, b"async") == 0
    assert store.read_entry(ledger, 0) == b"async"


def test_writes_complete_in_the_order_they_were_made(impl: Impl) -> None:
    store = impl.store
    first = new_ledger(store)
    second = new_ledger(store)
    order: list[str] = []
    lock = threading.Lock()

    def note(label: str) -> Callable[[Completion[int]], None]:
        def callback(_: Completion[int]) -> None:
            with lock:
                order.append(label)
        return callback

    made: list[tuple[str, Completion[int]]] = [
        ("a0", store.add_entry(first, b"a0")), ("b0", store.add_entry(second, b"b0")),
        ("meta", store.metadata.apply_journaled([(b"k", b"v")])),
        ("a1", store.add_entry(first, b"a1")), ("close-a", store.close_ledger(first)),
        ("new", store.create_ledger()), ("b1", store.add_entry(second, b"b1"))]
    for label, completion in made:
        completion.add_done_callback(note(label))
    for _, completion in made:
        done(completion)
    assert order == [label for label, _ in made]


def test_a_started_ledger_takes_adds_and_records_before_its_creation_is_durable(
        impl: Impl) -> None:
    store = impl.store
    before = new_ledger(store)
    ledger, created = store.start_ledger({"ml": "started"})
    assert ledger > before
    added = store.add_entry(ledger, b"first")
    recorded = store.metadata.apply_journaled([(b"names", str(ledger).encode())])
    assert (done(created), done(added)) == (ledger, 0)
    done(recorded)
    assert store.ledger_info(ledger).metadata == {"ml": "started"}
    assert store.read_entry(ledger, 0) == b"first"
    assert store.metadata.get(b"names") == str(ledger).encode()
    assert new_ledger(store) > ledger


def _refusal(write: Callable[[], Completion[int]]) -> type[BaseException] | None:
    """The error a write met, whether refused when made or failed when finished."""
    try:
        done(write())
    except StorageError as error:
        return type(error)
    return None


def test_writes_after_a_started_ledger_that_fails_fail_with_it(impl: Impl) -> None:
    store = impl.store
    impl.set_disk_full(True)
    ledger, created = store.start_ledger()
    assert _refusal(lambda: store.add_entry(ledger, b"x")) is StorageFullError
    assert _refusal(lambda: created) is StorageFullError
    impl.set_disk_full(False)
    assert store.try_resume_writes()
    again, created_again = store.start_ledger()
    assert done(created_again) == again
    assert done(store.add_entry(again, b"y")) == 0


def test_callbacks_see_the_lac_already_advanced(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    seen: list[tuple[int, int]] = []
    completion = store.add_entry(ledger, b"x")
    completion.add_done_callback(
        lambda c: seen.append((c.result(), store.last_add_confirmed(ledger))))
    done(completion)
    assert seen == [(0, 0)]


# -- metadata ----------------------------------------------------------------------------


def test_metadata_put_get_delete_and_scan_in_key_order(impl: Impl) -> None:
    meta = impl.store.metadata
    assert meta.get(b"k") is None
    meta.put(b"p/b", b"2")
    meta.put(b"p/a", b"1")
    meta.put(b"q/a", b"3")
    assert meta.get(b"p/a") == b"1"
    assert meta.scan(b"p/") == [(b"p/a", b"1"), (b"p/b", b"2")]
    meta.delete(b"p/a")
    assert meta.get(b"p/a") is None
    assert meta.scan(b"p/") == [(b"p/b", b"2")]
    meta.delete(b"never-there")  # deleting a missing key is fine


def test_a_metadata_transaction_applies_all_or_nothing(impl: Impl) -> None:
    meta = impl.store.metadata
    meta.put(b"old", b"0")
    with meta.transaction() as txn:
        txn.put(b"a", b"1")
        assert txn.get(b"a") == b"1"  # sees its own writes
        txn.delete(b"old")
        assert txn.get(b"old") is None
    assert (meta.get(b"a"), meta.get(b"old")) == (b"1", None)

    def aborted() -> None:
        with meta.transaction() as txn:
            txn.put(b"b", b"2")
            txn.delete(b"a")
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError):
        aborted()
    assert (meta.get(b"a"), meta.get(b"b")) == (b"1", None)


def test_journaled_metadata_is_visible_at_once_and_durable_on_completion(impl: Impl) -> None:
    meta = impl.store.metadata
    completion = meta.apply_journaled([(b"c/1", b"x"), (b"c/2", b"y")])
    assert meta.get(b"c/1") == b"x"
    done(completion)
    done(meta.apply_journaled([(b"c/1", None)]))
    assert meta.scan(b"c/") == [(b"c/2", b"y")]


@pytest.mark.parametrize("key", [b"", b"k" * (META_KEY_BYTES_MAX + 1)])
def test_bad_metadata_keys_raise_value_error_and_apply_nothing(impl: Impl, key: bytes) -> None:
    meta = impl.store.metadata
    with pytest.raises(ValueError, match="metadata keys"):
        meta.put(key, b"v")
    with pytest.raises(ValueError, match="metadata keys"):
        meta.apply_journaled([(b"fine", b"v"), (key, b"v")])
    assert meta.get(b"fine") is None


# -- failure and closing -----------------------------------------------------------------


def test_a_healthy_store_is_not_failed_and_has_nothing_to_resume(impl: Impl) -> None:
    store = impl.store
    assert store.failed is None
    assert not store.full
    assert not store.closed
    assert not store.try_resume_writes()


def test_a_full_disk_stops_writes_until_there_is_room_again(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    acknowledged = fill(store, ledger, 0, 10)
    done(store.metadata.apply_journaled([(b"m/keep", b"1"), (b"m/drop", b"2")]))
    impl.set_disk_full(True)
    with pytest.raises(StorageFullError):
        done(store.add_entry(ledger, b"refused"))
    assert store.full
    assert isinstance(store.failed, StorageFullError)
    writes: list[Callable[[], object]] = [
        lambda: store.add_entry(ledger, b"again"), lambda: store.create_ledger(),
        lambda: store.close_ledger(ledger),
        lambda: store.metadata.apply_journaled([(b"m/new", b"3")])]
    for refused in writes:
        with pytest.raises(StorageFullError):
            refused()
    # Deleting still works while full: it frees space.
    done(store.metadata.apply_journaled([(b"m/drop", None)]))
    assert store.metadata.get(b"m/drop") is None
    assert store.read_entries(ledger, 0, 9) == acknowledged  # reads go on
    assert not store.try_resume_writes()  # still no room: nothing changes
    assert store.full
    impl.set_disk_full(False)
    assert store.try_resume_writes()
    assert not store.full
    assert store.failed is None
    # The failed add's id is handed out again; everything acknowledged is readable.
    assert store.last_add_confirmed(ledger) == 9
    acknowledged += fill(store, ledger, 10, 3)
    assert store.read_entries(ledger, 0, 12) == acknowledged
    assert store.metadata.get(b"m/keep") == b"1"
    assert store.metadata.get(b"m/drop") is None


def test_a_ledger_can_be_deleted_while_the_disk_is_full(impl: Impl) -> None:
    store = impl.store
    doomed = new_ledger(store)
    kept = new_ledger(store)
    fill(store, doomed, 0, 3)
    impl.set_disk_full(True)
    with pytest.raises(StorageFullError):
        done(store.add_entry(kept, b"refused"))
    done(store.delete_ledger(doomed))
    assert [info.ledger_id for info in store.list_ledgers()] == [kept]
    impl.set_disk_full(False)
    assert store.try_resume_writes()
    with pytest.raises(LedgerNotFoundError):
        store.ledger_info(doomed)


def test_try_add_entry_adds_like_add_entry_while_the_cache_has_room(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    assert store.cache_space().result(WAIT_S) is None  # room now: already finished
    completions = [store.try_add_entry(ledger, b"t%d" % i) for i in range(3)]
    assert all(c is not None for c in completions)
    assert [done(c) for c in completions if c is not None] == [0, 1, 2]
    assert store.read_entries(ledger, 0, 2) == [b"t0", b"t1", b"t2"]
    with pytest.raises(EntryTooLargeError):
        store.try_add_entry(ledger, b"x" * (store.config.entry_size_bytes_max + 1))
    with pytest.raises(LedgerNotFoundError):
        store.try_add_entry(ledger + 100, b"x")


def test_an_entry_given_as_a_buffer_is_stored_as_it_was_when_added(impl: Impl) -> None:
    """add_entry and try_add_entry keep a copy of a bytearray or memoryview entry: the
    caller may reuse its buffer at once (the single-add path keeps only exact bytes)."""
    store = impl.store
    ledger = new_ledger(store)
    buffer = bytearray(b"first")
    added = store.add_entry(ledger, buffer)
    buffer[:] = b"later"
    view_source = bytearray(b"second")
    tried = store.try_add_entry(ledger, memoryview(view_source))
    assert tried is not None
    view_source[:] = b"changed"
    assert [done(added), done(tried)] == [0, 1]
    assert store.read_entries(ledger, 0, 1) == [b"first", b"second"]
    assert all(type(data) is bytes for data in store.read_entries(ledger, 0, 1))


def test_a_run_of_adds_gets_consecutive_ids_and_one_completion_for_the_last(
        impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    assert done(store.add_entry(ledger, b"a")) == 0
    assert done(store.add_entries(ledger, [b"b", b"c", b"d"])) == 3
    run = store.try_add_entries(ledger, [b"e", b"f"])
    assert run is not None
    assert done(run) == 5
    assert store.last_add_confirmed(ledger) == 5
    assert store.read_entries(ledger, 0, 5) == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_a_refused_run_of_adds_writes_none_of_them(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    fill(store, ledger, 0, 2)
    too_large = b"x" * (store.config.entry_size_bytes_max + 1)
    with pytest.raises(EntryTooLargeError):
        store.add_entries(ledger, [b"fits", too_large])
    with pytest.raises(EntryTooLargeError):
        store.try_add_entries(ledger, [b"fits", too_large])
    assert store.ledger_info(ledger).entries == 2
    done(store.close_ledger(ledger))
    with pytest.raises(LedgerClosedError):
        store.add_entries(ledger, [b"late", b"later"])
    assert store.last_add_confirmed(ledger) == 1


def test_runs_of_several_ledgers_are_one_write_with_one_completion(impl: Impl) -> None:
    """Each run gets consecutive ids in its ledger (a ledger may come twice); the one
    completion finishes with every run durable and gives the last run's last id."""
    store = impl.store
    first, second = new_ledger(store), new_ledger(store)
    fill(store, first, 0, 2)
    added = store.try_add_runs([(first, [b"a", b"b"]), (second, [b"c"]), (first, [b"d"])])
    assert added is not None
    lasts, completion = added
    assert lasts == [3, 0, 4]
    assert done(completion) == 4
    assert store.last_add_confirmed(first) == 4
    assert store.last_add_confirmed(second) == 0
    assert store.read_entries(first, 2, 4) == [b"a", b"b", b"d"]
    assert store.read_entries(second, 0, 0) == [b"c"]


def test_a_refused_run_of_several_ledgers_writes_none_of_them(impl: Impl) -> None:
    store = impl.store
    first, second = new_ledger(store), new_ledger(store)
    fill(store, first, 0, 1)
    done(store.close_ledger(second))
    with pytest.raises(LedgerClosedError):
        store.try_add_runs([(first, [b"a"]), (second, [b"b"])])
    too_large = b"x" * (store.config.entry_size_bytes_max + 1)
    with pytest.raises(EntryTooLargeError):
        store.try_add_runs([(first, [b"a"]), (first, [too_large])])
    with pytest.raises(LedgerNotFoundError):
        store.try_add_runs([(first, [b"a"]), (second + 100, [b"b"])])
    assert store.ledger_info(first).entries == 1
    assert store.last_add_confirmed(first) == 0
    assert done(store.add_entry(first, b"next")) == 1


def test_try_read_entries_answers_from_memory_or_not_at_all(impl: Impl) -> None:
    """None (it would need the disk) or exactly what `read_entries` gives; the same range
    checks either way."""
    store = impl.store
    ledger = new_ledger(store)
    datas = fill(store, ledger, 0, 4)
    found = store.try_read_entries(ledger, 1, 3)
    assert found is None or found == datas[1:4]
    with pytest.raises(NoSuchEntryError):
        store.try_read_entries(ledger, 2, 4)
    with pytest.raises(LedgerNotFoundError):
        store.try_read_entries(ledger + 100, 0, 0)


def test_cache_space_finishes_when_the_store_stops(impl: Impl) -> None:
    store = impl.store
    impl.close()
    assert store.cache_space().result(WAIT_S) is None
    with pytest.raises(StorageClosedError):
        store.try_add_entry(1, b"x")


def test_a_closed_store_refuses_writes(impl: Impl) -> None:
    store = impl.store
    ledger = new_ledger(store)
    impl.close()
    assert store.closed
    writes: list[Callable[[], object]] = [
        lambda: store.add_entry(ledger, b"x"), lambda: store.create_ledger(),
        lambda: store.fence(ledger)]
    for refused in writes:
        with pytest.raises(StorageClosedError):
            refused()


def test_every_error_raised_is_a_storage_error_with_a_wire_code(impl: Impl) -> None:
    store = impl.store
    with pytest.raises(StorageError) as caught:
        store.read_entry(12345, 0)
    assert isinstance(caught.value.code, int)
    assert caught.value.code > 0
