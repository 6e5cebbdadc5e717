"""The shared client suite, part 1: producing and consuming, against both transports.

Every test here runs twice (`make_client` is parametrized): with the broker embedded in this
process and over TCP against a standalone broker subprocess. Waiting is always a receive with
a deadline; a test expecting nothing uses a short receive that must time out.
"""

from __future__ import annotations

import gc
import weakref

import pytest

import magnetar
from magnetar import CompressionType, ConsumerType, InitialPosition

RECEIVE_MS = 5000
QUIET_MS = 300  # a receive that must time out: nothing more is coming
EARLIEST = InitialPosition.Earliest


def drain(consumer: magnetar.Consumer, count: int, ack: bool = True) -> list[magnetar.Message]:
    """Receive exactly `count` messages (acknowledging them), then make sure none follows."""
    received = []
    for _ in range(count):
        message = consumer.receive(RECEIVE_MS)
        if ack:
            consumer.acknowledge(message)
        received.append(message)
    with pytest.raises(magnetar.Timeout):
        consumer.receive(QUIET_MS)
    return received


def test_round_trip_keeps_every_field(client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, producer_name="the-producer")
    sent = producer.send(b"payload", properties={"a": "1", "b": "two"}, partition_key="key-1",
                         ordering_key="order-1", event_timestamp=1234)
    message = consumer.receive(RECEIVE_MS)
    assert message.data() == b"payload"
    assert message.properties() == {"a": "1", "b": "two"}
    assert message.partition_key() == "key-1"
    assert message.ordering_key() == "order-1"
    assert message.event_timestamp() == 1234
    assert message.producer_name() == "the-producer"
    assert message.topic_name() == topic
    assert message.message_id() == sent
    assert message.redelivery_count() == 0
    assert message.publish_timestamp() > 0
    assert producer.last_sequence_id() == 0
    consumer.acknowledge(message)
    with pytest.raises(magnetar.Timeout):
        consumer.receive(QUIET_MS)


def test_null_value_is_not_empty_bytes(client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic)
    producer.send(None)
    producer.send(b"")
    first, second = drain(consumer, 2)
    assert first.has_null_value()
    assert first.data() == b""
    assert not second.has_null_value()


@pytest.mark.parametrize("compression", list(CompressionType), ids=lambda c: c.name)
@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_compression_and_batching(client: magnetar.Client, topic: str,
                                  compression: CompressionType, batching: bool) -> None:
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, compression_type=compression,
                                      batching_enabled=batching,
                                      batching_max_publish_delay_ms=60_000)
    bodies = [(f"message {i} " * 50).encode() for i in range(20)]
    results: list[tuple[magnetar.Result, magnetar.MessageId | None]] = []
    for body in bodies:
        producer.send_async(body, lambda result, mid: results.append((result, mid)))
    producer.flush()
    assert [result for result, _ in results] == [magnetar.Result.Ok] * 20
    ids = [mid for _, mid in results if mid is not None]
    assert isinstance(ids[0], magnetar.MessageId)
    if batching:  # one entry (the delay never ran out), batch indexes in order
        assert {(m.ledger_id(), m.entry_id()) for m in ids} == \
            {(ids[0].ledger_id(), ids[0].entry_id())}
        assert [m.batch_index() for m in ids] == list(range(20))
    else:
        assert len({(m.ledger_id(), m.entry_id()) for m in ids}) == 20
    received = drain(consumer, 20)
    assert [m.data() for m in received] == bodies
    assert [m.message_id() for m in received] == ids


def test_key_based_batching_groups_by_key(client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", consumer_type=ConsumerType.KeyShared)
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_type=magnetar.BatchingType.KeyBased,
                                      batching_max_publish_delay_ms=60_000)
    keys = ["A", "B", "C", "B", "C", "A"]
    for index, key in enumerate(keys):
        producer.send_async(f"{key}{index}".encode(), None, partition_key=key)
    producer.flush()
    received = [m.data() for m in drain(consumer, 6)]
    assert received == [b"A0", b"A5", b"B1", b"B3", b"C2", b"C4"]  # C++ testSequenceId


def test_full_queue_refuses_or_the_batch_waits(client: magnetar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=True, max_pending_messages=2,
                                      batching_max_publish_delay_ms=60_000)
    producer.send_async(b"1", None)
    producer.send_async(b"2", None)
    with pytest.raises(magnetar.ProducerQueueIsFull, match="2 of 2 pending"):
        producer.send_async(b"3", None)
    producer.flush()
    producer.send_async(b"3", None)  # room again once the receipts came
    producer.flush()


def test_oversize_message_without_and_with_chunking(client: magnetar.Client,
                                                    topic: str) -> None:
    big = bytes(range(256)) * (6 * 1024 * 4)  # 6 MiB: over the 5 MiB default
    producer = client.create_producer(topic)
    with pytest.raises(magnetar.MessageTooBig, match="exceeds the maximum"):
        producer.send(big)
    consumer = client.subscribe(topic, "sub")
    chunked = client.create_producer(topic, chunking_enabled=True)
    sent = chunked.send(big, properties={"k": "v"})
    message = consumer.receive(RECEIVE_MS)
    assert message.data() == big
    assert message.properties() == {"k": "v"}
    assert message.message_id() == sent
    consumer.acknowledge(message)
    with pytest.raises(magnetar.Timeout):
        consumer.receive(QUIET_MS)


def test_batching_and_chunking_together_is_a_value_error(client: magnetar.Client,
                                                         topic: str) -> None:
    with pytest.raises(ValueError, match="batching and chunking"):
        client.create_producer(topic, batching_enabled=True, chunking_enabled=True)


def test_initial_position_and_sequence_ids(client: magnetar.Client, topic: str) -> None:
    producer = client.create_producer(topic, producer_name="seq")
    for i in range(5):
        producer.send(f"early {i}".encode())
    assert producer.last_sequence_id() == 4
    latest = client.subscribe(topic, "latest")
    earliest = client.subscribe(topic, "earliest", initial_position=EARLIEST)
    producer.send(b"late")
    assert [m.data() for m in drain(latest, 1)] == [b"late"]
    assert [m.data() for m in drain(earliest, 6)] == \
        [f"early {i}".encode() for i in range(5)] + [b"late"]


def test_user_sequence_ids_and_last_sequence_id(client: magnetar.Client, topic: str) -> None:
    producer = client.create_producer(topic, initial_sequence_id=10)
    producer.send(b"a")
    assert producer.last_sequence_id() == 11
    producer.send(b"b", sequence_id=20)
    assert producer.last_sequence_id() == 20


def test_multi_topic_consumer(client: magnetar.Client, topic: str) -> None:
    topics = [f"{topic}-{i}" for i in range(3)]
    consumer = client.subscribe(topics, "sub")
    for name in topics:
        client.create_producer(name).send(name.encode())
    received = drain(consumer, 3)
    assert sorted(m.data() for m in received) == sorted(t.encode() for t in topics)
    assert {m.topic_name() for m in received} == set(topics)
    with pytest.raises(magnetar.OperationNotSupported):
        consumer.acknowledge(received[0].message_id())


def test_pattern_consumer(client: magnetar.Client, topic: str) -> None:
    import re

    matching = [f"{topic}-match-{i}" for i in range(2)]
    for name in [*matching, f"{topic}-other"]:
        client.create_producer(name).send(name.encode())
    consumer = client.subscribe(re.compile(re.escape(topic) + "-match-.*"), "sub",
                                initial_position=EARLIEST)
    assert sorted(m.data() for m in drain(consumer, 2)) == sorted(n.encode() for n in matching)


def test_partitioned_topic(partitioned_client: magnetar.Client, topic: str) -> None:
    client = partitioned_client
    consumer = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(topic)
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]
    sent = {}
    for i in range(30):
        body = f"m{i}".encode()
        sent[body] = producer.send(body, partition_key=f"key-{i % 6}").partition()
    received = drain(consumer, 30)
    assert {m.data(): m.message_id().partition() for m in received} == sent
    assert len(set(sent.values())) > 1  # keys spread over partitions
    assert all(m.topic_name().startswith(f"{topic}-partition-") for m in received)
    for i in range(6):  # one key, one partition
        assert len({sent[f"m{j}".encode()] for j in range(i, 30, 6)}) == 1


def test_partitioned_round_robin_and_ack_by_id(partitioned_client: magnetar.Client,
                                              topic: str) -> None:
    client = partitioned_client
    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic)
    ids = [producer.send(f"m{i}".encode()) for i in range(6)]
    assert sorted(m.partition() for m in ids) == [0, 0, 1, 1, 2, 2]
    for message in drain(consumer, 6, ack=False):
        consumer.acknowledge(message.message_id())  # a bare id finds its partition
    consumer.close()
    again = client.subscribe(topic, "sub")
    with pytest.raises(magnetar.Timeout):
        again.receive(QUIET_MS)


def test_message_listener(client: magnetar.Client, topic: str) -> None:
    import threading

    got: list[bytes] = []
    done = threading.Event()

    def listener(consumer: magnetar.Consumer, message: magnetar.Message) -> None:
        consumer.acknowledge(message)
        got.append(message.data())
        if message.data() == b"m1":
            raise RuntimeError("a failing listener does not stop the next message")
        if len(got) == 3:
            done.set()

    consumer = client.subscribe(topic, "sub", message_listener=listener)
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(f"m{i}".encode())
    assert done.wait(RECEIVE_MS / 1000)
    assert got == [b"m0", b"m1", b"m2"]  # Python test_message_listener: in order
    consumer.close()
    again = client.subscribe(topic, "sub")
    with pytest.raises(magnetar.Timeout):
        again.receive(QUIET_MS)  # the listener's acks went through


def test_batch_receive(client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", batch_receive_policy=(
        magnetar.ConsumerBatchReceivePolicy(max_num_message=10, timeout_ms=QUIET_MS)))
    producer = client.create_producer(topic, batching_enabled=True)
    for i in range(25):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    sizes = []
    while True:
        batch = consumer.batch_receive()
        if not batch:
            break
        sizes.append(len(batch))
        for message in batch:
            consumer.acknowledge(message)
    assert sum(sizes) == 25
    assert max(sizes) == 10


def test_producer_access_modes(client: magnetar.Client, topic: str) -> None:
    exclusive = magnetar.ProducerAccessMode.Exclusive
    first = client.create_producer(topic, access_mode=exclusive)
    with pytest.raises(magnetar.ProducerFenced, match=topic):
        client.create_producer(topic, access_mode=exclusive)
    first.send(b"still the owner")
    fencing = client.create_producer(
        topic, access_mode=magnetar.ProducerAccessMode.ExclusiveWithFencing)
    with pytest.raises((magnetar.ProducerFenced, magnetar.AlreadyClosed)):
        first.send(b"fenced")
    fencing.send(b"new owner")
    consumer = client.subscribe(topic, "sub", initial_position=EARLIEST)
    assert [m.data() for m in drain(consumer, 2)] == [b"still the owner", b"new owner"]


def test_pattern_consumer_picks_up_new_topics(client: magnetar.Client, topic: str) -> None:
    import re

    first = f"{topic}-new-0"
    client.create_producer(first).send(b"first")
    consumer = client.subscribe(re.compile(re.escape(topic) + "-new-.*"), "sub",
                                initial_position=EARLIEST, pattern_auto_discovery_period=1)
    assert consumer.receive(RECEIVE_MS).data() == b"first"
    client.create_producer(f"{topic}-new-1").send(b"later")  # found by the next discovery
    message = consumer.receive(RECEIVE_MS)
    assert message.data() == b"later"
    assert message.topic_name() == f"{topic}-new-1"


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_send_async_from_threads_blocks_and_keeps_order(client: magnetar.Client, topic: str,
                                                        batching: bool) -> None:
    import threading

    consumer = client.subscribe(topic, "sub")
    producer = client.create_producer(topic, max_pending_messages=10, block_if_queue_full=True,
                                      batching_enabled=batching)
    errors: list[object] = []

    def send(thread: int) -> None:
        for i in range(100):
            producer.send_async(f"{thread}:{i}".encode(),
                                lambda result, _mid: errors.append(result)
                                if result != magnetar.Result.Ok else None)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    producer.flush()
    assert errors == []
    received = [m.data().decode().split(":") for m in drain(consumer, 400)]
    for thread in range(4):
        assert [int(i) for t, i in received if t == str(thread)] == list(range(100))


def test_non_persistent_topic(client: magnetar.Client, topic: str) -> None:
    name = topic.replace("persistent://", "non-persistent://")
    consumer = client.subscribe(name, "sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(name)
    for i in range(3):
        producer.send(f"m{i}".encode())
    assert [m.data() for m in drain(consumer, 3)] == [b"m0", b"m1", b"m2"]
    with pytest.raises(magnetar.NotAllowedError, match="non-persistent"):
        consumer.seek(magnetar.MessageId.earliest)


def test_closed_producers_consumers_and_readers_are_not_kept(client: magnetar.Client,
                                                              topic: str) -> None:
    """A service that opens and closes a producer, consumer or reader per request must not grow:
    the client forgets each one once closed (before, it held every one until the client itself
    closed), and still closes what is open when it closes."""
    gone: list[weakref.ref[object]] = []
    for i in range(3):
        producer = client.create_producer(topic)
        producer.send(f"m{i}".encode())
        gone.append(weakref.ref(producer._core))
        producer.close()
        consumer = client.subscribe(topic, f"sub-{i}")
        gone.append(weakref.ref(consumer._group))
        consumer.close()
        reader = client.create_reader(topic, magnetar.MessageId.earliest)
        gone.append(weakref.ref(reader._group))
        reader.close()
    del producer, consumer, reader
    gc.collect()
    assert [ref() for ref in gone] == [None] * len(gone)
    still_open = client.create_producer(topic)
    client.close()
    with pytest.raises(magnetar.AlreadyClosed):
        still_open.send(b"after close")
