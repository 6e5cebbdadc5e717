"""Readers (non-durable subscriptions with a start message id), `has_message_available`
(GET_LAST_MESSAGE_ID) and seeking by message id and by publish time."""

from __future__ import annotations

import pulsar
import pytest

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000
QUIET_MS = 300
COUNT = 10


def _publish(client: pulsar.Client, topic: str, count: int = COUNT,
             **options: object) -> list[pulsar.MessageId]:
    producer = client.create_producer(topic, **options)  # type: ignore[arg-type]
    ids = [producer.send(f"m-{i}".encode()) for i in range(count)]
    producer.close()
    return ids


def _read_all(reader: pulsar.Reader) -> list[bytes]:
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(RECEIVE_MS).data())
    return out


def test_reader_from_earliest_reads_everything(client: pulsar.Client, topic: str) -> None:
    _publish(client, topic)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert _read_all(reader) == [f"m-{i}".encode() for i in range(COUNT)]
    assert not reader.has_message_available()


def test_reader_on_an_empty_topic_has_nothing(client: pulsar.Client, topic: str) -> None:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    with pytest.raises(pulsar.Timeout):
        reader.read_next(QUIET_MS)


def test_reader_from_a_message_id_starts_after_it(client: pulsar.Client, topic: str) -> None:
    ids = _publish(client, topic)
    reader = client.create_reader(topic, ids[4])
    assert _read_all(reader) == [f"m-{i}".encode() for i in range(5, COUNT)]


def test_inclusive_reader_starts_at_the_message_id(client: pulsar.Client, topic: str) -> None:
    ids = _publish(client, topic)
    reader = client.create_reader(topic, ids[4], start_message_id_inclusive=True)
    assert _read_all(reader) == [f"m-{i}".encode() for i in range(4, COUNT)]


def test_reader_inside_a_batch_skips_the_earlier_messages(client: pulsar.Client,
                                                          topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_publish_delay_ms=50)
    ids: list[pulsar.MessageId] = []
    for i in range(6):
        producer.send_async(f"b-{i}".encode(), lambda _r, mid: ids.append(mid))
    producer.flush()
    assert len({i.entry_id() for i in ids}) == 1, "one batch entry"
    reader = client.create_reader(topic, ids[2])
    assert _read_all(reader) == [b"b-3", b"b-4", b"b-5"]


def test_reader_from_latest_sees_only_new_messages(client: pulsar.Client, topic: str) -> None:
    _publish(client, topic, 3)
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    assert not reader.has_message_available()
    _publish(client, topic, 2)
    assert reader.read_next(RECEIVE_MS).data() == b"m-0"
    assert reader.read_next(RECEIVE_MS).data() == b"m-1"
    assert not reader.has_message_available()


def test_reader_seek_to_earliest(client: pulsar.Client, topic: str) -> None:
    _publish(client, topic, 4)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert _read_all(reader) == [f"m-{i}".encode() for i in range(4)]
    reader.seek(pulsar.MessageId.earliest)
    assert _read_all(reader) == [f"m-{i}".encode() for i in range(4)]


def test_last_message_id_of_a_batch_names_its_last_index(client: pulsar.Client,
                                                         topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_publish_delay_ms=50)
    for i in range(5):
        producer.send_async(f"b-{i}".encode(), None)
    producer.flush()
    consumer = client.subscribe(topic, "last", initial_position=pulsar.InitialPosition.Earliest)
    last = consumer.get_last_message_id()
    received = [consumer.receive(RECEIVE_MS) for _ in range(5)]
    assert (last.ledger_id(), last.entry_id(), last.batch_index()) == (
        received[-1].message_id().ledger_id(), received[-1].message_id().entry_id(), 4)


def test_seek_by_message_id_redelivers_from_there(client: pulsar.Client, topic: str) -> None:
    ids = _publish(client, topic)
    consumer = client.subscribe(topic, "seek", initial_position=pulsar.InitialPosition.Earliest)
    received = [consumer.receive(RECEIVE_MS) for _ in range(COUNT)]
    for message in received:
        consumer.acknowledge(message)
    consumer.seek(ids[3])
    # The broker restarts AT the sought entry and the client drops that one message itself
    # (broker reference §4.7, `testSeekIsByReceive`): the next one is m-4.
    again = [consumer.receive(RECEIVE_MS).data() for _ in range(COUNT - 4)]
    assert again == [f"m-{i}".encode() for i in range(4, COUNT)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)


def test_seek_to_earliest_and_latest(client: pulsar.Client, topic: str) -> None:
    _publish(client, topic, 5)
    consumer = client.subscribe(topic, "ends", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(5):
        consumer.acknowledge(consumer.receive(RECEIVE_MS))
    consumer.seek(pulsar.MessageId.earliest)
    assert [consumer.receive(RECEIVE_MS).data() for _ in range(5)] == [
        f"m-{i}".encode() for i in range(5)]
    consumer.seek(pulsar.MessageId.latest)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)


def test_seek_by_publish_time(client: pulsar.Client, topic: str) -> None:
    _publish(client, topic)
    consumer = client.subscribe(topic, "time", initial_position=pulsar.InitialPosition.Earliest)
    received = [consumer.receive(RECEIVE_MS) for _ in range(COUNT)]
    for message in received:
        consumer.acknowledge(message)
    times = [m.publish_timestamp() for m in received]
    target = times[6]
    first = min(i for i, t in enumerate(times) if t >= target)  # ties share a millisecond
    consumer.seek(target)
    again = [consumer.receive(RECEIVE_MS).data() for _ in range(COUNT - first)]
    assert again == [f"m-{i}".encode() for i in range(first, COUNT)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)
    consumer.seek(times[-1] + 1)  # after every message: nothing
    with pytest.raises(pulsar.Timeout):
        consumer.receive(QUIET_MS)
