"""Deduplication of the official client's batches (issue 9, item 1): its batched SENDs state
no highest sequence id, so the broker takes it from the batch. A producer with the same name
then learns the batch's last id -- on the running broker, after a clean restart and after
kill -9 (the tail replayed) -- and resending stores nothing twice."""

from __future__ import annotations

import signal
import uuid

import pulsar
import pytest

from .conftest import BrokerFactory, new_client, read_everything

pytestmark = pytest.mark.interop

PRODUCER_NAME = "batching-p"
BATCH_MESSAGES = 100
BATCH_DELAY_MS = 50  # long enough for all the send_async calls to land in one batch


def _send_one_batch(url: str, topic: str, first: int) -> None:
    """Ids first..first+99 with send_async, asserted to be stored as one batch entry."""
    client = new_client(url)
    try:
        producer = client.create_producer(
            topic, producer_name=PRODUCER_NAME, batching_enabled=True,
            batching_max_messages=BATCH_MESSAGES * 10,
            batching_max_publish_delay_ms=BATCH_DELAY_MS)
        ids: list[pulsar.MessageId] = []
        for sequence_id in range(first, first + BATCH_MESSAGES):
            producer.send_async(f"b-{sequence_id}".encode(),
                                lambda result, message_id: ids.append(message_id),
                                sequence_id=sequence_id)
        producer.flush()
        assert len({(i.ledger_id(), i.entry_id()) for i in ids}) == 1, "not one batch"
    finally:
        client.close()


def _resume(url: str, topic: str, expected_last: int) -> None:
    """A new producer with the same name sees `expected_last`, and resending ids up to it
    is answered as a duplicate."""
    client = new_client(url)
    try:
        producer = client.create_producer(topic, producer_name=PRODUCER_NAME,
                                          batching_enabled=False)
        assert producer.last_sequence_id() == expected_last
        for sequence_id in (expected_last - 1, expected_last):
            again = producer.send(b"again", sequence_id=sequence_id)
            assert (again.ledger_id(), again.entry_id()) == (-1, -1)
    finally:
        client.close()


def test_batch_last_id_survives_running_restart_and_kill(broker_factory: BrokerFactory) -> None:
    process = broker_factory("broker_deduplication_enabled=true")
    topic = f"persistent://public/default/dedup-batches-{uuid.uuid4().hex[:8]}"
    _send_one_batch(process.url, topic, 0)
    _resume(process.url, topic, BATCH_MESSAGES - 1)  # the running broker

    assert process.stop(signal.SIGTERM) == 0
    process.start()
    _resume(process.url, topic, BATCH_MESSAGES - 1)  # a clean restart: the snapshot

    _send_one_batch(process.url, topic, BATCH_MESSAGES)
    process.kill()
    process.start()
    _resume(process.url, topic, 2 * BATCH_MESSAGES - 1)  # kill -9: the tail replayed

    expected = [f"b-{i}".encode() for i in range(2 * BATCH_MESSAGES)]
    assert read_everything(process.url, topic) == expected
