"""An opt-in latency trace: timestamped events of the publish path, for attributing a tail.

Off unless the environment names a file (`TRACE_PATH_ENV`, read at import). Then each call
site appends `(perf_counter_ns, kind, a, b)` to one bounded ring buffer (`TRACE_EVENTS_MAX`
events, the oldest dropped), and the whole buffer is written to that file as JSON lines at
exit. `perf_counter_ns` is CLOCK_MONOTONIC on Linux: a client process's `perf_counter_ns`
stamps compare with these directly.

Call sites test `trace.on` first, so a broker without the variable pays one attribute read
per site. Events (the `a`, `b` of each kind):

* the broker: `read` (first and last sequence id of the SENDs of one socket read),
  `submit` and `confirm` (an `AddGroup` handed to the storage, and confirmed on the loop;
  both carry the submit's ns), `receipts` (last sequence id written, count), `lag` (the
  loop's lateness in us, the loop thread's CPU us meanwhile) with `runq` (its wait for a
  CPU meanwhile, us; see `start_lag_probe`)
* the journal and the checkpoint: the crash points their steps pass (`FileSystem.point`:
  `journal:before-write`, `journal:before-sync`, `journal:after-sync`, `checkpoint:begin`,
  `journal:prealloc` (a step of zeros written ahead of the data: the next sync writes it),
  `checkpoint:after-swap` (the entries sorted), ...), and `durable` (records whose
  completions have run), `checkpoint:flushed` (the index committed, the half released) and
  `checkpoint:freed` (the end)
* the cyclic GC: `gc0`/`gc1` (generation, objects collected)
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import time
from collections import deque
from typing import Any, Final

__all__ = ["TRACE_EVENTS_MAX", "TRACE_PATH_ENV", "LatencyTrace", "trace"]

TRACE_PATH_ENV: Final = "MAGNETAR_LATENCY_TRACE"
TRACE_EVENTS_MAX: Final = 2_000_000  # about 200 MB of tuples at most; 30 s at 5,000 msg/s
LAG_PROBE_INTERVAL_S: Final = 0.002
LAG_REPORTED_US_MIN: Final = 300  # a probe later than this is recorded


class LatencyTrace:
    """The ring buffer and its switch (see the module comment)."""

    def __init__(self, path: str | None, events_max: int = TRACE_EVENTS_MAX):
        self.on = bool(path)
        self.path = path
        self.events: deque[tuple[int, str, int, int]] = deque(maxlen=events_max)

    def mark(self, kind: str, a: int = 0, b: int = 0) -> None:
        self.events.append((time.perf_counter_ns(), kind, a, b))

    def dump(self) -> None:
        """Write the events to `path` (JSON lines: ns, kind, a, b)."""
        if self.path is None:
            return
        with open(self.path, "w", encoding="ascii") as out:
            for event in list(self.events):
                out.write(json.dumps(event) + "\n")

    def start(self) -> None:
        """Trace the cyclic GC's collections and dump at exit (once, when on)."""
        if not self.on:
            return
        gc.callbacks.append(self._on_gc)
        atexit.register(self.dump)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.mark("gc0", info["generation"])
        else:
            self.mark("gc1", info["generation"], info["collected"])

    def start_lag_probe(self, loop: asyncio.AbstractEventLoop) -> None:
        """Every `LAG_PROBE_INTERVAL_S` on `loop`, record how late the probe ran (when over
        `LAG_REPORTED_US_MIN`): the loop was busy or could not get the GIL."""
        if not self.on:
            return
        due = [time.perf_counter_ns()]
        last = [_schedstat()]

        def probe() -> None:
            late_us = (time.perf_counter_ns() - due[0]) // 1000
            now = _schedstat()
            if late_us >= LAG_REPORTED_US_MIN:
                # The loop thread's CPU time and its wait for a CPU (run queue) since the
                # last probe: the rest of the lag it was blocked (the GIL, a lock).
                self.mark("lag", late_us, (now[0] - last[0][0]) // 1000)
                self.mark("runq", (now[1] - last[0][1]) // 1000)
            last[0] = now
            due[0] = time.perf_counter_ns() + int(LAG_PROBE_INTERVAL_S * 1e9)
            loop.call_later(LAG_PROBE_INTERVAL_S, probe)

        due[0] = time.perf_counter_ns() + int(LAG_PROBE_INTERVAL_S * 1e9)
        loop.call_later(LAG_PROBE_INTERVAL_S, probe)


def _schedstat() -> tuple[int, int]:
    """The calling thread's CPU ns and run-queue wait ns (Linux; zeros elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as source:
            cpu, wait = source.read().split()[:2]
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return 0, 0


trace = LatencyTrace(os.environ.get(TRACE_PATH_ENV) or None)
trace.start()
