"""Adds to the engine's ledgers: runs of entries, of one ledger or of several at once.

Theory of operation
-------------------
An add is applied in memory under the storage lock (the ledger's next entry id advances and
the entries go into the write cache), then journaled; its completion finishes once the
journal's group commit has synced it (see `_storage.py`). `add_runs` does that for a list of
runs, each a ledger id and its entries, under ONE hold of the lock: every run is checked
first (nothing is written when any is refused), then each gets consecutive entry ids in its
ledger and its own journal request, in list order. Only the last request carries the
completion: the journal completes requests in order, so when it finishes, every run is
durable (and each ledger's LAC has advanced with its request); when the journal fails, it
fails, and any of the runs may or may not be durable.

The broker uses a list of many ledgers' runs to hand everything one socket read delivered
(the SENDs of many producers, on many topics) to the storage as one write: one lock hold,
one completion, one hand-off back to its event loop. `Storage.try_add_entries` is the list
of one run.

`add_one` is the list of one run of one entry (`Storage.add_entry`, `try_add_entry`), the
add of a client that submits one at a time and so pays the whole path per entry: the same
checks, refusals and errors, without the lists, zips and generators a list of runs needs
(about half the CPU per add of going through `add_runs`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ._completion import Completion
from ._config import StorageConfig
from ._errors import EntryTooLargeError, LedgerNotFoundError
from ._journal import Journal, JournalRequest
from ._journal_format import RecordType
from ._ledger import OPEN, LedgerState, LedgerTable
from ._write_cache import WriteCache

__all__ = ["AddedRuns", "add_one", "add_run", "add_runs"]

_ADD = int(RecordType.ADD_ENTRY)  # an enum member costs a class attribute lookup per use

# What `add_runs` hands back: each run's LAST entry id, and the completion of the whole list.
AddedRuns = tuple[list[int], Completion[int]]


class _Engine(Protocol):
    """The parts of `Storage` that adds use."""

    config: StorageConfig
    lock: threading.Condition
    mutex: threading.RLock  # the lock `lock` is built on: `with` it costs no Python call
    journal: Journal | None
    cache: WriteCache
    ledgers: LedgerTable
    _checkpoint_wanted: threading.Event

    @property
    def failed(self) -> BaseException | None: ...

    @property
    def closed(self) -> bool: ...

    def _check_writable(self) -> None: ...

    def _writable_ledger(self, ledger_id: int) -> LedgerState: ...


def checked_runs(runs: Sequence[tuple[int, Sequence[bytes]]],
                 size_max: int) -> list[list[bytes]]:
    """Each run's entries as bytes, once every entry is checked against `size_max` (every
    implementation of `try_add_runs` refuses the same way).

    Raises:
        EntryTooLargeError: an entry is above `size_max`, naming its ledger.
    """
    assert runs, "a list of runs has at least one"
    datas = [list(map(bytes, entries)) for _, entries in runs]
    assert all(datas), "every run has at least one entry"
    for (ledger_id, _), run in zip(runs, datas, strict=True):
        if (largest := max(map(len, run))) > size_max:
            raise EntryTooLargeError(
                f"entry of {largest} bytes for ledger {ledger_id} exceeds "
                f"entry_size_bytes_max={size_max}")
    return datas


def add_runs(engine: _Engine, runs: Sequence[tuple[int, Sequence[bytes]]],
             journal_may_wait: bool) -> AddedRuns | None:
    """Apply and journal `runs` (ledger id, entries) in order, as the module comment says;
    None (nothing written) while the write cache is full and its other half is still being
    flushed, or, unless `journal_may_wait` (a thread's add then waits in `Journal.submit`),
    while the journal's queue has no room for all of their records. The completion gives
    the last run's last entry id.

    Raises:
        EntryTooLargeError: an entry is above `entry_size_bytes_max`; nothing written.
        LedgerNotFoundError, LedgerFencedError, LedgerClosedError: for any of the ledgers;
            nothing written.
        StorageFailedError, StorageClosedError: the engine accepts no writes.
    """
    datas = checked_runs(runs, engine.config.entry_size_bytes_max)
    records = sum(map(len, datas))
    with engine.mutex:
        engine._check_writable()
        table = engine.ledgers.ledgers  # as `add_one`: a call only to raise
        ledgers = []
        for ledger_id, _ in runs:
            ledger = table.get(ledger_id)
            if ledger is None or ledger.state != OPEN:
                ledger = engine._writable_ledger(ledger_id)  # raises
            ledgers.append(ledger)
        journal = engine.journal
        assert journal is not None
        completion = _room_for(engine, journal, records, journal_may_wait)
        if completion is None:
            return None
        cache = engine.cache
        lasts = []
        requests = []
        for index, ((ledger_id, _), ledger, run) in enumerate(zip(runs, ledgers, datas,
                                                                   strict=True)):
            first = ledger.next_entry_id
            last = first + len(run) - 1
            ledger.next_entry_id = last + 1
            cache.put_run(ledger_id, first, run)
            lasts.append(last)
            requests.append(JournalRequest(
                _ADD, b"", completion if index == len(runs) - 1 else None,
                ledger, last, entries=run, ledger_id=ledger_id))
        journal.submit_many(requests)  # one journal lock hold and wake-up for the list
    return lasts, completion


def add_run(engine: _Engine, ledger_id: int, entries: Sequence[bytes],
            journal_may_wait: bool) -> Completion[int] | None:
    """`add_runs` of one run (its completion gives the run's last entry id), None as
    `add_runs`."""
    added = add_runs(engine, [(ledger_id, entries)], journal_may_wait)
    return None if added is None else added[1]


def add_one(engine: _Engine, ledger_id: int, data: bytes,
            journal_may_wait: bool) -> Completion[int] | None:
    """`add_runs` of one entry, the add a client makes one at a time: the same checks,
    the same refusals (None) and the same errors, with the work per add cut to what one
    entry needs (no lists of runs). Returns the completion, which gives the entry id."""
    if type(data) is not bytes:  # (exactly bytes is kept as it is, without a call)
        data = bytes(data)
    if len(data) > engine.config.entry_size_bytes_max:
        checked_runs([(ledger_id, [data])], engine.config.entry_size_bytes_max)  # raises
    with engine.mutex:
        if engine.failed is not None or engine.closed:
            engine._check_writable()  # raises
        ledger = engine.ledgers.ledgers.get(ledger_id)
        if ledger is None or ledger.state != OPEN:
            ledger = engine._writable_ledger(ledger_id)  # raises
        journal = engine.journal
        assert journal is not None
        completion = _room_for(engine, journal, 1, journal_may_wait)
        if completion is None:
            return None
        cache = engine.cache
        entry_id = ledger.next_entry_id
        ledger.next_entry_id = entry_id + 1
        cache.put_new(ledger_id, entry_id, data)
        journal.submit(JournalRequest.add(completion, ledger, ledger_id, entry_id, data),
                       defer_wake=journal_may_wait)  # (`Storage.add_entry`: see `submit`)
    return completion


def _room_for(engine: _Engine, journal: Journal, records: int,
              journal_may_wait: bool) -> Completion[int] | None:
    """Storage lock held: the completion for adds of `records` entries about to be queued, or
    None when they must be refused for now (the journal's queue is full and the caller may not
    wait, or both write-cache halves are full: a checkpoint is asked for)."""
    if not journal_may_wait and not journal.has_room_for_adds(records):
        return None
    cache = engine.cache
    if cache.active_full():
        engine._checkpoint_wanted.set()
        if cache.flushing is not None:
            return None  # else the next checkpoint swaps; may overshoot by one list
    completion: Completion[int] = Completion()
    if engine.config.journal_caller_syncs_when_idle:
        completion.before_blocking = journal.lead
    return completion


def one_by_one(end: Callable[[int], Completion[int]],
               ledger_ids: Sequence[int]) -> list[Completion[int]]:
    """`end` (a store's close_ledger or delete_ledger) of each ledger in turn, a missing
    ledger's error as its completion's, as the batched `close_ledgers`/`delete_ledgers`
    report it."""
    completions = []
    for ledger_id in ledger_ids:
        try:
            completions.append(end(ledger_id))
        except LedgerNotFoundError as error:
            completions.append(Completion.failed(error))
    return completions
