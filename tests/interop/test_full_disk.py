"""A full disk as the official client sees it (issue 10, item 6).

The broker runs in-process on a thread of its own (its storage on the fault-injecting file
system, which can make every write fail with ENOSPC), served on a loopback port with its admin
API; the test drives it with the official `pulsar-client`. Before the fix a send on a full disk
got SEND_ERROR PersistenceError, which the client treats as a broken connection: it reconnected
and resent in a loop, and a send with a timeout got no answer at all. Now the send fails
promptly with ProducerBlockedQuotaExceededException, health says the disk is full, and once
there is room the same producer publishes again without a broker restart.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.broker import BrokerConfig

from .in_process import InProcessBroker

pytestmark = pytest.mark.interop

TOPIC = "persistent://public/default/full-disk"
SEND_TIMEOUT_MS = 5_000
ANSWER_WITHIN_S = 4.0  # well below the send timeout: the error comes from the broker
RESUME_WITHIN_S = 30.0
CHECK_INTERVAL_S = 0.2
IN_FLIGHT_SENDS = 20


@pytest.fixture
def in_process_broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "data", BrokerConfig(
        storage_full_check_interval_s=CHECK_INTERVAL_S))
    try:
        yield broker
    finally:
        broker.stop()


def _messages(client: pulsar.Client, count: int) -> list[bytes]:
    consumer = client.subscribe(TOPIC, "check", initial_position=pulsar.InitialPosition.Earliest)
    out = [consumer.receive(timeout_millis=10_000).data() for _ in range(count)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)
    consumer.close()
    return out


def test_send_on_a_full_disk_fails_promptly_and_writes_resume(
        in_process_broker: InProcessBroker) -> None:
    broker = in_process_broker
    client = pulsar.Client(broker.url, operation_timeout_seconds=15,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        # A subscription holds the data (no retention otherwise).
        client.subscribe(TOPIC, "check",
                         initial_position=pulsar.InitialPosition.Earliest).close()
        producer = client.create_producer(TOPIC, send_timeout_millis=SEND_TIMEOUT_MS,
                                          batching_enabled=False)
        for i in range(5):
            producer.send(f"m{i}".encode())
        assert broker.health() == (200, "ok")
        broker.fs.fail_writes(errno.ENOSPC)
        began = time.monotonic()
        results: list[pulsar.Result] = []
        for i in range(IN_FLIGHT_SENDS):  # several in flight when the disk fills
            producer.send_async(f"refused{i}".encode(),
                                lambda result, _id: results.append(result))
        while len(results) < IN_FLIGHT_SENDS:
            assert time.monotonic() - began < ANSWER_WITHIN_S, results
            time.sleep(0.01)
        assert set(results) == {pulsar.Result.ProducerBlockedQuotaExceededException}
        status, reason = broker.health()
        assert status == 503
        assert "disk is full" in reason
        # One connection all along: the client was not made to reconnect in a loop.
        assert broker.server.connection_count == 1
        broker.fs.heal()
        deadline = time.monotonic() + RESUME_WITHIN_S
        while broker.service.storage_full:
            assert time.monotonic() < deadline, "writes did not resume"
            time.sleep(CHECK_INTERVAL_S)
        assert broker.health() == (200, "ok")
        # The same producer publishes again once it has reconnected (with backoff).
        deadline = time.monotonic() + RESUME_WITHIN_S
        while True:
            try:
                producer.send(b"m5")
                break
            except pulsar.ProducerBlockedQuotaExceededException:
                assert time.monotonic() < deadline, "the producer did not recover"
                time.sleep(CHECK_INTERVAL_S)
        producer.close()
        assert _messages(client, 6) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    finally:
        client.close()
