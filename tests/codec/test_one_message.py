"""`holds_one_message` never says "one message" of an entry whose metadata holds
`num_messages_in_batch`: over arbitrary metadata (batch counts included), arbitrary bytes as
metadata (overlong keys too), with and without checksum and broker entry metadata."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from magnetar.codec import (
    RemoteProtocolError,
    encode_entry,
    holds_one_message,
    parse_entry_metadata,
    pb,
    prefix_broker_entry_metadata,
)

U64 = st.integers(0, 2**64 - 1)
BATCH_KEY = 11 << 3  # num_messages_in_batch, varint


@st.composite
def metadatas(draw: st.DrawFn) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(producer_name=draw(st.text(max_size=12)),
                                  sequence_id=draw(U64), publish_time=draw(U64))
    if draw(st.booleans()):
        metadata.num_messages_in_batch = draw(st.integers(-3, 2**31 - 1))
    if draw(st.booleans()):
        metadata.partition_key = draw(st.text(max_size=8))
    if draw(st.booleans()):
        metadata.uncompressed_size = draw(st.integers(0, 2**32 - 1))
    return metadata


def raw_entry(metadata: bytes, payload: bytes, checksum: bool) -> bytes:
    head = b"\x0e\x01" + struct.pack(">I", 0) if checksum else b""
    return head + struct.pack(">I", len(metadata)) + metadata + payload


def has_batch_count(entry: bytes) -> bool | None:
    """Whether the parsed metadata holds the field; None when the entry does not parse."""
    try:
        metadata = parse_entry_metadata(entry, validated=True)[0]
    except RemoteProtocolError:
        return None
    return metadata.HasField("num_messages_in_batch")


@given(metadatas(), st.binary(max_size=20), st.booleans(), st.booleans())
def test_a_batch_count_is_never_missed(metadata: pb.MessageMetadata, payload: bytes,
                                       checksum: bool, block: bool) -> None:
    entry = encode_entry(metadata, payload, checksum=checksum)
    if block:
        entry = prefix_broker_entry_metadata(pb.BrokerEntryMetadata(index=7), entry)
    if holds_one_message(entry):
        assert not metadata.HasField("num_messages_in_batch")
        assert has_batch_count(entry) is False


@given(st.binary(max_size=30), st.binary(max_size=5), st.booleans(),
       st.sampled_from([b"", bytes((BATCH_KEY, 5)), bytes((BATCH_KEY | 0x80, 0x00, 5)),
                        bytes((BATCH_KEY | 0x80, 0x80, 0x80, 0x00, 9))]))
def test_arbitrary_metadata_bytes_and_overlong_keys(metadata: bytes, payload: bytes,
                                                    checksum: bool, extra: bytes) -> None:
    entry = raw_entry(metadata + extra, payload, checksum)
    if holds_one_message(entry):
        assert has_batch_count(entry) in (False, None)  # None: the full parse refuses it


def test_answers_for_plain_and_batched_entries() -> None:
    single = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    batch = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2,
                               num_messages_in_batch=3)
    assert holds_one_message(encode_entry(single, b"x" * 100))
    assert holds_one_message(prefix_broker_entry_metadata(
        pb.BrokerEntryMetadata(index=5, broker_timestamp=9), encode_entry(single, b"x")))
    assert not holds_one_message(encode_entry(batch, b"x" * 100))
    # A byte of the field's key inside another field's value: not known without a parse.
    named = pb.MessageMetadata(producer_name="X", sequence_id=1, publish_time=2)
    assert not holds_one_message(encode_entry(named, b""))


def test_truncated_entries_are_left_to_the_parse() -> None:
    entry = encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2),
                         b"x")
    for cut in range(len(entry) - 1):
        short = entry[:cut]
        if holds_one_message(short):
            assert has_batch_count(short) is False
    assert not holds_one_message(b"\x0e\x02\x00")
    assert not holds_one_message(b"\x0e\x02\x00\x00\x00\x09abc")
    assert not holds_one_message(struct.pack(">I", 50) + b"\x08")
