"""Attribute the publish-latency tail (issue 14): the `publish latency` workload of
`e2e_peers.py` against a broker that records the latency trace (`storage/_trace.py`), each
message's send and receipt times kept, then what coincided with the slowest receipts.

    python benchmarks/trace_latency.py --seconds 6 [--warm-up] [--dir /tmp/trace]

`--warm-up` first runs the other side-by-side workloads (as `bench_e2e.py` does before the
latency one), so the broker holds what they left. Prints the p50/p99/max, then for the
receipts over the p99: the median share of their latency spent in each step (client to
broker read, read to journal write, write to fdatasync start, the fdatasync, the hand-over to
the loop, loop to receipt write, receipt to the client's callback), and how many of them
coincided with a checkpoint step, a GC collection (per generation), a loop lag, or an
fdatasync over 2 ms. The raw trace and the messages stay in --dir.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pulsar
from bench_e2e import BrokerProcess
from e2e_peers import (
    LATENCY,
    LATENCY_RATE_PER_S,
    MESSAGE_BYTES,
    PACE_TICK_S,
    WORKLOADS,
    _producer,
    run_workloads,
)

from magnetar.storage._trace import TRACE_PATH_ENV

SLOW_SYNC_NS = 2_000_000
BASELINE_EVERY = 10  # every this many messages make the baseline (what all of them overlap)


def _unbatched_producer(url: str) -> tuple[Any, Any, bytes]:
    """A client, its unbatched producer of the workloads' settings, and a payload."""
    client = pulsar.Client(url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = _producer(client, f"persistent://public/default/trace-{os.getpid()}", False)
    return client, producer, os.urandom(MESSAGE_BYTES)


def publish(url: str, seconds: float) -> list[tuple[int, int, int]]:
    """(sequence id, send ns, receipt ns) of each message sent at the workload's rate."""
    client, producer, payload = _unbatched_producer(url)
    done: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def callback_for(index: int, sent_ns: int) -> Any:
        def callback(result: Any, _: Any) -> None:
            now = time.perf_counter_ns()
            if result == pulsar.Result.Ok:
                with lock:
                    done.append((index, sent_ns, now))
        return callback

    sent = 0
    started = time.perf_counter()
    while (now := time.perf_counter()) < started + seconds:
        due = int((now - started) * LATENCY_RATE_PER_S) + 1
        while sent < due:
            producer.send_async(payload, callback_for(sent, time.perf_counter_ns()))
            sent += 1
        time.sleep(PACE_TICK_S)
    deadline = time.monotonic() + 30
    while len(done) < sent and time.monotonic() < deadline:
        time.sleep(0.01)
    producer.close()
    client.close()
    return sorted(done)


def publish_sync(url: str, seconds: float) -> list[tuple[int, int, int]]:
    """As `publish`, one message in flight (`send`): the sync-publish workload's path."""
    client, producer, payload = _unbatched_producer(url)
    done: list[tuple[int, int, int]] = []
    stop_at = time.perf_counter() + seconds
    while time.perf_counter() < stop_at:
        sent_ns = time.perf_counter_ns()
        producer.send(payload)
        done.append((len(done), sent_ns, time.perf_counter_ns()))
    producer.close()
    client.close()
    return done


def _intervals(events: list[list[Any]], start: str, end: str) -> list[tuple[int, int, int]]:
    """(start ns, end ns, start's a) of each start..end pair, in order."""
    out, opened = [], None
    for ns, kind, a, _ in events:
        if kind == start:
            opened = (ns, a)
        elif kind == end and opened is not None:
            out.append((opened[0], ns, opened[1]))
            opened = None
    return out


def _overlaps(intervals: list[tuple[int, int, int]], lo: int,
              hi: int) -> list[tuple[int, int, int]]:
    return [i for i in intervals if i[0] < hi and i[1] > lo]


def _median_ms(spans: list[tuple[int, int, int]]) -> float:
    return statistics.median([b - a for a, b, _ in spans]) / 1e6


def _following(starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
    """(start, the first end at or after it) for each start that has one."""
    out = []
    for start in starts:
        k = bisect.bisect_left(ends, start)
        if k < len(ends):
            out.append((start, ends[k]))
    return out


def _hops(events: list[list[Any]], checkpoints: list[tuple[int, int, int]]) -> None:
    """p50/p99 of each hand-over of every message's path, outside and inside checkpoints."""
    times: dict[str, list[int]] = defaultdict(list)
    for ns, kind, _, _ in events:
        times[kind].append(ns)
    path = ["submit", "journal:before-write", "journal:before-sync", "journal:after-sync",
            "durable", "confirm", "receipts"]
    print("each step of every message's path (us), outside | inside a checkpoint:")
    for first, second in itertools.pairwise(path):
        split: tuple[list[int], list[int]] = ([], [])
        for start, end in _following(times[first], times[second]):
            inside = any(a <= start <= b for a, b, _ in checkpoints)
            split[inside].append(end - start)
        figures = []
        for values in split:
            values.sort()
            figures.append(f"n {len(values):6d} p50 {_pct_us(values, 0.5):7.0f} "
                           f"p99 {_pct_us(values, 0.99):7.0f}" if values else "-")
        print(f"  {first.split(':')[-1]:>12s} -> {second.split(':')[-1]:12s} "
              + " | ".join(figures))


def _pct_us(ordered: list[int], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] / 1e3


def analyse(messages: list[tuple[int, int, int]], events: list[list[Any]]) -> None:
    latencies = sorted(r - s for _, s, r in messages)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(f"messages {len(messages)}: p50 {latencies[len(latencies) // 2] / 1e6:.2f} ms, "
          f"p99 {p99 / 1e6:.2f} ms, max {latencies[-1] / 1e6:.2f} ms")
    reads = [(e[0], e[2], e[3]) for e in events if e[1] == "read"]
    receipts = [(e[0], e[2], e[3]) for e in events if e[1] == "receipts"]
    writes = [e[0] for e in events if e[1] == "journal:before-write"]
    syncs = _intervals(events, "journal:before-sync", "journal:after-sync")
    durables = [e[0] for e in events if e[1] == "durable"]
    confirms = [e[0] for e in events if e[1] == "confirm"]
    gcs = [(s, t, g) for s, t, g in _intervals(events, "gc0", "gc1")]
    lags = [(e[0] - e[2] * 1000, e[0], e[2]) for e in events if e[1] == "lag"]
    lag_cpu = [e[3] for e in events if e[1] == "lag"]
    lag_runq = [e[2] for e in events if e[1] == "runq"]
    if lags:
        total = sum(lag for _, _, lag in lags)
        print(f"loop lags: {len(lags)}, {total / 1e3:.1f} ms in all; the loop thread meanwhile "
              f"ran {sum(lag_cpu) / 1e3:.1f} ms and waited for a CPU {sum(lag_runq) / 1e3:.1f} ms"
              f" (the rest: blocked, e.g. on the GIL)")
    ckpt_steps = ["checkpoint:begin", "checkpoint:after-swap",
                  "checkpoint:after-entrylog-write", "checkpoint:after-entrylog-sync",
                  "checkpoint:before-index-commit", "checkpoint:after-index-commit",
                  "checkpoint:flushed", "checkpoint:freed"]
    ckpt: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for first, second in itertools.pairwise(ckpt_steps):
        ckpt[second.split(":")[1]] = _intervals(events, first, second)
    print(f"trace: {len(events)} events, {len(syncs)} fdatasyncs (p50 "
          f"{statistics.median([b - a for a, b, _ in syncs]) / 1e3:.0f} us, max "
          f"{max(b - a for a, b, _ in syncs) / 1e3:.0f} us), {len(gcs)} GC collections "
          f"({dict(Counter(g for _, _, g in gcs))}), {len(lags)} loop lags, "
          f"{len(ckpt['freed'])} checkpoints")
    for name, spans in ckpt.items():
        if spans:
            print(f"  checkpoint step {name:22s} median {_median_ms(spans):7.1f} ms, "
                  f"max {max(b - a for a, b, _ in spans) / 1e6:7.1f} ms")
    phase = [e for e in events if e[0] >= messages[0][1]]  # the latency workload's
    _hops(phase, _intervals(phase, "checkpoint:begin", "checkpoint:freed"))
    for gen in (0, 1, 2):
        spans = [b - a for a, b, g in gcs if g == gen]
        if spans:
            print(f"  GC gen{gen}: {len(spans)}, median {statistics.median(spans) / 1e3:.0f} us, "
                  f"max {max(spans) / 1e3:.0f} us")
    slow = [(i, s, r) for i, s, r in messages if r - s > p99]
    receipt_times = [t for t, _, _ in receipts]
    sync_starts = [a for a, _, _ in syncs]
    # The start of each sync that followed a preallocation step (it writes the zeros too).
    after_prealloc = {sync_starts[k] for e in events if e[1] == "journal:prealloc"
                      and (k := bisect.bisect_left(sync_starts, e[0])) < len(sync_starts)}

    def breakdown(index: int, sent: int, got: int) -> tuple[dict[str, int], set[str]] | None:
        """The steps (ns) of one message's path, and what its time overlapped."""
        # The broker's read of this SEND: the first read event from its send on that holds it.
        k = bisect.bisect_left(reads, (sent,))
        while k < len(reads) and not (reads[k][1] <= index <= reads[k][2]):
            k += 1
        r = bisect.bisect_left(receipt_times, sent)
        while r < len(receipts) and receipts[r][1] < index:
            r += 1
        if k >= len(reads) or r >= len(receipts):
            return None
        read, receipt = reads[k][0], receipts[r][0]
        after_read = bisect.bisect_left(writes, read)
        write = writes[after_read] if after_read < len(writes) else receipt
        at = bisect.bisect_left(sync_starts, write)
        sync0, sync1 = syncs[at][:2] if at < len(syncs) else (write, write)
        durable = durables[min(bisect.bisect_left(durables, sync1), len(durables) - 1)]
        confirm = confirms[min(bisect.bisect_left(confirms, sync1), len(confirms) - 1)]
        parts = {"client->read": read - sent, "read->write": write - read,
                 "write->sync": sync0 - write, "fdatasync": sync1 - sync0,
                 "sync->durable": durable - sync1, "durable->confirm": confirm - durable,
                 "confirm->receipt": receipt - confirm, "receipt->client": got - receipt}
        tags = {f"checkpoint {name}" for name, spans in ckpt.items()
                if _overlaps(spans, sent, got)}
        if tags:
            tags.add("any checkpoint step")
        tags |= {f"GC gen{gen}" for _, _, gen in _overlaps(gcs, sent, got)}
        if _overlaps(lags, sent, got):
            tags.add("a loop lag >= 0.3 ms")
        overlapped = _overlaps(syncs, sent, got)
        if any(b - a > SLOW_SYNC_NS for a, b, _ in overlapped):
            tags.add("an fdatasync > 2 ms")
        if any(a in after_prealloc for a, _, _ in overlapped):
            tags.add("the fdatasync after a preallocation step")
        return parts, tags

    baseline = [b for m in messages[::BASELINE_EVERY] if (b := breakdown(*m)) is not None]
    typical = {name: statistics.median([parts[name] for parts, _ in baseline])
               for name in baseline[0][0]}
    base_tags: Counter[str] = Counter(tag for _, tags in baseline for tag in tags)
    steps: dict[str, list[float]] = defaultdict(list)
    largest: Counter[str] = Counter()
    coincide: Counter[str] = Counter()
    matched = 0
    for message in slow:
        found = breakdown(*message)
        if found is None:
            continue
        matched += 1
        parts, tags = found
        for name, value in parts.items():
            steps[name].append(value / 1e6)
        # The step that grew most over its median among all messages.
        largest[max(parts, key=lambda name: parts[name] - typical[name])] += 1
        coincide.update(tags)
    print(f"\n{len(slow)} receipts over the p99 ({matched} matched to the trace); each "
          f"step's median ms among them (among every message):")
    for name, values in steps.items():
        print(f"  {name:18s} {statistics.median(values):7.2f} ({typical[name] / 1e6:.2f})"
              f"  max {max(values):6.2f}")
    print("the step that grew most over its median:")
    for name, count in largest.most_common():
        print(f"  {name:34s} {count:5d}  {count / matched:5.0%}")
    print("overlapping (share of the receipts over the p99; of every message):")
    for name, count in coincide.most_common():
        print(f"  {name:34s} {count:5d}  {count / matched:5.0%}  "
              f"({base_tags[name] / len(baseline):.0%})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warm-up", action="store_true")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--analyse-only", action="store_true")
    parser.add_argument("--sync", action="store_true",
                        help="one message in flight (`send`) instead of the steady rate")
    parser.add_argument("--root", default=None,
                        help="run the broker of this checkout (default: this one)")
    args = parser.parse_args()
    scratch = args.dir or tempfile.mkdtemp(prefix="trace-latency-")
    os.makedirs(scratch, exist_ok=True)
    trace_path = os.path.join(scratch, "trace.jsonl")
    messages_path = os.path.join(scratch, "messages.json")
    if not args.analyse_only:
        os.environ[TRACE_PATH_ENV] = trace_path
        broker = BrokerProcess(tempfile.mkdtemp(prefix="broker-", dir=scratch),
                               **({"root": args.root} if args.root else {}))
        broker.start()
        try:
            broker.wait_ready()
            if args.warm_up:
                assert broker.process is not None
                run_workloads("magnetar", broker.url, broker.process.pid, 3.0, 10_000,
                              [name for name in WORKLOADS if name != LATENCY])
            messages = (publish_sync if args.sync else publish)(broker.url, args.seconds)
        finally:
            broker.stop()
        with open(messages_path, "w", encoding="ascii") as out:
            json.dump(messages, out)
    with open(messages_path, encoding="ascii") as source:
        messages = [tuple(m) for m in json.load(source)]
    with open(trace_path, encoding="ascii") as source:
        events = [json.loads(line) for line in source]
    analyse(messages, events)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
