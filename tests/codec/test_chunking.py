"""Chunking: split and reassemble (round trips under every codec, chunk by chunk through the
frame layer), chunk message ids, and the Java client's rules for duplicates, gaps, eviction and
expiry, row by row as the theory-of-operation table in codec/_chunking.py lists them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magnetar.codec import (
    INCOMPLETE_CHUNK_EXPIRY_MS_DEFAULT,
    PENDING_CHUNKED_MESSAGES_MAX_DEFAULT,
    ChunkAssembler,
    CompressionType,
    Frame,
    LocalProtocolError,
    MessageId,
    RemoteProtocolError,
    Role,
    SingleMessage,
    base_command,
    build_message,
    chunk_payload_size_bytes,
    chunk_uuid,
    encode_frame,
    pb,
    split_into_chunks,
    unpack_messages,
)

from .helpers import connected, receive_three_ways

PUBLISH_TIME = 1_700_000_000_000


def chunked(
    payload: bytes, chunk_size: int, *, sequence_id: int = 0, producer: str = "prod"
) -> list[tuple[pb.MessageMetadata, bytes]]:
    metadata, body = build_message(
        SingleMessage(payload, sequence_id=sequence_id),
        producer_name=producer,
        publish_time=PUBLISH_TIME,
    )
    return split_into_chunks(metadata, body, chunk_size_bytes=chunk_size)


def ids(*entries: int) -> tuple[MessageId, ...]:
    return tuple(MessageId(1, e) for e in entries)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payload=st.binary(min_size=1, max_size=3000),
    chunk_size=st.integers(1, 700),
    codec=st.sampled_from(list(CompressionType)),
)
def test_chunks_round_trip_through_the_frame_layer(
    payload: bytes, chunk_size: int, codec: CompressionType
) -> None:
    metadata, body = build_message(
        SingleMessage(payload, {"p": "1"}, sequence_id=9),
        producer_name="big",
        publish_time=PUBLISH_TIME,
        compression=codec,
    )
    chunks = split_into_chunks(metadata, body, chunk_size_bytes=chunk_size)
    assert len(chunks) == max(1, -(-len(body) // chunk_size))
    frames = b"".join(
        encode_frame(
            base_command(pb.CommandSend(producer_id=1, sequence_id=9, is_chunk=len(chunks) > 1)),
            chunk_metadata,
            chunk_payload,
        )
        for chunk_metadata, chunk_payload in chunks
    )
    events = receive_three_ways(lambda: connected(Role.BROKER), frames)
    assert all(isinstance(e, Frame) for e in events)
    if len(chunks) == 1:
        assert chunks[0][0] is metadata  # fits: sent unchanged, no chunk fields
        return
    assembler = ChunkAssembler()
    results = []
    for entry_id, event in enumerate(events):
        assert isinstance(event, Frame)
        assert event.metadata is not None
        assert event.metadata.uuid == "big-9"
        results.append(assembler.add(MessageId(3, entry_id), event.metadata, event.payload, 0))
    *partial, last = results
    assert all(r.message is None and not r.ack and not r.redeliver for r in partial)
    done = last.message
    assert done is not None
    assert len(assembler) == 0
    assert unpack_messages(done.metadata, done.payload) == [
        SingleMessage(payload, {"p": "1"}, sequence_id=9)
    ]
    assert done.message_id == MessageId(3, len(chunks) - 1)
    assert done.message_id.first_chunk == MessageId(3, 0)
    assert done.chunk_ids == tuple(MessageId(3, i) for i in range(len(chunks)))


def test_chunk_metadata_fields() -> None:
    chunks = chunked(b"0123456789", 4, sequence_id=42)
    assert [p for _, p in chunks] == [b"0123", b"4567", b"89"]
    for index, (metadata, _) in enumerate(chunks):
        assert metadata.uuid == chunk_uuid("prod", 42) == "prod-42"
        assert metadata.num_chunks_from_msg == 3
        assert metadata.total_chunk_msg_size == 10
        assert metadata.chunk_id == index
        assert metadata.sequence_id == 42


def test_chunk_size_is_max_message_size_minus_the_metadata() -> None:
    metadata, _ = build_message(SingleMessage(b""), producer_name="c1", publish_time=PUBLISH_TIME)
    assert chunk_payload_size_bytes(metadata, 4096) == 4096 - metadata.ByteSize()
    with pytest.raises(LocalProtocolError):
        chunk_payload_size_bytes(metadata, metadata.ByteSize())
    with pytest.raises(ValueError, match="chunk_size_bytes"):
        split_into_chunks(metadata, b"x", chunk_size_bytes=0)


def test_chunk_message_id_strings_and_serialization() -> None:
    chunks = chunked(b"abcdef", 2)
    assembler = ChunkAssembler()
    results = [assembler.add(MessageId(7, 5 + i), m, p, 0) for i, (m, p) in enumerate(chunks)]
    done = results[-1].message
    assert done is not None
    assert str(done.message_id) == "7:5:-1;7:7:-1"
    assert done.message_id.to_cpp_string() == "(7,5,-1,-1);(7,7,-1,-1)"
    assert MessageId.deserialize(done.message_id.serialize()).first_chunk == MessageId(7, 5)


def test_defaults_are_pulsars() -> None:
    assert PENDING_CHUNKED_MESSAGES_MAX_DEFAULT == 10
    assert INCOMPLETE_CHUNK_EXPIRY_MS_DEFAULT == 60_000


# -- the rules, one test per row ------------------------------------------------------------------


def test_duplicate_of_a_held_chunk_from_the_same_entry_is_ignored() -> None:
    (m0, p0), (m1, p1), (m2, p2) = chunked(b"abcdefghi", 3)
    assembler = ChunkAssembler()
    assembler.add(MessageId(1, 1), m0, p0, 0)
    assembler.add(MessageId(1, 2), m1, p1, 0)
    again = assembler.add(MessageId(1, 2), m1, p1, 0)  # a redelivery of chunk 1
    assert again.message is None
    assert again.ack == again.redeliver == ()
    done = assembler.add(MessageId(1, 3), m2, p2, 0).message
    assert done is not None
    assert done.payload == b"abcdefghi"


def test_duplicate_chunk_from_another_entry_is_acknowledged() -> None:
    # Java's example: chunks 0,1,2 at 1:1..1:3, then 1 and 2 again at 1:4, 1:5, then 3 at 1:6.
    chunks = chunked(b"abcdefgh", 2)
    assembler = ChunkAssembler()
    for entry, (m, p) in zip((1, 2, 3), chunks[:3], strict=True):
        assert assembler.add(MessageId(1, entry), m, p, 0).message is None
    assert assembler.add(MessageId(1, 4), *chunks[1], 0).ack == ids(4)
    assert assembler.add(MessageId(1, 5), *chunks[2], 0).ack == ids(5)
    done = assembler.add(MessageId(1, 6), *chunks[3], 0).message
    assert done is not None
    assert done.payload == b"abcdefgh"
    assert done.chunk_ids == ids(1, 2, 3, 6)


def test_first_chunk_again_from_the_same_entry_restarts_without_acks() -> None:
    chunks = chunked(b"abcdef", 2)
    assembler = ChunkAssembler()
    assembler.add(MessageId(1, 1), *chunks[0], 0)
    assembler.add(MessageId(1, 2), *chunks[1], 0)
    restart = assembler.add(MessageId(1, 1), *chunks[0], 0)  # redelivery from the start
    assert restart.ack == restart.redeliver == ()
    assembler.add(MessageId(1, 2), *chunks[1], 0)
    done = assembler.add(MessageId(1, 3), *chunks[2], 0).message
    assert done is not None
    assert done.chunk_ids == ids(1, 2, 3)


def test_first_chunk_again_from_another_entry_acks_the_corrupt_publish() -> None:
    chunks = chunked(b"abcdef", 2)
    assembler = ChunkAssembler()
    assembler.add(MessageId(1, 1), *chunks[0], 0)
    assembler.add(MessageId(1, 2), *chunks[1], 0)
    restart = assembler.add(MessageId(1, 3), *chunks[0], 0)  # the producer re-sent it all
    assert restart.ack == ids(1, 2)
    assembler.add(MessageId(1, 4), *chunks[1], 0)
    done = assembler.add(MessageId(1, 5), *chunks[2], 0).message
    assert done is not None
    assert done.chunk_ids == ids(3, 4, 5)


def test_gap_drops_the_message_and_leaves_everything_for_redelivery() -> None:
    chunks = chunked(b"abcdefgh", 2)
    assembler = ChunkAssembler()
    assembler.add(MessageId(1, 1), *chunks[0], PUBLISH_TIME)
    result = assembler.add(MessageId(1, 3), *chunks[2], PUBLISH_TIME)  # chunk 1 missing
    assert result.message is None
    assert result.ack == ()
    assert result.redeliver == ids(1, 3)
    assert len(assembler) == 0


def test_chunk_without_its_first_is_acked_once_older_than_the_expiry() -> None:
    chunks = chunked(b"abcd", 2)
    assembler = ChunkAssembler(incomplete_chunk_expiry_ms=1000)
    fresh = assembler.add(MessageId(1, 2), *chunks[1], PUBLISH_TIME + 1000)
    assert fresh.redeliver == ids(2)
    assert fresh.ack == ()
    stale = assembler.add(MessageId(1, 2), *chunks[1], PUBLISH_TIME + 1001)
    assert stale.ack == ids(2)
    assert stale.redeliver == ()


def test_too_many_pending_evicts_the_oldest_for_redelivery_or_ack() -> None:
    for auto_ack in (False, True):
        assembler = ChunkAssembler(pending_chunked_messages_max=2, auto_ack_oldest_on_full=auto_ack)
        firsts = [chunked(b"abcd", 2, sequence_id=s)[0] for s in range(3)]
        assert assembler.add(MessageId(1, 1), *firsts[0], 0).redeliver == ()
        assert assembler.add(MessageId(1, 2), *firsts[1], 0).redeliver == ()
        evicted = assembler.add(MessageId(1, 3), *firsts[2], 0)
        assert len(assembler) == 2
        assert (evicted.ack if auto_ack else evicted.redeliver) == ids(1)
        assert (evicted.redeliver if auto_ack else evicted.ack) == ()
        # Like C++ testMaxPendingChunkMessages: the evicted message never completes.
        late = assembler.add(MessageId(1, 4), *chunked(b"abcd", 2, sequence_id=0)[1], 0)
        assert late.message is None


def test_zero_means_no_limit() -> None:
    assembler = ChunkAssembler(pending_chunked_messages_max=0)
    for s in range(50):
        assert assembler.add(MessageId(1, s), *chunked(b"abcd", 2, sequence_id=s)[0], 0).ack == ()
    assert len(assembler) == 50


def test_incomplete_messages_expire_and_their_chunks_are_acknowledged() -> None:
    assembler = ChunkAssembler(incomplete_chunk_expiry_ms=5000)
    assert assembler.next_expiry_ms is None
    chunks = chunked(b"abcdef", 2)
    assembler.add(MessageId(1, 1), *chunks[0], now_ms=100)
    assembler.add(MessageId(1, 2), *chunks[1], now_ms=200)
    other = chunked(b"abcd", 2, sequence_id=1)
    assembler.add(MessageId(1, 3), *other[0], now_ms=3000)
    assert assembler.next_expiry_ms == 5100
    assert assembler.expire(5100).ack == ()
    assert assembler.expire(5101).ack == ids(1, 2)
    assert len(assembler) == 1
    assert assembler.expire(8001).ack == ids(3)
    assert ChunkAssembler(incomplete_chunk_expiry_ms=0).expire(10**12).ack == ()


INCONSISTENT = {
    "no uuid": {"uuid": None},
    "chunk id past the count": {"chunk_id": 3},
    "negative chunk id": {"chunk_id": -1},
    "no chunks": {"num_chunks_from_msg": 0},
    "negative total": {"total_chunk_msg_size": -1},
    "total above the bound": {"total_chunk_msg_size": 2_000_000},
}


@pytest.mark.parametrize("change", INCONSISTENT.values(), ids=INCONSISTENT.keys())
def test_inconsistent_chunk_metadata_is_refused_and_changes_nothing(change: dict) -> None:  # type: ignore[type-arg]
    chunks = chunked(b"abcdef", 2)
    assembler = ChunkAssembler(chunked_message_size_bytes_max=1_000_000)
    assembler.add(MessageId(1, 1), *chunks[0], 0)
    metadata = pb.MessageMetadata()
    metadata.CopyFrom(chunks[1][0])
    for name, value in change.items():
        if value is None:
            metadata.ClearField(name)
        else:
            setattr(metadata, name, value)
    with pytest.raises(RemoteProtocolError):
        assembler.add(MessageId(1, 2), metadata, chunks[1][1], 0)
    assembler.add(MessageId(1, 2), *chunks[1], 0)
    done = assembler.add(MessageId(1, 3), *chunks[2], 0).message
    assert done is not None
    assert done.payload == b"abcdef"


def test_sizes_that_do_not_add_up_are_refused() -> None:
    chunks = chunked(b"abcdef", 2)
    assembler = ChunkAssembler()
    assembler.add(MessageId(1, 1), *chunks[0], 0)
    with pytest.raises(RemoteProtocolError, match="more than"):
        assembler.add(MessageId(1, 2), chunks[1][0], b"toolong", 0)
    assembler.add(MessageId(1, 2), *chunks[1], 0)
    with pytest.raises(RemoteProtocolError, match="add up"):
        assembler.add(MessageId(1, 3), chunks[2][0], b"e", 0)
    lying = pb.MessageMetadata()
    lying.CopyFrom(chunks[2][0])
    lying.num_chunks_from_msg = 4
    with pytest.raises(RemoteProtocolError, match="disagrees"):
        assembler.add(MessageId(1, 3), lying, b"ef", 0)
    done = assembler.add(MessageId(1, 3), *chunks[2], 0).message
    assert done is not None


def test_assembler_settings_must_be_sane() -> None:
    with pytest.raises(ValueError, match="pending"):
        ChunkAssembler(pending_chunked_messages_max=-1)
    with pytest.raises(ValueError, match="expiry"):
        ChunkAssembler(incomplete_chunk_expiry_ms=-1)


@settings(max_examples=40, deadline=None)
@given(
    order=st.permutations(range(4)),
    duplicates=st.lists(st.integers(0, 3), max_size=4),
)
def test_any_arrival_order_never_completes_a_wrong_message(
    order: list[int], duplicates: list[int]
) -> None:
    chunks = chunked(b"ABCDEFGH", 2)
    assembler = ChunkAssembler(pending_chunked_messages_max=0, incomplete_chunk_expiry_ms=0)
    completed = []
    for position in list(order) + duplicates:
        result = assembler.add(MessageId(1, position), *chunks[position], 0)
        if result.message is not None:
            completed.append(result.message)
        assert set(result.ack).isdisjoint(result.redeliver)
    for message in completed:
        assert message.payload == b"ABCDEFGH"
        assert message.chunk_ids == ids(0, 1, 2, 3)
    assert (list(order) == [0, 1, 2, 3]) <= bool(completed)
