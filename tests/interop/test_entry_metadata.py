"""Broker entry metadata (0x0e02) with `broker_entry_metadata_interceptors=timestamp,index`:
clients that declare supports_broker_entry_metadata receive the block (broker time, a
topic-wide message index counting batch sizes), others get the entry without it; the official
client still decodes everything; seek by time, last-message-id, delayed delivery, tag filtering,
Key_Shared keys and dedup replay read the prefixed entries; the index continues across a
restart. (`MAGNETAR_INTEROP_BROKER_CONFIG` runs the whole interop suite with the setting on.)"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import timedelta

import pulsar
import pytest

from magnetar.codec import Frame, pb

from . import BrokerProcess, RawClient, wait_for
from .conftest import BrokerFactory, new_client
from .test_dlq_routing_tags import _subscription_with_properties

T = pb.BaseCommand
INTERCEPTORS = "broker_entry_metadata_interceptors=timestamp,index"
RECEIVE_TIMEOUT_MS = 10_000
TICK_MS = 100  # the delayed-delivery tick of the module's broker
DELAY_MS = 1000
BATCHES = (3, 1, 4)  # messages per batch the test producer sends
KEYS = 24  # Key_Shared keys: all on one of two consumers has odds of about 2**-23
POLL_MS = 50
QUIET_MS = 300


@pytest.fixture(scope="module")
def bem_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("entry-metadata-broker")
    process = BrokerProcess(base / "data", base / "broker.log",
                            config=(INTERCEPTORS, f"delayed_delivery_tick_time_ms={TICK_MS}"))
    process.start()
    yield process
    process.cleanup()


def _publish_batches(url: str, topic: str, batches: tuple[int, ...] = BATCHES,
                     tag: str = "m", **producer_options: object) -> list[bytes]:
    """Send each group as one batch (flushed), then close; returns the payloads in order."""
    client = new_client(url)
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_publish_delay_ms=60_000,
                                      batching_max_messages=1000, **producer_options)
    sent: list[bytes] = []
    for number, size in enumerate(batches):
        for i in range(size):
            payload = f"{tag}-{number}-{i}".encode()
            producer.send_async(payload, None)
            sent.append(payload)
        producer.flush()
    client.close()
    return sent


def _raw_messages(port: int, topic: str, entries: int, *, declare: bool) -> list[Frame]:
    """MESSAGE frames of `entries` entries, read from the earliest by a raw consumer that does
    or does not declare supports_broker_entry_metadata."""
    raw = RawClient(port)
    try:
        raw.send(pb.CommandConnect(
            client_version="entry-metadata-test", protocol_version=20,
            feature_flags=pb.FeatureFlags(supports_broker_entry_metadata=declare)))
        raw.expect(T.CONNECTED)
        raw.request(pb.CommandSubscribe(
            topic=topic, subscription="raw", subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1, request_id=1,
            initialPosition=pb.CommandSubscribe.Earliest), T.SUCCESS)
        raw.send(pb.CommandFlow(consumer_id=1, messagePermits=1000))
        return [raw.expect(T.MESSAGE) for _ in range(entries)]
    finally:
        raw.close()


def _check_indexes(frames: list[Frame], first_index: int) -> int:
    """Each entry's index is the previous one plus its messages; returns the last."""
    index = first_index - 1
    for frame in frames:
        assert frame.metadata is not None
        assert frame.broker_entry_metadata is not None, "a declaring client gets the block"
        index += max(1, frame.metadata.num_messages_in_batch)
        assert frame.broker_entry_metadata.index == index
    return index


def test_declaring_client_gets_timestamp_and_index(bem_broker: BrokerProcess,
                                                   topic: str) -> None:
    before = int(time.time() * 1000)
    _publish_batches(bem_broker.url, topic)
    after = int(time.time() * 1000)
    frames = _raw_messages(bem_broker.port, topic, len(BATCHES), declare=True)
    assert [f.metadata.num_messages_in_batch for f in frames if f.metadata] == list(BATCHES)
    assert _check_indexes(frames, 0) == sum(BATCHES) - 1
    for frame in frames:
        assert frame.broker_entry_metadata is not None
        assert before <= frame.broker_entry_metadata.broker_timestamp <= after
        assert frame.checksum is not None, "the producer's checksum is kept and verified"


def test_other_clients_get_the_entry_without_the_block(bem_broker: BrokerProcess,
                                                       topic: str) -> None:
    sent = _publish_batches(bem_broker.url, topic)
    frames = _raw_messages(bem_broker.port, topic, len(BATCHES), declare=False)
    assert all(f.broker_entry_metadata is None for f in frames)
    assert [f.metadata.num_messages_in_batch for f in frames if f.metadata] == list(BATCHES)
    client = new_client(bem_broker.url)  # the official client declares it, and decodes it
    try:
        consumer = client.subscribe(topic, "official",
                                    initial_position=pulsar.InitialPosition.Earliest)
        got = [consumer.receive(RECEIVE_TIMEOUT_MS) for _ in sent]
        assert [m.data() for m in got] == sent
        assert all(m.publish_timestamp() > 0 for m in got)
        assert [m.message_id().batch_index() for m in got][:3] == [0, 1, 2]
    finally:
        client.close()


def test_reader_seek_and_last_message_id_read_prefixed_entries(bem_broker: BrokerProcess,
                                                               topic: str) -> None:
    early = _publish_batches(bem_broker.url, topic, (2,), tag="early")
    cutoff = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= cutoff:  # publish times after the cutoff, strictly
        time.sleep(0.001)
    late = _publish_batches(bem_broker.url, topic, (1, 1), tag="late")
    client = new_client(bem_broker.url)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(RECEIVE_TIMEOUT_MS).data() for _ in early + late] == \
            early + late
        assert not reader.has_message_available()
        reader.seek(cutoff)
        assert reader.read_next(RECEIVE_TIMEOUT_MS).data() == late[0]
    finally:
        client.close()


def test_delayed_delivery_reads_prefixed_entries(bem_broker: BrokerProcess, topic: str) -> None:
    client = new_client(bem_broker.url)
    try:
        consumer = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic)
        sent = time.monotonic()
        producer.send(b"later", deliver_after=timedelta(milliseconds=DELAY_MS))
        producer.send(b"now")
        first = consumer.receive(RECEIVE_TIMEOUT_MS)
        second = consumer.receive(RECEIVE_TIMEOUT_MS)
        assert (first.data(), second.data()) == (b"now", b"later")
        assert time.monotonic() - sent >= (DELAY_MS - TICK_MS) / 1000
    finally:
        client.close()


def test_tags_and_key_shared_keys_are_read_from_prefixed_entries(bem_broker: BrokerProcess,
                                                                 topic: str) -> None:
    _subscription_with_properties(bem_broker.port, topic, "tagged", {"tag1": "1"})
    client = new_client(bem_broker.url)
    try:
        tagged = client.subscribe(topic, "tagged", consumer_type=pulsar.ConsumerType.Shared)
        keyed = [client.subscribe(topic, "keyed", consumer_type=pulsar.ConsumerType.KeyShared,
                                  consumer_name=f"c{i}") for i in range(2)]
        producer = client.create_producer(topic, batching_enabled=False)
        keys = [f"key-{i}" for i in range(KEYS)]
        for key in keys:
            producer.send(key.encode(), partition_key=key,
                          properties={"tag1": "TAGS"} if key == keys[0] else {"tag2": "TAGS"})
        assert tagged.receive(RECEIVE_TIMEOUT_MS).data() == keys[0].encode()
        with pytest.raises(pulsar.Timeout):
            tagged.receive(QUIET_MS)  # the other messages carry another tag: filtered out
        owner: dict[str, int] = {}
        for _ in keys:  # poll both consumers until every message arrived once
            index, message = wait_for(lambda: _receive_any(keyed), RECEIVE_TIMEOUT_MS / 1000,
                                      "a Key_Shared delivery")
            assert owner.setdefault(message.partition_key(), index) == index
        # A lost key would send every message to one consumer (all hash as the empty key).
        assert set(owner.values()) == {0, 1}
        assert sorted(owner) == sorted(keys)
    finally:
        client.close()


def _receive_any(consumers: list[pulsar.Consumer]) -> tuple[int, pulsar.Message] | None:
    for index, consumer in enumerate(consumers):
        try:
            return index, consumer.receive(POLL_MS)
        except pulsar.Timeout:
            continue
    return None


def test_index_continues_across_a_restart_and_dedup_replays(broker_factory: BrokerFactory,
                                                            topic: str) -> None:
    process = broker_factory(INTERCEPTORS, "broker_deduplication_enabled=true")
    _publish_batches(process.url, topic, (2, 1, 1), producer_name="p")  # sequence ids 0..3
    process.stop(signal.SIGKILL)
    process.start()
    client = new_client(process.url)
    try:
        producer = client.create_producer(topic, producer_name="p")
        assert producer.last_sequence_id() == 3, "dedup state replayed from prefixed entries"
        duplicate = producer.send(b"again", sequence_id=3)
        assert (duplicate.ledger_id(), duplicate.entry_id()) == (-1, -1)
        producer.send(b"after-restart")
    finally:
        client.close()
    frames = _raw_messages(process.port, topic, 4, declare=True)
    assert _check_indexes(frames, 0) == 4  # 2 + 1 + 1 messages before the restart, 1 after


def test_interceptor_names_are_checked() -> None:
    from magnetar.broker.cli._standalone import config_with_overrides

    upstream = ("org.apache.pulsar.common.intercept.AppendBrokerTimestampMetadataInterceptor,"
                "org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor")
    config = config_with_overrides([f"broker_entry_metadata_interceptors={upstream}"])
    assert len(config.broker_entry_metadata_interceptors) == 2
    with pytest.raises(ValueError, match="unknown broker entry metadata interceptor 'clock'"):
        config_with_overrides(["broker_entry_metadata_interceptors=index,clock"])
