"""Handing the GIL over from a long loop in a background thread.

A thread running Python code keeps the GIL until another thread that wants it has waited the
switch interval (`sys.getswitchinterval()`, 5 ms by default) and forced a switch. The event
loop gives the GIL up at each of its system calls (select, recv, send, the self-pipe write of
`call_soon_threadsafe`) and must take it back after each: behind a checkpoint encoding a
second's worth of entries (20 ms of Python for 5,000 1 KB entries), every one of those calls
could wait up to 5 ms, and a SEND's receipt, which needs several, 10-20 ms -- the publish
latency p99 of issue 14.

So the storage's background loops over many items (a checkpoint's sort of its entries, its
entry-log append and its index puts; a GC copy) call `hand_over_gil` every `HAND_OVER_ITEMS`
items (or, in the append, `HAND_OVER_BYTES` bytes), a fraction of a millisecond of work: a short
sleep. A zero-length sleep or `sched_yield` is not enough:
the yielding thread usually takes the GIL back before the waiting one has woken up, whereas
during a sleep it cannot. The sleep costs the background thread a few tens of microseconds of
wall time per hand-over and no CPU.
"""

from __future__ import annotations

import time
from typing import Final

__all__ = ["HAND_OVER_BYTES", "HAND_OVER_ITEMS", "hand_over_gil"]

# Items a background loop handles between two hand-overs, or bytes it encodes, whichever comes
# first. Beside checkpoints of 5,000 1 KB entries (loaded machine) another thread waited for
# the GIL at p99 2.5-3.6 ms with 256 items and 1.0-1.8 ms with 64, but 64 cut the append's
# rate from about 340 to 180 MB/s (each hand-over may wait for a CPU), which recovery's replay
# would feel: a replay needs no hand-over, and could pass 64 to a checkpoint's flush only.
HAND_OVER_ITEMS: Final = 256
HAND_OVER_BYTES: Final = 256 * 1024
HAND_OVER_SLEEP_S: Final = 20e-6  # long enough for a waiting thread to wake and take the GIL


def hand_over_gil() -> None:
    """Let a thread waiting for the GIL (the event loop) take it now (module comment)."""
    time.sleep(HAND_OVER_SLEEP_S)
