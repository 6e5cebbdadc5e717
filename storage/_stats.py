"""The engine's own figures: fixed-bucket histograms and counters kept as plain integers.

Theory of operation
-------------------
Storage measures a few things as they happen (a journal fsync's latency, how many records
one fsync covered, checkpoints, GC passes, the replay at open) and keeps them here for
whoever reports them (the broker's `/metrics`). Nothing here knows about an exposition
format: a `Buckets` is a list of counts with upper-inclusive bounds and an overflow slot,
and a `StorageMetrics` is counters and such histograms.

Cost and threads: recording is an add (and a bisect over a dozen bounds) in the thread that
did the work; no lock is taken. Each figure has one writer at a time (the journal's syncer
role is held by one thread at a time; checkpoints and GC run under the checkpoint lock;
the replay happens before the engine is shared), and readers in other threads take
`snapshot()`, which may miss an observation being recorded at that instant but never
sees a count go down.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["FSYNC_LATENCY_BUCKETS_US", "GROUP_COMMIT_BUCKETS_RECORDS", "Buckets",
           "BucketsSnapshot", "StorageMetrics"]

# A journal fdatasync, in microseconds: from a fast NVMe cache flush to a stalled disk.
FSYNC_LATENCY_BUCKETS_US: tuple[int, ...] = (
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    1_000_000)
# Journal records made durable by one fdatasync (group commit).
GROUP_COMMIT_BUCKETS_RECORDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class BucketsSnapshot:
    """Counts per bucket (the last one: above every bound) and the sum of the values."""

    bounds: tuple[int, ...]
    counts: tuple[int, ...]
    sum: int

    @property
    def count(self) -> int:
        return sum(self.counts)


class Buckets:
    """A histogram over fixed bounds: a value goes to the first bucket whose bound is at
    least the value (upper-inclusive), or to the overflow bucket after the last bound."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[int]):
        assert bounds, "at least one bound"
        assert list(bounds) == sorted(set(bounds)), "bounds strictly increase"
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0

    def add(self, value: int, count: int = 1) -> None:
        """Count `value` (`count` times)."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count

    def snapshot(self) -> BucketsSnapshot:
        return BucketsSnapshot(self.bounds, tuple(self.counts), self.sum)


@dataclass
class StorageMetrics:
    """What one data directory's engine has done since it was opened.

    Attributes:
        journal_fsync_us: latency of each journal fdatasync that covered a batch.
        group_commit_records: journal records made durable by each of those fdatasyncs.
        journal_bytes_written: bytes written to journal segments (padding included).
        gc_runs: GC passes that completed.
        gc_entry_logs_deleted: entry logs GC removed (no live data left).
        gc_entry_logs_compacted: entry logs GC compacted (live entries copied out).
        replay_seconds: how long the recovery at open took (journal replay included).
        replay_records: journal records replayed at open.
    """

    journal_fsync_us: Buckets = field(
        default_factory=lambda: Buckets(FSYNC_LATENCY_BUCKETS_US))
    group_commit_records: Buckets = field(
        default_factory=lambda: Buckets(GROUP_COMMIT_BUCKETS_RECORDS))
    journal_bytes_written: int = 0
    gc_runs: int = 0
    gc_entry_logs_deleted: int = 0
    gc_entry_logs_compacted: int = 0
    replay_seconds: float = 0.0
    replay_records: int = 0
