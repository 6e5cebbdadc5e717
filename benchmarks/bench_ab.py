"""Before/after in one run: the side-by-side workloads (`e2e_peers.py`) against two checkouts
of the broker -- typically the commit before a change and the working tree -- and pulsar-lite,
in alternating rounds on the same disk, so a change's effect is measured against the same
machine load. Each broker is a fresh `magnetar standalone` (or pulsar-lite) subprocess per
round, its data in a temporary directory under --dir.

    git archive HEAD~1 | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    python benchmarks/bench_ab.py --before /tmp/before --rounds 2 \\
        --workloads "unbatched publish,publish latency"

Prints, per workload, each broker's messages/s (and latency p50/p99) per round and the median
over the rounds, and after / before, after / pulsar-lite; and each server's CPU time (user +
system, from /proc) per message over the workloads -- the figure least moved by other load on
a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_e2e import QUICK, BrokerProcess
from e2e_peers import (
    LATENCY,
    LATENCY_P99_ALLOWANCE_MS,
    RECEIPTS,
    WORKLOADS,
    ServerProcess,
    Workload,
    run_workloads,
    running_pulsar_lite,
)

from magnetar.storage.testing._bench_measure import _best_limits, _run_limits
from magnetar.storage.testing._bench_model import _Results

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measured(process: ServerProcess, run: Callable[[], list[Workload]]) -> Run:
    assert process.process is not None
    before = cpu_seconds(process.process.pid)
    workloads = run()
    return Run(workloads, cpu_seconds(process.process.pid) - before)


@dataclass
class Run:
    workloads: list[Workload]
    cpu_s: float  # the server process's CPU time during the workloads

    def cpu_us_per_message(self) -> float:
        messages = sum(w.messages for w in self.workloads)
        return self.cpu_s / messages * 1e6 if messages else 0.0


def _run_broker(root: str, scratch: str, seconds: float, consume_max: int,
                workloads: Sequence[str], event_loop: str | None, receipts: str) -> Run:
    broker = BrokerProcess(tempfile.mkdtemp(prefix="broker-", dir=scratch),
                           event_loop=event_loop, root=root)
    broker.start()
    try:
        broker.wait_ready()
        return _measured(broker, lambda: run_workloads(
            os.path.basename(root) or root, broker.url, broker.pid, seconds, consume_max,
            workloads, receipts))
    finally:
        broker.stop()
        broker.discard_data()


def _figure(run: Workload) -> str:
    text = f"{run.per_s:,.0f}" + (" (stalled)" if run.stalled else "")
    if run.name == LATENCY:
        text += f" p50 {run.p50_ms:.2f} p99 {run.p99_ms:.2f} ms"
    return text


def _report(results: dict[str, list[Run]], workloads: Sequence[str]) -> str:
    lines = []
    for index, name in enumerate(WORKLOADS):
        if name not in workloads:
            continue
        medians = {}
        for side, rounds in results.items():
            if not rounds:
                continue
            runs = [r.workloads[index] for r in rounds]
            medians[side] = statistics.median(r.per_s for r in runs)
            p50 = statistics.median(r.p50_ms for r in runs)
            p99 = statistics.median(r.p99_ms for r in runs)
            lines.append(f"  {name:24s} {side:12s} median {medians[side]:>9,.0f}/s"
                         + (f" p50 {p50:.2f} p99 {p99:.2f} ms" if name == LATENCY else "")
                         + "   rounds: "
                         + "; ".join(_figure(r) for r in runs))
        if medians.get("before"):
            line = f"  {name:24s} after/before {medians['after'] / medians['before']:.2f}"
            if medians.get("pulsar-lite"):
                line += f", after/pulsar-lite {medians['after'] / medians['pulsar-lite']:.2f}"
            lines.append(line)
    for side, rounds in results.items():
        if rounds:
            cpu = [r.cpu_us_per_message() for r in rounds]
            lines.append(f"  server CPU per message, all workloads: {side:12s} median "
                         f"{statistics.median(cpu):.1f} us   rounds: "
                         + "; ".join(f"{c:.1f}" for c in cpu))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the checkout measured as 'before'")
    parser.add_argument("--after", default=REPO_ROOT, help="default: this checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--consume", type=int, default=50_000, help="messages, at most")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--workloads", default="unbatched publish,publish latency")
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default=None)
    parser.add_argument("--before-event-loop", choices=("asyncio", "uvloop"), default=None,
                        help="the before side's loop, if not --event-loop's (with --before "
                        "= --after, this compares the loops)")
    parser.add_argument("--no-peer", action="store_true", help="skip pulsar-lite")
    parser.add_argument("--receipts", choices=RECEIPTS, default=RECEIPTS[0],
                        help="how the publish workloads learn of receipts (as bench_e2e.py)")
    args = parser.parse_args(argv)
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)}")
    results: dict[str, list[Run]] = {"before": [], "after": [], "pulsar-lite": []}
    disk = _Results()
    with tempfile.TemporaryDirectory(prefix="magnetar-bench-ab-", dir=args.dir) as scratch:
        if LATENCY in workloads:  # the latency target's fdatasync p99, as bench_e2e.py
            _run_limits(QUICK.storage, scratch, disk, "start")
        for round_no in range(args.rounds):
            order = ("before", "after") if round_no % 2 == 0 else ("after", "before")
            for side in order:
                root = args.before if side == "before" else args.after
                loop = args.before_event_loop if side == "before" else None
                results[side].append(_run_broker(root, scratch, args.seconds, args.consume,
                                                 workloads, loop or args.event_loop,
                                                 args.receipts))
            if not args.no_peer:
                with running_pulsar_lite(scratch) as peer:
                    results["pulsar-lite"].append(_measured(peer, lambda: run_workloads(
                        "pulsar-lite", peer.url, peer.pid, args.seconds, args.consume,
                        workloads, args.receipts)))
        if LATENCY in workloads:
            _run_limits(QUICK.storage, scratch, disk, "end")
    print(f"{args.rounds} rounds, {args.seconds:g} s each, event loop "
          f"{args.event_loop or 'default'}, load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if disk.limit_samples:
        limits = _best_limits(disk.limit_samples, QUICK.storage)
        print(f"publish latency target: p99 <= {LATENCY_P99_ALLOWANCE_MS:g} ms + the fdatasync "
              f"p99 {limits.fsync_append_p99_ms:.2f} ms = "
              f"{LATENCY_P99_ALLOWANCE_MS + limits.fsync_append_p99_ms:.2f} ms (the better of "
              f"the samples at the start and the end: "
              + ", ".join(f"{s.when} {s.fsync_append_p99_ms:.2f}" for s in disk.limit_samples)
              + ")")
    print(_report(results, workloads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
