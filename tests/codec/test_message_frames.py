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
    Role,
    base_command,
    decode_frame,
    encode_entry,
    encode_frame,
    message_frame,
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
