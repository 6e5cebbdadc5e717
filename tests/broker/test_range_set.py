"""RangeSet: coalescing across ledger boundaries, counting, trimming, serialization, and a
property test against a plain set model."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.broker.ledger._position import Position
from magnetar.broker.ledger._range_set import RangeSet

P = Position


class Layout:
    """A fixed ledger layout: closed ledgers 3 (4 entries) and 5 (1 entry), then 9 (3
    entries) as the current ledger."""

    def __init__(self, ledgers: tuple[tuple[int, int], ...] = ((3, 4), (5, 1), (9, 3))):
        self.ledgers = ledgers
        self.positions = [P(ledger, entry) for ledger, count in ledgers for entry in range(count)]

    def next_position(self, position: Position) -> Position:
        index = bisect.bisect_right(self.positions, position)
        if index < len(self.positions):
            return self.positions[index]
        return P(position.ledger_id, position.entry_id + 1)

    def entries_between(self, first: Position, last: Position) -> int:
        return (bisect.bisect_right(self.positions, last)
                - bisect.bisect_left(self.positions, first))


LAYOUT = Layout()
ALL = LAYOUT.positions


def ranges_of(ranges: RangeSet) -> list[tuple[Position, Position]]:
    return list(ranges)


def test_adjacent_entries_coalesce_within_a_ledger() -> None:
    ranges = RangeSet(LAYOUT)
    assert ranges.add(P(3, 1))
    assert ranges.add(P(3, 3))
    assert ranges_of(ranges) == [(P(3, 1), P(3, 1)), (P(3, 3), P(3, 3))]
    assert ranges.add(P(3, 2))
    assert ranges_of(ranges) == [(P(3, 1), P(3, 3))]
    assert ranges.entry_count == 3
    ranges.check()


def test_last_entry_of_a_ledger_touches_entry_zero_of_the_next() -> None:
    ranges = RangeSet(LAYOUT)
    ranges.add(P(3, 3))
    ranges.add(P(9, 0))
    assert len(ranges) == 2  # ledger 5's entry sits between them
    ranges.add(P(5, 0))
    assert ranges_of(ranges) == [(P(3, 3), P(9, 0))]
    assert ranges.entry_count == 3
    ranges.check()


def test_adding_twice_changes_nothing() -> None:
    ranges = RangeSet(LAYOUT)
    assert ranges.add(P(5, 0))
    assert not ranges.add(P(5, 0))
    assert ranges.entry_count == 1


def test_contains_and_range_lookups() -> None:
    ranges = RangeSet(LAYOUT)
    for position in (P(3, 0), P(3, 1), P(9, 1)):
        ranges.add(position)
    assert P(3, 1) in ranges
    assert P(3, 2) not in ranges
    assert ranges.contains(P(9, 1))
    assert ranges.range_containing(P(3, 1)) == (P(3, 0), P(3, 1))
    assert ranges.range_containing(P(5, 0)) is None
    assert ranges.next_range_from(P(3, 2)) == (P(9, 1), P(9, 1))
    assert ranges.next_range_from(P(3, 1)) == (P(3, 0), P(3, 1))
    assert ranges.next_range_from(P(9, 2)) is None
    assert ranges.first_range == (P(3, 0), P(3, 1))
    assert RangeSet(LAYOUT).first_range is None


def test_count_from_counts_covered_entries_at_or_after() -> None:
    ranges = RangeSet(LAYOUT)
    for position in (P(3, 1), P(3, 2), P(3, 3), P(5, 0), P(9, 2)):
        ranges.add(position)
    assert ranges.count_from(P(3, 0)) == 5
    assert ranges.count_from(P(3, 2)) == 4
    assert ranges.count_from(P(3, 99)) == 2  # not an entry: counts from the next one
    assert ranges.count_from(P(9, 0)) == 1
    assert ranges.count_from(P(9, 3)) == 0


def test_remove_up_to_cuts_a_straddling_range() -> None:
    ranges = RangeSet(LAYOUT)
    for position in ALL[1:6]:  # 3:1 .. 5:0 .. 9:0
        ranges.add(position)
    ranges.add(P(9, 2))
    assert ranges_of(ranges) == [(P(3, 1), P(9, 0)), (P(9, 2), P(9, 2))]
    ranges.remove_up_to(P(3, 3))
    assert ranges_of(ranges) == [(P(5, 0), P(9, 0)), (P(9, 2), P(9, 2))]
    assert ranges.entry_count == 3
    ranges.remove_up_to(P(9, 1))
    assert ranges_of(ranges) == [(P(9, 2), P(9, 2))]
    ranges.check()
    ranges.remove_up_to(P(9, 2))
    assert not ranges
    assert ranges.entry_count == 0


def test_add_range_merges_overlapping_and_touching_ranges() -> None:
    ranges = RangeSet(LAYOUT)
    ranges.add(P(3, 0))
    ranges.add(P(9, 2))
    ranges.add_range(P(3, 2), P(5, 0))
    assert ranges_of(ranges) == [(P(3, 0), P(3, 0)), (P(3, 2), P(5, 0)), (P(9, 2), P(9, 2))]
    ranges.add_range(P(3, 1), P(9, 1))  # fills every gap
    assert ranges_of(ranges) == [(P(3, 0), P(9, 2))]
    assert ranges.entry_count == len(ALL)
    ranges.check()


def test_serialization_round_trip_and_limit() -> None:
    ranges = RangeSet(LAYOUT)
    for position in (P(3, 0), P(3, 2), P(3, 3), P(9, 1)):
        ranges.add(position)
    data = ranges.to_list()
    assert data == [[3, 0, 3, 0], [3, 2, 3, 3], [9, 1, 9, 1]]
    again = RangeSet.from_list(LAYOUT, data)
    assert ranges_of(again) == ranges_of(ranges)
    assert again.entry_count == ranges.entry_count
    assert ranges.to_list(2) == data[:2]
    assert ranges.to_list(0) == []


def test_open_closed_view_matches_pulsar_stats() -> None:
    ranges = RangeSet(LAYOUT)
    ranges.add(P(3, 1))
    ranges.add(P(3, 2))
    ranges.add(P(9, 0))
    assert ranges.open_closed() == [(P(3, 0), P(3, 2)), (P(9, -1), P(9, 0))]
    assert repr(ranges) == "[(3:0..3:2], (9:-1..9:0]]"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(ALL)), st.lists(st.tuples(st.sampled_from(ALL),
                                                           st.sampled_from(ALL)), max_size=3),
       st.sampled_from([*ALL, P(1, 0), P(5, 7)]))
def test_matches_a_plain_set(adds: list[Position], spans: list[tuple[Position, Position]],
                             cut: Position) -> None:
    ranges = RangeSet(LAYOUT)
    model: set[Position] = set()
    for position in adds:
        assert ranges.add(position) == (position not in model)
        model.add(position)
    for low, high in spans:
        first, last = min(low, high), max(low, high)
        ranges.add_range(first, last)
        model.update(p for p in ALL if first <= p <= last)
    _assert_same(ranges, model)
    for position in ALL:
        assert ranges.count_from(position) == sum(1 for p in model if p >= position)
    ranges.remove_up_to(cut)
    model = {p for p in model if p > cut}
    _assert_same(ranges, model)


def _assert_same(ranges: RangeSet, model: set[Position]) -> None:
    ranges.check()
    assert ranges.entry_count == len(model)
    assert {p for p in ALL if p in ranges} == model
    covered = {p for first, last in ranges for p in ALL if first <= p <= last}
    assert covered == model


@pytest.mark.parametrize("position", [P(3, 0), P(9, 2)])
def test_single_entry_sets(position: Position) -> None:
    ranges = RangeSet(LAYOUT)
    ranges.add(position)
    assert ranges.first_range == (position, position)
    assert ranges.entry_count == 1
    ranges.remove_up_to(position)
    assert ranges.entry_count == 0
