"""Key_Shared selectors: the upstream vectors and worked examples of broker reference §2.2-2.6,
the ring properties of §2.4.3, name indexes, auto-split, STICKY validation and the snapshot
diff (§2.4.4)."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.broker._config import BrokerConfig
from magnetar.broker._errors import ConsumerAssignError
from magnetar.broker.dispatch._selectors import (
    ConsistentHashingSelector,
    ConsumerHashAssignmentsSnapshot,
    ConsumerNameIndexTracker,
    HashRange,
    HashRangeAutoSplitSelector,
    HashRangeExclusiveSelector,
    ImpactedConsumers,
    RangeChange,
    StickyKeyConsumerSelector,
    merge_ranges,
    new_selector,
    ranges_contain,
)
from magnetar.codec import consistent_hashing_slot, hash_range_slot, murmur3_32

SLOT_MAX = 65535


@dataclass(eq=False)
class FakeConsumer:
    """What a selector sees of a consumer; identity equality, like the broker's."""

    consumer_name: str
    key_shared_ranges: tuple[tuple[int, int], ...] | None = None

    def __repr__(self) -> str:
        return f"FakeConsumer({self.consumer_name})"


def sticky(name: str, *ranges: tuple[int, int]) -> FakeConsumer:
    return FakeConsumer(name, tuple(ranges))


Owners = list[FakeConsumer | None]


def owners_by_slot(snapshot: ConsumerHashAssignmentsSnapshot[FakeConsumer],
                   size: int = SLOT_MAX + 1) -> Owners:
    """Expand a snapshot into one owner per slot (index = slot)."""
    owners: Owners = [None] * size
    for r, c in snapshot.assignments:
        owners[r.start:r.end + 1] = [c] * (r.end - r.start + 1)
    return owners


def brute_force_changes(before: Owners, after: Owners, low: int
                        ) -> tuple[dict[FakeConsumer, list[HashRange]],
                                   dict[FakeConsumer, list[HashRange]]]:
    """Per consumer, the runs of slots it lost and gained, slot by slot."""
    lost: dict[FakeConsumer, list[HashRange]] = {}
    gained: dict[FakeConsumer, list[HashRange]] = {}
    for slot in range(low, len(before)):
        b, a = before[slot], after[slot]
        if b is a:
            continue
        for owner, runs in ((b, lost), (a, gained)):
            if owner is None:
                continue
            owner_runs = runs.setdefault(owner, [])
            if owner_runs and owner_runs[-1].end == slot - 1:
                owner_runs[-1] = HashRange(owner_runs[-1].start, slot)
            else:
                owner_runs.append(HashRange(slot, slot))
    return lost, gained


def assert_impacted_exactly(impacted: ImpactedConsumers[FakeConsumer] | None,
                            before: Owners, after: Owners, low: int) -> None:
    assert impacted is not None
    lost, gained = brute_force_changes(before, after, low)
    assert {c: list(rs) for c, rs in impacted.removed.items()} == lost
    assert {c: list(rs) for c, rs in impacted.added.items()} == gained


def assert_select_agrees_at_boundaries(selector: StickyKeyConsumerSelector[FakeConsumer],
                                       snapshot: ConsumerHashAssignmentsSnapshot[FakeConsumer]
                                       ) -> None:
    for r, c in snapshot.assignments:
        assert selector.select(r.start) is c
        assert selector.select(min(r.end, SLOT_MAX)) is c


# ---------------------------------------------------------------------------------------------
# §2.2: key -> slot, through codec's hashing functions

SLOT_TABLE = [  # key, masked murmur, consistent-hashing slot, auto-split / sticky slot
    ("key1", 462881061, 7357, 293),
    ("key2", 1936800180, 44326, 14772),
    ("k1", 2110152746, 56817, 24618),
    ("k2", 1479966664, 55295, 32712),
    ("hello", 613153351, 7892, 64071),
    ("a", 1009084850, 42456, 27058),
    ("", 0, 1, 1),
    ("NONE_KEY", 504741539, 56505, 48803),
]


@pytest.mark.parametrize(("key", "masked", "consistent", "hash_range"), SLOT_TABLE)
def test_slot_table(key: str, masked: int, consistent: int, hash_range: int) -> None:
    assert murmur3_32(key) == masked
    assert consistent_hashing_slot(key) == consistent
    assert hash_range_slot(key) == hash_range
    assert ConsistentHashingSelector[FakeConsumer]().slot_for(key.encode()) == consistent
    assert HashRangeAutoSplitSelector[FakeConsumer]().slot_for(key.encode()) == hash_range
    assert HashRangeExclusiveSelector[FakeConsumer]().slot_for(key.encode()) == hash_range


def test_key_hash_ranges() -> None:
    assert ConsistentHashingSelector[FakeConsumer]().key_hash_range == (1, 65535)
    assert HashRangeAutoSplitSelector[FakeConsumer]().key_hash_range == (0, 65535)
    assert HashRangeAutoSplitSelector[FakeConsumer](64).key_hash_range == (0, 63)
    assert HashRangeExclusiveSelector[FakeConsumer]().key_hash_range == (0, 65535)


# ---------------------------------------------------------------------------------------------
# §2.4: consistent hashing, exact worked examples

THREE_POINT_RANGES = {
    "consumer1": [(14359, 18366), (29991, 39817), (52980, 60442)],
    "consumer2": [(1, 6668), (39818, 52979), (60443, 63679), (65184, 65535)],
    "consumer3": [(6669, 14358), (18367, 29990), (63680, 65183)],
}


def three_point_selector() -> tuple[ConsistentHashingSelector[FakeConsumer],
                                    list[FakeConsumer]]:
    selector = ConsistentHashingSelector[FakeConsumer](3)
    consumers = [FakeConsumer(f"consumer{i}") for i in (1, 2, 3)]
    for c in consumers:
        selector.add_consumer(c)
    return selector, consumers


def ranges_by_name(selector: StickyKeyConsumerSelector[FakeConsumer]
                   ) -> dict[str, list[tuple[int, int]]]:
    return {c.consumer_name: [(r.start, r.end) for r in rs]
            for c, rs in selector.consumer_key_hash_ranges().items()}


def test_three_points_ring_points() -> None:
    selector, (c1, c2, c3) = three_point_selector()
    assert selector.ring_points(c1) == [60442, 18366, 39817]
    assert selector.ring_points(c2) == [6668, 63679, 52979]
    assert selector.ring_points(c3) == [29990, 65183, 14358]
    assert selector.ring_points(c1)[0] == consistent_hashing_slot("consumer1\x000\x000")


def test_three_points_ranges_are_exact_contiguous_and_cover_the_range() -> None:
    selector, _ = three_point_selector()
    assert ranges_by_name(selector) == THREE_POINT_RANGES
    assert ranges_by_name(selector) == ranges_by_name(selector)  # stable when asked again
    flat = sorted(r for rs in THREE_POINT_RANGES.values() for r in rs)
    assert flat[0][0] == 1
    assert flat[-1][1] == SLOT_MAX
    for (_, end), (start, _) in itertools.pairwise(flat):
        assert start == end + 1


def test_three_points_selection() -> None:
    selector, (c1, c2, c3) = three_point_selector()
    expected = {"key1": c3, "key2": c2, "k1": c1, "hello": c3}
    for key, consumer in expected.items():
        assert selector.select(selector.slot_for(key.encode())) is consumer
    # Every slot agrees with the range view, including the wrap-around tail.
    owners = owners_by_slot(selector.snapshot)
    assert all(selector.select(slot) is owners[slot] for slot in range(1, SLOT_MAX + 1))
    assert selector.select(65535) is c2  # the tail after the last point wraps to the first


def test_three_points_remove_and_readd_consumer2() -> None:
    selector, (c1, c2, c3) = three_point_selector()
    impacted = selector.remove_consumer(c2)
    assert ranges_by_name(selector) == {
        "consumer1": [(14359, 18366), (29991, 60442)],
        "consumer3": [(1, 14358), (18367, 29990), (60443, 65535)],
    }
    assert impacted.removed == {c2: tuple(HashRange(*r) for r in THREE_POINT_RANGES["consumer2"])}
    assert impacted.added == {
        c1: (HashRange(39818, 52979),),
        c3: (HashRange(1, 6668), HashRange(60443, 63679), HashRange(65184, 65535)),
    }
    impacted = selector.add_consumer(c2)
    assert ranges_by_name(selector) == THREE_POINT_RANGES
    assert impacted.removed == {
        c1: (HashRange(39818, 52979),),
        c3: (HashRange(1, 6668), HashRange(60443, 63679), HashRange(65184, 65535)),
    }
    assert impacted.removed_from(c2) == ()
    assert list(impacted.added_to(c2)) == [HashRange(*r) for r in THREE_POINT_RANGES["consumer2"]]


def test_two_consumers_with_default_points() -> None:
    selector = ConsistentHashingSelector[FakeConsumer]()
    c1, c2 = FakeConsumer("c1"), FakeConsumer("c2")
    selector.add_consumer(c1)
    selector.add_consumer(c2)
    assert len(selector.ring_points(c1)) == 100
    assert selector.ring_points(c1)[:5] == [34662, 61273, 23534, 54464, 29173]
    ranges = selector.consumer_key_hash_ranges()
    assert (sum(e - s + 1 for s, e in ranges[c1]), len(ranges[c1])) == (30966, 52)
    assert (sum(e - s + 1 for s, e in ranges[c2]), len(ranges[c2])) == (34569, 51)
    expected = {"key1": c1, "key2": c2, "k1": c2, "hello": c1}
    for key, consumer in expected.items():
        assert selector.select(selector.slot_for(key.encode())) is consumer


def test_first_consumer_gets_everything_and_empty_ring_selects_nobody() -> None:
    selector = ConsistentHashingSelector[FakeConsumer](5)
    assert selector.select(1) is None
    assert selector.consumer_key_hash_ranges() == {}
    only = FakeConsumer("only")
    impacted = selector.add_consumer(only)
    assert impacted.removed == {}
    assert impacted.added == {only: (HashRange(1, SLOT_MAX),)}
    assert selector.consumer_key_hash_ranges() == {only: [HashRange(1, SLOT_MAX)]}
    assert selector.select(1) is only
    assert selector.select(SLOT_MAX) is only


def test_same_named_consumers_get_name_indexes_and_different_rings() -> None:
    selector = ConsistentHashingSelector[FakeConsumer](10)
    first, second = FakeConsumer("same"), FakeConsumer("same")
    selector.add_consumer(first)
    selector.add_consumer(second)
    assert selector.name_index(first) == 0
    assert selector.name_index(second) == 1
    assert selector.ring_points(first) == [consistent_hashing_slot(f"same\x000\x00{i}")
                                           for i in range(10)]
    assert selector.ring_points(second) == [consistent_hashing_slot(f"same\x001\x00{i}")
                                            for i in range(10)]
    assert set(selector.ring_points(first)).isdisjoint(selector.ring_points(second))
    assert set(selector.consumer_key_hash_ranges()) == {first, second}


def test_rejoining_consumer_gets_its_old_index_and_ring() -> None:
    selector = ConsistentHashingSelector[FakeConsumer](10)
    a, b, c = FakeConsumer("n"), FakeConsumer("n"), FakeConsumer("n")
    for consumer in (a, b, c):
        selector.add_consumer(consumer)
    ranges = selector.consumer_key_hash_ranges()
    selector.remove_consumer(b)
    assert selector.name_index(b) is None
    newcomer = FakeConsumer("n")
    selector.add_consumer(newcomer)
    assert selector.name_index(newcomer) == 1  # the lowest free index
    selector.remove_consumer(newcomer)
    selector.add_consumer(b)
    assert selector.name_index(b) == 1
    assert selector.consumer_key_hash_ranges() == ranges


def test_names_ending_in_digits_do_not_collide() -> None:
    selector = ConsistentHashingSelector[FakeConsumer](12)
    c1, c11 = FakeConsumer("consumer1"), FakeConsumer("consumer11")
    selector.add_consumer(c1)
    selector.add_consumer(c11)
    assert len(set(selector.ring_points(c1))) == 12
    assert set(selector.ring_points(c1)).isdisjoint(selector.ring_points(c11))
    ranges = selector.consumer_key_hash_ranges()
    assert set(ranges) == {c1, c11}
    assert not set(ranges[c1]) & set(ranges[c11])
    owners = owners_by_slot(selector.snapshot)
    assert owners[1:].count(c1) + owners[1:].count(c11) == SLOT_MAX


def test_removing_everyone_leaves_an_empty_map_and_removing_twice_is_harmless() -> None:
    selector = ConsistentHashingSelector[FakeConsumer](12)
    consumers = [FakeConsumer(f"consumer{i}") for i in range(1, 100)]
    for c in consumers:
        selector.add_consumer(c)
    assert len(selector.consumer_key_hash_ranges()) == len(consumers)
    for c in consumers:
        selector.remove_consumer(c)
    assert selector.consumer_key_hash_ranges() == {}
    assert selector.select(100) is None
    for c in consumers:
        assert selector.remove_consumer(c).empty


def _colliding_names() -> tuple[str, str]:
    """Two names whose only ring point (points=1, index 0) lands on the same slot."""
    seen: dict[int, str] = {}
    for i in range(100_000):
        name = f"x{i}"
        slot = consistent_hashing_slot(f"{name}\x000\x000")
        if slot in seen:
            return seen[slot], name
        seen[slot] = name
    raise AssertionError("no collision found")


def test_collisions_first_added_wins_and_the_queue_takes_over(
        caplog: pytest.LogCaptureFixture) -> None:
    first_name, second_name = _colliding_names()
    selector = ConsistentHashingSelector[FakeConsumer](1)
    first, second = FakeConsumer(first_name), FakeConsumer(second_name)
    selector.add_consumer(first)
    with caplog.at_level(logging.ERROR, logger="magnetar.broker.dispatch._selectors"):
        impacted = selector.add_consumer(second)
    assert "got no hash ring point" in caplog.text
    assert impacted.empty
    assert selector.consumer_key_hash_ranges() == {first: [HashRange(1, SLOT_MAX)]}
    impacted = selector.remove_consumer(first)
    assert selector.consumer_key_hash_ranges() == {second: [HashRange(1, SLOT_MAX)]}
    assert impacted.removed == {first: (HashRange(1, SLOT_MAX),)}
    selector.add_consumer(first)  # now queued behind `second`
    assert selector.select(1) is second
    selector.remove_consumer(second)
    assert selector.select(1) is first


def test_twenty_same_named_consumers_spread_keys_evenly(seed: int) -> None:
    selector = ConsistentHashingSelector[FakeConsumer](200)
    consumers = [FakeConsumer("consumer") for _ in range(20)]
    for c in consumers:
        selector.add_consumer(c)
    # The hash space itself: each consumer owns 1/20 of it, within ±20%.
    shares = {c: sum(e - s + 1 for s, e in rs)
              for c, rs in selector.consumer_key_hash_ranges().items()}
    assert set(shares) == set(consumers)
    for share in shares.values():
        assert abs(share - SLOT_MAX / 20) <= SLOT_MAX / 20 * 0.2, sorted(shares.values())
    # 10000 random keys: 10000/20 each within ±20%, measured against each consumer's own share
    # of the space so that sampling noise (about 22 keys) stays far inside the bound.
    rng = random.Random(seed)
    counts = dict.fromkeys(consumers, 0)
    for _ in range(10_000):
        chosen = selector.select(selector.slot_for(rng.randbytes(16).hex().encode()))
        assert chosen is not None
        counts[chosen] += 1
    for c, count in counts.items():
        expected = 10_000 * shares[c] / SLOT_MAX
        assert abs(count - expected) <= expected * 0.25, (count, expected)
        assert abs(count - 500) <= 500 * 0.4


def test_leave_and_rejoin_with_repeated_names_moves_under_one_percent() -> None:
    selector = ConsistentHashingSelector[FakeConsumer](100)
    consumers = [FakeConsumer("worker") for _ in range(10)]
    for c in consumers:
        selector.add_consumer(c)
    before = owners_by_slot(selector.snapshot)
    leaver = consumers[3]
    selector.remove_consumer(leaver)
    replacement = FakeConsumer("worker")
    selector.add_consumer(replacement)
    assert selector.name_index(replacement) == 3
    after = owners_by_slot(selector.snapshot)
    moved = sum(1 for slot in range(1, SLOT_MAX + 1)
                if after[slot] is not (replacement if before[slot] is leaver else before[slot]))
    assert moved < SLOT_MAX // 100


# ---------------------------------------------------------------------------------------------
# §2.4.3 properties (hypothesis)

NAMES = st.sampled_from(["a", "b", "c", "consumer1", "consumer11", "same"])


@settings(max_examples=30, deadline=None)
@given(names=st.lists(NAMES, min_size=0, max_size=5), newcomer=NAMES,
       points=st.integers(1, 12))
def test_adding_moves_slots_only_to_the_newcomer(names: list[str], newcomer: str,
                                                 points: int) -> None:
    selector = ConsistentHashingSelector[FakeConsumer](points)
    for name in names:
        selector.add_consumer(FakeConsumer(name))
    before = owners_by_slot(selector.snapshot)
    new = FakeConsumer(newcomer)
    impacted = selector.add_consumer(new)
    after = owners_by_slot(selector.snapshot)
    assert all(a is b or a is new for a, b in zip(after[1:], before[1:], strict=True))
    assert_impacted_exactly(impacted, before, after, 1)
    assert_select_agrees_at_boundaries(selector, selector.snapshot)


@settings(max_examples=30, deadline=None)
@given(names=st.lists(NAMES, min_size=1, max_size=6), points=st.integers(1, 12),
       data=st.data())
def test_removing_moves_only_the_removed_consumers_slots(names: list[str], points: int,
                                                         data: st.DataObject) -> None:
    selector = ConsistentHashingSelector[FakeConsumer](points)
    consumers = [FakeConsumer(name) for name in names]
    for c in consumers:
        selector.add_consumer(c)
    leaver = data.draw(st.sampled_from(consumers))
    before = owners_by_slot(selector.snapshot)
    impacted = selector.remove_consumer(leaver)
    after = owners_by_slot(selector.snapshot)
    assert all(a is b or b is leaver for a, b in zip(after[1:], before[1:], strict=True))
    assert leaver not in after
    assert_impacted_exactly(impacted, before, after, 1)
    assert_select_agrees_at_boundaries(selector, selector.snapshot)


@settings(max_examples=30, deadline=None)
@given(names=st.lists(NAMES, min_size=1, max_size=6), points=st.integers(1, 12),
       data=st.data())
def test_all_leave_in_any_order_and_rejoin_in_order_gives_the_same_mapping(
        names: list[str], points: int, data: st.DataObject) -> None:
    selector = ConsistentHashingSelector[FakeConsumer](points)
    consumers = [FakeConsumer(name) for name in names]
    for c in consumers:
        selector.add_consumer(c)
    original = selector.snapshot.assignments
    for c in data.draw(st.permutations(consumers)):
        selector.remove_consumer(c)
    assert selector.snapshot.assignments == ()
    for c in consumers:
        selector.add_consumer(c)
    assert selector.snapshot.assignments == original


# ---------------------------------------------------------------------------------------------
# Name index tracker


def test_name_index_tracker_gives_distinct_indexes_and_reuses_the_lowest_free() -> None:
    tracker = ConsumerNameIndexTracker[FakeConsumer]()
    a, b, c = FakeConsumer("x"), FakeConsumer("x"), FakeConsumer("x")
    assert [tracker.acquire(a), tracker.acquire(b), tracker.acquire(c)] == [0, 1, 2]
    tracker.release(b)
    assert tracker.index_of(b) is None
    d = FakeConsumer("x")
    assert tracker.acquire(d) == 1
    tracker.release(a)
    assert tracker.acquire(FakeConsumer("x")) == 0
    assert tracker.acquire(FakeConsumer("x")) == 3
    assert tracker.acquire(FakeConsumer("other")) == 0


def test_name_index_tracker_stable_when_every_other_leaves_and_rejoins() -> None:
    tracker = ConsumerNameIndexTracker[FakeConsumer]()
    consumers = [FakeConsumer("consumer") for _ in range(100)]
    indexes = {c: tracker.acquire(c) for c in consumers}
    for c in consumers[::2]:
        tracker.release(c)
    for i, c in enumerate(consumers):
        assert tracker.index_of(c) == (None if i % 2 == 0 else indexes[c])
    for c in consumers[::2]:
        assert tracker.acquire(c) == indexes[c]
    assert {c: tracker.index_of(c) for c in consumers} == indexes


def test_name_index_tracker_counts_references() -> None:
    tracker = ConsumerNameIndexTracker[FakeConsumer]()
    consumers = [FakeConsumer("consumer") for _ in range(10)]
    first = [tracker.acquire(c) for c in consumers]
    assert [tracker.acquire(c) for c in consumers] == first
    assert tracker.tracked_names == 1
    for c in consumers:
        tracker.release(c)
    assert [tracker.index_of(c) for c in consumers] == first
    for c in consumers:
        tracker.release(c)
    assert tracker.tracked_consumers == 0
    assert tracker.tracked_names == 0


def test_name_index_tracker_many_names() -> None:
    tracker = ConsumerNameIndexTracker[FakeConsumer]()
    consumers = [FakeConsumer(f"consumer{i}") for i in range(100)]
    assert {tracker.acquire(c) for c in consumers} == {0}
    assert (tracker.tracked_names, tracker.tracked_consumers) == (100, 100)
    for c in consumers:
        tracker.release(c)
    assert (tracker.tracked_names, tracker.tracked_consumers) == (0, 0)


# ---------------------------------------------------------------------------------------------
# §2.5: auto-split


def test_auto_split_worked_example() -> None:
    selector = HashRangeAutoSplitSelector[FakeConsumer]()
    c1, c2, c3, c4 = (FakeConsumer(f"c{i}") for i in range(1, 5))
    assert selector.add_consumer(c1).added == {c1: (HashRange(0, 65536),)}
    assert ranges_by_name(selector) == {"c1": [(0, 65536)]}
    impacted = selector.add_consumer(c2)
    assert ranges_by_name(selector) == {"c2": [(0, 32768)], "c1": [(32769, 65536)]}
    assert impacted.removed == {c1: (HashRange(0, 32768),)}
    assert impacted.added == {c2: (HashRange(0, 32768),)}
    impacted = selector.add_consumer(c3)
    assert ranges_by_name(selector) == {"c3": [(0, 16384)], "c2": [(16385, 32768)],
                                        "c1": [(32769, 65536)]}
    assert impacted.removed == {c2: (HashRange(0, 16384),)}
    impacted = selector.add_consumer(c4)
    assert ranges_by_name(selector) == {"c3": [(0, 16384)], "c2": [(16385, 32768)],
                                        "c4": [(32769, 49152)], "c1": [(49153, 65536)]}
    assert impacted.removed == {c1: (HashRange(32769, 49152),)}
    assert selector.select(selector.slot_for(b"key1")) is c3  # slot 293
    impacted = selector.remove_consumer(c2)
    assert ranges_by_name(selector) == {"c3": [(0, 16384)], "c4": [(16385, 49152)],
                                        "c1": [(49153, 65536)]}
    assert impacted.removed == {c2: (HashRange(16385, 32768),)}
    assert impacted.added == {c4: (HashRange(16385, 32768),)}
    impacted = selector.remove_consumer(c1)
    assert ranges_by_name(selector) == {"c3": [(0, 16384)], "c4": [(16385, 65536)]}
    assert impacted.removed == {c1: (HashRange(49153, 65536),)}
    assert selector.select(65535) is c4


def test_auto_split_range_size_64() -> None:
    selector = HashRangeAutoSplitSelector[FakeConsumer](64)
    for i in range(1, 5):
        selector.add_consumer(FakeConsumer(f"consumer{i}"))
    assert ranges_by_name(selector) == {"consumer3": [(0, 16)], "consumer2": [(17, 32)],
                                        "consumer4": [(33, 48)], "consumer1": [(49, 64)]}


def test_auto_split_same_named_consumers_get_different_ranges() -> None:
    selector = HashRangeAutoSplitSelector[FakeConsumer](64)
    a, b = FakeConsumer("same"), FakeConsumer("same")
    selector.add_consumer(a)
    selector.add_consumer(b)
    ranges = selector.consumer_key_hash_ranges()
    assert ranges == {b: [HashRange(0, 32)], a: [HashRange(33, 64)]}


def test_auto_split_runs_out_of_ranges() -> None:
    selector = HashRangeAutoSplitSelector[FakeConsumer](2)
    c1, c2 = FakeConsumer("c1"), FakeConsumer("c2")
    selector.add_consumer(c1)
    selector.add_consumer(c2)
    assert ranges_by_name(selector) == {"c2": [(0, 1)], "c1": [(2, 2)]}
    with pytest.raises(ConsumerAssignError) as failure:
        selector.add_consumer(FakeConsumer("c3"))
    assert str(failure.value) == ("No more range can assigned to new consumer, "
                                  "assigned consumers 2")
    assert failure.value.code == 19
    assert ranges_by_name(selector) == {"c2": [(0, 1)], "c1": [(2, 2)]}


@pytest.mark.parametrize("size", [0, 1, 3, 6, 100, 65535])
def test_auto_split_range_size_must_be_a_power_of_two(size: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        HashRangeAutoSplitSelector[FakeConsumer](size)


def test_auto_split_empty_and_unknown() -> None:
    selector = HashRangeAutoSplitSelector[FakeConsumer]()
    assert selector.select(5) is None
    assert selector.remove_consumer(FakeConsumer("ghost")).empty
    only = FakeConsumer("only")
    selector.add_consumer(only)
    assert selector.remove_consumer(only).removed == {only: (HashRange(0, 65536),)}
    assert selector.consumer_key_hash_ranges() == {}


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=25))
def test_auto_split_partitions_and_reports_exactly(ops: list[tuple[bool, int]]) -> None:
    size = 256
    selector = HashRangeAutoSplitSelector[FakeConsumer](size)
    pool = [FakeConsumer(f"c{i}") for i in range(10)]
    present: set[FakeConsumer] = set()
    for add, k in ops:
        before = owners_by_slot(selector.snapshot, size + 1)
        if add and pool[k] not in present:
            impacted = selector.add_consumer(pool[k])
            present.add(pool[k])
        else:
            impacted = selector.remove_consumer(pool[k])
            present.discard(pool[k])
        after = owners_by_slot(selector.snapshot, size + 1)
        assert_impacted_exactly(impacted, before, after, 0)
        assert set(selector.consumer_key_hash_ranges()) == present
        if present:
            assert None not in after  # the ranges partition [0, R]
            assert all(selector.select(slot) is after[slot] for slot in range(size))
        else:
            assert selector.snapshot.assignments == ()


# ---------------------------------------------------------------------------------------------
# §2.6: exclusive (STICKY)


@pytest.mark.parametrize(("ranges", "message"), [
    (None, "Must specify key shared meta for consumer."),
    ((), "Ranges for KeyShared policy must not be empty."),
    (((5, 3),), "Fixed hash range start > end for range: [5,3]"),
    (((20, 30), (0, 10), (5, 12)),
     "Consumer's own ranges conflict: [0,10] overlaps with [5,12]"),
    (((0, 10), (10, 20)), "Consumer's own ranges conflict: [0,10] overlaps with [10,20]"),
])
def test_sticky_validation_messages(ranges: tuple[tuple[int, int], ...] | None,
                                    message: str) -> None:
    selector = HashRangeExclusiveSelector[FakeConsumer]()
    with pytest.raises(ConsumerAssignError) as failure:
        selector.add_consumer(FakeConsumer("c", ranges))
    assert str(failure.value) == message
    assert selector.consumer_key_hash_ranges() == {}


def test_sticky_adjacent_own_ranges_are_fine_and_merge_in_the_view() -> None:
    selector: StickyKeyConsumerSelector[FakeConsumer] = HashRangeExclusiveSelector()
    c = sticky("c", (10, 20), (0, 9), (100, 200))
    assert selector.add_consumer(c) is None  # STICKY reports no impacted consumers
    assert selector.consumer_key_hash_ranges() == {c: [HashRange(0, 20), HashRange(100, 200)]}
    assert selector.select(50) is None


def test_sticky_conflict_matrix() -> None:
    selector: StickyKeyConsumerSelector[FakeConsumer] = HashRangeExclusiveSelector()
    c1 = sticky("c1", (0, 99), (400, 65535))
    c2 = sticky("c2", (100, 399))
    selector.add_consumer(c1)
    selector.add_consumer(c2)
    for ranges, owner in ([(0, 65535)], c1), ([(1, 1)], c1):
        with pytest.raises(ConsumerAssignError) as failure:
            selector.add_consumer(sticky("new", *ranges))
        assert str(failure.value) == f"Range conflict with consumer {owner}"
    assert selector.remove_consumer(c1) is None
    for ranges in ([(0, 65535)], [(50, 100)], [(399, 500)]):
        with pytest.raises(ConsumerAssignError, match="Range conflict with consumer") as failure:
            selector.add_consumer(sticky("new", *ranges))
        assert str(failure.value) == f"Range conflict with consumer {c2}"
    c3, c4 = sticky("c3", (400, 600)), sticky("c4", (50, 99))
    selector.add_consumer(c3)
    selector.add_consumer(c4)
    assert selector.consumer_key_hash_ranges() == {
        c4: [HashRange(50, 99)], c2: [HashRange(100, 399)], c3: [HashRange(400, 600)]}


def test_sticky_select_uses_containment() -> None:
    selector = HashRangeExclusiveSelector[FakeConsumer]()
    c1 = sticky("c1", (0, 99), (400, 65535))
    c2 = sticky("c2", (100, 399))
    selector.add_consumer(c1)
    selector.add_consumer(c2)
    expected = {0: c1, 99: c1, 100: c2, 200: c2, 399: c2, 400: c1, 65535: c1}
    for slot, owner in expected.items():
        assert selector.select(slot) is owner
    selector.remove_consumer(c2)
    # 4.0.0 routed a slot in the gap between two ranges of c1 to c1; #24730 routes it nowhere.
    assert selector.select(200) is None
    assert selector.select(99) is c1
    assert selector.select(400) is c1


def test_sticky_find_conflicting_consumer() -> None:
    selector = HashRangeExclusiveSelector[FakeConsumer]()
    c1, c2 = sticky("c1", (10, 19)), sticky("c2", (30, 39))
    selector.add_consumer(c1)
    selector.add_consumer(c2)
    assert selector.find_conflicting_consumer([(0, 9)]) is None
    assert selector.find_conflicting_consumer([(20, 29), (40, 50)]) is None
    assert selector.find_conflicting_consumer([(0, 10)]) is c1
    assert selector.find_conflicting_consumer([(19, 19)]) is c1
    assert selector.find_conflicting_consumer([(20, 30)]) is c2
    assert selector.find_conflicting_consumer([(0, 5), (25, 100)]) is c2


RANGE = st.tuples(st.integers(0, 300), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=60, deadline=None)
@given(declared=st.lists(st.lists(RANGE, min_size=1, max_size=3), min_size=1, max_size=6))
def test_sticky_accepts_exactly_the_non_overlapping_and_selects_by_containment(
        declared: list[list[tuple[int, int]]]) -> None:
    selector = HashRangeExclusiveSelector[FakeConsumer]()
    owners: dict[int, FakeConsumer] = {}
    for i, ranges in enumerate(declared):
        consumer = sticky(f"c{i}", *ranges)
        slots = [s for start, end in ranges for s in range(start, end + 1)]
        acceptable = len(slots) == len(set(slots)) and not set(slots) & set(owners)
        try:
            selector.add_consumer(consumer)
        except ConsumerAssignError:
            assert not acceptable
        else:
            assert acceptable
            owners.update(dict.fromkeys(slots, consumer))
    for slot in range(0, 350):
        assert selector.select(slot) is owners.get(slot)


# ---------------------------------------------------------------------------------------------
# §2.4.4: snapshots and the lost-ranges diff


def snapshot(*assignments: tuple[int, int, FakeConsumer]
             ) -> ConsumerHashAssignmentsSnapshot[FakeConsumer]:
    return ConsumerHashAssignmentsSnapshot((HashRange(s, e), c) for s, e, c in assignments)


C1, C2 = FakeConsumer("c1"), FakeConsumer("c2")


def test_snapshot_same_mapping_reports_nothing() -> None:
    before = snapshot((1, 5, C1), (6, 10, C2))
    after = snapshot((1, 5, C1), (6, 10, C2))
    assert before.diff(after) == []
    assert before.resolve_impacted_consumers(after).empty


def test_snapshot_owner_change() -> None:
    impacted = snapshot((1, 5, C1)).resolve_impacted_consumers(snapshot((1, 5, C2)))
    assert impacted.removed == {C1: (HashRange(1, 5),)}
    assert impacted.added == {C2: (HashRange(1, 5),)}


def test_snapshot_range_removed() -> None:
    impacted = snapshot((1, 5, C1)).resolve_impacted_consumers(snapshot())
    assert impacted.removed == {C1: (HashRange(1, 5),)}
    assert impacted.added == {}


def test_snapshot_range_added_loses_nothing() -> None:
    impacted = snapshot().resolve_impacted_consumers(snapshot((1, 5, C1)))
    assert impacted.removed == {}
    assert impacted.added == {C1: (HashRange(1, 5),)}


def test_snapshot_partial_overlap() -> None:
    before, after = snapshot((1, 5, C1)), snapshot((3, 7, C2))
    assert before.diff(after) == [RangeChange(HashRange(3, 5), C1, C2),
                                  RangeChange(HashRange(3, 7), None, C2)]
    impacted = before.resolve_impacted_consumers(after)
    assert impacted.removed == {C1: (HashRange(3, 5),)}
    assert impacted.added == {C2: (HashRange(3, 7),)}


def test_snapshot_lost_ranges_are_merged() -> None:
    before = snapshot((1, 5, C1), (6, 10, C1), (11, 20, C2), (21, 30, C1))
    after = snapshot((1, 10, C2), (11, 20, C2), (21, 30, C2))
    impacted = before.resolve_impacted_consumers(after)
    assert impacted.removed == {C1: (HashRange(1, 10), HashRange(21, 30))}
    assert impacted.added == {C2: (HashRange(1, 10), HashRange(21, 30))}


def test_snapshot_ranges_by_consumer_merges_adjacent() -> None:
    snap = snapshot((1, 5, C1), (6, 10, C1), (11, 20, C2), (22, 30, C1))
    assert snap.ranges_by_consumer() == {C1: [HashRange(1, 10), HashRange(22, 30)],
                                         C2: [HashRange(11, 20)]}


def test_snapshot_rejects_unsorted_or_overlapping_assignments() -> None:
    with pytest.raises(AssertionError):
        snapshot((1, 5, C1), (5, 10, C2))


POOL = [FakeConsumer(f"p{i}") for i in range(4)]


@st.composite
def full_partitions(draw: st.DrawFn, high: int = 60) -> list[tuple[int, int, FakeConsumer]]:
    cuts = sorted(draw(st.sets(st.integers(1, high - 1), max_size=8)))
    bounds = [0, *cuts, high]
    return [(bounds[i] + 1, bounds[i + 1], draw(st.sampled_from(POOL)))
            for i in range(len(bounds) - 1)]


@settings(max_examples=150, deadline=None)
@given(before=full_partitions(), after=full_partitions())
def test_snapshot_diff_matches_slot_by_slot_comparison(
        before: list[tuple[int, int, FakeConsumer]],
        after: list[tuple[int, int, FakeConsumer]]) -> None:
    snap_before, snap_after = snapshot(*before), snapshot(*after)
    impacted = snap_before.resolve_impacted_consumers(snap_after)
    assert_impacted_exactly(impacted, owners_by_slot(snap_before, 61),
                            owners_by_slot(snap_after, 61), 1)


# ---------------------------------------------------------------------------------------------
# Range helpers and the factory


def test_merge_ranges() -> None:
    assert merge_ranges([]) == []
    assert merge_ranges([(10, 20), (1, 5), (6, 8), (15, 30), (40, 40)]) == [
        HashRange(1, 8), HashRange(10, 30), HashRange(40, 40)]
    assert merge_ranges([(1, 5), (7, 9)]) == [HashRange(1, 5), HashRange(7, 9)]


@settings(max_examples=100, deadline=None)
@given(ranges=st.lists(RANGE, max_size=8), slot=st.integers(0, 400))
def test_ranges_contain_matches_a_scan(ranges: Sequence[tuple[int, int]], slot: int) -> None:
    merged = merge_ranges(ranges)
    assert ranges_contain(merged, slot) == any(s <= slot <= e for s, e in ranges)


def test_new_selector_follows_mode_and_config() -> None:
    config = BrokerConfig()
    selector: StickyKeyConsumerSelector[FakeConsumer] = new_selector(config, sticky=True)
    assert isinstance(selector, HashRangeExclusiveSelector)
    selector = new_selector(config, sticky=False)
    assert isinstance(selector, ConsistentHashingSelector)
    c = FakeConsumer("c1")
    selector.add_consumer(c)
    assert len(selector.ring_points(c)) == 100
    few = BrokerConfig(key_shared_consistent_hashing_replica_points=7)
    selector = new_selector(few, sticky=False)
    assert isinstance(selector, ConsistentHashingSelector)
    selector.add_consumer(c)
    assert len(selector.ring_points(c)) == 7
    off = BrokerConfig(key_shared_use_consistent_hashing=False)
    assert isinstance(new_selector(off, sticky=False), HashRangeAutoSplitSelector)


def test_consistent_hashing_points_must_be_positive() -> None:
    with pytest.raises(ValueError, match="points"):
        ConsistentHashingSelector[FakeConsumer](0)
