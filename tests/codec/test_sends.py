"""`decode_plain_send` against the ordinary decode: whatever it takes, `decode_frame` takes
with the same values, metadata and entry; what it leaves, `decode_frame` decides."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.codec import (
    ChecksumMismatch,
    Connection,
    Frame,
    RemoteProtocolError,
    Role,
    Send,
    base_command,
    decode_frame,
    decode_plain_send,
    decode_plain_send_in,
    encode_entry,
    encode_frame,
    pb,
)

U64 = st.integers(0, 2**64 - 1)
SMALL = st.integers(0, 2**22)  # the usual ids: one to four bytes
IDS = st.one_of(SMALL, U64)
TEXT = st.text(max_size=12)
# Fields outside the plain set, each of which makes a SEND not plain.
NOT_PLAIN = {
    "chunk_id": st.integers(0, 3),
    "num_chunks_from_msg": st.integers(1, 3), "deliver_at_time": st.integers(0, 2**40),
    "highest_sequence_id": IDS, "txnid_least_bits": U64, "marker_type": st.integers(0, 3),
    "encryption_algo": TEXT, "uuid": TEXT, "total_chunk_msg_size": st.integers(0, 99),
}


@st.composite
def commands(draw: st.DrawFn) -> pb.CommandSend:
    send = pb.CommandSend(producer_id=draw(IDS), sequence_id=draw(IDS))
    for name, values in (("highest_sequence_id", IDS), ("num_messages", st.integers(-3, 9)),
                         ("txnid_least_bits", U64), ("txnid_most_bits", U64),
                         ("is_chunk", st.booleans()), ("marker", st.booleans())):
        if draw(st.integers(0, 3)) == 0:
            setattr(send, name, draw(values))
    if draw(st.integers(0, 9)) == 0:
        send.message_id.ledgerId, send.message_id.entryId = draw(SMALL), draw(SMALL)
    return send


@st.composite
def metadatas(draw: st.DrawFn, plain: bool = False) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(producer_name=draw(TEXT), sequence_id=draw(IDS),
                                  publish_time=draw(U64))
    optional = {"partition_key": TEXT, "ordering_key": st.binary(max_size=5),
                "compression": st.sampled_from(list(pb.CompressionType.values())),
                "uncompressed_size": st.integers(0, 2**32 - 1), "event_time": U64,
                "schema_version": st.binary(max_size=5), "null_value": st.booleans(),
                "replicated_from": TEXT, "num_messages_in_batch": st.integers(-2, 2**31 - 1)}
    for name, values in optional.items():
        if draw(st.booleans()):
            setattr(metadata, name, draw(values))
    for _ in range(draw(st.integers(0, 2))):
        metadata.properties.add(key=draw(TEXT), value=draw(TEXT))
    metadata.replicate_to.extend(draw(st.lists(TEXT, max_size=2)))
    if not plain:
        for name in draw(st.lists(st.sampled_from(sorted(NOT_PLAIN)), max_size=2)):
            setattr(metadata, name, draw(NOT_PLAIN[name]))
    return metadata


def send_frame(send: pb.CommandSend, entry: bytes) -> bytes:
    """The frame without its totalSize prefix, as `decode_frame` takes it."""
    return encode_frame(base_command(send), entry=entry)[4:]


def assert_same(plain: Send, frame: bytes) -> None:
    """`decode_frame` decodes `frame` to what `plain` says."""
    ordinary = decode_frame(frame)
    assert isinstance(ordinary, Frame)
    send = ordinary.command.send
    assert (plain.producer_id, plain.sequence_id) == (send.producer_id, send.sequence_id)
    assert plain.highest_sequence_id == (send.highest_sequence_id
                                         if send.HasField("highest_sequence_id") else None)
    assert plain.num_messages == send.num_messages
    assert (plain.txnid_least_bits, plain.txnid_most_bits) == (send.txnid_least_bits,
                                                               send.txnid_most_bits)
    assert plain.metadata == ordinary.metadata
    assert plain.entry == ordinary.entry
    assert plain.payload_bytes == len(ordinary.payload)
    assert plain.checksum == ordinary.checksum


@settings(max_examples=150, deadline=None)
@given(commands(), metadatas(), st.binary(max_size=40), st.booleans())
def test_what_the_plain_decode_takes_decodes_the_same_the_ordinary_way(
        send: pb.CommandSend, metadata: pb.MessageMetadata, payload: bytes,
        checksum: bool) -> None:
    frame = send_frame(send, encode_entry(metadata, payload, checksum=checksum))
    plain = decode_plain_send(frame)
    if plain is not None:
        assert_same(plain, frame)
    taken = (not send.HasField("message_id") and send.num_messages >= 0
             and not any(metadata.HasField(name) for name in NOT_PLAIN))
    # Ten-byte varints (ids from 2**63) are left to the runtime.
    big = [send.producer_id, send.sequence_id, send.highest_sequence_id,
           send.txnid_least_bits, send.txnid_most_bits]
    if taken and max(big) < 2**63:
        assert plain is not None


@settings(max_examples=100, deadline=None)
@given(commands(), metadatas(plain=True), st.binary(min_size=1, max_size=20),
       st.data())
def test_a_damaged_send_is_left_to_the_ordinary_decode(
        send: pb.CommandSend, metadata: pb.MessageMetadata, payload: bytes,
        data: st.DataObject) -> None:
    """Bytes flipped, cut or added anywhere: the plain decode takes the frame only when
    the ordinary one decodes it to the same."""
    frame = bytearray(send_frame(send, encode_entry(metadata, payload,
                                                   checksum=data.draw(st.booleans()))))
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(0, len(frame) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            frame[where] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del frame[where]
        else:
            frame.insert(where, data.draw(st.integers(0, 255)))
    damaged = bytes(frame)
    plain = decode_plain_send(damaged)
    if plain is not None:
        assert_same(plain, damaged)


def raw_metadata(name: bytes) -> bytes:
    """MessageMetadata bytes with `name` as producer_name, unchecked."""
    return b"\x0a" + bytes((len(name),)) + name + b"\x10\x01\x18\x02"


def raw_entry(metadata: bytes, payload: bytes = b"x") -> bytes:
    return struct.pack(">I", len(metadata)) + metadata + payload


def test_a_string_that_is_not_utf8_is_left_to_the_ordinary_decode() -> None:
    frame = send_frame(pb.CommandSend(producer_id=1, sequence_id=2),
                       raw_entry(raw_metadata(b"\xff\xfe")))
    assert decode_plain_send(frame) is None
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        decode_frame(frame)


@settings(max_examples=100, deadline=None)
@given(TEXT, IDS, U64, st.binary(max_size=20), st.none() | st.integers(-2**31, 2**31 - 1))
def test_the_official_clients_metadata_shape_decodes_the_same(
        name: str, sequence_id: int, publish_time: int, payload: bytes,
        batch: int | None) -> None:
    """The required fields alone, in number order, then for a batch its count: the shape the
    C++ client writes for a lone message and a batch, which the plain decode checks by its
    bytes (`_OFFICIAL_TAIL`)."""
    metadata = pb.MessageMetadata(producer_name=name, sequence_id=sequence_id,
                                  publish_time=publish_time)
    if batch is not None:
        metadata.num_messages_in_batch = batch
    frame = send_frame(pb.CommandSend(producer_id=3, sequence_id=sequence_id % 2**22),
                       encode_entry(metadata, payload))
    plain = decode_plain_send(frame)
    assert plain is not None
    assert_same(plain, frame)


@pytest.mark.parametrize("varint", [b"\xff" * 9 + b"\x01", b"\xff" * 9 + b"\x7f",
                                    b"\x80" * 9 + b"\x00", b"\xff" * 10 + b"\x01"])
def test_long_varints_in_the_official_shape_decode_as_the_runtime_says(varint: bytes) -> None:
    for metadata in (b"\x0a\x01p\x10" + varint + b"\x18\x02",
                     b"\x0a\x01p\x10\x01\x18" + varint):
        frame = send_frame(pb.CommandSend(producer_id=1, sequence_id=2), raw_entry(metadata))
        plain = decode_plain_send(frame)
        if plain is not None:
            assert_same(plain, frame)
        else:
            with pytest.raises(RemoteProtocolError):
                decode_frame(frame)


def test_a_missing_required_field_or_bad_checksum_is_left_to_the_ordinary_decode() -> None:
    no_publish_time = b"\x0a\x01p\x10\x01"
    frame = send_frame(pb.CommandSend(producer_id=1, sequence_id=2),
                       raw_entry(no_publish_time))
    assert decode_plain_send(frame) is None
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    good = send_frame(pb.CommandSend(producer_id=1, sequence_id=2),
                      encode_entry(metadata, b"payload"))
    assert isinstance(decode_plain_send(good), Send)
    corrupt = good[:-1] + bytes((good[-1] ^ 1,))
    assert decode_plain_send(corrupt) is None
    assert isinstance(decode_frame(corrupt), ChecksumMismatch)


@settings(max_examples=100, deadline=None)
@given(commands(), metadatas(), st.binary(max_size=40), st.booleans(),
       st.binary(max_size=12), st.binary(max_size=12), st.integers(-3, 3))
def test_a_frame_decoded_in_place_decodes_as_the_frame_alone(
        send: pb.CommandSend, metadata: pb.MessageMetadata, payload: bytes, checksum: bool,
        before: bytes, after: bytes, cut: int) -> None:
    """`decode_plain_send_in` over a frame inside a larger buffer (other bytes before and
    after it, as in a connection's receive buffer), its end possibly moved, says what
    `decode_plain_send` says of exactly those bytes; the entry it keeps is a copy."""
    frame = send_frame(send, encode_entry(metadata, payload, checksum=checksum))
    end = max(len(before), len(before) + len(frame) + min(cut, len(after)))
    buffer = bytearray(before + frame + after)
    with memoryview(buffer) as view:
        in_place = decode_plain_send_in(buffer, view, len(before), end)
    assert in_place == decode_plain_send(bytes(buffer[len(before):end]))
    if in_place is not None:
        assert type(in_place.entry) is bytes
        original = bytes(buffer)
        buffer[:] = bytes(len(buffer))  # the Send keeps nothing of the buffer
        assert in_place.entry == original[end - len(in_place.entry):end]


def connected_broker(plain_sends: bool) -> Connection:
    broker = Connection(Role.BROKER, plain_sends=plain_sends)
    broker.receive_data(encode_frame(base_command(pb.CommandConnect(
        client_version="t", protocol_version=20))))
    assert len(list(broker.events())) == 1
    broker.send(base_command(pb.CommandConnected(server_version="t", protocol_version=20)))
    return broker


def test_a_broker_connection_hands_plain_sends_out_only_when_asked() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=5, publish_time=2)
    plain = encode_frame(base_command(pb.CommandSend(producer_id=1, sequence_id=5)),
                         entry=encode_entry(metadata, b"a"))
    chunk = pb.MessageMetadata(producer_name="p", sequence_id=6, publish_time=2,
                               chunk_id=0, num_chunks_from_msg=2, uuid="u")
    chunked = encode_frame(base_command(pb.CommandSend(producer_id=1, sequence_id=6)),
                           entry=encode_entry(chunk, b"b"))
    asked = connected_broker(plain_sends=True)
    asked.receive_data(plain + chunked)
    first, second = list(asked.events())
    assert isinstance(first, Send)
    assert first.sequence_id == 5
    assert isinstance(second, Frame)
    assert second.command.send.sequence_id == 6
    default = connected_broker(plain_sends=False)
    default.receive_data(plain)
    assert all(isinstance(event, Frame) for event in default.events())
