"""How far the official Python client can go on this machine: issue 14's publish targets
against a broker that does nothing.

Issue 14 sets four publish targets measured with the official client (`bench_e2e.py`):
batched publish >= 1.5x pulsar-lite, unbatched publish >= 50,000 msg/s, sync publish >= 0.8x
the raw write + fdatasync rate, publish latency p99 <= 3 ms + the fdatasync p99. This runs the
same workloads (`e2e_peers.run_workloads`, same settings) in one run against three servers on
the same disk:

* `magnetar standalone` (durable: fdatasync before each receipt),
* pulsar-lite, the issue's peer,
* `null_broker.py`, which receipts every SEND at once and stores nothing: what the client
  reaches against it is the most any broker could give it here (the client's own ceiling).

and prints, per target, each server's figure and whether the ceiling leaves room for the target
at all ("reachable": the do-nothing broker meets it). For sync publish (one message in flight)
a durable broker must add one fdatasync to every round trip, so its ceiling there is the null
broker's round trip plus one preallocated write + fdatasync (the cheapest sync the disk
offers): `1 / (1 / null rate + 1 / preallocated fsync rate)`, against 0.8x the growing-file
rate the target names. The client's CPU per message is printed
for each server: it is the client process, all its threads. Table on stdout, JSON with --json.

How the publish workloads learn of receipts matters here (`--receipts`, see `e2e_peers.py`):
with a Python callback per send, the client's callbacks cost it more than any broker does, and
every broker ends up at the same ceiling; without them (the default), the brokers differ.

Example: `python benchmarks/client_ceiling.py --seconds 3 --dir /tmp`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_e2e import BrokerProcess
from e2e_peers import (
    LATENCY,
    LATENCY_P99_ALLOWANCE_MS,
    RECEIPTS,
    ServerProcess,
    Workload,
    run_workloads,
    running_pulsar_lite,
)

from magnetar.storage.testing._bench_measure import _best_limits, _run_limits
from magnetar.storage.testing._bench_model import _Results
from magnetar.storage.testing.benchmark import QUICK_SCALE

PUBLISH_WORKLOADS = ("batched publish", "unbatched publish", "sync publish", LATENCY)
SERVERS = ("magnetar", "pulsar-lite", "null")
BATCHED_VS_PEER_MIN = 1.5
UNBATCHED_PER_S_MIN = 50_000.0
SYNC_VS_FSYNC_MIN = 0.8


class NullBrokerProcess(ServerProcess):
    """`null_broker.py` in a subprocess."""

    name = "the null broker"

    def __init__(self, directory: str):
        super().__init__(directory, "null-broker.log")

    def start(self) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        self._launch([sys.executable, os.path.join(here, "null_broker.py"),
                      "--port", str(self.port)], cwd=here)


@contextlib.contextmanager
def _running(server: str, scratch: str) -> Iterator[ServerProcess]:
    if server == "pulsar-lite":
        with running_pulsar_lite(scratch) as peer:
            yield peer
        return
    process: ServerProcess = (BrokerProcess(tempfile.mkdtemp(prefix="broker-", dir=scratch))
                              if server == "magnetar"
                              else NullBrokerProcess(tempfile.mkdtemp(prefix="null-", dir=scratch)))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def measure(scratch: str, seconds: float, receipts: str = RECEIPTS[0]) -> dict[str, Any]:
    """The disk limits, then every server's publish workloads (receipts counted as
    `receipts` says, `e2e_peers.RECEIPTS`); the JSON document."""
    limits_results = _Results()
    _run_limits(QUICK_SCALE, scratch, limits_results, "start")
    limits = _best_limits(limits_results.limit_samples, QUICK_SCALE)
    figures: dict[str, dict[str, Workload]] = {}
    for server in SERVERS:
        with _running(server, scratch) as process:
            done = run_workloads(server, process.url, process.pid, seconds, 1,
                                 only=PUBLISH_WORKLOADS, receipts=receipts)
        figures[server] = {w.name: w for w in done if w.name in PUBLISH_WORKLOADS}
    return {
        "receipts": receipts,
        "fsync_append_per_s": limits.fsync_append_per_s,
        "fsync_append_p99_ms": limits.fsync_append_p99_ms,
        "fsync_overwrite_per_s": limits.fsync_overwrite_per_s,
        "servers": {server: {name: _workload_json(w) for name, w in workloads.items()}
                    for server, workloads in figures.items()},
    }


def _workload_json(workload: Workload) -> dict[str, Any]:
    server_us, client_us = workload.cpu_us_per_message()
    return {"per_s": workload.per_s, "stalled": workload.stalled, "p50_ms": workload.p50_ms,
            "p99_ms": workload.p99_ms, "client_cpu_us_per_message": client_us,
            "server_cpu_us_per_message": server_us,
            "client_cores": workload.client_cpu_s / workload.wall_s if workload.wall_s else 0.0}


def targets(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: its goal, each server's value, and whether the null broker meets it."""
    servers = document["servers"]

    def value(server: str, workload: str, key: str = "per_s") -> float:
        return float(servers[server][workload][key])

    peer_batched = value("pulsar-lite", "batched publish")
    fsync = document["fsync_append_per_s"]

    def sync_vs_fsync(server: str) -> float:
        rate = value(server, "sync publish")
        if server == "null":  # plus the one fdatasync a durable broker owes each message
            rate = 1 / (1 / rate + 1 / document["fsync_overwrite_per_s"])
        return rate / fsync

    rows = [
        ("batched publish, x pulsar-lite", BATCHED_VS_PEER_MIN, "batched publish",
         lambda s: value(s, "batched publish") / peer_batched, True),
        ("unbatched publish, msg/s", UNBATCHED_PER_S_MIN, "unbatched publish",
         lambda s: value(s, "unbatched publish"), True),
        ("sync publish, x raw fsync", SYNC_VS_FSYNC_MIN, "sync publish",
         sync_vs_fsync, True),
        ("latency p99 at 5,000/s, ms", LATENCY_P99_ALLOWANCE_MS + document["fsync_append_p99_ms"],
         LATENCY, lambda s: value(s, LATENCY, "p99_ms"), False),
    ]
    result = []
    for name, goal, workload, of, higher_is_better in rows:
        values = {server: of(server) for server in SERVERS}
        reachable = values["null"] >= goal if higher_is_better else values["null"] <= goal
        result.append({"target": name, "goal": goal, "values": values,
                       "client_cpu_us": {s: servers[s][workload]["client_cpu_us_per_message"]
                                         for s in SERVERS},
                       "null_server_cpu_us": servers["null"][workload]["server_cpu_us_per_message"],
                       "null_client_cores": servers["null"][workload]["client_cores"],
                       "reachable_with_this_client": reachable})
    return result


def render(document: dict[str, Any]) -> str:
    lines = [f"publish receipts counted by {document.get('receipts', 'callback')}",
             f"raw write(1 KB) + fdatasync: {document['fsync_append_per_s']:,.0f} /s, "
             f"p99 {document['fsync_append_p99_ms']:.3f} ms; preallocated "
             f"{document['fsync_overwrite_per_s']:,.0f} /s",
             "null: the do-nothing broker (sync row: plus one preallocated fdatasync per "
             "message)", ""]
    header = (f"{'target':<32}{'goal':>10}" + "".join(f"{s:>13}" for s in SERVERS)
              + "  client CPU us/msg (m / lite / null)  reachable")
    lines += [header, "-" * len(header)]
    for row in document["targets"]:
        values = "".join(f"{row['values'][s]:>13,.2f}" for s in SERVERS)
        cpu = " / ".join(f"{row['client_cpu_us'][s]:.1f}" for s in SERVERS)
        lines.append(f"{row['target']:<32}{row['goal']:>10,.2f}{values}  {cpu:<36} "
                     f"{'yes' if row['reachable_with_this_client'] else 'NO'}")
    lines += ["", "against the null broker: its own CPU us/msg, and the client's cores "
              "(CPU seconds per wall second)"]
    lines += [f"  {row['target']:<32}{row['null_server_cpu_us']:>8.1f} us/msg  "
              f"{row['null_client_cores']:.2f} cores" for row in document["targets"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Issue 14's publish targets with the official client against magnetar, "
                    "pulsar-lite and a do-nothing broker (the client's own ceiling), one run.")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="seconds per workload and server (default 3)")
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="run on the disk holding this directory")
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--receipts", choices=RECEIPTS, default=RECEIPTS[0],
                        help="flush (sends without callbacks, flush() at the end; default) or "
                             "callback (a Python callback per send)")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds must be positive, not {args.seconds}")
    if not os.path.isdir(args.dir):
        parser.error(f"--dir {args.dir}: not a directory")
    with tempfile.TemporaryDirectory(prefix="client-ceiling-", dir=args.dir) as scratch:
        document = measure(scratch, args.seconds, args.receipts)
    document["targets"] = targets(document)
    print(render(document))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
