"""Producer access modes (PIP-68) through the official client and the raw protocol: what
the client raises, WaitForExclusive blocking until the topic is free (producer_ready=false,
then true on the same request id), ExclusiveWithFencing evicting, and topic epochs that grow
and survive a restart."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pulsar
import pytest

from magnetar.codec import pb

from . import BrokerProcess, RawClient, wait_for
from .conftest import BrokerFactory, new_client

pytestmark = pytest.mark.interop

Mode = pulsar.ProducerAccessMode
T = pb.BaseCommand
WAIT_DEADLINE_S = 10.0


def _create_in_thread(client: pulsar.Client, topic: str, **options: Any) -> dict[str, Any]:
    """Start create_producer in a thread; the dict gets "producer" or "error"."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["producer"] = client.create_producer(topic, **options)
        except Exception as exc:  # reported to the test through the dict
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_exclusive_refuses_others(client: pulsar.Client, topic: str) -> None:
    first = client.create_producer(topic, access_mode=Mode.Exclusive)
    first.send(b"one")
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)  # Shared
    first.close()
    second = client.create_producer(topic, access_mode=Mode.Exclusive)
    second.send(b"two")
    second.close()


def test_exclusive_refused_while_shared_producers(client: pulsar.Client, topic: str) -> None:
    shared = [client.create_producer(topic) for _ in range(2)]
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    for producer in shared:
        producer.close()
    client.create_producer(topic, access_mode=Mode.Exclusive).close()


def test_wait_for_exclusive_blocks_until_the_topic_is_free(
        broker: BrokerProcess, client: pulsar.Client, topic: str) -> None:
    holder = client.create_producer(topic, access_mode=Mode.Exclusive)
    waiting = _create_in_thread(client, topic, access_mode=Mode.WaitForExclusive)
    # Once the broker has queued it (and answered producer_ready=false), the creation stays
    # blocked while the holder is there.
    wait_for(lambda: f"waits for exclusive access to {topic}" in broker.log_path.read_text(),
             WAIT_DEADLINE_S, "the broker queueing the producer")
    holder.send(b"from the holder")
    assert waiting["thread"].is_alive()
    assert "error" not in waiting
    holder.close()
    waiting["thread"].join(WAIT_DEADLINE_S)
    assert not waiting["thread"].is_alive(), "WaitForExclusive never became ready"
    producer = waiting.get("producer")
    assert producer is not None, waiting.get("error")
    producer.send(b"from the waiter")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(5000).data() for _ in range(2)] == [b"from the holder",
                                                                 b"from the waiter"]
    producer.close()


def test_fencing_evicts_the_old_producer(client: pulsar.Client, topic: str) -> None:
    old = client.create_producer(topic, access_mode=Mode.Exclusive, send_timeout_millis=5000)
    old.send(b"before")
    new = client.create_producer(topic, access_mode=Mode.ExclusiveWithFencing)
    new.send(b"after")
    # The broker closed the old producer; its reconnect presents the old epoch and is
    # refused, which the client reports on the next send.
    with pytest.raises(pulsar.ProducerFenced):
        old.send(b"too late")
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    new.close()


# -- raw protocol ---------------------------------------------------------------------------


def _producer(raw: RawClient, topic: str, producer_id: int, request_id: int, mode: int,
              topic_epoch: int | None = None) -> None:
    request = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=request_id,
                                 producer_access_mode=mode)  # type: ignore[arg-type]
    if topic_epoch is not None:
        request.topic_epoch = topic_epoch
    raw.send(request)


def _success(raw: RawClient) -> pb.CommandProducerSuccess:
    reply: pb.CommandProducerSuccess = raw.expect(T.PRODUCER_SUCCESS).body
    return reply


def _error(raw: RawClient) -> pb.CommandError:
    reply: pb.CommandError = raw.expect(T.ERROR).body
    return reply


@pytest.mark.parametrize("domain", ["persistent", "non-persistent"])
def test_raw_ready_false_then_true_and_epochs(raw: Callable[[], RawClient], topic: str,
                                              domain: str) -> None:
    topic = topic.replace("persistent://", f"{domain}://", 1)
    holder, waiter = raw(), raw()
    holder.handshake()
    waiter.handshake()
    _producer(holder, topic, 1, 10, pb.Exclusive)
    first = _success(holder)
    assert first.producer_ready
    assert first.HasField("topic_epoch")
    assert first.topic_epoch == 0

    _producer(waiter, topic, 7, 70, pb.WaitForExclusive)
    queued = _success(waiter)
    assert (queued.request_id, queued.producer_ready) == (70, False)
    assert not queued.HasField("topic_epoch")

    assert holder.request(pb.CommandCloseProducer(producer_id=1, request_id=11),
                          T.SUCCESS).request_id == 11
    promoted = _success(waiter)
    assert (promoted.request_id, promoted.producer_ready) == (70, True)
    assert promoted.topic_epoch == 1
    assert promoted.producer_name == queued.producer_name

    # A producer presenting an older epoch is fenced even once the topic is free.
    assert waiter.request(pb.CommandCloseProducer(producer_id=7, request_id=71),
                          T.SUCCESS).request_id == 71
    _producer(holder, topic, 2, 12, pb.Exclusive, topic_epoch=0)
    fenced = _error(holder)
    assert (fenced.request_id, fenced.error) == (12, pb.ProducerFenced)
    # Presenting the current epoch (a reconnect) keeps it.
    _producer(holder, topic, 3, 13, pb.Exclusive, topic_epoch=1)
    assert _success(holder).topic_epoch == 1


def test_raw_fencing_closes_and_fails_waiters(raw: Callable[[], RawClient], topic: str) -> None:
    holder, waiter, fencer = raw(), raw(), raw()
    for connection in (holder, waiter, fencer):
        connection.handshake()
    _producer(holder, topic, 1, 10, pb.Exclusive)
    assert _success(holder).topic_epoch == 0
    _producer(waiter, topic, 1, 20, pb.WaitForExclusive)
    assert not _success(waiter).producer_ready
    _producer(fencer, topic, 1, 30, pb.ExclusiveWithFencing)
    assert _success(fencer).topic_epoch == 1
    closed = holder.expect(T.CLOSE_PRODUCER).body
    assert (closed.producer_id, closed.request_id) == (1, 2**64 - 1)
    failed = _error(waiter)
    assert (failed.request_id, failed.error) == (20, pb.ProducerFenced)


def test_raw_waiter_that_closes_leaves_the_queue(raw: Callable[[], RawClient],
                                                 topic: str) -> None:
    holder, waiter, other = raw(), raw(), raw()
    for connection in (holder, waiter, other):
        connection.handshake()
    _producer(holder, topic, 1, 10, pb.Exclusive)
    _success(holder)
    _producer(waiter, topic, 1, 20, pb.WaitForExclusive)
    assert not _success(waiter).producer_ready
    _producer(other, topic, 1, 30, pb.WaitForExclusive)
    assert not _success(other).producer_ready
    waiter.close()  # a disconnect removes it from the queue: the next one is promoted
    holder.request(pb.CommandCloseProducer(producer_id=1, request_id=11), T.SUCCESS)
    promoted = _success(other)
    assert (promoted.request_id, promoted.producer_ready, promoted.topic_epoch) == (30, True, 1)


def test_topic_epoch_survives_kill_9(broker_factory: BrokerFactory, topic: str) -> None:
    process = broker_factory()
    connection = RawClient(process.port)
    try:
        connection.handshake()
        for request_id in (1, 2, 3):  # three exclusive producers in turn: epochs 0, 1, 2
            _producer(connection, topic, request_id, request_id, pb.Exclusive)
            assert _success(connection).topic_epoch == request_id - 1
            connection.request(pb.CommandCloseProducer(producer_id=request_id,
                                                       request_id=100 + request_id), T.SUCCESS)
    finally:
        connection.close()
    process.kill()  # the epoch was recorded durably before each producer was admitted
    process.start()
    connection = RawClient(process.port)
    try:
        connection.handshake()
        _producer(connection, topic, 1, 1, pb.Exclusive, topic_epoch=1)
        assert _error(connection).error == pb.ProducerFenced
        _producer(connection, topic, 2, 2, pb.Exclusive)
        assert _success(connection).topic_epoch == 3
    finally:
        connection.close()
    official = new_client(process.url)
    try:
        producer = wait_for(lambda: official.create_producer(
            topic, access_mode=Mode.WaitForExclusive), WAIT_DEADLINE_S, "the producer")
        producer.send(b"x")
    finally:
        official.close()
