"""Moving rates and per-interval histograms, as Pulsar's stats report them.

Theory of operation
-------------------
Pulsar's `msgRateIn`, `msgThroughputIn`, `msgRateOut` and `msgThroughputOut` are windowed
rates: every `statsUpdateFrequencyInSecs` (default 60) the broker calls each producer's,
consumer's and topic's `Rate.calculateRate()`, which divides the events and bytes counted
since the previous call by the seconds elapsed since then and resets the counts. Between
two calls the published figure stays what the last interval measured. Magnetar does the
same, with the same default and the `stats_update_frequency_s` setting, as a tumbling
window (not an exponentially-weighted average): a rate is the difference of two readings
of a cumulative counter divided by the time between the readings.

The hot path therefore pays nothing new: publishes and dispatches already add to the
cumulative counters (`msg_in_counter`, `bytes_out_counter`, ...). A `RateMeter` keeps the
previous reading and the last rate; `update(now, count, value)` is called for every meter
once per interval from the broker's maintenance (`topics/_stats_interval.py`), on the
event loop, never concurrently with the counting.

The managed ledger's add latency and entry size histograms (`storage.Buckets`, with
Pulsar's bounds below) are cumulative too; `BucketsWindow` turns them into the counts of
the last interval, which is what Pulsar's `StatsBuckets.refresh()` exposes as
`pulsar_storage_write_latency_le_*` and `pulsar_entry_size_le_*`.
"""

from __future__ import annotations

from typing import Final

from magnetar.storage import Buckets, BucketsSnapshot

__all__ = ["ENTRY_LATENCY_BUCKETS_US", "ENTRY_SIZE_BUCKETS_BYTES", "BucketsWindow", "RateMeter"]

# Pulsar's ManagedLedgerMBeanImpl.ENTRY_LATENCY_BUCKETS_USEC: add-entry latency bounds, µs
# (exposed as pulsar_storage_write_latency_le_0_5 ... _le_1000 and _overflow).
ENTRY_LATENCY_BUCKETS_US: Final[tuple[int, ...]] = (
    500, 1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 1_000_000)
# Pulsar's ManagedLedgerMBeanImpl.ENTRY_SIZE_BUCKETS_BYTES, bytes (pulsar_entry_size_le_128
# ... _le_1_mb and _le_overflow). The fourth bound is 2084 upstream, not 2048, though its
# metric is named _le_2_kb; kept as upstream has it so that the counts agree.
ENTRY_SIZE_BUCKETS_BYTES: Final[tuple[int, ...]] = (
    128, 512, 1024, 2084, 4096, 16_384, 102_400, 1_232_896)


class RateMeter:
    """Events per second and value (bytes) per second over the last interval, read off a
    pair of cumulative counters (see the module comment)."""

    __slots__ = ("_at", "_count", "_value", "rate", "value_rate")

    def __init__(self, now: float, count: int = 0, value: int = 0):
        self._at = now
        self._count = count
        self._value = value
        self.rate = 0.0
        self.value_rate = 0.0

    def update(self, now: float, count: int, value: int) -> None:
        """Close the interval at `now` (monotonic seconds) with the counters' readings. A
        reading at or before the previous one changes nothing."""
        period = now - self._at
        if period <= 0:
            return
        self.rate = max(0, count - self._count) / period
        self.value_rate = max(0, value - self._value) / period
        self._at, self._count, self._value = now, count, value


class BucketsWindow:
    """The counts a cumulative `Buckets` gained over the last interval."""

    __slots__ = ("_last", "_source", "last_interval")

    def __init__(self, source: Buckets):
        self._source = source
        self._last = _zero_snapshot(source.bounds)
        self._last = self._snapshot()
        self.last_interval = _zero_snapshot(source.bounds)

    def _snapshot(self) -> BucketsSnapshot:
        """The source's counts, as the last snapshot's object when they did not move (a
        window of a topic without traffic holds no copies of its own)."""
        last = self._last
        if self._source.sum == last.sum and self._source.counts == list(last.counts):
            return last
        return self._source.snapshot()

    def update(self) -> None:
        """Close the interval: `last_interval` becomes what was added since the last call."""
        now = self._snapshot()
        if now is self._last:
            self.last_interval = _zero_snapshot(now.bounds)
            return
        self.last_interval = BucketsSnapshot(
            now.bounds, tuple(a - b for a, b in zip(now.counts, self._last.counts, strict=True)),
            now.sum - self._last.sum)
        self._last = now


_ZERO_SNAPSHOTS: dict[tuple[int, ...], BucketsSnapshot] = {}  # one per set of bounds


def _zero_snapshot(bounds: tuple[int, ...]) -> BucketsSnapshot:
    """The empty snapshot of `bounds`, shared by every window over them."""
    zero = _ZERO_SNAPSHOTS.get(bounds)
    if zero is None:
        zero = _ZERO_SNAPSHOTS[bounds] = BucketsSnapshot(bounds, (0,) * (len(bounds) + 1), 0)
    return zero
