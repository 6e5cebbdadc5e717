"""Draining hashes (broker reference §2.7.2, §11 item 9, stats of §2.7.6)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.broker.dispatch._draining import (
    UNBLOCKED_IN_BATCH,
    ConsumerDrainingStats,
    DrainingHash,
    DrainingHashesTracker,
)
from magnetar.broker.dispatch._pending_acks import PendingAcksMap
from magnetar.broker.dispatch._selectors import ConsistentHashingSelector, ranges_contain


@dataclass(eq=False)
class FakeConsumer:
    consumer_name: str

    def __repr__(self) -> str:
        return f"FakeConsumer({self.consumer_name})"


class Events:
    """Records the unblock events a tracker fires."""

    def __init__(self) -> None:
        self.slots: list[int] = []

    def __call__(self, slot: int) -> None:
        self.slots.append(slot)


def make_tracker() -> tuple[DrainingHashesTracker[FakeConsumer], Events]:
    events = Events()
    return DrainingHashesTracker("dispatcher1", events), events


C1, C2 = FakeConsumer("consumer1"), FakeConsumer("consumer2")


def test_add_entry_creates_an_entry() -> None:
    tracker, _ = make_tracker()
    tracker.add_entry(C1, 1)
    entry = tracker.get_entry(1)
    assert entry is not None
    assert entry.consumer is C1
    assert (entry.ref_count, entry.blocked_count) == (1, 0)
    tracker.add_entry(C1, 1)
    assert entry.ref_count == 2
    assert len(tracker) == 1


def test_add_entry_rejects_slot_zero() -> None:
    tracker, _ = make_tracker()
    with pytest.raises(ValueError, match="0"):
        tracker.add_entry(C1, 0)
    assert len(tracker) == 0


def test_add_entry_rejects_a_slot_draining_for_another_consumer() -> None:
    tracker, _ = make_tracker()
    tracker.add_entry(C1, 7)
    with pytest.raises(RuntimeError, match="already draining hash 7 in dispatcher dispatcher1"):
        tracker.add_entry(C2, 7)
    entry = tracker.get_entry(7)
    assert entry is not None
    assert entry.consumer is C1
    assert entry.ref_count == 1


def test_releasing_the_last_reference_deletes_the_entry() -> None:
    tracker, events = make_tracker()
    tracker.add_entry(C1, 1)
    tracker.add_entry(C1, 1)
    tracker.reduce_ref_count(C1, 1, closing=False)
    assert tracker.get_entry(1) is not None
    tracker.reduce_ref_count(C1, 1, closing=False)
    assert tracker.get_entry(1) is None
    assert events.slots == []  # nothing was blocked, so nothing to unblock


def test_releasing_from_the_wrong_consumer_is_an_error() -> None:
    tracker, _ = make_tracker()
    tracker.add_entry(C1, 1)
    with pytest.raises(RuntimeError, match="already draining"):
        tracker.reduce_ref_count(C2, 1, closing=False)
    entry = tracker.get_entry(1)
    assert entry is not None
    assert entry.consumer is C1
    assert entry.ref_count == 1


def test_releasing_an_untracked_slot_or_slot_zero_is_ignored() -> None:
    tracker, events = make_tracker()
    tracker.reduce_ref_count(C1, 5, closing=False)
    tracker.reduce_ref_count(C1, 0, closing=False)
    assert len(tracker) == 0
    assert events.slots == []


def test_same_consumer_is_not_blocked_and_drops_the_entry() -> None:
    tracker, _ = make_tracker()
    tracker.add_entry(C1, 1)
    assert tracker.should_block(C1, 1) is False
    assert tracker.get_entry(1) is None  # the slot came back to its owner
    assert tracker.consumer_stats(C1).draining_hashes_cleared_total == 1


def test_another_consumer_is_blocked_and_counted() -> None:
    tracker, _ = make_tracker()
    tracker.add_entry(C1, 1)
    assert tracker.should_block(C2, 1) is True
    assert tracker.should_block(C2, 1) is True
    entry = tracker.get_entry(1)
    assert entry is not None
    assert entry.blocked_count == 2


def test_no_entry_or_slot_zero_does_not_block() -> None:
    tracker, _ = make_tracker()
    assert tracker.should_block(C1, 1) is False
    assert tracker.should_block(C1, 0) is False
    assert len(tracker) == 0


def test_unblock_fires_on_release_only_when_something_was_blocked() -> None:
    tracker, events = make_tracker()
    tracker.add_entry(C1, 1)
    tracker.add_entry(C1, 2)
    tracker.should_block(C2, 1)
    tracker.reduce_ref_count(C1, 1, closing=False)
    tracker.reduce_ref_count(C1, 2, closing=False)
    assert events.slots == [1]


def test_no_unblock_when_the_release_is_a_close() -> None:
    tracker, events = make_tracker()
    tracker.add_entry(C1, 1)
    tracker.should_block(C2, 1)
    tracker.reduce_ref_count(C1, 1, closing=True)
    assert tracker.get_entry(1) is None
    assert events.slots == []


def test_batch_levels_nest() -> None:
    tracker, _ = make_tracker()
    for depth in (1, 2, 3):
        tracker.start_batch()
        assert tracker.batch_depth == depth
    for depth in (2, 1, 0):
        tracker.end_batch()
        assert tracker.batch_depth == depth
    with pytest.raises(AssertionError):
        tracker.end_batch()


def test_unblocks_inside_a_batch_collapse_into_one_event_at_the_outermost_end() -> None:
    tracker, events = make_tracker()
    for slot in (1, 2, 3):
        tracker.add_entry(C1, slot)
        tracker.should_block(C2, slot)
    tracker.start_batch()
    tracker.reduce_ref_count(C1, 1, closing=False)
    with tracker.batch():
        tracker.reduce_ref_count(C1, 2, closing=False)
        tracker.reduce_ref_count(C1, 3, closing=False)
    assert events.slots == []  # the inner end is not the outermost
    tracker.end_batch()
    assert events.slots == [UNBLOCKED_IN_BATCH]
    assert UNBLOCKED_IN_BATCH == -1
    with tracker.batch():
        pass
    assert events.slots == [-1]  # a batch with no unblock fires nothing


def test_batch_of_closing_releases_fires_nothing() -> None:
    tracker, events = make_tracker()
    tracker.add_entry(C1, 1)
    tracker.should_block(C2, 1)
    with tracker.batch():
        tracker.reduce_ref_count(C1, 1, closing=True)
    assert events.slots == []


def test_clear_removes_all_entries_and_stats() -> None:
    tracker, _ = make_tracker()
    tracker.add_entry(C1, 1)
    tracker.add_entry(C2, 2)
    tracker.clear()
    assert tracker.get_entry(1) is None
    assert tracker.get_entry(2) is None
    assert len(tracker) == 0
    assert tracker.consumer_stats(C1) == ConsumerDrainingStats()


def test_consumer_stats() -> None:
    tracker, _ = make_tracker()
    assert tracker.consumer_stats(C1).to_json() == {
        "drainingHashesCount": 0, "drainingHashesClearedTotal": 0,
        "drainingHashesUnackedMessages": 0, "drainingHashes": []}
    for slot, refs in ((30, 2), (10, 1), (20, 3)):
        for _ in range(refs):
            tracker.add_entry(C1, slot)
    tracker.should_block(C2, 20)
    tracker.reduce_ref_count(C1, 10, closing=False)
    stats = tracker.consumer_stats(C1)
    assert stats.draining_hashes == (DrainingHash(20, 3, 1), DrainingHash(30, 2, 0))
    assert stats.to_json() == {
        "drainingHashesCount": 2,
        "drainingHashesClearedTotal": 1,
        "drainingHashesUnackedMessages": 5,
        "drainingHashes": [{"hash": 20, "unackMsgs": 3, "blockedAttempts": 1},
                           {"hash": 30, "unackMsgs": 2, "blockedAttempts": 0}],
    }
    assert tracker.consumer_stats(C2) == ConsumerDrainingStats()
    tracker.consumer_removed(C1)
    assert tracker.consumer_stats(C1) == ConsumerDrainingStats()


@dataclass
class ModelEntry:
    owner: FakeConsumer
    refs: int = 0
    blocked: int = 0


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "reduce", "close", "block"]),
                              st.sampled_from([C1, C2]), st.integers(1, 4)), max_size=40))
def test_tracker_matches_a_reference_model(ops: list[tuple[str, FakeConsumer, int]]) -> None:
    tracker, events = make_tracker()
    model: dict[int, ModelEntry] = {}
    expected_events: list[int] = []
    for op, consumer, slot in ops:
        entry = model.get(slot)
        foreign = entry is not None and entry.owner is not consumer
        if op == "block":
            assert tracker.should_block(consumer, slot) == foreign
            if entry is not None and foreign:
                entry.blocked += 1
            elif entry is not None:
                del model[slot]
        elif foreign and op == "add":
            with pytest.raises(RuntimeError):
                tracker.add_entry(consumer, slot)
        elif foreign:
            with pytest.raises(RuntimeError):
                tracker.reduce_ref_count(consumer, slot, closing=op == "close")
        elif op == "add":
            tracker.add_entry(consumer, slot)
            model.setdefault(slot, ModelEntry(consumer)).refs += 1
        else:
            tracker.reduce_ref_count(consumer, slot, closing=op == "close")
            if entry is not None:
                entry.refs -= 1
                if entry.refs == 0:
                    del model[slot]
                    if entry.blocked > 0 and op == "reduce":
                        expected_events.append(slot)
        actual = {s: ModelEntry(e.consumer, e.ref_count, e.blocked_count)
                  for s in range(1, 5) if (e := tracker.get_entry(s)) is not None}
        assert actual == model
    assert events.slots == expected_events


def test_worked_stats_example_with_a_selector_and_pending_acks() -> None:
    """§2.7.6: c1 holds 20 unacked messages over keys "0".."9" (2 per key); c2 joins."""
    selector = ConsistentHashingSelector[FakeConsumer]()
    tracker, events = make_tracker()
    c1, c2 = FakeConsumer("c1"), FakeConsumer("c2")
    selector.add_consumer(c1)
    acks = PendingAcksMap(c1)
    slots = {key: selector.slot_for(str(key).encode()) for key in range(10)}
    for entry_id in range(20):
        assert acks.add(1, entry_id, 1, slots[entry_id % 10])
    impacted = selector.add_consumer(c2)
    lost = impacted.removed_from(c1)
    for _, _, _, slot in acks:
        if ranges_contain(lost, slot):
            tracker.add_entry(c1, slot)
    moved = sorted({slot for slot in slots.values() if selector.select(slot) is c2})
    assert moved, "some of the ten keys must move to c2 for the example to say anything"
    stats = tracker.consumer_stats(c1)
    assert [h.hash for h in stats.draining_hashes] == moved
    assert all(h.unack_msgs == 2 for h in stats.draining_hashes)
    assert stats.draining_hashes_count == len(moved)
    assert stats.draining_hashes_unacked_messages == 2 * len(moved)
    assert stats.draining_hashes_cleared_total == 0
    assert tracker.consumer_stats(c2) == ConsumerDrainingStats()
    # 20 more messages for the same keys: each one for c2 is blocked.
    for entry_id in range(20, 40):
        slot = slots[entry_id % 10]
        owner = selector.select(slot)
        assert tracker.should_block(c2, slot) == (owner is c2)
    assert all(h.blocked_attempts > 0 for h in tracker.consumer_stats(c1).draining_hashes)
    # c1 acks its old messages: the slots drain one by one and each fires an unblock.
    for entry_id in range(20):
        removed = acks.remove(1, entry_id)
        assert removed is not None
        tracker.reduce_ref_count(c1, removed.slot, closing=False)
    assert tracker.consumer_stats(c1).draining_hashes == ()
    assert tracker.consumer_stats(c1).draining_hashes_cleared_total == len(moved)
    assert sorted(events.slots) == moved
