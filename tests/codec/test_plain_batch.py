"""`plain_batch_starts` / `plain_batch_message`: a batch of bare bodies handed out undecoded
gives the same messages as `decode_batch_payload`; anything else is left to the full decode."""

from __future__ import annotations

import struct

import pytest

from magnetar.codec import (
    SingleMessage,
    decode_batch_payload,
    encode_batch_payload,
    pb,
    plain_batch_message,
    plain_batch_starts,
)


def _lazily(payload: bytes, count: int, first: int | None) -> list[SingleMessage] | None:
    starts = plain_batch_starts(payload, count)
    if starts is None:
        return None
    return [plain_batch_message(payload, start, index, first)
            for index, start in enumerate(starts)]


@pytest.mark.parametrize("sizes", [[0], [1, 127, 128, 300], [16383, 5], [1024] * 126])
@pytest.mark.parametrize("sequence_ids", ["none", "small", "large"])
def test_a_plain_batch_decodes_as_the_full_decoder_does(sizes: list[int],
                                                        sequence_ids: str) -> None:
    base = {"none": None, "small": 3, "large": (1 << 40) + 7}[sequence_ids]
    messages = [SingleMessage(payload=bytes([i % 251]) * size,
                              sequence_id=None if base is None else base + i)
                for i, size in enumerate(sizes)]
    payload = encode_batch_payload(messages)
    for first in (None, 1000):
        expected = decode_batch_payload(payload, len(sizes), first_sequence_id=first)
        assert _lazily(payload, len(sizes), first) == expected


@pytest.mark.parametrize("odd", [
    SingleMessage(payload=b"x", properties={"k": "v"}),
    SingleMessage(payload=b"x", partition_key="key"),
    SingleMessage(payload=b"x", ordering_key=b"o"),
    SingleMessage(payload=b"x", event_time=5),
    SingleMessage(payload=None),
    SingleMessage(payload=b"x", sequence_id=4, compacted_out=True),
    SingleMessage(payload=b"x" * 16384),  # payload_size takes three varint bytes
])
def test_a_batch_with_anything_but_bare_bodies_is_left_to_the_full_decoder(
        odd: SingleMessage) -> None:
    payload = encode_batch_payload([SingleMessage(payload=b"plain", sequence_id=1), odd])
    assert plain_batch_starts(payload, 2) is None
    assert len(decode_batch_payload(payload, 2)) == 2  # the full decoder takes it


def test_a_field_after_a_short_sequence_id_is_not_taken_for_its_varint() -> None:
    # payload_size 1, sequence_id 5, then compacted_out = true: the metadata's last byte
    # (0x01) ends a varint, but the sequence id's does not run to it.
    metadata = bytes([0x18, 0x01, 0x40, 0x05, 0x20, 0x01])
    payload = struct.pack(">I", len(metadata)) + metadata + b"x"
    assert plain_batch_starts(payload, 1) is None
    assert decode_batch_payload(payload, 1)[0].compacted_out


@pytest.mark.parametrize("cut", [-1, 1, 3])
def test_a_truncated_or_overlong_payload_is_left_to_the_full_decoder(cut: int) -> None:
    payload = encode_batch_payload([SingleMessage(payload=b"abc", sequence_id=1)] * 2)
    assert plain_batch_starts(payload[:-cut] if cut > 0 else payload + b"\0", 2) is None
    assert plain_batch_starts(payload, 3) is None
    assert plain_batch_starts(payload, 1) is None
    assert plain_batch_starts(payload, 0) is None


@pytest.mark.parametrize("sequence_id", [0, 127, 128, 16383, 16384, 99_999, (1 << 21) - 1,
                                         1 << 21, (1 << 28) - 1, 1 << 28, (1 << 64) - 1])
def test_a_bare_body_s_sequence_id_is_encoded_as_the_runtime_does(sequence_id: int) -> None:
    payload = encode_batch_payload([SingleMessage(payload=b"x" * 1024, sequence_id=sequence_id)])
    expected = pb.SingleMessageMetadata(payload_size=1024, sequence_id=sequence_id)
    assert payload[4:-1024] == expected.SerializeToString()
    assert decode_batch_payload(payload, 1)[0].sequence_id == sequence_id


def test_a_message_laid_out_as_its_neighbours_but_flagged_is_not_taken_for_plain() -> None:
    # Two messages of one layout (size prefix, payload_size 1, a three-byte sequence id
    # field) but the second one's "varint" is sequence id 5 then compacted_out = true.
    plain = bytes([0x18, 0x01, 0x40, 0x80, 0x80, 0x01])
    flagged = bytes([0x18, 0x01, 0x40, 0x05, 0x20, 0x01])
    payload = b"".join(struct.pack(">I", 6) + meta + b"x" for meta in (plain, flagged))
    assert plain_batch_starts(payload, 2) is None
    assert decode_batch_payload(payload, 2)[1].compacted_out
    twice = b"".join(struct.pack(">I", 6) + plain + b"x" for _ in range(2))
    assert plain_batch_starts(twice, 2) == [0, 11]
