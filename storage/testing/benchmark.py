"""The storage benchmark: durable appends, reads and journal replay, each set against the
disk's own limits measured in the same run.

Theory of operation
-------------------
Everything runs in one temporary directory created under `BenchOptions.directory` (so on
the disk being judged) and removed at the end. The steps, one progress-bar cell each:

1. Physical limits, with plain `os` calls and no engine: 1 KB `write` + `fdatasync` on a
   fresh file (the file grows with every write); 1 KB `pwrite` + `fdatasync` into a
   preallocated zero-filled file (what the journal does); and sequential bandwidth, 1 MB
   writes with one `fdatasync` at the end. They are sampled at the start of the run and
   again at its end, and each limit is the better sample: on a shared machine another
   process's burst of I/O during one sample must not make the engine look closer to the
   disk than it is.
2. Durable appends for every (entry size, adds in flight) cell, each on a fresh `Storage`
   with the default configuration and a fresh ledger. With 1 in flight the caller adds and
   waits, as a synchronous client would. With N > 1 exactly N adds are outstanding: each
   completion's callback submits the next add. A cell runs for a fixed time after a short
   warm-up and reports appends/s, MB/s of entry data, and latency p50/p99 (submit to
   completion). One more cell repeats 1 KB with 1 in flight with the process held to one
   CPU (Linux), to show what cross-CPU thread wake-ups cost that case.
3. Reads: tailing reads from the write cache (the checkpoint interval is made huge so the
   cache keeps everything), then catch-up reads front to back from the entry logs after a
   checkpoint has emptied the cache, first with the logs in the page cache (warm), then
   with their pages dropped before each pass (`POSIX_FADV_DONTNEED`, cold).
4. Journal replay: entries are journaled with nothing checkpointed, the store is abandoned
   (the un-checkpointed journal a kill leaves), and `Storage.open` is timed. The rate is
   the journal bytes replayed (record headers included) over the whole open, which also
   flushes the replayed entries to entry logs and the index, as a restart must.

Ratios: appends/s over the raw fsync rate (1 in flight: how close an add is to one bare
fsync; more in flight: how many adds group commit fits in one fsync's time), and every
MB/s over the sequential bandwidth. MB means 2**20 bytes throughout.

The results go to stdout as a table, to `json_path` as JSON (parameters, git commit,
Python, machine and its load, results, targets) and, optionally, to `plot_path` as a PNG.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tqdm import tqdm

from .._completion import Completion
from .._config import StorageConfig
from .._errors import StorageError
from .._recovery import ReplayStats
from .._storage import Storage

__all__ = [
    "FULL_SCALE",
    "QUICK_SCALE",
    "TINY_SCALE",
    "BenchOptions",
    "BenchScale",
    "run_storage_benchmark",
]

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
    seconds: float
    mb_per_s: float
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


# -- the run ------------------------------------------------------------------------------

def run_storage_benchmark(options: BenchOptions) -> dict[str, Any]:
    """Run every step, print the table, write the JSON and PNG; return the JSON document.

    Raises:
        OSError: the directory is not writable, or the disk failed; the temporary
            directory is removed all the same.
        StorageError: the engine failed during a step (the same).
        ModuleNotFoundError: a PNG was asked for and matplotlib (the `bench` extra) is not
            installed; raised before anything is measured or created.
    """
    if options.plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise ModuleNotFoundError("the chart (plot_path) needs matplotlib: pip install "
                                  "'magnetar[bench]'; nothing was measured", name="matplotlib")
    scale = options.chosen_scale()
    os.makedirs(options.directory, exist_ok=True)
    load_before = os.getloadavg()
    results = _Results()
    with _quiet_storage_log(), _scratch_dir(options.directory) as scratch:
        steps = _steps(scale, scratch, results)
        bar = tqdm(total=len(steps), desc="bench storage", unit="cell", file=sys.stderr,
                   disable=not options.progress)
        try:
            for label, step in steps:
                bar.set_postfix_str(label)
                step()
                bar.update(1)
        finally:
            bar.close()
    _add_ratios(results, scale)
    document = _document(options, scale, results, load_before, os.getloadavg())
    print(render_table(document))
    if options.json_path:
        with open(options.json_path, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
            out.write("\n")
    if options.plot_path:
        write_plot(document, options.plot_path)
    return document


Step = tuple[str, Callable[[], None]]


def _steps(scale: BenchScale, scratch: str, results: _Results) -> list[Step]:
    steps: list[Step] = [("disk limits", partial(_run_limits, scale, scratch, results,
                                                 "start"))]
    steps += [(f"append {_size_name(size)} x{in_flight}",
               partial(_run_append_cell, scale, scratch, results, size, in_flight))
              for size in ENTRY_SIZES for in_flight in IN_FLIGHT]
    if hasattr(os, "sched_setaffinity"):
        steps.append(("append 1 KB x1, one CPU", partial(_run_append_cell, scale, scratch,
                                                          results, KB, 1, one_cpu=True)))
    steps += [(f"reads {_size_name(size)}", partial(_run_read_cells, scale, scratch, results,
                                                    size)) for size in READ_SIZES]
    steps += [(f"replay {_size_name(size)}", partial(_run_replay_cell, scale, scratch, results,
                                                     size)) for size in REPLAY_SIZES]
    steps.append(("disk limits again", partial(_run_limits, scale, scratch, results, "end")))
    return steps


@contextmanager
def _scratch_dir(parent: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="magnetar-bench-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _quiet_storage_log() -> Iterator[None]:
    """The engine logs every open and close at INFO; a benchmark opens dozens of stores."""
    logger = logging.getLogger("magnetar.storage")
    previous = logger.level
    if logger.getEffectiveLevel() > logging.DEBUG:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _fresh_dir(scratch: str, name: str) -> str:
    path = os.path.join(scratch, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# -- step 1: the disk's limits -----------------------------------------------------------

def _run_limits(scale: BenchScale, scratch: str, results: _Results, when: str) -> None:
    """One sample of the limits; each fsync loop runs half a cell's time (two samples)."""
    directory = _fresh_dir(scratch, f"limits-{when}")
    seconds = scale.cell_seconds / 2
    append_rate, append_lat = _fsync_loop(os.path.join(directory, "append"), scale, seconds,
                                          preallocate=False)
    overwrite_rate, overwrite_lat = _fsync_loop(os.path.join(directory, "overwrite"), scale,
                                                seconds, preallocate=True)
    sequential = _sequential_bandwidth(os.path.join(directory, "sequential"),
                                       scale.sequential_bytes)
    results.limit_samples.append(LimitSample(
        when, append_rate, _percentile_ms(append_lat, 50), _percentile_ms(append_lat, 99),
        overwrite_rate, _percentile_ms(overwrite_lat, 50), _percentile_ms(overwrite_lat, 99),
        sequential))
    shutil.rmtree(directory)


def _best_limits(samples: list[LimitSample], scale: BenchScale) -> Limits:
    assert samples
    append = max(samples, key=lambda s: s.fsync_append_per_s)
    overwrite = max(samples, key=lambda s: s.fsync_overwrite_per_s)
    return Limits(append.fsync_append_per_s, append.fsync_append_p50_ms,
                  append.fsync_append_p99_ms, overwrite.fsync_overwrite_per_s,
                  overwrite.fsync_overwrite_p50_ms, overwrite.fsync_overwrite_p99_ms,
                  max(s.sequential_mb_per_s for s in samples), scale.sequential_bytes,
                  list(samples))


def _fsync_loop(path: str, scale: BenchScale, seconds: float, *,
                preallocate: bool) -> tuple[float, list[float]]:
    """1 KB writes, each followed by fdatasync, for `seconds`; returns (per second,
    latencies in s)."""
    block = os.urandom(KB)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if preallocate:
            _write_zeros(fd, _PREALLOC_BYTES)
            os.fdatasync(fd)
        latencies: list[float] = []
        offset = 0
        started = time.perf_counter()
        deadline = started + seconds
        now = started
        while now < deadline or len(latencies) < scale.cell_ops_min:
            if preallocate:
                os.pwrite(fd, block, offset)
                offset = (offset + KB) % _PREALLOC_BYTES
            else:
                os.write(fd, block)
            os.fdatasync(fd)
            done = time.perf_counter()
            latencies.append(done - now)
            now = done
        return len(latencies) / (now - started), latencies
    finally:
        os.close(fd)


def _write_zeros(fd: int, size: int) -> None:
    zeros = bytes(MB)
    for offset in range(0, size, MB):
        os.pwrite(fd, zeros[: min(MB, size - offset)], offset)


def _sequential_bandwidth(path: str, size: int) -> float:
    """MB/s for `size` bytes in 1 MB writes and one fdatasync at the end."""
    block = os.urandom(MB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(size // MB):
            os.write(fd, block)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
    return size / MB / elapsed


# -- step 2: durable appends -------------------------------------------------------------

def _run_append_cell(scale: BenchScale, scratch: str, results: _Results, entry_bytes: int,
                     in_flight: int, *, one_cpu: bool = False) -> None:
    directory = _fresh_dir(scratch, f"append-{entry_bytes}-{in_flight}-{int(one_cpu)}")
    data = os.urandom(entry_bytes)
    with _on_one_cpu(one_cpu), Storage.open(directory, scale.storage_config()) as store:
        ledger_id = store.create_ledger({"bench": "append"}).result()
        if in_flight == 1:
            window = _append_and_wait(store, ledger_id, data, scale)
        else:
            window = _append_pipelined(store, ledger_id, data, in_flight, scale)
    shutil.rmtree(directory)
    cell = _append_cell(entry_bytes, in_flight, window)
    cell.one_cpu = one_cpu
    results.appends.append(cell)


@contextmanager
def _on_one_cpu(wanted: bool) -> Iterator[None]:
    """Hold this thread, and the threads it starts meanwhile (the engine's, when it opens a
    store), to one CPU. With 1 add in flight every add crosses three threads; on a virtual
    machine a wake-up on another, idle CPU costs tens of microseconds, on the same CPU a
    few. This cell shows what that deployment choice is worth."""
    if not wanted:
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


@dataclass
class _Window:
    """Completions of a measured window: when each finished and how long it took."""

    start: float
    end: float
    latencies: list[float]


def _append_and_wait(store: Storage, ledger_id: int, data: bytes,
                     scale: BenchScale) -> _Window:
    warm_end = time.perf_counter() + scale.warmup_seconds
    stop_at = warm_end + scale.cell_seconds
    latencies: list[float] = []
    now = time.perf_counter()
    while now < stop_at or len(latencies) < scale.cell_ops_min:
        store.add_entry(ledger_id, data).result()
        done = time.perf_counter()
        if now >= warm_end:
            latencies.append(done - now)
        now = done
    return _Window(warm_end, now, latencies)


class _Pipeline:
    """Keeps exactly `in_flight` adds outstanding: each completion submits the next add
    (from the thread that completes it, the journal's syncer). Stops submitting once the
    window has lasted long enough and measured enough adds."""

    def __init__(self, store: Storage, ledger_id: int, data: bytes, in_flight: int,
                 scale: BenchScale):
        self._store = store
        self._ledger_id = ledger_id
        self._data = data
        self._in_flight = in_flight
        self._ops_min = scale.cell_ops_min
        self.warm_end = time.perf_counter() + scale.warmup_seconds
        self._stop_at = self.warm_end + scale.cell_seconds
        self._lock = threading.Lock()
        self.done_at: list[float] = []
        self.latencies: list[float] = []
        self._measured = 0
        self._slots_ended = 0
        self.first_stop: float | None = None
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self, timeout: float) -> _Window:
        """Raises the first add error, or TimeoutError when the adds do not drain."""
        for _ in range(self._in_flight):
            self._submit()
        if not self.finished.wait(timeout):
            raise TimeoutError(f"{self._in_flight} adds in flight did not drain in {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.first_stop is not None
        in_window = [lat for done, lat in zip(self.done_at, self.latencies, strict=True)
                     if self.warm_end <= done <= self.first_stop]
        return _Window(self.warm_end, self.first_stop, in_window)

    def _submit(self) -> None:
        now = time.perf_counter()
        if self.error is not None or (now >= self._stop_at and self._measured >= self._ops_min):
            self._end_slot(now)
            return
        try:
            completion = self._store.add_entry(self._ledger_id, self._data)
        except StorageError as exc:
            self.error = exc
            self._end_slot(now)
            return
        completion.add_done_callback(partial(self._on_done, now))

    def _on_done(self, submitted: float, completion: Completion[int]) -> None:
        now = time.perf_counter()
        error = completion.exception()
        if error is not None:
            self.error = error
            self._end_slot(now)
            return
        with self._lock:
            self.done_at.append(now)
            self.latencies.append(now - submitted)
            if now >= self.warm_end:
                self._measured += 1
        self._submit()

    def _end_slot(self, now: float) -> None:
        with self._lock:
            if self.first_stop is None:
                self.first_stop = now
            self._slots_ended += 1
            if self._slots_ended == self._in_flight:
                self.finished.set()


def _append_pipelined(store: Storage, ledger_id: int, data: bytes, in_flight: int,
                      scale: BenchScale) -> _Window:
    pipeline = _Pipeline(store, ledger_id, data, in_flight, scale)
    timeout = 60.0 + 10 * (scale.warmup_seconds + scale.cell_seconds)
    return pipeline.run(timeout)


def _append_cell(entry_bytes: int, in_flight: int, window: _Window) -> AppendCell:
    seconds = window.end - window.start
    count = len(window.latencies)
    assert count > 0
    assert seconds > 0
    return AppendCell(entry_bytes, in_flight, count, seconds, count / seconds,
                      count * entry_bytes / MB / seconds,
                      _percentile_ms(window.latencies, 50), _percentile_ms(window.latencies, 99))


# -- filling a store (reads and replay) ---------------------------------------------------

def _fill(store: Storage, ledger_id: int, data: bytes, count: int) -> None:
    """Add `count` entries with up to `_FILL_IN_FLIGHT_MAX` outstanding; wait for all.

    Raises the first add error.
    """
    assert count > 0
    outstanding = threading.BoundedSemaphore(_FILL_IN_FLIGHT_MAX)
    errors: list[BaseException] = []

    def release(completion: Completion[int]) -> None:
        error = completion.exception()
        if error is not None:
            errors.append(error)
        outstanding.release()

    for _ in range(count):
        outstanding.acquire()
        if errors:
            outstanding.release()
            break
        try:
            completion = store.add_entry(ledger_id, data)
        except BaseException:
            outstanding.release()
            raise
        completion.add_done_callback(release)
    for _ in range(_FILL_IN_FLIGHT_MAX):
        outstanding.acquire()
    if errors:
        raise errors[0]


def _entries_for(total_bytes: int, entry_bytes: int) -> int:
    return max(total_bytes // entry_bytes, 8)


# -- step 3: reads ----------------------------------------------------------------------

def _run_read_cells(scale: BenchScale, scratch: str, results: _Results,
                    entry_bytes: int) -> None:
    directory = _fresh_dir(scratch, f"reads-{entry_bytes}")
    count = _entries_for(scale.read_bytes, entry_bytes)
    config = scale.storage_config(
        checkpoint_interval_ms=_NEVER_MS,
        write_cache_bytes_max=_cache_bytes_for(scale.config, count * entry_bytes))
    with Storage.open(directory, config) as store:
        ledger_id = store.create_ledger({"bench": "reads"}).result()
        _fill(store, ledger_id, os.urandom(entry_bytes), count)
        assert store.last_add_confirmed(ledger_id) == count - 1
        tail_call = min(_TAILING_CALL_ENTRIES_MAX, _call_entries(entry_bytes))
        results.reads.append(_read_loop(store, ledger_id, count, entry_bytes, tail_call,
                                        "tailing", scale, before_pass=None))
        store.checkpoint()
        assert store.cache.total_bytes() == 0, "catch-up reads must miss the write cache"
        call = _call_entries(entry_bytes)
        results.reads.append(_read_loop(store, ledger_id, count, entry_bytes, call,
                                        "catch-up", scale, before_pass=None))
        drop = partial(_drop_page_cache, store.entry_log_dir)
        results.reads.append(_read_loop(store, ledger_id, count, entry_bytes, call,
                                        "catch-up cold", scale, before_pass=drop))
    shutil.rmtree(directory)


def _cache_bytes_for(config: StorageConfig, data_bytes: int) -> int:
    """A write cache whose active half holds `data_bytes` without asking for a checkpoint."""
    return max(2 * data_bytes + 32 * MB, config.write_cache_bytes_max)


def _call_entries(entry_bytes: int) -> int:
    return max(1, min(_READ_CALL_ENTRIES_MAX, _READ_CALL_BYTES_MAX // entry_bytes))


def _read_loop(store: Storage, ledger_id: int, count: int, entry_bytes: int, per_call: int,
               kind: str, scale: BenchScale,
               before_pass: Callable[[], None] | None) -> ReadCell:
    """Read the ledger front to back in calls of `per_call` entries, pass after pass,
    until the cell's time is up. Time spent in `before_pass` is not counted."""
    entries = 0
    seconds = 0.0
    while seconds < scale.cell_seconds or entries < scale.cell_ops_min:
        if before_pass is not None:
            before_pass()
        started = time.perf_counter()
        for first in range(0, count, per_call):
            last = min(first + per_call, count) - 1
            got = store.read_entries(ledger_id, first, last)
            assert len(got) == last - first + 1
            entries += len(got)
        seconds += time.perf_counter() - started
    return ReadCell(kind, entry_bytes, per_call, entries, seconds, entries / seconds,
                    entries * entry_bytes / MB / seconds)


def _drop_page_cache(directory: str) -> None:
    """Evict the (synced, hence clean) pages of every file in `directory`."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- step 4: journal replay ---------------------------------------------------------------

def _run_replay_cell(scale: BenchScale, scratch: str, results: _Results,
                     entry_bytes: int) -> None:
    directory = _fresh_dir(scratch, f"replay-{entry_bytes}")
    count = _entries_for(scale.replay_bytes, entry_bytes)
    config = scale.storage_config(
        checkpoint_interval_ms=_NEVER_MS,
        write_cache_bytes_max=_cache_bytes_for(scale.config, count * entry_bytes))
    store = Storage.open(directory, config)
    try:
        ledger_id = store.create_ledger({"bench": "replay"}).result()
        _fill(store, ledger_id, os.urandom(entry_bytes), count)
        assert store.index.last_indexed_entry(ledger_id) == -1, "nothing may be checkpointed"
    finally:
        store.abandon()
    started = time.perf_counter()
    reopened = Storage.open(directory, scale.storage_config())
    seconds = time.perf_counter() - started
    try:
        stats = reopened.replay_stats
        assert isinstance(stats, ReplayStats)
        assert reopened.last_add_confirmed(ledger_id) == count - 1, "replay lost entries"
    finally:
        reopened.close()
    shutil.rmtree(directory)
    results.replay.append(ReplayCell(entry_bytes, stats.bytes, stats.records, seconds,
                                     stats.bytes / MB / seconds))


# -- ratios, targets, the document -------------------------------------------------------

def _add_ratios(results: _Results, scale: BenchScale) -> None:
    results.limits = limits = _best_limits(results.limit_samples, scale)
    bandwidth = limits.sequential_mb_per_s
    for cell in results.appends:
        cell.vs_fsync = cell.appends_per_s / limits.fsync_append_per_s
        cell.vs_fsync_overwrite = cell.appends_per_s / limits.fsync_overwrite_per_s
        cell.vs_bandwidth = cell.mb_per_s / bandwidth
    for read in results.reads:
        read.vs_bandwidth = read.mb_per_s / bandwidth
    for replay in results.replay:
        replay.vs_bandwidth = replay.mb_per_s / bandwidth


def _targets(results: _Results) -> list[Target]:
    limits = results.limits
    assert limits is not None
    sync = _find_append(results, KB, 1)
    piped = _find_append(results, KB, max(IN_FLIGHT))
    catch_up = next(r for r in results.reads if r.kind == "catch-up" and r.entry_bytes == KB)
    replay = next(r for r in results.replay if r.entry_bytes == KB)
    sync_min = TARGET_SYNC_RATIO_MIN * limits.fsync_append_per_s
    return [
        Target(f"1 KB, 1 in flight >= {TARGET_SYNC_RATIO_MIN} x raw fsync rate",
               sync.appends_per_s, sync_min, "appends/s", sync.appends_per_s >= sync_min),
        Target(f"1 KB, {max(IN_FLIGHT)} in flight", piped.appends_per_s,
               TARGET_PIPELINED_APPENDS_PER_S_MIN, "appends/s",
               piped.appends_per_s >= TARGET_PIPELINED_APPENDS_PER_S_MIN),
        Target("catch-up reads, 1 KB entries", catch_up.entries_per_s,
               TARGET_CATCH_UP_ENTRIES_PER_S_MIN, "entries/s",
               catch_up.entries_per_s >= TARGET_CATCH_UP_ENTRIES_PER_S_MIN),
        Target("journal replay, 1 KB entries",
               replay.mb_per_s, TARGET_REPLAY_MB_PER_S_MIN, "MB/s",
               replay.mb_per_s >= TARGET_REPLAY_MB_PER_S_MIN),
    ]


def _find_append(results: _Results, entry_bytes: int, in_flight: int) -> AppendCell:
    return next(c for c in results.appends
                if c.entry_bytes == entry_bytes and c.in_flight == in_flight and not c.one_cpu)


def _document(options: BenchOptions, scale: BenchScale, results: _Results,
              load_before: tuple[float, float, float],
              load_after: tuple[float, float, float]) -> dict[str, Any]:
    assert results.limits is not None
    return {
        "benchmark": "storage",
        "parameters": {
            "directory": os.path.abspath(options.directory),
            "scale": dataclasses.asdict(scale),
            "entry_sizes": list(ENTRY_SIZES),
            "in_flight": list(IN_FLIGHT),
            "mb_bytes": MB,
        },
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "load_before": list(load_before),
            "load_after": list(load_after),
        },
        "limits": dataclasses.asdict(results.limits),
        "appends": [dataclasses.asdict(c) for c in results.appends],
        "reads": [dataclasses.asdict(c) for c in results.reads],
        "replay": [dataclasses.asdict(c) for c in results.replay],
        "targets": [dataclasses.asdict(t) for t in _targets(results)],
    }


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _percentile_ms(samples: Sequence[float], percent: float) -> float:
    assert samples
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, round(percent / 100 * len(ordered)) - 1))
    return ordered[rank] * 1000


def _size_name(size: int) -> str:
    return f"{size // KB} KB" if size % KB == 0 else f"{size} B"


# -- the table ------------------------------------------------------------------------------

def render_table(document: dict[str, Any]) -> str:
    """The human-readable report of a benchmark document."""
    parts = [_render_header(document), _render_limits(document), _render_appends(document),
             _render_reads(document), _render_replay(document), _render_targets(document)]
    return "\n\n".join(parts)


def _render_header(document: dict[str, Any]) -> str:
    machine = document["machine"]
    load = " ".join(f"{x:.2f}" for x in machine["load_before"])
    load_after = " ".join(f"{x:.2f}" for x in machine["load_after"])
    return (f"Storage benchmark ({document['parameters']['scale']['name']} run) in "
            f"{document['parameters']['directory']}\n"
            f"{machine['nproc']} CPUs, {machine['platform']}, Python {document['python']}, "
            f"commit {(document['git_commit'] or 'unknown')[:12]}\n"
            f"load average before {load}, after {load_after}; MB = 2^20 bytes")


def _render_limits(document: dict[str, Any]) -> str:
    limits = document["limits"]
    rows = [
        ["write(1 KB) + fdatasync, growing file", f"{limits['fsync_append_per_s']:,.0f} /s",
         f"{limits['fsync_append_p50_ms']:.3f}", f"{limits['fsync_append_p99_ms']:.3f}"],
        ["pwrite(1 KB) + fdatasync, preallocated", f"{limits['fsync_overwrite_per_s']:,.0f} /s",
         f"{limits['fsync_overwrite_p50_ms']:.3f}", f"{limits['fsync_overwrite_p99_ms']:.3f}"],
        [f"sequential {limits['sequential_bytes'] // MB} MB, 1 MB writes + 1 fdatasync",
         f"{limits['sequential_mb_per_s']:,.1f} MB/s", "", ""],
    ]
    samples = "; ".join(
        f"{s['when']}: {s['fsync_append_per_s']:,.0f} /s, {s['fsync_overwrite_per_s']:,.0f} /s, "
        f"{s['sequential_mb_per_s']:,.1f} MB/s" for s in limits["samples"])
    return ("Disk limits (the better of two samples, taken at the start and the end)\n"
            + _table(["measure", "rate", "p50 ms", "p99 ms"], rows, "lrrr")
            + f"\n  samples: {samples}")


def _render_appends(document: dict[str, Any]) -> str:
    verdicts = _append_verdicts(document)
    rows = [[_size_name(cell["entry_bytes"]),
             f"{cell['in_flight']}{' (one CPU)' if cell['one_cpu'] else ''}",
             f"{cell['appends_per_s']:,.0f}", f"{cell['mb_per_s']:,.1f}",
             f"{cell['p50_ms']:.2f}", f"{cell['p99_ms']:.2f}", f"{cell['vs_fsync']:.2f}",
             f"{cell['vs_fsync_overwrite']:.2f}", f"{cell['vs_bandwidth']:.3f}",
             "" if cell["one_cpu"] else verdicts.get((cell["entry_bytes"], cell["in_flight"]),
                                                     "")]
            for cell in document["appends"]]
    headers = ["entry", "in flight", "appends/s", "MB/s", "p50 ms", "p99 ms", "x fsync",
               "x fsync prealloc", "x bandwidth", "target"]
    return "Durable appends\n" + _table(headers, rows, "lrrrrrrrrl")


def _append_verdicts(document: dict[str, Any]) -> dict[tuple[int, int], str]:
    targets = document["targets"]
    return {(KB, 1): _verdict(targets[0]), (KB, max(IN_FLIGHT)): _verdict(targets[1])}


def _render_reads(document: dict[str, Any]) -> str:
    catch_up_verdict = _verdict(document["targets"][2])
    rows = []
    for read in document["reads"]:
        is_target = read["kind"] == "catch-up" and read["entry_bytes"] == KB
        rows.append([read["kind"], _size_name(read["entry_bytes"]),
                     str(read["entries_per_call"]), f"{read['entries_per_s']:,.0f}",
                     f"{read['mb_per_s']:,.1f}", f"{read['vs_bandwidth']:.2f}",
                     catch_up_verdict if is_target else ""])
    headers = ["read", "entry", "per call", "entries/s", "MB/s", "x bandwidth", "target"]
    return "Reads\n" + _table(headers, rows, "llrrrrl")


def _render_replay(document: dict[str, Any]) -> str:
    rows = []
    for replay in document["replay"]:
        passed = replay["mb_per_s"] >= TARGET_REPLAY_MB_PER_S_MIN
        rows.append([_size_name(replay["entry_bytes"]), f"{replay['journal_bytes'] / MB:,.1f}",
                     f"{replay['records']:,}", f"{replay['seconds']:.3f}",
                     f"{replay['mb_per_s']:,.1f}", f"{replay['vs_bandwidth']:.2f}",
                     "PASS" if passed else "MISS"])
    headers = ["entry", "journal MB", "records", "open s", "MB/s", "x bandwidth", "target"]
    return ("Journal replay (Storage.open after a kill with an un-checkpointed journal)\n"
            + _table(headers, rows, "lrrrrrl"))


def _render_targets(document: dict[str, Any]) -> str:
    rows = [[t["name"], f"{t['measured']:,.1f} {t['unit']}", f">= {t['required']:,.1f}",
             _verdict(t)] for t in document["targets"]]
    return "Targets\n" + _table(["target", "measured", "required", "verdict"], rows, "lrrl")


def _verdict(target: dict[str, Any]) -> str:
    return "PASS" if target["passed"] else "MISS"


def _table(headers: list[str], rows: list[list[str]], align: str) -> str:
    assert len(align) == len(headers)
    assert all(len(row) == len(headers) for row in rows)
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [c.ljust(w) if a == "l" else c.rjust(w)
                  for c, w, a in zip(cells, widths, align, strict=True)]
        return ("  " + "  ".join(padded)).rstrip()

    rule = "  " + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(row) for row in rows])


# -- the chart -------------------------------------------------------------------------------

def write_plot(document: dict[str, Any], path: str) -> None:
    """A PNG with appends/s per cell against the raw fsync rate, and MB/s of appends,
    reads and replay against the sequential bandwidth."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 6.5), dpi=100)
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.25]})
    _plot_appends(left, document)
    _plot_bandwidth(right, document)
    figure.suptitle(f"Magnetar storage benchmark ({document['parameters']['scale']['name']} "
                    f"run, {document['machine']['nproc']} CPUs)")
    figure.tight_layout()
    figure.savefig(path, format="png")


def _plot_appends(axes: Any, document: dict[str, Any]) -> None:
    width = 0.8 / len(IN_FLIGHT)
    for slot, in_flight in enumerate(IN_FLIGHT):
        cells = [c for c in document["appends"]
                 if c["in_flight"] == in_flight and not c["one_cpu"]]
        positions = [ENTRY_SIZES.index(c["entry_bytes"]) + (slot - 1) * width for c in cells]
        axes.bar(positions, [c["appends_per_s"] for c in cells], width,
                 label=f"{in_flight} in flight")
    for cell in document["appends"]:
        if cell["one_cpu"]:
            axes.plot([ENTRY_SIZES.index(cell["entry_bytes"]) - width], [cell["appends_per_s"]],
                      marker="*", markersize=12, color="tab:red", linestyle="none",
                      label=f"{cell['in_flight']} in flight, one CPU")
    limits = document["limits"]
    axes.axhline(limits["fsync_append_per_s"], color="black", linestyle="--",
                 label="raw fsync/s (growing file)")
    axes.axhline(limits["fsync_overwrite_per_s"], color="grey", linestyle=":",
                 label="raw fsync/s (preallocated)")
    axes.axhline(TARGET_PIPELINED_APPENDS_PER_S_MIN, color="red", linestyle="-.",
                 label="target, 1 KB x 256")
    axes.set_yscale("log")
    axes.set_xticks(range(len(ENTRY_SIZES)), [_size_name(s) for s in ENTRY_SIZES])
    axes.set_xlabel("entry size")
    axes.set_ylabel("durable appends/s (log)")
    axes.set_title("Durable appends")
    axes.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)


def _plot_bandwidth(axes: Any, document: dict[str, Any]) -> None:
    bars: list[tuple[str, float, str]] = []  # label, MB/s, colour
    bars += [(f"append {_size_name(c['entry_bytes'])} x{c['in_flight']}", c["mb_per_s"],
              "tab:blue") for c in document["appends"] if c["in_flight"] == max(IN_FLIGHT)]
    bars += [(f"{r['kind']} {_size_name(r['entry_bytes'])}", r["mb_per_s"], "tab:green")
             for r in document["reads"]]
    bars += [(f"replay {_size_name(r['entry_bytes'])}", r["mb_per_s"], "tab:purple")
             for r in document["replay"]]
    positions = range(len(bars))
    axes.barh(positions, [mb for _, mb, _ in bars], color=[colour for _, _, colour in bars])
    axes.axvline(document["limits"]["sequential_mb_per_s"], color="black", linestyle="--",
                 label="sequential write bandwidth")
    axes.axvline(TARGET_REPLAY_MB_PER_S_MIN, color="tab:purple", linestyle="-.",
                 label="replay target")
    axes.set_xscale("log")
    axes.set_yticks(positions, [label for label, _, _ in bars], fontsize="small")
    axes.invert_yaxis()
    axes.set_xlabel("MB/s (log)")
    axes.set_title("Appends, reads and replay against the disk's bandwidth")
    axes.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
