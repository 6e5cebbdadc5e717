"""`LedgerLayout`: a managed ledger's list of ledgers, and positions in it.

The base of `ManagedLedger` (through `LedgerReads`): the figures over its ledgers and the
position arithmetic, memory only. The layout is the list `_ledgers` (oldest first; the last
is the current ledger), the tuple of their ids `_ids` for bisect, and `_last_confirmed`, all
kept by `ManagedLedger` (see its theory of operation for what they hold and when they change).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from ._ml_records import LedgerRecord, _Ledger
from ._position import Position

__all__ = ["LedgerLayout"]


class LedgerLayout:
    """Positions over a managed ledger's ledgers (its base class; memory only)."""

    __slots__ = ()

    _ledgers: list[_Ledger]
    _ids: tuple[int, ...]
    _last_confirmed: Position

    @property
    def last_confirmed_position(self) -> Position:
        """The last durable entry; `(current, -1)` when the ML has none."""
        return self._last_confirmed

    @property
    def total_size_bytes(self) -> int:
        return sum(ledger.size for ledger in self._ledgers)

    @property
    def number_of_entries(self) -> int:
        return sum(ledger.entries for ledger in self._ledgers)

    def ledgers(self) -> list[LedgerRecord]:
        """Every ledger, oldest first; the last one is the current ledger."""
        return [LedgerRecord(ledger.ledger_id, ledger.entries, ledger.size, ledger.timestamp_ms)
                for ledger in self._ledgers]
    # -- position arithmetic -------------------------------------------------------------

    def _ledger_index(self, ledger_id: int) -> int | None:
        index = bisect_left(self._ids, ledger_id)
        if index < len(self._ids) and self._ids[index] == ledger_id:
            return index
        return None

    def has_ledger(self, ledger_id: int) -> bool:
        return self._ledger_index(ledger_id) is not None

    def ledger_entries(self, ledger_id: int) -> int:
        """Confirmed entries of a ledger (0 for one that is not in the list)."""
        index = self._ledger_index(ledger_id)
        return 0 if index is None else self._ledgers[index].entries

    def write_position(self) -> Position:
        """Where the next entry goes: `(current, its entry count)`."""
        current = self._ledgers[-1]
        return Position(current.ledger_id, current.entries)

    def is_valid_position(self, position: Position) -> bool:
        """Whether `position` is a confirmed entry of this ML."""
        return 0 <= position.entry_id < self.ledger_entries(position.ledger_id)

    def first_position(self) -> Position:
        """The position before the first entry: `(first ledger, -1)` (Pulsar's
        `getFirstPosition`)."""
        return Position(self._ids[0], -1)

    def first_entry_at_or_after(self, position: Position) -> Position:
        """The lowest confirmed entry >= `position`; the write position when there is none
        below it; `position` itself when it is beyond the write position."""
        write = self.write_position()
        if position >= write:
            return position
        index = bisect_left(self._ids, position.ledger_id)
        if index < len(self._ids) and self._ids[index] == position.ledger_id:
            entry_id = max(position.entry_id, 0)
            if entry_id < self._ledgers[index].entries:
                return Position(position.ledger_id, entry_id)
            index += 1
        for ledger in self._ledgers[index:]:
            if ledger.entries > 0:
                return Position(ledger.ledger_id, 0)
        return write

    def next_position(self, position: Position) -> Position:
        """The position right after `position` in the ledger layout (always greater)."""
        following = self.first_entry_at_or_after(Position(position.ledger_id,
                                                          position.entry_id + 1))
        assert following > position
        return following

    def next_valid_position(self, position: Position) -> Position:
        """`next_position`, capped at the write position (Pulsar's `getNextValidPosition`)."""
        return min(self.next_position(position), self.write_position())

    def previous_position(self, position: Position) -> Position:
        """The entry before `position`: `(l, e-1)`; for entry 0 the last entry of the previous
        ledger with entries; `(first ledger, -1)` when there is none."""
        if position.entry_id > 0:
            return Position(position.ledger_id, position.entry_id - 1)
        index = bisect_left(self._ids, position.ledger_id) - 1
        while index >= 0:
            ledger = self._ledgers[index]
            if ledger.entries > 0:
                return Position(ledger.ledger_id, ledger.entries - 1)
            index -= 1
        return self.first_position()

    def entries_between(self, first: Position, last: Position) -> int:
        """How many confirmed entries p satisfy first <= p <= last."""
        if last < first:
            return 0
        start = bisect_left(self._ids, first.ledger_id)
        stop = bisect_right(self._ids, last.ledger_id)
        total = 0
        for ledger in self._ledgers[start:stop]:
            low = max(first.entry_id, 0) if ledger.ledger_id == first.ledger_id else 0
            high = ledger.entries - 1
            if ledger.ledger_id == last.ledger_id:
                high = min(high, last.entry_id)
            if high >= low:
                total += high - low + 1
        return total

    def position_after_n(self, position: Position, count: int) -> Position:
        """The `count`-th confirmed entry after `position` (count >= 1), or the last confirmed
        entry when there are fewer."""
        assert count >= 1
        at = self.next_position(position)
        while at <= self._last_confirmed:
            available = self.ledger_entries(at.ledger_id) - at.entry_id
            assert available > 0
            if count <= available:
                return Position(at.ledger_id, at.entry_id + count - 1)
            count -= available
            at = self.next_position(Position(at.ledger_id, at.entry_id + available - 1))
        return max(self._last_confirmed, position)

    def estimated_size_after(self, position: Position) -> int:
        """Bytes of the entries after `position` (whole ledgers exactly, the ledger holding
        `position` pro rata by its average entry size): the backlog size estimate."""
        total = 0
        for ledger in self._ledgers:
            if ledger.ledger_id > position.ledger_id:
                total += ledger.size
            elif ledger.ledger_id == position.ledger_id and ledger.entries > 0:
                remaining = ledger.entries - 1 - position.entry_id
                total += max(remaining, 0) * ledger.size // ledger.entries
        return total
