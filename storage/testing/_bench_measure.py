"""The storage benchmark's measurements (see `benchmark` for the theory of operation): the
disk's own limits with plain `os` calls, durable appends at every (entry size, adds in
flight) cell, tailing and catch-up reads (warm and cold), and journal replay.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from .._completion import Completion
from .._config import StorageConfig
from .._errors import StorageError
from .._recovery import ReplayStats
from .._storage import Storage
from ._bench_model import (
    _FILL_IN_FLIGHT_MAX,
    _NEVER_MS,
    _PREALLOC_BYTES,
    _READ_CALL_BYTES_MAX,
    _READ_CALL_ENTRIES_MAX,
    _TAILING_CALL_ENTRIES_MAX,
    KB,
    MB,
    AppendCell,
    BenchScale,
    Limits,
    LimitSample,
    ReadCell,
    ReplayCell,
    _entries_for,
    _fresh_dir,
    _percentile_ms,
    _Results,
)

__all__: list[str] = []

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
                     in_flight: int, *, one_cpu: bool = False, runs: bool = False) -> None:
    directory = _fresh_dir(scratch, f"append-{entry_bytes}-{in_flight}-{int(one_cpu)}"
                                    f"{'-runs' if runs else ''}")
    data = os.urandom(entry_bytes)
    with _on_one_cpu(one_cpu), Storage.open(directory, scale.storage_config()) as store:
        ledger_id = store.create_ledger({"bench": "append"}).result()
        cpu_started = time.process_time()
        if in_flight == 1:
            window = _append_and_wait(store, ledger_id, data, scale)
        elif runs:
            window = _RunPipeline(store, ledger_id, data, in_flight, scale).run(
                _drain_seconds(scale))
        else:
            window = _append_pipelined(store, ledger_id, data, in_flight, scale)
        cpu = time.process_time() - cpu_started
    shutil.rmtree(directory)
    cell = _append_cell(entry_bytes, in_flight, window)
    cell.one_cpu = one_cpu
    cell.runs = runs
    cell.cpu_us_per_append = cpu * 1e6 / window.total
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
    total: int  # adds completed in the whole cell, warm-up included (for CPU per add)


def _append_and_wait(store: Storage, ledger_id: int, data: bytes,
                     scale: BenchScale) -> _Window:
    warm_end = time.perf_counter() + scale.warmup_seconds
    stop_at = warm_end + scale.cell_seconds
    latencies: list[float] = []
    total = 0
    now = time.perf_counter()
    while now < stop_at or len(latencies) < scale.cell_ops_min:
        store.add_entry(ledger_id, data).result()
        done = time.perf_counter()
        if now >= warm_end:
            latencies.append(done - now)
        now = done
        total += 1
    return _Window(warm_end, now, latencies, total)


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
        return _Window(self.warm_end, self.first_stop, in_window, len(self.done_at))

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
    return pipeline.run(_drain_seconds(scale))


def _drain_seconds(scale: BenchScale) -> float:
    return 60.0 + 10 * (scale.warmup_seconds + scale.cell_seconds)


class _RunPipeline:
    """Keeps `in_flight` adds outstanding as a broker connection does: a submitter thread
    takes every slot freed since its last turn and submits them as ONE `add_entries` run
    (a socket read's SENDs), while completions (in the journal's thread) only free their
    run's slots. Latency is per entry: its run's submit to its run's completion. Stops
    submitting once the window has lasted long enough and measured enough adds."""

    def __init__(self, store: Storage, ledger_id: int, data: bytes, in_flight: int,
                 scale: BenchScale):
        self._store = store
        self._ledger_id = ledger_id
        self._data = data
        self._ops_min = scale.cell_ops_min
        self.warm_end = time.perf_counter() + scale.warmup_seconds
        self._stop_at = self.warm_end + scale.cell_seconds
        self._changed = threading.Condition()
        self._free = in_flight
        self._in_flight = in_flight
        self._error: BaseException | None = None
        self._done: list[tuple[float, float, int]] = []  # (when, latency, adds) per run
        self._measured = 0  # adds finished after the warm-up
        self._total = 0

    def run(self, timeout: float) -> _Window:
        """Raises the first add error, or TimeoutError when the adds do not drain."""
        deadline = time.perf_counter() + timeout
        stopped: float | None = None
        while True:
            with self._changed:
                while self._free == 0 and self._error is None:
                    if not self._changed.wait(max(0.0, deadline - time.perf_counter())):
                        raise TimeoutError(f"{self._in_flight} adds in flight did not drain "
                                           f"in {timeout} s")
                if self._error is not None:
                    raise self._error
                now = time.perf_counter()
                if stopped is None and now >= self._stop_at and self._measured >= self._ops_min:
                    stopped = now
                if stopped is not None:
                    if self._free == self._in_flight:
                        return _Window(self.warm_end, stopped, [
                            latency for when, latency, count in self._done
                            if self.warm_end <= when <= stopped for _ in range(count)],
                            self._total)
                    self._changed.wait(max(0.0, deadline - now))
                    continue
                count, self._free = self._free, 0
            completion = self._store.add_entries(self._ledger_id, [self._data] * count)
            completion.add_done_callback(partial(self._on_done, now, count))

    def _on_done(self, submitted: float, count: int, completion: Completion[int]) -> None:
        now = time.perf_counter()
        error = completion.exception()
        with self._changed:
            if error is not None and self._error is None:
                self._error = error
            self._free += count
            self._total += count
            self._done.append((now, now - submitted, count))
            if self.warm_end <= now:
                self._measured += count
            self._changed.notify()


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
    cpu_started = time.process_time()
    started = time.perf_counter()
    reopened = Storage.open(directory, scale.storage_config())
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    try:
        stats = reopened.replay_stats
        assert isinstance(stats, ReplayStats)
        assert reopened.last_add_confirmed(ledger_id) == count - 1, "replay lost entries"
        reopened.checkpoint()  # after the replay's own flush: all of it out of the journal
        flushed = time.perf_counter() - started
        assert reopened.index.last_indexed_entry(ledger_id) == count - 1
    finally:
        reopened.close()
    shutil.rmtree(directory)
    results.replay.append(ReplayCell(entry_bytes, stats.bytes, stats.records, seconds,
                                     stats.bytes / MB / seconds, cpu, flushed))
