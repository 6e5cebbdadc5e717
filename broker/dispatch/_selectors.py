"""Key_Shared consumer selectors: which consumer owns which hash slot.

Theory of operation
-------------------

A Key_Shared dispatcher hashes each entry's sticky key into a *slot* of its selector's key-hash
range (`slot_for`, which is `codec.key_hash_slot`; slot 0 means "hash not set" and is never
produced) and asks the selector which consumer owns that slot (`select`). Three selectors
exist, as in Pulsar 4.0 (broker reference §2.3-2.6):

| selector                     | mode                    | key-hash range | ownership         |
|------------------------------|-------------------------|----------------|-------------------|
| `ConsistentHashingSelector`  | AUTO_SPLIT (default)    | [1, 65535]     | ring of points    |
| `HashRangeAutoSplitSelector` | AUTO_SPLIT, hashing off | [0, 65535]     | halving of [0, R] |
| `HashRangeExclusiveSelector` | STICKY                  | [0, 65535]     | declared ranges   |

*Consistent hashing.* Every consumer puts `points` ring points at the slots of the strings
`name NUL index NUL i` (i = 0..points-1), where `index` is the consumer's *name index*: the
lowest integer no other connected consumer with the same name holds (`ConsumerNameIndexTracker`),
so same-named consumers get different rings and a consumer that rejoins gets its old ring
back. The first consumer to take a point keeps it; later ones queue behind it and take over,
in order, when it leaves. A slot belongs to the first point at or above it, wrapping to the
lowest point. `select` is a bisect over the sorted points.

*Auto-split.* A sorted list of upper bounds over [0, R]: a consumer owns (previous bound, its
bound]. A newcomer halves the largest range (the lowest one on ties) and takes the lower half;
a leaver's range goes to the range above it, except that the top bound R passes down to the
consumer just below.

*Exclusive (STICKY).* Each consumer declares inclusive ranges; they may not overlap each other
or any connected consumer's. A slot belongs to the consumer whose range contains it, else to
nobody (the post-4.0.0 containment fix #24730).

The two AUTO_SPLIT selectors keep a `ConsumerHashAssignmentsSnapshot` (the sorted
`(range, consumer)` list covering the key-hash range) and, after every add or remove, diff it
against a fresh one. The result, `ImpactedConsumers`, lists per consumer the ranges it lost
(these drive draining-hash registration) and, per the post-4.0.0 fix #24736, the ranges it
gained. STICKY never moves a slot between connected consumers, so it reports nothing (None).

Consumers are opaque here: a selector reads only `consumer_name` (and `key_shared_ranges` for
STICKY) and keys its maps by the objects themselves, so a consumer class must keep the default
identity equality and hash. Everything is synchronous and single-threaded.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Final, Generic, NamedTuple, Protocol, TypeVar

from magnetar.codec import KEY_HASH_RANGE_SIZE, key_hash_slot

from .._config import BrokerConfig
from .._errors import ConsumerAssignError

__all__ = [
    "STICKY_KEY_HASH_NOT_SET",
    "ConsistentHashingSelector",
    "ConsumerHashAssignmentsSnapshot",
    "ConsumerNameIndexTracker",
    "HashRange",
    "HashRangeAutoSplitSelector",
    "HashRangeExclusiveSelector",
    "ImpactedConsumers",
    "RangeChange",
    "SelectorConsumer",
    "StickyKeyConsumerSelector",
    "StickyRangesConsumer",
    "merge_ranges",
    "new_selector",
    "ranges_contain",
]

_log = logging.getLogger(__name__)

STICKY_KEY_HASH_NOT_SET: Final = 0
SLOT_MAX: Final = KEY_HASH_RANGE_SIZE - 1  # 65535, the highest slot of every selector
CONSISTENT_HASHING_RANGE: Final = (STICKY_KEY_HASH_NOT_SET + 1, SLOT_MAX)
HASH_RANGE_RANGE: Final = (0, SLOT_MAX)
POINTS_DEFAULT: Final = BrokerConfig.key_shared_consistent_hashing_replica_points
POINT_SEPARATOR: Final = "\0"

assert POINTS_DEFAULT == 100
assert KEY_HASH_RANGE_SIZE == 2 << 15


class SelectorConsumer(Protocol):
    """What a selector reads of a consumer. Consumers are compared by identity."""

    @property
    def consumer_name(self) -> str: ...


class StickyRangesConsumer(SelectorConsumer, Protocol):
    """A consumer as the STICKY selector reads it: `key_shared_ranges` holds the inclusive
    `(start, end)` ranges of its KeySharedMeta, or None when it sent no KeySharedMeta."""

    @property
    def key_shared_ranges(self) -> Sequence[tuple[int, int]] | None: ...


C = TypeVar("C", bound=SelectorConsumer)
S = TypeVar("S", bound=StickyRangesConsumer)


class HashRange(NamedTuple):
    """An inclusive range of hash slots. Compares and sorts as the tuple `(start, end)`."""

    start: int
    end: int

    def contains(self, slot: int) -> bool:
        return self.start <= slot <= self.end


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[HashRange]:
    """Sort ranges and join the overlapping and adjacent ones (`end >= next.start - 1`).

    Args:
        ranges: inclusive `(start, end)` pairs, in any order.

    Returns:
        The merged ranges, ascending.
    """
    merged: list[HashRange] = []
    for start, end in sorted(ranges):
        assert start <= end
        if merged and merged[-1].end >= start - 1:
            merged[-1] = HashRange(merged[-1].start, max(merged[-1].end, end))
        else:
            merged.append(HashRange(start, end))
    return merged


def ranges_contain(ranges: Sequence[HashRange], slot: int) -> bool:
    """Whether `slot` lies in one of `ranges` (sorted, non-overlapping): one bisect."""
    i = bisect_right(ranges, slot, key=lambda r: r.start) - 1
    return i >= 0 and ranges[i].end >= slot


# --------------------------------------------------------------------------------------------
# Snapshots and the impacted-consumers diff (§2.4.4)


class RangeChange(NamedTuple, Generic[C]):
    """One range whose owner differs between two snapshots (None: nobody)."""

    range: HashRange
    before: C | None
    after: C | None


@dataclass(frozen=True)
class ImpactedConsumers(Generic[C]):
    """What a selector change did to the consumers.

    `removed` maps each consumer that lost slots to the merged, sorted ranges it lost;
    `added` maps each consumer that gained slots to the ranges it gained (#24736).
    """

    removed: Mapping[C, tuple[HashRange, ...]] = field(default_factory=dict)
    added: Mapping[C, tuple[HashRange, ...]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.removed and not self.added

    def removed_from(self, consumer: C) -> tuple[HashRange, ...]:
        """The ranges `consumer` lost (empty if none)."""
        return self.removed.get(consumer, ())

    def added_to(self, consumer: C) -> tuple[HashRange, ...]:
        """The ranges `consumer` gained (empty if none)."""
        return self.added.get(consumer, ())


class ConsumerHashAssignmentsSnapshot(Generic[C]):
    """The sorted, non-overlapping `(range, consumer)` list of a selector at one instant."""

    def __init__(self, assignments: Iterable[tuple[HashRange, C]] = ()) -> None:
        self._assignments: tuple[tuple[HashRange, C], ...] = tuple(
            (HashRange(*r), c) for r, c in assignments)
        for (prev, _), (cur, _) in pairwise(self._assignments):
            assert prev.end < cur.start, "snapshot ranges must be sorted and disjoint"
        self._by_consumer: dict[C, list[HashRange]] | None = None

    @property
    def assignments(self) -> tuple[tuple[HashRange, C], ...]:
        return self._assignments

    def ranges_by_consumer(self) -> dict[C, list[HashRange]]:
        """Per consumer, its merged, sorted ranges (computed once per snapshot)."""
        if self._by_consumer is None:
            grouped: dict[C, list[HashRange]] = {}
            for r, c in self._assignments:
                grouped.setdefault(c, []).append(r)
            self._by_consumer = {c: merge_ranges(rs) for c, rs in grouped.items()}
        return {c: list(rs) for c, rs in self._by_consumer.items()}

    def diff(self, after: ConsumerHashAssignmentsSnapshot[C]) -> list[RangeChange[C]]:
        """The ranges whose owner changed from this snapshot to `after`.

        A merge walk over both lists: equal ranges compare owners; overlapping ones compare
        owners on the overlap and advance whichever ends first; a range present on one side
        only is owned by nobody on the other. Like Pulsar's walk, the part of a range that
        precedes a partial overlap is not examined; snapshots of one selector always cover
        the same key-hash range, where that case never arises.
        """
        changes: list[RangeChange[C]] = []
        before_list, after_list = self._assignments, after._assignments
        i = j = 0
        while i < len(before_list) and j < len(after_list):
            (b_range, b_owner), (a_range, a_owner) = before_list[i], after_list[j]
            if b_range.end < a_range.start:
                changes.append(RangeChange(b_range, b_owner, None))
                i += 1
            elif a_range.end < b_range.start:
                changes.append(RangeChange(a_range, None, a_owner))
                j += 1
            else:
                overlap = HashRange(max(b_range.start, a_range.start),
                                    min(b_range.end, a_range.end))
                if b_owner is not a_owner:
                    changes.append(RangeChange(overlap, b_owner, a_owner))
                i += b_range.end <= overlap.end
                j += a_range.end <= overlap.end
        changes.extend(RangeChange(r, c, None) for r, c in before_list[i:])
        changes.extend(RangeChange(r, None, c) for r, c in after_list[j:])
        return changes

    def resolve_impacted_consumers(
            self, after: ConsumerHashAssignmentsSnapshot[C]) -> ImpactedConsumers[C]:
        """Per consumer, the ranges it lost and gained going from this snapshot to `after`."""
        lost: dict[C, list[HashRange]] = {}
        gained: dict[C, list[HashRange]] = {}
        for change in self.diff(after):
            if change.before is not None:
                lost.setdefault(change.before, []).append(change.range)
            if change.after is not None:
                gained.setdefault(change.after, []).append(change.range)
        return ImpactedConsumers(
            removed={c: tuple(merge_ranges(rs)) for c, rs in lost.items()},
            added={c: tuple(merge_ranges(rs)) for c, rs in gained.items()})


# --------------------------------------------------------------------------------------------
# The selector contract (§2.3)


class StickyKeyConsumerSelector(Protocol[C]):
    """Maps hash slots to consumers."""

    @property
    def key_hash_range(self) -> HashRange:
        """The inclusive slot range `slot_for` produces."""

    def slot_for(self, sticky_key: bytes) -> int:
        """The slot of a sticky key in this selector's key-hash range (never 0)."""

    def add_consumer(self, consumer: C) -> ImpactedConsumers[C] | None:
        """Add a consumer.

        Returns:
            The impacted consumers (AUTO_SPLIT selectors) or None (STICKY).

        Raises:
            ConsumerAssignError: the consumer cannot be placed; the selector is unchanged.
        """

    def remove_consumer(self, consumer: C) -> ImpactedConsumers[C] | None:
        """Remove a consumer (a consumer not present is ignored); same result as `add`."""

    def select(self, slot: int) -> C | None:
        """The consumer owning `slot`, or None."""

    def consumer_key_hash_ranges(self) -> dict[C, list[HashRange]]:
        """Per consumer, its merged, sorted ranges."""


# --------------------------------------------------------------------------------------------
# Consistent hashing (§2.4)


@dataclass
class _NameIndexEntry:
    name: str
    index: int
    ref_count: int


class ConsumerNameIndexTracker(Generic[C]):
    """Hands each consumer the lowest index not held by a connected consumer of the same name.

    Reference-counted per consumer object: acquiring twice needs two releases. A consumer that
    is released and acquired again gets its old index back if nobody took it meanwhile.
    """

    def __init__(self) -> None:
        self._used: dict[str, set[int]] = {}
        self._entries: dict[C, _NameIndexEntry] = {}

    def acquire(self, consumer: C) -> int:
        """Add a reference to `consumer`; return its name index."""
        entry = self._entries.get(consumer)
        if entry is None:
            name = consumer.consumer_name
            used = self._used.setdefault(name, set())
            index = next(i for i in range(len(used) + 1) if i not in used)
            used.add(index)
            entry = self._entries[consumer] = _NameIndexEntry(name, index, 0)
        entry.ref_count += 1
        return entry.index

    def release(self, consumer: C) -> None:
        """Drop a reference; the last one frees the index (and the name when unused)."""
        entry = self._entries[consumer]
        entry.ref_count -= 1
        assert entry.ref_count >= 0
        if entry.ref_count == 0:
            del self._entries[consumer]
            used = self._used[entry.name]
            used.remove(entry.index)
            if not used:
                del self._used[entry.name]

    def index_of(self, consumer: C) -> int | None:
        """The tracked index of `consumer`, or None when it holds none."""
        entry = self._entries.get(consumer)
        return None if entry is None else entry.index

    @property
    def tracked_consumers(self) -> int:
        return len(self._entries)

    @property
    def tracked_names(self) -> int:
        return len(self._used)


class ConsistentHashingSelector(Generic[C]):
    """The default AUTO_SPLIT selector: a ring of `points` points per consumer over [1, 65535]."""

    def __init__(self, points: int = POINTS_DEFAULT) -> None:
        """Args:
            points: ring points per consumer
                (`key_shared_consistent_hashing_replica_points`, default 100).
        """
        if points < 1:
            raise ValueError(f"points must be positive, got {points}")
        self._points_per_consumer = points
        self._names: ConsumerNameIndexTracker[C] = ConsumerNameIndexTracker()
        self._ring: dict[int, list[C]] = {}  # point -> owners; [0] is selected
        self._sorted_points: list[int] = []
        self._selected: list[C] = []  # parallel to _sorted_points
        self._snapshot: ConsumerHashAssignmentsSnapshot[C] = ConsumerHashAssignmentsSnapshot()

    @property
    def key_hash_range(self) -> HashRange:
        return HashRange(*CONSISTENT_HASHING_RANGE)

    def slot_for(self, sticky_key: bytes) -> int:
        return key_hash_slot(sticky_key, *CONSISTENT_HASHING_RANGE)

    @property
    def snapshot(self) -> ConsumerHashAssignmentsSnapshot[C]:
        return self._snapshot

    def ring_points(self, consumer: C) -> list[int]:
        """The ring points of a connected consumer, in point order i = 0..points-1."""
        index = self._names.index_of(consumer)
        assert index is not None, "consumer is not in the ring"
        return [self._point(consumer, index, i) for i in range(self._points_per_consumer)]

    def name_index(self, consumer: C) -> int | None:
        return self._names.index_of(consumer)

    def _point(self, consumer: C, name_index: int, i: int) -> int:
        text = POINT_SEPARATOR.join((consumer.consumer_name, str(name_index), str(i)))
        return key_hash_slot(text.encode(), *CONSISTENT_HASHING_RANGE)

    def add_consumer(self, consumer: C) -> ImpactedConsumers[C]:
        """Put the consumer's points on the ring (first-added keeps a contested point).

        Returns:
            The ranges every consumer lost or gained.
        """
        assert self._names.index_of(consumer) is None, "consumer added twice"
        name_index = self._names.acquire(consumer)
        won = 0
        for i in range(self._points_per_consumer):
            owners = self._ring.setdefault(self._point(consumer, name_index, i), [])
            won += not owners
            owners.append(consumer)
        if won == 0:
            _log.error("consumer %r got no hash ring point of its %d (all collided); consider "
                       "raising key_shared_consistent_hashing_replica_points",
                       consumer.consumer_name, self._points_per_consumer)
        return self._refresh()

    def remove_consumer(self, consumer: C) -> ImpactedConsumers[C]:
        """Take the consumer's points off the ring; queued owners take over its points."""
        name_index = self._names.index_of(consumer)
        if name_index is None:
            return ImpactedConsumers()
        for i in range(self._points_per_consumer):
            point = self._point(consumer, name_index, i)
            owners = self._ring[point]
            del owners[next(k for k, c in enumerate(owners) if c is consumer)]
            if not owners:
                del self._ring[point]
        self._names.release(consumer)
        return self._refresh()

    def select(self, slot: int) -> C | None:
        points = self._sorted_points
        if not points:
            return None
        i = bisect_left(points, slot)
        return self._selected[i if i < len(points) else 0]

    def consumer_key_hash_ranges(self) -> dict[C, list[HashRange]]:
        return self._snapshot.ranges_by_consumer()

    def _refresh(self) -> ImpactedConsumers[C]:
        self._sorted_points = sorted(self._ring)
        self._selected = [self._ring[p][0] for p in self._sorted_points]
        before, self._snapshot = self._snapshot, self._build_snapshot()
        return before.resolve_impacted_consumers(self._snapshot)

    def _build_snapshot(self) -> ConsumerHashAssignmentsSnapshot[C]:
        """The range view of §2.4.2: `[previous point + 1, point]` per point, joined per
        consumer, and the tail after the last point owned by the first point's consumer."""
        low, high = CONSISTENT_HASHING_RANGE
        out: list[tuple[HashRange, C]] = []
        start = low
        for point, owner in zip(self._sorted_points, self._selected, strict=True):
            if out and out[-1][1] is owner:
                out[-1] = (HashRange(out[-1][0].start, point), owner)
            else:
                out.append((HashRange(start, point), owner))
            start = point + 1
        if out and start <= high:
            first = self._selected[0]
            if out[-1][1] is first:
                out[-1] = (HashRange(out[-1][0].start, high), first)
            else:
                out.append((HashRange(start, high), first))
        return ConsumerHashAssignmentsSnapshot(out)


# --------------------------------------------------------------------------------------------
# Auto-split hash ranges (§2.5)


class HashRangeAutoSplitSelector(Generic[C]):
    """AUTO_SPLIT without consistent hashing: consumers halve the largest range of [0, R]."""

    def __init__(self, range_size: int = KEY_HASH_RANGE_SIZE) -> None:
        """Args:
            range_size: R, a power of two >= 2 (Pulsar's DEFAULT_RANGE_SIZE, 65536).

        Raises:
            ValueError: R is not a power of two >= 2.
        """
        if range_size < 2 or range_size & (range_size - 1):
            raise ValueError(f"range size must be a power of two >= 2, got {range_size}")
        self._range_size = range_size
        self._bounds: list[int] = []  # sorted upper bounds; the top one is always R
        self._owners: list[C] = []  # parallel to _bounds
        self._bound_of: dict[C, int] = {}
        self._snapshot: ConsumerHashAssignmentsSnapshot[C] = ConsumerHashAssignmentsSnapshot()

    @property
    def key_hash_range(self) -> HashRange:
        return HashRange(0, self._range_size - 1)

    def slot_for(self, sticky_key: bytes) -> int:
        return key_hash_slot(sticky_key, 0, self._range_size - 1)

    @property
    def snapshot(self) -> ConsumerHashAssignmentsSnapshot[C]:
        return self._snapshot

    def add_consumer(self, consumer: C) -> ImpactedConsumers[C]:
        """Give the consumer the lower half of the largest range.

        Raises:
            ConsumerAssignError: the largest range has one slot left.
        """
        assert consumer not in self._bound_of, "consumer added twice"
        if not self._bounds:
            self._insert(0, self._range_size, consumer)
            return self._refresh()
        i, size = self._largest_range()
        if size <= 1:
            raise ConsumerAssignError("No more range can assigned to new consumer, "
                                      f"assigned consumers {len(self._bounds)}")
        self._insert(i, self._bounds[i] - (size >> 1), consumer)
        return self._refresh()

    def _largest_range(self) -> tuple[int, int]:
        best_i, best_size, previous = 0, 0, 0
        for i, bound in enumerate(self._bounds):
            if bound - previous > best_size:
                best_i, best_size = i, bound - previous
            previous = bound
        return best_i, best_size

    def _insert(self, i: int, bound: int, consumer: C) -> None:
        self._bounds.insert(i, bound)
        self._owners.insert(i, consumer)
        self._bound_of[consumer] = bound

    def remove_consumer(self, consumer: C) -> ImpactedConsumers[C]:
        """Hand the consumer's range to the range above it (the top bound passes down)."""
        bound = self._bound_of.pop(consumer, None)
        if bound is None:
            return ImpactedConsumers()
        i = bisect_left(self._bounds, bound)
        assert self._owners[i] is consumer
        if bound == self._range_size and len(self._bounds) > 1:
            heir = self._owners[i - 1]
            del self._bounds[i - 1], self._owners[i - 1]
            self._owners[i - 1] = heir
            self._bound_of[heir] = bound
        else:
            del self._bounds[i], self._owners[i]
        return self._refresh()

    def select(self, slot: int) -> C | None:
        i = bisect_left(self._bounds, slot)
        return self._owners[i] if i < len(self._bounds) else None

    def consumer_key_hash_ranges(self) -> dict[C, list[HashRange]]:
        return self._snapshot.ranges_by_consumer()

    def _refresh(self) -> ImpactedConsumers[C]:
        assert not self._bounds or self._bounds[-1] == self._range_size
        out: list[tuple[HashRange, C]] = []
        start = 0
        for bound, owner in zip(self._bounds, self._owners, strict=True):
            out.append((HashRange(start, bound), owner))
            start = bound + 1
        before, self._snapshot = self._snapshot, ConsumerHashAssignmentsSnapshot(out)
        return before.resolve_impacted_consumers(self._snapshot)


# --------------------------------------------------------------------------------------------
# Exclusive declared ranges: STICKY (§2.6)


class HashRangeExclusiveSelector(Generic[S]):
    """STICKY: each consumer owns the ranges it declared; nobody owns the gaps."""

    def __init__(self) -> None:
        self._entries: list[tuple[HashRange, S]] = []  # sorted by start, disjoint
        self._starts: list[int] = []  # parallel to _entries

    @property
    def key_hash_range(self) -> HashRange:
        return HashRange(*HASH_RANGE_RANGE)

    def slot_for(self, sticky_key: bytes) -> int:
        return key_hash_slot(sticky_key, *HASH_RANGE_RANGE)

    def add_consumer(self, consumer: S) -> None:
        """Validate the consumer's declared ranges and take them.

        Raises:
            ConsumerAssignError: no KeySharedMeta, no ranges, a range with start > end, two of
                its own ranges overlap, or a range overlaps a connected consumer's ("Range
                conflict with consumer <consumer>"). The selector is unchanged.
        """
        ranges = self.validate(consumer)
        conflicting = self.find_conflicting_consumer(ranges)
        if conflicting is not None:
            raise ConsumerAssignError(f"Range conflict with consumer {conflicting}")
        for r in ranges:
            i = bisect_left(self._starts, r.start)
            self._starts.insert(i, r.start)
            self._entries.insert(i, (r, consumer))

    @staticmethod
    def validate(consumer: S) -> list[HashRange]:
        """The consumer's declared ranges sorted by start, checked on their own.

        Raises:
            ConsumerAssignError: with Pulsar's message for the first problem found.
        """
        declared = consumer.key_shared_ranges
        if declared is None:
            raise ConsumerAssignError("Must specify key shared meta for consumer.")
        if not declared:
            raise ConsumerAssignError("Ranges for KeyShared policy must not be empty.")
        ranges = sorted((HashRange(s, e) for s, e in declared), key=lambda r: r.start)
        for i, r in enumerate(ranges):
            if r.start > r.end:
                raise ConsumerAssignError(
                    f"Fixed hash range start > end for range: [{r.start},{r.end}]")
            following = ranges[i + 1] if i + 1 < len(ranges) else None
            if following is not None and following.start <= r.end:
                raise ConsumerAssignError(
                    f"Consumer's own ranges conflict: [{r.start},{r.end}] overlaps with "
                    f"[{following.start},{following.end}]")
        return ranges

    def find_conflicting_consumer(self, ranges: Iterable[tuple[int, int]]) -> S | None:
        """The first connected consumer whose ranges overlap one of `ranges`, or None.

        The dispatcher uses it to probe the conflicting consumer's connection before
        rejecting a newcomer (a dead connection is closed, then the add is retried).
        """
        for start, end in ranges:
            i = bisect_right(self._starts, start) - 1  # the range starting at or below start
            if i >= 0 and self._entries[i][0].end >= start:
                return self._entries[i][1]
            if i + 1 < len(self._entries) and self._starts[i + 1] <= end:
                return self._entries[i + 1][1]
        return None

    def remove_consumer(self, consumer: S) -> None:
        kept = [(r, c) for r, c in self._entries if c is not consumer]
        self._entries = kept
        self._starts = [r.start for r, _ in kept]

    def select(self, slot: int) -> S | None:
        i = bisect_right(self._starts, slot) - 1
        if i >= 0 and self._entries[i][0].end >= slot:
            return self._entries[i][1]
        return None

    def consumer_key_hash_ranges(self) -> dict[S, list[HashRange]]:
        grouped: dict[S, list[HashRange]] = {}
        for r, c in self._entries:
            grouped.setdefault(c, []).append(r)
        return {c: merge_ranges(rs) for c, rs in grouped.items()}


def new_selector(config: BrokerConfig, *, sticky: bool) -> StickyKeyConsumerSelector[S]:
    """The selector a new Key_Shared dispatcher uses.

    Args:
        config: the broker configuration (consistent hashing on/off, replica points).
        sticky: True for KeySharedMode STICKY, False for AUTO_SPLIT.

    Returns:
        HashRangeExclusiveSelector for STICKY; for AUTO_SPLIT, ConsistentHashingSelector unless
        `key_shared_use_consistent_hashing` is off, then HashRangeAutoSplitSelector.
    """
    if sticky:
        return HashRangeExclusiveSelector()
    if config.key_shared_use_consistent_hashing:
        return ConsistentHashingSelector(config.key_shared_consistent_hashing_replica_points)
    return HashRangeAutoSplitSelector()
