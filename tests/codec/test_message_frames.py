"""The hand-built MESSAGE frame is byte for byte what the protobuf runtime builds (the way
`encode_frame` with a stored entry builds it), over arbitrary ids, partitions (negative ones
too), redelivery counts, ack sets and epochs; and `Connection.check_send` refuses what `send`
refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.codec import (
    Connection,
    LocalProtocolError,
    MessageFrameHeads,
    Role,
    base_command,
    decode_frame,
    encode_entry,
    encode_frame,
    message_frame,
    message_frame_head,
    pb,
)
from magnetar.codec._wire import UINT64_MASK

from .helpers import connected

T = pb.BaseCommand
U64 = st.one_of(st.integers(0, 300), st.sampled_from([127, 128, 16383, 16384, 2**21, 2**28,
                                                       2**35, 2**63, UINT64_MASK]),
                st.integers(0, UINT64_MASK))
IDS = st.one_of(st.just(-1), U64)
INT32 = st.one_of(st.sampled_from([-1, 0, 1, 2**31 - 1, -(2**31)]),
                  st.integers(-(2**31), 2**31 - 1))
INT64 = st.one_of(st.sampled_from([-1, 0, 2**63 - 1, -(2**63)]),
                  st.integers(-(2**63), 2**63 - 1))
ENTRY = encode_entry(pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2), b"x")


def runtime_frame(consumer_id: int, ledger_id: int, entry_id: int, partition: int,
                  redelivery_count: int, entry: bytes, ack_set: list[int],
                  epoch: int | None) -> bytes:
    message = pb.CommandMessage(
        consumer_id=consumer_id,
        message_id=pb.MessageIdData(ledgerId=ledger_id & UINT64_MASK,
                                    entryId=entry_id & UINT64_MASK, partition=partition),
        redelivery_count=redelivery_count)
    if ack_set:
        message.ack_set.extend(ack_set)
    if epoch is not None:
        message.consumer_epoch = epoch
    return encode_frame(base_command(message), entry=entry)


@given(U64, IDS, IDS, INT32, st.integers(0, 2**32 - 1), st.binary(max_size=40),
       st.lists(INT64, max_size=4), st.none() | U64)
def test_message_frames_match_the_runtime(consumer_id: int, ledger_id: int, entry_id: int,
                                          partition: int, redelivery_count: int,
                                          entry: bytes, ack_set: list[int],
                                          epoch: int | None) -> None:
    ours = message_frame(consumer_id, ledger_id, entry_id, partition, redelivery_count, entry,
                         ack_set=ack_set, consumer_epoch=epoch)
    assert ours == runtime_frame(consumer_id, ledger_id, entry_id, partition,
                                 redelivery_count, entry, ack_set, epoch)


SMALL = st.one_of(st.just(-1), st.integers(0, 3), st.sampled_from([127, 128, 2**14, 2**21]))


@given(U64, st.lists(st.tuples(SMALL, IDS, st.sampled_from([-1, 0, 5, 2**31 - 1]),
                              st.sampled_from([0, 1, 200]), st.integers(0, 2**20),
                              st.lists(INT64, max_size=2), st.sampled_from([None, 0, 2**40])),
                    max_size=12))
def test_the_heads_of_a_write_match_single_heads(
        consumer_id: int, heads: list[tuple[int, int, int, int, int, list[int], int | None]],
) -> None:
    """A run of heads (ledgers, partitions, counts and epochs changing or not, ids of every
    width, some with ack sets) is byte for byte what `message_frame_head` builds for each."""
    shared = MessageFrameHeads(consumer_id)
    for ledger_id, entry_id, partition, redelivery, entry_bytes, ack_set, epoch in heads:
        assert shared.head(ledger_id, entry_id, partition, redelivery, entry_bytes,
                           ack_set, epoch) == message_frame_head(
            consumer_id, ledger_id, entry_id, partition, redelivery, entry_bytes,
            ack_set=ack_set, consumer_epoch=epoch)


def test_the_heads_of_a_write_refuse_a_frame_over_the_limit() -> None:
    size = len(message_frame(1, 2, 3, -1, 0, ENTRY)) - 4
    heads = MessageFrameHeads(1, frame_size_bytes_max=size)
    assert len(heads.head(2, 3, -1, 0, len(ENTRY))) + len(ENTRY) == size + 4
    with pytest.raises(LocalProtocolError, match="exceeds"):
        heads.head(2, 3, -1, 0, len(ENTRY) + 1)


def test_a_message_decodes_to_its_fields_and_entry() -> None:
    frame = decode_frame(message_frame(4, 7, 9, -1, 2, ENTRY, ack_set=[5], consumer_epoch=3)[4:])
    message = frame.command.message  # type: ignore[union-attr]
    assert (message.consumer_id, message.redelivery_count, list(message.ack_set),
            message.consumer_epoch) == (4, 2, [5], 3)
    assert (message.message_id.ledgerId, message.message_id.entryId,
            message.message_id.partition) == (7, 9, -1)
    assert frame.entry == ENTRY  # type: ignore[union-attr]


def test_a_frame_over_the_limit_is_refused() -> None:
    size = len(message_frame(1, 2, 3, -1, 0, ENTRY)) - 4  # totalSize: the limit's measure
    assert len(message_frame(1, 2, 3, -1, 0, ENTRY, frame_size_bytes_max=size)) == size + 4
    with pytest.raises(LocalProtocolError, match="exceeds"):
        message_frame(1, 2, 3, -1, 0, ENTRY, frame_size_bytes_max=size - 1)


def test_check_send_refuses_what_send_refuses() -> None:
    broker = connected(Role.BROKER)
    broker.check_send(T.MESSAGE)  # allowed: nothing raised
    with pytest.raises(LocalProtocolError, match="does not send"):
        broker.check_send(T.SEND)  # a client's command
    with pytest.raises(LocalProtocolError, match="cannot handle"):
        broker.check_send(T.REACHED_END_OF_TOPIC)  # the C++ client would drop the connection
    fresh = Connection(Role.BROKER)
    with pytest.raises(LocalProtocolError):
        fresh.check_send(T.MESSAGE)  # before the handshake
    with pytest.raises(LocalProtocolError):
        connected(Role.BROKER).check_send(T.CONNECTED)  # a handshake command
