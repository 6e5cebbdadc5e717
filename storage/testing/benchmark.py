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
   warm-up and reports appends/s, MB/s of entry data, latency p50/p99 (submit to
   completion), and the CPU of the whole process (every thread) per add, warm-up
   included. One more cell repeats 1 KB with 1 in flight with the process held to one
   CPU (Linux), to show what cross-CPU thread wake-ups cost that case. Another repeats
   1 KB with 256 in flight the way a broker connection submits (`runs`): a client thread
   takes every slot freed since its last turn and submits them as ONE `add_entries` run,
   as the broker does with the SENDs of one socket read (one lock hold, one journal
   request and one completion per run); the plain cell submits each freed slot as an add
   of its own from the completing thread.
3. Reads: tailing reads from the write cache (the checkpoint interval is made huge so the
   cache keeps everything), then catch-up reads front to back from the entry logs after a
   checkpoint has emptied the cache, first with the logs in the page cache (warm), then
   with their pages dropped before each pass (`POSIX_FADV_DONTNEED`, cold).
4. Journal replay: entries are journaled with nothing checkpointed, the store is abandoned
   (the un-checkpointed journal a kill leaves), and `Storage.open` is timed. The rate is
   the journal bytes replayed (record headers included) over the whole open: until the
   store accepts writes and serves reads. The open does not wait for the replayed
   entries to reach entry logs and the index (the journal covers them until then; the
   checkpoint thread flushes them next), so the cell also reports the time until that
   flush is done (`flushed s`: the open and a checkpoint right after it), and the CPU of
   the process during the open.

Ratios: appends/s over the raw fsync rate (1 in flight: how close an add is to one bare
fsync; more in flight: how many adds group commit fits in one fsync's time), and every
MB/s over the sequential bandwidth. MB means 2**20 bytes throughout.

The results go to stdout as a table, to `json_path` as JSON (parameters, git commit,
Python, machine and its load, results, targets) and, optionally, to `plot_path` as a PNG.

Layout: this module runs the steps; `_bench_model` holds the parameters and results,
`_bench_measure` the measurements and `_bench_report` the document, table and chart.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from tqdm import tqdm

from ._bench_measure import (
    _run_append_cell,
    _run_limits,
    _run_read_cells,
    _run_replay_cell,
)
from ._bench_model import (
    ENTRY_SIZES,
    FULL_SCALE,
    IN_FLIGHT,
    KB,
    QUICK_SCALE,
    READ_KINDS,
    READ_SIZES,
    REPLAY_SIZES,
    TINY_SCALE,
    BenchOptions,
    BenchScale,
    _Results,
    _size_name,
)
from ._bench_report import (
    _add_ratios,
    _document,
    render_table,
    write_plot,
)

__all__ = [
    "ENTRY_SIZES",
    "FULL_SCALE",
    "IN_FLIGHT",
    "QUICK_SCALE",
    "READ_KINDS",
    "READ_SIZES",
    "REPLAY_SIZES",
    "TINY_SCALE",
    "BenchOptions",
    "BenchScale",
    "run_storage_benchmark",
]


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
    steps.append((f"append 1 KB x{max(IN_FLIGHT)} runs", partial(
        _run_append_cell, scale, scratch, results, KB, max(IN_FLIGHT), runs=True)))
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
