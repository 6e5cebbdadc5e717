"""The latency recorder and the send pacer of `magnetar perf`: percentiles against a sorted
list within the histogram's stated relative error, memory that does not grow with the values
recorded, interval snapshots that partition the run, and the pacer's schedule on an injected
clock (no time passes in these tests)."""

from __future__ import annotations

import math
import random
import tracemalloc

import pytest

from magnetar.broker.cli._perf_recorder import LatencyHistogram, LatencyRecorder, Pacer

PERCENTILES = (0.0, 0.1, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0)


def _true_percentile(ordered: list[int], percentile: float) -> int:
    """The value at rank ceil(p/100 * n) (rank 1 at least) of an ascending list."""
    rank = max(1, math.ceil(percentile / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _check(values: list[int], histogram: LatencyHistogram) -> None:
    ordered = sorted(values)
    found = histogram.percentiles_us(PERCENTILES)
    for percentile in PERCENTILES:
        true = _true_percentile(ordered, percentile)
        reported = found[percentile]
        assert true <= reported <= true * (1 + histogram.relative_error), (
            f"p{percentile}: reported {reported}, true {true}")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentiles_of_a_wide_distribution_are_within_the_stated_error(seed: int) -> None:
    rng = random.Random(seed)
    # microseconds from about 1 to tens of seconds: every bucket shift gets used
    values = [int(rng.lognormvariate(7.0, 2.0)) for _ in range(20_000)]
    histogram = LatencyHistogram()
    for value in values:
        histogram.record(value)
    _check(values, histogram)
    assert histogram.count == len(values)
    assert histogram.min_us == min(values)
    assert histogram.max_us == max(values)
    assert histogram.sum_us == sum(values)


def test_values_below_two_to_the_bits_are_exact() -> None:
    histogram = LatencyHistogram(precision_bits=8)
    values = list(range(256)) * 3
    for value in values:
        histogram.record(value)
    ordered = sorted(values)
    for percentile in PERCENTILES:
        assert histogram.percentile_us(percentile) == _true_percentile(ordered, percentile)


def test_a_coarse_histogram_keeps_its_coarser_promise() -> None:
    histogram = LatencyHistogram(highest_us=10**9, precision_bits=4)
    assert histogram.relative_error == 1 / 8
    rng = random.Random(7)
    values = [rng.randrange(0, 10**9) for _ in range(5000)]
    for value in values:
        histogram.record(value)
    _check(values, histogram)


def test_memory_does_not_grow_with_the_values_recorded() -> None:
    histogram = LatencyHistogram()
    size = histogram.memory_bytes
    assert size == 23_221 * 8  # the stated bound for one hour at three significant digits
    rng = random.Random(11)
    values = [rng.randrange(0, 3_600_000_000) for _ in range(50_000)]
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for value in values:
            histogram.record(value)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert histogram.memory_bytes == size
    assert after - before < 4096, f"recording 50,000 values kept {after - before} bytes"


def test_out_of_range_values_are_clamped_and_counted() -> None:
    histogram = LatencyHistogram(highest_us=1_000_000)
    histogram.record(-5)
    histogram.record(5_000_000)
    assert histogram.clamped == 1
    assert histogram.min_us == 0
    assert histogram.max_us == 5_000_000  # the exact maximum is kept
    assert histogram.percentile_us(0) == 0
    assert histogram.percentile_us(100) == 5_000_000


def test_an_empty_histogram_answers_zeros() -> None:
    summary = LatencyHistogram().summary_ms()
    assert summary == {"count": 0, "mean": 0.0, "min": 0.0, "p50": 0.0, "p95": 0.0,
                       "p99": 0.0, "p99.9": 0.0, "p99.99": 0.0, "max": 0.0}


def test_a_percentile_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="percentile 101"):
        LatencyHistogram().percentiles_us([101.0])


def test_adding_histograms_equals_recording_into_one() -> None:
    rng = random.Random(5)
    first = [rng.randrange(0, 10**7) for _ in range(3000)]
    second = [rng.randrange(10**3, 10**8) for _ in range(3000)]
    one, two, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for value in first:
        one.record(value)
        both.record(value)
    for value in second:
        two.record(value)
        both.record(value)
    one.add(two)
    assert one.summary_ms() == both.summary_ms()
    assert one.percentiles_us(PERCENTILES) == both.percentiles_us(PERCENTILES)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: int = 1_000_000_000):
        self.now_ns = start
        self.waits: list[float] = []

    def ns(self) -> int:
        return self.now_ns

    def s(self) -> float:
        return self.now_ns / 1e9


def test_intervals_partition_the_run_and_the_total_holds_them_all() -> None:
    clock = FakeClock()
    recorder = LatencyRecorder(clock.s)
    recorded: list[int] = []
    for interval in range(3):
        for value in range(100 * (interval + 1)):
            recorder.record(value * 10 + interval, 100)
            recorded.append(value * 10 + interval)
        clock.now_ns += 1_000_000_000
        taken = recorder.take_interval()
        assert taken.messages == 100 * (interval + 1)
        assert taken.bytes == 100 * taken.messages
        assert taken.seconds == pytest.approx(1.0)
        assert taken.histogram.count == taken.messages
    assert recorder.total_messages == len(recorded)
    assert recorder.total_bytes == 100 * len(recorded)
    _check(recorded, recorder.total)
    assert recorder.take_interval().messages == 0


def _paced(rate: float, clock: FakeClock, oversleep_ns: int = 0,
           stop_after_waits: int | None = None) -> Pacer:
    def wait(seconds: float) -> bool:
        clock.waits.append(seconds)
        if stop_after_waits is not None and len(clock.waits) > stop_after_waits:
            return True
        clock.now_ns += round(seconds * 1e9) + oversleep_ns
        return False

    return Pacer(rate, clock.ns, wait)


def test_the_schedule_is_start_plus_index_over_rate() -> None:
    clock = FakeClock()
    pacer = _paced(1000.0, clock)
    times = [pacer.next() for _ in range(5)]
    start = 1_000_000_000
    assert times == [start + i * 1_000_000 for i in range(5)]
    assert clock.waits == [0.001] * 4  # the first is due at once


def test_oversleeping_does_not_drift_the_schedule() -> None:
    clock = FakeClock()
    pacer = _paced(1000.0, clock, oversleep_ns=300_000)  # every wait 0.3 ms late
    times = [pacer.next() for _ in range(10_000)]
    start = 1_000_000_000
    assert times[-1] == start + 9_999 * 1_000_000  # intended times, never pushed back
    assert clock.now_ns - start < 10_000 * 1_000_000 + 300_000  # caught up, never behind
    # the late wakes shorten the next waits: 0.7 ms after each 0.3 ms overshoot
    assert clock.waits[1] == pytest.approx(0.0007)


def test_after_a_stall_the_due_messages_go_at_once_with_their_intended_times() -> None:
    clock = FakeClock()
    pacer = _paced(1000.0, clock)
    start = 1_000_000_000
    assert pacer.next() == start
    clock.now_ns += 50_000_000  # a 50 ms stall (a GC pause, a full pending queue)
    waits_before = len(clock.waits)
    times = [pacer.next() for _ in range(50)]
    assert len(clock.waits) == waits_before  # no waiting while behind
    assert times == [start + i * 1_000_000 for i in range(1, 51)]
    # latency measured from these times counts the stall for every message it delayed
    assert clock.now_ns - times[0] == 49_000_000


def test_a_fractional_rate_lands_on_whole_seconds() -> None:
    clock = FakeClock()
    pacer = _paced(3.0, clock)
    times = [pacer.next() for _ in range(7)]
    assert times[3] - times[0] == 1_000_000_000
    assert times[6] - times[0] == 2_000_000_000


def test_rate_zero_never_waits_and_measures_from_now() -> None:
    clock = FakeClock()
    pacer = _paced(0.0, clock)
    for step in range(5):
        clock.now_ns += 123 * step
        assert pacer.next() == clock.now_ns
    assert clock.waits == []
    assert pacer.released == 5


def test_a_stop_during_the_wait_releases_nothing() -> None:
    clock = FakeClock()
    pacer = _paced(10.0, clock, stop_after_waits=2)
    assert pacer.next() is not None
    assert pacer.next() is not None
    assert pacer.next() is not None
    assert pacer.next() is None
    assert pacer.released == 3


@pytest.mark.parametrize("rate", [-1.0, math.inf, math.nan])
def test_a_bad_rate_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        Pacer(rate, FakeClock().ns, lambda _s: False)
