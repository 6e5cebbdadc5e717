"""The hand-built SEND_RECEIPT frame is byte for byte what the protobuf runtime builds, over
arbitrary ids (small, varint boundaries, a duplicate's (-1, -1), the uint64 edge)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.codec import pb
from magnetar.codec._framer import base_command, decode_frame, encode_frame
from magnetar.codec._receipts import send_receipt_frame
from magnetar.codec._wire import UINT64_MASK

U64 = st.one_of(st.integers(0, 300), st.sampled_from([127, 128, 16383, 16384, 2**21, 2**28,
                                                       2**35, 2**63, UINT64_MASK]),
                st.integers(0, UINT64_MASK))
IDS = st.one_of(st.just(-1), U64)


def runtime_frame(producer_id: int, sequence_id: int, ledger_id: int, entry_id: int,
                  highest: int) -> bytes:
    receipt = pb.CommandSendReceipt(
        producer_id=producer_id, sequence_id=sequence_id,
        message_id=pb.MessageIdData(ledgerId=ledger_id & UINT64_MASK,
                                    entryId=entry_id & UINT64_MASK),
        highest_sequence_id=highest)
    return encode_frame(base_command(receipt))


@given(U64, U64, IDS, IDS, U64)
def test_receipt_frames_match_the_runtime(producer_id: int, sequence_id: int, ledger_id: int,
                                          entry_id: int, highest: int) -> None:
    ours = send_receipt_frame(producer_id, sequence_id, ledger_id, entry_id, highest)
    assert ours == runtime_frame(producer_id, sequence_id, ledger_id, entry_id, highest)


def test_a_receipt_decodes_to_its_fields() -> None:
    frame = decode_frame(send_receipt_frame(3, 41, 7, 9, 42)[4:])
    receipt = frame.command.send_receipt  # type: ignore[union-attr]
    assert (receipt.producer_id, receipt.sequence_id, receipt.highest_sequence_id) == (3, 41, 42)
    assert (receipt.message_id.ledgerId, receipt.message_id.entryId) == (7, 9)
