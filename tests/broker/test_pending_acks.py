"""Pending acks (broker reference §2.7.2, §11 item 10), alone and wired to the draining
tracker the way the Key_Shared dispatcher wires them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from magnetar.broker.dispatch._draining import DrainingHashesTracker
from magnetar.broker.dispatch._pending_acks import PendingAck, PendingAcksMap


@dataclass(eq=False)
class FakeConsumer:
    consumer_name: str


CONSUMER = FakeConsumer("consumer1")


@dataclass
class RecordingHandler:
    """A remove handler that records what it hears."""

    calls: list[tuple[object, ...]] = field(default_factory=list)

    def handle_removing(self, consumer: FakeConsumer, ledger_id: int, entry_id: int, slot: int,
                        closing: bool) -> None:
        self.calls.append(("remove", consumer, ledger_id, entry_id, slot, closing))

    def start_batch(self) -> None:
        self.calls.append(("start",))

    def end_batch(self) -> None:
        self.calls.append(("end",))


def filled(*positions: tuple[int, int, int, int]) -> PendingAcksMap[FakeConsumer]:
    acks = PendingAcksMap(CONSUMER)
    for ledger_id, entry_id, batch_size, slot in positions:
        assert acks.add(ledger_id, entry_id, batch_size, slot)
    return acks


def test_add_when_allowed() -> None:
    acks = PendingAcksMap(CONSUMER)
    assert acks.add(1, 1, 1, 123) is True
    assert (1, 1) in acks
    assert acks.get(1, 1) == PendingAck(1, 123)
    assert len(acks) == 1


def test_add_refused_by_the_hook() -> None:
    seen: list[tuple[object, int, int, int]] = []

    def refuse(consumer: FakeConsumer, ledger_id: int, entry_id: int, slot: int) -> bool:
        seen.append((consumer, ledger_id, entry_id, slot))
        return False

    acks = PendingAcksMap(CONSUMER, add_hook=refuse)
    assert acks.add(1, 1, 1, 123) is False
    assert (1, 1) not in acks
    assert len(acks) == 0
    assert seen == [(CONSUMER, 1, 1, 123)]


def test_add_hook_is_consulted_and_can_allow() -> None:
    seen: list[tuple[object, int, int, int]] = []

    def allow(consumer: FakeConsumer, ledger_id: int, entry_id: int, slot: int) -> bool:
        seen.append((consumer, ledger_id, entry_id, slot))
        return True

    acks = PendingAcksMap(CONSUMER)
    acks.add_hook = allow  # the dispatcher installs it after creating the consumer
    assert acks.add(1, 1, 1, 123) is True
    assert seen == [(CONSUMER, 1, 1, 123)]


def test_add_refused_after_close() -> None:
    acks = PendingAcksMap(CONSUMER)
    acks.for_each_and_close(lambda *_: None)
    assert acks.closed
    assert acks.add(1, 1, 1, 123) is False
    assert (1, 1) not in acks
    assert len(acks) == 0


def test_for_each_visits_in_position_order() -> None:
    acks = filled((2, 1, 1, 125), (1, 2, 1, 124), (1, 1, 1, 123), (3, 0, 4, 9), (1, 7, 1, 5))
    seen: list[tuple[int, int, int, int]] = []
    acks.for_each(lambda *item: seen.append(item))
    assert seen == [(1, 1, 1, 123), (1, 2, 1, 124), (1, 7, 1, 5), (2, 1, 1, 125), (3, 0, 4, 9)]
    assert list(acks) == seen


def test_for_each_and_close_visits_clears_and_tells_the_handler() -> None:
    handler = RecordingHandler()
    acks = filled((1, 2, 1, 124), (1, 1, 1, 123))
    acks.remove_handler = handler
    visited: list[int] = []
    acks.for_each_and_close(lambda _l, entry_id, _b, _s: visited.append(entry_id))
    assert visited == [1, 2]
    assert len(acks) == 0
    assert list(acks) == []
    assert handler.calls == [("start",),
                             ("remove", CONSUMER, 1, 1, 123, True),
                             ("remove", CONSUMER, 1, 2, 124, True),
                             ("end",)]


def test_remove_returns_the_entry_and_tells_the_handler() -> None:
    handler = RecordingHandler()
    acks = PendingAcksMap(CONSUMER, remove_handler=handler)
    acks.add(1, 1, 5, 123)
    assert acks.remove(1, 1) == PendingAck(5, 123)
    assert (1, 1) not in acks
    assert len(acks) == 0
    assert handler.calls == [("remove", CONSUMER, 1, 1, 123, False)]
    assert acks.remove(1, 1) is None
    assert acks.remove(9, 9) is None
    assert len(handler.calls) == 1


def test_remove_all_up_to_within_a_ledger() -> None:
    acks = filled((1, 1, 1, 123), (1, 2, 1, 124), (2, 1, 1, 125))
    assert acks.remove_all_up_to(1, 2) == 2
    assert (1, 1) not in acks
    assert (1, 2) not in acks
    assert (2, 1) in acks
    assert len(acks) == 1


def test_remove_all_up_to_across_ledgers() -> None:
    acks = filled((1, 1, 1, 123), (1, 2, 1, 124), (2, 1, 1, 125), (2, 2, 1, 126), (3, 1, 1, 127))
    assert acks.remove_all_up_to(2, 1) == 3
    assert [(lid, eid) for lid, eid, _, _ in acks] == [(2, 2), (3, 1)]
    assert len(acks) == 2


def test_remove_all_up_to_a_position_between_entries_and_ledgers() -> None:
    acks = filled((1, 5, 1, 1), (3, 2, 1, 2), (3, 9, 1, 3), (5, 0, 1, 4))
    assert acks.remove_all_up_to(3, 4) == 2  # (1,5) and (3,2); no entry 3:4 exists
    assert [(lid, eid) for lid, eid, _, _ in acks] == [(3, 9), (5, 0)]
    assert acks.remove_all_up_to(4, 100) == 1
    assert acks.remove_all_up_to(0, 0) == 0
    assert [(lid, eid) for lid, eid, _, _ in acks] == [(5, 0)]


def test_remove_all_up_to_tells_the_handler_per_entry_in_one_batch() -> None:
    handler = RecordingHandler()
    acks = filled((1, 1, 3, 123), (1, 2, 5, 124), (2, 1, 7, 125))
    acks.remove_handler = handler
    removed: list[tuple[int, int, int, int]] = []
    acks.remove_all_up_to(1, 2, lambda *item: removed.append(item))
    assert removed == [(1, 1, 3, 123), (1, 2, 5, 124)]
    assert handler.calls == [("start",),
                             ("remove", CONSUMER, 1, 1, 123, False),
                             ("remove", CONSUMER, 1, 2, 124, False),
                             ("end",)]
    handler.calls.clear()
    assert acks.remove_all_up_to(1, 99) == 0
    assert handler.calls == []


def test_size_counts_entries_not_messages() -> None:
    acks = PendingAcksMap(CONSUMER)
    assert len(acks) == 0
    acks.add(1, 1, 1, 123)
    acks.add(1, 2, 1, 124)
    acks.add(2, 1, 1, 125)
    assert len(acks) == 3
    acks.add(1, 1, 10, 123)  # the same entry again, now a batch of 10: overwritten, counted once
    assert len(acks) == 3
    assert acks.get(1, 1) == PendingAck(10, 123)
    acks.remove(1, 2)
    assert len(acks) == 2
    acks.remove_all_up_to(1, 1)
    assert len(acks) == 1


def test_out_of_order_adds_iterate_sorted() -> None:
    acks = PendingAcksMap(CONSUMER)
    for entry_id in (5, 6, 2, 9, 1):
        acks.add(7, entry_id, 1, entry_id)
    assert [eid for _, eid, _, _ in acks] == [1, 2, 5, 6, 9]
    assert acks.remove_all_up_to(7, 5) == 3
    acks.add(7, 3, 1, 3)
    assert [eid for _, eid, _, _ in acks] == [3, 6, 9]


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(AssertionError):
        PendingAcksMap(CONSUMER).add(1, 1, 0, 5)


class PendingAcksModel(RuleBasedStateMachine):
    """The map against a plain dict, under random adds, removes, sweeps and a close."""

    def __init__(self) -> None:
        super().__init__()
        self.handler = RecordingHandler()
        self.acks = PendingAcksMap(CONSUMER, remove_handler=self.handler)
        self.model: dict[tuple[int, int], PendingAck] = {}
        self.closed = False

    positions = st.tuples(st.integers(0, 3), st.integers(0, 12))

    @rule(position=positions, batch_size=st.integers(1, 4), slot=st.integers(1, 9))
    def add(self, position: tuple[int, int], batch_size: int, slot: int) -> None:
        added = self.acks.add(*position, batch_size, slot)
        assert added is not self.closed
        if added:
            self.model[position] = PendingAck(batch_size, slot)

    @rule(position=positions)
    def remove(self, position: tuple[int, int]) -> None:
        self.handler.calls.clear()
        expected = self.model.pop(position, None)
        assert self.acks.remove(*position) == expected
        assert self.handler.calls == ([] if expected is None else
                                      [("remove", CONSUMER, *position, expected.slot, False)])

    @rule(position=positions)
    def remove_all_up_to(self, position: tuple[int, int]) -> None:
        self.handler.calls.clear()
        doomed = sorted(p for p in self.model if p <= position)
        removed: list[tuple[int, int]] = []
        count = self.acks.remove_all_up_to(*position, lambda lid, eid, _b, _s: removed.append(
            (lid, eid)))
        assert count == len(doomed)
        assert removed == doomed
        removals = [c[2:4] for c in self.handler.calls if c[0] == "remove"]
        assert removals == doomed
        for p in doomed:
            del self.model[p]

    @rule()
    def close(self) -> None:
        visited: list[tuple[int, int]] = []
        self.acks.for_each_and_close(lambda lid, eid, _b, _s: visited.append((lid, eid)))
        assert visited == sorted(self.model)
        self.model.clear()
        self.closed = True

    @invariant()
    def matches_the_model(self) -> None:
        assert len(self.acks) == len(self.model)
        assert list(self.acks) == [(lid, eid, ack.batch_size, ack.slot)
                                   for (lid, eid), ack in sorted(self.model.items())]


TestPendingAcksModel = PendingAcksModel.TestCase
TestPendingAcksModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# ---------------------------------------------------------------------------------------------
# Wired to the draining tracker, as the dispatcher does it


class DrainingBridge:
    """The dispatcher's glue: removals release draining references; adds are refused for a
    slot draining for another consumer."""

    def __init__(self, tracker: DrainingHashesTracker[FakeConsumer]) -> None:
        self.tracker = tracker

    def handle_removing(self, consumer: FakeConsumer, ledger_id: int, entry_id: int, slot: int,
                        closing: bool) -> None:
        self.tracker.reduce_ref_count(consumer, slot, closing)

    def start_batch(self) -> None:
        self.tracker.start_batch()

    def end_batch(self) -> None:
        self.tracker.end_batch()

    def allow_add(self, consumer: FakeConsumer, ledger_id: int, entry_id: int,
                  slot: int) -> bool:
        entry = self.tracker.get_entry(slot)
        return entry is None or entry.consumer is consumer


def wired() -> tuple[DrainingHashesTracker[FakeConsumer], list[int], DrainingBridge]:
    events: list[int] = []
    tracker = DrainingHashesTracker[FakeConsumer]("d", events.append)
    return tracker, events, DrainingBridge(tracker)


def test_add_refused_while_the_slot_drains_for_another_consumer() -> None:
    tracker, _, bridge = wired()
    old, new = FakeConsumer("old"), FakeConsumer("new")
    old_acks = PendingAcksMap(old, bridge.allow_add, bridge)
    new_acks = PendingAcksMap(new, bridge.allow_add, bridge)
    assert old_acks.add(1, 1, 1, 42)
    tracker.add_entry(old, 42)
    assert not new_acks.add(1, 2, 1, 42)
    assert old_acks.add(1, 3, 1, 42)  # its owner may still get the slot back
    assert new_acks.add(1, 4, 1, 43)


def test_acks_release_draining_and_a_sweep_fires_one_unblock() -> None:
    tracker, events, bridge = wired()
    old, new = FakeConsumer("old"), FakeConsumer("new")
    acks = PendingAcksMap(old, bridge.allow_add, bridge)
    for entry_id, slot in enumerate((5, 5, 6, 7)):
        acks.add(1, entry_id, 1, slot)
        tracker.add_entry(old, slot)
    for slot in (5, 6, 7):
        assert tracker.should_block(new, slot)
    acks.remove(1, 2)  # slot 6 drains on an individual ack: one event with its slot
    assert events == [6]
    acks.remove_all_up_to(1, 3)  # slots 5 and 7 drain in one sweep: one batched event
    assert events == [6, -1]
    assert len(tracker) == 0


def test_closing_consumer_releases_draining_without_unblock_events() -> None:
    tracker, events, bridge = wired()
    old, new = FakeConsumer("old"), FakeConsumer("new")
    acks = PendingAcksMap(old, bridge.allow_add, bridge)
    for entry_id, slot in enumerate((5, 6)):
        acks.add(1, entry_id, 1, slot)
        tracker.add_entry(old, slot)
        assert tracker.should_block(new, slot)
    replay: list[tuple[int, int, int]] = []
    acks.for_each_and_close(lambda lid, eid, _b, slot: replay.append((lid, eid, slot)))
    assert replay == [(1, 0, 5), (1, 1, 6)]
    assert len(tracker) == 0
    assert events == []
    assert tracker.batch_depth == 0
