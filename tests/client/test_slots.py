"""`_Slots`, the pending-message limit of `send_async`: a blocking take waits for a slot the
loop gives back, in ticket order; a non-blocking one refuses at once and leaves no trace."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from magnetar._sender import _Slots

DEADLINE_S = 5.0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)  # polling another thread's state, with a deadline


def test_a_blocking_take_waits_until_a_slot_is_given_back() -> None:
    slots = _Slots(2, block=True)
    assert slots.take()
    assert slots.take()
    taken: list[int] = []
    waiters = [threading.Thread(target=lambda i=i: taken.append(i) if slots.take() else None)
               for i in range(2)]
    for waiter in waiters:
        waiter.start()
    _until(lambda: slots._waiting == 2, "both takes wait")
    assert taken == []
    slots.give(1)
    _until(lambda: len(taken) == 1, "one take goes on")
    assert slots._waiting == 1  # the other still waits: one slot came back
    slots.give(1)
    for waiter in waiters:
        waiter.join(DEADLINE_S)
    assert sorted(taken) == [0, 1]


def test_a_non_blocking_take_refuses_when_full_and_leaves_no_trace() -> None:
    slots = _Slots(1, block=False)
    assert slots.take()
    assert not slots.take()
    assert not slots.take()
    slots.give(1)
    assert slots.take()  # the refused takes did not use the slot up
    assert not slots.take()
