"""Message ids: Pulsar's ordering, both string forms, and serialization identical to the official
client's `MessageId.serialize()` in both directions."""

from __future__ import annotations

import itertools

import pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.codec import EARLIEST, LATEST, MessageId, RemoteProtocolError, pb

from .helpers import decode_whole_prefixes_trailing

INT64_MAX = (1 << 63) - 1

longs = st.integers(-1, INT64_MAX) | st.sampled_from([-1, 0, INT64_MAX])
ints = st.integers(-1, (1 << 31) - 1)
plain_ids = st.builds(MessageId, longs, longs, ints, ints)
ids_with_size = st.builds(MessageId, longs, longs, ints, ints, st.integers(0, 1000))
# Chunk ids as a consumer builds them: both chunks on the same partition, no batch index (the
# serialized form keeps neither batch indexes nor a first-chunk partition of its own).
chunk_ids = st.builds(
    lambda first_ledger, first_entry, ledger, entry, partition: MessageId(
        ledger, entry, partition, first_chunk=MessageId(first_ledger, first_entry, partition)
    ),
    longs,
    longs,
    longs,
    longs,
    ints,
)


def test_earliest_and_latest() -> None:
    assert (EARLIEST.ledger_id, EARLIEST.entry_id) == (-1, -1)
    assert (LATEST.ledger_id, LATEST.entry_id) == (INT64_MAX, INT64_MAX)
    assert EARLIEST < MessageId(0, 0) < LATEST
    assert EARLIEST.serialize() == bytes.fromhex("08ffffffffffffffffff01 10ffffffffffffffffff01")


def test_ordering_is_ledger_entry_partition_batch_signed() -> None:
    ordered = [
        MessageId(-1, -1),
        MessageId(0, 5, 3, 9),
        MessageId(1, 0, -1, -1),
        MessageId(1, 0, -1, 0),
        MessageId(1, 0, 0, -1),
        MessageId(1, 1),
        MessageId(2, 0),
        MessageId(INT64_MAX, INT64_MAX),
    ]
    assert sorted(reversed(ordered)) == ordered
    for a, b in itertools.pairwise(ordered):
        assert a < b
        assert a <= b
        assert b > a
        assert b >= a
        assert a != b


def test_equality_ignores_batch_size_and_chunk_reference() -> None:
    plain = MessageId(3, 4, 1, 2)
    assert plain == MessageId(3, 4, 1, 2, batch_size=10)
    assert plain == MessageId(3, 4, 1, 2, first_chunk=MessageId(3, 1, 1))
    assert hash(plain) == hash(MessageId(3, 4, 1, 2, batch_size=10))
    assert plain != MessageId(3, 4, 1, 3)
    assert plain != MessageId(3, 4, -1, 2)
    assert plain.entry() == MessageId(3, 4, 1)
    assert plain.__eq__("3:4:1:2") is NotImplemented


def test_string_forms() -> None:
    assert str(MessageId(7, 3)) == "7:3:-1"
    assert str(MessageId(7, 3, -1, 2)) == "7:3:-1:2"
    assert str(MessageId(7, 3, 1, 2)) == "7:3:1:2"
    assert MessageId(7, 3).to_cpp_string() == "(7,3,-1,-1)"
    assert MessageId(7, 3, 1, 2).to_cpp_string() == "(7,3,1,2)"
    chunk = MessageId(7, 7, first_chunk=MessageId(7, 5))
    assert str(chunk) == "7:5:-1;7:7:-1"
    assert chunk.to_cpp_string() == "(7,5,-1,-1);(7,7,-1,-1)"
    assert chunk.is_chunk
    assert not MessageId(7, 5).is_chunk


@settings(max_examples=100, deadline=None)
@given(message_id=plain_ids | chunk_ids)
def test_string_forms_parse_back(message_id: MessageId) -> None:
    for text in (str(message_id), message_id.to_cpp_string()):
        parsed = MessageId.parse(text)
        assert parsed == message_id
        assert parsed.first_chunk == message_id.first_chunk


@pytest.mark.parametrize(
    "text", ["", "1:2", "1:2:3:4:5", "(1,2,3)", "a:b:c", "1;2;3", "1:2:3;", "9" * 20 + ":0:0"]
)
def test_bad_strings_are_refused(text: str) -> None:
    with pytest.raises(RemoteProtocolError):
        MessageId.parse(text)


def test_values_out_of_range_are_programmer_errors() -> None:
    with pytest.raises(ValueError, match="ledger_id"):
        MessageId(1 << 63, 0)
    with pytest.raises(ValueError, match="partition"):
        MessageId(0, 0, 1 << 31)
    with pytest.raises(ValueError, match="chunk"):
        MessageId(0, 0, first_chunk=MessageId(0, 0, first_chunk=MessageId(0, 0)))


def _all_fields(data: bytes) -> tuple[object, ...]:
    parsed = MessageId.deserialize(data)
    return (
        parsed.ledger_id,
        parsed.entry_id,
        parsed.partition,
        parsed.batch_index,
        parsed.batch_size,
        parsed.first_chunk and parsed.first_chunk.to_cpp_string(),
    )


@settings(max_examples=100, deadline=None)
@given(message_id=ids_with_size | chunk_ids)
def test_serialization_round_trips(message_id: MessageId) -> None:
    data = message_id.serialize()
    # A prefix of a protobuf message can be a valid, shorter message: it just must not decode to
    # the same id, compared on every field.
    everything = decode_whole_prefixes_trailing(_all_fields, data, strict=False)
    back = MessageId.deserialize(data)
    assert everything == _all_fields(data)
    assert back == message_id
    assert back.first_chunk == message_id.first_chunk
    if not message_id.is_chunk:
        assert back.batch_size == message_id.batch_size


@settings(max_examples=100, deadline=None)
@given(message_id=ids_with_size | chunk_ids)
def test_proto_form_keeps_everything(message_id: MessageId) -> None:
    back = MessageId.from_proto(message_id.to_proto())
    assert back == message_id
    assert back.batch_size == message_id.batch_size
    assert back.first_chunk == message_id.first_chunk


def test_java_style_bytes_with_batch_size_zero_are_accepted() -> None:
    java = pb.MessageIdData(ledgerId=5, entryId=6, batch_size=0).SerializeToString()
    assert MessageId.deserialize(java) == MessageId(5, 6)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=40))
def test_garbage_gives_protocol_error_only(data: bytes) -> None:
    try:
        parsed = MessageId.deserialize(data)
    except RemoteProtocolError:
        return
    assert isinstance(parsed, MessageId)


def test_nested_chunk_references_are_refused() -> None:
    inner = pb.MessageIdData(ledgerId=1, entryId=1)
    inner.first_chunk_message_id.CopyFrom(pb.MessageIdData(ledgerId=0, entryId=0))
    outer = pb.MessageIdData(ledgerId=2, entryId=2)
    outer.first_chunk_message_id.CopyFrom(inner)
    with pytest.raises(RemoteProtocolError, match="nested"):
        MessageId.deserialize(outer.SerializeToString())


# -- interop with the official package ------------------------------------------------------------

INTEROP_IDS = [
    MessageId(1, 2),
    MessageId(0, 0),
    MessageId(7, 3, 0, 0),
    MessageId(7, 3, 5, 12),
    MessageId(7, 3, -1, 4, batch_size=10),
    MessageId(INT64_MAX, INT64_MAX),
    MessageId(-1, -1),
    MessageId(123456789012, 987654321, 41, -1),
    MessageId(5, 6, first_chunk=MessageId(1, 2)),
    MessageId(5, 6, 2, first_chunk=MessageId(1, 2, 2)),
    MessageId(5, 6, 0, first_chunk=MessageId(1, 2, -1)),
]


def _theirs(message_id: MessageId) -> pulsar.MessageId:
    if message_id.is_chunk or message_id.batch_size:
        # The Python API builds such ids only through deserialize: feed it the full proto form.
        return pulsar.MessageId.deserialize(message_id.to_proto().SerializeToString())
    return pulsar.MessageId(
        message_id.partition, message_id.ledger_id, message_id.entry_id, message_id.batch_index
    )


@pytest.mark.interop
@pytest.mark.parametrize("message_id", INTEROP_IDS, ids=str)
def test_serialize_is_byte_identical_to_the_official_client(message_id: MessageId) -> None:
    theirs = _theirs(message_id)
    assert message_id.serialize() == theirs.serialize()
    assert message_id.to_cpp_string() == str(theirs)


@pytest.mark.interop
@pytest.mark.parametrize("message_id", INTEROP_IDS, ids=str)
def test_they_parse_what_we_serialize_and_we_parse_what_they_serialize(
    message_id: MessageId,
) -> None:
    parsed_there = pulsar.MessageId.deserialize(message_id.serialize())
    assert (
        parsed_there.ledger_id(),
        parsed_there.entry_id(),
        parsed_there.partition(),
        parsed_there.batch_index(),
    ) == (
        message_id.ledger_id,
        message_id.entry_id,
        message_id.partition,
        -1 if message_id.is_chunk else message_id.batch_index,
    )
    parsed_here = MessageId.deserialize(_theirs(message_id).serialize())
    assert parsed_here.to_cpp_string() == str(_theirs(message_id))


@pytest.mark.interop
def test_earliest_and_latest_match_the_official_constants() -> None:
    assert EARLIEST.serialize() == pulsar.MessageId.earliest.serialize()
    assert LATEST.serialize() == pulsar.MessageId.latest.serialize()
    assert MessageId.deserialize(pulsar.MessageId.latest.serialize()) == LATEST
    assert LATEST.to_cpp_string() == str(pulsar.MessageId.latest)
