"""Latency recording and send pacing for `magnetar perf` (and the benchmarks that import it).

Theory of operation
-------------------
`LatencyHistogram` counts integer microseconds in HdrHistogram-style buckets: exact below
2**bits, then each power of two split into 2**(bits-1) equal sub-buckets. A value v lands
in bucket (shift << (bits-1)) + (v >> shift), shift = max(0, v.bit_length() - bits), whose
width is at most 2**-(bits-1) of its lower edge. A percentile is answered with the highest
value of the bucket holding that rank (as HdrHistogram's "highest equivalent value"), capped
at the exact maximum: never below the true value, at most `relative_error` above it
(bits = 11: 1/1024, three significant digits). The counts live in one fixed `array('Q')`
sized by the highest trackable value (one hour by default: 23,221 buckets, 181 KiB), so
memory does not grow with the number of values; larger values count in the top bucket
(and in `clamped`), the exact maximum is kept beside. Not thread-safe.

`LatencyRecorder` is the thread-safe front: client threads `record` into an interval
histogram under a lock; the reporting thread `take_interval`s it once a second (a swap under
the lock, so recording never waits for a percentile walk) and folds it into the run's total
outside the lock, as HdrHistogram's Recorder does.

`Pacer` decides when each message is due for a rate-limited sender: message i at
start + i / rate, computed from the index (never by adding intervals, so sleep overshoot does
not accumulate into drift). A sender that falls behind (a stall, a full pending queue) sends
the messages already due back to back, and each keeps its intended time: latency measured
from the intended send time counts the stall against every message it delayed rather than
hiding it (coordinated omission, corrected as wrk2 and HdrHistogram do). The clock and the
wait are injected, so the schedule is testable without time passing.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["LatencyHistogram", "LatencyRecorder", "Pacer", "RecorderInterval"]

PRECISION_BITS_DEFAULT = 11  # relative error 2**-10: three significant digits
HIGHEST_US_DEFAULT = 3_600_000_000  # one hour in microseconds; above counts as this
SUMMARY_PERCENTILES = (50.0, 95.0, 99.0, 99.9, 99.99)
US_PER_MS = 1000.0
NS_PER_S = 1_000_000_000


def _percentile_key(percentile: float) -> str:
    """'p50', 'p99.9': the name of a percentile in summaries and JSON."""
    return f"p{percentile:g}"


class LatencyHistogram:
    """Counts of integer microsecond values in log/linear buckets (see the module comment)."""

    def __init__(self, highest_us: int = HIGHEST_US_DEFAULT,
                 precision_bits: int = PRECISION_BITS_DEFAULT):
        if not 2 <= precision_bits <= 20:
            raise ValueError(f"precision_bits {precision_bits}: must be from 2 to 20")
        if highest_us < 2 ** precision_bits:
            raise ValueError(f"highest_us {highest_us}: must be at least 2**precision_bits")
        self.precision_bits = precision_bits
        self.highest_us = highest_us
        self._half_bits = precision_bits - 1
        self._zeros = array("Q", bytes(8 * (self._index(highest_us) + 1)))
        self._counts = array("Q", self._zeros)
        self.reset()

    @property
    def relative_error(self) -> float:
        """How far above the true value a reported percentile may be, as a fraction of it."""
        return float(2.0 ** -self._half_bits)

    @property
    def memory_bytes(self) -> int:
        """The size of the bucket counts: fixed at construction."""
        return len(self._counts) * self._counts.itemsize

    def reset(self) -> None:
        self._counts[:] = self._zeros
        self.count = 0
        self.sum_us = 0
        self.min_us = 0
        self.max_us = 0
        self.clamped = 0  # values above highest_us, counted in its bucket
        self._low = len(self._counts)  # the lowest and highest bucket in use
        self._high = -1

    def _index(self, value_us: int) -> int:
        shift = value_us.bit_length() - self.precision_bits
        if shift <= 0:
            return value_us
        return (shift << self._half_bits) + (value_us >> shift)

    def _highest_equivalent(self, index: int) -> int:
        """The largest value that lands in bucket `index`."""
        if index < 2 ** self.precision_bits:
            return index
        shift = (index >> self._half_bits) - 1
        top = index - (shift << self._half_bits)
        return ((top + 1) << shift) - 1

    def record(self, value_us: int, times: int = 1) -> None:
        """Count `value_us` (negative counts as 0, above `highest_us` as `highest_us`)."""
        value_us = max(0, value_us)
        if value_us > self.highest_us:
            self.clamped += times
            index = len(self._counts) - 1
        else:
            index = self._index(value_us)
        self._counts[index] += times
        if self.count == 0 or value_us < self.min_us:
            self.min_us = value_us
        self.max_us = max(self.max_us, value_us)
        self.count += times
        self.sum_us += value_us * times
        self._low = min(self._low, index)
        self._high = max(self._high, index)

    def add(self, other: LatencyHistogram) -> None:
        """Fold `other`'s counts into this one (same layout)."""
        assert (other.precision_bits, other.highest_us) == (self.precision_bits,
                                                            self.highest_us)
        if other.count == 0:
            return
        counts, theirs = self._counts, other._counts
        for index in range(other._low, other._high + 1):
            counts[index] += theirs[index]
        self.min_us = other.min_us if self.count == 0 else min(self.min_us, other.min_us)
        self.max_us = max(self.max_us, other.max_us)
        self.count += other.count
        self.sum_us += other.sum_us
        self.clamped += other.clamped
        self._low = min(self._low, other._low)
        self._high = max(self._high, other._high)

    def percentiles_us(self, percentiles: Iterable[float]) -> dict[float, int]:
        """Each percentile (0 to 100) as the value at rank ceil(p/100 * count) among the
        recorded values in ascending order (rank 1 at least; p0 is the minimum), within
        `relative_error` above (the exact maximum when that rank fell past `highest_us`);
        all 0 when nothing was recorded. One walk of the buckets."""
        wanted = sorted(set(percentiles))
        for percentile in wanted:
            if not 0.0 <= percentile <= 100.0:
                raise ValueError(f"percentile {percentile}: must be from 0 to 100")
        if self.count == 0:
            return {percentile: 0 for percentile in wanted}
        found: dict[float, int] = {}
        ranks = [(max(1, math.ceil(percentile / 100.0 * self.count)), percentile)
                 for percentile in wanted]
        position = 0
        seen = 0
        top = len(self._counts) - 1
        for index in range(self._low, self._high + 1):
            seen += self._counts[index]
            while position < len(ranks) and ranks[position][0] <= seen:
                value = min(self._highest_equivalent(index), self.max_us)
                if index == top and self.clamped:
                    value = self.max_us  # past highest_us: the exact maximum, never below
                found[ranks[position][1]] = value
                position += 1
            if position == len(ranks):
                break
        return found

    def percentile_us(self, percentile: float) -> int:
        return self.percentiles_us([percentile])[percentile]

    def summary_ms(self, percentiles: Iterable[float] = SUMMARY_PERCENTILES,
                   ) -> dict[str, float]:
        """count, mean, min, the percentiles ('p50', 'p99.9', ...) and max, in ms."""
        values = self.percentiles_us(percentiles)
        summary: dict[str, float] = {
            "count": self.count,
            "mean": self.sum_us / self.count / US_PER_MS if self.count else 0.0,
            "min": self.min_us / US_PER_MS,
        }
        for percentile, value in values.items():
            summary[_percentile_key(percentile)] = value / US_PER_MS
        summary["max"] = self.max_us / US_PER_MS
        return summary


@dataclass
class RecorderInterval:
    """What was recorded since the previous `take_interval`."""

    seconds: float
    messages: int
    bytes: int
    histogram: LatencyHistogram


class LatencyRecorder:
    """Thread-safe recording of (latency, message size) with interval snapshots.

    `record` may be called from any thread; `take_interval` and `total` from one reporting
    thread only."""

    def __init__(self, clock_s: Callable[[], float], highest_us: int = HIGHEST_US_DEFAULT,
                 precision_bits: int = PRECISION_BITS_DEFAULT):
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._interval = LatencyHistogram(highest_us, precision_bits)
        self._spare: LatencyHistogram | None = LatencyHistogram(highest_us, precision_bits)
        self._total = LatencyHistogram(highest_us, precision_bits)
        self._messages = 0
        self._bytes = 0
        self._interval_started_s = clock_s()
        self.total_messages = 0
        self.total_bytes = 0
        self.last_record_s: float | None = None  # the clock when the last value came in

    def record(self, latency_us: int, size_bytes: int) -> None:
        with self._lock:
            self._interval.record(latency_us)
            self._messages += 1
            self._bytes += size_bytes
            self.last_record_s = self._clock_s()

    def take_interval(self) -> RecorderInterval:
        """Swap in a fresh interval histogram, fold the finished one into the total and
        return it (valid until the next call)."""
        # A KeyboardInterrupt part way leaves no histogram in two roles: the spare is
        # dropped while it is the interval (at worst one interval's counts miss the total).
        fresh = self._spare or LatencyHistogram(self._total.highest_us,
                                                self._total.precision_bits)
        self._spare = None
        fresh.reset()
        with self._lock:
            finished, self._interval = self._interval, fresh
            messages, size, self._messages, self._bytes = self._messages, self._bytes, 0, 0
        now = self._clock_s()
        seconds, self._interval_started_s = now - self._interval_started_s, now
        self._total.add(finished)
        self.total_messages += messages
        self.total_bytes += size
        self._spare = finished
        return RecorderInterval(seconds, messages, size, finished)

    @property
    def total(self) -> LatencyHistogram:
        """Everything folded in by `take_interval` so far."""
        return self._total


class Pacer:
    """When each message is due at `rate_per_s` (0: no limit, each is due at once).

    `clock_ns` is a monotonic clock; `wait(seconds)` blocks up to that long and returns True
    when the run was stopped meanwhile."""

    def __init__(self, rate_per_s: float, clock_ns: Callable[[], int],
                 wait: Callable[[float], bool]):
        if not (math.isfinite(rate_per_s) and rate_per_s >= 0):
            raise ValueError(f"rate {rate_per_s}: must be a finite number, 0 or more")
        self.rate_per_s = rate_per_s
        self._clock_ns = clock_ns
        self._wait = wait
        self._interval_ns = NS_PER_S / rate_per_s if rate_per_s else 0.0
        self.start_ns: int | None = None
        self.released = 0  # messages whose time has come

    def due_ns(self, index: int) -> int:
        """Message `index`'s intended send time (the schedule starts at the first `next`)."""
        assert self.start_ns is not None
        return self.start_ns + round(index * self._interval_ns)

    def next(self) -> int | None:
        """Wait until the next message is due and return the time to measure its latency
        from: its intended send time when rate-limited, the clock now when not; None when
        `wait` reported a stop (that message was not released)."""
        now = self._clock_ns()
        if self.start_ns is None:
            self.start_ns = now
        if not self.rate_per_s:
            self.released += 1
            return now
        due = self.due_ns(self.released)
        if due > now and self._wait((due - now) / NS_PER_S):
            return None
        self.released += 1
        return due
