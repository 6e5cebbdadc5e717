"""The side-by-side half of `bench_e2e.py`: the issue-14 workloads, run with the official client
against Magnetar and against the peer broker pulsar-lite in the same run, on the same disk.

Workloads (1 KB messages, one producer or one consumer, a fresh topic per broker):

* **batched publish**: `send_async`, client batching of up to 1000 messages or 1 ms,
  1000 messages pending, blocking when full. Receipts (`RECEIPTS`): by default ("flush") the
  sends pass no callback; `flush()` at the end waits for the last receipt and the producer's
  last receipted sequence id must be the last one sent, and messages/s is sends over the time
  to that. With "callback" each send has a Python callback that counts its receipt, as an
  application that handles each receipt would: that costs the official client some 30 us per
  message (each callback takes the GIL from the sending thread; measured against the do-nothing
  broker of `client_ceiling.py`), more than either broker spends, so that mode measures the
  client's callbacks more than the broker.
* **batched consume + ack**: `receive` + `acknowledge` of the backlog the batched publish left.
* **unbatched publish**: the same without client batching.
* **unbatched consume + ack**: the same on the unbatched backlog.
* **sync publish**: `send` (one message in flight), for the same time.
* **publish latency**: unbatched `send_async` at a steady `LATENCY_RATE_PER_S` (what is due is
  sent, then the sender sleeps `PACE_TICK_S`), for the same time; each message's latency is
  its receipt callback's time minus its send time; p50, p99 and max. Issue 14's target is a
  p99 of at most `LATENCY_P99_ALLOWANCE_MS` over the disk's fdatasync p99 (same run).

Each workload also records the CPU seconds it cost the broker's process (from
`/proc/<pid>/stat`) and this process, which runs the official client (`getrusage`, all its
threads), per message: with both on two cores, a client near one core per second of wall time
sets the rate whatever the broker does.

A workload that stops making progress (no receipt or no message within `STALL_S`) is recorded
as stalled with what it completed, rather than ending the run.

pulsar-lite is the binary the `pulsar-lite` wheel ships (`pulsar_lite/bin/pulsar-lite`), started
on a free loopback port with its data in a temporary directory and its metrics endpoint off (a
config file), stopped by PID.

The peer's receipts do not wait for the disk: pulsar-lite 0.2 stores in RocksDB and an entry
log opened without O_SYNC/O_DSYNC, and `strace -f -c` of it through 4 s of batched publish
(about 120,000 messages) counted no fsync, fdatasync or sync_file_range. Magnetar answers a
SEND only after the fdatasync that covers it, so in the publish workloads its receipts carry
a group commit's latency (about 2.4 ms at the median on a shared machine: waiting for the
fdatasync under way, the write, then its own fdatasync), and with 1000 pending a publisher's
rate is about 1000 / (its own round trip + that latency).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pulsar  # type: ignore[import-untyped]
from send_receipts import ReceiptCount

HOST = "127.0.0.1"
MESSAGE_BYTES = 1024
IN_FLIGHT = 1000  # pending sends, at most (the client blocks when full)
BATCH_MESSAGES = 1000
BATCH_DELAY_MS = 1
STALL_S = 10.0  # no receipt / no message for this long: the workload stalled
STARTUP_DEADLINE_S = 30.0
STOP_DEADLINE_S = 30.0
LATENCY_RATE_PER_S = 5000.0  # the publish-latency workload's steady send rate
PACE_TICK_S = 0.001  # its sender sends what is due, then sleeps this long
LATENCY_P99_ALLOWANCE_MS = 3.0  # the target: p99 <= this + the fdatasync p99
LATENCY = "publish latency"
RECEIPTS = ("flush", "callback")  # how the publish workloads learn of receipts (module comment)
WORKLOADS = ("batched publish", "batched consume + ack", "unbatched publish",
             "unbatched consume + ack", "sync publish", LATENCY)
BROKERS = ("magnetar", "pulsar-lite")


@dataclass
class Workload:
    broker: str
    name: str
    messages: int = 0
    seconds: float = 0.0
    per_s: float = 0.0
    stalled: bool = False
    p50_ms: float = 0.0  # the publish-latency workload only
    p99_ms: float = 0.0
    max_ms: float = 0.0
    broker_cpu_s: float = 0.0  # CPU the broker's process used during the workload
    client_cpu_s: float = 0.0  # CPU this process (the official client) used, all threads
    wall_s: float = 0.0  # the workload's wall time, set-up included, for the CPU figures

    def finish(self, messages: int, seconds: float, stalled: bool = False) -> None:
        self.messages = messages
        self.seconds = seconds
        self.per_s = messages / seconds if seconds > 0 else 0.0
        self.stalled = stalled

    def cpu_us_per_message(self) -> tuple[float, float]:
        """(broker, client) CPU microseconds per message; zeros when nothing completed."""
        if self.messages <= 0:
            return 0.0, 0.0
        return (self.broker_cpu_s / self.messages * 1e6,
                self.client_cpu_s / self.messages * 1e6)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def cpu_accounted(result: Workload, broker_pid: int) -> Iterator[None]:
    """Add the broker's and this process's CPU seconds, and the wall time, of the block to
    `result`."""
    broker_before, own_before, started = process_cpu_s(broker_pid), own_cpu_s(), time.perf_counter()
    try:
        yield
    finally:
        result.broker_cpu_s += process_cpu_s(broker_pid) - broker_before
        result.client_cpu_s += own_cpu_s() - own_before
        result.wall_s += time.perf_counter() - started


# -- pulsar-lite ----------------------------------------------------------------------------

def pulsar_lite_binary() -> str:
    """The broker binary the pulsar-lite wheel ships.

    Raises:
        RuntimeError: the package is not installed (it is in the `bench` extra).
    """
    spec = importlib.util.find_spec("pulsar_lite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pulsar-lite is not installed: pip install -e '.[bench]'")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "bin", "pulsar-lite")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"the pulsar-lite binary is missing or not executable: {path}")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


class ServerProcess:
    """A server in a subprocess on a free loopback port, its output in `log_name` in
    `directory`; `start` builds its command and calls `_launch`, `stop` ends it by PID."""

    name = "the server"
    data_name = "data"  # its data, under `directory` (`discard_data`)

    def __init__(self, directory: str, log_name: str):
        self.directory = directory
        self.port = free_port()
        self.log_path = os.path.join(directory, log_name)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _launch(self, command: list[str], cwd: str, env: dict[str, str] | None = None) -> None:
        """Run `command` and wait until the port accepts connections.

        Raises:
            RuntimeError: it exited or did not listen within `STARTUP_DEADLINE_S`.
        """
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while not self._accepting():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not listen within {STARTUP_DEADLINE_S} s")
            time.sleep(0.05)

    def _accepting(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}; "
                               f"see {self.log_path}")
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def discard_data(self) -> None:
        """Delete the stopped server's data (its log stays). Between rounds: a round's
        hundreds of MB left on the disk would still be written back during the next ones,
        which then measured slower than the first."""
        assert self.process is None or self.process.poll() is not None, "still running"
        shutil.rmtree(os.path.join(self.directory, self.data_name), ignore_errors=True)

    def stop(self) -> None:
        """SIGTERM by PID and wait; SIGKILL if it does not exit within `STOP_DEADLINE_S`."""
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_DEADLINE_S)


class PulsarLiteProcess(ServerProcess):
    """pulsar-lite in a subprocess, its data and log in `directory`."""

    name = "pulsar-lite"
    data_name = "db"

    def __init__(self, directory: str):
        super().__init__(directory, "pulsar-lite.log")

    def start(self) -> None:
        """Start it and wait until it accepts connections (raises as `_launch`)."""
        config = os.path.join(self.directory, "pulsar-lite.toml")
        with open(config, "w", encoding="utf-8") as out:
            out.write("[metrics]\nenabled = false\n")  # else it listens on 0.0.0.0:8080
        command = [pulsar_lite_binary(), "--config", config, "--addr", f"{HOST}:{self.port}",
                   "--db-path", os.path.join(self.directory, self.data_name),
                   "--log-level", "warn"]
        self._launch(command, cwd=self.directory)


@contextlib.contextmanager
def running_pulsar_lite(scratch: str) -> Iterator[PulsarLiteProcess]:
    peer = PulsarLiteProcess(tempfile.mkdtemp(prefix="pulsar-lite-", dir=scratch))
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()
        peer.discard_data()


# -- the workloads --------------------------------------------------------------------------

class _Receipts(ReceiptCount):
    """Counts receipts of `send_async`; the client's own pending bound blocks the sender."""

    def __init__(self) -> None:
        super().__init__(pulsar.Result.Ok)

    def callback(self, result: Any, _message_id: Any) -> None:
        self.count(result)

    def wait_all_or_stall(self, sent: int) -> bool:
        """Wait for every receipt; False when none arrived for `STALL_S`."""
        while not self.answered(sent):
            if self.quiet_s() > STALL_S:
                return False
            time.sleep(0.005)
        return True


def _producer(client: pulsar.Client, topic: str, batching: bool) -> pulsar.Producer:
    return client.create_producer(topic, batching_enabled=batching,
                                  batching_max_messages=BATCH_MESSAGES,
                                  batching_max_publish_delay_ms=BATCH_DELAY_MS,
                                  block_if_queue_full=True, max_pending_messages=IN_FLIGHT,
                                  send_timeout_millis=int(STALL_S * 3000))


def _publish(client: pulsar.Client, topic: str, batching: bool, seconds: float,
             result: Workload, receipts_by: str) -> None:
    """`send_async` for `seconds`, then the receipts as `receipts_by` says (`RECEIPTS`)."""
    assert receipts_by in RECEIPTS
    producer = _producer(client, topic, batching)
    payload = os.urandom(MESSAGE_BYTES)
    receipts = _Receipts() if receipts_by == "callback" else None
    callback = None if receipts is None else receipts.callback
    sent = 0
    started = time.perf_counter()
    stop_at = started + seconds
    while time.perf_counter() < stop_at:
        producer.send_async(payload, callback)
        sent += 1
    if receipts is None:
        _flushed(producer, sent, started, result)
    else:
        complete = receipts.wait_all_or_stall(sent)
        result.finish(receipts.done, receipts.last_s - started,
                      stalled=not complete or bool(receipts.failed))
    with contextlib.suppress(Exception):
        producer.close()


def _flushed(producer: pulsar.Producer, sent: int, started: float, result: Workload) -> None:
    """Receipts without callbacks: `flush()` waits for the last one (stalled: it timed out,
    or the last receipted sequence id is short of the sends)."""
    stalled = False
    try:
        producer.flush()
    except pulsar.PulsarException:
        stalled = True
    ended = time.perf_counter()
    receipted = producer.last_sequence_id() + 1  # sequence ids count from 0
    result.finish(min(receipted, sent), ended - started,
                  stalled=stalled or receipted < sent)


def _sync_publish(client: pulsar.Client, topic: str, seconds: float, result: Workload) -> None:
    producer = _producer(client, topic, False)
    payload = os.urandom(MESSAGE_BYTES)
    sent = 0
    started = time.perf_counter()
    stop_at = started + seconds
    stalled = False
    try:
        while time.perf_counter() < stop_at:
            producer.send(payload)
            sent += 1
    except pulsar.Timeout:
        stalled = True
    result.finish(sent, time.perf_counter() - started, stalled=stalled)
    producer.close()


class _Latencies:
    """The receipt latency of each `send_async`, from its callback."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: list[float] = []
        self.failed = 0
        self.last_s = time.perf_counter()

    def callback_for(self, sent_s: float) -> Callable[[Any, Any], None]:
        def callback(result: Any, _message_id: Any) -> None:
            now = time.perf_counter()
            with self.lock:
                self.last_s = now
                if result == pulsar.Result.Ok:
                    self.seconds.append(now - sent_s)
                else:
                    self.failed += 1
        return callback

    def wait_all(self, sent: int) -> bool:
        """Wait for every receipt; False when none arrived for `STALL_S`."""
        while True:
            with self.lock:
                if len(self.seconds) + self.failed >= sent:
                    return True
                quiet_s = time.perf_counter() - self.last_s
            if quiet_s > STALL_S:
                return False
            time.sleep(0.005)


def _publish_latency(client: pulsar.Client, topic: str, seconds: float,
                     result: Workload) -> None:
    """Unbatched `send_async` at `LATENCY_RATE_PER_S`; per-message receipt latency."""
    producer = _producer(client, topic, False)
    payload = os.urandom(MESSAGE_BYTES)
    latencies = _Latencies()
    sent = 0
    started = time.perf_counter()
    while (now := time.perf_counter()) < started + seconds:
        due = int((now - started) * LATENCY_RATE_PER_S) + 1
        while sent < due:
            producer.send_async(payload, latencies.callback_for(time.perf_counter()))
            sent += 1
        time.sleep(PACE_TICK_S)
    complete = latencies.wait_all(sent)
    samples = sorted(latencies.seconds)
    result.finish(len(samples), seconds, stalled=not complete or latencies.failed > 0)
    if samples:
        result.p50_ms = _percentile_ms(samples, 50)
        result.p99_ms = _percentile_ms(samples, 99)
        result.max_ms = samples[-1] * 1000
    with contextlib.suppress(Exception):
        producer.close()


def _percentile_ms(ordered: list[float], percent: float) -> float:
    rank = min(len(ordered) - 1, max(0, round(percent / 100 * len(ordered)) - 1))
    return ordered[rank] * 1000


def _consume(client: pulsar.Client, topic: str, wanted: int, result: Workload) -> None:
    started = time.perf_counter()
    last = started
    received = 0
    consumer = client.subscribe(topic, "backlog", consumer_type=pulsar.ConsumerType.Exclusive)
    stalled = False
    try:
        for _ in range(wanted):
            message = consumer.receive(timeout_millis=int(STALL_S * 1000))
            consumer.acknowledge(message)
            received += 1
            last = time.perf_counter()
    except pulsar.Timeout:
        stalled = True
    result.finish(received, last - started, stalled=stalled)
    consumer.close()


def run_workloads(broker: str, url: str, broker_pid: int, seconds: float, consume_max: int,
                  only: Sequence[str] = WORKLOADS, receipts: str = RECEIPTS[0]
                  ) -> list[Workload]:
    """The workloads `only` names (default: all) against the broker at `url` (process
    `broker_pid`, for its CPU), the publish workloads learning of receipts as `receipts`
    says (`RECEIPTS`); one `Workload` each, in `WORKLOADS` order (a workload not run has
    zeros)."""
    results = {name: Workload(broker, name) for name in WORKLOADS}
    client = pulsar.Client(url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    prefix = f"persistent://public/default/side-{broker}-{os.getpid()}"

    def accounted(name: str) -> contextlib.AbstractContextManager[None]:
        return cpu_accounted(results[name], broker_pid)

    try:
        for kind in ("batched", "unbatched"):
            topic = f"{prefix}-{kind}"
            published = results[f"{kind} publish"]
            consumed = f"{kind} consume + ack"
            if published.name not in only and consumed not in only:
                continue
            if consumed in only:
                # The backlog subscription exists before the publish, so it keeps the messages.
                client.subscribe(topic, "backlog", consumer_type=pulsar.ConsumerType.Exclusive,
                                 initial_position=pulsar.InitialPosition.Earliest).close()
            with accounted(published.name):
                _publish(client, topic, kind == "batched", seconds, published, receipts)
            if consumed in only:
                with accounted(consumed):
                    _consume(client, topic, min(consume_max, published.messages),
                             results[consumed])
        if "sync publish" in only:
            with accounted("sync publish"):
                _sync_publish(client, f"{prefix}-sync", seconds, results["sync publish"])
        if LATENCY in only:
            with accounted(LATENCY):
                _publish_latency(client, f"{prefix}-latency", seconds, results[LATENCY])
    finally:
        client.close()
    return [results[name] for name in WORKLOADS]


# -- the report -----------------------------------------------------------------------------

def median_rounds(rounds: Sequence[Sequence[Workload]]) -> list[Workload]:
    """Each broker's median round of each workload, in the order of the first round: the
    round whose rate is the median of that broker's rounds (the publish-latency workload's:
    whose p99 is), taken whole, so that its CPU and latency figures stay one round's. With
    an even number of rounds, the lower of the two middle rates (the higher of the two
    middle p99s): never the better of two rounds."""
    assert rounds
    assert all(len(r) == len(rounds[0]) for r in rounds)
    medians = []
    for position, first in enumerate(rounds[0]):
        runs = [r[position] for r in rounds]
        assert all((w.broker, w.name) == (first.broker, first.name) for w in runs)
        if first.name == LATENCY:
            runs.sort(key=lambda w: -w.p99_ms)
        else:
            runs.sort(key=lambda w: w.per_s)
        medians.append(runs[(len(runs) - 1) // 2])
    return medians


def rounds_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Per workload, each round's figure for both brokers and their ratio (the publish-latency
    workload: the p99s, and the ratio pulsar-lite / Magnetar, so that above 1 means Magnetar
    did better in all rows alike)."""
    rounds = [{(w["broker"], w["name"]): w for w in workloads}
              for workloads in document.get("side_by_side_rounds", [])]
    rows = []
    for name in WORKLOADS:
        key = "p99_ms" if name == LATENCY else "per_s"
        figures = [(r[("magnetar", name)][key], r[("pulsar-lite", name)][key]) for r in rounds]
        ratios = [(p / o if name == LATENCY else o / p) if min(o, p) > 0 else None
                  for o, p in figures]
        rows.append({"workload": name, "figure": key, "magnetar": [o for o, _ in figures],
                     "peer": [p for _, p in figures], "ratios": ratios})
    return rows


def render_rounds(document: dict[str, Any]) -> str:
    """The rounds behind the side-by-side table's medians, one line per workload and broker."""
    rounds = len(document.get("side_by_side_rounds", []))
    lines = [f"Side by side, each of the {rounds} rounds (Magnetar, then pulsar-lite, each a "
             "fresh server; the table above shows each broker's median round; ratio: "
             "Magnetar / pulsar-lite, for latency pulsar-lite's p99 / Magnetar's)"]
    for row in rounds_rows(document):
        if not any(row["magnetar"]) and not any(row["peer"]):
            continue  # a workload left out of the run
        unit = "p99 ms" if row["figure"] == "p99_ms" else "msg/s"
        form = "{:.2f}" if row["figure"] == "p99_ms" else "{:,.0f}"
        cells = {"Magnetar": [form.format(x) for x in row["magnetar"]],
                 "pulsar-lite": [form.format(x) for x in row["peer"]],
                 "ratio": ["-" if r is None else f"{r:.2f}" for r in row["ratios"]]}
        width = max(len(cell) for column in cells.values() for cell in column)
        lines.append(f"  {row['workload']} ({unit})")
        lines += [f"    {label:12s} " + "  ".join(cell.rjust(width) for cell in column)
                  for label, column in cells.items()]
    return "\n".join(lines)


def side_by_side_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per workload: each broker's messages/s, Magnetar over pulsar-lite, and for sync
    publish Magnetar over the raw write+fdatasync rate."""
    by_key = {(w["broker"], w["name"]): w for w in document["side_by_side"]}
    fsync_per_s = document["limits"]["fsync_append_per_s"]
    rows = []
    for name in WORKLOADS:
        ours, peer = by_key[("magnetar", name)], by_key[("pulsar-lite", name)]
        rows.append({
            "workload": name, "magnetar_per_s": ours["per_s"], "magnetar_stalled": ours["stalled"],
            "peer_per_s": peer["per_s"], "peer_stalled": peer["stalled"],
            "ratio": ours["per_s"] / peer["per_s"] if peer["per_s"] > 0 else None,
            "vs_fsync": ours["per_s"] / fsync_per_s if name == "sync publish" else None,
            "magnetar_p50_ms": ours.get("p50_ms", 0.0), "magnetar_p99_ms": ours.get("p99_ms", 0.0),
            "peer_p50_ms": peer.get("p50_ms", 0.0), "peer_p99_ms": peer.get("p99_ms", 0.0),
            "magnetar_cpu": _cpu_figures(ours), "peer_cpu": _cpu_figures(peer)})
    return rows


def _cpu_figures(workload: dict[str, Any]) -> dict[str, float]:
    """Broker and client CPU microseconds per message, and the client's cores (its CPU seconds
    per wall second), of one workload's JSON; zeros when nothing completed."""
    messages = workload["messages"]
    wall_s = workload.get("wall_s", 0.0)
    if messages <= 0 or wall_s <= 0:
        return {"broker_us": 0.0, "client_us": 0.0, "client_cores": 0.0}
    return {"broker_us": workload["broker_cpu_s"] / messages * 1e6,
            "client_us": workload["client_cpu_s"] / messages * 1e6,
            "client_cores": workload["client_cpu_s"] / wall_s}


def latency_target_ms(document: dict[str, Any]) -> float:
    """Issue 14's publish-latency p99 target: the allowance plus the measured fdatasync p99."""
    return LATENCY_P99_ALLOWANCE_MS + float(document["limits"]["fsync_append_p99_ms"])


def _rate(per_s: float, stalled: bool) -> str:
    return f"{per_s:,.0f}" + (" (stalled)" if stalled else "")


def render_side_by_side(document: dict[str, Any],
                        table: Callable[[list[str], list[list[str]], str], str]) -> str:
    rows = [[r["workload"], _rate(r["magnetar_per_s"], r["magnetar_stalled"]),
             _rate(r["peer_per_s"], r["peer_stalled"]),
             "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
             "" if r["vs_fsync"] is None else f"{r['vs_fsync']:.2f}",
             _latency(r["magnetar_p50_ms"], r["magnetar_p99_ms"]),
             _latency(r["peer_p50_ms"], r["peer_p99_ms"]),
             _cpu(r["magnetar_cpu"]), _cpu(r["peer_cpu"])]
            for r in side_by_side_rows(document)]
    headers = ["workload (1 KB)", "Magnetar msg/s", "pulsar-lite msg/s", "ratio", "x fsync",
               "Magnetar p50/p99 ms", "pulsar-lite p50/p99 ms",
               "Magnetar CPU us/msg", "pulsar-lite CPU us/msg"]
    receipts = document["parameters"].get("side_by_side_receipts", "callback")
    return ("Side by side with pulsar-lite (same run, same disk; ratio = Magnetar / "
            f"pulsar-lite; publish receipts counted by {receipts}; publish latency at "
            f"{LATENCY_RATE_PER_S:,.0f} msg/s unbatched, "
            f"target p99 <= {latency_target_ms(document):.2f} ms = "
            f"{LATENCY_P99_ALLOWANCE_MS:g} ms + the fdatasync p99; CPU: broker / official "
            "client microseconds per message, and in brackets the client's CPU seconds per "
            "wall second)\n"
            + table(headers, rows, "lrrrrrrrr"))


def _cpu(figures: dict[str, float]) -> str:
    if figures["client_cores"] <= 0:
        return ""
    return (f"{figures['broker_us']:.1f} / {figures['client_us']:.1f} "
            f"({figures['client_cores']:.2f})")


def _latency(p50_ms: float, p99_ms: float) -> str:
    return f"{p50_ms:.2f} / {p99_ms:.2f}" if p99_ms > 0 else ""


def plot_side_by_side(axes: Any, document: dict[str, Any]) -> None:
    rows = side_by_side_rows(document)
    width = 0.4
    positions = range(len(rows))
    axes.bar([i - width / 2 for i in positions], [r["magnetar_per_s"] for r in rows], width,
             label="Magnetar")
    axes.bar([i + width / 2 for i in positions], [r["peer_per_s"] for r in rows], width,
             label="pulsar-lite")
    axes.axhline(document["limits"]["fsync_append_per_s"], color="black", linestyle="--",
                 label="raw fsync/s (growing file)")
    axes.set_xticks(list(positions), [r["workload"].replace(" ", "\n", 1) for r in rows],
                    fontsize="small")
    axes.set_yscale("log")
    axes.set_ylabel("messages/s (log)")
    axes.set_title("1 KB, side by side with pulsar-lite")
    axes.legend(fontsize="small")
