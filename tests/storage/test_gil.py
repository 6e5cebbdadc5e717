"""Handing the GIL over from background loops (`_gil.py`)."""

from __future__ import annotations

import ctypes
import threading

from magnetar.storage._gil import TIMER_SLACK_NS, hand_over_gil, timer_slack_ns

DEFAULT_SLACK_NS = 50_000  # Linux's default timer slack
PR_SET_TIMERSLACK = 29


def test_a_threads_first_hand_over_tightens_its_timer_slack() -> None:
    """A hand-over sleeps a few tens of microseconds; with the default 50 us timer slack
    each lasted about 90 us, so a thread's first hand-over sets its own slack to
    `TIMER_SLACK_NS` (Linux, per thread). Fails when hand-overs leave the slack alone."""
    seen: list[int | None] = []

    def background() -> None:
        # A new thread inherits its creator's slack: start this one from the default.
        assert ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, DEFAULT_SLACK_NS, 0, 0, 0) == 0
        seen.append(timer_slack_ns())
        hand_over_gil()
        seen.append(timer_slack_ns())

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen == [DEFAULT_SLACK_NS, TIMER_SLACK_NS]
