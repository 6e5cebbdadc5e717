"""Prefixed entries: `prefix_broker_entry_metadata`, `split_…`, `strip_…`, and `parse_entry`
accepting the 0x0e02 block in front of an entry; a MESSAGE built from a prefixed entry decodes
with the block."""

from __future__ import annotations

import pytest

from magnetar.codec import (
    LocalProtocolError,
    RemoteProtocolError,
    base_command,
    decode_frame,
    encode_entry,
    encode_frame,
    parse_entry,
    parse_entry_metadata,
    pb,
    prefix_broker_entry_metadata,
    split_broker_entry_metadata,
    strip_broker_entry_metadata,
)


def _entry() -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=42,
                                  num_messages_in_batch=2)
    return encode_entry(metadata, b"payload")


def test_prefix_split_strip_and_parse() -> None:
    entry = _entry()
    block = pb.BrokerEntryMetadata(broker_timestamp=1_700_000_000_000, index=41)
    prefixed = prefix_broker_entry_metadata(block, entry)
    assert prefixed.endswith(entry)
    assert prefixed[:2] == b"\x0e\x02"
    assert split_broker_entry_metadata(prefixed) == (block, entry)
    assert split_broker_entry_metadata(entry) == (None, entry)
    assert strip_broker_entry_metadata(prefixed) == entry
    assert strip_broker_entry_metadata(entry) == entry
    parsed = parse_entry(prefixed)
    assert parsed.broker_entry_metadata == block
    assert (parsed.metadata.sequence_id, parsed.payload) == (3, b"payload")
    assert parse_entry(entry).broker_entry_metadata is None
    with pytest.raises(LocalProtocolError, match="already carries"):
        prefix_broker_entry_metadata(block, prefixed)


def test_parse_entry_metadata_tells_what_parse_entry_does_but_the_payload() -> None:
    entry = _entry()
    block = pb.BrokerEntryMetadata(broker_timestamp=7, index=2)
    for stored in (entry, prefix_broker_entry_metadata(block, entry)):
        parsed = parse_entry(stored)
        assert parse_entry_metadata(stored) == (parsed.metadata, len(parsed.payload),
                                                parsed.broker_entry_metadata)
    with pytest.raises(RemoteProtocolError, match="runs past the end"):
        parse_entry_metadata(entry[:-len(b"payload") - 2])


def test_a_validated_entry_is_parsed_alike_and_only_its_wire_format_checked() -> None:
    entry = _entry()
    block = pb.BrokerEntryMetadata(broker_timestamp=7, index=2)
    for stored in (entry, prefix_broker_entry_metadata(block, entry)):
        assert parse_entry_metadata(stored, validated=True) == parse_entry_metadata(stored)
    # Metadata without its required fields: refused when checked, taken when validated before.
    bare = encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1),
                        b"x").replace(b"\x18\x01", b"\x40\x01")  # publish_time -> field 8
    with pytest.raises(RemoteProtocolError, match="required"):
        parse_entry_metadata(bare)
    assert parse_entry_metadata(bare, validated=True)[0].publish_time == 0
    # Bytes that are not protobuf at all are refused either way.
    garbage = entry.replace(b"\x0a\x01p", b"\x0a\x7fp")  # a length past the metadata
    for validated in (False, True):
        with pytest.raises(RemoteProtocolError, match="not valid protobuf"):
            parse_entry_metadata(garbage, validated=validated)


def test_a_truncated_block_is_refused() -> None:
    prefixed = prefix_broker_entry_metadata(pb.BrokerEntryMetadata(index=1), _entry())
    with pytest.raises(RemoteProtocolError, match="broker entry metadata"):
        parse_entry(prefixed[:4])
    with pytest.raises(RemoteProtocolError, match="runs past the end"):
        strip_broker_entry_metadata(prefixed[:2] + b"\x7f\xff\xff\xff")


def test_a_message_carrying_a_prefixed_entry_decodes_with_its_block() -> None:
    block = pb.BrokerEntryMetadata(broker_timestamp=5, index=9)
    entry = _entry()
    message = base_command(pb.CommandMessage(
        consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=2)))
    frame = decode_frame(encode_frame(message, entry=prefix_broker_entry_metadata(block,
                                                                                   entry))[4:])
    assert frame.broker_entry_metadata == block  # type: ignore[union-attr]
    assert frame.entry == entry  # type: ignore[union-attr]
    assert frame.checksum is not None  # type: ignore[union-attr]
