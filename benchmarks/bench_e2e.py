"""End-to-end benchmark: the official Pulsar Python client against `magnetar standalone` in a
subprocess, durable, set against the disk's limits measured in the same run.

What is measured
----------------
A broker is started as a subprocess (`python -m magnetar.broker.cli standalone`) on a free loopback
port, with its data directory in a temporary directory under `--dir` (the disk being
measured); it is stopped by PID (SIGTERM, then a wait) and the directory removed at the end.
Every publish is durable: the broker receipts a SEND only once its entry is journaled.

For each cell -- message size (1 KB, 100 B) x client batching (off: `batching_enabled=False`;
on: `batching_enabled=True` with the client's default batching settings), one producer and
one consumer, on a fresh topic:

* **Publish rate**: `send_async` with at most `PUBLISH_IN_FLIGHT` sends unreceipted, for a
  fixed time; messages/s and MB/s of message data counted from the receipts.
* **End-to-end latency**: an Exclusive consumer (a message listener that acknowledges) receives
  while the producer sends at a steady rate, `LATENCY_RATE_FRACTION` of the measured publish
  rate (at most `LATENCY_RATE_MAX_PER_S`); each message carries its send time (a
  `time.time_ns()` property); latency = receive time - send time; p50, p99, max.
* **Consume rate**: the messages of the publish phase stay in a subscription created before it;
  a consumer then drains up to `consume_messages` of that backlog with `receive` +
  `acknowledge`; messages/s from the subscribe to the last receive.

Disk limits: `storage.testing.benchmark`'s own measurement (1 KB write + fdatasync on a growing
file and on a preallocated one, sequential bandwidth), sampled at the start and the end; each
limit is the better sample. Ratios: publish messages/s over the growing file's fsync rate (for
batching off, how many receipted sends fit in one bare fsync's time -- above 1 the broker's
group commit shares a sync among sends), and MB/s over the sequential bandwidth. MB means 2**20
bytes.

Side by side (`e2e_peers.py`): the issue-14 workloads at 1 KB -- batched publish, batched
consume + ack, unbatched publish, unbatched consume + ack, sync publish -- against this
broker and against pulsar-lite (the `bench` extra's peer, its own binary) in the same run;
ratios Magnetar / pulsar-lite, and sync publish over the raw fsync rate. `--rounds N` runs
them N times, alternating (a fresh Magnetar, then a fresh pulsar-lite, per round): the table
shows each broker's median round and every round is listed below it, since on a shared
machine one round's ratio moves by tens of percent with the machine's speed.

Many topics (`e2e_many_topics.py`, a broker of its own): 100 producers on 100 topics against
one topic's unbatched rate, then the scale's number of topics created one by one with the
official client (topics/s per step and the broker's RSS as N grows), then a restart and the
time until the first topic serves again. `--many-topics N` sets N (0 leaves it out).

    python benchmarks/bench_e2e.py --quick --json e2e.json --plot e2e.png
    python benchmarks/bench_e2e.py --dir /data
    python benchmarks/bench_e2e.py --only-many-topics --many-topics 10000

Profiling: `--side-by-side-only --workloads "unbatched publish" --profile broker.prof` runs
just that workload (the limits are still measured) with the broker under cProfile, whose stats
land in broker.prof when it stops; `--event-loop uvloop` (or asyncio) sets the broker's
MAGNETAR_EVENT_LOOP.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# Runnable from a checkout without installing: the repository root holds the packages.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # e2e_peers beside it

import pulsar  # type: ignore[import-untyped]
from e2e_many_topics import plot_many_topics, render_many_topics, run_many_topics
from e2e_peers import (
    RECEIPTS,
    STARTUP_DEADLINE_S,
    WORKLOADS,
    ServerProcess,
    median_rounds,
    plot_side_by_side,
    render_rounds,
    render_side_by_side,
    run_workloads,
    running_pulsar_lite,
)
from send_receipts import BoundedReceipts
from tqdm import tqdm

from magnetar.storage.testing._bench_measure import _best_limits, _run_limits
from magnetar.storage.testing._bench_model import _percentile_ms, _Results
from magnetar.storage.testing._bench_report import _git_commit, _render_limits, _table
from magnetar.storage.testing.benchmark import (
    FULL_SCALE,
    QUICK_SCALE,
    TINY_SCALE,
    BenchScale,
    _quiet_storage_log,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1024 * 1024
HOST = "127.0.0.1"
MESSAGE_SIZES = (1024, 100)
BATCHING = (False, True)
PUBLISH_IN_FLIGHT = 1000  # sends not yet receipted, at most
LATENCY_RATE_FRACTION = 0.5  # of the measured publish rate
LATENCY_RATE_MAX_PER_S = 5000.0  # what a paced Python loop sustains while the listener runs
PACE_TICK_S = 0.001  # the paced sender sends what is due, then sleeps this long
RECEIVE_TIMEOUT_MS = 10_000
OPERATION_TIMEOUT_S = 30
DRAIN_DEADLINE_S = 60.0  # for the last receipts or latency messages of a phase
SEND_TIME_PROPERTY = "bench-sent-ns"
READY_LOG_LINE = b"Magnetar standalone ready on"  # broker/cli/_standalone.py logs it


@dataclass(frozen=True)
class E2EScale:
    """How long and how big each phase of a cell is."""

    name: str
    storage: BenchScale  # the disk-limit samples
    publish_seconds: float
    latency_seconds: float
    consume_messages: int  # drained from the publish phase's backlog, at most
    many_topics: int  # topics created one by one (`e2e_many_topics`)

    def __post_init__(self) -> None:
        assert self.publish_seconds > 0
        assert self.latency_seconds > 0
        assert self.consume_messages > 0
        assert self.many_topics >= 0


FULL = E2EScale("full", FULL_SCALE, 10.0, 10.0, 200_000, 100_000)
QUICK = E2EScale("quick", QUICK_SCALE, 3.0, 3.0, 50_000, 10_000)
TINY = E2EScale("tiny", TINY_SCALE, 0.3, 0.3, 500, 20)  # for the smoke test


@dataclass
class BenchOptions:
    directory: str = "."
    quick: bool = False
    json_path: str | None = None
    plot_path: str | None = None
    progress: bool = True
    scale: E2EScale | None = None  # overrides `quick` (the test uses TINY)
    side_by_side_only: bool = False  # skip the cells
    workloads: tuple[str, ...] = WORKLOADS  # the side-by-side workloads to run
    profile_path: str | None = None  # the broker runs under cProfile, its stats here
    event_loop: str | None = None  # the broker's MAGNETAR_EVENT_LOOP (None: inherited)
    many_topics: int | None = None  # overrides the scale's
    only_many_topics: bool = False  # the many-topics workloads alone
    receipts: str = RECEIPTS[0]  # how the side-by-side publish workloads count receipts
    rounds: int = 1  # side-by-side rounds (each broker once per round, fresh; medians shown)

    def __post_init__(self) -> None:
        assert self.rounds >= 1

    def chosen_scale(self) -> E2EScale:
        scale = self.scale if self.scale is not None else QUICK if self.quick else FULL
        if self.many_topics is not None:
            scale = dataclasses.replace(scale, many_topics=self.many_topics)
        return scale


@dataclass
class Cell:
    message_bytes: int
    batching: bool
    published: int = 0
    publish_seconds: float = 0.0
    publish_per_s: float = 0.0
    publish_mb_per_s: float = 0.0
    latency_rate_per_s: float = 0.0  # the paced send rate of the latency phase
    latency_messages: int = 0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_max_ms: float = 0.0
    consumed: int = 0
    consume_seconds: float = 0.0
    consume_per_s: float = 0.0
    consume_mb_per_s: float = 0.0
    publish_vs_fsync: float = 0.0
    publish_vs_bandwidth: float = 0.0
    consume_vs_bandwidth: float = 0.0


@dataclass
class _E2EResults:
    storage: _Results = field(default_factory=_Results)
    cells: list[Cell] = field(default_factory=list)
    side_by_side_rounds: list[list[Any]] = field(default_factory=list)  # e2e_peers.Workload
    many_topics: Any = None  # e2e_many_topics.ManyTopics


# -- the broker subprocess ------------------------------------------------------------------

class BrokerProcess(ServerProcess):
    """`magnetar standalone` in a subprocess, its output in a log file next to its data."""

    name = "the broker"

    def __init__(self, directory: str, profile_path: str | None = None,
                 event_loop: str | None = None, root: str = REPO_ROOT):
        super().__init__(directory, "broker.log")
        self.profile_path = profile_path
        self.event_loop = event_loop
        self.root = root  # the checkout whose broker runs (bench_ab.py: another commit's)

    def start(self) -> None:
        """Start the broker and wait until it accepts connections (raises as `_launch`)."""
        profiler = ([] if self.profile_path is None
                    else ["-m", "cProfile", "-o", os.path.abspath(self.profile_path)])
        command = [sys.executable, *profiler, "-m", "magnetar.broker.cli", "standalone",
                   "--data-dir", os.path.join(self.directory, self.data_name), "--host", HOST,
                   "--port", str(self.port), "--http-port", "0"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # As deployed, a restart finds its modules compiled (pip install, or any earlier start
        # caches them): without this, PYTHONDONTWRITEBYTECODE would charge each start 0.15-0.3 s.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if self.event_loop is not None:
            env["MAGNETAR_EVENT_LOOP"] = self.event_loop
        self._launch(command, cwd=self.root, env=env)

    def wait_ready(self) -> None:
        """Wait until the broker has logged that it is ready. The binary port opens before
        the admin HTTP server's imports and the start's last steps, which hold the GIL for
        some 0.15 s: a workload timed from the port's opening measures those too.

        Raises:
            RuntimeError: no ready line within `STARTUP_DEADLINE_S`.
        """
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:
            with open(self.log_path, "rb") as log:
                if READY_LOG_LINE in log.read():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not log that it was ready within "
                                   f"{STARTUP_DEADLINE_S} s; see {self.log_path}")
            time.sleep(0.02)


@contextlib.contextmanager
def _running_broker(scratch: str, options: BenchOptions) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tempfile.mkdtemp(prefix="broker-", dir=scratch),
                           options.profile_path, options.event_loop)
    broker.start()
    try:
        broker.wait_ready()
        yield broker
    finally:
        broker.stop()
        broker.discard_data()


# -- one cell -------------------------------------------------------------------------------

def _producer(client: pulsar.Client, topic: str, batching: bool) -> pulsar.Producer:
    return client.create_producer(topic, batching_enabled=batching, block_if_queue_full=True,
                                  max_pending_messages=PUBLISH_IN_FLIGHT)


def _publish_phase(client: pulsar.Client, topic: str, cell: Cell, seconds: float) -> None:
    """Send as fast as the in-flight bound allows for `seconds`; receipts counted."""
    producer = _producer(client, topic, cell.batching)
    payload = os.urandom(cell.message_bytes)
    receipts = BoundedReceipts(pulsar.Result.Ok, PUBLISH_IN_FLIGHT)
    sent = 0
    started = time.perf_counter()
    stop_at = started + seconds
    while time.perf_counter() < stop_at:
        receipts.slots.acquire()
        producer.send_async(payload, receipts.callback)
        sent += 1
    producer.flush()
    receipts.wait_all(sent, DRAIN_DEADLINE_S)
    producer.close()
    cell.published = receipts.done
    cell.publish_seconds = receipts.last_s - started
    cell.publish_per_s = cell.published / cell.publish_seconds
    cell.publish_mb_per_s = cell.publish_per_s * cell.message_bytes / MB


class _LatencySink:
    """A message listener: the latency of each message, acknowledged as it arrives."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []

    def listener(self, consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        received_ns = time.time_ns()
        sent_ns = int(message.properties()[SEND_TIME_PROPERTY])
        with self.lock:
            self.latencies.append((received_ns - sent_ns) / 1e9)
        consumer.acknowledge(message)

    def count(self) -> int:
        with self.lock:
            return len(self.latencies)


def _latency_phase(client: pulsar.Client, topic: str, cell: Cell, seconds: float) -> None:
    """Send at a steady rate while a listener measures send-to-receive times."""
    rate = min(LATENCY_RATE_MAX_PER_S, cell.publish_per_s * LATENCY_RATE_FRACTION)
    sink = _LatencySink()
    consumer = client.subscribe(topic, "latency", consumer_type=pulsar.ConsumerType.Exclusive,
                                message_listener=sink.listener)
    producer = _producer(client, topic, cell.batching)
    payload = os.urandom(cell.message_bytes)
    receipts = BoundedReceipts(pulsar.Result.Ok, PUBLISH_IN_FLIGHT)
    sent = 0
    started = time.perf_counter()
    while (now := time.perf_counter()) < started + seconds:
        due = int((now - started) * rate) + 1
        while sent < due:
            receipts.slots.acquire()
            producer.send_async(payload, receipts.callback,
                                properties={SEND_TIME_PROPERTY: str(time.time_ns())})
            sent += 1
        time.sleep(PACE_TICK_S)
    producer.flush()
    receipts.wait_all(sent, DRAIN_DEADLINE_S)
    deadline = time.monotonic() + DRAIN_DEADLINE_S
    while sink.count() < sent:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {sink.count()} of {sent} messages were received")
        time.sleep(0.005)
    producer.close()
    consumer.close()
    cell.latency_rate_per_s = sent / seconds
    cell.latency_messages = sent
    cell.latency_p50_ms = _percentile_ms(sink.latencies, 50)
    cell.latency_p99_ms = _percentile_ms(sink.latencies, 99)
    cell.latency_max_ms = max(sink.latencies) * 1000


def _consume_phase(client: pulsar.Client, topic: str, cell: Cell, limit: int) -> None:
    """Drain up to `limit` messages of the backlog the publish phase left: receive + ack."""
    wanted = min(limit, cell.published)
    started = time.perf_counter()
    consumer = client.subscribe(topic, "backlog", consumer_type=pulsar.ConsumerType.Exclusive)
    for _ in range(wanted):
        message = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
        consumer.acknowledge(message)
    cell.consume_seconds = time.perf_counter() - started
    consumer.close()
    cell.consumed = wanted
    cell.consume_per_s = wanted / cell.consume_seconds
    cell.consume_mb_per_s = cell.consume_per_s * cell.message_bytes / MB


def _run_cell(url: str, scale: E2EScale, message_bytes: int, batching: bool) -> Cell:
    """The three phases of one cell, each on a topic of its own (the consume phase drains the
    publish topic's backlog)."""
    cell = Cell(message_bytes, batching)
    client = pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    name = f"persistent://public/default/e2e-{message_bytes}-{'batch' if batching else 'single'}"
    try:
        # The backlog subscription exists before the publish phase, so it keeps the messages.
        client.subscribe(name, "backlog", consumer_type=pulsar.ConsumerType.Exclusive,
                         initial_position=pulsar.InitialPosition.Earliest).close()
        _publish_phase(client, name, cell, scale.publish_seconds)
        _latency_phase(client, name + "-latency", cell, scale.latency_seconds)
        _consume_phase(client, name, cell, scale.consume_messages)
    finally:
        client.close()
    return cell


# -- the run --------------------------------------------------------------------------------

def run_e2e_benchmark(options: BenchOptions) -> dict[str, Any]:
    """Run the limits and every cell, print the table, write the JSON and the PNG; return
    the JSON document.

    Raises:
        OSError: the disk failed.
        RuntimeError: the broker did not start, or sends or receives did not complete.
    """
    scale = options.chosen_scale()
    os.makedirs(options.directory, exist_ok=True)
    results = _E2EResults()
    load_before = os.getloadavg()
    cells = ([] if options.side_by_side_only or options.only_many_topics
             else [(size, batching) for size in MESSAGE_SIZES for batching in BATCHING])
    with (_quiet_storage_log(), _scratch_dir(options.directory) as scratch,
          tqdm(total=len(cells) + 2 * options.rounds + 3, disable=not options.progress,
               file=sys.stderr, unit="step") as bar):
        bar.set_description("disk limits")
        _run_limits(scale.storage, scratch, results.storage, "start")
        bar.update()
        if not options.only_many_topics:
            _run_single_topic(scratch, options, scale, cells, results, bar)
        if scale.many_topics:
            bar.set_description(f"many topics ({scale.many_topics:,})")
            unprofiled = dataclasses.replace(options, profile_path=None)
            results.many_topics = run_many_topics(
                lambda: _running_broker(scratch, unprofiled), scale.many_topics,
                scale.publish_seconds,
                lambda step: bar.set_postfix(topics=step.topics, per_s=f"{step.step_per_s:.0f}",
                                             rss_mb=f"{step.rss_mb:.0f}"))
        bar.update()
        bar.set_description("disk limits again")
        _run_limits(scale.storage, scratch, results.storage, "end")
        bar.update()
    document = _document(options, scale, results, load_before)
    print(render_table(document))
    if options.json_path:
        with open(options.json_path, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
            out.write("\n")
    if options.plot_path:
        write_plot(document, options.plot_path)
    return document


def _run_single_topic(scratch: str, options: BenchOptions, scale: E2EScale,
                      cells: list[tuple[int, bool]], results: _E2EResults, bar: Any) -> None:
    """The cells (on one broker), then the side-by-side rounds: in each, the workloads
    against a fresh Magnetar, then against a fresh pulsar-lite."""
    if cells:
        with _running_broker(scratch, options) as broker:
            for size, batching in cells:
                bar.set_description(f"{size} B {_batching_name(batching)}")
                results.cells.append(_run_cell(broker.url, scale, size, batching))
                bar.update()
    for number in range(1, options.rounds + 1):
        of = f" (round {number} of {options.rounds})" if options.rounds > 1 else ""
        bar.set_description(f"side by side: Magnetar{of}")
        with _running_broker(scratch, options) as broker:
            ours = run_workloads("magnetar", broker.url, broker.pid, scale.publish_seconds,
                                 scale.consume_messages, options.workloads, options.receipts)
        bar.update()
        bar.set_description(f"side by side: pulsar-lite{of}")
        with running_pulsar_lite(scratch) as peer:
            theirs = run_workloads("pulsar-lite", peer.url, peer.pid, scale.publish_seconds,
                                   scale.consume_messages, options.workloads,
                                   options.receipts)
        bar.update()
        results.side_by_side_rounds.append(ours + theirs)


@contextlib.contextmanager
def _scratch_dir(parent: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="magnetar-bench-e2e-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _document(options: BenchOptions, scale: E2EScale, results: _E2EResults,
              load_before: tuple[float, float, float]) -> dict[str, Any]:
    limits = _best_limits(results.storage.limit_samples, scale.storage)
    for cell in results.cells:
        cell.publish_vs_fsync = cell.publish_per_s / limits.fsync_append_per_s
        cell.publish_vs_bandwidth = cell.publish_mb_per_s / limits.sequential_mb_per_s
        cell.consume_vs_bandwidth = cell.consume_mb_per_s / limits.sequential_mb_per_s
    rounds = results.side_by_side_rounds
    return {
        "benchmark": "e2e",
        "parameters": {
            "directory": os.path.abspath(options.directory),
            "scale": dataclasses.asdict(scale),
            "message_sizes": list(MESSAGE_SIZES),
            "publish_in_flight": PUBLISH_IN_FLIGHT,
            "side_by_side_receipts": options.receipts,
            "side_by_side_rounds": options.rounds,
            "latency_rate_fraction": LATENCY_RATE_FRACTION,
            "latency_rate_max_per_s": LATENCY_RATE_MAX_PER_S,
            "client": f"pulsar-client {_client_version()}",
            "batching_on": "client defaults: batching_max_messages=1000, "
                           "batching_max_allowed_size_in_bytes=131072, "
                           "batching_max_publish_delay_ms=10",
            "mb_bytes": MB,
        },
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "machine": {"nproc": os.cpu_count(), "platform": platform.platform(),
                    "load_before": list(load_before), "load_after": list(os.getloadavg())},
        "limits": dataclasses.asdict(limits),
        "cells": [dataclasses.asdict(c) for c in results.cells],
        # Each broker's median round of each workload (`median_rounds`).
        "side_by_side": ([dataclasses.asdict(w) for w in median_rounds(rounds)]
                         if rounds else []),
        "side_by_side_rounds": [[dataclasses.asdict(w) for w in workloads]
                                for workloads in rounds],
        "many_topics": (None if results.many_topics is None
                        else dataclasses.asdict(results.many_topics)),
    }


def _client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pulsar-client")
    except PackageNotFoundError:
        return "unknown"


def _batching_name(batching: bool) -> str:
    return "batching on" if batching else "batching off"


def _cell_name(cell: dict[str, Any]) -> str:
    size = cell["message_bytes"]
    return f"{size // 1024} KB" if size % 1024 == 0 else f"{size} B"


def render_table(document: dict[str, Any]) -> str:
    """The human-readable report of a benchmark document."""
    machine = document["machine"]
    header = (f"End-to-end benchmark ({document['parameters']['scale']['name']} run), "
              f"{document['parameters']['client']}, one producer and one consumer, durable\n"
              f"{machine['nproc']} CPUs, Python {document['python']}, commit "
              f"{(document['git_commit'] or 'unknown')[:12]}, load average before "
              f"{' '.join(f'{x:.2f}' for x in machine['load_before'])}, after "
              f"{' '.join(f'{x:.2f}' for x in machine['load_after'])}; MB = 2^20 bytes")
    rows = [[_cell_name(c), "on" if c["batching"] else "off", f"{c['publish_per_s']:,.0f}",
             f"{c['publish_mb_per_s']:,.2f}", f"{c['publish_vs_fsync']:.2f}",
             f"{c['publish_vs_bandwidth']:.3f}", f"{c['latency_rate_per_s']:,.0f}",
             f"{c['latency_p50_ms']:.2f}", f"{c['latency_p99_ms']:.2f}",
             f"{c['consume_per_s']:,.0f}", f"{c['consume_mb_per_s']:,.2f}"]
            for c in document["cells"]]
    headers = ["message", "batching", "publish msg/s", "MB/s", "x fsync", "x bandwidth",
               "latency at msg/s", "p50 ms", "p99 ms", "consume msg/s", "MB/s"]
    parts = [header, _render_limits(document)]
    if document["cells"]:
        parts.append("Official client through the broker\n" + _table(headers, rows, "llrrrrrrrrr"))
    if document["side_by_side"]:
        parts.append(render_side_by_side(document, _table))
        if len(document.get("side_by_side_rounds", [])) > 1:
            parts.append(render_rounds(document))
    if document["many_topics"] is not None:
        parts.append(render_many_topics(document, _table))
    return "\n\n".join(parts)


# -- the chart ------------------------------------------------------------------------------

def write_plot(document: dict[str, Any], path: str) -> None:
    """A PNG: publish and consume messages/s per cell against the raw fsync rate, and the
    end-to-end latency p50 and p99 per cell."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = ((2 if document["cells"] else 0) + bool(document["side_by_side"])
              + (document["many_topics"] is not None))
    figure = Figure(figsize=(6.3 * max(panels, 1), 5.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(1, max(panels, 1), squeeze=False)[0])
    if document["many_topics"] is not None:
        plot_many_topics(axes.pop(), document)
    if document["side_by_side"]:
        plot_side_by_side(axes.pop(), document)
    if document["cells"]:
        _plot_cells(axes, document)
    figure.suptitle(f"Magnetar end to end, official Python client "
                    f"({document['parameters']['scale']['name']} run, "
                    f"{document['machine']['nproc']} CPUs)")
    figure.tight_layout()
    figure.savefig(path, format="png")


def _plot_cells(axes: list[Any], document: dict[str, Any]) -> None:
    rates, latency = axes
    cells = document["cells"]
    labels = [f"{_cell_name(c)}\n{_batching_name(c['batching'])}" for c in cells]
    _bars(rates, labels, [("publish", [c["publish_per_s"] for c in cells]),
                          ("consume", [c["consume_per_s"] for c in cells])])
    rates.axhline(document["limits"]["fsync_append_per_s"], color="black", linestyle="--",
                  label="raw fsync/s (growing file)")
    rates.set_yscale("log")
    rates.set_ylabel("messages/s (log)")
    rates.set_title("Durable publish and consume rates")
    rates.legend(fontsize="small")
    _bars(latency, labels, [("p50", [c["latency_p50_ms"] for c in cells]),
                            ("p99", [c["latency_p99_ms"] for c in cells])])
    latency.set_ylabel("send to receive, ms")
    latency.set_title("End-to-end latency at a steady rate")
    latency.legend(fontsize="small")


def _bars(axes: Any, labels: list[str], series: list[tuple[str, list[float]]]) -> None:
    width = 0.8 / len(series)
    for slot, (name, values) in enumerate(series):
        offset = (slot - (len(series) - 1) / 2) * width
        axes.bar([i + offset for i in range(len(values))], values, width, label=name)
    axes.set_xticks(range(len(labels)), labels, fontsize="small")


# -- command line ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure the official Pulsar client against `magnetar standalone` (1 KB "
        "and 100 B messages, batching off and on, durable): publish rate, end-to-end latency "
        "and consume rate, against the disk's fsync rate and bandwidth measured in the same "
        "run, in a temporary directory under --dir.")
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes: "
                        "10,000 topics; the full run creates 100,000)")
    parser.add_argument("--many-topics", type=int, default=None, metavar="N",
                        help="topics to create in the many-topics workload (0: leave it out)")
    parser.add_argument("--only-many-topics", action="store_true",
                        help="the disk limits and the many-topics workloads alone")
    parser.add_argument("--dir", default=".", help="run on the disk holding this directory")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    parser.add_argument("--plot", default=None, help="write a PNG chart here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--side-by-side-only", action="store_true",
                        help="only the side-by-side workloads (no per-size cells)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated side-by-side workloads (default: all of "
                        f"{', '.join(WORKLOADS)})")
    parser.add_argument("--profile", default=None,
                        help="run the broker under cProfile and write its stats here (with "
                             "--rounds, the last round's broker)")
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default=None,
                        help="the broker's event loop (default: its own default)")
    parser.add_argument("--receipts", choices=RECEIPTS, default=RECEIPTS[0],
                        help="how the side-by-side publish workloads learn of receipts: "
                             "flush (no callbacks; flush() waits for the last one) or "
                             "callback (a Python callback per send, which costs the official "
                             "client about 30 us per message); default flush")
    parser.add_argument("--rounds", type=int, default=1, metavar="N",
                        help="side-by-side rounds: in each, the workloads against a fresh "
                             "Magnetar, then a fresh pulsar-lite; the table shows each "
                             "broker's median round, and every round is listed (a shared "
                             "machine's speed drifts by tens of percent between minutes, so "
                             "one round's ratio can be off by as much; default 1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.many_topics is not None and args.many_topics < 0:
        parser.error(f"--many-topics: {args.many_topics} is negative")
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} is below 1")
    workloads = tuple(name.strip() for name in args.workloads.split(",") if name.strip())
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)}; expected some of "
                     f"{', '.join(WORKLOADS)}")
    run_e2e_benchmark(BenchOptions(directory=args.dir, quick=args.quick, json_path=args.json,
                                   plot_path=args.plot, progress=not args.no_progress,
                                   side_by_side_only=args.side_by_side_only,
                                   workloads=workloads, profile_path=args.profile,
                                   event_loop=args.event_loop, many_topics=args.many_topics,
                                   only_many_topics=args.only_many_topics,
                                   receipts=args.receipts, rounds=args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
