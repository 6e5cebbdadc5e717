"""The hand-built SEND_RECEIPT frame is byte for byte what the protobuf runtime builds, over
arbitrary ids (small, varint boundaries, a duplicate's (-1, -1), the uint64 edge); a run's
frames built from templates are byte for byte the single frames joined."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from magnetar.codec import pb
from magnetar.codec._framer import base_command, decode_frame, encode_frame
from magnetar.codec._receipts import send_receipt_frame, send_receipt_frames
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


RUN_IDS = st.one_of(st.integers(0, 40), st.sampled_from([16383, 16384, 2**21 - 1, 2**21,
                                                          2**28 - 1, 2**28, 2**40]))


@st.composite
def receipt_runs(draw: st.DrawFn) -> list[tuple[int, int, tuple[int, int]]]:
    """A producer's receipts: mostly consecutive ids in one ledger (the templates' case),
    with jumps across varint lengths, a ledger change, a duplicate's (-1, -1) and a stated
    highest sequence id above the sequence id."""
    sequence_id, ledger_id, entry_id = draw(RUN_IDS), draw(RUN_IDS), draw(RUN_IDS)
    run = []
    for _ in range(draw(st.integers(0, 12))):
        move = draw(st.sampled_from(["next"] * 4 + ["jump", "ledger", "duplicate", "highest"]))
        if move == "jump":
            sequence_id, entry_id = draw(RUN_IDS), draw(RUN_IDS)
        elif move == "ledger":
            ledger_id, entry_id = draw(RUN_IDS), 0
        highest = sequence_id + draw(st.integers(1, 5)) if move == "highest" else sequence_id
        position = (-1, -1) if move == "duplicate" else (ledger_id, entry_id)
        run.append((sequence_id, highest, position))
        sequence_id, entry_id = sequence_id + 1, entry_id + 1
    return run


@given(U64, receipt_runs())
def test_a_runs_frames_are_the_single_frames_joined(
        producer_id: int, run: list[tuple[int, int, tuple[int, int]]]) -> None:
    joined = b"".join(send_receipt_frame(producer_id, sequence_id, ledger_id, entry_id, highest)
                      for sequence_id, highest, (ledger_id, entry_id) in run)
    assert send_receipt_frames(producer_id, run) == joined
