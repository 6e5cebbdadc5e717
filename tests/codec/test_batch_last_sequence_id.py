"""`batch_last_sequence_id` (the last message's id, for deduplication of batches whose SEND
states no highest id) agrees with the full decoder, with and without the tail check, and
`entry_payload` finds the payload that `parse_entry` finds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.codec import (
    RemoteProtocolError,
    SingleMessage,
    batch_last_sequence_id,
    decode_batch_payload,
    encode_batch_payload,
    encode_entry,
    entry_payload,
    parse_entry,
    prefix_broker_entry_metadata,
)
from magnetar.codec._proto import pulsar_api_pb2 as pb

from .test_batching import SETTINGS, as_protobuf, messages


@SETTINGS
@given(batch=st.lists(messages, min_size=1, max_size=8),
       extra=st.lists(st.tuples(st.integers(11, 500), st.binary(max_size=8)), max_size=3))
def test_agrees_with_the_decoder(batch: list[SingleMessage],
                                 extra: list[tuple[int, bytes]]) -> None:
    # The first message is written through the runtime with unknown fields appended, which
    # the walk must skip as the decoder does.
    meta = as_protobuf(batch[0]).SerializeToString()
    for number, value in extra:
        meta += bytes([(number << 3 | 2) & 0x7F | 0x80, number >> 4, len(value)]) + value
    payload = (len(meta).to_bytes(4, "big") + meta + (batch[0].payload or b"")
               + encode_batch_payload(batch[1:]))
    wanted = decode_batch_payload(payload, len(batch))[-1].sequence_id
    assert batch_last_sequence_id(payload, len(batch)) == wanted
    if wanted is not None:
        assert batch_last_sequence_id(payload, len(batch), expected=wanted) == wanted
    assert batch_last_sequence_id(payload, len(batch), expected=12345) == wanted


@pytest.mark.parametrize("step", [1, 2, 1000])
@pytest.mark.parametrize("key", [None, "k"])
def test_consecutive_guess_is_confirmed_and_a_wrong_one_walks(step: int,
                                                              key: str | None) -> None:
    batch = [SingleMessage(b"body-%d" % i, partition_key=key, sequence_id=7 + i * step)
             for i in range(300)]
    payload = encode_batch_payload(batch)
    assert batch_last_sequence_id(payload, 300, expected=7 + 299) == 7 + 299 * step
    assert batch_last_sequence_id(payload, 300) == 7 + 299 * step


def test_body_containing_the_expected_field_is_not_mistaken() -> None:
    """The encoded `sequence_id` field inside the last body is tried and rejected."""
    field = b"\x40" + bytes([9])
    batch = [SingleMessage(b"a", sequence_id=1),
             SingleMessage(b"\x00\x00\x00\x02\x18\x00" + field + b"\x00\x00" + field,
                           sequence_id=11)]
    assert batch_last_sequence_id(encode_batch_payload(batch), 2, expected=9) == 11


def test_last_message_without_an_id_is_none() -> None:
    batch = [SingleMessage(b"a", sequence_id=4), SingleMessage(b"b")]
    assert batch_last_sequence_id(encode_batch_payload(batch), 2, expected=5) is None


def test_malformed_payloads_are_refused() -> None:
    good = encode_batch_payload([SingleMessage(b"x" * 20, sequence_id=i) for i in range(3)])
    for bad in (good[:-1], good[:10], good + b"\x00", b""):
        with pytest.raises(RemoteProtocolError):
            batch_last_sequence_id(bad, 3)
    with pytest.raises(RemoteProtocolError):
        batch_last_sequence_id(good, 4)
    with pytest.raises(RemoteProtocolError):
        batch_last_sequence_id(good, 0)
    no_size = b"\x00\x00\x00\x02\x40\x01"
    with pytest.raises(RemoteProtocolError):
        batch_last_sequence_id(no_size + good, 4)


def test_entry_payload_is_what_parse_entry_finds() -> None:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1)
    for checksum in (True, False):
        entry = encode_entry(metadata, b"the payload", checksum=checksum)
        assert entry_payload(entry) == parse_entry(entry).payload == b"the payload"
        prefixed = prefix_broker_entry_metadata(pb.BrokerEntryMetadata(index=5), entry)
        assert entry_payload(prefixed) == b"the payload"
    with pytest.raises(RemoteProtocolError):
        entry_payload(encode_entry(metadata, b"")[:5])
