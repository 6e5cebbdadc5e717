"""Broker benchmark: publish, dispatch and ack through `BrokerService` in process, durably,
with 1 KB messages, batching off and on, for each subscription type, set against the disk's
limits measured in the same run.

What is measured
----------------
* **Disk limits**, with `storage.testing.benchmark`'s own measurement (1 KB write + fdatasync on a
  growing file and on a preallocated one, and sequential bandwidth), sampled at the start
  and at the end of the run; each limit is the better sample.
* **Publish** (`publish` cells): `PersistentTopic.publish` of 1 KB messages to a topic with
  no subscription, batching off (one message per entry) and on (`build_batch` of
  `BATCH_MESSAGES` messages per entry), with 1 publish in flight (a synchronous client) and
  with `PUBLISH_IN_FLIGHT_MAX` concurrent publish tasks. Every publish returns only once its
  entry is durable (the journal's group commit). Messages/s, MB/s of message data, latency
  p50/p99 (call to return).
* **Dispatch + ack** (`dispatch` cells): a backlog of messages is published first (not
  timed); then consumers subscribe (Exclusive: one; Failover, Shared, Key_Shared: two) with
  a receiver queue of `RECEIVER_QUEUE` permits, and each consumer, as a client would,
  acknowledges every delivery batch it receives (Exclusive and Failover cumulatively, Shared
  and Key_Shared individually, whole entries) and grants the permits back the way the official
  client does: in one FLOW once half the receiver queue has been consumed. Each
  acknowledgement returns once the cursor is durable. The rate is the backlog's messages
  over the time from the first permit to the last ack returned.

Ratios: entries/s over the raw fsync rate of a growing file (for batching off with 1 in
flight, how close one durable publish comes to one bare fsync; above 1, how many entries a
group commit fits in one fsync's time), and MB/s of message data over the sequential
bandwidth. MB means 2**20 bytes. Each cell runs on a fresh data directory, `Storage` (default
configuration, its own threads) and `BrokerService` (failover delay 0, so the Failover cell
does not wait a second for its first read).

    python benchmarks/bench_broker.py --quick
    python benchmarks/bench_broker.py --json bench-broker.json --dir /data
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# Runnable from a checkout without installing: the repository root holds the packages.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from magnetar.broker import (
    BrokerConfig,
    BrokerService,
    Consumer,
    Delivery,
    PersistentTopic,
    ProducerSpec,
    SubscribeSpec,
)
from magnetar.broker.topics._topic import Producer
from magnetar.codec import SingleMessage, build_batch, build_message, encode_entry
from magnetar.storage import Storage, StorageConfig
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

MB = 1024 * 1024
MESSAGE_BYTES = 1024
BATCH_MESSAGES = 100
PUBLISH_IN_FLIGHT = (1, 256)
PUBLISH_IN_FLIGHT_MAX = max(PUBLISH_IN_FLIGHT)
SUB_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
RECEIVER_QUEUE = 1000  # permits per consumer, granted back as it acknowledges
FLOW_THRESHOLD = RECEIVER_QUEUE // 2  # the client sends FLOW once this many were consumed
KEYS = 16  # Key_Shared keys; a batch carries one key (key-based batching)
FILL_IN_FLIGHT = 256
CELL_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class BrokerBenchScale:
    """How long and how big each cell is."""

    name: str
    storage: BenchScale  # the disk-limit samples and the storage configuration
    publish_seconds: float  # measured time of each publish cell
    warmup_seconds: float  # discarded time before it
    publish_ops_min: int  # a publish cell also runs until this many publishes returned
    dispatch_messages: int  # backlog of each dispatch cell, batching off
    dispatch_batched_messages: int  # the same, batching on (a multiple of BATCH_MESSAGES)

    def __post_init__(self) -> None:
        assert self.dispatch_batched_messages % BATCH_MESSAGES == 0
        assert self.dispatch_messages > 0
        assert self.publish_ops_min > 0


FULL = BrokerBenchScale("full", FULL_SCALE, 5.0, 0.5, 50, 100_000, 500_000)
QUICK = BrokerBenchScale("quick", QUICK_SCALE, 1.0, 0.2, 20, 20_000, 100_000)
TINY = BrokerBenchScale("tiny", TINY_SCALE, 0.05, 0.01, 5, 300, 1_000)


@dataclass
class BenchOptions:
    directory: str = "."
    quick: bool = False
    json_path: str | None = None
    progress: bool = True
    scale: BrokerBenchScale | None = None  # overrides `quick` (the tests use TINY)

    def chosen_scale(self) -> BrokerBenchScale:
        if self.scale is not None:
            return self.scale
        return QUICK if self.quick else FULL


@dataclass
class PublishCell:
    batching: bool
    in_flight: int
    messages: int
    entries: int
    seconds: float
    messages_per_s: float
    entries_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    vs_fsync: float = 0.0
    vs_bandwidth: float = 0.0


@dataclass
class DispatchCell:
    batching: bool
    sub_type: str
    consumers: int
    messages: int
    entries: int
    acks: int
    seconds: float
    messages_per_s: float
    entries_per_s: float
    mb_per_s: float
    vs_fsync: float = 0.0
    vs_bandwidth: float = 0.0


@dataclass
class _BrokerResults:
    storage: _Results = field(default_factory=_Results)  # the limit samples
    publish: list[PublishCell] = field(default_factory=list)
    dispatch: list[DispatchCell] = field(default_factory=list)


# -- the run ------------------------------------------------------------------------------

def run_broker_benchmark(options: BenchOptions) -> dict[str, Any]:
    """Run every cell, print the table, write the JSON; return the JSON document.

    Raises:
        OSError, StorageError, BrokerError: the disk or the broker failed; the temporary
            directory is removed all the same.
    """
    scale = options.chosen_scale()
    os.makedirs(options.directory, exist_ok=True)
    results = _BrokerResults()
    steps = _steps(scale, results)
    with _quiet_storage_log(), _scratch_dir(options.directory) as scratch:
        for number, (label, step) in enumerate(steps, 1):
            if options.progress:
                print(f"[{number}/{len(steps)}] {label}", file=sys.stderr, flush=True)
            step(scratch)
    document = _document(options, scale, results)
    print(render_table(document))
    if options.json_path:
        with open(options.json_path, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
            out.write("\n")
    return document


Step = tuple[str, Callable[[str], None]]


def _steps(scale: BrokerBenchScale, results: _BrokerResults) -> list[Step]:
    def limits(when: str) -> Callable[[str], None]:
        return lambda scratch: _run_limits(scale.storage, scratch, results.storage, when)

    def publish(batching: bool, in_flight: int) -> Callable[[str], None]:
        return lambda scratch: results.publish.append(
            _run_cell(scratch, scale, _publish_cell(scale, batching, in_flight)))

    def dispatch(batching: bool, sub_type: str) -> Callable[[str], None]:
        return lambda scratch: results.dispatch.append(
            _run_cell(scratch, scale, _dispatch_cell(scale, batching, sub_type)))

    steps: list[Step] = [("disk limits", limits("start"))]
    steps += [(f"publish {_batching_name(b)} x{n}", publish(b, n))
              for b in (False, True) for n in PUBLISH_IN_FLIGHT]
    steps += [(f"dispatch+ack {t} {_batching_name(b)}", dispatch(b, t))
              for b in (False, True) for t in SUB_TYPES]
    steps.append(("disk limits again", limits("end")))
    return steps


@contextmanager
def _scratch_dir(parent: str) -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="magnetar-bench-broker-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


CellWork = Callable[[BrokerService], Any]


def _run_cell(scratch: str, scale: BrokerBenchScale, work: CellWork) -> Any:
    """Run one cell's coroutine on a fresh directory, storage and service."""
    directory = tempfile.mkdtemp(prefix="cell-", dir=scratch)

    async def main() -> Any:
        storage = Storage.open(directory, _storage_config(scale))
        service = BrokerService(storage, BrokerConfig(active_consumer_failover_delay_ms=0))
        try:
            await service.start(maintenance=False)
            return await asyncio.wait_for(work(service), CELL_TIMEOUT_S)
        finally:
            await service.close()
            storage.close()

    try:
        return asyncio.run(main())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _storage_config(scale: BrokerBenchScale) -> StorageConfig:
    return scale.storage.storage_config()


# -- entries ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Entry:
    data: bytes
    metadata: Any
    messages: int


def _make_entry(producer: str, batching: bool, key: str, sequence_id: int) -> _Entry:
    body = os.urandom(MESSAGE_BYTES)
    now_ms = int(time.time() * 1000)
    if not batching:
        metadata, payload = build_message(
            SingleMessage(body, partition_key=key, sequence_id=sequence_id),
            producer_name=producer, publish_time=now_ms)
        return _Entry(encode_entry(metadata, payload), metadata, 1)
    messages = [SingleMessage(body, partition_key=key, sequence_id=sequence_id + i)
                for i in range(BATCH_MESSAGES)]
    metadata, payload = build_batch(messages, producer_name=producer, publish_time=now_ms)
    metadata.highest_sequence_id = sequence_id + BATCH_MESSAGES - 1
    return _Entry(encode_entry(metadata, payload), metadata, BATCH_MESSAGES)


async def _producer(service: BrokerService, topic_name: str,
                    ) -> tuple[PersistentTopic, Producer]:
    topic, producer = await service.create_producer(topic_name, ProducerSpec("bench"))
    assert isinstance(topic, PersistentTopic)
    return topic, producer


async def _publish(topic: PersistentTopic, producer: Producer, entry: _Entry) -> None:
    result = await topic.publish(producer, entry.data, 0, 0, entry.metadata)
    assert not result.duplicate


# -- publish cells ------------------------------------------------------------------------

def _publish_cell(scale: BrokerBenchScale, batching: bool, in_flight: int) -> CellWork:
    async def work(service: BrokerService) -> PublishCell:
        topic, producer = await _producer(service, f"bench-publish-{in_flight}")
        entry = _make_entry(producer.name, batching, "k0", 0)
        warm_end = time.perf_counter() + scale.warmup_seconds
        stop_at = warm_end + scale.publish_seconds
        latencies: list[float] = []

        async def publisher() -> None:
            while True:
                started = time.perf_counter()
                if started >= stop_at and len(latencies) >= scale.publish_ops_min:
                    return
                await _publish(topic, producer, entry)
                if started >= warm_end:
                    latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(publisher() for _ in range(in_flight)))
        seconds = time.perf_counter() - warm_end
        messages = len(latencies) * entry.messages
        return PublishCell(batching, in_flight, messages, len(latencies), seconds,
                           messages / seconds, len(latencies) / seconds,
                           messages * MESSAGE_BYTES / MB / seconds,
                           _percentile_ms(latencies, 50), _percentile_ms(latencies, 99))

    return work


# -- dispatch + ack cells -----------------------------------------------------------------

class _AckingConsumer:
    """A consumer that acknowledges each delivery batch and grants its permits back, as a
    client with a receiver queue does; a sink for the broker."""

    def __init__(self, cumulative: bool):
        self.cumulative = cumulative
        self.consumer: Consumer | None = None
        self.queue: asyncio.Queue[list[Delivery]] = asyncio.Queue()
        self.acks = 0
        self.consumed = 0  # messages consumed since the last FLOW

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        self.queue.put_nowait(deliveries)

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        pass

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        raise AssertionError(f"the broker closed a benchmark consumer: {reason}")

    async def run(self, topic: PersistentTopic, subscription: str,
                  acked: Callable[[int], bool]) -> None:
        """Acknowledge until `acked(messages)` says the backlog is done."""
        assert self.consumer is not None
        sub = topic.subscriptions[subscription]
        while True:
            deliveries = await self.queue.get()
            messages = sum(d.batch_size for d in deliveries)
            if self.cumulative:
                last = deliveries[-1]
                acks: list[tuple[int, int, list[int] | None]] = [
                    (last.ledger_id, last.entry_id, None)]
            else:
                acks = [(d.ledger_id, d.entry_id, None) for d in deliveries]
            await sub.acknowledge(self.consumer, 1 if self.cumulative else 0, acks)
            self.acks += 1
            self.consumed += messages
            if self.consumed >= FLOW_THRESHOLD:
                sub.flow(self.consumer, self.consumed)
                self.consumed = 0
            if acked(messages):
                return


def _dispatch_cell(scale: BrokerBenchScale, batching: bool, sub_type: str) -> CellWork:
    total = scale.dispatch_batched_messages if batching else scale.dispatch_messages
    per_entry = BATCH_MESSAGES if batching else 1
    entries = total // per_entry
    consumers = 1 if sub_type == "Exclusive" else 2

    async def work(service: BrokerService) -> DispatchCell:
        topic, producer = await _producer(service, "bench-dispatch")
        await topic.create_subscription("bench", "earliest")
        await _fill(topic, producer, batching, entries)
        sinks = [_AckingConsumer(cumulative=sub_type in ("Exclusive", "Failover"))
                 for _ in range(consumers)]
        remaining = [total]
        done = asyncio.get_running_loop().create_future()

        def acked(messages: int) -> bool:
            remaining[0] -= messages
            if remaining[0] <= 0 and not done.done():
                done.set_result(None)
            return remaining[0] <= 0

        started = time.perf_counter()
        for number, sink in enumerate(sinks):
            spec = SubscribeSpec("bench", sub_type, f"c{number}", initial_position="earliest")
            _, sink.consumer = await service.subscribe(topic.name, spec, sink)
            topic.subscriptions["bench"].flow(sink.consumer, RECEIVER_QUEUE)
        tasks = [asyncio.ensure_future(s.run(topic, "bench", acked)) for s in sinks]
        await done
        seconds = time.perf_counter() - started
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        backlog = topic.subscriptions["bench"].backlog()
        assert backlog == 0, f"{sub_type}: backlog {backlog} after every message was acked"
        return DispatchCell(batching, sub_type, consumers, total, entries,
                            sum(s.acks for s in sinks), seconds, total / seconds,
                            entries / seconds, total * MESSAGE_BYTES / MB / seconds)

    return work


async def _fill(topic: PersistentTopic, producer: Producer, batching: bool,
                entries: int) -> None:
    """Publish the backlog with `FILL_IN_FLIGHT` publishes in flight (not timed)."""
    per_entry = BATCH_MESSAGES if batching else 1
    made = [_make_entry(producer.name, batching, f"key-{k}", k * per_entry)
            for k in range(min(KEYS, entries))]
    next_index = [0]

    async def filler() -> None:
        while next_index[0] < entries:
            index = next_index[0]
            next_index[0] += 1
            await _publish(topic, producer, made[index % len(made)])

    await asyncio.gather(*(filler() for _ in range(min(FILL_IN_FLIGHT, entries))))


# -- ratios and the document ------------------------------------------------------------------

def _document(options: BenchOptions, scale: BrokerBenchScale,
              results: _BrokerResults) -> dict[str, Any]:
    limits = _best_limits(results.storage.limit_samples, scale.storage)
    cells: list[PublishCell | DispatchCell] = [*results.publish, *results.dispatch]
    for cell in cells:
        cell.vs_fsync = cell.entries_per_s / limits.fsync_append_per_s
        cell.vs_bandwidth = cell.mb_per_s / limits.sequential_mb_per_s
    return {
        "benchmark": "broker",
        "parameters": {
            "directory": os.path.abspath(options.directory),
            "scale": dataclasses.asdict(scale),
            "message_bytes": MESSAGE_BYTES,
            "batch_messages": BATCH_MESSAGES,
            "publish_in_flight": list(PUBLISH_IN_FLIGHT),
            "receiver_queue": RECEIVER_QUEUE,
            "sub_types": list(SUB_TYPES),
            "broker_config": {"active_consumer_failover_delay_ms": 0},
            "mb_bytes": MB,
        },
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "machine": {"nproc": os.cpu_count(), "platform": platform.platform()},
        "limits": dataclasses.asdict(limits),
        "publish": [dataclasses.asdict(c) for c in results.publish],
        "dispatch": [dataclasses.asdict(c) for c in results.dispatch],
    }


def _batching_name(batching: bool) -> str:
    return f"batch {BATCH_MESSAGES}" if batching else "no batch"


def render_table(document: dict[str, Any]) -> str:
    """The human-readable report of a benchmark document."""
    header = (f"Broker benchmark ({document['parameters']['scale']['name']} run), "
              f"{document['machine']['nproc']} CPUs, Python {document['python']}, commit "
              f"{(document['git_commit'] or 'unknown')[:12]}; 1 KB messages, MB = 2^20 bytes")
    publish_rows = [
        [_batching_name(c["batching"]), str(c["in_flight"]), f"{c['messages_per_s']:,.0f}",
         f"{c['entries_per_s']:,.0f}", f"{c['mb_per_s']:,.1f}", f"{c['p50_ms']:.2f}",
         f"{c['p99_ms']:.2f}", f"{c['vs_fsync']:.2f}", f"{c['vs_bandwidth']:.3f}"]
        for c in document["publish"]]
    dispatch_rows = [
        [c["sub_type"], _batching_name(c["batching"]), str(c["consumers"]),
         f"{c['messages']:,}", f"{c['acks']:,}", f"{c['seconds']:.2f}",
         f"{c['messages_per_s']:,.0f}", f"{c['entries_per_s']:,.0f}", f"{c['mb_per_s']:,.1f}",
         f"{c['vs_fsync']:.2f}", f"{c['vs_bandwidth']:.3f}"] for c in document["dispatch"]]
    publish = _table(["batching", "in flight", "msgs/s", "entries/s", "MB/s", "p50 ms",
                      "p99 ms", "x fsync", "x bandwidth"], publish_rows, "lrrrrrrrr")
    dispatch = _table(["subscription", "batching", "consumers", "messages", "ack calls", "s",
                       "msgs/s", "entries/s", "MB/s", "x fsync", "x bandwidth"],
                      dispatch_rows, "llrrrrrrrrr")
    return "\n\n".join([
        header, _render_limits(document),
        "Durable publish (PersistentTopic.publish, no subscription)\n" + publish,
        "Dispatch + durable ack of a backlog, per subscription type\n" + dispatch])


# -- command line ----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure durable publish and dispatch+ack through the broker service "
        "in process (1 KB messages, batching off and on, every subscription type) against "
        "the disk's raw fsync rate and bandwidth, in a temporary directory under --dir.")
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    parser.add_argument("--dir", default=".", help="run on the disk holding this directory")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    parser.add_argument("--no-progress", action="store_true", help="no per-cell lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run_broker_benchmark(BenchOptions(directory=args.dir, quick=args.quick,
                                      json_path=args.json, progress=not args.no_progress))
    return 0


if __name__ == "__main__":
    sys.exit(main())
