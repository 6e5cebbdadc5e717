"""`AddGroup`: the adds of many managed ledgers handed to their storage as one write.

Theory of operation
-------------------
A broker connection gathers what one socket read delivered -- SENDs of many producers, on
many topics -- into one group: each topic adds its admitted entries (`add`), and `submit`
hands every run to the storage at once (`LedgerStorage.try_add_runs`: one lock hold, one
completion), then confirms them on the event loop in one hand-off, each managed ledger in
turn (`ManagedLedger.confirm_run`: entry counts, `last_confirmed_position`, its hooks), and
calls each run's `on_added` with its positions in order; then the group's `after` hook, once
(a connection writes every producer's receipts of the group there, in one write).

A run joins only when its managed ledger could hand it over at once (`ManagedLedger.reserve`:
open, nothing queued before it, no rollover due); otherwise -- and for every later run of
the same managed ledger in the group -- `submit` starts its ordinary add
(`ManagedLedger.add_entries_soon`) after handing the group over. `add` and `submit` run in
one turn of the loop, so nothing comes between a reservation and its hand-over, and each
managed ledger's adds keep call order. When the storage refuses the group (its write cache or
journal queue is full, or any run's ledger refuses), every run is given back and added the
ordinary way, in call order (which waits for room, and raises each ledger's own refusal for
its own run). A group that failed in the storage fails each run (the next add of each
managed ledger then rolls over first).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from magnetar.storage import Completion, latency_trace

from ._completions import call_soon
from ._managed_ledger import ADD_RUN_BYTES_MAX, ADD_RUN_ENTRIES_MAX, ManagedLedger
from ._position import Position

__all__ = ["AddGroup", "AddOutcomes"]

# A run's outcome: each entry's position, or the error its add raised.
AddOutcomes = Sequence[Position | BaseException]


class _Part(NamedTuple):
    ml: ManagedLedger
    entries: Sequence[bytes]
    size: int
    on_added: Callable[[AddOutcomes], None]
    ledger: Any  # the ML's current ledger, from `reserve` (None: an ordinary add)


_new_part = tuple.__new__  # a _Part without the NamedTuple's __new__ (a call per SEND)


class AddGroup:
    """Runs of entries for many managed ledgers of one storage, handed over as one write
    (see the module comment). Use it within one turn of the event loop; the caller bounds
    what it adds (a connection: one socket read, `RECEIVE_BYTES_MAX`)."""

    def __init__(self, after: Callable[[], None] | None = None) -> None:
        """`after`, when given, is called once `on_added` has been called for each run that
        the group's write confirmed or failed, and after each ordinary add's `on_added`."""
        self._after = after
        self._parts: list[_Part] = []
        self._ordinary: set[int] = set()  # ids of the MLs with an ordinary add in the group
        self._storage: object = None

    def add(self, ml: ManagedLedger, entries: Sequence[bytes],
            on_added: Callable[[AddOutcomes], None]) -> None:
        """Add `entries` to `ml`, in call order with its other adds: `on_added` gets their
        outcomes in order once the group's write is confirmed, or, when `ml` cannot take
        them into the group now (or uses another storage than the group's), once the
        ordinary add that `submit` starts (`add_entries_soon`) has them."""
        assert entries
        if len(entries) == 1:  # the common case with many producers: no map
            size = largest = len(entries[0])
        else:
            size, largest = sum(map(len, entries)), max(map(len, entries))
        storage = ml.storage
        ordinary = self._ordinary
        ledger = None
        if (ordinary and id(ml) in ordinary) or self._storage not in (None, storage):
            pass
        elif largest <= storage.config.entry_size_bytes_max:  # else refused alone
            ledger = ml.reserve(len(entries), size)
        if ledger is None:
            ordinary.add(id(ml))
        else:
            self._storage = storage
        self._parts.append(_new_part(_Part, (ml, entries, size, on_added, ledger)))

    def submit(self) -> asyncio.Future[Any] | None:
        """Hand every reserved run over, then start the ordinary adds (see the module
        comment); returns a future that finishes once every `on_added` of the group has been
        called (None: the group is empty). Empties the group."""
        parts, self._parts, self._storage = self._parts, [], None
        self._ordinary.clear()
        if not parts:
            return None
        loop, after = asyncio.get_running_loop(), self._after
        reserved = [part for part in parts if part.ledger is not None]
        added = None
        if reserved:
            runs, ends = _storage_runs(reserved)
            try:
                added = reserved[0].ml.storage.try_add_runs(runs)
            except Exception:  # each ledger's own add raises its own refusal
                added = None
        waits: list[asyncio.Future[None]] = []
        if added is not None:
            confirmed: asyncio.Future[None] = loop.create_future()
            run_lasts, completion = added
            lasts = [run_lasts[end] for end in ends]  # each part's last entry id
            for part in reserved:
                part.ml.handed_over(confirmed)
            submitted_ns = time.perf_counter_ns()
            if latency_trace.on:
                latency_trace.mark("submit", submitted_ns)
            completion.add_done_callback(lambda done: call_soon(
                loop, _confirm, reserved, lasts, done, submitted_ns, confirmed, after))
            waits.append(confirmed)
        for part in parts:
            if part.ledger is not None and added is None:
                part.ml.unreserve(len(part.entries), part.size)
            if part.ledger is None or added is None:
                waits.append(_answer_when_added(part.ml.add_entries_soon(part.entries),
                                                len(part.entries), part.on_added, after))
        return waits[0] if len(waits) == 1 else asyncio.gather(*waits)


def _storage_runs(parts: list[_Part]) -> tuple[list[tuple[int, Sequence[bytes]]], list[int]]:
    """The parts as runs for `try_add_runs`, each part cut where a managed ledger's own add
    would cut it (`ADD_RUN_ENTRIES_MAX`, `ADD_RUN_BYTES_MAX`); and the index of each part's
    last run."""
    runs: list[tuple[int, Sequence[bytes]]] = []
    ends = []
    for part in parts:
        ledger_id, entries = part.ledger.ledger_id, part.entries
        if len(entries) <= ADD_RUN_ENTRIES_MAX and part.size <= ADD_RUN_BYTES_MAX:
            runs.append((ledger_id, entries))
        else:
            start = size = 0
            for index, data in enumerate(entries):
                if index > start and (index - start == ADD_RUN_ENTRIES_MAX
                                      or size + len(data) > ADD_RUN_BYTES_MAX):
                    runs.append((ledger_id, entries[start:index]))
                    start, size = index, 0
                size += len(data)
            runs.append((ledger_id, entries[start:]))
        ends.append(len(runs) - 1)
    return runs, ends


def _answer_when_added(task: asyncio.Task[list[Position | BaseException]], count: int,
                       on_added: Callable[[AddOutcomes], None],
                       after: Callable[[], None] | None) -> asyncio.Future[None]:
    """Call `on_added`, then `after`, once an `add_entries_soon` task of `count` entries is
    done (its refusal, or a cancellation, answers every entry); the returned future
    finishes then."""
    answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def answer(_: object) -> None:
        try:
            if task.cancelled():
                on_added([asyncio.CancelledError()] * count)
            elif (error := task.exception()) is not None:
                on_added([error] * count)
            else:
                on_added(task.result())
            if after is not None:
                after()
        finally:
            answered.set_result(None)

    task.add_done_callback(answer)
    return answered


def _confirm(parts: list[_Part], lasts: list[int], completion: Completion[int],
             submitted_ns: int, finished: asyncio.Future[None],
             after: Callable[[], None] | None) -> None:
    """On the loop: the group's write finished (each part's last entry id in `lasts`);
    confirm each run and answer it, then call
    `after`. A run whose answer raises (a bug) does not keep the others from theirs (nor
    `after` from being called): `finished` fails with the first such error once every run
    is done."""
    error = completion.exception()
    latency_us = (time.perf_counter_ns() - submitted_ns) // 1000
    if latency_trace.on:
        latency_trace.mark("confirm", submitted_ns)
    failure: BaseException | None = None
    for (ml, entries, size, on_added, ledger), last in zip(parts, lasts, strict=True):
        try:
            if error is not None:
                ml.run_failed()
                on_added([error] * len(entries))
            else:
                on_added(ml.confirm_run(ledger, entries, size, last, latency_us))
        except Exception as exc:
            failure = failure or exc
    if after is not None:
        try:
            after()
        except Exception as exc:
            failure = failure or exc
    if not finished.done():
        if failure is None:
            finished.set_result(None)
        else:
            finished.set_exception(failure)
    for part in parts:
        part.ml.forget_add(finished)
