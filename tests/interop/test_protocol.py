"""The broker's side of the wire protocol, frame by frame, with our codec as the client: the
handshake, the reply forms of wire reference §12, commands the Python client never sends
(GET_SCHEMA, CONSUMER_STATS, ACK receipts, topic hashes, transactions), and bad input, which
must close that one connection and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pulsar
import pytest

from magnetar.broker._names import topics_hash
from magnetar.codec import Frame, SingleMessage, build_batch, build_message, encode_frame, pb
from magnetar.codec import base_command as wrap

from . import RawClient

pytestmark = pytest.mark.interop

T = pb.BaseCommand
UINT64_MAX = (1 << 64) - 1
RECEIVE_MS = 5000
Connect = Callable[[], RawClient]


def _connected(raw: Connect, **options: object) -> RawClient:
    connection = raw()
    connection.handshake(**options)  # type: ignore[arg-type]
    return connection


def _producer(connection: RawClient, topic: str, producer_id: int = 1) -> str:
    reply = connection.request(pb.CommandProducer(topic=topic, producer_id=producer_id,
                                                  request_id=100 + producer_id),
                               T.PRODUCER_SUCCESS)
    assert reply.request_id == 100 + producer_id
    return str(reply.producer_name)


def _subscribe(connection: RawClient, topic: str, consumer_id: int = 1, **fields: object) -> None:
    request = pb.CommandSubscribe(topic=topic, subscription="raw", consumer_id=consumer_id,
                                  request_id=200 + consumer_id,
                                  subType=pb.CommandSubscribe.Exclusive,
                                  initialPosition=pb.CommandSubscribe.Earliest)
    for name, value in fields.items():
        setattr(request, name, value)
    assert connection.request(request, T.SUCCESS).request_id == 200 + consumer_id


def _send(connection: RawClient, sequence_id: int, body: bytes, producer_id: int = 1) -> None:
    metadata, payload = build_message(SingleMessage(body, sequence_id=sequence_id),
                                      producer_name="raw", publish_time=1_700_000_000_000)
    connection.send(pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id), metadata,
                    payload)


@pytest.mark.parametrize(("asked", "granted"), [(20, 20), (15, 15), (25, 20)])
def test_connected_answers_the_lower_protocol_version(raw: Connect, asked: int,
                                                      granted: int) -> None:
    connected = raw().handshake(protocol_version=asked)
    assert connected.protocol_version == granted
    assert connected.server_version.startswith("Magnetar")
    assert connected.max_message_size == 5 * 1024 * 1024


def test_ping_is_answered_with_pong(raw: Connect) -> None:
    connection = _connected(raw)
    connection.send(pb.CommandPing())
    connection.expect(T.PONG)


def test_lookup_connects_to_the_advertised_url(raw: Connect, service_url: str) -> None:
    connection = _connected(raw)
    reply = connection.request(pb.CommandLookupTopic(topic="persistent://public/default/x",
                                                     request_id=7), T.LOOKUP_RESPONSE)
    assert (reply.request_id, reply.response) == (7, pb.CommandLookupTopicResponse.Connect)
    assert reply.HasField("response")
    assert reply.brokerServiceUrl == service_url
    assert reply.authoritative


def test_lookup_of_an_invalid_name_fails_inside_the_lookup_reply(raw: Connect) -> None:
    connection = _connected(raw)
    reply = connection.request(pb.CommandLookupTopic(topic="persistent://a", request_id=8),
                               T.LOOKUP_RESPONSE)
    assert reply.response == pb.CommandLookupTopicResponse.Failed
    assert reply.error == pb.InvalidTopicName


def test_partitioned_metadata_always_writes_its_response(raw: Connect) -> None:
    connection = _connected(raw)
    reply = connection.request(pb.CommandPartitionedTopicMetadata(
        topic="persistent://public/default/pm", request_id=0), T.PARTITIONED_METADATA_RESPONSE)
    assert reply.HasField("response")
    assert (reply.response, reply.partitions) == (
        pb.CommandPartitionedTopicMetadataResponse.Success, 0)


def test_receipts_echo_sequence_ids_in_order(raw: Connect, topic: str) -> None:
    connection = _connected(raw)
    _producer(connection, topic)
    for sequence_id in range(20):
        _send(connection, sequence_id, f"r-{sequence_id}".encode())
    receipts = [connection.expect(T.SEND_RECEIPT).body for _ in range(20)]
    assert [r.sequence_id for r in receipts] == list(range(20))
    positions = [(r.message_id.ledgerId, r.message_id.entryId) for r in receipts]
    assert positions == sorted(positions)
    assert len(set(positions)) == 20


def test_one_write_of_sends_for_many_producers_gets_each_its_receipts_in_order(
        raw: Connect, topic: str) -> None:
    """SENDs of three producers on three topics, interleaved in one write (one group of
    adds, answered together), with a transactional SEND that is refused at once: each
    producer's receipts come in its order, the refusal after the receipt before it."""
    connection = _connected(raw)
    for producer_id in (1, 2, 3):
        _producer(connection, f"{topic}-{producer_id}", producer_id)
    frames = bytearray()
    for sequence_id in range(4):
        for producer_id in (1, 2, 3):
            send = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id)
            if (producer_id, sequence_id) == (2, 1):
                send.txnid_least_bits = 7
            metadata, payload = build_message(
                SingleMessage(b"m-%d-%d" % (producer_id, sequence_id), sequence_id=sequence_id),
                producer_name=f"raw-{producer_id}", publish_time=1_700_000_000_000)
            frames += encode_frame(wrap(send), metadata, payload)
    connection.send_bytes(bytes(frames))
    answers: dict[int, list[tuple[int, int, int]]] = {1: [], 2: [], 3: []}
    for _ in range(12):
        frame = connection.next_event()
        assert isinstance(frame, Frame)
        assert frame.type in (T.SEND_RECEIPT, T.SEND_ERROR)
        body = frame.body
        if frame.type == T.SEND_ERROR:
            assert body.error == pb.NotAllowedError
            answers[body.producer_id].append((body.sequence_id, -1, -1))
        else:
            answers[body.producer_id].append(
                (body.sequence_id, body.message_id.ledgerId, body.message_id.entryId))
    for producer_id, got in answers.items():
        assert [sequence_id for sequence_id, _, _ in got] == [0, 1, 2, 3]
        stored = [(ledger, entry) for _, ledger, entry in got if entry >= 0]
        assert [entry for _, entry in stored] == list(range(len(stored)))
        assert len(stored) == (3 if producer_id == 2 else 4)


def test_messages_carry_the_stored_entry_verbatim(raw: Connect, topic: str) -> None:
    connection = _connected(raw)
    _producer(connection, topic)
    metadata, payload = build_batch([SingleMessage(b"a", sequence_id=0, partition_key="k"),
                                     SingleMessage(b"b", sequence_id=1)],
                                    producer_name="raw", publish_time=1_700_000_000_000)
    connection.send(pb.CommandSend(producer_id=1, sequence_id=0, num_messages=2), metadata,
                    payload)
    connection.expect(T.SEND_RECEIPT)
    _subscribe(connection, topic)
    connection.send(pb.CommandFlow(consumer_id=1, messagePermits=10))
    message = connection.expect(T.MESSAGE)
    assert message.body.message_id.partition == -1
    assert message.body.redelivery_count == 0
    assert message.metadata == metadata
    assert message.payload == payload
    assert message.checksum is not None


def test_ack_with_a_request_id_gets_an_ack_response(raw: Connect, topic: str) -> None:
    connection = _connected(raw)
    _producer(connection, topic)
    _send(connection, 0, b"x")
    connection.expect(T.SEND_RECEIPT)
    _subscribe(connection, topic)
    connection.send(pb.CommandFlow(consumer_id=1, messagePermits=10))
    delivered = connection.expect(T.MESSAGE).body.message_id
    connection.send(pb.CommandAck(consumer_id=1, ack_type=pb.CommandAck.Individual,
                                  message_id=[delivered], request_id=55))
    reply = connection.expect(T.ACK_RESPONSE).body
    assert (reply.consumer_id, reply.request_id, reply.HasField("error")) == (1, 55, False)


def test_consumer_stats_and_last_message_id(raw: Connect, topic: str) -> None:
    connection = _connected(raw)
    _subscribe(connection, topic, consumer_name="stats-me")
    empty = connection.request(pb.CommandGetLastMessageId(consumer_id=1, request_id=3),
                               T.GET_LAST_MESSAGE_ID_RESPONSE)
    assert (empty.last_message_id.ledgerId, empty.last_message_id.entryId) == (
        UINT64_MAX, UINT64_MAX)
    connection.send(pb.CommandFlow(consumer_id=1, messagePermits=7))
    stats = connection.request(pb.CommandConsumerStats(consumer_id=1, request_id=4),
                               T.CONSUMER_STATS_RESPONSE)
    assert not stats.HasField("error_code")
    assert (stats.consumerName, stats.availablePermits, stats.type) == (
        "stats-me", 7, "Exclusive")
    missing = connection.request(pb.CommandConsumerStats(consumer_id=99, request_id=5),
                                 T.CONSUMER_STATS_RESPONSE)
    assert missing.error_code == pb.ConsumerNotFound


def test_get_topics_of_namespace_filters_and_hashes(raw: Connect,
                                                    client: pulsar.Client) -> None:
    tag = uuid.uuid4().hex[:8]
    names = [f"persistent://public/default/gt-{tag}-{suffix}" for suffix in ("one", "two")]
    for name in names:
        client.create_producer(name).close()
    connection = _connected(raw)
    pattern = f"persistent://public/default/gt-{tag}-.*"
    assert len(pattern) <= 50  # longer patterns are not evaluated by the broker
    first = connection.request(pb.CommandGetTopicsOfNamespace(
        request_id=9, namespace="public/default", topics_pattern=pattern),
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    assert (first.changed, first.filtered, sorted(first.topics)) == (True, True, names)
    assert first.topics_hash == topics_hash(names)
    again = connection.request(pb.CommandGetTopicsOfNamespace(
        request_id=10, namespace="public/default", topics_pattern=pattern,
        topics_hash=first.topics_hash), T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    assert (again.changed, list(again.topics)) == (False, [])
    everything = connection.request(pb.CommandGetTopicsOfNamespace(
        request_id=11, namespace="public/default"), T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    assert not everything.filtered
    assert set(names) <= set(everything.topics)
    assert everything.topics_hash == topics_hash(everything.topics)


def test_schemas_are_stored_per_topic(raw: Connect, client: pulsar.Client, topic: str) -> None:
    connection = _connected(raw)
    unknown = connection.request(pb.CommandGetSchema(request_id=1, topic=topic),
                                 T.GET_SCHEMA_RESPONSE)
    assert unknown.error_code == pb.TopicNotFound
    client.create_producer(topic, schema=pulsar.schema.StringSchema()).close()
    known = connection.request(pb.CommandGetSchema(request_id=2, topic=topic),
                               T.GET_SCHEMA_RESPONSE)
    assert not known.HasField("error_code")
    assert known.schema.type == pb.Schema.String
    assert known.schema_version == bytes(8)
    # A schema of type None is what a bytes producer may send: no schema, no version.
    none = pb.Schema(name="bytes", schema_data=b"", type=pb.Schema.Type.Value("None"))
    plain = connection.request(pb.CommandProducer(topic=topic, producer_id=4, request_id=4,
                                                  schema=none), T.PRODUCER_SUCCESS)
    assert not plain.HasField("schema_version")
    json_schema = pb.Schema(name="j", schema_data=b'{"type":"record"}', type=pb.Schema.Json)
    refused = connection.request(pb.CommandProducer(topic=topic, producer_id=3, request_id=3,
                                                    schema=json_schema), T.ERROR)
    assert refused.error == pb.IncompatibleSchema


def test_transactions_are_refused_with_not_allowed(raw: Connect) -> None:
    connection = _connected(raw)
    reply = connection.request(pb.CommandTcClientConnectRequest(request_id=12, tc_id=0),
                               T.ERROR)
    assert (reply.request_id, reply.error) == (12, pb.NotAllowedError)
    assert "Transactions" in reply.message
    reply = connection.request(pb.CommandNewTxn(request_id=13, tc_id=0), T.ERROR)
    assert (reply.request_id, reply.error) == (13, pb.NotAllowedError)


def test_errors_use_the_error_command_for_producers(raw: Connect, topic: str) -> None:
    connection = _connected(raw)
    _producer(connection, topic, producer_id=1)
    busy = connection.request(pb.CommandProducer(topic=topic, producer_id=2, request_id=2,
                                                 producer_name="raw-busy"), T.PRODUCER_SUCCESS)
    assert busy.producer_name == "raw-busy"
    clash = connection.request(pb.CommandProducer(topic=topic, producer_id=3, request_id=3,
                                                  producer_name="raw-busy"), T.ERROR)
    assert (clash.request_id, clash.error) == (3, pb.ProducerBusy)


def test_a_corrupt_send_fails_alone(raw: Connect, topic: str) -> None:
    connection = _connected(raw)
    _producer(connection, topic)
    metadata, payload = build_message(SingleMessage(b"payload", sequence_id=0),
                                      producer_name="raw", publish_time=1)
    frame = bytearray(encode_frame(wrap(pb.CommandSend(producer_id=1, sequence_id=0)),
                                   metadata, payload))
    frame[-1] ^= 0xFF  # the last payload byte: the CRC32C no longer matches
    connection.send_bytes(bytes(frame))
    error = connection.expect(T.SEND_ERROR).body
    assert (error.sequence_id, error.error) == (0, pb.ChecksumError)
    _send(connection, 1, b"fine")
    assert connection.expect(T.SEND_RECEIPT).body.sequence_id == 1


def test_a_corrupt_send_between_good_ones_of_one_read_is_answered_in_its_place(
        raw: Connect, topic: str) -> None:
    """Receipts leave in the order the SENDs came, an error among them in its place: the
    receipts before it are written before it (one producer's receipts are built as a run)."""
    connection = _connected(raw)
    _producer(connection, topic)
    frames = []
    for sequence_id in range(5):
        metadata, payload = build_message(SingleMessage(b"m%d" % sequence_id,
                                                        sequence_id=sequence_id),
                                          producer_name="raw", publish_time=1)
        frame = bytearray(encode_frame(wrap(pb.CommandSend(producer_id=1,
                                                           sequence_id=sequence_id)),
                                       metadata, payload))
        if sequence_id == 2:
            frame[-1] ^= 0xFF
        frames.append(bytes(frame))
    connection.send_bytes(b"".join(frames))  # one write: most likely one read
    answers = []
    for _ in range(5):
        event = connection.next_event()
        assert isinstance(event, Frame), event
        answers.append((event.command.type, (event.command.send_receipt if
                        event.command.type == T.SEND_RECEIPT else
                        event.command.send_error).sequence_id))
    assert answers == [(T.SEND_RECEIPT, 0), (T.SEND_RECEIPT, 1), (T.SEND_ERROR, 2),
                       (T.SEND_RECEIPT, 3), (T.SEND_RECEIPT, 4)]


def test_garbage_closes_only_that_connection(raw: Connect, client: pulsar.Client,
                                             topic: str) -> None:
    bystander = _connected(raw)
    victim = _connected(raw)
    victim.send_bytes(b"\x00\x00\x00\x05\x00\x00\x00\x01\xff")
    assert victim.closed_by_broker()
    bystander.send(pb.CommandPing())
    bystander.expect(T.PONG)
    client.create_producer(topic).send(b"still serving")


def test_a_command_before_connect_closes_the_connection(raw: Connect) -> None:
    connection = raw()
    connection.send_bytes(encode_frame(wrap(pb.CommandPing())))
    assert connection.closed_by_broker()


def test_a_send_for_an_unknown_producer_closes_the_connection(raw: Connect) -> None:
    connection = _connected(raw)
    _send(connection, 0, b"nobody", producer_id=42)
    assert connection.closed_by_broker()


def test_an_oversized_frame_closes_the_connection(raw: Connect) -> None:
    connection = _connected(raw)
    connection.send_bytes((64 * 1024 * 1024).to_bytes(4, "big"))
    assert connection.closed_by_broker()


def test_failover_consumers_hear_which_one_is_active(raw: Connect, topic: str) -> None:
    connection = _connected(raw)
    for consumer_id, name in ((1, "a"), (2, "b")):
        connection.send(pb.CommandSubscribe(
            topic=topic, subscription="fo", consumer_id=consumer_id, request_id=consumer_id,
            subType=pb.CommandSubscribe.Failover, consumer_name=name))
    successes: set[int] = set()
    active: dict[int, bool] = {}
    while successes != {1, 2} or sorted(active.values()) != [False, True]:
        event = connection.next_event()
        assert isinstance(event, Frame), event
        if event.type == T.SUCCESS:
            successes.add(event.body.request_id)
        else:
            assert event.type == T.ACTIVE_CONSUMER_CHANGE, event.command
            active[event.body.consumer_id] = event.body.is_active


def test_get_or_create_schema_for_java_clients(raw: Connect, topic: str) -> None:
    connection = _connected(raw, client_version="Pulsar-Java-v3.3.0")
    avro = pb.Schema(name="rec", type=pb.Schema.Avro,
                     schema_data=b'{"type":"record","name":"R","fields":[]}')
    created = connection.request(pb.CommandGetOrCreateSchema(request_id=1, topic=topic,
                                                             schema=avro),
                                 T.GET_OR_CREATE_SCHEMA_RESPONSE)
    assert (created.HasField("error_code"), created.schema_version) == (False, bytes(8))
    # Under the broker default (FULL) a new field needs a default, as in Pulsar.
    no_default = pb.Schema(name="rec", type=pb.Schema.Avro,
                           schema_data=b'{"type":"record","name":"R","fields":[{"name":"a",'
                                       b'"type":"int"}]}')
    refused = connection.request(pb.CommandGetOrCreateSchema(request_id=4, topic=topic,
                                                             schema=no_default),
                                 T.GET_OR_CREATE_SCHEMA_RESPONSE)
    assert refused.error_code == pb.IncompatibleSchema
    assert "R.a" in refused.error_message
    avro_v2 = pb.Schema(name="rec", type=pb.Schema.Avro,
                        schema_data=b'{"type":"record","name":"R","fields":[{"name":"a",'
                                    b'"type":"int","default":0}]}')
    second = connection.request(pb.CommandGetOrCreateSchema(request_id=2, topic=topic,
                                                            schema=avro_v2),
                                T.GET_OR_CREATE_SCHEMA_RESPONSE)
    assert second.schema_version == (1).to_bytes(8, "big")
    first = connection.request(pb.CommandGetSchema(request_id=3, topic=topic,
                                                   schema_version=bytes(8)),
                               T.GET_SCHEMA_RESPONSE)
    assert (first.schema.type, first.schema.schema_data) == (pb.Schema.Avro, avro.schema_data)


def test_a_consumer_whose_connection_dies_while_subscribing_is_released(
        raw: Connect, topic: str) -> None:
    for attempt in range(5):  # the close lands before, during or after the topic's load
        doomed = _connected(raw)
        doomed.send(pb.CommandSubscribe(topic=topic, subscription="excl", consumer_id=1,
                                        request_id=1, subType=pb.CommandSubscribe.Exclusive))
        doomed.close()
        survivor = _connected(raw)
        survivor.timeout_s = 10.0
        reply = survivor.request(pb.CommandSubscribe(
            topic=topic, subscription="excl", consumer_id=1, request_id=2,
            subType=pb.CommandSubscribe.Exclusive), T.SUCCESS)
        assert reply.request_id == 2, attempt
        survivor.send(pb.CommandCloseConsumer(consumer_id=1, request_id=3))
        survivor.expect(T.SUCCESS)


def test_a_producer_whose_connection_dies_while_opening_is_released(
        raw: Connect, topic: str) -> None:
    for attempt in range(5):
        doomed = _connected(raw)
        doomed.send(pb.CommandProducer(topic=topic, producer_id=1, request_id=1,
                                       producer_name="only-one"))
        doomed.close()
        survivor = _connected(raw)
        survivor.timeout_s = 10.0
        reply = survivor.request(pb.CommandProducer(topic=topic, producer_id=1, request_id=2,
                                                    producer_name="only-one"),
                                 T.PRODUCER_SUCCESS)
        assert reply.producer_name == "only-one", attempt
        survivor.send(pb.CommandCloseProducer(producer_id=1, request_id=3))
        survivor.expect(T.SUCCESS)
