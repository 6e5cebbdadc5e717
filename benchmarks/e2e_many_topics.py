"""The many-topics half of `bench_e2e.py` (issue 14, target 5), with the official client against
a `magnetar standalone` subprocess of its own.

Workloads:

* **many producers**: `PRODUCERS` producers on as many topics, one client, no batching, at most
  `PENDING_PER_PRODUCER` sends unreceipted per producer, 1 KB messages, for the scale's
  publish time; aggregate messages/s from the receipts. Compared with one producer on one
  topic measured just before on the same broker, as the side-by-side unbatched publish
  (`e2e_peers`: 1 KB, 1000 pending, the same time).
* **topic creation**: for each of N topics in turn -- subscribe and close the consumer,
  create a producer, send one 100 B message (`send`, so durable), close the producer --
  the issue's sequence. Every `STEP` topics a row: topics so far, seconds so far, the rate
  of that step, and the broker's RSS (`VmRSS`) against the allowance
  `RSS_BASE_MB` + `RSS_PER_TOPIC_KB` per loaded topic. The broker never unloads an
  idle topic, so the loaded topics are the topics created.
* **restart**: the broker is stopped (SIGTERM, the time to exit recorded) and started again
  on the same data directory; time to first serve is from the start of the new process to the
  first topic's message received by a subscription made before the restart (and, apart,
  until its port accepts: the interpreter's start and the data directory's recovery); the
  broker's RSS then.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import pulsar  # type: ignore[import-untyped]
from e2e_peers import Workload, _publish
from send_receipts import ReceiptCount

PRODUCERS = 100
PENDING_PER_PRODUCER = 100
MANY_PRODUCERS_MESSAGE_BYTES = 1024
CREATE_MESSAGE_BYTES = 100
STEP_TOPICS_MAX = 1000  # a row per this many topics (fewer at small scales)
STEPS_MIN = 4
RSS_BASE_MB = 100.0
RSS_PER_TOPIC_KB = 5.0
TARGET_TOPICS_PER_S = {10_000: 60.0, 100_000: 600.0}  # N topics in at most S seconds
TARGET_FIRST_SERVE_S = 1.0
OPERATION_TIMEOUT_S = 60
RECEIVE_TIMEOUT_MS = 30_000
DRAIN_DEADLINE_S = 60.0
SUBSCRIPTION = "first"
MB = 1024 * 1024


class Broker(Protocol):
    """What the workloads need of the broker subprocess (`bench_e2e.BrokerProcess`)."""

    @property
    def url(self) -> str: ...

    @property
    def pid(self) -> int: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class CreationStep:
    topics: int
    seconds: float  # since the first topic
    step_per_s: float  # topics/s over this step
    rss_mb: float
    rss_allowed_mb: float
    rss_anon_mb: float  # of rss_mb: the heap and other private memory, not mapped files


@dataclass
class ManyTopics:
    """The figures of one run (the JSON's `many_topics`)."""

    producers: int = PRODUCERS
    pending_per_producer: int = PENDING_PER_PRODUCER
    many_producers_messages: int = 0
    many_producers_seconds: float = 0.0
    many_producers_per_s: float = 0.0
    single_topic_per_s: float = 0.0  # one producer, 1000 pending, the same broker just before
    topics: int = 0
    creation_seconds: float = 0.0
    creation_per_s: float = 0.0
    steps: list[CreationStep] = field(default_factory=list)
    rss_peak_mb: float = 0.0
    stop_seconds: float = 0.0
    listen_seconds: float = 0.0  # from the new process's start until its port accepts
    first_serve_seconds: float = 0.0
    rss_after_restart_mb: float = 0.0


def rss_mb(pid: int, field_name: str = "VmRSS") -> float:
    """A process's resident set (`VmRSS`), its peak (`VmHWM`) or its anonymous part
    (`RssAnon`: not the pages of mapped files, such as LMDB's), in MB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field_name} in /proc/{pid}/status")


def _client(url: str) -> pulsar.Client:
    return pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _topic(prefix: str, index: int) -> str:
    return f"persistent://public/default/{prefix}-{index}"


# -- many producers ---------------------------------------------------------------------------

class _Pending(ReceiptCount):
    """Receipts of many producers: a slot count per producer, one event for "a slot freed"."""

    def __init__(self, producers: int):
        super().__init__(pulsar.Result.Ok)
        self.free = [PENDING_PER_PRODUCER] * producers
        self.freed = threading.Event()

    def callback_for(self, index: int) -> Callable[[Any, Any], None]:
        def callback(result: Any, _message_id: Any) -> None:
            self.count(result)
            with self.lock:
                self.free[index] += 1
            self.freed.set()
        return callback

    def take(self, index: int) -> bool:
        with self.lock:
            if self.free[index] == 0:
                return False
            self.free[index] -= 1
            return True


def single_topic(url: str, seconds: float, result: ManyTopics) -> None:
    """The side-by-side unbatched publish (one producer, 1000 pending) on this broker, each
    receipt counted by a callback as `many_producers` counts them."""
    workload = Workload("magnetar", "unbatched publish")
    client = _client(url)
    try:
        _publish(client, _topic("single", 0), False, seconds, workload, "callback")
    finally:
        client.close()
    if workload.stalled:
        raise RuntimeError("the single-topic publish stalled")
    result.single_topic_per_s = workload.per_s


def many_producers(url: str, seconds: float, result: ManyTopics) -> None:
    """`PRODUCERS` producers on as many topics from one client, sending round the producers
    while each has a free slot of its `PENDING_PER_PRODUCER`."""
    client = _client(url)
    try:
        producers = [client.create_producer(_topic("many-producers", index),
                                            batching_enabled=False,
                                            max_pending_messages=PENDING_PER_PRODUCER,
                                            block_if_queue_full=True)
                     for index in range(PRODUCERS)]
        pending = _Pending(len(producers))
        callbacks = [pending.callback_for(index) for index in range(len(producers))]
        payload = os.urandom(MANY_PRODUCERS_MESSAGE_BYTES)
        sent = 0
        started = time.perf_counter()
        stop_at = started + seconds
        while time.perf_counter() < stop_at:
            pending.freed.clear()
            progress = False
            for index, producer in enumerate(producers):
                if pending.take(index):
                    producer.send_async(payload, callbacks[index])
                    sent += 1
                    progress = True
            if not progress:
                pending.freed.wait(0.01)
        pending.wait_all(sent, DRAIN_DEADLINE_S)
        for producer in producers:
            producer.close()
    finally:
        client.close()
    result.many_producers_messages = pending.done
    result.many_producers_seconds = pending.last_s - started
    result.many_producers_per_s = pending.done / result.many_producers_seconds


# -- topic creation and restart ---------------------------------------------------------------

def _create_one(client: pulsar.Client, topic: str, payload: bytes) -> None:
    """The issue's per-topic sequence. The subscription stays, so the message is kept."""
    client.subscribe(topic, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Exclusive,
                     initial_position=pulsar.InitialPosition.Earliest).close()
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(payload)
    producer.close()


def step_of(topics: int) -> int:
    """Topics per reported step: `STEP_TOPICS_MAX`, or fewer so that there are at least
    `STEPS_MIN` steps."""
    return max(1, min(STEP_TOPICS_MAX, topics // STEPS_MIN))


def create_topics(broker: Broker, topics: int, result: ManyTopics,
                  on_step: Callable[[CreationStep], None] | None = None) -> None:
    """Create `topics` topics in turn (module comment), a `CreationStep` per `step_of`."""
    payload = os.urandom(CREATE_MESSAGE_BYTES)
    step = step_of(topics)
    client = _client(broker.url)
    try:
        started = last = time.perf_counter()
        for index in range(topics):
            _create_one(client, _topic("created", index), payload)
            done = index + 1
            if done % step == 0 or done == topics:
                now = time.perf_counter()
                row = CreationStep(done, now - started, (done - (result.steps[-1].topics
                                                                  if result.steps else 0))
                                   / (now - last), rss_mb(broker.pid),
                                   RSS_BASE_MB + RSS_PER_TOPIC_KB * done / 1024,
                                   rss_mb(broker.pid, "RssAnon"))
                result.steps.append(row)
                last = now
                if on_step is not None:
                    on_step(row)
    finally:
        client.close()
    result.topics = topics
    result.creation_seconds = result.steps[-1].seconds
    result.creation_per_s = topics / result.creation_seconds
    result.rss_peak_mb = rss_mb(broker.pid, "VmHWM")


def restart(broker: Broker, result: ManyTopics) -> None:
    """Stop the broker, start it again on its data, and time the first topic's first
    message (module comment)."""
    stopping = time.perf_counter()
    broker.stop()
    started = time.perf_counter()
    result.stop_seconds = started - stopping
    broker.start()
    result.listen_seconds = time.perf_counter() - started
    client = _client(broker.url)
    try:
        consumer = client.subscribe(_topic("created", 0), SUBSCRIPTION,
                                    consumer_type=pulsar.ConsumerType.Exclusive)
        consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
        result.first_serve_seconds = time.perf_counter() - started
        consumer.close()
    finally:
        client.close()
    result.rss_after_restart_mb = rss_mb(broker.pid)


def run_many_topics(running_broker: Callable[[], AbstractContextManager[Broker]],
                    topics: int, publish_seconds: float,
                    on_step: Callable[[CreationStep], None] | None = None) -> ManyTopics:
    """Every workload of the module comment on a fresh broker from `running_broker`: the
    topics first (the RSS they cost, without what the publishing workloads leave in the write
    cache and the page cache), the restart, then the publishing workloads beside them."""
    result = ManyTopics()
    with running_broker() as broker:
        create_topics(broker, topics, result, on_step)
        restart(broker, result)
        single_topic(broker.url, publish_seconds, result)
        many_producers(broker.url, publish_seconds, result)
    return result


# -- the report -------------------------------------------------------------------------------

def targets(document: dict[str, Any]) -> Iterator[tuple[str, str, bool]]:
    """(target, measured, met) for each part of target 5 the run measured."""
    many = document["many_topics"]
    single = many["single_topic_per_s"]
    yield (f"{PRODUCERS} producers >= one topic's unbatched ({single:,.0f}/s)",
           f"{many['many_producers_per_s']:,.0f}/s", many["many_producers_per_s"] >= single)
    for count, limit_s in TARGET_TOPICS_PER_S.items():
        row = next((s for s in many["steps"] if s["topics"] == count), None)
        if row is not None:
            yield (f"{count:,} topics in <= {limit_s:.0f} s", f"{row['seconds']:,.1f} s",
                   row["seconds"] <= limit_s)
    worst = max(many["steps"], key=lambda s: s["rss_mb"] - s["rss_allowed_mb"])
    yield (f"RSS <= {RSS_BASE_MB:.0f} MB + {RSS_PER_TOPIC_KB:.0f} KB/topic",
           f"{worst['rss_mb']:,.0f} of {worst['rss_allowed_mb']:,.0f} MB at "
           f"{worst['topics']:,} topics", worst["rss_mb"] <= worst["rss_allowed_mb"])
    yield (f"restart serves the first topic in <= {TARGET_FIRST_SERVE_S:.0f} s",
           f"{many['first_serve_seconds']:.2f} s",
           many["first_serve_seconds"] <= TARGET_FIRST_SERVE_S)


def render_many_topics(document: dict[str, Any],
                       table: Callable[[list[str], list[list[str]], str], str]) -> str:
    many = document["many_topics"]
    rows = [[f"{s['topics']:,}", f"{s['seconds']:,.1f}", f"{s['step_per_s']:,.0f}",
             f"{s['rss_mb']:,.0f}", f"{s['rss_allowed_mb']:,.0f}", f"{s['rss_anon_mb']:,.0f}"]
            for s in many["steps"]]
    creation = table(["topics", "seconds", "topics/s (step)", "RSS MB", "RSS allowed MB",
                      "of RSS: anonymous MB"], rows, "rrrrrr")
    checks = table(["target 5", "measured", "met"],
                   [[name, value, "yes" if met else "NO"]
                    for name, value, met in targets(document)], "lrl")
    return (f"Many topics (its own broker; per topic: subscribe + close, producer, one "
            f"{CREATE_MESSAGE_BYTES} B send, close)\n{creation}\n"
            f"{PRODUCERS} producers x {PENDING_PER_PRODUCER} pending, 1 KB unbatched: "
            f"{many['many_producers_per_s']:,.0f} msg/s (one topic, 1000 pending: "
            f"{many['single_topic_per_s']:,.0f} msg/s); stop {many['stop_seconds']:.2f} s, "
            f"restart to first message {many['first_serve_seconds']:.2f} s (listening after "
            f"{many['listen_seconds']:.2f} s), RSS after restart "
            f"{many['rss_after_restart_mb']:,.0f} MB, peak {many['rss_peak_mb']:,.0f} MB\n"
            + checks)


def plot_many_topics(axes: Any, document: dict[str, Any]) -> None:
    steps = document["many_topics"]["steps"]
    counts = [s["topics"] for s in steps]
    axes.plot(counts, [s["step_per_s"] for s in steps], marker="o", label="topics/s (step)")
    axes.set_xlabel("topics created")
    axes.set_ylabel("topics/s")
    axes.set_title("Topic creation rate and broker RSS")
    memory = axes.twinx()
    memory.plot(counts, [s["rss_mb"] for s in steps], color="tab:red", marker=".",
                label="RSS MB")
    memory.plot(counts, [s["rss_allowed_mb"] for s in steps], color="tab:red",
                linestyle="--", label="RSS allowed MB")
    memory.set_ylabel("MB")
    lines = axes.get_legend_handles_labels()
    more = memory.get_legend_handles_labels()
    axes.legend(lines[0] + more[0], lines[1] + more[1], fontsize="small")
