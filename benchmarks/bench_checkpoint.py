"""What a checkpoint costs the threads beside it (issue 14, target 4: publish latency).

A `Storage` in a temporary directory takes `--entries` adds of `--entry-bytes` each (one
ledger, or `--ledgers` round robin), then `store.checkpoint()` flushes them, `--rounds`
times (after two more as a warm-up, not counted). Meanwhile a probe thread sleeps 0.2 ms in
a loop, as an event loop between its system calls: each time it needs the GIL back, and its
wake-up past the sleep is how long it waited (for the GIL, or for a CPU). Printed per run:

* the checkpointing thread's CPU time and the wall time of a checkpoint (medians);
* the cyclic-GC collections that ran during checkpoints (any thread), and their time;
* the probe's waits during checkpoints: p50, p99 and the longest.

`--root` also runs another checkout (e.g. a `git archive` copy of main) in a subprocess,
alternating with this one `--pairs` times, so that both see the same machine load. The
GIL switch interval is the standalone broker's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROBE_SLEEP_S = 0.0002
WARM_UP_ROUNDS = 2


def measure(entries: int, entry_bytes: int, ledgers: int, rounds: int, directory: str,
            warm_up: int = WARM_UP_ROUNDS, broker_switch_interval: bool = True
            ) -> dict[str, Any]:
    """One run in this process, with whatever `magnetar.storage` imports as; with the
    standalone broker's GIL switch interval unless `broker_switch_interval` is False (the
    smoke test: importing the broker for it takes seconds on a loaded machine)."""
    from magnetar.storage import Storage, StorageConfig

    if broker_switch_interval:
        from magnetar.broker.cli._standalone import GIL_SWITCH_INTERVAL_S

        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    data_dir = tempfile.mkdtemp(prefix="checkpoint-", dir=directory)
    config = StorageConfig(checkpoint_interval_ms=3_600_000, gc_interval_ms=3_600_000)
    store = Storage.open(data_dir, config)
    counting = threading.Event()
    waits: list[float] = []
    collections: list[float] = []
    started = [0.0]
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            before = time.perf_counter()
            time.sleep(PROBE_SLEEP_S)
            if counting.is_set():
                waits.append(time.perf_counter() - before - PROBE_SLEEP_S)

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif counting.is_set():
            collections.append(time.perf_counter() - started[0])

    prober = threading.Thread(target=probe, name="probe", daemon=True)
    gc.callbacks.append(on_gc)
    cpu_ms: list[float] = []
    wall_ms: list[float] = []
    try:
        ledger_ids = [store.create_ledger().result() for _ in range(ledgers)]
        payload = os.urandom(entry_bytes)
        prober.start()
        for round_no in range(rounds + warm_up):
            added = [store.add_entry(ledger_ids[i % ledgers], payload) for i in range(entries)]
            for completion in added:
                completion.result()
            counted = round_no >= warm_up
            if counted:
                counting.set()
            cpu, wall = time.thread_time(), time.perf_counter()
            store.checkpoint()
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            counting.clear()
            if counted:
                cpu_ms.append(cpu * 1000)
                wall_ms.append(wall * 1000)
    finally:
        stop.set()
        gc.callbacks.remove(on_gc)
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    waits.sort()
    return {
        "cpu_ms": statistics.median(cpu_ms), "wall_ms": statistics.median(wall_ms),
        "gc_per_checkpoint": len(collections) / rounds,
        "gc_ms_per_checkpoint": sum(collections) * 1000 / rounds,
        "wait_p50_us": _at(waits, 0.5), "wait_p99_us": _at(waits, 0.99),
        "wait_max_us": waits[-1] * 1e6 if waits else 0.0,
    }


def _at(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(len(values) * fraction))] * 1e6 if values else 0.0


def _report(name: str, result: dict[str, Any]) -> str:
    return (f"{name:>8}: checkpoint CPU {result['cpu_ms']:.1f} ms, wall {result['wall_ms']:.1f}"
            f" ms; GC during it {result['gc_per_checkpoint']:.1f} collections "
            f"({result['gc_ms_per_checkpoint']:.2f} ms); probe waits p50 "
            f"{result['wait_p50_us']:.0f} p99 {result['wait_p99_us']:.0f} max "
            f"{result['wait_max_us']:.0f} us")


def _run_other(root: str, args: argparse.Namespace) -> dict[str, Any]:
    """This script's `--json-only` run with `root` first on the import path."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    command = [sys.executable, os.path.abspath(__file__), "--json-only",
               "--entries", str(args.entries), "--entry-bytes", str(args.entry_bytes),
               "--ledgers", str(args.ledgers), "--rounds", str(args.rounds),
               "--dir", args.dir]
    done = subprocess.run(command, env=env, cwd=tempfile.gettempdir(), check=True,
                          capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--ledgers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--root", help="another checkout, run alternately with this one")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warm_up = WARM_UP_ROUNDS
    if args.quick:
        args.entries, args.rounds, args.pairs, warm_up = 300, 1, 1, 0
    if args.json_only:
        print(json.dumps(measure(args.entries, args.entry_bytes, args.ledgers, args.rounds,
                                 args.dir, warm_up)))
        return 0
    print(f"checkpoints of {args.entries:,} entries of {args.entry_bytes:,} B "
          f"({args.ledgers} ledger(s)), {args.rounds} counted; load average "
          f"{os.getloadavg()[0]:.2f}")
    for _ in range(args.pairs if args.root else 1):
        if args.root:
            print(_report("other", _run_other(args.root, args)))
        print(_report("this", measure(args.entries, args.entry_bytes, args.ledgers,
                                      args.rounds, args.dir, warm_up, not args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
