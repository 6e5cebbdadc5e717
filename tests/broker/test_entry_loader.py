"""`EntryLoader`: the bounded worker for reads that need the disk. Its limits hold (loads
in flight, bytes the running loads may return), waiting loads start as running ones
finish, and results and errors come back on the loop. Reads are held in the
in-memory store, so "running" is observable without timing."""

from __future__ import annotations

import asyncio

import pytest

from magnetar.broker.ledger._loader import EntryLoader, runs_of
from magnetar.broker.ledger._position import Position
from magnetar.storage import CorruptionError
from magnetar.storage.testing.memory import InMemoryLedgerStorage

from .helpers import wait_for


def _store_with(entries: int) -> tuple[InMemoryLedgerStorage, int]:
    store = InMemoryLedgerStorage()
    ledger = store.create_ledger().result(5)
    for i in range(entries):
        store.add_entry(ledger, b"e%d" % i).result(5)
    return store, ledger


@pytest.mark.parametrize(("in_flight_max", "bytes_max", "running"),
                         [(2, 1 << 20, 2), (4, 100, 1)], ids=["loads", "bytes"])
def test_limits_hold_and_waiting_loads_start_when_room_frees(in_flight_max: int, bytes_max: int,
                                                      running: int) -> None:
    async def scenario() -> None:
        store, ledger = _store_with(6)
        loader = EntryLoader(in_flight_max, bytes_max)
        store.hold_reads()
        futures = [loader.load(store, [(ledger, i, i)], 60) for i in range(6)]
        await wait_for(lambda: store.reads_held == running)
        assert loader.running == running
        assert loader.waiting == 6 - running
        store.release_reads()
        results = [await future for future in futures]
        assert results == [[(Position(ledger, i), b"e%d" % i)] for i in range(6)]
        assert loader.running == 0
        assert loader.running_bytes == 0
        loader.close()
        store.close()

    asyncio.run(scenario())


def test_a_load_error_comes_back_on_the_loop() -> None:
    async def scenario() -> None:
        store, ledger = _store_with(3)
        store.corrupt_entry(ledger, 1)
        loader = EntryLoader()
        with pytest.raises(CorruptionError):
            await loader.load(store, [(ledger, 0, 2)], 1 << 20)
        assert await loader.load(store, [(ledger, 2, 2)], 1 << 20) == [(Position(ledger, 2),
                                                                         b"e2")]
        loader.close()
        store.close()

    asyncio.run(scenario())


def test_runs_group_consecutive_entries_of_a_ledger() -> None:
    positions = [Position(1, 0), Position(1, 1), Position(1, 3), Position(2, 4),
                 Position(2, 5)]
    assert runs_of(positions) == [(1, 0, 1), (1, 3, 3), (2, 4, 5)]
