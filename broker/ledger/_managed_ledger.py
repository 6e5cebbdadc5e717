"""`ManagedLedger`: a topic's durable log, as a list of storage ledgers.

Theory of operation
-------------------
A managed ledger (ML) named N is the list of storage ledgers that hold a topic's entries, oldest
first. Writes go to the last one, the *current* ledger; the others are closed. A position is
`(ledger_id, entry_id)` and entry ids run 0..n-1 inside each ledger.

The storage is any `LedgerStorage` (the engine, or the in-memory one in tests).

Metadata. The list lives in `storage.metadata` under `b"ml/" + N`, as JSON
`{"ledgers": [{"ledger_id", "entries", "size", "timestamp_ms"}], "properties": {}}` (plus
`"terminated": [ledger_id, entry_id]` once terminated: Pulsar's terminatedPosition), written
through the journal (`apply_journaled`: no disk on the loop) each time the list changes. A
ledger's `timestamp_ms` is its close time (0 while it is the current ledger). Storage ledgers
carry the metadata `{"ml": N}` so that orphans can be found.

Open (bookkeeper-storage.md §9.1). Read the record; close the last ledger of the previous run at
its last entry (`close_ledger`; its entry count is then exact, and its size is summed by reading
it back unless the record already holds both); drop zero-entry ledgers; find orphans (storage
ledgers tagged with N that the record does not list: a rollover or trim that crashed between
its steps); create a NEW ledger for writes — an ML never appends to a previous run's ledger;
write the record; only then delete the dropped ledgers and the orphans. Then recover every
durable cursor stored under `b"cursor/" + N + b"\\x00"`.

Adds. `add_entry` takes the ML's submit lock (an `asyncio.Lock`, FIFO), rolls over first when
the current ledger is full, hands the entry to `storage.try_add_entry` (which assigns the entry
id at once), releases the lock and waits for durability. The event loop never waits on the
storage: while its write cache is full, `try_add_entry` refuses and the add awaits the storage's
`cache_space` signal on the loop, holding the submit lock, so this ML's later adds queue behind
it (back-pressure reaches its producers) while the loop serves everything else. So
concurrent adds get positions in call order; `add_entries` hands a group over under one hold
of the lock (a connection's SENDs of one socket read), as runs of entries that each go to the
storage as one write (`try_add_entries`: one journal request, one completion). The storage
completes adds in order; the runs handed over together are bounced onto the event loop once,
when the last completes, where each run in turn advances the ledger's entry count and size
and `last_confirmed_position`, resolves its adds, and calls the `on_entries_added` hooks
(once, with its last position).
After its add is durable, an add that filled the ledger rolls over at once (Pulsar closes a
full ledger right away, so it can be trimmed).

A failed add (the storage refused or failed it: a full disk) leaves the current ledger in
doubt, as in Pulsar, where a failed add closes the ledger: the next add first rolls over, and
the new ledger's list ignores whatever the storage may hold of the failed adds beyond the
entries the ML confirmed (a current ledger left without entries is dropped from the list
and deleted). A rollover that fails because the disk is full does not fence the ML: the next
add tries again (any other storage error still fences it).

Rollover (§9.1). A ledger is full when it has entries and (entries >= max_entries, or size >=
max_size, or age >= max_rollover_time) and, when a minimum rollover time is set, its age is
above that minimum (Pulsar's `currentLedgerIsFull`). Steps, under the submit lock: close the
ledger (durable once every add before it is; the close is awaited through the event loop, so
the confirmations of those adds have been applied first), create the next one, record the list
(metadata first), then trim. A crash between the steps leaves an orphan ledger that the next
open deletes.

Reads stop at `last_confirmed_position` and never touch the disk on the event loop: a read is
planned as runs of entries (`plan_runs`), served from the storage's memory when it can
(`read_cached`) and otherwise loaded by the bounded `EntryLoader` in worker threads (`load`;
see `_loader.py`). `read_entries`/`read_entry` read synchronously: for threads, and for rare
single-entry reads on the loop (an admin lookup, a message-age backlog-quota check, the
newest entry's index when a topic with the index interceptor loads).

Trimming (broker semantics §7.1, storage §9.3). Candidates are the closed ledgers strictly below
the ledger of the slowest durable cursor's *persisted* mark-delete position (the next ledger when
that position is its ledger's last entry), or every closed ledger when there are no durable
cursors. Walking them oldest first, a ledger goes when its retention time has expired or the
data kept would still be over the retention size; the walk stops at the first that stays.
Non-durable cursors do not hold data back; they are moved past what goes. The record is written
first, then the storage ledgers are deleted, so a crash leaves orphans, never dangling
metadata. Trimming runs after each rollover, when a durable cursor's persisted mark-delete
moves to another ledger, and whenever the owner calls `trim_consumed_ledgers` (Pulsar: every
`retentionCheckIntervalInSeconds`).

Position arithmetic (the base class `LedgerLayout`, `_layout.py`). Ledgers other than the
current one always have at least one entry (a ledger is rolled over only once it has entries,
and empty ones are dropped on open). The *write position* is `(current, entries of current)`,
where the next entry will go.
`next_position(p)` is the position right after p in the layout (crossing to entry 0 of the next
ledger that has entries); `next_valid_position(p)` is that, capped at the write position
(Pulsar's `getNextValidPosition`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from magnetar.storage import (
    Completion,
    LedgerNotFoundError,
    LedgerStorage,
    StorageError,
    StorageFullError,
)

from .._rates import AddFigures
from ._completions import (
    add_when_cache_has_space,
    after_earlier_callbacks,
    close_storage_ledger,
    delete_in_background,
    delete_storage_ledger,
    in_order_on_loop,
)
from ._cursor import ManagedCursor
from ._loader import EntryLoader, LedgerReads, default_loader
from ._ml_records import LedgerRecord, ManagedLedgerConfig, MiB, _Ledger, cursor_prefix, ml_key
from ._position import (
    EMPTY_MAP,
    ManagedLedgerClosedError,
    ManagedLedgerFencedError,
    ManagedLedgerTerminatedError,
    Position,
)

__all__ = ["InitialPosition", "LedgerRecord", "ManagedLedger", "ManagedLedgerConfig", "ml_key"]

log = logging.getLogger(__name__)

RECOVERY_READ_ENTRIES_MAX = 1024  # entries per storage read when sizing a recovered ledger
ADD_RUN_ENTRIES_MAX = 256  # entries handed to the storage as one run (one journal request)
ADD_RUN_BYTES_MAX = 1 * MiB  # ... and their bytes at most (a larger entry goes alone)

InitialPosition = Literal["latest", "earliest"]


class _Run(NamedTuple):
    """A run of entries handed to the storage as one (`try_add_entries`), until its
    completion is confirmed on the loop; `done` gives the run's positions."""

    entries: Sequence[bytes]
    size: int
    completion: Completion[int]
    done: asyncio.Future[list[Position]]
    submitted_ns: int


class ManagedLedger(LedgerReads):
    """A topic's durable log. Open it with `await ManagedLedger.open(...)`; use it from one
    asyncio event loop."""

    __slots__ = ("_add_failed", "_current_created_s", "_fenced", "_ids", "_last_add",
                 "_last_confirmed", "_ledgers", "_lock", "_non_durable", "_queued_adds",
                 "_record_written", "_state", "_submitted_bytes", "_submitted_entries",
                 "add_figures", "clock", "config", "cursors", "loader", "name", "on_entries_added",
                 "properties", "record_sink", "storage", "terminated_position")

    def __init__(self, storage: LedgerStorage, name: str, config: ManagedLedgerConfig,
                 clock: Callable[[], float], ledgers: list[_Ledger],
                 properties: Mapping[str, str], terminated: Position | None = None,
                 loader: EntryLoader | None = None):
        """Internal: use `ManagedLedger.open`."""
        self.loader = loader or default_loader()
        assert ledgers, "an open managed ledger always has a current ledger"
        self.storage = storage
        self.name = name
        self.config = config
        self.clock = clock
        self.properties = properties  # EMPTY_MAP while none (most topics): see set_property
        self._ledgers = ledgers
        # the ledgers' ids, for bisect: a tuple (rebuilt at the seldom changes) is smaller
        self._ids = tuple(ledger.ledger_id for ledger in ledgers)
        self._current_created_s = clock()
        self._submitted_entries = 0
        self._submitted_bytes = 0
        self._lock: asyncio.Lock | None = None  # `_submit_lock`, made at the first use
        self._state = "open"
        self.record_sink: Callable[[bytes, bytes], None] | None = None  # see _write_record
        self._record_written: Completion[int] | None = None  # the newest record's write
        self._fenced: BaseException | None = None
        self._add_failed = False  # an add failed: roll over before the next one
        self.cursors: dict[str, ManagedCursor] = {}
        self._non_durable: dict[int, ManagedCursor] | None = None  # made at the first one
        # A tuple (add one with +=): one hook per topic, smaller than a list, and no copy to
        # iterate while a hook changes the hooks.
        self.on_entries_added: tuple[Callable[[Position], None], ...] = ()
        self._last_confirmed = self._initial_last_confirmed()
        self.terminated_position = terminated
        self._last_add: asyncio.Future[Any] | None = None
        self._queued_adds = 0  # `add_entries_soon` tasks not finished
        # Pulsar's ManagedLedgerMBean figures of the stats interval (None: no add yet).
        self.add_figures: AddFigures | None = None

    # -- opening -------------------------------------------------------------------------

    @classmethod
    async def open(cls, storage: LedgerStorage, name: str,
                   config: ManagedLedgerConfig | None = None,
                   clock: Callable[[], float] = time.time,
                   loader: EntryLoader | None = None) -> ManagedLedger:
        """Open (creating if needed) and recover the managed ledger `name`.

        Args:
            storage: the open storage holding the ledgers and the metadata.
            name: the ML name (the topic's persistence name).
            config: settings; the defaults when None.
            clock: wall-clock seconds (ledger ages and timestamps).
            loader: the worker for reads that need the disk (default: the process's).

        Raises:
            StorageError: the storage failed; nothing was changed in the record.
        """
        config = config or ManagedLedgerConfig()
        raw = storage.metadata.get(ml_key(name))
        record: dict[str, Any] = json.loads(raw) if raw else {"ledgers": [], "properties": {}}
        ledgers = [_Ledger.from_json(item) for item in record["ledgers"]]
        if ledgers:
            await _recover_last_ledger(storage, ledgers[-1], int(clock() * 1000))
        kept = [ledger for ledger in ledgers if ledger.entries > 0]
        dropped = [ledger.ledger_id for ledger in ledgers if ledger.entries == 0]
        known = {ledger.ledger_id for ledger in ledgers}
        orphans = [info.ledger_id for info in storage.list_ledgers(tagged=("ml", name))
                   if info.ledger_id not in known]
        # The record naming the new ledger is journaled after its creation: one group commit
        # makes both durable (a crash between them leaves an orphan, deleted at next open).
        new_id, created = storage.start_ledger({"ml": name})
        terminated = record.get("terminated")
        ml = cls(storage, name, config, clock, [*kept, _Ledger(new_id)],
                 record.get("properties") or EMPTY_MAP,
                 Position(*terminated) if terminated else None, loader)
        written = ml._write_record()
        await created
        await written  # open once durable
        ml._forget_record_write()
        for ledger_id in dropped + orphans:
            await delete_storage_ledger(storage, ledger_id)
        if orphans:
            log.info("ml %s: deleted orphan ledgers %s", name, orphans)
        for key, value in storage.metadata.scan(cursor_prefix(name)):
            cursor_name = key[len(cursor_prefix(name)):].decode()
            ml.cursors[cursor_name] = ManagedCursor.recover(ml, cursor_name, value)
        log.info("ml %s opened: ledgers %s, last %s", name, ml._ids, ml._last_confirmed)
        return ml

    @property
    def _submit_lock(self) -> asyncio.Lock:
        """Serialises adds, rollovers and closing. Made at the first use: the adds of most
        loaded topics go through `reserve` and never take it (one Lock less per topic)."""
        lock = self._lock
        if lock is None:
            lock = self._lock = asyncio.Lock()
        return lock

    def _submit_locked(self) -> bool:
        """Whether someone holds the submit lock (without making it)."""
        lock = self._lock
        return lock is not None and lock.locked()

    def _initial_last_confirmed(self) -> Position:
        for ledger in reversed(self._ledgers):
            if ledger.entries > 0:
                return Position(ledger.ledger_id, ledger.entries - 1)
        return Position(self._ledgers[-1].ledger_id, -1)

    def _write_record(self) -> Completion[int]:
        """Record the ledger list and properties through the journal: visible at once, durable
        before anything submitted to the storage after it (adds to a new ledger, deletes of
        trimmed ones), or handed to `record_sink` (a shutdown's records go together)."""
        data: dict[str, Any] = {"ledgers": [ledger.to_json() for ledger in self._ledgers],
                                "properties": self.properties or {}}
        if self.terminated_position is not None:
            data["terminated"] = list(self.terminated_position)
        encoded = json.dumps(data, separators=(",", ":")).encode()
        if self.record_sink is not None:
            self.record_sink(ml_key(self.name), encoded)
            return Completion.resolved(0)
        self._record_written = self.storage.metadata.apply_journaled(
            [(ml_key(self.name), encoded)])
        return self._record_written

    def _forget_record_write(self) -> None:
        """Drop the newest record's write once it succeeded: `record_durable` has nothing
        to wait for, and an idle ML keeps no completion (a failed one stays, to be raised)."""
        written = self._record_written
        if written is not None and written.done() and written.exception() is None:
            self._record_written = None

    async def record_durable(self) -> None:
        """Wait until the newest record (ledger list, properties) is durable.

        Raises:
            StorageError: its write failed (the record may or may not be on disk)."""
        if self._record_written is not None:
            await self._record_written

    async def terminate(self) -> Position:
        """Take no more entries from now on; returns the last entry's position (entry -1 of
        the current ledger when there is none), once every earlier add is durable and the
        termination is recorded. Idempotent.

        Raises:
            ManagedLedgerClosedError: closed or deleted; nothing changed.
            StorageError: recording failed; the ML refuses adds until it is reopened (the
                record may or may not say terminated).
        """
        self._check_open()
        if self.terminated_position is not None:
            return self.terminated_position
        async with self._submit_lock:
            self.terminated_position = Position(-1, -1)  # adds are refused from here on
            if self._last_add is not None:
                await asyncio.wait([self._last_add])
            self.terminated_position = self._last_confirmed
            await self._write_record()
        log.info("ml %s terminated at %s", self.name, self.terminated_position)
        return self.terminated_position

    def set_property(self, key: str, value: str | None) -> None:
        """Set (or remove, with None) an ML property, durable with the next group commit
        (`record_durable` waits for it)."""
        self._check_open()
        properties = dict(self.properties)  # (seldom: a copy, so that none is ever shared)
        if value is None:
            properties.pop(key, None)
        else:
            properties[key] = value
        self.properties = properties or EMPTY_MAP
        self._write_record()

    # -- state ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._state != "open"

    @property
    def current_ledger_id(self) -> int:
        return self._ledgers[-1].ledger_id

    def _check_open(self) -> None:
        if self._state != "open":
            raise ManagedLedgerClosedError(f"managed ledger {self.name} is {self._state}")

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- adds and rollover ---------------------------------------------------------------

    async def add_entry(self, data: bytes) -> Position:
        """Append an entry; returns its position once it is durable.

        Concurrent calls get increasing positions in call order.

        Raises:
            ManagedLedgerClosedError: the ML is closed or deleted; nothing written.
            ManagedLedgerFencedError: an earlier rollover failed; nothing written.
            ManagedLedgerTerminatedError: the ML is terminated; nothing written.
            StorageError: the storage refused or failed the add (see `storage.add_entry`).
        """
        outcome = (await self.add_entries([bytes(data)]))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def add_entries(self, entries: Sequence[bytes]) -> list[Position | BaseException]:
        """Append entries in order, as `add_entry` each, under one hold of the submit lock;
        returns each one's durable position or what `add_entry` would have raised for it
        (entries after one that could not be handed over get its error; not written).

        Raises:
            As `add_entry`, before anything is written.
        """
        assert entries
        self._check_writable()
        async with self._submit_lock:
            self._check_writable()
            if self._add_failed or self._current_is_full():
                await self._rollover()
            runs, error = await self._submit(entries)
            self._last_add = runs[-1].done if runs else self._last_add
            ledger = self._ledgers[-1]
            filled = self._current_is_full()
        outcomes: list[Position | BaseException] = []
        for run in runs:  # confirmed in order: mostly only the last is waited for
            if not run.done.done():
                await asyncio.wait([run.done])
            failed = run.done.exception()
            outcomes += [failed] * len(run.entries) if failed else run.done.result()
        if runs:
            self.forget_add(runs[-1].done)
        outcomes += [error] * (len(entries) - len(outcomes))  # type: ignore[list-item]
        # Only the add that filled the ledger rolls it over once durable, and only when no
        # one else holds the submit lock (a later add rolling over, or a close): waiting
        # for it would make this add return after later ones, and publishes must return
        # in order (send receipts, dedup's persisted sequence ids).
        if filled and self._ledgers[-1] is ledger and not self._submit_locked():
            await self.rollover_if_full()
        return outcomes

    def _check_writable(self) -> None:
        self._check_open()
        if self.terminated_position is not None:
            raise ManagedLedgerTerminatedError(f"managed ledger {self.name} is terminated")
        if self._fenced is not None:
            raise ManagedLedgerFencedError(
                f"managed ledger {self.name} is fenced after a failed rollover: "
                f"{self._fenced}") from self._fenced

    async def _submit(self, entries: Sequence[bytes]) -> tuple[list[_Run], Exception | None]:
        """Hand the entries to the storage in order (submit lock held; a full ledger rolls
        over between runs); returns the runs handed over and the error that stopped the
        handing over (None: none did)."""
        loop = asyncio.get_running_loop()
        runs: list[_Run] = []
        handed = 0
        try:
            while handed < len(entries):
                if runs and (self._add_failed or self._current_is_full()):
                    await self._rollover()
                handed = await self._submit_runs(loop, entries, handed, runs)
        except Exception as exc:
            return runs, exc
        return runs, None

    async def _submit_runs(self, loop: asyncio.AbstractEventLoop, entries: Sequence[bytes],
                           handed: int, runs: list[_Run]) -> int:
        """Hand over entries from `handed` on into the current ledger, a run at a time
        (`_run_length`), until it is full or the cache is (after the first run: else it
        waits for space on the loop, so only this ML's adds wait); the runs are bounced to
        the loop as one. Returns how many entries are handed over in all."""
        ledger = self._ledgers[-1]
        batch: list[_Run] = []
        try:
            while handed < len(entries) and not (batch and self._current_is_full()):
                count, size = self._run_length(entries, handed)
                chunk = entries[handed:handed + count]
                completion = self.storage.try_add_entries(ledger.ledger_id, chunk)
                if completion is None:
                    if batch:
                        break  # what is handed over goes first
                    completion = await add_when_cache_has_space(
                        self.storage, ledger.ledger_id, chunk, self.name)
                self._submitted_entries += count
                self._submitted_bytes += size
                run = _Run(chunk, size, completion, loop.create_future(), time.perf_counter_ns())
                batch.append(run)
                runs.append(run)
                handed += count
        finally:
            if batch:
                in_order_on_loop(loop, [run.completion for run in batch],
                                 lambda index: self._on_run_done(ledger, batch[index]))
        return handed

    def _run_length(self, entries: Sequence[bytes], start: int) -> tuple[int, int]:
        """How many entries from `start` go to the storage as one run, and their bytes: at
        least one, then while the ledger would not be full after them (as single adds would
        roll over), within `ADD_RUN_ENTRIES_MAX` and `ADD_RUN_BYTES_MAX`, and never with an
        entry the storage refuses as too large (that one goes alone, and fails alone)."""
        size_max = self.storage.config.entry_size_bytes_max
        count, size = 1, len(entries[start])
        while start + count < len(entries) and count < ADD_RUN_ENTRIES_MAX:
            following = len(entries[start + count])
            if (size > size_max or following > size_max or size + following > ADD_RUN_BYTES_MAX
                    or self._is_full(self._submitted_entries + count,
                                     self._submitted_bytes + size)):
                break
            count += 1
            size += following
        return count, size

    def _on_run_done(self, ledger: _Ledger, run: _Run) -> None:
        error = run.completion.exception()
        if error is not None:
            self._add_failed = True
            if not run.done.done():
                run.done.set_exception(error)
            return
        latency_us = (time.perf_counter_ns() - run.submitted_ns) // 1000
        positions = self.confirm_run(ledger, run.entries, run.size, run.completion.result(),
                                     latency_us)
        if not run.done.done():
            run.done.set_result(positions)

    def confirm_run(self, ledger: _Ledger, entries: Sequence[bytes], size: int, last: int,
                    latency_us: int) -> list[Position]:
        """A run handed over to `ledger` is durable up to entry `last`, `latency_us` after it
        was handed over: advance the entry count, size and `last_confirmed_position`, call
        the `on_entries_added` hooks; the run's positions."""
        first = last - len(entries) + 1
        assert first == ledger.entries, "adds of a ledger complete in order"
        ledger.entries = last + 1
        ledger.size += size
        if self.add_figures is None:
            self.add_figures = AddFigures()
        self.add_figures.record(latency_us, entries)
        ledger_id, new = ledger.ledger_id, tuple.__new__  # Position(...) without its __new__
        if first == last:  # one entry (many producers, each a SEND a read): no comprehension
            positions = [new(Position, (ledger_id, last))]
        else:
            positions = [new(Position, (ledger_id, entry)) for entry in range(first, last + 1)]
        assert positions[0] > self._last_confirmed
        self._last_confirmed = positions[-1]
        for hook in self.on_entries_added:
            hook(positions[-1])
        return positions

    def add_entries_soon(self, entries: Sequence[bytes],
                         ) -> asyncio.Task[list[Position | BaseException]]:
        """`add_entries` as a task started now: `reserve` refuses until it has finished."""
        self._queued_adds += 1
        task = asyncio.ensure_future(self.add_entries(entries))
        task.add_done_callback(self._queued_add_done)
        return task

    def _queued_add_done(self, _: object) -> None:
        self._queued_adds -= 1

    def reserve(self, count: int, size: int) -> _Ledger | None:
        """For an `AddGroup`: take `count` entries of `size` bytes as handed over to the
        current ledger now, and return it, when an add could hand them over at once as one
        run: open and writable, no add queued and no one holding the submit lock, no
        rollover due before or after them. Else None, nothing changed. The caller bounds
        them, hands them over (`storage.try_add_runs`, cut into runs within
        `ADD_RUN_ENTRIES_MAX` and `ADD_RUN_BYTES_MAX`) before it yields, or gives them back
        (`unreserve`)."""
        # Not full after them means not full now either: fullness only grows with entries.
        if (self._state != "open" or self.terminated_position is not None or self._fenced
                or self._add_failed or self._queued_adds or self._submit_locked()
                or self._is_full(self._submitted_entries + count, self._submitted_bytes + size)):
            return None
        self._submitted_entries += count
        self._submitted_bytes += size
        return self._ledgers[-1]

    def unreserve(self, count: int, size: int) -> None:
        """Give back a `reserve` that was not handed over."""
        self._submitted_entries -= count
        self._submitted_bytes -= size

    def handed_over(self, confirmed: asyncio.Future[Any]) -> None:
        """Reserved runs were handed over; `confirmed` finishes once they are confirmed
        (or failed: `run_failed`), what `terminate` waits for."""
        self._last_add = confirmed

    def forget_add(self, done: asyncio.Future[Any]) -> None:
        """`done` has finished: unless a later add was handed over since, there is nothing
        for `terminate` to wait for (and an idle ledger keeps no future, nor the completion
        of a record written since)."""
        if self._last_add is done:
            self._last_add = None
        if self._record_written is not None:
            self._forget_record_write()

    def run_failed(self) -> None:
        """A reserved run failed in the storage: the next add rolls over first."""
        self._add_failed = True

    def _current_is_full(self) -> bool:
        """Pulsar's `currentLedgerIsFull`, for a ledger that has entries."""
        return self._is_full(self._submitted_entries, self._submitted_bytes)

    def _is_full(self, entries: int, size: int) -> bool:
        """`_current_is_full` once the current ledger holds `entries` of `size` bytes."""
        if entries == 0 or self._state != "open" or self._fenced:
            return False
        config = self.config
        age_s = self.clock() - self._current_created_s
        full = (entries >= config.max_entries_per_ledger
                or size >= config.max_size_per_ledger_bytes
                or age_s >= config.max_ledger_rollover_time_s)
        if not full:
            return False
        return config.min_ledger_rollover_time_s <= 0 or age_s > config.min_ledger_rollover_time_s

    async def rollover_if_full(self) -> bool:
        """Roll over when the current ledger is full (the owner calls this periodically so
        that an idle ledger is closed by age). Returns whether it rolled over.

        Raises:
            StorageError: the rollover failed; the ML is then fenced.
        """
        async with self._submit_lock:
            if not self._current_is_full():
                return False
            await self._rollover()
            return True

    async def _rollover(self) -> None:
        """Close the current ledger and start the next one. Submit lock held."""
        assert self._submit_locked()
        old = self._ledgers[-1]
        try:
            last = await after_earlier_callbacks(self.storage.close_ledger(old.ledger_id))
            new_id = await self.storage.create_ledger({"ml": self.name})
        except StorageFullError as error:
            log.warning("ml %s: rollover of ledger %d failed, retried by the next add: %s",
                        self.name, old.ledger_id, error)
            self._add_failed = True
            raise
        except StorageError as error:
            self._fenced = error
            log.error("ml %s: rollover of ledger %d failed: %s", self.name, old.ledger_id, error)
            raise
        assert self._state == "open"
        now_ms = self._now_ms()
        if self._add_failed:
            self._add_failed = False
            if last + 1 != old.entries:
                log.warning("ml %s: ledger %d closed after failed adds; keeping its %d "
                            "confirmed entries (storage holds %d)", self.name,
                            old.ledger_id, old.entries, last + 1)
        else:
            assert last + 1 == self._submitted_entries == old.entries, "close waits for adds"
        old.timestamp_ms = now_ms
        if old.entries == 0:  # only after failed adds: the list keeps no empty ledger
            self._ledgers.pop()
            self._ids = self._ids[:-1]
            delete_in_background(self.storage, old.ledger_id)
            if self._last_confirmed.ledger_id == old.ledger_id:
                self._last_confirmed = Position(new_id, -1)
        self._ledgers.append(_Ledger(new_id))
        self._ids += (new_id,)
        self._current_created_s = self.clock()
        self._submitted_entries = 0
        self._submitted_bytes = 0
        self._write_record()
        log.info("ml %s: rolled over ledger %d (%d entries) to %d", self.name, old.ledger_id,
                 old.entries, new_id)
        self.trim_consumed_ledgers(now_ms)

    # -- cursors -------------------------------------------------------------------------

    async def open_cursor(self, name: str, initial_position: InitialPosition = "latest",
                          properties: dict[str, int] | None = None) -> ManagedCursor:
        """The durable cursor `name`: the existing one (its initial position and properties
        are then ignored), or a new one created at `initial_position` (§4.6) and persisted
        before this returns.

        Raises:
            ManagedLedgerClosedError: the ML is closed.
            StorageError, ValueError: the new cursor's record could not be written (ValueError:
                its key is too long for the metadata store); the new cursor is forgotten
                again, so nothing is left behind.
        """
        self._check_open()
        existing = self.cursors.get(name)
        if existing is not None:
            await existing.flush()
            return existing
        cursor = ManagedCursor.create(self, name, initial_position, durable=True,
                                      properties=properties)
        self.cursors[name] = cursor
        try:
            await cursor.flush()
        except BaseException:
            if self.cursors.get(name) is cursor:  # a cursor never persisted is no cursor
                del self.cursors[name]
                cursor.deleted = True  # whoever still holds it writes nothing more
            raise
        return cursor

    def new_non_durable_cursor(self, start: Position | None = None,
                               initial_position: InitialPosition = "latest",
                               name: str = "") -> ManagedCursor:
        """A memory-only cursor (readers, §4.6) that never holds back trimming. `start` is the
        reader's start message position: a real one makes the reader start AT it; EARLIEST
        starts at the first entry; None, LATEST or a position beyond the last entry let
        `initial_position` decide."""
        self._check_open()
        cursor = ManagedCursor.create_non_durable(self, name, start, initial_position)
        if self._non_durable is None:
            self._non_durable = {}
        self._non_durable[id(cursor)] = cursor
        return cursor

    def release_non_durable_cursor(self, cursor: ManagedCursor) -> None:
        """Forget a non-durable cursor (its last consumer left)."""
        assert not cursor.durable
        if self._non_durable is not None:
            self._non_durable.pop(id(cursor), None)
            if not self._non_durable:
                self._non_durable = None

    @property
    def non_durable_cursors(self) -> list[ManagedCursor]:
        return list(self._non_durable.values()) if self._non_durable else []

    async def delete_cursor(self, name: str) -> None:
        """Delete a durable cursor and its record (durably), then trim what it held back.
        Deleting a cursor that does not exist is a no-op."""
        cursor = self.cursors.pop(name, None)
        if cursor is None:
            return
        await cursor.delete_record()
        if self._state == "open":
            self.trim_consumed_ledgers()

    def on_cursor_persisted(self, cursor: ManagedCursor, previous: Position,
                            current: Position) -> None:
        """A durable cursor's persisted mark-delete moved from `previous` to `current`."""
        if self._state != "open" or cursor.name not in self.cursors:
            return
        end_of_ledger = current.entry_id + 1 >= self.ledger_entries(current.ledger_id)
        if current.ledger_id != previous.ledger_id or end_of_ledger:
            self.trim_consumed_ledgers()

    # -- trimming ------------------------------------------------------------------------

    def _trim_boundary(self) -> int:
        """Index of the first ledger that is NOT a trimming candidate."""
        current_index = len(self._ledgers) - 1
        if not self.cursors:
            return current_index
        # The lower of the in-memory and the persisted mark-delete: a crash must not find its
        # cursor pointing into a deleted ledger, and a reset may have moved it back.
        slowest = min(min(c.mark_delete_position, c.persisted_mark_delete_position)
                      for c in self.cursors.values())
        index = bisect_left(self._ids, slowest.ledger_id)
        if (index < current_index and self._ids[index] == slowest.ledger_id
                and slowest.entry_id >= self._ledgers[index].entries - 1):
            index += 1
        return min(index, current_index)

    def trim_consumed_ledgers(self, now_ms: int | None = None) -> list[int]:
        """Delete consumed ledgers that retention no longer keeps (§7.1).

        Args:
            now_ms: the wall-clock time to judge retention by (default: the clock's).

        Returns:
            The ids of the ledgers deleted (their storage deletes are under way).
        """
        if self._state != "open":
            return []
        now_ms = self._now_ms() if now_ms is None else now_ms
        doomed = self._trim_candidates(now_ms)
        if not doomed:
            return []
        kept_from = Position(self._ids[len(doomed)], -1)
        for cursor in self.non_durable_cursors:
            cursor.move_past_trimmed(kept_from)
        for cursor in self.cursors.values():
            assert cursor.mark_delete_position >= self.previous_position(kept_from)
        del self._ledgers[:len(doomed)]
        self._ids = self._ids[len(doomed):]
        self._write_record()
        for ledger_id in doomed:
            delete_in_background(self.storage, ledger_id)
        log.info("ml %s: trimmed ledgers %s", self.name, doomed)
        return doomed

    def _trim_candidates(self, now_ms: int) -> list[int]:
        config = self.config
        retention_ms = config.retention_time_minutes * 60_000
        retention_bytes = config.retention_size_mb * MiB
        total = self.total_size_bytes
        size_deleted = 0
        doomed: list[int] = []
        for ledger in self._ledgers[:self._trim_boundary()]:
            size_deleted += ledger.size
            expired = retention_ms >= 0 and now_ms - ledger.timestamp_ms > retention_ms
            over_quota = retention_bytes >= 0 and total - size_deleted >= retention_bytes
            if not (expired or over_quota):
                break
            doomed.append(ledger.ledger_id)
        return doomed

    # -- closing and deleting ------------------------------------------------------------

    async def close(self) -> None:
        """Flush the cursors, close the current ledger and record it (dropping it when
        empty). Idempotent. Storage errors are logged: a later open recovers."""
        if self._state != "open":
            return
        async with self._submit_lock:
            self._state = "closing"
            try:
                for cursor in list(self.cursors.values()):
                    await cursor.flush()
                await self._close_current_ledger()
            except StorageError as error:
                log.warning("ml %s: close did not finish cleanly (%s); the next open recovers",
                            self.name, error)
            finally:
                self._state = "closed"

    async def _close_current_ledger(self) -> None:
        current = self._ledgers[-1]
        last = await close_storage_ledger(self.storage, current.ledger_id)  # batched
        assert last + 1 == current.entries or self._add_failed
        current.timestamp_ms = self._now_ms()
        empty = current.entries == 0 and len(self._ledgers) > 1
        if empty:
            self._ledgers.pop()
            self._ids = self._ids[:-1]
        await self._write_record()  # closed once durable
        if empty:
            await delete_storage_ledger(self.storage, current.ledger_id)

    async def delete(self) -> None:
        """Delete the cursors, the ML record and every ledger, in that order (a crash
        leaves orphan ledgers, which the next open of the same name deletes)."""
        if self._state == "deleted":
            return
        async with self._submit_lock:
            self._state = "deleted"
            for name in list(self.cursors):
                await self.cursors.pop(name).delete_record()
            self._non_durable = None
            self.storage.metadata.apply_journaled([(ml_key(self.name), None)])
            for ledger_id in list(self._ids):
                await delete_storage_ledger(self.storage, ledger_id)


async def _recover_last_ledger(storage: LedgerStorage, ledger: _Ledger, now_ms: int) -> None:
    """Close the previous run's last ledger at its last entry and learn its size."""
    try:
        last = await storage.close_ledger(ledger.ledger_id)
    except LedgerNotFoundError:
        log.warning("ml ledger %d is gone from storage; dropping it", ledger.ledger_id)
        ledger.entries = 0
        return
    entries = last + 1
    if entries != ledger.entries or (entries > 0 and ledger.size == 0):
        ledger.size = _ledger_size(storage, ledger.ledger_id, entries)
    ledger.entries = entries
    if ledger.timestamp_ms == 0:
        ledger.timestamp_ms = now_ms


def _ledger_size(storage: LedgerStorage, ledger_id: int, entries: int) -> int:
    """Total bytes of a closed ledger, read back (its size was not recorded)."""
    size = 0
    for first in range(0, entries, RECOVERY_READ_ENTRIES_MAX):
        last = min(first + RECOVERY_READ_ENTRIES_MAX, entries) - 1
        size += sum(len(data) for data in storage.read_entries(ledger_id, first, last))
    return size
