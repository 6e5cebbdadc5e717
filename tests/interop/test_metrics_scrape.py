"""`/metrics` of a standalone broker under load from the official client: the rates and
throughputs move while messages flow and fall back to zero once they stop, the managed
ledger's buckets carry Pulsar's names, and the engine's own histograms count the fsyncs.
Every scrape is parsed with prometheus_client's parsers."""

from __future__ import annotations

import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from . import HOST, BrokerProcess, HttpBrokerProcess, wait_for
from .conftest import new_client

pytestmark = pytest.mark.interop

LOAD_DEADLINE_S = 30.0  # for an interval (1 s) to see traffic and a scrape to show it
PAYLOAD = b"m" * 300  # an entry of 129..512 bytes with its metadata

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, accept: str | None = None) -> tuple[str, str]:
    """(Content-Type, text) of a GET /metrics."""
    headers = {"Accept": accept} if accept else {}
    request = urllib.request.Request(f"http://{HOST}:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()


def samples_of(text: str, *, openmetrics: bool = False) -> Samples:
    parser = openmetrics_families if openmetrics else text_string_to_metric_families
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in parser(text) for s in family.samples}


def topic_value(samples: Samples, name: str, topic: str, **extra: str) -> float:
    """The sample of `name` for the topic (and subscription...), 0 when not written yet."""
    labels = frozenset({"cluster": "standalone", "namespace": "public/default",
                        "topic": topic, **extra}.items())
    return samples.get((name, labels), 0.0)


@pytest.fixture
def metrics_broker(tmp_path: Path) -> Iterator[tuple[BrokerProcess, int]]:
    """A broker whose stats interval is 1 s, with its admin API on a known port."""
    process = HttpBrokerProcess(tmp_path / "data", tmp_path / "broker.log",
                                config=("stats_update_frequency_s=1",))
    process.start()  # (ready once its log says the admin API listens)
    yield process, process.http_port
    process.cleanup()


class Load:
    """A producer and a consumer of one topic, each in its own thread until stopped."""

    def __init__(self, url: str, topic: str):
        self.client = new_client(url)
        self.consumer = self.client.subscribe(topic, "watch",
                                              consumer_type=pulsar.ConsumerType.Shared)
        self.producer = self.client.create_producer(topic, batching_enabled=False)
        self.stop = threading.Event()
        self.produced = threading.Event()  # set once the producer thread has ended
        self.sent = self.received = 0
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(self._produce,)),
                        threading.Thread(target=self._guard, args=(self._consume,))]
        for thread in self.threads:
            thread.start()

    def _guard(self, work: object) -> None:
        try:
            work()  # type: ignore[operator]
        except BaseException as exc:
            self.errors.append(exc)

    def _produce(self) -> None:
        while not self.stop.is_set():
            self.producer.send(PAYLOAD)  # each send waits for its receipt
            self.sent += 1

    def _consume(self) -> None:
        # Until the producer has ended, not just been told to stop: its last send may still
        # be under way, and `sent` counts it only once the send returns.
        while not self.produced.is_set() or self.received < self.sent:
            try:
                message = self.consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            self.consumer.acknowledge(message)
            self.received += 1

    def close(self) -> None:
        self.stop.set()
        producing, consuming = self.threads
        producing.join(timeout=30)
        self.produced.set()
        consuming.join(timeout=30)
        self.client.close()
        assert self.errors == []


def test_rates_move_under_load_and_fall_back_when_idle(
        metrics_broker: tuple[BrokerProcess, int]) -> None:
    process, http_port = metrics_broker
    topic = f"persistent://public/default/metrics-{uuid.uuid4().hex[:8]}"
    rates = ("pulsar_rate_in", "pulsar_rate_out", "pulsar_throughput_in",
             "pulsar_throughput_out")
    load = Load(process.url, topic)
    try:
        def all_moving() -> Samples | None:
            samples = samples_of(scrape(http_port)[1])
            moving = all(topic_value(samples, name, topic) > 0 for name in rates) and \
                topic_value(samples, "pulsar_subscription_msg_rate_out", topic,
                            subscription="watch") > 0
            return samples if moving else None

        busy = wait_for(all_moving, LOAD_DEADLINE_S, "the rates to move")
    finally:
        load.close()
    assert load.sent > 0
    # Throughput is rate times entry size: the entries here are PAYLOAD plus metadata.
    rate_in = topic_value(busy, "pulsar_rate_in", topic)
    throughput_in = topic_value(busy, "pulsar_throughput_in", topic)
    assert len(PAYLOAD) < throughput_in / rate_in < 512
    # That interval's entries fell in Pulsar's 128..512 B bucket, each one.
    entries = topic_value(busy, "pulsar_entry_size_count", topic)
    assert entries > 0
    assert topic_value(busy, "pulsar_entry_size_le_512", topic) == entries
    latency_buckets = ("le_0_5", "le_1", "le_5", "le_10", "le_20", "le_50", "le_100",
                       "le_200", "le_1000", "overflow")
    assert sum(topic_value(busy, f"pulsar_storage_write_latency_{b}", topic)
               for b in latency_buckets) == \
        topic_value(busy, "pulsar_storage_write_latency_count", topic) > 0
    cluster = frozenset({("cluster", "standalone")})
    # Under load a scrape may fall between a group commit's two observations (its fsync's
    # latency, then its record count): the counts agree once idle, below.
    assert busy[("magnetar_journal_fsync_latency_seconds_count", cluster)] > 0
    assert busy[("magnetar_journal_group_commit_records_count", cluster)] > 0
    assert busy[("process_resident_memory_bytes", frozenset())] > 0

    # With no more traffic the next full interval brings every rate back to zero, while
    # the totals stay.
    def all_idle() -> Samples | None:
        samples = samples_of(scrape(http_port)[1])
        return samples if all(topic_value(samples, name, topic) == 0
                              for name in rates) else None

    idle = wait_for(all_idle, LOAD_DEADLINE_S, "the rates to fall back to 0")
    assert topic_value(idle, "pulsar_in_messages_total", topic) == load.sent
    assert topic_value(idle, "pulsar_out_messages_total", topic, subscription="watch") == \
        load.received == load.sent
    assert idle[("magnetar_journal_group_commit_records_count", cluster)] == \
        idle[("magnetar_journal_fsync_latency_seconds_count", cluster)]

    content_type, text = scrape(http_port, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert topic_value(samples_of(text, openmetrics=True), "pulsar_in_messages_total",
                       topic) == load.sent
