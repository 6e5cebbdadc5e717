"""`RangeSet`: the individually acknowledged positions of a cursor, as coalesced ranges.

Theory of operation
-------------------
Pulsar keeps a cursor's acks above its mark-delete position as open-closed ranges `(prev, pos]`
and merges ranges that touch. We store the same set as sorted, disjoint, *inclusive* ranges
`[first, last]` of real entry positions, in two parallel lists (`firsts`, `lasts`) searched with
`bisect` (while empty, both are the shared empty tuple: a cursor without ack holes, one per
loaded topic, holds no lists). Whether two ranges touch depends on the ledger layout — entry e
of ledger L is followed by e + 1, and the last entry of L by entry 0 of the next ledger that
has entries — so the set asks a `PositionLayout` (the managed ledger) for `next_position` and
for entry counts.

Invariants, checked by `check()` and by asserts on the mutating paths:

* ranges are sorted and disjoint: `lasts[i] < firsts[i + 1]`;
* no two neighbours touch: `next_position(lasts[i]) != firsts[i + 1]` (they would have merged);
* `entry_count` equals the number of entries the ranges cover.

Adjacency is decided when a range is inserted. Both ends of an ack exist by then (acks are of
confirmed entries), so a later rollover cannot make two stored ranges adjacent after the fact:
no range can start in a ledger that did not exist yet.

The serialized form (`to_list`) is a list of `[first_ledger, first_entry, last_ledger,
last_entry]`; `open_closed()` gives Pulsar's `(prev, last]` view for stats, where prev is the
literal `(ledger, first_entry - 1)`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Final, Protocol

from ._position import Position

__all__ = ["PositionLayout", "RangeSet"]

_NO_RANGES: Final[tuple[Position, ...]] = ()  # `firsts` and `lasts` of every empty set


class PositionLayout(Protocol):
    """What a `RangeSet` needs to know about the ledger layout."""

    def next_position(self, position: Position) -> Position:
        """The position right after `position`."""
        ...

    def entries_between(self, first: Position, last: Position) -> int:
        """How many existing entries p satisfy first <= p <= last."""
        ...


class RangeSet:
    """Sorted, coalesced, inclusive ranges of entry positions."""

    __slots__ = ("_entries", "_firsts", "_lasts", "layout")

    def __init__(self, layout: PositionLayout):
        self.layout = layout
        self._firsts: list[Position] | tuple[Position, ...] = _NO_RANGES
        self._lasts: list[Position] | tuple[Position, ...] = _NO_RANGES
        self._entries = 0

    # -- queries -------------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of ranges."""
        return len(self._firsts)

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def __iter__(self) -> Iterator[tuple[Position, Position]]:
        """Ranges as inclusive `(first, last)` pairs, lowest first."""
        return iter(list(zip(self._firsts, self._lasts, strict=True)))

    def __contains__(self, position: object) -> bool:
        return isinstance(position, Position) and self.contains(position)

    def __repr__(self) -> str:
        return "[" + ", ".join(f"({lo}..{hi}]" for lo, hi in self.open_closed()) + "]"

    @property
    def entry_count(self) -> int:
        """How many entries the ranges cover."""
        return self._entries

    @property
    def first_range(self) -> tuple[Position, Position] | None:
        """The lowest range as `(first, last)`, or None when empty."""
        if not self._firsts:
            return None
        return self._firsts[0], self._lasts[0]

    def contains(self, position: Position) -> bool:
        """Whether `position` lies inside a range."""
        index = bisect_right(self._firsts, position) - 1
        return index >= 0 and position <= self._lasts[index]

    def range_containing(self, position: Position) -> tuple[Position, Position] | None:
        """The range that holds `position`, or None."""
        index = bisect_right(self._firsts, position) - 1
        if index >= 0 and position <= self._lasts[index]:
            return self._firsts[index], self._lasts[index]
        return None

    def next_range_from(self, position: Position) -> tuple[Position, Position] | None:
        """The lowest range that ends at or after `position`, or None."""
        index = bisect_left(self._lasts, position)
        if index == len(self._lasts):
            return None
        return self._firsts[index], self._lasts[index]

    def count_from(self, position: Position) -> int:
        """How many covered entries are at or after `position`."""
        # Ranges at or after a cursor's read position are few (acks trail reads), so walk
        # those rather than the whole set.
        index = bisect_left(self._lasts, position)
        total = 0
        for first, last in zip(self._firsts[index:], self._lasts[index:], strict=True):
            total += self.layout.entries_between(max(first, position), last)
        assert 0 <= total <= self._entries
        return total

    def open_closed(self) -> list[tuple[Position, Position]]:
        """Pulsar's view: `(prev, last]` with prev = (first ledger, first entry - 1)."""
        return [(Position(first.ledger_id, first.entry_id - 1), last)
                for first, last in zip(self._firsts, self._lasts, strict=True)]

    # -- changes -------------------------------------------------------------------------

    def add(self, position: Position) -> bool:
        """Add one existing entry, merging with the ranges it touches.

        Returns:
            False when it was already covered (nothing changed), else True.
        """
        index = bisect_right(self._firsts, position) - 1
        if index >= 0 and position <= self._lasts[index]:
            return False
        firsts, lasts = self._lists()
        next_of = self.layout.next_position
        joins_left = index >= 0 and next_of(lasts[index]) == position
        right = index + 1
        joins_right = right < len(firsts) and next_of(position) == firsts[right]
        if joins_left and joins_right:
            lasts[index] = lasts[right]
            del firsts[right]
            del lasts[right]
        elif joins_left:
            lasts[index] = position
        elif joins_right:
            firsts[right] = position
        else:
            firsts.insert(right, position)
            lasts.insert(right, position)
        self._entries += 1
        return True

    def add_range(self, first: Position, last: Position) -> None:
        """Add every existing entry in [first, last], merging overlapping and touching
        ranges (used when restoring a persisted set)."""
        assert first <= last, (first, last)
        next_of = self.layout.next_position
        start = bisect_left(self._lasts, first)
        if start > 0 and next_of(self._lasts[start - 1]) >= first:
            start -= 1
        stop = bisect_right(self._firsts, last)
        if stop < len(self._firsts) and next_of(last) >= self._firsts[stop]:
            stop += 1
        merged_first, merged_last = first, last
        if start < stop:
            merged_first = min(first, self._firsts[start])
            merged_last = max(last, self._lasts[stop - 1])
        for old_first, old_last in zip(self._firsts[start:stop], self._lasts[start:stop],
                                       strict=True):
            self._entries -= self.layout.entries_between(old_first, old_last)
        firsts, lasts = self._lists()
        firsts[start:stop] = [merged_first]
        lasts[start:stop] = [merged_last]
        self._entries += self.layout.entries_between(merged_first, merged_last)

    def remove_up_to(self, position: Position) -> None:
        """Drop every covered entry at or below `position` (a range that straddles it is cut
        to start right after it)."""
        if not self._firsts:
            return
        firsts, lasts = self._lists()
        index = bisect_right(lasts, position)
        for first, last in zip(firsts[:index], lasts[:index], strict=True):
            self._entries -= self.layout.entries_between(first, last)
        del firsts[:index]
        del lasts[:index]
        if not firsts:
            self.clear()
        elif firsts[0] <= position:
            self._entries -= self.layout.entries_between(firsts[0], position)
            firsts[0] = max(self.layout.next_position(position), firsts[0])
            assert firsts[0] <= lasts[0]
        assert self._entries >= 0

    def clear(self) -> None:
        self._firsts = self._lasts = _NO_RANGES
        self._entries = 0

    def _lists(self) -> tuple[list[Position], list[Position]]:
        """`firsts` and `lasts` as this set's own lists (made when they are `_NO_RANGES`)."""
        firsts, lasts = self._firsts, self._lasts
        if isinstance(firsts, tuple) or isinstance(lasts, tuple):
            assert not firsts
            assert not lasts
            firsts, lasts = self._firsts, self._lasts = [], []
        return firsts, lasts

    # -- persistence and checks ----------------------------------------------------------

    def to_list(self, ranges_max: int | None = None) -> list[list[int]]:
        """The lowest `ranges_max` ranges (all when None) as `[l1, e1, l2, e2]` lists."""
        count = len(self._firsts) if ranges_max is None else min(ranges_max, len(self._firsts))
        return [[*self._firsts[i], *self._lasts[i]] for i in range(count)]

    @classmethod
    def from_list(cls, layout: PositionLayout, data: list[list[int]]) -> RangeSet:
        """Rebuild a set from `to_list` output (ranges are re-coalesced for `layout`)."""
        ranges = cls(layout)
        for item in data:
            assert len(item) == 4, item
            ranges.add_range(Position(item[0], item[1]), Position(item[2], item[3]))
        return ranges

    def check(self) -> None:
        """Assert the invariants of the module comment (tests)."""
        next_of = self.layout.next_position
        total = 0
        for index, (first, last) in enumerate(zip(self._firsts, self._lasts, strict=True)):
            assert first <= last, (first, last)
            total += self.layout.entries_between(first, last)
            if index + 1 < len(self._firsts):
                following = self._firsts[index + 1]
                assert last < following, (last, following)
                assert next_of(last) != following, f"{last} and {following} should have merged"
        assert total == self._entries, (total, self._entries)
