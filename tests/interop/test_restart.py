"""The broker process's life: start-up time, graceful SIGTERM, SIGKILL in the middle of a
stream, and deduplication across restarts -- each on a private broker subprocess whose data
directory survives the restart."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import pulsar
import pytest

from . import BrokerProcess, wait_for
from .conftest import BrokerFactory, new_client, read_everything

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000
QUIET_MS = 300
STARTUP_S_MAX = 10.0  # an empty data directory, Python start-up included
SIGTERM_EXIT_S_MAX = 5.0
STREAM_MESSAGES = 300
CRASH_AFTER_SENDS = 60
RECEIVED_BEFORE_CRASH = 40
PRODUCER_JOIN_S = 60.0
DRAIN_DEADLINE_S = 30.0


def _topic() -> str:
    return f"persistent://public/default/restart-{uuid.uuid4().hex[:8]}"


def test_startup_time_on_an_empty_data_directory(broker_factory: BrokerFactory) -> None:
    process = broker_factory()
    print(f"start-up to accepting connections: {process.startup_s:.3f} s")
    assert 0 < process.startup_s < STARTUP_S_MAX
    wait_for(lambda: "ready on pulsar://" in process.log_path.read_text(), STARTUP_S_MAX,
             "the ready line (after the admin server)")


def test_sigterm_exits_zero_quickly_and_keeps_the_data(broker_factory: BrokerFactory) -> None:
    process = broker_factory()
    topic = _topic()
    client = new_client(process.url)
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "kept", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(50):
        producer.send(f"t-{i}".encode())
    for _ in range(20):
        consumer.acknowledge(consumer.receive(RECEIVE_MS))
    consumer.close()  # flushes the grouped acks; the producer stays connected
    began = time.monotonic()
    status = process.stop(signal.SIGTERM)  # with the client still connected
    elapsed = time.monotonic() - began
    client.close()
    print(f"SIGTERM to exit: {elapsed:.3f} s")
    assert status == 0, process.log_tail()
    assert elapsed < SIGTERM_EXIT_S_MAX
    assert "stopped cleanly" in process.log_path.read_text()
    process.start()
    assert read_everything(process.url, topic) == [f"t-{i}".encode() for i in range(50)]
    again = new_client(process.url)
    try:
        resumed = again.subscribe(topic, "kept")
        assert resumed.receive(RECEIVE_MS).data() == b"t-20"  # the acks survived
    finally:
        again.close()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_dedup_survives_a_restart(broker_factory: BrokerFactory, how: str) -> None:
    process = broker_factory("broker_deduplication_enabled=true")
    topic = _topic()
    first = new_client(process.url)
    producer = first.create_producer(topic, producer_name="dedup-p")
    assert producer.last_sequence_id() == -1
    for i in range(5):
        producer.send(f"d-{i}".encode())
    first.close()
    process.stop(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
    process.start()
    second = new_client(process.url)
    try:
        producer = second.create_producer(topic, producer_name="dedup-p")
        assert producer.last_sequence_id() == 4
        duplicate = producer.send(b"again-3", sequence_id=3)
        assert (duplicate.ledger_id(), duplicate.entry_id()) == (-1, -1)
        fresh = producer.send(b"d-5")
        assert fresh.entry_id() >= 0
        assert producer.last_sequence_id() == 5
    finally:
        second.close()
    assert read_everything(process.url, topic) == [f"d-{i}".encode() for i in range(6)]


class _Stream:
    """A producer thread that records every send() that returned."""

    def __init__(self, producer: pulsar.Producer):
        self.producer = producer
        self.returned: list[bytes] = []
        self.failures: list[tuple[int, Exception]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for i in range(STREAM_MESSAGES):
            body = f"c-{i}".encode()
            try:
                self.producer.send(body)
            except Exception as exc:  # recorded and asserted on by the test
                self.failures.append((i, exc))
            else:
                self.returned.append(body)


def _drain_until(consumer: pulsar.Consumer, wanted: set[bytes]) -> set[bytes]:
    seen: set[bytes] = set()
    end = time.monotonic() + DRAIN_DEADLINE_S
    while not wanted <= seen:
        assert time.monotonic() < end, f"missing after restart: {sorted(wanted - seen)[:10]}"
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        seen.add(message.data())
        consumer.acknowledge(message)
    return seen


def test_sigkill_mid_stream_loses_nothing_acknowledged(broker_factory: BrokerFactory) -> None:
    process: BrokerProcess = broker_factory()
    topic = _topic()
    client = new_client(process.url)
    try:
        consumer = client.subscribe(topic, "crash", consumer_type=pulsar.ConsumerType.Shared)
        stream = _Stream(client.create_producer(topic, producer_name="crash-p"))
        stream.thread.start()
        before = [consumer.receive(RECEIVE_MS) for _ in range(RECEIVED_BEFORE_CRASH)]
        unacked = {m.data() for m in before[1::2]}
        for message in before[0::2]:
            consumer.acknowledge(message)
        wait_for(lambda: len(stream.returned) >= CRASH_AFTER_SENDS, 20.0, "sends before the crash")
        process.kill()
        assert len(stream.returned) < STREAM_MESSAGES, "the crash came mid-stream"
        process.start()
        stream.thread.join(PRODUCER_JOIN_S)
        assert not stream.thread.is_alive()
        assert not stream.failures, stream.failures[:3]
        after = _drain_until(consumer, (set(stream.returned) - {m.data() for m in before})
                             | unacked)
        assert unacked <= after, "unacked messages were redelivered"
        assert set(stream.returned) <= after | {m.data() for m in before}
    finally:
        client.close()
