"""Readers (non-durable subscriptions with a start message id), `has_message_available`
(GET_LAST_MESSAGE_ID) and seeking by message id and by publish time."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable

import pulsar
import pytest

from magnetar.codec import pb

from . import RawClient, wait_for
from .conftest import BrokerFactory, new_client

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


# -- has_message_available at `latest` (the client decides from the mark-delete position) --------
#
# A reader whose start is `latest` (at creation or after seek(latest)) and that has read nothing
# asks GET_LAST_MESSAGE_ID and compares the subscription's mark-delete position (the last entry
# when the reader was positioned) with the last message id: newer → available, and it reads the
# newer messages. An inclusive reader with nothing newer seeks to the last id and so reads the
# last message (Pulsar's semantics of an inclusive `latest`).

LATE = 2  # messages published after the reader is positioned at `latest`


def _publish_some(client: pulsar.Client, topic: str, prefix: str, count: int,
                  batched: bool) -> None:
    producer = client.create_producer(topic, batching_enabled=batched,
                                      batching_max_publish_delay_ms=50)
    if batched:
        for i in range(count):
            producer.send_async(f"{prefix}-{i}".encode(), None)
        producer.flush()
    else:
        for i in range(count):
            producer.send(f"{prefix}-{i}".encode())
    producer.close()


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_latest_reader_sees_a_later_message_as_available(client: pulsar.Client, topic: str,
                                                         inclusive: bool, batched: bool) -> None:
    _publish_some(client, topic, "old", 3, batched)
    reader = client.create_reader(topic, pulsar.MessageId.latest,
                                  start_message_id_inclusive=inclusive)
    _publish_some(client, topic, "new", LATE, batched)
    assert reader.has_message_available()
    assert _read_all(reader) == [f"new-{i}".encode() for i in range(LATE)]
    assert not reader.has_message_available()


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_latest_reader_before_a_later_message(client: pulsar.Client, topic: str,
                                              inclusive: bool, batched: bool) -> None:
    _publish_some(client, topic, "old", 3, batched)
    reader = client.create_reader(topic, pulsar.MessageId.latest,
                                  start_message_id_inclusive=inclusive)
    # Exclusive: nothing after `latest`. Inclusive: the last message itself (Pulsar's semantics).
    assert reader.has_message_available() == inclusive
    if inclusive:
        assert _read_all(reader) == [b"old-2"]
    with pytest.raises(pulsar.Timeout):
        reader.read_next(QUIET_MS)


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("inclusive", [False, True], ids=["exclusive", "inclusive"])
def test_reader_after_seek_to_latest(client: pulsar.Client, topic: str, inclusive: bool,
                                     batched: bool) -> None:
    _publish_some(client, topic, "old", 3, batched)
    reader = client.create_reader(topic, pulsar.MessageId.earliest,
                                  start_message_id_inclusive=inclusive)
    assert _read_all(reader) == [f"old-{i}".encode() for i in range(3)]
    reader.seek(pulsar.MessageId.latest)
    assert reader.has_message_available() == inclusive  # before: only inclusive has the last
    if inclusive:
        assert _read_all(reader) == [b"old-2"]
        reader.seek(pulsar.MessageId.latest)
    _publish_some(client, topic, "new", LATE, batched)
    assert reader.has_message_available()
    assert _read_all(reader) == [f"new-{i}".encode() for i in range(LATE)]
    assert not reader.has_message_available()


def test_latest_reader_on_an_empty_topic(client: pulsar.Client, topic: str) -> None:
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    assert not reader.has_message_available()
    _publish_some(client, topic, "new", LATE, False)
    assert reader.has_message_available()
    assert _read_all(reader) == [b"new-0", b"new-1"]


# -- the same, frame by frame: the mark-delete position a reader's (non-durable) cursor answers ---

INT64_MAX = (1 << 63) - 1  # the C++ client's MessageId.latest: ledger and entry
T = pb.BaseCommand


def _reader_subscribe(connection: RawClient, topic: str, consumer_id: int, name: str,
                      start: tuple[int, int]) -> None:
    request = pb.CommandSubscribe(topic=topic, subscription=name, consumer_id=consumer_id,
                                  request_id=100 + consumer_id, durable=False,
                                  subType=pb.CommandSubscribe.Exclusive,
                                  initialPosition=pb.CommandSubscribe.Latest)
    request.start_message_id.ledgerId, request.start_message_id.entryId = start
    assert connection.request(request, T.SUCCESS).request_id == 100 + consumer_id


def _mark_delete(connection: RawClient, consumer_id: int) -> tuple[int, int] | None:
    reply = connection.request(pb.CommandGetLastMessageId(consumer_id=consumer_id,
                                                          request_id=200 + consumer_id),
                               T.GET_LAST_MESSAGE_ID_RESPONSE)
    if not reply.HasField("consumer_mark_delete_position"):
        return None
    mark = reply.consumer_mark_delete_position
    return mark.ledgerId, mark.entryId - (1 << 64) if mark.entryId >= 1 << 63 else mark.entryId


def test_a_readers_last_message_id_reply_carries_its_mark_delete_position(
        client: pulsar.Client, raw: Callable[[], RawClient], topic: str) -> None:
    connection = raw()
    connection.handshake()
    _reader_subscribe(connection, topic, 1, "empty-latest", (INT64_MAX, INT64_MAX))
    empty = _mark_delete(connection, 1)
    assert empty is not None, "an empty topic has one too"
    assert empty[1] == -1, "an empty topic: (its ledger, -1)"
    ids = _publish(client, topic, 3)
    ledger = ids[0].ledger_id()
    assert _mark_delete(connection, 1) == (ledger, -1), "nothing read: it stays"
    # At `latest`: the last entry when the reader was created.
    _reader_subscribe(connection, topic, 2, "latest", (INT64_MAX, INT64_MAX))
    assert _mark_delete(connection, 2) == (ledger, ids[2].entry_id())
    # At a message id: the entry before it (the broker delivers the start entry itself).
    _reader_subscribe(connection, topic, 3, "at-id", (ledger, ids[1].entry_id()))
    assert _mark_delete(connection, 3) == (ledger, ids[0].entry_id())
    # After seek(latest): the last entry; the consumer is closed and subscribes again.
    connection.send(pb.CommandSeek(consumer_id=3, request_id=300, message_id=pb.MessageIdData(
        ledgerId=INT64_MAX, entryId=INT64_MAX)))
    replies = {connection.next_event().type for _ in range(2)}  # type: ignore[union-attr]
    assert replies == {T.CLOSE_CONSUMER, T.SUCCESS}
    _reader_subscribe(connection, topic, 4, "at-id", (ledger, ids[1].entry_id()))
    assert _mark_delete(connection, 4) == (ledger, ids[2].entry_id())


def test_has_message_available_after_the_last_ledger_is_trimmed(
        broker_factory: BrokerFactory, topic: str) -> None:
    """With no subscription to retain them, a restart's new ledger lets maintenance trim the
    old one, last entry included: GET_LAST_MESSAGE_ID still answers that position (it used to
    fail with PersistenceError, so every reader's has_message_available() raised)."""
    broker = broker_factory("retention_check_interval_s=0")
    client = new_client(broker.url)
    _publish(client, topic, count=3)
    client.close()
    broker.restart()
    client = new_client(broker.url)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.latest)  # loads the topic
        wait_for(lambda: "trimmed ledgers" in broker.log_path.read_text(errors="replace"), 30,
                 "maintenance to trim the old ledger")
        assert not reader.has_message_available()
        _publish(client, topic, count=1)
        assert reader.has_message_available()
        assert reader.read_next(RECEIVE_MS).data() == b"m-0"
    finally:
        client.close()


def test_last_message_id_after_a_restart_is_loaded_off_the_loop(
        broker_factory: BrokerFactory) -> None:
    """After a clean restart the last entry is only in the entry logs: GetLastMessageId
    loads it in the broker's read worker and still names the batch's last index."""
    process = broker_factory()
    topic = f"persistent://public/default/last-id-{uuid.uuid4().hex[:8]}"
    with contextlib.closing(new_client(process.url)) as client:
        producer = client.create_producer(topic, batching_enabled=True,
                                          batching_max_publish_delay_ms=50)
        for i in range(5):
            producer.send_async(f"b-{i}".encode(), None)
        producer.flush()
    process.restart()
    with contextlib.closing(new_client(process.url)) as client:
        consumer = client.subscribe(topic, "last",
                                    initial_position=pulsar.InitialPosition.Earliest)
        last = consumer.get_last_message_id()
        received = [consumer.receive(RECEIVE_MS) for _ in range(5)]
        assert (last.ledger_id(), last.entry_id(), last.batch_index()) == (
            received[-1].message_id().ledger_id(), received[-1].message_id().entry_id(), 4)
