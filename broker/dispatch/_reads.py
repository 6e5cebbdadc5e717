"""A subscription's reads: from memory on the loop, or loaded off it, in order.

Theory of operation
-------------------
A dispatch round reads either new entries (from the cursor's read position) or replay
positions (redeliveries, delayed messages due, entries nobody could take). Both are planned
as runs (`ledger._loader`) and served at once when the storage has them in memory. When a
read needs the disk, it goes to the managed ledger's `EntryLoader` and the round raises
`ReadPending`; the finished load is kept here and the subscription is kicked, so that the
round runs again and takes it. What keeps delivery in order:

* one load at a time per subscription, and while it is in flight EVERY read of the
  subscription waits (raises `ReadPending`), hot ones included: nothing can overtake it;
* a loaded read of new entries is taken only while the cursor's `read_epoch` is the one it
  was planned at (any change of the read position — a rewind, a seek, a reset, a
  redelivery, an ack passing it — bumps it): otherwise it is dropped and the round plans
  again from the current state. What is taken moves the read position past it; a rest
  beyond the round's current limit stays for the next round (under the new epoch);
* a loaded replay is re-validated against the positions the round asks for: it serves the
  longest prefix of them it holds, in position order, and the round removes from the replay
  queue only what was served (or skipped); an answer that holds none of them is dropped;
* entries acknowledged meanwhile are skipped at take time, and a load's error is raised
  only by a round that would still take its entries (else it is dropped with them). A
  failed load of several new entries is not raised: the subscription then reads the entries
  that load covered one at a time (its reads ahead too), so the entries before a damaged one
  are delivered and the damaged one's own read raises (Pulsar too drops its read size to one
  after a failed read).

Read-ahead: a round that took new entries (from memory or from a load, leaving nothing
loaded) starts the load of the next ones when they are not in memory, without waiting for
the consumer's next permits; the round after it takes that load as above. A consumer
catching up on a backlog on disk so finds its next entries loaded when its permits come,
instead of waiting for the disk with its receiver queue running dry. What read-aheads hold
counts against the loader's `read_ahead_bytes_max` (a broker-wide budget, reserved at the
load's bound while it runs, then what it loaded, given back when taken or dropped); beyond
it no read-ahead starts.

The loaded entries held here are at most one load's (`dispatcher_max_read_size_bytes`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..ledger._cursor import ManagedCursor
from ..ledger._loader import Run, runs_of
from ..ledger._position import Position
from ._dispatcher import ReadPending

__all__ = ["SubscriptionReads"]

Raw = list[tuple[Position, bytes]]


@dataclass
class _Loaded:
    kind: Literal["new", "replay"]
    epoch: int  # the cursor's read epoch it was planned at ("new")
    entries: Raw
    error: BaseException | None
    asked: frozenset[Position] = frozenset()  # the positions a replay load was for
    planned: int = 0  # the entries its runs covered


class SubscriptionReads:
    """The read state of one subscription (see the module comment)."""

    __slots__ = ("_kick", "_loaded", "_reserved", "_singles_left", "closed", "cursor",
                 "in_flight")

    def __init__(self, cursor: ManagedCursor, kick: Callable[[], None]):
        self.cursor = cursor
        self._kick = kick
        self.in_flight: asyncio.Future[Raw] | None = None
        self._loaded: _Loaded | None = None
        self._reserved = 0  # bytes of the loader's read-ahead budget this subscription holds
        self._singles_left = 0  # after a failed load of new entries: see `read_new`
        self.closed = False

    def read_new(self, max_entries: int, max_bytes: int) -> Raw:
        """Up to `max_entries` unacknowledged entries from the read position (moved past
        them), within `max_bytes`. When what follows them needs the disk, its load starts
        now (`_read_ahead`).

        Raises:
            ReadPending: the read needs the disk, or a load is in flight.
            The storage's error for the load that planned these entries.
        """
        cursor = self.cursor
        loaded = self._take("new")
        if self._singles_left:
            max_entries = 1
        if loaded is not None and loaded.epoch == cursor.read_epoch:
            if loaded.error is not None and loaded.planned > 1:
                # Which entry failed is not known: read its window one entry at a time, so
                # that every entry before the failing one is delivered and its read raises.
                self._singles_left = loaded.planned
                return self.read_new(1, max_bytes)
            if loaded.error is not None:
                raise loaded.error
            assert loaded.entries, "a load of planned runs returns at least one entry"
            raw, rest = loaded.entries[:max_entries], loaded.entries[max_entries:]
            if raw:
                cursor.advance_past(raw[-1][0])
            if rest:
                self._loaded = _Loaded("new", cursor.read_epoch, rest, None)
            self._singles_left = max(0, self._singles_left - len(raw))
            if not rest:
                self._read_ahead(max_entries, max_bytes)
            if not cursor.individually_deleted and raw and raw[0][0] > \
                    cursor.mark_delete_position:
                return raw  # none acknowledged meanwhile (they are sorted)
            return [(p, data) for p, data in raw if not cursor.is_acked(p)]
        runs = cursor.plan_read(max_entries)
        if not runs:
            return []
        raw = self.cursor.ml.read_cached(runs, max_bytes)
        if not raw:
            self._start("new", cursor.read_epoch, runs, max_bytes)
        cursor.advance_past(raw[-1][0])
        self._singles_left = max(0, self._singles_left - len(raw))
        self._read_ahead(max_entries, max_bytes)
        return raw

    def _read_ahead(self, max_entries: int, max_bytes: int) -> None:
        """After a round took its entries: when the next `max_entries` ones are not in memory,
        start their load now, so that the consumer's next permits find them loaded rather
        than wait for the disk (its receiver queue keeps being refilled while it works
        through what it holds). The load is held like any other (one per subscription, taken
        only under the read epoch it was planned at)."""
        if self.in_flight is not None or self._loaded is not None or self.closed:
            return
        cursor = self.cursor
        loader = cursor.ml.loader
        if loader.read_ahead_bytes + max_bytes > loader.read_ahead_bytes_max:
            return  # the broker's budget for read-aheads is spent: load when asked
        try:
            runs = cursor.plan_read(max_entries)
            if not runs:
                return  # nothing more yet
            ledger_id, first, _ = runs[0]
            if cursor.ml.read_cached([(ledger_id, first, first)], 1):
                return  # the next entry is in memory (the round that reads it loads the rest)
        except AssertionError:
            raise
        except Exception:  # the round that reads these entries meets it
            return  # (raising here would lose the entries this round already took)
        loader.read_ahead_bytes += max_bytes  # until it is loaded: then what it holds
        self._reserved = max_bytes
        self._begin("new", cursor.read_epoch, runs, max_bytes)

    def _release(self) -> None:
        """The read-ahead's entries were taken or dropped: its budget goes back."""
        if self._reserved:
            self.cursor.ml.loader.read_ahead_bytes -= self._reserved
            self._reserved = 0
            assert self.cursor.ml.loader.read_ahead_bytes >= 0

    def read_positions(self, positions: list[Position],
                       max_bytes: int) -> tuple[Raw, list[Position]]:
        """Entries at `positions` (sorted): (what to dispatch, the positions dealt with —
        those served and those skipped as acknowledged or beyond the last entry). The rest
        stays for a later round.

        Raises:
            ReadPending: the first wanted entry needs the disk, or a load is in flight.
            The storage's error for the load of these positions.
        """
        cursor = self.cursor
        last = self.cursor.ml.last_confirmed_position
        skipped = [p for p in positions if cursor.is_acked(p) or p > last]
        wanted = [p for p in positions if not (cursor.is_acked(p) or p > last)]
        loaded = self._take("replay")
        if not wanted:
            return [], skipped
        if loaded is not None:
            held = dict(loaded.entries)
            if wanted[0] in held:
                served: Raw = []
                for position in wanted:
                    if position not in held:
                        break
                    served.append((position, held[position]))
                return served, skipped + [p for p, _ in served]
            if loaded.error is not None and wanted[0] in loaded.asked:
                raise loaded.error
        runs = runs_of(wanted)
        raw = self.cursor.ml.read_cached(runs, max_bytes)
        if not raw:
            self._start("replay", cursor.read_epoch, runs, max_bytes, frozenset(wanted))
        return raw, skipped + [p for p, _ in raw]

    def _take(self, kind: Literal["new", "replay"]) -> _Loaded | None:
        """The finished load of `kind`, or None (one of the other kind stays, for a later
        round: a replay may come between a load of new entries and its use).

        Raises:
            ReadPending: a load is in flight.
        """
        if self.in_flight is not None:
            raise ReadPending()
        loaded = self._loaded
        if loaded is None or loaded.kind != kind:
            return None
        self._loaded = None
        self._release()
        return loaded

    def _start(self, kind: Literal["new", "replay"], epoch: int, runs: list[Run],
               max_bytes: int, asked: frozenset[Position] = frozenset()) -> None:
        """Hand `runs` to the loader. Always raises ReadPending."""
        self._begin(kind, epoch, runs, max_bytes, asked)
        raise ReadPending()

    def _begin(self, kind: Literal["new", "replay"], epoch: int, runs: list[Run],
               max_bytes: int, asked: frozenset[Position] = frozenset()) -> None:
        """Hand `runs` to the loader; its result is kept for a later round, which is kicked."""
        future = self.cursor.ml.load(runs, max_bytes)
        self.in_flight = future

        planned = sum(last - first + 1 for _, first, last in runs)

        def finished(done: asyncio.Future[Raw]) -> None:
            self.in_flight = None
            if self.closed or done.cancelled():
                self._release()
                return
            error = done.exception()
            entries = [] if error is not None else done.result()
            if self._loaded is not None:  # a replay's load replaces a read-ahead's
                self._release()
            elif self._reserved:  # a read-ahead holds what it loaded, not its bound
                held = sum(len(data) for _, data in entries)
                self.cursor.ml.loader.read_ahead_bytes += held - self._reserved
                self._reserved = held
            self._loaded = _Loaded(kind, epoch, entries, error, asked, planned)
            self._kick()

        future.add_done_callback(finished)

    def close(self) -> None:
        self.closed = True
        self._loaded = None
        if self.in_flight is None:
            self._release()  # else its `finished` does
