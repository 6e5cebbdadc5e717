"""The in-memory delayed-delivery tracker: upstream's AbstractDeliveryTrackerTest and
InMemoryDeliveryTrackerTest examples (reference §6, §11 item 38), the timer rule, the
in-memory bound, and properties of the scheduled output."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.broker._config import BrokerConfig
from magnetar.broker.dispatch._delayed import DelayedAdd, InMemoryDelayedDeliveryTracker

TRACKED = DelayedAdd.TRACKED
NOT_DELAYED = DelayedAdd.NOT_DELAYED
OVERFLOW = DelayedAdd.OVERFLOW


class FakeClock:
    """A settable millisecond clock."""

    def __init__(self, now: float = 0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(clock: FakeClock, *, tick_time_ms: int, strict: bool,
         tracked_messages_max: int = 100_000) -> InMemoryDelayedDeliveryTracker:
    """A tracker without fixed-delay detection (upstream's tests use lookahead 0)."""
    return InMemoryDelayedDeliveryTracker(
        clock, tick_time_ms=tick_time_ms, strict=strict, fixed_delay_detection_lookahead=0,
        tracked_messages_max=tracked_messages_max)


@pytest.mark.parametrize("strict", [False, True])
def test_upstream_sequence_with_tick_1(strict: bool) -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=1, strict=strict)
    assert not tracker.has_message_available()
    assert tracker.add(1, 2, 20) is TRACKED
    assert tracker.add(2, 1, 10) is TRACKED
    assert tracker.add(3, 3, 30) is TRACKED
    assert tracker.add(4, 5, 50) is TRACKED
    assert tracker.add(5, 4, 40) is TRACKED
    assert not tracker.has_message_available()
    assert tracker.size() == 5
    assert tracker.get_scheduled_messages(10) == []

    clock.now = 15
    assert tracker.add(6, 6, 10) is NOT_DELAYED  # already due: goes out at once
    assert tracker.size() == 5
    assert tracker.has_message_available()
    assert tracker.get_scheduled_messages(10) == [(2, 1)]

    clock.now = 60
    assert tracker.size() == 4
    assert tracker.has_message_available()
    assert len(tracker.get_scheduled_messages(1)) == 1
    assert tracker.size() == 3
    assert tracker.has_message_available()
    assert len(tracker.get_scheduled_messages(3)) == 3
    assert tracker.size() == 0
    assert not tracker.has_message_available()
    assert tracker.get_scheduled_messages(10) == []


def test_add_within_tick_time_non_strict() -> None:
    tracker = make(FakeClock(0), tick_time_ms=100, strict=False)
    assert tracker.add(1, 1, 10) is NOT_DELAYED
    assert tracker.add(2, 2, 99) is NOT_DELAYED
    assert tracker.add(3, 3, 100) is NOT_DELAYED
    assert tracker.add(4, 4, 101) is TRACKED
    assert tracker.add(5, 5, 200) is TRACKED
    assert tracker.size() == 2


@pytest.mark.parametrize("tick", [0, 100])
def test_add_with_strict_cutoff(tick: int) -> None:
    tracker = make(FakeClock(10), tick_time_ms=tick, strict=True)
    assert tracker.add(1, 1, 9) is NOT_DELAYED
    assert tracker.add(4, 4, 10) is NOT_DELAYED
    assert tracker.add(1, 1, 11) is TRACKED
    assert tracker.size() == 1
    assert not tracker.has_message_available()


def test_negative_deliver_at_is_not_delayed() -> None:
    tracker = make(FakeClock(0), tick_time_ms=1, strict=True)
    assert tracker.add(1, 1, -1) is NOT_DELAYED
    assert tracker.size() == 0


def test_earliest_due_are_taken_first_then_sorted_by_position() -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=1, strict=True)
    tracker.add(5, 0, 10)
    tracker.add(1, 0, 20)
    tracker.add(3, 0, 15)
    tracker.add(2, 9, 16)
    clock.now = 100
    assert tracker.get_scheduled_messages(2) == [(3, 0), (5, 0)]
    assert tracker.get_scheduled_messages(0) == []
    assert tracker.get_scheduled_messages(5) == [(1, 0), (2, 9)]


def test_same_position_is_tracked_once() -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=1, strict=True)
    assert tracker.add(1, 1, 50) is TRACKED
    assert tracker.add(1, 1, 50) is TRACKED
    assert tracker.size() == 1
    clock.now = 50
    assert tracker.get_scheduled_messages(10) == [(1, 1)]
    assert tracker.size() == 0


def test_reset_tick_time_moves_the_cutoff() -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=0, strict=False)
    assert tracker.add(1, 1, 50) is TRACKED
    assert not tracker.has_message_available()
    tracker.reset_tick_time(50)
    assert tracker.tick_time_ms == 50
    assert tracker.has_message_available()
    assert tracker.add(2, 2, 40) is NOT_DELAYED


def test_from_config() -> None:
    config = BrokerConfig(delayed_delivery_tick_time_ms=7,
                          delayed_delivery_deliver_at_time_strict=True,
                          delayed_delivery_tracked_in_memory_max=2)
    tracker = InMemoryDelayedDeliveryTracker.from_config(config, FakeClock(0))
    assert tracker.tick_time_ms == 7
    assert tracker.add(1, 1, 1) is TRACKED  # strict: cutoff is now, not now + tick
    assert tracker.add(1, 2, 1) is TRACKED
    assert tracker.add(1, 3, 1) is OVERFLOW


# -- the timer --------------------------------------------------------------------------------


def test_timer_target_follows_the_earliest_message() -> None:
    tracker = make(FakeClock(0), tick_time_ms=1, strict=False)
    assert tracker.next_delivery_time() is None
    tracker.add(2, 2, 20)
    assert tracker.next_delivery_time() == 20
    tracker.add(1, 1, 10)
    assert tracker.next_delivery_time() == 10
    tracker.add(3, 3, 30)
    assert tracker.next_delivery_time() == 10


def test_timer_waits_a_full_tick_after_the_last_one() -> None:
    # deliver_at is after now, but too early for another tick: the tick decides the delay.
    clock = FakeClock(10_000)
    tracker = make(clock, tick_time_ms=1000, strict=True)
    tracker.on_timer_fired()
    assert tracker.add(1, 1, 10_001) is TRACKED
    assert tracker.next_delivery_time() == 11_000


def test_timer_at_deliver_time_when_no_recent_tick() -> None:
    clock = FakeClock(500_000)
    tracker = make(clock, tick_time_ms=1, strict=True)
    assert tracker.add(1, 1, 500_005) is TRACKED
    assert tracker.next_delivery_time() == 500_005


def test_timer_at_deliver_time_beyond_a_full_tick() -> None:
    tracker = make(FakeClock(0), tick_time_ms=500, strict=True)
    assert tracker.add(1, 1, 2000) is TRACKED
    assert tracker.next_delivery_time() == 2000


def test_no_timer_when_the_earliest_is_past_due() -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=1000, strict=True)
    tracker.add(1, 1, 50)
    clock.now = 60
    assert tracker.has_message_available()
    assert tracker.next_delivery_time() is None
    tracker.get_scheduled_messages(10)
    assert tracker.next_delivery_time() is None


@pytest.mark.parametrize("strict", [False, True])
def test_timer_fires_at_most_once_per_tick(strict: bool) -> None:
    tick = 100
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=tick, strict=strict)
    deliver_at = {(1, i): 200 + 3 * i for i in range(400)}
    for (ledger, entry), at in deliver_at.items():
        assert tracker.add(ledger, entry, at) is TRACKED
    fired: list[float] = []
    delivered: list[tuple[int, int]] = []
    while tracker.size():
        target = tracker.next_delivery_time()
        assert target is not None
        clock.now = target
        tracker.on_timer_fired()
        fired.append(target)
        batch = tracker.get_scheduled_messages(1000)
        assert batch, "a timer that fires has something due"
        for position in batch:
            early_allowed = 0 if strict else tick
            assert deliver_at[position] - early_allowed <= clock.now
        delivered.extend(batch)
    assert sorted(delivered) == sorted(deliver_at)
    gaps = [b - a for a, b in itertools.pairwise(fired)]
    assert all(gap >= tick for gap in gaps)
    # 1200 ms of deliver-at times at one fire per tick or less.
    assert len(fired) <= 1200 // tick + 1


# -- fixed-delay detection --------------------------------------------------------------------

LOOKAHEAD = 100


def fixed_delay_tracker(clock: FakeClock) -> InMemoryDelayedDeliveryTracker:
    tracker = InMemoryDelayedDeliveryTracker(
        clock, tick_time_ms=500, strict=True, fixed_delay_detection_lookahead=LOOKAHEAD)
    assert not tracker.has_message_available()
    for i in range(1, 6):
        assert tracker.add(i, i, i * 10) is TRACKED
    assert not tracker.has_message_available()
    assert tracker.size() == 5
    assert not tracker.should_pause_all_deliveries()
    for i in range(6, LOOKAHEAD + 1):
        assert tracker.add(i, i, i * 10) is TRACKED
    assert tracker.should_pause_all_deliveries()
    return tracker


def test_fixed_delays_pause_then_resume_when_due() -> None:
    clock = FakeClock(0)
    tracker = fixed_delay_tracker(clock)
    clock.now = LOOKAHEAD * 10
    tracker.get_scheduled_messages(100)
    assert not tracker.should_pause_all_deliveries()
    while tracker.get_scheduled_messages(100):
        pass
    assert not tracker.should_pause_all_deliveries()


def test_fixed_delays_pause_only_while_nothing_is_due() -> None:
    clock = FakeClock(0)
    tracker = fixed_delay_tracker(clock)
    clock.now = 10  # the first message is due: the dispatcher must read it
    assert not tracker.should_pause_all_deliveries()


def test_out_of_order_delay_stops_the_pause() -> None:
    tracker = fixed_delay_tracker(FakeClock(0))
    assert tracker.add(5, 6, 5) is TRACKED  # earlier than highest - tick
    assert not tracker.should_pause_all_deliveries()


def test_out_of_order_within_a_tick_keeps_the_pause() -> None:
    tracker = fixed_delay_tracker(FakeClock(0))
    assert tracker.add(5, 6, LOOKAHEAD * 10 - 500) is TRACKED  # exactly highest - tick
    assert tracker.should_pause_all_deliveries()


def test_not_delayed_message_stops_the_pause() -> None:
    tracker = fixed_delay_tracker(FakeClock(0))
    assert tracker.add(5, 6, -1) is NOT_DELAYED
    assert not tracker.should_pause_all_deliveries()


def test_detection_restarts_once_the_tracker_is_empty() -> None:
    clock = FakeClock(0)
    tracker = fixed_delay_tracker(clock)
    tracker.add(9, 9, -1)
    assert not tracker.should_pause_all_deliveries()
    clock.now = 10_000
    while tracker.get_scheduled_messages(1000):
        pass
    for i in range(LOOKAHEAD):
        tracker.add(20, i, 20_000 + i)
    assert tracker.should_pause_all_deliveries()
    tracker.clear()
    assert tracker.size() == 0
    assert not tracker.should_pause_all_deliveries()
    for i in range(LOOKAHEAD):
        tracker.add(21, i, 30_000 + i)
    assert tracker.should_pause_all_deliveries()


def test_lookahead_zero_never_pauses() -> None:
    tracker = make(FakeClock(0), tick_time_ms=500, strict=True)
    for i in range(1, 200):
        tracker.add(i, i, i * 10)
    assert not tracker.should_pause_all_deliveries()


# -- the in-memory bound ----------------------------------------------------------------------


def test_overflow_when_full() -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=1, strict=True, tracked_messages_max=3)
    for entry in range(3):
        assert tracker.add(1, entry, 100 + entry) is TRACKED
    assert tracker.is_full
    assert tracker.add(1, 3, 50) is OVERFLOW  # even an earlier one: no eviction
    assert tracker.add(1, 1, 101) is TRACKED  # already held
    assert tracker.add(1, 4, -1) is NOT_DELAYED  # not delayed: goes out
    assert tracker.size() == 3
    assert tracker.should_pause_all_deliveries()  # full and nothing due: stop reading

    clock.now = 100
    assert not tracker.should_pause_all_deliveries()  # something is due: read it
    assert tracker.get_scheduled_messages(1) == [(1, 0)]
    assert not tracker.is_full
    assert tracker.add(1, 3, 150) is TRACKED  # re-read after room was made
    assert tracker.add(1, 5, 150) is OVERFLOW


def test_clear_forgets_everything() -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=1, strict=True, tracked_messages_max=2)
    tracker.add(1, 1, 10)
    tracker.add(1, 2, 20)
    tracker.clear()
    assert tracker.size() == 0
    assert not tracker.is_full
    assert tracker.next_delivery_time() is None
    clock.now = 100
    assert tracker.get_scheduled_messages(10) == []
    assert tracker.add(1, 1, 200) is TRACKED


# -- properties -------------------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 5), st.integers(0, 20),
                  st.integers(-5, 400)),
        st.tuples(st.just("advance"), st.integers(0, 60)),
        st.tuples(st.just("take"), st.integers(0, 8)),
    ),
    max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS, strict=st.booleans(), tick=st.integers(0, 50), bound=st.integers(1, 30))
def test_scheduled_output_is_sorted_and_never_early(
        ops: list[tuple[object, ...]], strict: bool, tick: int, bound: int) -> None:
    clock = FakeClock(0)
    tracker = make(clock, tick_time_ms=tick, strict=strict, tracked_messages_max=bound)
    model: dict[tuple[int, int], int] = {}  # tracked position -> deliver_at
    for op in ops:
        if op[0] == "add":
            _, ledger, entry, at = op
            assert isinstance(ledger, int)
            assert isinstance(entry, int)
            assert isinstance(at, int)
            result = tracker.add(ledger, entry, at)
            cutoff = clock.now if strict else clock.now + tick
            if at < 0 or at <= cutoff:
                assert result is NOT_DELAYED
            elif (ledger, entry) in model:
                assert result is TRACKED
            elif len(model) >= bound:
                assert result is OVERFLOW
            else:
                assert result is TRACKED
                model[(ledger, entry)] = at
        elif op[0] == "advance":
            assert isinstance(op[1], int)
            clock.now += op[1]
        else:
            assert isinstance(op[1], int)
            taken = tracker.get_scheduled_messages(op[1])
            assert taken == sorted(taken)
            assert len(taken) <= op[1]
            early_allowed = 0 if strict else tick
            for position in taken:
                assert model[position] - early_allowed <= clock.now
            taken_times = [model.pop(position) for position in taken]
            # The earliest deliver-at times go first; a short answer leaves nothing due.
            if taken_times:
                assert all(at >= max(taken_times) for at in model.values())
            if len(taken) < op[1]:
                assert all(at - early_allowed > clock.now for at in model.values())
        assert tracker.size() == len(model) <= bound
        target = tracker.next_delivery_time()
        if target is not None:
            assert target >= min(model.values())
