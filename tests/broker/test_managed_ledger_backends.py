"""`ManagedLedger` over either `LedgerStorage`: the real engine and the in-memory one.

The first part re-runs a slice of `test_managed_ledger.py` (rollover, ordering, hooks, the
record, close/delete, reads, position arithmetic, trimming and retention; everything but the
crash tests, which need a real journal) with its `env` fixture parametrized over both
implementations: the test bodies are imported, not copied, so both run the same assertions.
A "restart" of the in-memory environment opens a new managed ledger over the same store, as
a broker restart over a surviving store would.

The second part scripts storage failures that only the in-memory store makes cheap (adds in
flight when the disk fills, a refused add, an I/O error during a rollover, a corrupt entry).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from magnetar.broker.ledger._managed_ledger import ManagedLedger, ManagedLedgerConfig
from magnetar.broker.ledger._position import ManagedLedgerFencedError, Position
from magnetar.storage import (
    CorruptionError,
    LedgerStorage,
    StorageError,
    StorageFailedError,
    StorageFullError,
)
from magnetar.storage.testing.memory import InMemoryLedgerStorage
from tests.broker.test_managed_ledger import (  # the shared slice, run again below
    KEEP_ALL,
    Env,
    FakeClock,
    add_many,
    entry_counts,
    test_clean_close_records_the_current_ledger,
    test_close_drops_an_empty_current_ledger,
    test_concurrent_adds_get_positions_in_call_order,
    test_current_ledger_is_never_trimmed,
    test_delete_removes_record_cursors_and_ledgers,
    test_find_newest_matching_and_position_by_time,
    test_full_ledger_is_closed_right_after_the_add_that_filled_it,
    test_hooks_see_every_new_last_position_in_order,
    test_infinite_retention_keeps_everything,
    test_minimum_rollover_time_holds_back_a_full_ledger,
    test_new_ml_has_one_empty_ledger,
    test_non_durable_cursors_do_not_hold_back_and_are_moved,
    test_orphan_ledgers_of_the_ml_are_deleted_on_open,
    test_position_arithmetic_across_ledgers,
    test_properties_survive_a_restart,
    test_read_entries_crosses_ledgers_and_honours_limits,
    test_restart_closes_the_last_ledger_and_writes_to_a_new_one,
    test_retention_size_keeps_the_newest_consumed_ledgers,
    test_retention_time_keeps_consumed_ledgers_until_expired,
    test_rollover_by_age,
    test_rollover_by_entry_count,
    test_rollover_by_size,
    test_slowest_durable_cursor_holds_ledgers_back,
    test_trim_writes_metadata_before_deleting_ledgers,
    test_without_cursors_every_closed_ledger_is_trimmed_by_default,
    test_zero_entry_ledgers_are_dropped_on_open,
)

SHARED_SLICE = [
    test_clean_close_records_the_current_ledger,
    test_close_drops_an_empty_current_ledger,
    test_concurrent_adds_get_positions_in_call_order,
    test_current_ledger_is_never_trimmed,
    test_delete_removes_record_cursors_and_ledgers,
    test_find_newest_matching_and_position_by_time,
    test_full_ledger_is_closed_right_after_the_add_that_filled_it,
    test_hooks_see_every_new_last_position_in_order,
    test_infinite_retention_keeps_everything,
    test_minimum_rollover_time_holds_back_a_full_ledger,
    test_new_ml_has_one_empty_ledger,
    test_non_durable_cursors_do_not_hold_back_and_are_moved,
    test_orphan_ledgers_of_the_ml_are_deleted_on_open,
    test_position_arithmetic_across_ledgers,
    test_properties_survive_a_restart,
    test_read_entries_crosses_ledgers_and_honours_limits,
    test_restart_closes_the_last_ledger_and_writes_to_a_new_one,
    test_retention_size_keeps_the_newest_consumed_ledgers,
    test_retention_time_keeps_consumed_ledgers_until_expired,
    test_rollover_by_age,
    test_rollover_by_entry_count,
    test_rollover_by_size,
    test_slowest_durable_cursor_holds_ledgers_back,
    test_trim_writes_metadata_before_deleting_ledgers,
    test_without_cursors_every_closed_ledger_is_trimmed_by_default,
    test_zero_entry_ledgers_are_dropped_on_open,
]

P = Position


class MemoryEnv:
    """`Env` over an `InMemoryLedgerStorage` (no crash: nothing to lose)."""

    def __init__(self, *, inline: bool = False) -> None:
        self.storage = InMemoryLedgerStorage(inline_completions=inline)
        self.clock = FakeClock()

    def restart(self) -> LedgerStorage:
        return self.storage

    async def open(self, name: str = "topic", config: ManagedLedgerConfig = KEEP_ALL
                   ) -> ManagedLedger:
        return await ManagedLedger.open(self.storage, name, config, clock=self.clock)


@pytest.fixture(params=["real", "memory", "memory-inline"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env | MemoryEnv]:
    """The fixture the imported slice asks for, over both implementations (the in-memory
    one also with completions finished before the call returns)."""
    made: Env | MemoryEnv = (Env(tmp_path) if request.param == "real"
                             else MemoryEnv(inline=request.param == "memory-inline"))
    yield made
    made.storage.close()


def test_the_shared_slice_is_collected_here() -> None:
    collected = {name for name, value in globals().items() if name.startswith("test_")
                 and callable(value)}
    assert {test.__name__ for test in SHARED_SLICE} <= collected


# -- scripted failures (in-memory only) --------------------------------------------------


@pytest.fixture
def mem() -> Iterator[MemoryEnv]:
    made = MemoryEnv()
    yield made
    made.storage.close()


async def test_adds_in_flight_when_the_disk_fills_fail_and_writes_resume_in_a_new_ledger(
        mem: MemoryEnv) -> None:
    store = mem.storage

    ml = await mem.open()
    acknowledged = await add_many(ml, 2)
    first_ledger = ml.ledgers()[-1].ledger_id
    store.hold_completions()
    in_flight = [asyncio.ensure_future(ml.add_entry(b"late%d" % i)) for i in range(3)]
    await asyncio.sleep(0)  # let them reach the storage
    assert store.complete_pending(0) == 0
    store.set_disk_full(True)
    store.complete_pending()
    for future in in_flight:
        with pytest.raises(StorageFullError):
            await future
    assert ml.last_confirmed_position == acknowledged[-1]
    with pytest.raises(StorageFullError):  # the rollover it tries first is refused
        await ml.add_entry(b"while full")
    store.set_disk_full(False)
    assert await asyncio.to_thread(store.try_resume_writes)
    position = await ml.add_entry(b"after")  # not fenced: rolls over, then writes
    assert position.ledger_id != first_ledger
    assert position.entry_id == 0
    assert entry_counts(ml) == [2, 1]
    assert store.ledger_info(first_ledger).last_add_confirmed == 1
    read = ml.read_entries(ml.first_position(), 10, 1 << 20)
    assert [data for _, data in read] == [b"m0", b"m1", b"after"]


async def test_held_completions_confirm_positions_in_order(mem: MemoryEnv) -> None:
    store = mem.storage

    ml = await mem.open()
    store.hold_completions()
    adds = [asyncio.ensure_future(ml.add_entry(b"%d" % i)) for i in range(4)]
    await asyncio.sleep(0)
    ledger = ml.ledgers()[-1].ledger_id
    assert ml.last_confirmed_position == P(ledger, -1)
    store.complete_pending(2)
    assert [p.entry_id for p in await asyncio.gather(*adds[:2])] == [0, 1]
    assert ml.last_confirmed_position == P(ledger, 1)
    assert not any(add.done() for add in adds[2:])
    store.complete_pending()
    assert [p.entry_id for p in await asyncio.gather(*adds[2:])] == [2, 3]


async def test_a_refused_add_fails_alone_and_the_next_goes_on_in_the_same_ledger(
        mem: MemoryEnv) -> None:
    ml = await mem.open()
    await add_many(ml, 2)
    mem.storage.fail_next_adds(1, StorageError("write cache full (scripted)"))
    with pytest.raises(StorageError, match="write cache full"):
        await ml.add_entry(b"refused")
    position = await ml.add_entry(b"next")
    assert position == P(ml.ledgers()[0].ledger_id, 2)
    assert entry_counts(ml) == [3]


async def test_an_io_error_fences_the_ml_where_a_full_disk_does_not(mem: MemoryEnv) -> None:
    ml = await mem.open()
    await add_many(ml, 1)
    mem.storage.fail_writes(StorageFailedError("journal write failed (scripted EIO)",
                                               errno=5))
    with pytest.raises(StorageFailedError):
        await ml.add_entry(b"lost")
    with pytest.raises(StorageFailedError):  # the rollover after a failed add
        await ml.add_entry(b"refused")
    with pytest.raises(ManagedLedgerFencedError):
        await ml.add_entry(b"fenced")
    assert [data for _, data in ml.read_entries(ml.first_position(), 10, 1 << 20)] == \
        [b"m0"]


async def test_a_corrupt_entry_fails_the_reads_that_cover_it_only(mem: MemoryEnv) -> None:
    ml = await mem.open(config=replace(KEEP_ALL, max_entries_per_ledger=3))
    positions = await add_many(ml, 5)
    bad = positions[1]
    mem.storage.corrupt_entry(bad.ledger_id, bad.entry_id)
    with pytest.raises(CorruptionError, match="scripted corruption"):
        ml.read_entries(ml.first_position(), 10, 1 << 20)
    assert ml.read_entry(positions[0]) == b"m0"
    assert [data for _, data in ml.read_entries(positions[2], 10, 1 << 20)] == \
        [b"m2", b"m3", b"m4"]
