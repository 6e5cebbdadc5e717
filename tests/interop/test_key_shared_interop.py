"""Key_Shared through the official client while consumers join and leave: per key, the order
in which messages are first delivered never regresses (PIP-379 draining hashes hold a moved
key back until its old owner acks), and the admin HTTP API shows the Key_Shared consumer
fields (drainingHashes*, keyHashRangeArrays). The broker runs with an admin HTTP port."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pulsar
import pytest

from . import HttpBrokerProcess
from .conftest import new_client

pytestmark = pytest.mark.interop

KEYS = 12
PER_PHASE = 48
POLL_MS = 100
QUIET_ROUNDS = 2


@pytest.fixture(scope="module")
def http_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpBrokerProcess]:
    base = tmp_path_factory.mktemp("key-shared-broker")
    process = HttpBrokerProcess(base / "data", base / "broker.log")
    process.start()
    yield process
    process.cleanup()


@dataclass
class Tracker:
    """First deliveries per key, and what each consumer holds unacknowledged."""

    first: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    seen: set[int] = field(default_factory=set)
    held: dict[int, list[pulsar.Message]] = field(default_factory=lambda: defaultdict(list))

    def poll(self, consumers: list[pulsar.Consumer], acking: set[int]) -> None:
        """Receive from every consumer until all are quiet; consumers whose index is in
        `acking` ack at once, the others hold their messages."""
        quiet = 0
        while quiet < QUIET_ROUNDS:
            got = False
            for consumer in consumers:
                try:
                    message = consumer.receive(POLL_MS)
                except pulsar.Timeout:
                    continue
                got = True
                number = int(message.data())
                if number not in self.seen:
                    self.seen.add(number)
                    self.first[message.partition_key()].append(number)
                if id(consumer) in acking:
                    consumer.acknowledge(message)
                else:
                    self.held[id(consumer)].append(message)
            quiet = 0 if got else quiet + 1

    def release(self, consumer: pulsar.Consumer) -> None:
        for message in self.held.pop(id(consumer), []):
            consumer.acknowledge(message)


def _send_phase(producer: pulsar.Producer, phase: int) -> None:
    for i in range(PER_PHASE):
        number = phase * PER_PHASE + i
        producer.send(str(number).encode(), partition_key=f"k{number % KEYS}")


def _consumer_stats(process: HttpBrokerProcess, topic: str) -> list[dict[str, Any]]:
    local = topic.removeprefix("persistent://")
    stats = process.get_json(f"/admin/v2/persistent/{local}/stats")
    consumers: list[dict[str, Any]] = stats["subscriptions"]["ks"]["consumers"]
    return consumers


def _check_ranges(consumers: list[dict[str, Any]], count: int) -> None:
    assert len(consumers) == count
    ranges = []
    for consumer in consumers:
        for name in ("drainingHashesCount", "drainingHashesClearedTotal",
                     "drainingHashesUnackedMessages", "drainingHashes", "keyHashRangeArrays"):
            assert name in consumer, name
        assert consumer["drainingHashesCount"] == len(consumer["drainingHashes"])
        assert consumer["keyHashRangeArrays"], "every consumer owns some hash ranges"
        ranges += [tuple(r) for r in consumer["keyHashRangeArrays"]]
    ranges.sort()
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end < start, f"overlapping ranges {ranges}"


def test_key_shared_order_and_stats_with_joining_and_leaving_consumers(
        http_broker: HttpBrokerProcess) -> None:
    topic = "persistent://public/default/key-shared-churn"
    client = new_client(http_broker.url)
    try:
        def join(name: str) -> pulsar.Consumer:
            return client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                                    consumer_name=name, receiver_queue_size=20)

        producer = client.create_producer(topic, batching_enabled=False)
        tracker = Tracker()
        c1 = join("c1")
        _send_phase(producer, 0)
        tracker.poll([c1], acking=set())  # c1 holds everything unacked
        c2 = join("c2")
        _send_phase(producer, 1)
        tracker.poll([c1, c2], acking={id(c2)})
        stats = _consumer_stats(http_broker, topic)
        _check_ranges(stats, 2)
        held_by_c1 = next(s for s in stats if s["consumerName"] == "c1")
        assert held_by_c1["drainingHashesCount"] > 0, "c2 took hashes c1 still holds"
        assert held_by_c1["drainingHashesUnackedMessages"] > 0
        tracker.release(c1)  # the draining hashes clear, c2 gets its keys
        tracker.poll([c1, c2], acking={id(c1), id(c2)})
        stats = _consumer_stats(http_broker, topic)
        assert all(s["drainingHashesCount"] == 0 for s in stats)
        assert sum(s["drainingHashesClearedTotal"] for s in stats) > 0
        c3 = join("c3")
        _send_phase(producer, 2)
        # c2's share waits unread in its receiver queue: the application never saw it
        tracker.poll([c1, c3], acking={id(c1), id(c3)})
        _check_ranges(_consumer_stats(http_broker, topic), 3)
        assert len(tracker.seen) < 3 * PER_PHASE, "c2 had a share of phase 2"
        _send_phase(producer, 3)  # c2's keys must wait for its unacked messages
        c2.close()  # they go back to the others, before the newer messages of those keys
        tracker.poll([c1, c3], acking={id(c1), id(c3)})
        _check_ranges(_consumer_stats(http_broker, topic), 2)
        assert tracker.seen == set(range(4 * PER_PHASE))
        for key, numbers in tracker.first.items():
            assert numbers == sorted(numbers), f"key {key} regressed: {numbers}"
    finally:
        client.close()
