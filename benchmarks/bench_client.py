"""Client benchmark: `magnetar`'s own client, embedded and over TCP, against the official
`pulsar-client` over TCP and persist-queue's SQLite queues, durable, on one disk.

What is measured
----------------
Every system keeps its data in a temporary directory under `--dir` (the disk being measured),
removed at the end. 1 KB messages; every acknowledgment is durable (fsynced): the broker
receipts a SEND once its entry is journaled; persist-queue runs with `auto_commit=True` (one
SQLite transaction per put/get/ack, WAL with SQLite's default `synchronous=FULL`, recorded in
the JSON as read from the queue's connection).

Systems: `embedded` (`magnetar.Client(data_dir)`: the broker in this process), `tcp`
(`magnetar.Client("pulsar://...")`) and `official` (`pulsar.Client`), both against one
`magnetar standalone` subprocess on a free loopback port (`bench_e2e.BrokerProcess`);
`sqlite-ack` (`SQLiteAckQueue`) and `sqlite` (`SQLiteQueue`).

For each client system, each cell -- workload x in flight (1: `send` and wait; 256:
`send_async` with at most 256 unreceipted, the producer's own bound: `max_pending_messages=256`
with `block_if_queue_full`, as an application would bound them) x batching (off; on with the
client defaults) -- runs on a fresh topic for a fixed time:

* **publish**: messages receipted per second.
* **publish+consume+ack**: a producer thread publishes for the fixed time while an Exclusive
  consumer (subscribed first) receives and acknowledges every message; messages received and
  acknowledged per second, from the start to the last receive.

Each cell also records this process's CPU time per message (`cpu_us_per_msg`: for `embedded`
the broker's too; for `tcp` and `official` the client's alone, the broker being another
process), and the report compares our client's with the official one's cell by cell: on a
loaded machine the rates swing with the load, the CPU a message costs much less.

persist-queue's API is synchronous (one put at a time, no batching): its cells run with one
in flight; in publish+consume+ack a thread puts while the main thread gets (and acks).

Disk limit: 1 KB write + fdatasync (`storage.testing.benchmark`'s measurement), sampled at the
start and the end. Targets (issue 12): embedded publish with 256 in flight >= 5x the better
persist-queue; embedded publish+consume+ack with batching >= 100,000 msg/s; our client over TCP
>= 0.8x the official client in each cell.

    python benchmarks/bench_client.py --quick --json client.json --plot client.png
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # send_receipts beside it

import pulsar  # type: ignore[import-untyped]
from persistqueue import SQLiteAckQueue, SQLiteQueue  # type: ignore[import-untyped]
from send_receipts import ReceiptCount
from tqdm import tqdm

import magnetar
from magnetar.storage.testing._bench_measure import _best_limits, _run_limits
from magnetar.storage.testing._bench_model import _Results
from magnetar.storage.testing._bench_report import _git_commit, _render_limits, _table
from magnetar.storage.testing.benchmark import (
    FULL_SCALE,
    QUICK_SCALE,
    TINY_SCALE,
    BenchScale,
    _quiet_storage_log,
)

MB = 1024 * 1024
MESSAGE_BYTES = 1024
IN_FLIGHT = (1, 256)
BATCHING = (False, True)
WORKLOADS = ("publish", "publish+consume+ack")
CLIENT_SYSTEMS = ("embedded", "tcp", "official")
QUEUE_SYSTEMS = ("sqlite-ack", "sqlite")
RECEIVE_TIMEOUT_MS = 10_000
DRAIN_DEADLINE_S = 60.0
TARGET_VS_PERSIST_QUEUE = 5.0
TARGET_EMBEDDED_CONSUME_PER_S = 100_000.0
TARGET_TCP_VS_OFFICIAL = 0.8


def _sibling(name: str) -> ModuleType:
    """Another benchmark module of this folder (it is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class ClientScale:
    name: str
    storage: BenchScale  # the disk-limit samples
    cell_seconds: float  # how long each cell publishes

    def __post_init__(self) -> None:
        assert self.cell_seconds > 0


FULL = ClientScale("full", FULL_SCALE, 5.0)
QUICK = ClientScale("quick", QUICK_SCALE, 1.5)
TINY = ClientScale("tiny", TINY_SCALE, 0.15)  # for the smoke test


@dataclass
class BenchOptions:
    directory: str = "."
    quick: bool = False
    json_path: str | None = None
    plot_path: str | None = None
    progress: bool = True
    scale: ClientScale | None = None  # overrides `quick` (the test uses TINY)
    systems: tuple[str, ...] = CLIENT_SYSTEMS + QUEUE_SYSTEMS
    # Subsets of the client systems' cells (`--workloads`, `--in-flight`, `--batching`).
    workloads: tuple[str, ...] = WORKLOADS
    in_flight: tuple[int, ...] = IN_FLIGHT
    batching: tuple[bool, ...] = BATCHING

    def chosen_scale(self) -> ClientScale:
        if self.scale is not None:
            return self.scale
        return QUICK if self.quick else FULL


@dataclass
class Cell:
    system: str
    workload: str
    in_flight: int
    batching: bool | None  # None: the system has no batching
    messages: int = 0
    seconds: float = 0.0
    per_s: float = 0.0
    mb_per_s: float = 0.0
    vs_fsync: float = 0.0
    # CPU time of this process per message (all its threads: for `embedded` the broker too,
    # for `tcp` and `official` the client alone). Less sensitive to a loaded machine than the
    # rate: compare our client with the official one by it when the rates are noisy.
    cpu_us_per_msg: float = 0.0


# -- the clients (ours and the official one have the same shape) ----------------------------

def _publish(client: Any, ok: object, topic: str, in_flight: int, batching: bool,
             seconds: float) -> tuple[int, float, float]:
    """Publish for `seconds`; (messages receipted, start, last receipt) in perf_counter s."""
    producer = client.create_producer(topic, batching_enabled=batching,
                                      block_if_queue_full=True,
                                      max_pending_messages=in_flight if in_flight > 1 else 1000)
    payload = os.urandom(MESSAGE_BYTES)
    started = time.perf_counter()
    stop_at = started + seconds
    try:
        if in_flight == 1:
            count = 0
            while time.perf_counter() < stop_at:
                producer.send(payload)
                count += 1
            return count, started, time.perf_counter()
        receipts = _Receipts(ok)
        callback = receipts.callback  # one bound method: not one made (and held) per send
        sent = 0
        while time.perf_counter() < stop_at:  # send_async blocks while 256 are unreceipted
            producer.send_async(payload, callback)
            sent += 1
        producer.flush()
        receipts.wait_all(sent, DRAIN_DEADLINE_S)
        return receipts.done, started, receipts.last_s
    finally:
        producer.close()


class _Receipts(ReceiptCount):
    """The receipts of one producer's `send_async`s, counted by its callback. The producer's
    own queue bounds the sends in flight (see `_publish`): a semaphore taken per send and
    released by each callback (`BoundedReceipts`) cost 13 Python calls per message in the
    client's own threads and woke the publishing thread once per receipt."""

    def callback(self, result: Any, _message_id: Any) -> None:
        self.count(result)


def _client_cell(client: Any, ok: object, exclusive: object, cell: Cell, topic: str,
                 seconds: float) -> None:
    cpu_s = time.process_time()
    try:
        _client_cell_run(client, ok, exclusive, cell, topic, seconds)
    finally:
        _record_cpu(cell, time.process_time() - cpu_s)


def _record_cpu(cell: Cell, cpu_s: float) -> None:
    cell.cpu_us_per_msg = cpu_s * 1e6 / cell.messages if cell.messages else 0.0


def _client_cell_run(client: Any, ok: object, exclusive: object, cell: Cell, topic: str,
                     seconds: float) -> None:
    assert cell.batching is not None
    if cell.workload == "publish":
        count, started, ended = _publish(client, ok, topic, cell.in_flight, cell.batching,
                                         seconds)
        _record(cell, count, ended - started)
        return
    consumer = client.subscribe(topic, "bench", consumer_type=exclusive)
    outcome: list[tuple[int, float, float]] = []
    errors: list[BaseException] = []
    finished: list[bool] = []  # set when the producer thread is done (no call per message)

    def produce() -> None:
        try:
            outcome.append(_publish(client, ok, topic, cell.in_flight, bool(cell.batching),
                                    seconds))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            finished.append(True)

    producer = threading.Thread(target=produce, name="bench-producer")
    started = time.perf_counter()
    producer.start()
    received = 0
    last = started
    try:
        while not finished or (outcome and received < outcome[0][0]):
            try:
                message = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS if finished
                                           else 100)
            except (magnetar.Timeout, pulsar.Timeout):
                continue
            consumer.acknowledge(message)
            received += 1
            last = time.perf_counter()
    finally:
        producer.join()
        consumer.close()
    if errors:
        raise RuntimeError(f"{cell.system}: the producer failed: {errors[0]}")
    _record(cell, received, last - started)


def _record(cell: Cell, messages: int, seconds: float) -> None:
    cell.messages = messages
    cell.seconds = seconds
    cell.per_s = messages / seconds if seconds > 0 else 0.0
    cell.mb_per_s = cell.per_s * MESSAGE_BYTES / MB


@contextlib.contextmanager
def _client(system: str, scratch: str, broker_url: str | None) -> Iterator[tuple[Any, Any,
                                                                                 Any]]:
    """(client, its Result.Ok, its Exclusive consumer type) for one client system."""
    if system == "official":
        client = pulsar.Client(broker_url, operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        ok, exclusive = pulsar.Result.Ok, pulsar.ConsumerType.Exclusive
    else:
        target = broker_url if system == "tcp" else os.path.join(scratch, "embedded-data")
        client = magnetar.Client(target)
        ok, exclusive = magnetar.Result.Ok, magnetar.ConsumerType.Exclusive
    try:
        yield client, ok, exclusive
    finally:
        client.close()


def _run_client_system(system: str, options: BenchOptions, scratch: str,
                       broker_url: str | None, step: Callable[[str], None]) -> list[Cell]:
    scale = options.chosen_scale()
    cells = []
    with _client(system, scratch, broker_url) as (client, ok, exclusive):
        for workload in options.workloads:
            for in_flight in options.in_flight:
                for batching in options.batching:
                    step(f"{system} {workload} {in_flight} {'batch' if batching else 'single'}")
                    cell = Cell(system, workload, in_flight, batching)
                    topic = (f"persistent://public/default/bench-{system}-{len(cells)}-"
                             f"{os.getpid()}-{time.monotonic_ns()}")
                    _client_cell(client, ok, exclusive, cell, topic, scale.cell_seconds)
                    cells.append(cell)
    return cells


# -- persist-queue --------------------------------------------------------------------------

def _queue(system: str, path: str) -> Any:
    kind = SQLiteAckQueue if system == "sqlite-ack" else SQLiteQueue
    return kind(path, auto_commit=True, multithreading=True)


def _synchronous_setting(queue: Any) -> int:
    """SQLite's `synchronous` pragma on the queue's connection (2 = FULL)."""
    return int(queue._getter.execute("PRAGMA synchronous").fetchone()[0])


def _queue_cell(system: str, workload: str, path: str, seconds: float) -> tuple[Cell, int]:
    cpu_s = time.process_time()
    cell, synchronous = _queue_cell_run(system, workload, path, seconds)
    _record_cpu(cell, time.process_time() - cpu_s)
    return cell, synchronous


def _queue_cell_run(system: str, workload: str, path: str, seconds: float,
                    ) -> tuple[Cell, int]:
    cell = Cell(system, workload, 1, None)
    queue = _queue(system, path)
    synchronous = _synchronous_setting(queue)
    payload = os.urandom(MESSAGE_BYTES)
    if workload == "publish":
        started = time.perf_counter()
        count = 0
        while time.perf_counter() < started + seconds:
            queue.put(payload)
            count += 1
        _record(cell, count, time.perf_counter() - started)
        return cell, synchronous
    put: list[int] = []

    def produce() -> None:
        began = time.perf_counter()
        count = 0
        while time.perf_counter() < began + seconds:
            queue.put(payload)
            count += 1
        put.append(count)

    producer = threading.Thread(target=produce, name="bench-queue-producer")
    started = time.perf_counter()
    producer.start()
    received = 0
    while producer.is_alive() or (put and received < put[0]):
        if system == "sqlite-ack":
            item = queue.get(block=True, timeout=0.1 if producer.is_alive() else 10, raw=True)
            queue.ack(id=item["pqid"])
        else:
            queue.get(block=True, timeout=0.1 if producer.is_alive() else 10)
        received += 1
    producer.join()
    _record(cell, received, time.perf_counter() - started)
    return cell, synchronous


def _run_queue_system(system: str, options: BenchOptions, scratch: str,
                      step: Callable[[str], None]) -> tuple[list[Cell], int]:
    scale = options.chosen_scale()
    cells = []
    synchronous = -1
    for workload in options.workloads:
        step(f"{system} {workload}")
        path = tempfile.mkdtemp(prefix=f"{system}-", dir=scratch)
        cell, synchronous = _queue_cell(system, workload, path, scale.cell_seconds)
        cells.append(cell)
    return cells, synchronous


# -- the run --------------------------------------------------------------------------------

@dataclass
class _Run:
    storage: _Results = field(default_factory=_Results)
    cells: list[Cell] = field(default_factory=list)
    sqlite_synchronous: int = -1


def run_client_benchmark(options: BenchOptions) -> dict[str, Any]:
    """Run the limits and every cell, print the table, write the JSON and the PNG; return
    the JSON document.

    Raises:
        OSError: the disk failed. RuntimeError: a broker did not start, or sends or receives
            did not complete.
    """
    scale = options.chosen_scale()
    os.makedirs(options.directory, exist_ok=True)
    run = _Run()
    load_before = os.getloadavg()
    steps = 2 + sum(len(options.workloads) * (len(options.in_flight) * len(options.batching)
                                              if s in CLIENT_SYSTEMS else 1)
                    for s in options.systems)
    with (_quiet_storage_log(), _scratch_dir(options.directory) as scratch,
          tqdm(total=steps, disable=not options.progress, file=sys.stderr, unit="cell") as bar):
        def step(name: str) -> None:
            bar.set_description(name)
            bar.update()

        step("disk limits")
        _run_limits(scale.storage, scratch, run.storage, "start")
        if "embedded" in options.systems:
            run.cells += _run_client_system("embedded", options, scratch, None, step)
        tcp_systems = [s for s in ("tcp", "official") if s in options.systems]
        if tcp_systems:
            broker_dir = tempfile.mkdtemp(prefix="broker-", dir=scratch)
            broker = _sibling("bench_e2e").BrokerProcess(broker_dir)
            broker.start()
            try:
                for system in tcp_systems:
                    run.cells += _run_client_system(system, options, scratch, broker.url, step)
            finally:
                broker.stop()
        for system in QUEUE_SYSTEMS:
            if system in options.systems:
                cells, run.sqlite_synchronous = _run_queue_system(system, options, scratch, step)
                run.cells += cells
        step("disk limits again")
        _run_limits(scale.storage, scratch, run.storage, "end")
    document = _document(options, scale, run, load_before)
    print(render_table(document))
    if options.json_path:
        with open(options.json_path, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
            out.write("\n")
    if options.plot_path:
        write_plot(document, options.plot_path)
    return document


@contextlib.contextmanager
def _scratch_dir(parent: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="magnetar-bench-client-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _document(options: BenchOptions, scale: ClientScale, run: _Run,
              load_before: tuple[float, float, float]) -> dict[str, Any]:
    limits = _best_limits(run.storage.limit_samples, scale.storage)
    for cell in run.cells:
        cell.vs_fsync = cell.per_s / limits.fsync_append_per_s
    cells = [dataclasses.asdict(c) for c in run.cells]
    return {
        "benchmark": "client",
        "parameters": {
            "directory": os.path.abspath(options.directory),
            "scale": dataclasses.asdict(scale),
            "message_bytes": MESSAGE_BYTES,
            "in_flight": list(options.in_flight),
            "workloads": list(options.workloads),
            "systems": list(options.systems),
            "official_client": f"pulsar-client {_version('pulsar-client')}",
            "persist_queue": f"persist-queue {_version('persist-queue')}, auto_commit=True, "
                             f"multithreading=True, sqlite synchronous="
                             f"{run.sqlite_synchronous}",
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
        "cells": cells,
        "targets": _targets(cells),
        "client_cpu": _client_cpu(cells),
    }


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def _find(cells: list[dict[str, Any]], system: str, workload: str, in_flight: int,
          batching: bool | None) -> dict[str, Any] | None:
    for cell in cells:
        if (cell["system"], cell["workload"], cell["in_flight"], cell["batching"]) == \
                (system, workload, in_flight, batching):
            return cell
    return None


def _targets(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 12's targets, each with the measured ratio or rate and whether it is met."""
    targets = []
    queues = [c["per_s"] for c in cells if c["system"] in QUEUE_SYSTEMS
              and c["workload"] == "publish"]
    for batching in BATCHING:
        ours = _find(cells, "embedded", "publish", 256, batching)
        if ours is not None and queues:
            value = ours["per_s"] / max(queues)
            targets.append({"target": f"embedded publish, 256 in flight, batching "
                                      f"{_onoff(batching)} / best persist-queue publish",
                            "value": value, "goal": TARGET_VS_PERSIST_QUEUE,
                            "met": value >= TARGET_VS_PERSIST_QUEUE})
    ours = _find(cells, "embedded", "publish+consume+ack", 256, True)
    if ours is not None:
        targets.append({"target": "embedded publish+consume+ack msg/s, 256 in flight, "
                                  "batching on", "value": ours["per_s"],
                        "goal": TARGET_EMBEDDED_CONSUME_PER_S,
                        "met": ours["per_s"] >= TARGET_EMBEDDED_CONSUME_PER_S})
    for workload in WORKLOADS:
        for in_flight in IN_FLIGHT:
            for batching in BATCHING:
                tcp = _find(cells, "tcp", workload, in_flight, batching)
                official = _find(cells, "official", workload, in_flight, batching)
                if tcp is None or official is None or official["per_s"] <= 0:
                    continue
                value = tcp["per_s"] / official["per_s"]
                targets.append({"target": f"tcp / official, {workload}, {in_flight} in flight, "
                                          f"batching {_onoff(batching)}", "value": value,
                                "goal": TARGET_TCP_VS_OFFICIAL,
                                "met": value >= TARGET_TCP_VS_OFFICIAL})
    return targets


def _client_cpu(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell, the client process's CPU per message of the official client over ours
    (both over TCP to the same broker: above 1, ours costs less), a view of the TCP targets
    that a loaded machine disturbs less than the rates."""
    rows = []
    for workload in WORKLOADS:
        for in_flight in IN_FLIGHT:
            for batching in BATCHING:
                tcp = _find(cells, "tcp", workload, in_flight, batching)
                official = _find(cells, "official", workload, in_flight, batching)
                if tcp is None or official is None or not tcp["cpu_us_per_msg"]:
                    continue
                rows.append({"cell": f"{workload}, {in_flight} in flight, batching "
                                     f"{_onoff(batching)}",
                             "tcp_us": tcp["cpu_us_per_msg"],
                             "official_us": official["cpu_us_per_msg"],
                             "official_over_tcp": official["cpu_us_per_msg"] /
                             tcp["cpu_us_per_msg"]})
    return rows


def _onoff(batching: bool | None) -> str:
    return "-" if batching is None else "on" if batching else "off"


def render_table(document: dict[str, Any]) -> str:
    """The human-readable report of a benchmark document."""
    machine = document["machine"]
    parameters = document["parameters"]
    header = (f"Client benchmark ({parameters['scale']['name']} run), 1 KB messages, durable; "
              f"{parameters['official_client']}; {parameters['persist_queue']}\n"
              f"{machine['nproc']} CPUs, Python {document['python']}, commit "
              f"{(document['git_commit'] or 'unknown')[:12]}, load average before "
              f"{' '.join(f'{x:.2f}' for x in machine['load_before'])}, after "
              f"{' '.join(f'{x:.2f}' for x in machine['load_after'])}; MB = 2^20 bytes")
    rows = [[c["system"], c["workload"], str(c["in_flight"]), _onoff(c["batching"]),
             f"{c['messages']:,}", f"{c['per_s']:,.0f}", f"{c['mb_per_s']:,.2f}",
             f"{c['vs_fsync']:.2f}", f"{c.get('cpu_us_per_msg', 0.0):,.1f}"]
            for c in document["cells"]]
    cells = _table(["system", "workload", "in flight", "batching", "messages", "msg/s",
                    "MB/s", "x fsync", "CPU us/msg"], rows, "llrlrrrrr")
    targets = _table(["target", "value", "goal", "met"],
                     [[t["target"], f"{t['value']:,.3f}", f"{t['goal']:,.2f}",
                       "yes" if t["met"] else "NO"] for t in document["targets"]], "lrrl")
    parts = [header, _render_limits(document), "Cells\n" + cells, "Targets\n" + targets]
    if document.get("client_cpu"):
        parts.append("Client CPU per message (the client process, over TCP)\n" + _table(
            ["cell", "ours us", "official us", "official / ours"],
            [[r["cell"], f"{r['tcp_us']:,.1f}", f"{r['official_us']:,.1f}",
              f"{r['official_over_tcp']:.2f}"] for r in document["client_cpu"]], "lrrr"))
    return "\n\n".join(parts)


def write_plot(document: dict[str, Any], path: str) -> None:
    """A PNG: messages/s of every cell, one panel per workload, against the raw fsync rate."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 6), dpi=100)
    FigureCanvasAgg(figure)
    for axes, workload in zip(figure.subplots(1, len(WORKLOADS)), WORKLOADS, strict=True):
        cells = [c for c in document["cells"] if c["workload"] == workload]
        labels = [f"{c['system']}\n{c['in_flight']} / {_onoff(c['batching'])}" for c in cells]
        axes.bar(range(len(cells)), [max(c["per_s"], 1e-3) for c in cells],
                 color=[_COLOURS.get(c["system"], "grey") for c in cells])
        axes.axhline(document["limits"]["fsync_append_per_s"], color="black",
                     linestyle="--", label="raw write+fdatasync/s")
        axes.set_xticks(range(len(cells)), labels, fontsize="x-small", rotation=90)
        axes.set_yscale("log")
        axes.set_ylabel("messages/s (log)")
        axes.set_title(f"{workload} (in flight / batching)")
        axes.legend(fontsize="small")
    figure.suptitle(f"Magnetar client, 1 KB durable ({document['parameters']['scale']['name']}"
                    f" run, {document['machine']['nproc']} CPUs)")
    figure.tight_layout()
    figure.savefig(path, format="png")


_COLOURS = {"embedded": "tab:blue", "tcp": "tab:cyan", "official": "tab:orange",
            "sqlite-ack": "tab:green", "sqlite": "tab:olive"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure magnetar's client (embedded and TCP) against the official "
        "pulsar-client and persist-queue's SQLite queues: 1 KB durable messages, 1 and 256 in "
        "flight, batching off and on, publish and publish+consume+ack, against the disk's "
        "fsync rate, in a temporary directory under --dir.")
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    parser.add_argument("--dir", default=".", help="run on the disk holding this directory")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    parser.add_argument("--plot", default=None, help="write a PNG chart here")
    parser.add_argument("--systems", default=",".join(CLIENT_SYSTEMS + QUEUE_SYSTEMS),
                        help="comma-separated subset of the systems to run")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated subset of the workloads to run")
    parser.add_argument("--in-flight", default=",".join(map(str, IN_FLIGHT)),
                        help="comma-separated subset of the client systems' in-flight counts")
    parser.add_argument("--batching", default="off,on",
                        help="comma-separated subset of the client systems' batching (off, on)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _subset(text: str, allowed: dict[str, Any], what: str) -> tuple[Any, ...]:
    """The chosen values of a comma-separated option, in the order given.

    Raises:
        ValueError: a value not among `allowed` (the message names it and the option)."""
    chosen = [s for s in text.split(",") if s]
    unknown = [s for s in chosen if s not in allowed]
    if unknown or not chosen:
        raise ValueError(f"bench_client: {what} must be among {sorted(allowed)}, not {text!r}")
    return tuple(allowed[s] for s in chosen)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    systems = tuple(s for s in args.systems.split(",") if s)
    unknown = set(systems) - set(CLIENT_SYSTEMS + QUEUE_SYSTEMS)
    if unknown:
        print(f"bench_client: unknown system(s) {sorted(unknown)} in --systems", file=sys.stderr)
        return 2
    try:
        workloads = _subset(args.workloads, {w: w for w in WORKLOADS}, "--workloads")
        in_flight = _subset(args.in_flight, {str(n): n for n in IN_FLIGHT}, "--in-flight")
        batching = _subset(args.batching, {"off": False, "on": True}, "--batching")
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    run_client_benchmark(BenchOptions(directory=args.dir, quick=args.quick, json_path=args.json,
                                      plot_path=args.plot, progress=not args.no_progress,
                                      systems=systems, workloads=workloads,
                                      in_flight=in_flight, batching=batching))
    return 0


if __name__ == "__main__":
    sys.exit(main())
