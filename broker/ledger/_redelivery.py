"""Redelivery counts of one subscription, kept with its cursor so that they survive restarts.

Theory of operation
-------------------
A `RedeliveryCounts` maps entry positions to how many times the entry was handed back for
redelivery (negative ack, ack timeout, redeliver-all). The count travels in every MESSAGE
the broker sends (`redelivery_count`), which the client's dead-letter policy compares with
its `max_redeliver_count`.

The counts belong to the subscription's `ManagedCursor`: its record carries them (the lowest
`persist_max` positions above the mark-delete that are not acknowledged, as
`[[ledger, entry, count], ...]` under "redel"), written through the journaled metadata path
like the rest of the cursor. A count change does not wait for its write: the cursor writes
it in the background, merged with any later change, and every ack writes the current counts
too. So a clean shutdown keeps every count (the cursor is flushed on close), and a
`kill -9` loses only the count changes whose background write was not yet durable (an
increment, or the clearing when the last consumer left: the counts written before it come
back), plus the counts beyond `persist_max`. Counts of acknowledged entries are dropped (on
ack, and when the mark-delete passes them).

Memory is bounded too: at most `memory_max` positions have a count; beyond it, new
positions are not counted (their count stays 0) until acks make room.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from ._position import EMPTY_MAP, Position, keys_between

__all__ = ["REDELIVERY_COUNTS_MEMORY_MAX_DEFAULT", "REDELIVERY_COUNTS_PERSIST_MAX_DEFAULT",
           "RedeliveryCounts"]

REDELIVERY_COUNTS_PERSIST_MAX_DEFAULT: Final = 10_000  # positions written with the cursor
REDELIVERY_COUNTS_MEMORY_MAX_DEFAULT: Final = 1_000_000  # positions counted in memory


class RedeliveryCounts:
    """Per-position redelivery counts (see the module docstring)."""

    __slots__ = ("_counts", "memory_max", "persist_max")

    def __init__(self, persist_max: int = REDELIVERY_COUNTS_PERSIST_MAX_DEFAULT,
                 memory_max: int = REDELIVERY_COUNTS_MEMORY_MAX_DEFAULT):
        assert 0 <= persist_max <= memory_max
        self.persist_max = persist_max
        self.memory_max = memory_max
        # EMPTY_MAP while no position has a count (one dict less per loaded topic)
        self._counts: Mapping[Position, int] = EMPTY_MAP

    def __len__(self) -> int:
        return len(self._counts)

    def get(self, position: Position) -> int:
        return self._counts.get(position, 0)

    def increment(self, position: Position) -> bool:
        """Count one more redelivery; False when the memory limit left it uncounted."""
        count = self._counts.get(position)
        if count is None and len(self._counts) >= self.memory_max:
            return False
        counts = self._counts
        if not isinstance(counts, dict):
            counts = self._counts = {}
        counts[position] = (count or 0) + 1
        return True

    def discard(self, positions: Iterable[Position]) -> bool:
        """Forget the counts of `positions`; whether any was there."""
        counts = self._counts
        if not isinstance(counts, dict):  # EMPTY_MAP: nothing to forget
            return False
        found = False
        for position in positions:
            found |= counts.pop(position, None) is not None
        if not counts:
            self._counts = EMPTY_MAP
        return found

    def discard_between(self, first: Position, last: Position) -> None:
        """Forget the counts of first..last (entries of one ledger)."""
        counts = self._counts
        if not isinstance(counts, dict):
            return
        for position in keys_between(counts, first, last):
            del counts[position]
        if not counts:
            self._counts = EMPTY_MAP

    def discard_up_to(self, mark_delete: Position) -> None:
        if any(p <= mark_delete for p in self._counts):
            self._counts = {p: count for p, count in self._counts.items()
                            if p > mark_delete} or EMPTY_MAP

    def clear(self) -> bool:
        """Forget every count; whether there was any."""
        had = bool(self._counts)
        self._counts = EMPTY_MAP
        return had

    def to_record(self, acked: Callable[[Position], bool]) -> list[list[int]]:
        """The lowest `persist_max` unacknowledged positions with their counts."""
        if not self._counts:
            return []
        kept = heapq.nsmallest(self.persist_max, (p for p in self._counts if not acked(p)))
        return [[p.ledger_id, p.entry_id, self._counts[p]] for p in kept]

    def restore(self, record: Any, valid: Callable[[Position], bool]) -> None:
        """Load a record's counts, keeping positions `valid` says are still unacked entries.

        Raises:
            ValueError: the record is malformed (nothing loaded).
        """
        loaded: dict[Position, int] = {}
        for item in record or []:
            if not isinstance(item, list) or len(item) != 3 or \
                    not all(isinstance(v, int) for v in item) or item[2] < 1:
                raise ValueError(f"bad redelivery count record item {item!r:.60}")
            position = Position(item[0], item[1])
            if valid(position):
                loaded[position] = item[2]
        self._counts = dict(list(loaded.items())[:self.memory_max]) or EMPTY_MAP
