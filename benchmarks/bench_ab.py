"""Before/after in one run: the side-by-side workloads (`e2e_peers.py`) against two checkouts
of the broker -- typically the commit before a change and the working tree -- and pulsar-lite,
in alternating rounds on the same disk, so a change's effect is measured against the same
machine load. Each broker is a fresh `magnetar standalone` (or pulsar-lite) subprocess per
round, its data in a temporary directory under --dir.

    git archive HEAD~1 | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    python benchmarks/bench_ab.py --before /tmp/before --rounds 2 \\
        --workloads "unbatched publish,publish latency"

Prints, per workload, each broker's messages/s (and latency p50/p99) per round and the median
over the rounds, and after / before, after / pulsar-lite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_e2e import BrokerProcess
from e2e_peers import LATENCY, WORKLOADS, Workload, run_workloads, running_pulsar_lite

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_broker(root: str, scratch: str, seconds: float, consume_max: int,
                workloads: Sequence[str], event_loop: str | None) -> list[Workload]:
    broker = BrokerProcess(tempfile.mkdtemp(prefix="broker-", dir=scratch),
                           event_loop=event_loop, root=root)
    broker.start()
    try:
        return run_workloads(os.path.basename(root) or root, broker.url, seconds,
                             consume_max, workloads)
    finally:
        broker.stop()


def _figure(run: Workload) -> str:
    text = f"{run.per_s:,.0f}" + (" (stalled)" if run.stalled else "")
    if run.name == LATENCY:
        text += f" p50 {run.p50_ms:.2f} p99 {run.p99_ms:.2f} ms"
    return text


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
    parser.add_argument("--no-peer", action="store_true", help="skip pulsar-lite")
    args = parser.parse_args(argv)
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)}")
    results: dict[str, list[list[Workload]]] = {"before": [], "after": [], "pulsar-lite": []}
    with tempfile.TemporaryDirectory(prefix="magnetar-bench-ab-", dir=args.dir) as scratch:
        for round_no in range(args.rounds):
            order = ("before", "after") if round_no % 2 == 0 else ("after", "before")
            for side in order:
                root = args.before if side == "before" else args.after
                results[side].append(_run_broker(root, scratch, args.seconds, args.consume,
                                                 workloads, args.event_loop))
            if not args.no_peer:
                with running_pulsar_lite(scratch) as peer:
                    results["pulsar-lite"].append(run_workloads(
                        "pulsar-lite", peer.url, args.seconds, args.consume, workloads))
    print(f"{args.rounds} rounds, {args.seconds:g} s each, event loop "
          f"{args.event_loop or 'default'}, load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for index, name in enumerate(WORKLOADS):
        if name not in workloads:
            continue
        medians = {}
        for side, rounds in results.items():
            if not rounds:
                continue
            runs = [r[index] for r in rounds]
            medians[side] = statistics.median(r.per_s for r in runs)
            p99 = statistics.median(r.p99_ms for r in runs)
            print(f"  {name:24s} {side:12s} median {medians[side]:>9,.0f}/s"
                  + (f" p99 {p99:.2f} ms" if name == LATENCY else "") + "   rounds: "
                  + "; ".join(_figure(r) for r in runs))
        if medians.get("before"):
            line = f"  {name:24s} after/before {medians['after'] / medians['before']:.2f}"
            if medians.get("pulsar-lite"):
                line += f", after/pulsar-lite {medians['after'] / medians['pulsar-lite']:.2f}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
