"""The official client's shapes: `send_async` callbacks get `(Result, MessageId)`, and
`MessageId` has the official accessors, serialization and `earliest`/`latest`."""

from __future__ import annotations

import pulsar  # type: ignore[import-untyped]
import pytest

import magnetar
from magnetar import MessageId, Result, codec

from .test_produce_consume import RECEIVE_MS, drain


def test_result_has_the_official_names_and_values() -> None:
    official = {name: int(value) for name, value in pulsar.Result.__members__.items()}
    assert {member.name: int(member) for member in Result} == official
    assert Result.of(None) is Result.Ok
    assert Result.of(magnetar.Timeout("late")) is Result.Timeout
    assert Result.of(RuntimeError("other")) is Result.UnknownError


def test_message_id_accessors_and_official_bytes() -> None:
    mine = MessageId(partition=2, ledger_id=5, entry_id=7, batch_index=1)
    theirs = pulsar.MessageId(2, 5, 7, 1)
    assert (mine.partition(), mine.ledger_id(), mine.entry_id(), mine.batch_index()) == \
        (2, 5, 7, 1)
    assert str(mine) == str(theirs) == "(5,7,2,1)"
    assert mine.serialize() == theirs.serialize()
    back = MessageId.deserialize(theirs.serialize(), topic="t")
    assert back == mine
    assert back.topic_name() == "t"
    for ours, official in ((MessageId.earliest, pulsar.MessageId.earliest),
                           (MessageId.latest, pulsar.MessageId.latest)):
        assert ours.serialize() == official.serialize()
        assert MessageId.deserialize(official.serialize()) == ours
    assert MessageId.earliest < mine < MessageId.latest
    assert len({mine, back, MessageId(2, 5, 7, 1)}) == 1
    assert mine == codec.MessageId(5, 7, 2, 1)  # the codec's id compares equal
    with pytest.raises(magnetar.InvalidConfiguration, match="not a serialized MessageId"):
        MessageId.deserialize(b"\xff\xff")


def test_send_async_callback_gets_result_and_id(client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, batching_enabled=False)
    results: dict[str, tuple[Result, MessageId | None]] = {}
    producer.send_async(b"fits", lambda result, mid: results.update(fits=(result, mid)))
    producer.send_async(bytes(6 * 1024 * 1024),  # over the 5 MiB maximum, no chunking
                        lambda result, mid: results.update(big=(result, mid)))
    producer.flush()
    assert results["big"] == (Result.MessageTooBig, None)
    assert results["fits"][0] is Result.Ok
    sent = results["fits"][1]
    assert isinstance(sent, MessageId)
    [message] = drain(consumer, 1)
    assert message.message_id() == sent
    assert sent.ledger_id() >= 0
    assert sent.entry_id() >= 0


def test_ids_of_either_class_seek_and_acknowledge(client: magnetar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(3)]
    consumer = client.subscribe(topic, "sub", initial_position=magnetar.InitialPosition.Earliest)
    received = drain(consumer, 3, ack=False)
    consumer.acknowledge(MessageId.deserialize(ids[0].serialize()))  # wrapper from bytes
    consumer.acknowledge(received[1].message_id().codec)  # the codec's own id
    consumer.acknowledge(received[2])
    consumer.seek(ids[1].codec)  # a codec id seeks too
    reader = client.create_reader(topic, ids[0].codec)
    assert reader.read_next(RECEIVE_MS).data() == b"m1"
    reader.close()
    consumer.close()


def test_trusted_ids_equal_checked_ones() -> None:
    from magnetar._message_id import trusted_id

    for values in ((1, 2, -1, -1, 0), (5, 7, 2, 3, 10), ((1 << 63) - 1, 0, 0, 0, 1)):
        fast, checked = trusted_id(*values), codec.MessageId(*values)
        assert fast == checked
        assert hash(fast) == hash(checked)
        assert (fast.batch_size, fast.first_chunk) == (checked.batch_size, None)
        assert fast.serialize() == checked.serialize()


def test_a_failing_router_fails_the_send_not_the_producer(partitioned_client: magnetar.Client,
                                                          topic: str) -> None:
    def router(message: magnetar.Message, partitions: int) -> int:
        if message.data() == b"bad":
            raise ZeroDivisionError("the router broke")
        return 0

    producer = partitioned_client.create_producer(topic, message_router=router)
    results: list[Result] = []
    producer.send_async(b"bad", lambda result, _mid: results.append(result))
    producer.flush()
    assert results == [Result.UnknownError]
    with pytest.raises(magnetar.PulsarException, match="the router broke"):
        producer.send(b"bad")
    assert producer.send(b"good").partition() == 0  # the producer goes on
