"""The frame layer: byte layouts, the handshake state machine, limits, and "garbage in gives
ProtocolError only". Every decode goes through `receive_three_ways` (whole, byte by byte, and
followed by the start of the next frame)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magnetar.codec import (
    CLIENT_TO_BROKER_TYPES,
    CPP_CLIENT_ACCEPTED_TYPES,
    NEED_DATA,
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Role,
    State,
    base_command,
    crc32c,
    decode_frame,
    encode_entry,
    encode_frame,
    parse_entry,
    pb,
)

from .helpers import (
    CONNECT,
    CONNECTED,
    TRAILING,
    connected,
    connected_pair,
    receive_three_ways,
    reject_three_ways,
)

T = pb.BaseCommand
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_broker() -> Connection:
    return connected(Role.BROKER)


def as_client() -> Connection:
    return connected(Role.CLIENT)


def frame_body(data: bytes) -> bytes:
    """A frame without its 4-byte size prefix (what decode_frame takes)."""
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    return data[4:]


# -- the byte-level examples of the wire reference, section 2.6 -------------------------------

CONNECT_FROM_CPP_CLIENT = bytes.fromhex(
    "00000029 00000025 0802 1221 0a11"
    + b"Pulsar-CPP-v4.2.0".hex()
    + "2014 2a04"
    + b"none".hex()
    + "5204 0801 1001"
)
SEND_HELLO = bytes.fromhex(
    "00000028 00000008 0806320408001000 0e01 09290a04 0000000d 0a027031100018 80d095ffbc31"
    + b"hello".hex()
)


def test_connect_from_the_cpp_client_decodes() -> None:
    [event] = receive_three_ways(lambda: Connection(Role.BROKER), CONNECT_FROM_CPP_CLIENT)
    assert isinstance(event, Frame)
    connect = event.command.connect
    assert event.type == T.CONNECT
    assert connect.client_version == "Pulsar-CPP-v4.2.0"
    assert connect.protocol_version == 20
    assert connect.auth_method_name == "none"
    assert connect.feature_flags.supports_auth_refresh
    assert connect.feature_flags.supports_broker_entry_metadata


def test_connected_ping_pong_receipt_bytes() -> None:
    connected_bytes = encode_frame(
        base_command(
            pb.CommandConnected(
                server_version="MyBroker-0.1", protocol_version=20, max_message_size=5242880
            )
        )
    )
    assert connected_bytes == bytes.fromhex(
        "0000001d 00000019 0803 1a15 0a0c" + b"MyBroker-0.1".hex() + "1014 188080c002"
    )
    assert encode_frame(base_command(pb.CommandPing())) == bytes.fromhex(
        "00000009000000050812920100"
    )
    assert encode_frame(base_command(pb.CommandPong())) == bytes.fromhex(
        "000000090000000508139a0100"
    )
    receipt = pb.CommandSendReceipt(
        producer_id=0, sequence_id=0, message_id=pb.MessageIdData(ledgerId=3, entryId=0)
    )
    assert encode_frame(base_command(receipt)) == bytes.fromhex(
        "00000012 0000000e 0807 3a0a 08001000 1a04 08031000"
    )


def test_send_of_hello_matches_the_reference_bytes_and_decodes() -> None:
    metadata = pb.MessageMetadata(producer_name="p1", sequence_id=0, publish_time=1700000000000)
    send = base_command(pb.CommandSend(producer_id=0, sequence_id=0))
    assert encode_frame(send, metadata, b"hello") == SEND_HELLO
    [event] = receive_three_ways(as_broker, SEND_HELLO)
    assert isinstance(event, Frame)
    assert event.metadata == metadata
    assert event.payload == b"hello"
    assert event.checksum == 0x09290A04
    assert event.entry == SEND_HELLO[16:]
    assert parse_entry(event.entry).payload == b"hello"


def test_message_frame_delivers_the_stored_entry_verbatim() -> None:
    entry = SEND_HELLO[16:]
    message = pb.CommandMessage(
        consumer_id=0, message_id=pb.MessageIdData(ledgerId=3, entryId=0, partition=-1)
    )
    data = encode_frame(base_command(message), entry=entry)
    assert (
        data
        == bytes.fromhex("00000037 00000017 0809 4a13 0800 120f 0803 1000 18ffffffffffffffffff01")
        + entry
    )
    [event] = receive_three_ways(as_client, data)
    assert isinstance(event, Frame)
    assert event.command.message.message_id.partition == -1
    assert event.entry == entry
    assert event.payload == b"hello"


def test_broker_entry_metadata_prefix_is_recognised() -> None:
    prefix = pb.BrokerEntryMetadata(broker_timestamp=1700000000001, index=41)
    message = pb.CommandMessage(consumer_id=5, message_id=pb.MessageIdData(ledgerId=1, entryId=2))
    data = encode_frame(base_command(message), entry=SEND_HELLO[16:], broker_entry_metadata=prefix)
    assert data[4 + 4 + int.from_bytes(data[4:8], "big") :][:2] == b"\x0e\x02"
    [event] = receive_three_ways(as_client, data)
    assert isinstance(event, Frame)
    assert event.broker_entry_metadata == prefix
    assert event.payload == b"hello"
    assert event.entry == SEND_HELLO[16:]


def test_frames_without_checksum_are_accepted() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=4)
    send = base_command(pb.CommandSend(producer_id=1, sequence_id=3))
    data = encode_frame(send, metadata, b"abc", checksum=False)
    [event] = receive_three_ways(as_broker, data)
    assert isinstance(event, Frame)
    assert event.checksum is None
    assert event.payload == b"abc"


def test_checksum_covers_metadata_size_metadata_and_payload() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=4)
    entry = encode_entry(metadata, b"payload")
    assert entry[:2] == b"\x0e\x01"
    assert int.from_bytes(entry[2:6], "big") == crc32c(entry[6:])
    assert crc32c(b"123456789") == 0xE3069283


def test_corrupt_payload_gives_checksum_mismatch_and_the_connection_goes_on() -> None:
    corrupt = bytearray(SEND_HELLO)
    corrupt[-1] ^= 0x01
    events = receive_three_ways(
        as_broker, bytes(corrupt) + encode_frame(base_command(pb.CommandPing()))
    )
    mismatch, ping = events
    assert isinstance(mismatch, ChecksumMismatch)
    assert mismatch.expected == 0x09290A04
    assert mismatch.actual != mismatch.expected
    assert mismatch.command.send.sequence_id == 0
    assert isinstance(ping, Frame)
    assert ping.type == T.PING
    with pytest.raises(RemoteProtocolError):
        parse_entry(bytes(corrupt[16:]))


# -- handshake and state machine ----------------------------------------------------------------


def test_handshake_moves_both_sides_to_connected() -> None:
    client = Connection(Role.CLIENT)
    broker = Connection(Role.BROKER)
    assert client.state is broker.state is State.IDLE
    broker.receive_data(client.send(CONNECT))
    assert client.state is State.CONNECTING
    [connect] = broker.events()
    assert isinstance(connect, Frame)
    assert broker.state is State.CONNECTING
    client.receive_data(broker.send(CONNECTED))
    assert broker.state is State.CONNECTED
    [reply] = client.events()
    assert isinstance(reply, Frame)
    assert client.state is State.CONNECTED


def test_auth_challenge_round_during_the_handshake() -> None:
    client = Connection(Role.CLIENT)
    broker = Connection(Role.BROKER)
    broker.receive_data(client.send(CONNECT))
    list(broker.events())
    client.receive_data(broker.send(base_command(pb.CommandAuthChallenge(server_version="b"))))
    list(client.events())
    broker.receive_data(client.send(base_command(pb.CommandAuthResponse(client_version="c"))))
    list(broker.events())
    assert client.state is broker.state is State.CONNECTING
    client.receive_data(broker.send(CONNECTED))
    list(client.events())
    assert client.state is broker.state is State.CONNECTED


def test_auth_refresh_round_after_the_handshake() -> None:
    """Credential refresh: the broker challenges a connected client, which answers; both stay
    connected (the C++ client accepts AUTH_CHALLENGE at any time)."""
    client = Connection(Role.CLIENT)
    broker = Connection(Role.BROKER)
    broker.receive_data(client.send(CONNECT))
    list(broker.events())
    client.receive_data(broker.send(CONNECTED))
    list(client.events())
    challenge = pb.CommandAuthChallenge(
        server_version="b", challenge=pb.AuthData(auth_method_name="token",
                                                  auth_data=b"PulsarAuthRefresh"))
    client.receive_data(broker.send(base_command(challenge)))
    [received] = client.events()
    assert isinstance(received, Frame)
    assert received.command.authChallenge.challenge.auth_data == b"PulsarAuthRefresh"
    response = pb.CommandAuthResponse(client_version="c", response=pb.AuthData(
        auth_method_name="token", auth_data=b"fresh"))
    broker.receive_data(client.send(base_command(response)))
    [answer] = broker.events()
    assert isinstance(answer, Frame)
    assert answer.command.authResponse.response.auth_data == b"fresh"
    assert client.state is broker.state is State.CONNECTED


def test_rejecting_the_handshake_closes_both_sides() -> None:
    client = Connection(Role.CLIENT)
    broker = Connection(Role.BROKER)
    broker.receive_data(client.send(CONNECT))
    list(broker.events())
    error = pb.CommandError(request_id=(1 << 64) - 1, error=pb.AuthenticationError, message="no")
    client.receive_data(broker.send(base_command(error)))
    assert broker.state is State.CLOSED
    [event] = client.events()
    assert isinstance(event, Frame)
    assert client.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        client.send(base_command(pb.CommandPing()))


def test_nothing_but_connect_may_open_a_connection() -> None:
    ping = encode_frame(base_command(pb.CommandPing()))
    reason = reject_three_ways(lambda: Connection(Role.BROKER), ping)
    assert "handshake" in reason
    with pytest.raises(LocalProtocolError):
        Connection(Role.CLIENT).send(base_command(pb.CommandPing()))
    with pytest.raises(LocalProtocolError):
        Connection(Role.BROKER).send(CONNECTED)


def test_commands_in_the_wrong_direction_are_refused() -> None:
    message = pb.CommandMessage(consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=1))
    data = encode_frame(base_command(message), entry=SEND_HELLO[16:])
    assert "does not send" in reject_three_ways(as_broker, data)
    assert "does not send" in reject_three_ways(as_client, SEND_HELLO)
    with pytest.raises(LocalProtocolError):
        as_client().send(base_command(message), entry=SEND_HELLO[16:])


def test_handshake_commands_may_not_repeat() -> None:
    client, broker = connected_pair()
    with pytest.raises(LocalProtocolError):
        client.send(CONNECT)
    with pytest.raises(LocalProtocolError):
        broker.send(CONNECTED)
    assert "after the handshake" in reject_three_ways(as_broker, encode_frame(CONNECT))


def test_broker_will_not_send_what_the_cpp_client_cannot_handle() -> None:
    broker = as_broker()
    end_of_topic = base_command(pb.CommandReachedEndOfTopic(consumer_id=1))
    with pytest.raises(LocalProtocolError, match="cannot handle"):
        broker.send(end_of_topic)
    assert broker.state is State.CONNECTED
    broker.peer_accepted_types = None  # e.g. a Java client, which handles it
    assert broker.send(end_of_topic)


ALL_TYPES = sorted(pb.BaseCommand.Type.values())


def _sample_command(command_type: int) -> pb.BaseCommand:
    """A valid BaseCommand of any type: required fields filled with zeros."""
    command = pb.BaseCommand(type=command_type)  # type: ignore[arg-type]
    name = pb.BaseCommand.DESCRIPTOR.fields_by_number[command_type].name
    body = getattr(command, name)
    body.SetInParent()
    _fill_required(body)
    return command


def _fill_required(message: object) -> None:
    for field in message.DESCRIPTOR.fields:  # type: ignore[attr-defined]
        if not field.is_required:
            continue
        if field.message_type is not None:
            child = getattr(message, field.name)
            child.SetInParent()
            _fill_required(child)
        elif field.type == field.TYPE_STRING:
            setattr(message, field.name, "")
        elif field.type == field.TYPE_BYTES:
            setattr(message, field.name, b"")
        elif field.enum_type is not None:
            setattr(message, field.name, field.enum_type.values[0].number)
        else:
            setattr(message, field.name, 0)


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("state", [State.IDLE, State.CONNECTING, State.CONNECTED])
def test_every_state_and_command_is_legal_or_a_protocol_error(role: Role, state: State) -> None:
    """h2-style transition check: for each (role, state, command, direction) the result is a
    legal state or a ProtocolError, and the reference outcomes hold."""
    outcomes = {}
    for command_type in ALL_TYPES:
        command = _sample_command(command_type)
        metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
        extra = {"metadata": metadata} if command_type in (T.SEND, T.MESSAGE) else {}
        for direction in ("send", "receive"):
            conn = _in_state(role, state)
            try:
                if direction == "send":
                    conn.send(command, **extra)  # type: ignore[arg-type]
                else:
                    conn.receive_data(encode_frame(command, **extra))  # type: ignore[arg-type]
                    assert isinstance(conn.next_event(), Frame)
            except ProtocolError:
                outcomes[(command_type, direction)] = None
                continue
            assert conn.state in (State.CONNECTING, State.CONNECTED, State.CLOSED)
            outcomes[(command_type, direction)] = conn.state
    sending = CLIENT_TO_BROKER_TYPES if role is Role.CLIENT else CPP_CLIENT_ACCEPTED_TYPES
    for (command_type, direction), outcome in outcomes.items():
        if state is State.CONNECTED and command_type not in (T.CONNECT, T.CONNECTED):
            allowed = direction == "send" and command_type in sending
            allowed |= direction == "receive" and _peer_sends(role, command_type)
            assert (outcome is State.CONNECTED) == allowed, (T.Type.Name(command_type), direction)
    if state is State.IDLE:
        legal = {k for k, v in outcomes.items() if v is not None}
        first = (T.CONNECT, "send" if role is Role.CLIENT else "receive")
        assert legal == {first}


def _peer_sends(role: Role, command_type: int) -> bool:
    if role is Role.BROKER:
        return command_type in CLIENT_TO_BROKER_TYPES
    from magnetar.codec import BROKER_TO_CLIENT_TYPES

    return command_type in BROKER_TO_CLIENT_TYPES


def _in_state(role: Role, state: State) -> Connection:
    if state is State.IDLE:
        return Connection(role)
    if state is State.CONNECTED:
        return connected(role)
    conn = Connection(role)
    if role is Role.CLIENT:
        conn.send(CONNECT)
    else:
        conn.receive_data(encode_frame(CONNECT))
        assert isinstance(conn.next_event(), Frame)
    assert conn.state is State.CONNECTING
    return conn


# -- limits and malformed frames ------------------------------------------------------------------


def test_oversized_frame_is_refused_as_soon_as_its_size_arrives() -> None:
    conn = Connection(Role.BROKER, frame_size_bytes_max=1024)
    conn.receive_data((1025).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        conn.next_event()
    assert conn.state is State.ERROR
    sender = Connection(Role.CLIENT, frame_size_bytes_max=1024)
    sender.send(CONNECT)
    send = base_command(pb.CommandSend(producer_id=0, sequence_id=0))
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
    with pytest.raises(LocalProtocolError, match="exceeds"):
        encode_frame(send, metadata, b"x" * 2000, frame_size_bytes_max=1024)


def test_default_frame_limit_is_max_message_size_plus_padding() -> None:
    conn = as_broker()
    assert conn.frame_size_bytes_max == 5 * 1024 * 1024 + 10 * 1024
    big = (conn.frame_size_bytes_max + 1).to_bytes(4, "big")
    assert "exceeds" in reject_three_ways(as_broker, big)


MALFORMED = {
    "size below command size field": bytes.fromhex("00000002 0000"),
    "command size past the frame": bytes.fromhex("00000006 000000ff 0812"),
    "not protobuf": bytes.fromhex("00000007 00000003 ffffff"),
    "missing type": bytes.fromhex("00000006 00000002 9201"),
    "unknown type": bytes.fromhex("00000006 00000002 0846"),
    "sub-command missing": bytes.fromhex("00000006 00000002 0806"),
    "required field missing": bytes.fromhex("00000008 00000004 08063200"),
    "bytes after a simple command": bytes.fromhex("0000000a 00000005 0812920100 ff"),
    "send without metadata": bytes.fromhex("0000000c 00000008 0806320408001000"),
    "metadata size past the end": bytes.fromhex("00000010 00000008 0806320408001000 000000ff"),
    "checksum cut short": bytes.fromhex("0000000f 00000008 0806320408001000 0e0101"),
    "invalid utf-8 string": bytes.fromhex("0000000c 00000008 0802 1204 0a02c328"),
    "metadata lacks required": bytes.fromhex("00000012 00000008 0806320408001000 00000002 0a00"),
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_raise_remote_protocol_error(data: bytes) -> None:
    # Byte 9 is the command type: a CONNECT goes to a fresh broker, the rest to a connected one.
    make = (lambda: Connection(Role.BROKER)) if data[9:10] == b"\x02" else as_broker
    reject_three_ways(make, data)
    with pytest.raises(RemoteProtocolError):
        decode_frame(frame_body(data)) if len(data) >= 4 else None


def test_peer_closing_mid_frame_is_an_error_and_at_a_boundary_is_an_event() -> None:
    conn = as_broker()
    conn.receive_data(SEND_HELLO[:10])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        conn.next_event()
    clean = as_broker()
    clean.receive_data(SEND_HELLO)
    clean.receive_data(b"")
    assert [type(e) for e in clean.events()] == [Frame, ConnectionClosed]
    assert clean.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        clean.receive_data(b"more")


def test_many_frames_in_one_buffer_and_split_anywhere() -> None:
    pings = encode_frame(base_command(pb.CommandPing())) * 50 + SEND_HELLO * 50
    events = receive_three_ways(as_broker, pings)
    assert [e.type for e in events if isinstance(e, Frame)] == [T.PING] * 50 + [T.SEND] * 50
    conn = as_broker()
    chunks = [pings[i : i + 7] for i in range(0, len(pings), 7)]
    got = []
    for chunk in chunks:
        conn.receive_data(chunk)
        got.extend(conn.events())
    assert got == events


# -- property tests -----------------------------------------------------------------------------

texts = st.text(max_size=20)
metadata_strategy = st.builds(
    lambda name, seq, time, key, props, batch: _metadata(name, seq, time, key, props, batch),
    texts,
    st.integers(0, (1 << 64) - 1),
    st.integers(0, (1 << 64) - 1),
    st.none() | texts,
    st.dictionaries(texts, texts, max_size=3),
    st.none() | st.integers(0, 1000),
)


def _metadata(
    name: str, seq: int, time: int, key: str | None, props: dict[str, str], batch: int | None
) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(producer_name=name, sequence_id=seq, publish_time=time)
    if key is not None:
        metadata.partition_key = key
    for k, v in props.items():
        metadata.properties.add(key=k, value=v)
    if batch is not None:
        metadata.num_messages_in_batch = batch
    return metadata


@SETTINGS
@given(
    producer_id=st.integers(0, (1 << 64) - 1),
    sequence_id=st.integers(0, (1 << 64) - 1),
    metadata=metadata_strategy,
    payload=st.binary(max_size=300),
    checksum=st.booleans(),
)
def test_send_frames_round_trip(
    producer_id: int, sequence_id: int, metadata: pb.MessageMetadata, payload: bytes, checksum: bool
) -> None:
    command = base_command(pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id))
    data = encode_frame(command, metadata, payload, checksum=checksum)
    [event] = receive_three_ways(as_broker, data)
    assert isinstance(event, Frame)
    assert event.command == command
    assert event.metadata == metadata
    assert event.payload == payload
    assert (event.checksum is not None) == checksum
    assert parse_entry(event.entry).metadata == metadata


@SETTINGS
@given(
    request_id=st.integers(0, (1 << 64) - 1),
    topic=texts,
    partitions=st.integers(0, (1 << 32) - 1),
)
def test_simple_frames_round_trip(request_id: int, topic: str, partitions: int) -> None:
    lookup = base_command(pb.CommandLookupTopic(topic=topic, request_id=request_id))
    [event] = receive_three_ways(as_broker, encode_frame(lookup))
    assert isinstance(event, Frame)
    assert event.command == lookup
    reply = base_command(
        pb.CommandPartitionedTopicMetadataResponse(
            request_id=request_id,
            partitions=partitions,
            response=pb.CommandPartitionedTopicMetadataResponse.Success,
        )
    )
    [event] = receive_three_ways(as_client, encode_frame(reply))
    assert isinstance(event, Frame)
    assert event.body == reply.partitionMetadataResponse
    assert event.body.HasField("response")


def _feed_garbage(role: Role, data: bytes) -> None:
    """Any input either yields events or raises ProtocolError; both feeding modes agree."""
    outcomes = []
    for chunks in ([data] if data else [], [data[i : i + 1] for i in range(len(data))]):
        conn = connected(role)
        events: list[object] = []
        try:
            for chunk in chunks:
                conn.receive_data(chunk)
                events.extend(conn.events())
            conn.receive_data(b"")
            events.extend(conn.events())
            outcome: object = events
        except ProtocolError as exc:
            outcome = ("error", exc.reason)
            assert conn.state is State.ERROR
        outcomes.append(outcome)
    assert outcomes[0] == outcomes[1]


@SETTINGS
@given(data=st.binary(max_size=200), role=st.sampled_from(list(Role)))
def test_random_bytes_give_events_or_protocol_error_only(data: bytes, role: Role) -> None:
    _feed_garbage(role, data)


@SETTINGS
@given(data=st.binary(min_size=4, max_size=120), role=st.sampled_from(list(Role)))
def test_random_frame_bodies_with_a_valid_size_prefix(data: bytes, role: Role) -> None:
    _feed_garbage(role, len(data).to_bytes(4, "big") + data)


REAL_FRAMES = [
    SEND_HELLO,
    CONNECT_FROM_CPP_CLIENT,
    encode_frame(
        base_command(pb.CommandSend(producer_id=7, sequence_id=9, num_messages=2)),
        _metadata("producer", 9, 1700000000000, "key", {"a": "b"}, 2),
        b"\x00\x00\x00\x04\x18\x01\x40\x09X\x00\x00\x00\x04\x18\x01\x40\x0aY",
    ),
]


@pytest.mark.parametrize("frame", REAL_FRAMES, ids=["send", "connect", "batch"])
def test_every_truncation_and_bit_flip_of_real_frames(frame: bytes) -> None:
    for cut in range(len(frame)):
        _feed_garbage(Role.BROKER, frame[:cut])
    for position, bit in itertools.product(range(len(frame)), range(8)):
        flipped = bytearray(frame)
        flipped[position] ^= 1 << bit
        _feed_garbage(Role.BROKER, bytes(flipped))


def test_trailing_helper_is_the_start_of_a_ping() -> None:
    ping = encode_frame(base_command(pb.CommandPing()))
    assert ping.startswith(TRAILING)


def _with_bad_utf8(metadata: pb.MessageMetadata, good: str) -> bytes:
    """Serialize, then turn the UTF-8 of `good` into bytes that are not UTF-8 (same length)."""
    data = metadata.SerializeToString()
    assert data.count(good.encode()) == 1
    return data.replace(good.encode(), b"\xff" * len(good.encode()))


@pytest.mark.parametrize("where", ["producer_name", "property value", "replicate_to"])
def test_strings_that_are_not_utf8_are_refused_anywhere_in_the_metadata(where: str) -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
    metadata.properties.add(key="k", value="v")
    metadata.replicate_to.append("r")
    if where == "producer_name":
        metadata.producer_name = "PRODUCER"
        raw = _with_bad_utf8(metadata, "PRODUCER")
    elif where == "property value":
        metadata.properties[0].value = "VALUE"
        raw = _with_bad_utf8(metadata, "VALUE")
    else:
        metadata.replicate_to[0] = "CLUSTER"
        raw = _with_bad_utf8(metadata, "CLUSTER")
    entry = len(raw).to_bytes(4, "big") + raw + b"body"
    send = base_command(pb.CommandSend(producer_id=0, sequence_id=0))
    data = encode_frame(send, entry=entry)
    assert "UTF-8" in reject_three_ways(as_broker, data)
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        parse_entry(entry)


def test_strings_that_are_not_utf8_are_refused_in_sub_commands() -> None:
    producer = pb.CommandProducer(topic="TOPIC", producer_id=1, request_id=2)
    producer.metadata.add(key="k", value="v")
    body = base_command(producer).SerializeToString().replace(b"TOPIC", b"\xc3\x28\xc3\x28\xff")
    data = (len(body) + 4).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body
    assert "UTF-8" in reject_three_ways(as_broker, data)
