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
  only by a round that would still take its entries (else it is dropped with them).

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


class SubscriptionReads:
    """The read state of one subscription (see the module comment)."""

    __slots__ = ("_kick", "_loaded", "closed", "cursor", "in_flight")

    def __init__(self, cursor: ManagedCursor, kick: Callable[[], None]):
        self.cursor = cursor
        self._kick = kick
        self.in_flight: asyncio.Future[Raw] | None = None
        self._loaded: _Loaded | None = None
        self.closed = False

    def read_new(self, max_entries: int, max_bytes: int) -> Raw:
        """Up to `max_entries` unacknowledged entries from the read position (moved past
        them), within `max_bytes`.

        Raises:
            ReadPending: the read needs the disk, or a load is in flight.
            The storage's error for the load that planned these entries.
        """
        cursor = self.cursor
        loaded = self._take("new")
        if loaded is not None and loaded.epoch == cursor.read_epoch:
            if loaded.error is not None:
                raise loaded.error
            assert loaded.entries, "a load of planned runs returns at least one entry"
            raw, rest = loaded.entries[:max_entries], loaded.entries[max_entries:]
            if raw:
                cursor.advance_past(raw[-1][0])
            if rest:
                self._loaded = _Loaded("new", cursor.read_epoch, rest, None)
            return [(p, data) for p, data in raw if not cursor.is_acked(p)]
        runs = cursor.plan_read(max_entries)
        if not runs:
            return []
        raw = self.cursor.ml.read_cached(runs, max_bytes)
        if not raw:
            self._start("new", cursor.read_epoch, runs, max_bytes)
        cursor.advance_past(raw[-1][0])
        return raw

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
        return loaded

    def _start(self, kind: Literal["new", "replay"], epoch: int, runs: list[Run],
               max_bytes: int, asked: frozenset[Position] = frozenset()) -> None:
        """Hand `runs` to the loader. Always raises ReadPending."""
        future = self.cursor.ml.load(runs, max_bytes)
        self.in_flight = future

        def finished(done: asyncio.Future[Raw]) -> None:
            self.in_flight = None
            if self.closed or done.cancelled():
                return
            error = done.exception()
            entries = [] if error is not None else done.result()
            self._loaded = _Loaded(kind, epoch, entries, error, asked)
            self._kick()

        future.add_done_callback(finished)
        raise ReadPending()

    def close(self) -> None:
        self.closed = True
        self._loaded = None
