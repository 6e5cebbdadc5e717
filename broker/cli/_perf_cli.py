"""`magnetar perf produce|consume`: the command line of the load generator in `_perf`
(pulsar-perf's habit: rate, size, batching, producers/consumers/topics, a live line a
second, a summary and `--json`). The official client is imported only when one runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from ._client_cli import DEFAULT_URL, _check_topic, _client, _pulsar
from ._perf import (
    INITIAL_POSITIONS,
    SUBSCRIPTION_TYPES,
    ConsumeOptions,
    PerfResult,
    ProduceOptions,
    run_consume,
    run_produce,
    topic_names,
)

if TYPE_CHECKING:
    from ._admin_http import SubParsers

__all__ = ["add_perf_command"]

EXIT_FAILED = 1
EXIT_USAGE = 2
TOPICS_MAX = 10_000  # topics one run may spread over
CLIENTS_PER_TOPIC_MAX = 1000  # producers or consumers on each topic


def _number(kind: type[int] | type[float], low: float, high: float = math.inf,
            meaning: str = "") -> Any:
    """An argparse type: a finite int or float from `low` to `high`."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            bound = f"from {low:g} to {high:g}" if math.isfinite(high) else f"{low:g} or more"
            raise argparse.ArgumentTypeError(f"invalid number {text!r}: must be {bound}"
                                             + (f" ({meaning})" if meaning else ""))
        return value

    return parse


def _topic(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", help="the topic (my-topic, tenant/ns/my-topic or a full "
                        "name); with --num-topics N > 1, topics TOPIC-0 .. TOPIC-(N-1)")


def _common(parser: argparse.ArgumentParser, clients: str) -> None:
    parser.add_argument("-u", "--url", default=DEFAULT_URL,
                        help=f"the broker's service URL, any Pulsar broker (default {DEFAULT_URL})")
    parser.add_argument("-t", "--num-topics", type=_number(int, 1, TOPICS_MAX), default=1,
                        metavar="N", help="spread the load over N topics (default 1)")
    parser.add_argument("-n", f"--num-{clients}", type=_number(int, 1, CLIENTS_PER_TOPIC_MAX),
                        default=1, metavar="N", help=f"{clients} on each topic (default 1)")
    parser.add_argument("-m", "--num-messages", type=_number(int, 0), default=0, metavar="N",
                        help="stop after N messages in all (default 0: no limit)")
    parser.add_argument("-d", "--duration-s", type=_number(float, 0), default=0.0,
                        metavar="SECONDS", help="stop after this long (default 0: no limit; "
                        "with neither limit the run ends with Ctrl-C)")
    parser.add_argument("--report-interval-s", type=_number(float, 0.01, 3600), default=1.0,
                        metavar="SECONDS", help="print a live line this often: msg/s, MB/s "
                        "and latency p50/p99/p99.9/max of the interval (default 1)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the "
                        "summary, the options and every interval's figures as JSON to FILE")
    parser.add_argument("--timeout-s", type=_number(float, 1), default=30.0,
                        metavar="SECONDS", help="the client's connection and operation "
                        "timeout (default 30)")
    from ._admin_http import _security_options

    _security_options(parser)


def _add_produce(perf: SubParsers) -> None:
    produce = perf.add_parser(
        "produce", help="publish at a given rate and measure publish latency",
        description="Publish to TOPIC with the official Pulsar client and measure the "
        "publish latency, from the send to the broker's receipt (when rate-limited, from "
        "the time the schedule meant the message to be sent, so a stall counts against "
        "every message it delayed). Each message carries its send time for `perf "
        "consume`. Ctrl-C (or SIGTERM) ends the run with the summary so far (exit 0); "
        "exit 1 when a send failed. MB = 2^20 bytes.")
    _topic(produce)
    produce.add_argument("-r", "--rate", type=_number(float, 0), default=100.0,
                         metavar="MSG_PER_S", help="messages per second, all producers "
                         "together, on a fixed schedule (default 100; 0: as fast as the "
                         "client goes)")
    produce.add_argument("-s", "--size", type=_number(int, 1, 100 * 1024 * 1024),
                         default=1024, metavar="BYTES", help="message payload size, random "
                         "bytes (default 1024)")
    produce.add_argument("-db", "--disable-batching", action="store_true",
                         help="send each message on its own (default: the client batches)")
    produce.add_argument("-bm", "--batch-max-messages", type=_number(int, 1), default=1000,
                         metavar="N", help="at most N messages in a batch (default 1000)")
    produce.add_argument("-b", "--batch-max-delay-ms", type=_number(int, 1), default=1,
                         metavar="MS", help="send a batch after this long even if not full "
                         "(default 1)")
    produce.add_argument("-o", "--max-pending", type=_number(int, 1), default=1000,
                         metavar="N", help="sends awaiting their receipts per producer before "
                         "the sender waits (default 1000)")
    _common(produce, "producers")
    produce.set_defaults(handler=_cmd_produce)


def _add_consume(perf: SubParsers) -> None:
    consume = perf.add_parser(
        "consume", help="receive, acknowledge and measure end-to-end latency",
        description="Subscribe to TOPIC with the official Pulsar client, acknowledge every "
        "message and measure the end-to-end latency: receive time minus send time (the "
        "`perf produce` send time each message carries, else its publish timestamp; both "
        "wall clocks, so on the same host). Messages past --num-messages are not "
        "acknowledged. Ctrl-C (or SIGTERM) ends the run with the summary so far (exit 0); "
        "exit 1 when --duration-s ran out before --num-messages arrived. MB = 2^20 bytes.")
    _topic(consume)
    consume.add_argument("-ss", "--subscription-name", default="sub", metavar="NAME",
                         help="the subscription (default sub)")
    consume.add_argument("-st", "--subscription-type", choices=SUBSCRIPTION_TYPES,
                         default="Exclusive", help="the subscription type (default "
                         "Exclusive, which takes one consumer per topic)")
    consume.add_argument("-sp", "--subscription-position", choices=INITIAL_POSITIONS,
                         default="Latest", help="where a new subscription starts (default "
                         "Latest)")
    consume.add_argument("-q", "--receiver-queue-size", type=_number(int, 1), default=1000,
                         metavar="N", help="messages each consumer prefetches (default 1000)")
    _common(consume, "consumers")
    consume.set_defaults(handler=_cmd_consume)


def add_perf_command(sub: SubParsers) -> None:
    """Register `perf produce|consume` on `magnetar`'s parser."""
    perf = sub.add_parser(
        "perf", help="load test a broker: publish or consume with live rates and latencies",
        description="Load and latency tests against any Pulsar broker through the official "
        "client, in the spirit of pulsar-perf: a live line every --report-interval-s, a "
        "summary at the end (also on Ctrl-C) and --json.")
    commands = perf.add_subparsers(dest="perf_command", required=True, metavar="COMMAND")
    _add_produce(commands)
    _add_consume(commands)


def _topics(args: argparse.Namespace) -> tuple[str, ...]:
    topics = topic_names(args.topic, args.num_topics)
    for topic in topics:
        _check_topic(topic)  # InvalidTopicNameError: main's one line, exit 2
    return topics


def _open_json(path: str | None) -> IO[str] | None:
    """Open --json for writing before the run, so a bad path fails before any work."""
    if path is None:
        return None
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"cannot write --json {path}: {error.strerror or error}") from None


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """During the run, SIGTERM (`timeout`, `kill`) ends it like Ctrl-C: with the summary."""
    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _finish(result: PerfResult, args: argparse.Namespace, out: IO[str] | None) -> None:
    print(result.summary(), flush=True)
    if out is not None:
        with out:
            document = dict(result.document(), url=args.url)
            json.dump(document, out, indent=2)
            out.write("\n")


def _cmd_produce(args: argparse.Namespace) -> int:
    options = ProduceOptions(
        topics=_topics(args), rate_per_s=args.rate, message_bytes=args.size,
        batching=not args.disable_batching, batch_max_messages=args.batch_max_messages,
        batch_max_delay_ms=args.batch_max_delay_ms, producers_per_topic=args.num_producers,
        max_pending=args.max_pending, messages=args.num_messages,
        duration_s=args.duration_s, report_interval_s=args.report_interval_s)
    out = _open_json(args.json)
    pulsar = _pulsar()
    client = _client(pulsar, args)
    if client is None:
        return EXIT_FAILED
    try:
        with _sigterm_as_ctrl_c():
            result = run_produce(client, options, live=sys.stdout)
    except pulsar.PulsarException as error:
        print(f"magnetar perf produce: failed against {args.url}: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        client.close()
    _finish(result, args, out)
    return EXIT_FAILED if result.failed or result.unconfirmed else 0


def _cmd_consume(args: argparse.Namespace) -> int:
    if args.num_consumers > 1 and args.subscription_type == "Exclusive":
        raise argparse.ArgumentTypeError(
            f"--num-consumers {args.num_consumers} needs --subscription-type Shared, "
            "Failover or KeyShared: an Exclusive subscription takes one consumer")
    options = ConsumeOptions(
        topics=_topics(args), subscription=args.subscription_name,
        subscription_type=args.subscription_type,
        initial_position=args.subscription_position,
        consumers_per_topic=args.num_consumers, receiver_queue_size=args.receiver_queue_size,
        messages=args.num_messages, duration_s=args.duration_s,
        report_interval_s=args.report_interval_s)
    out = _open_json(args.json)
    pulsar = _pulsar()
    client = _client(pulsar, args)
    if client is None:
        return EXIT_FAILED

    def subscribed() -> None:
        print(f"perf consume: subscribed {args.num_consumers * len(options.topics)} "
              f"consumer(s) as {args.subscription_name!r}", flush=True)

    try:
        with _sigterm_as_ctrl_c():
            result = run_consume(client, options, live=sys.stdout, subscribed=subscribed)
    except pulsar.PulsarException as error:
        print(f"magnetar perf consume: failed against {args.url}: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        client.close()
    _finish(result, args, out)
    short = options.messages and result.messages < options.messages and not result.interrupted
    if short:
        print(f"magnetar perf consume: {result.messages} of {options.messages} messages "
              f"within {options.duration_s:g} s", file=sys.stderr)
        return EXIT_FAILED
    return 0
