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
Pulsar's bounds below, in an `AddFigures`) count the adds of the current interval: the
interval's close takes them (`closed_add_interval`) and the next add starts new ones. The
last closed interval's counts are what Pulsar's `StatsBuckets.refresh()` exposes as
`pulsar_storage_write_latency_le_*` and `pulsar_entry_size_le_*`. A ledger without adds
in an interval holds no histogram, and its topic the shared `NO_ADDS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from magnetar.storage import Buckets, BucketsSnapshot

__all__ = ["ENTRY_LATENCY_BUCKETS_US", "ENTRY_SIZE_BUCKETS_BYTES", "NO_ADDS", "AddFigures",
           "AddInterval", "RateMeter", "closed_add_interval"]

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
        counted, valued = count - self._count, value - self._value
        # An idle interval's rates are the shared 0.0, not a float object per meter.
        self.rate = counted / period if counted > 0 else 0.0
        self.value_rate = valued / period if valued > 0 else 0.0
        self._at, self._count, self._value = now, count, value


class AddFigures:
    """A managed ledger's durable adds over the current stats interval: their latency
    (from submission to confirmation on the loop, µs) and entry sizes (bytes). Made at the
    interval's first add, so an idle ledger holds none."""

    __slots__ = ("latency_us", "size_bytes")

    def __init__(self) -> None:
        self.latency_us = Buckets(ENTRY_LATENCY_BUCKETS_US)
        self.size_bytes = Buckets(ENTRY_SIZE_BUCKETS_BYTES)

    def record(self, latency_us: int, entries: Sequence[bytes]) -> None:
        """A run of `entries` became durable `latency_us` after its submission."""
        self.latency_us.add(latency_us, len(entries))
        if len(entries) == 1:  # (many producers: a run is usually one SEND)
            self.size_bytes.add(len(entries[0]))
            return
        add_size = self.size_bytes.add
        for data in entries:
            add_size(len(data))


class AddInterval(NamedTuple):
    """What a topic's managed ledger added over the last closed stats interval."""

    latency_us: BucketsSnapshot
    size_bytes: BucketsSnapshot


def _zero(bounds: tuple[int, ...]) -> BucketsSnapshot:
    return BucketsSnapshot(bounds, (0,) * (len(bounds) + 1), 0)


# The interval without adds, shared by every topic in that state.
NO_ADDS: Final = AddInterval(_zero(ENTRY_LATENCY_BUCKETS_US), _zero(ENTRY_SIZE_BUCKETS_BYTES))


def closed_add_interval(figures: AddFigures | None) -> AddInterval:
    """The interval `figures` (None: no add) measured, as the metrics report it."""
    if figures is None:
        return NO_ADDS
    return AddInterval(figures.latency_us.snapshot(), figures.size_bytes.snapshot())
