"""Corrupt stored entries as the official client sees them (issue 10, item 2).

Bytes flipped in an entry log used to kill the dispatcher inside the event loop: consumers
silently stopped (700 of 4,500 delivered) and nothing said why. Now the topic is marked
failed: its consumers are closed, a new subscription fails at once with NotAllowedError,
the topic's stats say why, and other topics keep working. The broker runs in-process (so the
test can find the entry's bytes), served on loopback to the official client.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.storage._entry_log import entry_log_name, split_location

from .in_process import InProcessBroker

pytestmark = pytest.mark.interop

BAD = "persistent://public/default/corrupt"
GOOD = "persistent://public/default/healthy"
MESSAGES = 200
RECEIVE_TIMEOUT_MS = 10_000
ANSWER_WITHIN_S = 10.0
SILENT_AFTER_MS = 2_000


@pytest.fixture
def in_process_broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "data")
    try:
        yield broker
    finally:
        broker.stop()


def _flip_stored_entry(broker: InProcessBroker, ledger_id: int, entry_id: int) -> str:
    """Flip bytes inside one stored entry record (after a checkpoint put it in an entry
    log); returns the entry log's path."""
    broker.storage.checkpoint()
    [(_, location)] = broker.storage.index.locations(ledger_id, entry_id, entry_id)
    log_id, offset = split_location(location)
    path = os.path.join(broker.storage.entry_log_dir, entry_log_name(log_id))
    with open(path, "r+b") as handle:
        handle.seek(offset + 30)
        data = handle.read(4)
        handle.seek(offset + 30)
        handle.write(bytes(b ^ 0xFF for b in data))
    return path


def _stats(broker: InProcessBroker, topic: str) -> dict[str, object]:
    path = topic.replace("persistent://", "/admin/v2/persistent/") + "/stats"
    with urllib.request.urlopen(broker.admin.url + path, timeout=10) as answer:
        stats: dict[str, object] = json.loads(answer.read())
    return stats


def _receive_until_silent(consumer: pulsar.Consumer) -> int:
    received = 0
    while True:
        try:
            consumer.receive(timeout_millis=SILENT_AFTER_MS)
        except pulsar.Timeout:
            return received
        received += 1


def test_corrupt_entry_log_gives_consumers_an_error_not_silence(
        in_process_broker: InProcessBroker) -> None:
    broker = in_process_broker
    client = pulsar.Client(broker.url, operation_timeout_seconds=15,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        for topic in (BAD, GOOD):
            client.subscribe(topic, "sub",
                             initial_position=pulsar.InitialPosition.Earliest).close()
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(MESSAGES):
                producer.send(f"m{i}".encode())
            producer.close()
        ledger_id = broker.storage.list_ledgers()[0].ledger_id  # BAD's first ledger
        path = _flip_stored_entry(broker, ledger_id, MESSAGES // 2)
        broker.call(broker.service.unload_topic(BAD))  # no cached entries: read the file
        consumer = client.subscribe(BAD, "sub", initial_position=pulsar.InitialPosition.Earliest)
        assert _receive_until_silent(consumer) == MESSAGES // 2  # up to the damaged entry
        stats = _stats(broker, BAD)
        assert path in str(stats["storageFailure"])
        began = time.monotonic()
        with pytest.raises(pulsar.NotAllowedError):
            client.subscribe(BAD, "another")
        assert time.monotonic() - began < ANSWER_WITHIN_S
        healthy = client.subscribe(GOOD, "sub", initial_position=pulsar.InitialPosition.Earliest)
        got = [healthy.receive(timeout_millis=RECEIVE_TIMEOUT_MS).data()
               for _ in range(MESSAGES)]
        assert got == [f"m{i}".encode() for i in range(MESSAGES)]
        assert _stats(broker, GOOD)["storageFailure"] is None
    finally:
        client.close()
