"""Codec benchmark: batch building and parsing, compression, and the frame layer.

What is measured (each figure is a rate over one round; every benchmark runs several rounds and
the table shows the median, the 10th percentile -- 90 % of rounds were at least this fast -- and
the best round):

* `build batch N`: `build_batch` of N messages of 100 B (metadata + uncompressed batch payload),
  in messages per second, for N = 1, 100, 1000.
* `parse batch N`: `unpack_messages` of such a batch back to `SingleMessage`s, messages per second.
* `compress CODEC` / `decompress CODEC`: MB/s (of uncompressed bytes) on a 1000-message batch
  payload of JSON-like 100 B records, for each of Pulsar's codecs.
* `frame send` / `frame receive`: SEND frames of one 100 B message through `Connection.send`
  (encode, CRC32C) and through `receive_data` + `next_event` (decode, verify, parse metadata),
  frames per second; `frame receive batch` does the same for 1000-message batch frames and
  counts messages (decode + unpack).

The target from issue 3: building and parsing 1000-message batches at 500,000 messages/s or more.

    python benchmarks/bench_codec.py --quick
    python benchmarks/bench_codec.py --json bench-codec.json
    python benchmarks/bench_codec.py --profile parse   # cProfile of one benchmark
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

MESSAGE_SIZE_BYTES = 100
BATCH_SIZES = (1, 100, 1000)
TARGET_MESSAGES_PER_S = 500_000


@dataclass(frozen=True)
class Options:
    rounds: int
    messages_per_round: int
    compression_bytes_per_round: int
    frames_per_round: int
    seed: int


@dataclass(frozen=True)
class Result:
    name: str
    unit: str
    rounds: int
    median: float
    p10: float
    best: float


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure batch build/parse rates (100 B messages; 1, 100, 1000 per batch), "
        "compression MB/s per codec, and frames/s through the sans-IO frame layer."
    )
    parser.add_argument("--quick", action="store_true", help="a short run (a few seconds)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results as JSON")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per benchmark")
    parser.add_argument("--seed", type=int, default=20261122, help="seed for the message data")
    parser.add_argument(
        "--profile",
        choices=["build", "parse", "receive"],
        default=None,
        help="run cProfile over one 1000-message benchmark and print the top functions",
    )
    return parser


def options_from(args: argparse.Namespace) -> Options:
    if args.quick:
        return Options(args.rounds or 5, 20_000, 2_000_000, 5_000, args.seed)
    return Options(args.rounds or 15, 100_000, 10_000_000, 20_000, args.seed)


def records(count: int, rng: random.Random) -> list[bytes]:
    """JSON-like records of exactly MESSAGE_SIZE_BYTES: compressible, but not trivially."""
    out = []
    for i in range(count):
        text = (
            f'{{"order":{rng.randrange(10**9)},"user":"u-{rng.randrange(10**5)}",'
            f'"sku":"{rng.choice(["apple", "pear", "plum", "fig"])}-{i}",'
            f'"qty":{rng.randrange(99)}}}'
        )
        out.append(text.encode().ljust(MESSAGE_SIZE_BYTES, b" ")[:MESSAGE_SIZE_BYTES])
    return out


def measure(name: str, unit: str, rounds: int, work: Callable[[], float]) -> Result:
    """Run `work` (which returns how many units it did) `rounds` times; rates per round."""
    work()  # warm-up: caches, allocator, lazy imports
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        done = work()
        rates.append(done / (time.perf_counter() - start))
    rates.sort()
    p10 = rates[max(0, int(len(rates) * 0.1) - 1)] if len(rates) >= 10 else rates[0]
    return Result(name, unit, rounds, statistics.median(rates), p10, rates[-1])


def batch_benchmarks(opts: Options, rng: random.Random) -> list[Result]:
    from magnetar.codec import SingleMessage, build_batch, unpack_messages

    results = []
    bodies = records(max(BATCH_SIZES), rng)
    for size in BATCH_SIZES:
        messages = [SingleMessage(bodies[i], sequence_id=100_000 + i) for i in range(size)]
        calls = max(1, opts.messages_per_round // size)
        metadata, payload = build_batch(messages, producer_name="bench", publish_time=1)

        def build(messages: list[SingleMessage] = messages, calls: int = calls) -> float:
            for _ in range(calls):
                build_batch(messages, producer_name="bench", publish_time=1)
            return calls * len(messages)

        def parse(
            metadata: object = metadata, payload: bytes = payload, calls: int = calls
        ) -> float:
            decoded = 0
            for _ in range(calls):
                decoded += len(unpack_messages(metadata, payload))  # type: ignore[arg-type]
            return decoded

        results.append(measure(f"build batch {size}", "msg/s", opts.rounds, build))
        results.append(measure(f"parse batch {size}", "msg/s", opts.rounds, parse))
    return results


def compression_benchmarks(opts: Options, rng: random.Random) -> list[Result]:
    from magnetar.codec import (
        CompressionType,
        SingleMessage,
        compress,
        decompress,
        encode_batch_payload,
    )

    data = encode_batch_payload([SingleMessage(body) for body in records(1000, rng)])
    repeats = max(1, opts.compression_bytes_per_round // len(data))
    results = []
    for codec in CompressionType:
        packed = compress(codec, data)

        def pack(codec: CompressionType = codec) -> float:
            for _ in range(repeats):
                compress(codec, data)
            return repeats * len(data) / 1e6

        def unpack(codec: CompressionType = codec, packed: bytes = packed) -> float:
            for _ in range(repeats):
                decompress(codec, packed, len(data))
            return repeats * len(data) / 1e6

        ratio = len(data) / len(packed)
        results.append(measure(f"compress {codec.name} (x{ratio:.1f})", "MB/s", opts.rounds, pack))
        results.append(measure(f"decompress {codec.name}", "MB/s", opts.rounds, unpack))
    return results


def frame_benchmarks(opts: Options, rng: random.Random) -> list[Result]:
    from magnetar.codec import (
        NEED_DATA,
        Connection,
        Role,
        SingleMessage,
        base_command,
        build_batch,
        build_message,
        pb,
        unpack_messages,
    )

    body = records(1, rng)[0]
    metadata, payload = build_message(
        SingleMessage(body, sequence_id=0), producer_name="bench", publish_time=1_700_000_000_000
    )
    command = base_command(pb.CommandSend(producer_id=1, sequence_id=0))
    count = opts.frames_per_round

    def connected_pair() -> tuple[Connection, Connection]:
        client = Connection(Role.CLIENT)
        broker = Connection(Role.BROKER)
        connect = pb.CommandConnect(client_version="bench", protocol_version=20)
        broker.receive_data(client.send(base_command(connect)))
        list(broker.events())
        client.receive_data(broker.send(base_command(pb.CommandConnected(server_version="b"))))
        list(client.events())
        return client, broker

    sender, _ = connected_pair()

    def send() -> float:
        for _ in range(count):
            sender.send(command, metadata, payload)
        return count

    stream = sender.send(command, metadata, payload) * count

    def receive() -> float:
        _, broker = connected_pair()
        broker.receive_data(stream)
        received = 0
        while broker.next_event() is not NEED_DATA:
            received += 1
        assert received == count
        return count

    batch = [SingleMessage(b, sequence_id=i) for i, b in enumerate(records(1000, rng))]
    batch_metadata, batch_payload = build_batch(batch, producer_name="bench", publish_time=1)
    batch_frames = max(1, opts.messages_per_round // len(batch))
    batch_stream = sender.send(command, batch_metadata, batch_payload) * batch_frames

    def receive_batches() -> float:
        _, broker = connected_pair()
        broker.receive_data(batch_stream)
        messages = 0
        while (event := broker.next_event()) is not NEED_DATA:
            messages += len(unpack_messages(event.metadata, event.payload))  # type: ignore[union-attr]
        return messages

    return [
        measure("frame send (1 msg)", "frames/s", opts.rounds, send),
        measure("frame receive (1 msg)", "frames/s", opts.rounds, receive),
        measure("frame receive batch 1000 + unpack", "msg/s", opts.rounds, receive_batches),
    ]


def render(results: Sequence[Result]) -> str:
    width = max(len(r.name) for r in results)
    lines = [
        f"{'benchmark':<{width}}  {'unit':<9}  {'rounds':>6}  {'median':>12}  {'p10':>12}  "
        f"{'best':>12}",
        "-" * (width + 62),
    ]
    lines.extend(
        f"{r.name:<{width}}  {r.unit:<9}  {r.rounds:>6}  {r.median:>12,.0f}  {r.p10:>12,.0f}"
        f"  {r.best:>12,.0f}"
        for r in results
    )
    return "\n".join(lines)


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def profile(which: str, opts: Options) -> None:
    from magnetar.codec import SingleMessage, build_batch, unpack_messages

    rng = random.Random(opts.seed)
    messages = [SingleMessage(b, sequence_id=100_000 + i) for i, b in enumerate(records(1000, rng))]
    metadata, payload = build_batch(messages, producer_name="bench", publish_time=1)
    calls = max(1, opts.messages_per_round // 1000)
    actions: dict[str, Callable[[], object]] = {
        "build": lambda: [
            build_batch(messages, producer_name="b", publish_time=1) for _ in range(calls)
        ],
        "parse": lambda: [unpack_messages(metadata, payload) for _ in range(calls)],
        "receive": lambda: frame_benchmarks(opts, rng),
    }
    profiler = cProfile.Profile()
    profiler.runcall(actions[which])
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Runnable from a checkout without installing: the repository root holds `codec`.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    opts = options_from(args)
    if args.profile:
        profile(args.profile, opts)
        return 0
    rng = random.Random(opts.seed)
    results = batch_benchmarks(opts, rng)
    results += compression_benchmarks(opts, rng)
    results += frame_benchmarks(opts, rng)
    print(render(results))
    by_name = {r.name: r for r in results}
    verdicts = {
        name: by_name[name].median >= TARGET_MESSAGES_PER_S
        for name in ("build batch 1000", "parse batch 1000")
    }
    for name, met in verdicts.items():
        print(f"target {TARGET_MESSAGES_PER_S:,} msg/s for {name}: {'met' if met else 'NOT met'}")
    if args.json:
        report = {
            "benchmark": "codec",
            "parameters": {
                **asdict(opts),
                "message_size_bytes": MESSAGE_SIZE_BYTES,
                "quick": args.quick,
            },
            "git_commit": git_commit(),
            "python": sys.version,
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "results": [asdict(r) for r in results],
            "target_messages_per_s": TARGET_MESSAGES_PER_S,
            "target_met": verdicts,
        }
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
