"""`magnetar perf produce|consume`: load and latency through the official Pulsar client.

Theory of operation
-------------------
Produce: the producers (`producers_per_topic` on each topic) are created first; one sender
thread releases messages as the `Pacer` allows and hands them to the producers in turn with
`send_async`, at most `max_pending` unreceipted per producer (a semaphore per producer,
released by the receipt callback). The callback, on a client thread, records the publish
latency: receipt time minus the message's intended send time when rate-limited (so a stall
counts against every message it delayed: coordinated omission corrected), minus the time of
the `send_async` call at full speed (rate 0). Each message carries its wall-clock send time
(`time.time_ns()`) in the `perf-sent-ns` property, for consumers on the same host.

Consume: `consumers_per_topic` consumers on each topic with a message listener, which
records the end-to-end latency, receive wall time minus the `perf-sent-ns` property (the
publish timestamp, millisecond resolution, for messages from other producers), and
acknowledges. Past `messages` it neither counts nor acknowledges: those stay for a next run.

Both: the calling thread reports, a live line every `report_interval_s` (msg/s and MB/s of
that interval, its latency p50/p99/p99.9/max), until the count is done, the duration is up or
Ctrl-C (KeyboardInterrupt) arrives; then sending stops, receipts still pending are awaited
up to DRAIN_DEADLINE_S, the producers or consumers are closed and the result (the summary so
far, when interrupted) is returned. The engine takes a client and never closes it.

The latencies are the Python client's as a Python program sees them: a callback waits for
the GIL while the sender thread holds it, and that wait is part of what is measured.
MB means 2**20 bytes.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from ._perf_recorder import LatencyRecorder, Pacer, RecorderInterval

__all__ = ["SEND_TIME_PROPERTY", "ConsumeOptions", "PerfResult", "ProduceOptions",
           "run_consume", "run_produce", "topic_names"]

SEND_TIME_PROPERTY = "perf-sent-ns"  # the wall-clock send time, ns since the epoch
MB = 1024 * 1024
DRAIN_DEADLINE_S = 30.0  # after the end, for the receipts still pending
SLOT_POLL_S = 0.1  # a sender waiting for a pending slot looks for a stop this often
INTERVALS_KEPT_MAX = 3600  # interval records kept for the JSON (the latest ones)
LIVE_PERCENTILES = (50.0, 99.0, 99.9)
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "KeyShared")
INITIAL_POSITIONS = ("Latest", "Earliest")


@dataclass(frozen=True)
class ProduceOptions:
    topics: tuple[str, ...]
    rate_per_s: float = 100.0  # all producers together; 0: as fast as they go
    message_bytes: int = 1024
    batching: bool = True
    batch_max_messages: int = 1000
    batch_max_delay_ms: int = 1
    producers_per_topic: int = 1
    max_pending: int = 1000  # unreceipted sends per producer
    messages: int = 0  # in all; 0: no limit
    duration_s: float = 0.0  # 0: no limit
    report_interval_s: float = 1.0


@dataclass(frozen=True)
class ConsumeOptions:
    topics: tuple[str, ...]
    subscription: str = "sub"
    subscription_type: str = "Exclusive"  # one of SUBSCRIPTION_TYPES
    initial_position: str = "Latest"  # one of INITIAL_POSITIONS
    consumers_per_topic: int = 1
    receiver_queue_size: int = 1000
    messages: int = 0  # in all; 0: no limit
    duration_s: float = 0.0  # 0: no limit
    report_interval_s: float = 1.0


@dataclass
class PerfResult:
    """A run's outcome; `document()` is the JSON, `summary()` the closing lines."""

    command: str  # "produce" or "consume"
    options: dict[str, Any]
    messages: int  # receipted (produce) or received (consume)
    bytes: int
    failed: int  # sends the broker or the client refused
    unconfirmed: int  # sends without a receipt by the drain deadline
    seconds: float  # from the start to the last message (or to the end, when none came)
    latency_ms: dict[str, float]
    latency_measured: str  # what the latency is the time between
    latency_relative_error: float
    intervals: list[dict[str, Any]]
    interrupted: bool
    first_failure: str | None = None

    @property
    def msg_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0

    def document(self) -> dict[str, Any]:
        document = asdict(self)
        document.update(msg_per_s=self.msg_per_s, mb_per_s=self.mb_per_s)
        return document

    def summary(self) -> str:
        verb = "receipted" if self.command == "produce" else "received"
        head = (f"perf {self.command}: {self.messages:,} messages {verb} "
                f"({self.bytes / MB:,.3f} MB) in {self.seconds:,.3f} s: "
                f"{self.msg_per_s:,.1f} msg/s, {self.mb_per_s:,.3f} MB/s")
        if self.command == "produce":
            head += f"; {self.failed} failed"
            if self.first_failure:
                head += f" (first: {self.first_failure})"
            if self.unconfirmed:
                head += f", {self.unconfirmed} without a receipt"
        if self.interrupted:
            head += "; interrupted"
        figures = " ".join(f"{name} {value:,.3f}" for name, value in self.latency_ms.items()
                           if name != "count")
        return f"{head}\n  latency ms ({self.latency_measured}): {figures}"


def topic_names(topic: str, count: int) -> tuple[str, ...]:
    """The topics of a run: `topic` itself, or topic-0 .. topic-(count-1)."""
    return (topic,) if count == 1 else tuple(f"{topic}-{i}" for i in range(count))


def _pulsar() -> Any:
    import importlib

    return importlib.import_module("pulsar")


# -- reporting ------------------------------------------------------------------------------

def _interval_record(elapsed_s: float, interval: RecorderInterval) -> dict[str, Any]:
    rate = interval.messages / interval.seconds if interval.seconds > 0 else 0.0
    mb = interval.bytes / MB / interval.seconds if interval.seconds > 0 else 0.0
    histogram = interval.histogram
    latency = histogram.summary_ms(LIVE_PERCENTILES)
    return {"t_s": round(elapsed_s, 3), "messages": interval.messages, "msg_per_s": rate,
            "mb_per_s": mb, "latency_ms": {name: latency[name]
                                           for name in ("p50", "p99", "p99.9", "max")}}


def _live_line(command: str, record: dict[str, Any], extra: str) -> str:
    latency = record["latency_ms"]
    return (f"[{record['t_s']:8.1f} s] {command} {record['msg_per_s']:11,.1f} msg/s "
            f"{record['mb_per_s']:8.3f} MB/s | latency ms p50 {latency['p50']:.3f} "
            f"p99 {latency['p99']:.3f} p99.9 {latency['p99.9']:.3f} "
            f"max {latency['max']:.3f} | {extra}")


class _Run:
    """What the reporting loop needs of a produce or consume run."""

    command = ""

    def __init__(self, report_interval_s: float, duration_s: float):
        self.recorder = LatencyRecorder(time.monotonic)
        self.finished = threading.Event()  # the run reached its end by itself
        self.report_interval_s = report_interval_s
        self.duration_s = duration_s
        self.started_s = time.monotonic()
        self.intervals: deque[dict[str, Any]] = deque(maxlen=INTERVALS_KEPT_MAX)

    def extra(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop sending or counting (idempotent)."""
        raise NotImplementedError

    def drive(self, live: TextIO | None) -> bool:
        """Report until the run finishes, the duration is up or Ctrl-C; stop the run.
        Returns whether Ctrl-C ended it."""
        end = self.started_s + self.duration_s if self.duration_s else math.inf
        next_tick = self.started_s + self.report_interval_s
        interrupted = False
        try:
            while not self.finished.is_set():
                now = time.monotonic()
                if now >= end:
                    break
                if now >= next_tick:
                    self._report(live)
                    next_tick += self.report_interval_s
                    if next_tick <= now:  # the reporter fell behind: skip, don't burst
                        next_tick = now + self.report_interval_s
                    continue
                self.finished.wait(min(next_tick, end) - now)
        except KeyboardInterrupt:
            interrupted = True
        self.stop()
        return interrupted

    def _report(self, live: TextIO | None) -> None:
        interval = self.recorder.take_interval()
        record = _interval_record(time.monotonic() - self.started_s, interval)
        self.intervals.append(record)
        if live is not None:
            print(_live_line(self.command, record, self.extra()), file=live, flush=True)

    def result(self, options: Any, interrupted: bool, measured: str, failed: int = 0,
               unconfirmed: int = 0, first_failure: str | None = None) -> PerfResult:
        """Fold in the last partial interval and sum the run up."""
        ended_s = time.monotonic()
        last = self.recorder.take_interval()
        if last.messages:
            self.intervals.append(_interval_record(ended_s - self.started_s, last))
        recorder = self.recorder
        until = recorder.last_record_s if recorder.last_record_s is not None else ended_s
        return PerfResult(
            command=self.command, options=asdict(options), messages=recorder.total_messages,
            bytes=recorder.total_bytes, failed=failed, unconfirmed=unconfirmed,
            seconds=max(0.0, until - self.started_s), latency_ms=recorder.total.summary_ms(),
            latency_measured=measured,
            latency_relative_error=recorder.total.relative_error,
            intervals=list(self.intervals), interrupted=interrupted,
            first_failure=first_failure)


# -- produce --------------------------------------------------------------------------------

class _ProduceRun(_Run):
    command = "produce"

    def __init__(self, pulsar: Any, producers: list[Any], options: ProduceOptions):
        super().__init__(options.report_interval_s, options.duration_s)
        self.ok = pulsar.Result.Ok
        self.producers = producers
        self.options = options
        self.payload = os.urandom(options.message_bytes)  # random: compression can't flatter
        self.slots = [threading.Semaphore(options.max_pending) for _ in producers]
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # guards the counts below
        self.sent = 0
        self.pending = 0
        self.failed = 0
        self.first_failure: str | None = None
        self.sender_done = False
        self.error: Exception | None = None  # what ended the sender early
        self.thread = threading.Thread(target=self._send_loop, name="perf-sender", daemon=True)

    def extra(self) -> str:
        with self.lock:
            return f"sent {self.sent:,} pending {self.pending:,} failed {self.failed:,}"

    def stop(self) -> None:
        self.stopping.set()

    def _take_slot(self, which: int) -> bool:
        while not self.slots[which].acquire(timeout=SLOT_POLL_S):
            if self.stopping.is_set():
                return False
        return True

    def _send_loop(self) -> None:
        options = self.options
        pacer = Pacer(options.rate_per_s, time.perf_counter_ns, self.stopping.wait)
        try:
            index = 0
            while not self.stopping.is_set() and (not options.messages
                                                  or index < options.messages):
                which = index % len(self.producers)
                intended_ns = pacer.next()
                if intended_ns is None or not self._take_slot(which):
                    break
                start_ns = intended_ns if options.rate_per_s else time.perf_counter_ns()
                if not self._send(which, start_ns):
                    break
                index += 1
            for producer in self.producers:
                producer.flush()
        except Exception as error:  # the client's: reported by run_produce
            self.error = self.error or error
        finally:
            with self.lock:
                self.sender_done = True
                if self.pending == 0:
                    self.finished.set()

    def _send(self, which: int, start_ns: int) -> bool:
        with self.lock:
            self.sent += 1
            self.pending += 1
        try:
            self.producers[which].send_async(
                self.payload, functools.partial(self._on_receipt, which, start_ns),
                properties={SEND_TIME_PROPERTY: str(time.time_ns())})
        except Exception as error:  # the client refused it: end the run, say why
            with self.lock:
                self.sent -= 1
                self.pending -= 1
            self.slots[which].release()
            self.error = error
            return False
        return True

    def _on_receipt(self, which: int, start_ns: int, result: Any, _message_id: Any) -> None:
        now_ns = time.perf_counter_ns()
        if result == self.ok:
            self.recorder.record((now_ns - start_ns) // 1000, self.options.message_bytes)
        self.slots[which].release()
        with self.lock:
            if result != self.ok:
                self.failed += 1
                self.first_failure = self.first_failure or str(result)
            self.pending -= 1
            if self.sender_done and self.pending == 0:
                self.finished.set()

    def drain(self) -> int:
        """Wait up to DRAIN_DEADLINE_S for the sender to end and the receipts to come in;
        how many sends are still without a receipt."""
        self.finished.wait(DRAIN_DEADLINE_S)
        with self.lock:
            return self.pending


def run_produce(client: Any, options: ProduceOptions, live: TextIO | None = None,
                ) -> PerfResult:
    """Publish as `options` says through `client` (the official client's `pulsar.Client`,
    left open), printing a live line to `live` each interval.

    Raises:
        pulsar.PulsarException: a producer could not be created, or the client refused a
            send (the producers made are closed; nothing is summed up).
    """
    pulsar = _pulsar()
    producers: list[Any] = []
    try:
        for topic in options.topics:
            for _ in range(options.producers_per_topic):
                producers.append(client.create_producer(  # noqa: PERF401 (closed if one fails)
                    topic, batching_enabled=options.batching,
                    batching_max_messages=options.batch_max_messages,
                    batching_max_publish_delay_ms=options.batch_max_delay_ms,
                    max_pending_messages=options.max_pending, block_if_queue_full=True))
        run = _ProduceRun(pulsar, producers, options)
        run.thread.start()
        interrupted = run.drive(live)
        unconfirmed = run.drain()
        if run.error is not None:
            raise run.error
    finally:
        for producer in producers:
            _close_quietly(pulsar, producer)
    measured = ("receipt - intended send time (rate-limited)" if options.rate_per_s
                else "receipt - send_async call")
    return run.result(options, interrupted, measured, run.failed, unconfirmed,
                      run.first_failure)


def _close_quietly(pulsar: Any, closable: Any) -> None:
    try:
        closable.close()
    except pulsar.PulsarException:
        pass  # already closed by the client (its connection went away)


# -- consume --------------------------------------------------------------------------------

class _ConsumeRun(_Run):
    command = "consume"

    def __init__(self, options: ConsumeOptions):
        super().__init__(options.report_interval_s, options.duration_s)
        self.limit = options.messages
        self.lock = threading.Lock()  # guards the count and `closed`
        self.received = 0
        self.closed = False

    def extra(self) -> str:
        with self.lock:
            return f"received {self.received:,}"

    def stop(self) -> None:
        with self.lock:
            self.closed = True

    def listener(self, consumer: Any, message: Any) -> None:
        now_ns = time.time_ns()
        with self.lock:
            if self.closed or (self.limit and self.received >= self.limit):
                return  # not acknowledged: left for a next run
            self.received += 1
            self.recorder.record((now_ns - _sent_ns(message)) // 1000, len(message.data()))
            last = self.received == self.limit
        consumer.acknowledge(message)
        if last:
            self.finished.set()


def _sent_ns(message: Any) -> int:
    """When `message` was sent: its perf-sent-ns property, else its publish timestamp."""
    stamp = message.properties().get(SEND_TIME_PROPERTY)
    if stamp is not None:
        try:
            return int(stamp)
        except ValueError:
            pass
    return int(message.publish_timestamp()) * 1_000_000


def run_consume(client: Any, options: ConsumeOptions, live: TextIO | None = None,
                subscribed: Callable[[], None] | None = None) -> PerfResult:
    """Receive and acknowledge as `options` says through `client` (left open), printing a
    live line to `live` each interval; `subscribed` is called once every consumer is.

    Raises:
        pulsar.PulsarException: a consumer could not subscribe (those made are closed).
    """
    pulsar = _pulsar()
    run = _ConsumeRun(options)
    consumers: list[Any] = []
    try:
        for topic in options.topics:
            for _ in range(options.consumers_per_topic):
                consumers.append(client.subscribe(  # noqa: PERF401 (closed if one fails)
                    topic, options.subscription,
                    consumer_type=getattr(pulsar.ConsumerType, options.subscription_type),
                    initial_position=getattr(pulsar.InitialPosition, options.initial_position),
                    receiver_queue_size=options.receiver_queue_size,
                    message_listener=run.listener))
        run.started_s = time.monotonic()
        if subscribed is not None:
            subscribed()
        interrupted = run.drive(live)
    finally:
        run.stop()
        for consumer in consumers:
            _close_quietly(pulsar, consumer)
    measured = "receive - send wall-clock time (perf-sent-ns, else the publish timestamp)"
    return run.result(options, interrupted, measured)
