"""The in-memory delayed-delivery tracker of a Shared or Key_Shared subscription (reference §6).

Theory of operation
-------------------

A message is *delayed* when its metadata carries `deliver_at_time` (epoch ms). Delayed messages
are stored in the topic as ordinary entries; only this index of "which entries are waiting, and
until when" lives in memory. The dispatcher asks the tracker about every entry it reads:

* `add(ledger, entry, deliver_at)` returns NOT_DELAYED when the entry may go out now
  (`deliver_at < 0`, or `deliver_at <= cutoff`), TRACKED when the tracker now holds it (the
  dispatcher must not send it), or OVERFLOW (see "The bound" below).
* The cutoff is `now + tick_time_ms` by default, so a message may go out up to one tick early;
  with `strict=True` it is `now`, so a message never goes out early but may be up to a tick late.
* `get_scheduled_messages(n)` removes up to n due positions (earliest deliver-at first) and
  returns them sorted by position. The dispatcher puts them in its replay queue, so due messages
  go out in position order, ahead of new reads.
* A timer makes the dispatcher read again when the earliest message comes due.
  `next_delivery_time()` says when: `max(earliest deliver_at, last tick + tick_time_ms)`, so the
  timer fires at most once per tick; `on_timer_fired()` records the tick. No timer is needed
  when the earliest message is already due: the dispatcher is behind and will find it anyway.
* Fixed-delay detection: when every message was added with a deliver-at no earlier than the
  highest seen minus one tick, the tracker holds at least `fixed_delay_detection_lookahead`
  messages and none is due, `should_pause_all_deliveries()` tells the dispatcher to stop reading
  new entries: with fixed delays, later entries come due later, so reading them only fills
  memory. One out-of-order deliver-at, or one not-delayed message, turns the detection off until
  the tracker is empty again.

The bound
---------

Upstream's tracker grows without limit. This one holds at most `tracked_messages_max` positions
(`BrokerConfig.delayed_delivery_tracked_in_memory_max`, 100000 by default, about 10 MB). When it
is full, `add` of a new delayed position returns OVERFLOW: the dispatcher must leave that entry
*and every entry after it* unread, move its read position back to it, and read it again once
`get_scheduled_messages` has made room. `should_pause_all_deliveries()` is also true while the
tracker is full and nothing is due, so the dispatcher does not spin re-reading. The cost: while
the tracker is full, entries behind the first refused one wait, even ones that are not delayed,
and a refused entry whose time comes before the tracked ones goes out late.

After a restart, or after `clear()` when the last consumer leaves, the index is rebuilt by
re-reading entries from the cursor's mark-delete position: every unacknowledged entry passes
through `add` again. Nothing here is persisted.

Positions are `(ledger_id, entry_id)` tuples; all times are milliseconds of the injected clock,
which must be the epoch clock `deliver_at_time` is written in.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable
from typing import Final

from .._config import BrokerConfig

__all__ = ["DelayedAdd", "InMemoryDelayedDeliveryTracker"]

Position = tuple[int, int]

FIXED_DELAY_DETECTION_LOOKAHEAD: Final = 50_000


class DelayedAdd(enum.Enum):
    """What `InMemoryDelayedDeliveryTracker.add` did with an entry."""

    NOT_DELAYED = "not_delayed"  # dispatch it now
    TRACKED = "tracked"  # held until due; do not dispatch
    OVERFLOW = "overflow"  # delayed, but the tracker is full: leave it (and all after it) unread


class InMemoryDelayedDeliveryTracker:
    """Index of the delayed entries one subscription has read but not yet dispatched.

    Args:
        clock: the current epoch time in ms.
        tick_time_ms: the delayed-delivery tick (`delayedDeliveryTickTimeMillis`), >= 0.
        strict: `isDelayedDeliveryDeliverAtTimeStrict`: never deliver early.
        fixed_delay_detection_lookahead: messages needed before fixed-delay pausing engages;
            0 turns the detection off.
        tracked_messages_max: the most positions held at once (> 0).
    """

    def __init__(self, clock: Callable[[], float], *, tick_time_ms: int = 1000,
                 strict: bool = False,
                 fixed_delay_detection_lookahead: int = FIXED_DELAY_DETECTION_LOOKAHEAD,
                 tracked_messages_max: int = 100_000) -> None:
        assert tick_time_ms >= 0
        assert fixed_delay_detection_lookahead >= 0
        assert tracked_messages_max > 0
        self._clock = clock
        self._tick_time_ms = tick_time_ms
        self._strict = strict
        self._lookahead = fixed_delay_detection_lookahead
        self._tracked_max = tracked_messages_max
        self._heap: list[tuple[int, int, int]] = []  # (deliver_at, ledger_id, entry_id)
        self._positions: set[Position] = set()
        self._last_tick_ms: float = 0
        self._highest_deliver_at = 0
        self._fixed_delay = True

    @classmethod
    def from_config(cls, config: BrokerConfig,
                    clock: Callable[[], float]) -> InMemoryDelayedDeliveryTracker:
        """A tracker with the broker's delayed-delivery settings."""
        return cls(clock, tick_time_ms=config.delayed_delivery_tick_time_ms,
                   strict=config.delayed_delivery_deliver_at_time_strict,
                   tracked_messages_max=config.delayed_delivery_tracked_in_memory_max)

    @property
    def tick_time_ms(self) -> int:
        """The current tick."""
        return self._tick_time_ms

    def reset_tick_time(self, tick_time_ms: int) -> None:
        """Apply a changed tick (a topic or namespace DelayedDeliveryPolicies update)."""
        assert tick_time_ms >= 0
        self._tick_time_ms = tick_time_ms

    def _cutoff(self) -> float:
        """Entries with deliver_at at or before this time may be delivered now."""
        now = self._clock()
        return now if self._strict else now + self._tick_time_ms

    def add(self, ledger_id: int, entry_id: int, deliver_at: int) -> DelayedAdd:
        """Offer an entry that was just read.

        Args:
            ledger_id: the entry's ledger.
            entry_id: the entry's id in the ledger.
            deliver_at: the message's `deliver_at_time` (epoch ms); negative means none.

        Returns:
            NOT_DELAYED: send it now. TRACKED: held (also when already held). OVERFLOW: the
            tracker is full; leave this entry and every later one unread (module comment).
        """
        if deliver_at < 0 or deliver_at <= self._cutoff():
            self._fixed_delay = False
            return DelayedAdd.NOT_DELAYED
        position = (ledger_id, entry_id)
        if position in self._positions:
            return DelayedAdd.TRACKED
        if len(self._positions) >= self._tracked_max:
            return DelayedAdd.OVERFLOW
        heapq.heappush(self._heap, (deliver_at, ledger_id, entry_id))
        self._positions.add(position)
        if deliver_at < self._highest_deliver_at - self._tick_time_ms:
            self._fixed_delay = False
        self._highest_deliver_at = max(self._highest_deliver_at, deliver_at)
        assert len(self._heap) == len(self._positions) <= self._tracked_max
        return DelayedAdd.TRACKED

    def has_message_available(self) -> bool:
        """True when at least one tracked message is due."""
        return bool(self._heap) and self._heap[0][0] <= self._cutoff()

    def get_scheduled_messages(self, max_messages: int) -> list[Position]:
        """Remove and return up to `max_messages` due positions.

        Args:
            max_messages: the most positions to return (>= 0).

        Returns:
            The due positions, sorted by position. The earliest deliver-at times are taken
            first; the sort is over the ones taken.
        """
        assert max_messages >= 0
        cutoff = self._cutoff()
        due: list[Position] = []
        while len(due) < max_messages and self._heap and self._heap[0][0] <= cutoff:
            _, ledger_id, entry_id = heapq.heappop(self._heap)
            self._positions.remove((ledger_id, entry_id))
            due.append((ledger_id, entry_id))
        if not self._heap:
            self._reset_fixed_delay_detection()
        assert len(self._heap) == len(self._positions)
        due.sort()
        return due

    def _reset_fixed_delay_detection(self) -> None:
        self._highest_deliver_at = 0
        self._fixed_delay = True

    def next_delivery_time(self) -> float | None:
        """When the dispatcher's read timer should fire (clock ms), or None for no timer.

        It is `max(earliest deliver_at, last tick + tick_time_ms)`, i.e. the delay
        `max(deliver_at - now, last_tick + tick - now)` from now: never more often than once
        per tick. None when nothing is tracked, or when the earliest message is already past
        due (the dispatcher is behind and its next read finds it).
        """
        if not self._heap:
            return None
        earliest = self._heap[0][0]
        if earliest < self._clock():
            return None
        return max(earliest, self._last_tick_ms + self._tick_time_ms)

    def on_timer_fired(self) -> None:
        """Record that the read timer fired now (the start of a new tick)."""
        self._last_tick_ms = self._clock()

    def should_pause_all_deliveries(self) -> bool:
        """True when the dispatcher should stop reading new entries: nothing is due, and
        either the fixed-delay detection holds (all delays in order, at least the lookahead
        tracked) or the tracker is full."""
        if self.has_message_available():
            return False
        if self.is_full:
            return True
        return (self._lookahead > 0 and self._fixed_delay
                and len(self._heap) >= self._lookahead)

    @property
    def is_full(self) -> bool:
        """True when `add` would refuse a new delayed position."""
        return len(self._positions) >= self._tracked_max

    def clear(self) -> None:
        """Forget every tracked position (the last consumer left; the cursor rewinds and the
        entries are re-read and re-added)."""
        self._heap.clear()
        self._positions.clear()
        self._reset_fixed_delay_detection()

    def size(self) -> int:
        """The number of tracked positions (upstream's getNumberOfDelayedMessages)."""
        return len(self._heap)
