"""The storage benchmark's parameters and results (see `benchmark` for the theory of
operation): the cells measured (entry sizes, adds in flight, read and replay sizes), the
targets, the scales, the options, and the results of each step.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._config import StorageConfig

__all__ = ["FULL_SCALE", "QUICK_SCALE", "TINY_SCALE", "BenchOptions", "BenchScale"]

MB = 1024 * 1024
KB = 1024
ENTRY_SIZES = (100, KB, 64 * KB)
IN_FLIGHT = (1, 16, 256)
READ_SIZES = (KB, 64 * KB)
REPLAY_SIZES = (KB, 64 * KB)
READ_KINDS = ("tailing", "catch-up", "catch-up cold")
_READ_CALL_BYTES_MAX = 1 * MB  # entries per read call: up to 1000, and up to this much data
_READ_CALL_ENTRIES_MAX = 1000
_TAILING_CALL_ENTRIES_MAX = 100
_FILL_IN_FLIGHT_MAX = 4096  # adds outstanding while filling a store for reads or replay
_PREALLOC_BYTES = 16 * MB
_NEVER_MS = 24 * 3600 * 1000  # a checkpoint interval that never elapses during a run

# Targets on the reference 2-core machine (the acceptance figures).
TARGET_SYNC_RATIO_MIN = 0.8
TARGET_PIPELINED_APPENDS_PER_S_MIN = 100_000.0
TARGET_CATCH_UP_ENTRIES_PER_S_MIN = 200_000.0
TARGET_REPLAY_MB_PER_S_MIN = 100.0


@dataclass(frozen=True)
class BenchScale:
    """How long and how big each step is."""

    name: str
    cell_seconds: float  # measured time of each append and read cell
    warmup_seconds: float  # discarded time before each append cell
    cell_ops_min: int  # a cell also runs until this many operations were measured
    sequential_bytes: int  # written for the sequential bandwidth limit
    read_bytes: int  # entry data written for the read cells, per entry size
    replay_bytes: int  # entry data journaled for the replay cells, per entry size
    config: StorageConfig = field(default_factory=StorageConfig)  # every store's base

    def storage_config(self, **changes: Any) -> StorageConfig:
        return dataclasses.replace(self.config, **changes)


FULL_SCALE = BenchScale("full", 5.0, 0.5, 20, 256 * MB, 64 * MB, 256 * MB)
QUICK_SCALE = BenchScale("quick", 1.0, 0.2, 20, 64 * MB, 16 * MB, 32 * MB)
# For the tests: a few seconds in all, and small journal segments and LMDB maps.
TINY_SCALE = BenchScale("tiny", 0.05, 0.01, 5, 1 * MB, 256 * KB, 512 * KB, StorageConfig(
    journal_prealloc_bytes=256 * KB, journal_segment_bytes_max=16 * MB,
    lmdb_map_bytes=256 * MB))


@dataclass
class BenchOptions:
    """What `magnetar bench storage` and `benchmarks/bench_storage.py` pass in.

    `scale` (not on the command line) overrides the full/quick choice; the tests use
    `TINY_SCALE`.
    """

    directory: str = "."
    quick: bool = False
    json_path: str | None = None
    plot_path: str | None = None
    progress: bool = True
    scale: BenchScale | None = None

    def chosen_scale(self) -> BenchScale:
        if self.scale is not None:
            return self.scale
        return QUICK_SCALE if self.quick else FULL_SCALE


# -- results ------------------------------------------------------------------------------

@dataclass
class LimitSample:
    """One measurement of the disk's limits; a run takes one at its start and one at its
    end."""

    when: str
    fsync_append_per_s: float
    fsync_append_p50_ms: float
    fsync_append_p99_ms: float
    fsync_overwrite_per_s: float
    fsync_overwrite_p50_ms: float
    fsync_overwrite_p99_ms: float
    sequential_mb_per_s: float


@dataclass
class Limits:
    """The disk's limits: for each measure the better sample, so that another process's
    burst of I/O during one of them does not lower the bar the engine is held to."""

    fsync_append_per_s: float
    fsync_append_p50_ms: float
    fsync_append_p99_ms: float
    fsync_overwrite_per_s: float
    fsync_overwrite_p50_ms: float
    fsync_overwrite_p99_ms: float
    sequential_mb_per_s: float
    sequential_bytes: int
    samples: list[LimitSample]


@dataclass
class AppendCell:
    entry_bytes: int
    in_flight: int
    appends: int
    seconds: float
    appends_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    one_cpu: bool = False  # the process, engine threads included, held to one CPU
    # The client resubmits the slots one completion frees as ONE `add_entries` run (as the
    # broker submits the SENDs of one socket read), instead of one add per slot.
    runs: bool = False
    cpu_us_per_append: float = 0.0  # CPU of the whole process (every thread) per append
    vs_fsync: float = 0.0
    vs_fsync_overwrite: float = 0.0
    vs_bandwidth: float = 0.0


@dataclass
class ReadCell:
    kind: str
    entry_bytes: int
    entries_per_call: int
    entries: int
    seconds: float
    entries_per_s: float
    mb_per_s: float
    vs_bandwidth: float = 0.0


@dataclass
class ReplayCell:
    entry_bytes: int
    journal_bytes: int
    records: int
    seconds: float  # the open
    mb_per_s: float
    cpu_seconds: float = 0.0  # CPU of the process (every thread) during the open
    flushed_seconds: float = 0.0  # the open and the checkpoint of what it replayed
    vs_bandwidth: float = 0.0


@dataclass
class Target:
    name: str
    measured: float
    required: float
    unit: str
    passed: bool


@dataclass
class _Results:
    limit_samples: list[LimitSample] = field(default_factory=list)
    limits: Limits | None = None
    appends: list[AppendCell] = field(default_factory=list)
    reads: list[ReadCell] = field(default_factory=list)
    replay: list[ReplayCell] = field(default_factory=list)



def _fresh_dir(scratch: str, name: str) -> str:
    path = os.path.join(scratch, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path



def _entries_for(total_bytes: int, entry_bytes: int) -> int:
    return max(total_bytes // entry_bytes, 8)



def _percentile_ms(samples: Sequence[float], percent: float) -> float:
    assert samples
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, round(percent / 100 * len(ordered)) - 1))
    return ordered[rank] * 1000


def _size_name(size: int) -> str:
    return f"{size // KB} KB" if size % KB == 0 else f"{size} B"
