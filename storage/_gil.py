"""Handing the GIL over from a long loop in a background thread.

A thread running Python code keeps the GIL until another thread that wants it has waited the
switch interval (`sys.getswitchinterval()`, 5 ms by default) and forced a switch. The event
loop gives the GIL up at each of its system calls (select, recv, send, the self-pipe write of
`call_soon_threadsafe`) and must take it back after each: behind a checkpoint encoding a
second's worth of entries (20 ms of Python for 5,000 1 KB entries), every one of those calls
could wait up to 5 ms, and a SEND's receipt, which needs several, 10-20 ms -- the publish
latency p99 of issue 14.

So the storage's background loops over many items (a checkpoint's copy of its entries out of
the cache, its entry-log append, its index puts and its frees; a GC copy) call `hand_over_gil`
every `HAND_OVER_ITEMS` items (or, in the append, `HAND_OVER_BYTES` bytes), a fraction of a
millisecond of work: a short sleep. A zero-length sleep or `sched_yield` is not enough:
the yielding thread usually takes the GIL back before the waiting one has woken up, whereas
during a sleep it cannot. The sleep costs the background thread a few tens of microseconds of
wall time per hand-over, and about 16 us of CPU (its system calls, measured on the 2-core VM).

A sleep lasts at least its time plus the thread's timer slack (Linux: 50 us by default): a
20 us sleep took about 90 us, and an append of 20,000 1 KB entries handing over every 64 took
210-240 ms (loaded machine). The first hand-over of a thread sets its timer slack to
`TIMER_SLACK_NS` (prctl PR_SET_TIMERSLACK, that thread only): a 20 us sleep then takes 25-35
us and that append 95-130 ms, so the hand-overs can come every 64 items rather than 256 (an
event loop that wants the GIL waits behind a quarter of the work) for no more wall time.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["HAND_OVER_BYTES", "HAND_OVER_ITEMS", "TIMER_SLACK_NS", "hand_over_gil",
           "timer_slack_ns"]

# Items a background loop handles between two hand-overs, or bytes it encodes, whichever comes
# first. Beside checkpoints of 5,000 1 KB entries (loaded machine) another thread waited for
# the GIL at p99 2.5-3.6 ms with 256 items and 1.0-1.8 ms with 64, when each item was a few
# microseconds of Python. The loops now do C calls per item (maps over the packing and the
# CRC, slices, putmulti): 128 records are encoded in about 0.1 ms, and a hand-over costs its
# thread some 16 us of CPU (the sleep's system calls, the GIL's hand-off), so 64 would spend
# about as much on hand-overs as on the work.
HAND_OVER_ITEMS: Final = 128
HAND_OVER_BYTES: Final = 256 * 1024
HAND_OVER_SLEEP_S: Final = 20e-6  # long enough for a waiting thread to wake and take the GIL
TIMER_SLACK_NS: Final = 1000  # a handing-over thread's timer slack (module comment)

_PR_SET_TIMERSLACK = 29
_PR_GET_TIMERSLACK = 30


def _load_prctl() -> Callable[[int, int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                         ctypes.c_ulong)
    function.restype = ctypes.c_int
    return function


_prctl = _load_prctl()
_slack_set = threading.local()  # `done` is True once this thread's timer slack is set


def timer_slack_ns() -> int | None:
    """The calling thread's timer slack (None where it cannot be read: not Linux)."""
    return None if _prctl is None else _prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)


def hand_over_gil() -> None:
    """Let a thread waiting for the GIL (the event loop) take it now (module comment). The
    first call in a thread sets its timer slack to `TIMER_SLACK_NS` (a failure is ignored:
    hand-overs are then slower, not wrong)."""
    if not getattr(_slack_set, "done", False):
        _slack_set.done = True
        if _prctl is not None:
            _prctl(_PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
    time.sleep(HAND_OVER_SLEEP_S)
