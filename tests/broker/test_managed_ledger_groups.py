"""ManagedLedger.add_entries on a real Storage: a group gets the positions single adds would
(in order, rolling over inside the group exactly where single adds would), interleaves in call
order with single adds, and an entry the storage refuses fails from there on only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from magnetar.broker.ledger._managed_ledger import ManagedLedger, ManagedLedgerConfig
from magnetar.broker.ledger._position import Position
from magnetar.storage import EntryTooLargeError, Storage, StorageConfig

KEEP_ALL = ManagedLedgerConfig(min_ledger_rollover_time_s=0, retention_time_minutes=-1,
                               retention_size_mb=-1)


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    opened = Storage.open(tmp_path, StorageConfig(entry_size_bytes_max=1024))
    yield opened
    opened.close()


def counts(ml: ManagedLedger) -> list[int]:
    return [ledger.entries for ledger in ml.ledgers()]


async def test_a_group_rolls_over_where_single_adds_would(storage: Storage) -> None:
    ml = await ManagedLedger.open(storage, "t", replace(KEEP_ALL, max_entries_per_ledger=3))
    outcomes = await ml.add_entries([b"e%d" % i for i in range(7)])
    ids = [ledger.ledger_id for ledger in ml.ledgers()]
    assert counts(ml) == [3, 3, 1]
    assert outcomes == [Position(ids[0], 0), Position(ids[0], 1), Position(ids[0], 2),
                        Position(ids[1], 0), Position(ids[1], 1), Position(ids[1], 2),
                        Position(ids[2], 0)]
    assert ml.last_confirmed_position == outcomes[-1]
    entries = await ml.read_entries_async(Position(ids[0], 0), 7, 1 << 20)
    assert entries == [(p, b"e%d" % i) for i, p in enumerate(outcomes)]


async def test_groups_and_single_adds_keep_call_order(storage: Storage) -> None:
    ml = await ManagedLedger.open(storage, "t", KEEP_ALL)
    first = asyncio.ensure_future(ml.add_entries([b"a", b"b"]))
    single = asyncio.ensure_future(ml.add_entry(b"c"))
    second = asyncio.ensure_future(ml.add_entries([b"d"]))
    positions = [*await first, await single, *await second]
    assert [p.entry_id for p in positions] == [0, 1, 2, 3]  # type: ignore[union-attr]


async def test_a_refused_entry_fails_itself_and_the_rest_only(storage: Storage) -> None:
    ml = await ManagedLedger.open(storage, "t", KEEP_ALL)
    outcomes = await ml.add_entries([b"ok", b"x" * 2048, b"after"])
    assert isinstance(outcomes[0], Position)
    assert isinstance(outcomes[1], EntryTooLargeError)
    assert outcomes[2] is outcomes[1]
    assert ml.number_of_entries == 1
    assert await ml.add_entry(b"next") == Position(outcomes[0].ledger_id, 1)
