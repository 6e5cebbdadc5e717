"""Batches: the hand-written SingleMessageMetadata codec agrees with the protobuf runtime, batch
payloads round-trip under every codec (through the frame layer, three ways), and the two
containers close batches where Pulsar's producers do."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magnetar.codec import (
    BATCH_DELAY_MS_MAX_DEFAULT,
    BATCH_MESSAGES_MAX_DEFAULT,
    BATCH_SIZE_BYTES_MAX_DEFAULT,
    BatchContainer,
    CompressionType,
    Frame,
    KeyBasedBatchContainer,
    RemoteProtocolError,
    Role,
    SingleMessage,
    base_command,
    batch_key,
    build_batch,
    build_message,
    decode_batch_payload,
    encode_batch_payload,
    encode_frame,
    encode_single_metadata,
    pb,
    unpack_messages,
)

from .helpers import connected, decode_whole_prefixes_trailing, receive_three_ways

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

texts = st.text(max_size=12)
messages = st.builds(
    SingleMessage,
    payload=st.none() | st.binary(max_size=200),
    properties=st.dictionaries(texts, texts, max_size=3),
    partition_key=st.none() | texts,
    partition_key_b64_encoded=st.booleans(),
    ordering_key=st.none() | st.binary(max_size=12),
    event_time=st.integers(0, (1 << 64) - 1),
    sequence_id=st.none() | st.integers(0, (1 << 64) - 1),
    null_partition_key=st.booleans(),
)


def as_protobuf(message: SingleMessage) -> pb.SingleMessageMetadata:
    """What the protobuf runtime builds for the same message (our reference encoder)."""
    meta = pb.SingleMessageMetadata(payload_size=len(message.payload or b""))
    for key, value in message.properties.items():
        meta.properties.add(key=key, value=value)
    if message.partition_key is not None:
        meta.partition_key = message.partition_key
    if message.compacted_out:
        meta.compacted_out = True
    if message.event_time:
        meta.event_time = message.event_time
    if message.partition_key_b64_encoded:
        meta.partition_key_b64_encoded = True
    if message.ordering_key is not None:
        meta.ordering_key = message.ordering_key
    if message.sequence_id is not None:
        meta.sequence_id = message.sequence_id
    if message.payload is None:
        meta.null_value = True
    if message.null_partition_key:
        meta.null_partition_key = True
    return meta


def indexed(batch: list[SingleMessage]) -> list[SingleMessage]:
    return [m._replace(batch_index=i) for i, m in enumerate(batch)]


@SETTINGS
@given(message=messages)
def test_single_metadata_encoding_is_the_runtimes(message: SingleMessage) -> None:
    assert encode_single_metadata(message) == as_protobuf(message).SerializeToString()
    # The fast path in encode_batch_payload must agree as well.
    payload = encode_batch_payload([message])
    assert payload[4:].startswith(as_protobuf(message).SerializeToString())


@SETTINGS
@given(batch=st.lists(messages, min_size=1, max_size=8))
def test_batch_payload_round_trips(batch: list[SingleMessage]) -> None:
    payload = encode_batch_payload(batch)
    assert decode_batch_payload(payload, len(batch)) == indexed(batch)


@SETTINGS
@given(message=messages, extra=st.lists(st.tuples(st.integers(11, 500), st.binary(max_size=8))))
def test_decoder_reads_what_the_runtime_writes_unknown_fields_included(
    message: SingleMessage, extra: list[tuple[int, bytes]]
) -> None:
    meta = as_protobuf(message).SerializeToString()
    for number, value in extra:  # fields from a future schema: skipped, as protobuf does
        meta += bytes([(number << 3 | 2) & 0x7F | 0x80, number >> 4]) + bytes([len(value)]) + value
    body = message.payload or b""
    payload = len(meta).to_bytes(4, "big") + meta + body
    [decoded] = decode_batch_payload(payload, 1)
    assert decoded == message._replace(batch_index=0)


@SETTINGS
@given(
    batch=st.lists(messages, min_size=1, max_size=5),
    codec=st.sampled_from(list(CompressionType)),
)
def test_batches_round_trip_under_every_codec_through_the_frame_layer(
    batch: list[SingleMessage], codec: CompressionType
) -> None:
    metadata, payload = build_batch(
        batch, producer_name="producer-1", publish_time=1_700_000_000_000, compression=codec
    )
    send = base_command(pb.CommandSend(producer_id=1, sequence_id=metadata.sequence_id))
    [event] = receive_three_ways(
        lambda: connected(Role.BROKER), encode_frame(send, metadata, payload)
    )
    assert isinstance(event, Frame)
    assert event.metadata is not None
    assert event.metadata.num_messages_in_batch == len(batch)
    first = batch[0].sequence_id or 0
    expected = [
        m._replace(batch_index=i, sequence_id=first + i if m.sequence_id is None else m.sequence_id)
        for i, m in enumerate(batch)
    ]
    assert unpack_messages(event.metadata, event.payload) == expected


def test_outer_metadata_copies_the_first_messages_keys_like_the_cpp_client() -> None:
    batch = [
        SingleMessage(b"a", partition_key="a2V5", partition_key_b64_encoded=True,
                      ordering_key=b"ord", sequence_id=10),
        SingleMessage(b"b", partition_key="other", sequence_id=11),
    ]  # fmt: skip
    metadata, _ = build_batch(
        batch, producer_name="p", publish_time=5, compression=CompressionType.ZLIB
    )
    assert metadata.sequence_id == 10
    assert metadata.partition_key == "a2V5"
    assert metadata.partition_key_b64_encoded
    assert metadata.ordering_key == b"ord"
    assert metadata.HasField("num_messages_in_batch")
    assert metadata.compression == CompressionType.ZLIB
    assert metadata.uncompressed_size == len(encode_batch_payload(batch))
    plain, _ = build_batch(batch, producer_name="p", publish_time=5)
    assert not plain.HasField("compression")
    assert not plain.HasField("uncompressed_size")


def test_the_batch_observed_from_the_cpp_client_parses() -> None:
    # Wire reference 7.3: a batch of four, each (partition_key, payload_size = 2, sequence_id).
    elements = []
    for i in range(4):
        meta = b"\x12\x04" + f"key{i}".encode() + b"\x18\x02\x40" + bytes([i])
        elements.append(len(meta).to_bytes(4, "big") + meta + f"b{i}".encode())
    payload = b"".join(elements)
    assert payload.startswith(bytes.fromhex("0000000a 1204") + b"key0" + bytes.fromhex("18024000"))
    decoded = decode_whole_prefixes_trailing(lambda data: decode_batch_payload(data, 4), payload)
    assert [(m.partition_key, m.payload, m.sequence_id, m.batch_index) for m in decoded] == [
        (f"key{i}", f"b{i}".encode(), i, i) for i in range(4)
    ]


def test_null_values_and_empty_bodies_stay_distinct() -> None:
    batch = [SingleMessage(None, sequence_id=0), SingleMessage(b"", sequence_id=1)]
    decoded = decode_batch_payload(encode_batch_payload(batch), 2)
    assert decoded[0].payload is None
    assert decoded[1].payload == b""
    metadata, payload = build_message(SingleMessage(None), producer_name="p", publish_time=1)
    assert metadata.null_value
    assert payload == b""
    assert unpack_messages(metadata, payload)[0].payload is None


def test_missing_sequence_ids_are_numbered_from_the_entrys() -> None:
    batch = [SingleMessage(b"x"), SingleMessage(b"y", sequence_id=99), SingleMessage(b"z")]
    decoded = decode_batch_payload(encode_batch_payload(batch), 3, first_sequence_id=40)
    assert [m.sequence_id for m in decoded] == [40, 99, 42]
    assert [m.sequence_id for m in decode_batch_payload(encode_batch_payload(batch), 3)] == [
        None,
        99,
        None,
    ]


def test_compacted_out_messages_are_flagged() -> None:
    kept, dropped = SingleMessage(b"k"), SingleMessage(b"d", compacted_out=True)
    decoded = decode_batch_payload(encode_batch_payload([kept, dropped]), 2)
    assert [m.compacted_out for m in decoded] == [False, True]


def test_non_batched_entry_unpacks_from_its_metadata() -> None:
    message = SingleMessage(
        b"body", {"a": "1"}, "key", False, b"order", 77, sequence_id=5, null_partition_key=False
    )
    metadata, payload = build_message(
        message, producer_name="p", publish_time=9, compression=CompressionType.SNAPPY
    )
    assert not metadata.HasField("num_messages_in_batch")
    assert unpack_messages(metadata, payload) == [message]


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_prefixes_and_trailing_bytes_are_refused(count: int) -> None:
    batch = [SingleMessage(b"m" * 150, {"p": "q"}, sequence_id=20_000 + i) for i in range(count)]
    payload = encode_batch_payload(batch)
    decoded = decode_whole_prefixes_trailing(
        lambda data: decode_batch_payload(data, count), payload
    )
    assert decoded == indexed(batch)


def test_malformed_single_metadata_is_refused() -> None:
    cases = {
        "no payload_size": b"\x40\x01",
        "negative payload_size": b"\x18" + b"\xff" * 9 + b"\x01",
        "field number zero": b"\x18\x00\x00\x00",
        "wire type 7": b"\x18\x00\x0f",
        "truncated varint": b"\x18\x80",
        "string past the end": b"\x18\x00\x12\x05ab",
        "bad utf-8": b"\x18\x00\x12\x01\xff",
        "key-value lacks value": b"\x18\x00\x0a\x02\x0a\x00",
    }
    for meta in cases.values():
        payload = len(meta).to_bytes(4, "big") + meta
        with pytest.raises(RemoteProtocolError):
            decode_batch_payload(payload, 1)
    with pytest.raises(RemoteProtocolError, match="negative"):
        decode_batch_payload(b"", -1)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=120), count=st.integers(0, 5))
def test_garbage_gives_protocol_error_only(data: bytes, count: int) -> None:
    try:
        decoded = decode_batch_payload(data, count)
    except RemoteProtocolError:
        return
    assert len(decoded) == count


def _decoded_by_runtime(meta: bytes) -> pb.SingleMessageMetadata | None:
    try:
        theirs = pb.SingleMessageMetadata.FromString(meta)
    except DecodeError:
        return None
    if not theirs.IsInitialized() or theirs.payload_size < 0:
        return None
    return theirs


def test_bit_flips_decode_exactly_when_the_runtime_decodes() -> None:
    """Differential test: flip every bit of a real SingleMessageMetadata; our decoder must agree
    with the protobuf runtime, except that it also refuses strings that are not UTF-8."""
    message = SingleMessage(b"v", {"k": "v"}, "pk", True, b"o", 5, 6, True)
    meta = encode_single_metadata(message)
    agreed = 0
    for position in range(len(meta)):
        for bit in range(8):
            flipped = bytearray(meta)
            flipped[position] ^= 1 << bit
            theirs = _decoded_by_runtime(bytes(flipped))
            body = b"v" * (theirs.payload_size if theirs is not None else 1)
            payload = len(flipped).to_bytes(4, "big") + bytes(flipped) + body
            try:
                [ours] = decode_batch_payload(payload, 1)
            except RemoteProtocolError:
                # We may refuse only what the runtime refuses, or strings that are not UTF-8
                # (which the runtime hands back as bytes).
                texts = [] if theirs is None else [theirs.partition_key]
                if theirs is not None:
                    texts += [t for kv in theirs.properties for t in (kv.key, kv.value)]
                assert theirs is None or not all(isinstance(t, str) for t in texts), (position, bit)
                continue
            assert theirs is not None, (position, bit)
            assert ours.payload == (None if theirs.null_value else body)
            assert ours.properties == {kv.key: kv.value for kv in theirs.properties}
            assert ours.partition_key == (
                theirs.partition_key if theirs.HasField("partition_key") else None
            )
            assert ours.ordering_key == (
                theirs.ordering_key if theirs.HasField("ordering_key") else None
            )
            assert ours.sequence_id == (
                theirs.sequence_id if theirs.HasField("sequence_id") else None
            )
            assert ours.event_time == theirs.event_time
            assert ours.partition_key_b64_encoded == theirs.partition_key_b64_encoded
            assert ours.null_partition_key == theirs.null_partition_key
            assert ours.compacted_out == theirs.compacted_out
            agreed += 1
    assert agreed > len(meta)  # many flips still decode (e.g. in values): the test has teeth


# -- containers -----------------------------------------------------------------------------------


def msg(
    i: int, size: int = 10, key: str | None = None, ordering: bytes | None = None
) -> SingleMessage:
    return SingleMessage(b"x" * size, partition_key=key, ordering_key=ordering, sequence_id=i)


def seqs(batches: list) -> list[list[int | None]]:  # type: ignore[type-arg]
    return [[m.sequence_id for m in b.messages] for b in batches]


def test_container_defaults_are_pulsars() -> None:
    assert BATCH_MESSAGES_MAX_DEFAULT == 1000
    assert BATCH_SIZE_BYTES_MAX_DEFAULT == 131072
    assert BATCH_DELAY_MS_MAX_DEFAULT == 10


def test_count_limit_closes_the_batch_when_reached() -> None:
    container = BatchContainer(batch_messages_max=3)
    assert container.add(msg(0), 0) == []
    assert container.add(msg(1), 0) == []
    closed = container.add(msg(2), 0)
    assert seqs(closed) == [[0, 1, 2]]
    assert len(container) == 0
    assert container.deadline_ms is None


def test_byte_limit_closes_before_a_message_that_does_not_fit() -> None:
    container = BatchContainer(batch_size_bytes_max=100)
    assert container.add(msg(0, 60), 0) == []
    closed = container.add(msg(1, 60), 0)  # 120 > 100: the open batch goes first
    assert seqs(closed) == [[0]]
    assert container.size_bytes == 60
    closed = container.add(msg(2, 40), 0)  # reaches exactly 100: closes at once
    assert seqs(closed) == [[1, 2]]


def test_a_message_above_the_byte_limit_travels_alone() -> None:
    container = BatchContainer(batch_size_bytes_max=128)
    batches = []
    for i in range(3):
        batches += container.add(msg(i, 10), 0)
    batches += container.add(msg(3, 128 + 4), 0)
    batches += container.add(msg(4, 10), 0)
    batches += container.flush()
    assert seqs(batches) == [[0, 1, 2], [3], [4]]


def test_delay_closes_the_batch_after_its_first_message() -> None:
    container = BatchContainer(batch_delay_ms_max=10)
    container.add(msg(0), now_ms=1000)
    container.add(msg(1), now_ms=1005)
    assert container.deadline_ms == 1010
    assert container.expire(1009) == []
    assert seqs(container.expire(1010)) == [[0, 1]]
    assert container.expire(2000) == []
    container.add(msg(2), now_ms=3000)
    assert container.deadline_ms == 3010


def test_fixed_count_matches_pulsars_batch_message_test() -> None:
    # BatchMessageTest: max 25 messages, 50 sends -> 2 entries.
    container = BatchContainer(batch_messages_max=25)
    batches = [b for i in range(50) for b in container.add(msg(i), 0)]
    assert [len(b.messages) for b in batches] == [25, 25]


def test_batch_properties() -> None:
    container = BatchContainer()
    container.add(SingleMessage(b"ab", sequence_id=7), 0)
    container.add(SingleMessage(None, sequence_id=8), 0)
    [batch] = container.flush()
    assert batch.sequence_id == 7
    assert batch.highest_sequence_id == 8
    assert batch.size_bytes == 2
    metadata, payload = batch.build(producer_name="p", publish_time=1)
    assert unpack_messages(metadata, payload)[1].payload is None


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(st.lists(st.tuples(st.sampled_from([0, 10, 20, 70]),
                                        st.sampled_from([None, "A", "B"])), max_size=12),
                     max_size=5),
       count_max=st.integers(1, 6), bytes_max=st.sampled_from([10, 20, 30, 60, 100]),
       key_based=st.booleans())
def test_add_many_closes_what_one_add_per_message_closes(
        runs: list[list[tuple[int, str | None]]], count_max: int, bytes_max: int,
        key_based: bool) -> None:
    kind = KeyBasedBatchContainer if key_based else BatchContainer
    one, many = (kind(batch_messages_max=count_max, batch_size_bytes_max=bytes_max,
                      batch_delay_ms_max=5) for _ in range(2))
    sequence = 0
    for now, run in enumerate(runs):
        messages = [msg(sequence + i, size, key) for i, (size, key) in enumerate(run)]
        sequence += len(run)
        expected = [b for m in messages for b in one.add(m, now)]
        assert many.add_many(messages, now) == expected
        assert (len(many), many.size_bytes, many.deadline_ms) == \
            (len(one), one.size_bytes, one.deadline_ms)
    assert many.flush() == one.flush()


def test_key_based_container_one_batch_per_key_in_first_seen_order() -> None:
    container = KeyBasedBatchContainer()
    for i, key in enumerate("ABCBCA"):
        assert container.add(msg(i, key=key), 0) == []
    assert seqs(container.flush()) == [[0, 5], [1, 3], [2, 4]]


def test_key_based_container_keyless_messages_share_a_batch() -> None:
    container = KeyBasedBatchContainer()
    for i, key in enumerate([None, "A", None, None]):
        container.add(msg(i, key=key), 0)
    assert seqs(container.flush()) == [[0, 2, 3], [1]]


def test_key_based_ordering_key_wins_over_partition_key() -> None:
    container = KeyBasedBatchContainer()
    container.add(msg(0, key="A", ordering=b"X"), 0)
    container.add(msg(1, key="B", ordering=b"X"), 0)
    container.add(msg(2, key="X"), 0)  # partition key "X" is not ordering key b"X"
    assert seqs(container.flush()) == [[0, 1], [2]]
    assert batch_key(msg(0, key="A", ordering=b"X")) == ("ordering", b"X")
    assert batch_key(msg(0)) is None


def test_key_based_limits_apply_to_the_whole_container() -> None:
    container = KeyBasedBatchContainer(batch_messages_max=4)
    closed = [b for i, key in enumerate("ABAB") for b in container.add(msg(i, key=key), 0)]
    assert seqs(closed) == [[0, 2], [1, 3]]
    bytes_limited = KeyBasedBatchContainer(batch_size_bytes_max=25)
    closed = [b for i, key in enumerate("AB") for b in bytes_limited.add(msg(i, 10, key), 0)]
    assert closed == []
    assert seqs(bytes_limited.add(msg(2, 10, "C"), 0)) == [[0], [1]]


def test_container_limits_must_be_sane() -> None:
    with pytest.raises(ValueError, match="batch_messages_max"):
        BatchContainer(batch_messages_max=0)
    with pytest.raises(ValueError, match="batch_size_bytes_max"):
        KeyBasedBatchContainer(batch_size_bytes_max=0)
    with pytest.raises(ValueError, match="batch_delay_ms_max"):
        BatchContainer(batch_delay_ms_max=-1)
    with pytest.raises(ValueError, match="at least one"):
        build_batch([], producer_name="p", publish_time=0)


BOUNDARIES = [0, 1, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21, (1 << 28) - 1, 1 << 28]
BOUNDARIES += [1 << 35, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384])
def test_varint_boundaries_in_sizes_and_sequence_ids(size: int) -> None:
    batch = [SingleMessage(b"s" * size, sequence_id=value) for value in BOUNDARIES]
    assert decode_batch_payload(encode_batch_payload(batch), len(batch)) == indexed(batch)


@pytest.mark.parametrize(
    ("meta", "sequence"),
    [
        (b"\x18\x01\x40\x80\x00", 0),  # non-canonical varints mean what they say
        (b"\x18\x01\x40\xff\x80\x00", 127),
        (b"\x18\x81\x00\x40\x85\x80\x80\x00", 5),
        (b"\x18\x01\x40\x05\x40\x06", 6),  # a repeated scalar: the last one wins
    ],
)
def test_unusual_but_valid_encodings_decode_like_the_runtime(meta: bytes, sequence: int) -> None:
    reference = pb.SingleMessageMetadata.FromString(meta)
    assert reference.sequence_id == sequence
    payload = len(meta).to_bytes(4, "big") + meta + b"p" * reference.payload_size
    [decoded] = decode_batch_payload(payload, 1)
    assert decoded.sequence_id == sequence
    assert decoded.payload == b"p" * reference.payload_size
