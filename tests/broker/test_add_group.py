"""AddGroup: the runs of many managed ledgers reach their storage as one write and get the
positions their own adds would; a managed ledger that cannot take a run into the group now
(an add queued before, a rollover due, a refusing storage) adds it the ordinary way, after
what came before it and before what comes after it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from magnetar.broker.ledger._add_group import AddGroup, AddOutcomes
from magnetar.broker.ledger._managed_ledger import (
    ADD_RUN_ENTRIES_MAX,
    ManagedLedger,
    ManagedLedgerConfig,
)
from magnetar.broker.ledger._position import Position
from magnetar.storage import Storage, StorageConfig, StorageFailedError
from magnetar.storage.testing.memory import InMemoryLedgerStorage

KEEP_ALL = ManagedLedgerConfig(min_ledger_rollover_time_s=0, retention_time_minutes=-1,
                               retention_size_mb=-1)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    opened = Storage.open(tmp_path, StorageConfig())
    yield opened
    opened.close()


class Answers:
    """Each `on_added` call, in the order they came."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, AddOutcomes]] = []

    def to(self, name: str) -> Callable[[AddOutcomes], None]:
        return lambda outcomes: self.calls.append((name, outcomes))


def ids(outcomes: AddOutcomes) -> list[tuple[int, int]]:
    assert all(isinstance(p, Position) for p in outcomes)
    return [(p.ledger_id, p.entry_id) for p in outcomes]  # type: ignore[union-attr]


async def test_runs_of_many_managed_ledgers_are_one_storage_write() -> None:
    store = InMemoryLedgerStorage()
    first = await ManagedLedger.open(store, "a", KEEP_ALL)
    second = await ManagedLedger.open(store, "b", KEEP_ALL)
    store.hold_completions()
    answers = Answers()
    group = AddGroup()
    group.add(first, [b"a0", b"a1"], answers.to("a"))
    group.add(second, [b"b0"], answers.to("b"))
    group.add(first, [b"a2"], answers.to("a"))
    done = group.submit()
    assert done is not None
    assert store.pending_writes == 1
    store.complete_pending()
    await asyncio.wait_for(done, 5)
    a, b = first.current_ledger_id, second.current_ledger_id
    assert [name for name, _ in answers.calls] == ["a", "b", "a"]
    assert ids(answers.calls[0][1]) == [(a, 0), (a, 1)]
    assert ids(answers.calls[1][1]) == [(b, 0)]
    assert ids(answers.calls[2][1]) == [(a, 2)]
    assert first.last_confirmed_position == Position(a, 2)
    assert second.number_of_entries == 1
    entries = await first.read_entries_async(Position(a, 0), 3, 1 << 20)
    assert [data for _, data in entries] == [b"a0", b"a1", b"a2"]


async def test_a_long_run_is_cut_as_an_add_would_cut_it_and_stays_one_write() -> None:
    store = InMemoryLedgerStorage()
    ml = await ManagedLedger.open(store, "t", KEEP_ALL)
    store.hold_completions()
    answers = Answers()
    group = AddGroup()
    entries = [b"%d" % i for i in range(ADD_RUN_ENTRIES_MAX * 2 + 3)]
    group.add(ml, entries, answers.to("t"))
    done = group.submit()
    assert done is not None
    assert store.pending_writes == 1
    store.complete_pending()
    await asyncio.wait_for(done, 5)
    ledger = ml.current_ledger_id
    assert ids(answers.calls[0][1]) == [(ledger, i) for i in range(len(entries))]
    assert ml.number_of_entries == len(entries)


async def test_a_run_behind_a_queued_add_waits_its_turn(storage: Storage) -> None:
    ml = await ManagedLedger.open(storage, "t", KEEP_ALL)
    queued = ml.add_entries_soon([b"first"])
    answers = Answers()
    group = AddGroup()
    group.add(ml, [b"second"], answers.to("t"))
    done = group.submit()
    assert done is not None
    await asyncio.wait_for(done, 5)
    ledger = ml.current_ledger_id
    assert ids(await queued) == [(ledger, 0)]
    assert ids(answers.calls[0][1]) == [(ledger, 1)]


async def test_a_run_that_would_fill_the_ledger_rolls_it_over_the_ordinary_way(
        storage: Storage) -> None:
    ml = await ManagedLedger.open(storage, "t", replace(KEEP_ALL, max_entries_per_ledger=2))
    other = await ManagedLedger.open(storage, "u", KEEP_ALL)
    answers = Answers()
    group = AddGroup()
    group.add(ml, [b"0", b"1", b"2"], answers.to("t"))
    group.add(other, [b"x"], answers.to("u"))
    group.add(ml, [b"3"], answers.to("t"))
    done = group.submit()
    assert done is not None
    await asyncio.wait_for(done, 5)
    assert [name for name, _ in answers.calls] == ["u", "t", "t"]  # the group's write first
    positions = ids(answers.calls[1][1]) + ids(answers.calls[2][1])
    ledgers = [record.ledger_id for record in ml.ledgers()]
    assert positions == [(ledgers[0], 0), (ledgers[0], 1), (ledgers[1], 0), (ledgers[1], 1)]
    assert ids(answers.calls[0][1]) == [(other.current_ledger_id, 0)]


async def test_a_refused_group_adds_each_run_the_ordinary_way_in_order() -> None:
    store = InMemoryLedgerStorage()
    first = await ManagedLedger.open(store, "a", KEEP_ALL)
    second = await ManagedLedger.open(store, "b", KEEP_ALL)
    store.fill_cache()
    answers = Answers()
    group = AddGroup()
    group.add(first, [b"a0"], answers.to("a"))
    group.add(second, [b"b0"], answers.to("b"))
    group.add(first, [b"a1"], answers.to("a"))
    done = group.submit()
    assert done is not None
    await asyncio.sleep(0)
    assert answers.calls == []  # waiting for cache space, as the ordinary adds do
    store.free_cache()
    await asyncio.wait_for(done, 5)
    a, b = first.current_ledger_id, second.current_ledger_id
    assert sorted((name, ids(outcomes)) for name, outcomes in answers.calls) == [
        ("a", [(a, 0)]), ("a", [(a, 1)]), ("b", [(b, 0)])]


async def test_a_failed_group_write_fails_every_run_and_the_next_add_rolls_over() -> None:
    store = InMemoryLedgerStorage()
    ml = await ManagedLedger.open(store, "t", KEEP_ALL)
    store.hold_completions()
    answers = Answers()
    group = AddGroup()
    group.add(ml, [b"0", b"1"], answers.to("t"))
    done = group.submit()
    assert done is not None
    store.fail_writes(StorageFailedError("journal write failed (scripted)"))
    store.complete_pending()
    await asyncio.wait_for(done, 5)
    outcomes = answers.calls[0][1]
    assert len(outcomes) == 2
    assert all(isinstance(outcome, StorageFailedError) for outcome in outcomes)
    assert ml.number_of_entries == 0


async def test_an_answer_that_raises_does_not_keep_the_other_runs_from_theirs() -> None:
    store = InMemoryLedgerStorage()
    first = await ManagedLedger.open(store, "a", KEEP_ALL)
    second = await ManagedLedger.open(store, "b", KEEP_ALL)
    answers = Answers()

    def broken(outcomes: AddOutcomes) -> None:
        raise RuntimeError("a bug in an answer")

    group = AddGroup()
    group.add(first, [b"a0"], broken)
    group.add(second, [b"b0"], answers.to("b"))
    done = group.submit()
    assert done is not None
    with pytest.raises(RuntimeError, match="a bug in an answer"):
        await asyncio.wait_for(done, 5)
    assert ids(answers.calls[0][1]) == [(second.current_ledger_id, 0)]
    assert first.number_of_entries == 1  # confirmed all the same


async def test_after_comes_once_after_the_groups_answers_and_after_each_ordinary_one(
        storage: Storage) -> None:
    """A connection writes every producer's receipts of the group in `after`: it must come
    once the group's runs are all answered, and after each run added the ordinary way."""
    ml = await ManagedLedger.open(storage, "t", KEEP_ALL)
    others = [await ManagedLedger.open(storage, name, KEEP_ALL) for name in ("u", "v")]
    queued = ml.add_entries_soon([b"first"])  # so the group's run for "t" is ordinary
    answers = Answers()
    group = AddGroup(after=lambda: answers.calls.append(("after", [])))
    group.add(others[0], [b"u0"], answers.to("u"))
    group.add(ml, [b"t1"], answers.to("t"))
    group.add(others[1], [b"v0", b"v1"], answers.to("v"))
    done = group.submit()
    assert done is not None
    await asyncio.wait_for(done, 5)
    await queued
    assert [name for name, _ in answers.calls] == ["u", "v", "after", "t", "after"]
    assert ids(answers.calls[1][1]) == [(others[1].current_ledger_id, 0),
                                        (others[1].current_ledger_id, 1)]
    assert ids(answers.calls[3][1]) == [(ml.current_ledger_id, 1)]
