"""Journal segment header and record formats, PAD arithmetic, and the scanner's stops.

The scanner never raises on bad data: it yields the valid prefix and reports where and why
it stopped. Each stop has a test named after the damage it models.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from magnetar.storage import CorruptionError, OsFileSystem
from magnetar.storage._journal_batch import JournalRequest, _Segment, encode_batch
from magnetar.storage._journal_format import (
    RECORD_HEADER_BYTES,
    RecordType,
    ScanResult,
    SegmentHeader,
    encode_adds,
    encode_record,
    pad_record,
    scan_segment,
)

ALIGNMENT = 4096
SEGMENT_ID = 7
RECORD_BYTES_MAX = 1 << 20
KINDS = [k for k in RecordType if k != RecordType.PAD]

Written = list[tuple[int, int, bytes, int]]  # (lsn, kind, payload, offset)


def write_segment(path: Path, records: Sequence[tuple[int, bytes]], *, first_lsn: int = 1,
                  segment_id: int = SEGMENT_ID, pad: bool = True,
                  zeros_after: int = ALIGNMENT) -> Written:
    """A segment file with a header, `records` (kind, payload) and a final PAD to the
    alignment, followed by `zeros_after` zero bytes (the preallocated region)."""
    header = SegmentHeader(segment_id, first_lsn, ALIGNMENT)
    out = bytearray()
    written: Written = []
    lsn = first_lsn
    for kind, payload in records:
        written.append((lsn, kind, payload, ALIGNMENT + len(out)))
        encode_record(out, segment_id, lsn, kind, payload)
        lsn += 1
    before = len(out)
    if pad and pad_record(out, segment_id, lsn, ALIGNMENT, ALIGNMENT):
        pad_payload = bytes(len(out) - before - RECORD_HEADER_BYTES)
        written.append((lsn, RecordType.PAD, pad_payload, ALIGNMENT + before))
    path.write_bytes(header.encode() + bytes(out) + bytes(zeros_after))
    return written


def scan(path: Path, *, start: int = ALIGNMENT, previous_lsn: int | None = 0,
         record_bytes_max: int = RECORD_BYTES_MAX) -> tuple[list[tuple[int, int, bytes, int]],
                                                            ScanResult]:
    handle = OsFileSystem().open_read(str(path))
    try:
        header = SegmentHeader.decode(handle.pread(ALIGNMENT, 0), str(path))
        result = ScanResult(0, 0, 0, False)
        found = [(r.lsn, r.kind, bytes(r.payload), r.offset)
                 for r in scan_segment(handle, header, start, previous_lsn, record_bytes_max,
                                       result)]
    finally:
        handle.close()
    return found, result


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def payloads(found: list[tuple[int, int, bytes, int]]) -> list[bytes]:
    return [p for _, kind, p, _ in found if kind != RecordType.PAD]


def sample_records(count: int = 5) -> list[tuple[int, bytes]]:
    return [(RecordType.ADD_ENTRY, struct.pack(">QQ", 1, i) + bytes([i]) * (100 + i))
            for i in range(count)]


def record_size(payload: bytes) -> int:
    return RECORD_HEADER_BYTES + len(payload)


# -- the segment header ------------------------------------------------------------------

def test_segment_header_round_trip() -> None:
    header = SegmentHeader(0x1122334455667788, 12345, ALIGNMENT)
    block = header.encode()
    assert len(block) == ALIGNMENT
    assert block[:4] == b"PJNL"
    assert block[32:] == bytes(ALIGNMENT - 32)
    assert SegmentHeader.decode(block, "seg") == header


@pytest.mark.parametrize("offset", [0, 5, 8, 16, 24, 28])
def test_segment_header_with_a_flipped_bit_is_refused(offset: int) -> None:
    block = bytearray(SegmentHeader(3, 1, ALIGNMENT).encode())
    block[offset] ^= 0x10
    with pytest.raises(CorruptionError) as caught:
        SegmentHeader.decode(bytes(block), "/j/0003.jnl")
    assert caught.value.path == "/j/0003.jnl"
    assert caught.value.offset == 0


def test_segment_header_truncated_is_refused() -> None:
    with pytest.raises(CorruptionError, match="truncated"):
        SegmentHeader.decode(SegmentHeader(3, 1, ALIGNMENT).encode()[:20], "seg")


def test_segment_header_all_zero_is_refused() -> None:
    # A crash between creating the file and writing its header.
    with pytest.raises(CorruptionError):
        SegmentHeader.decode(bytes(ALIGNMENT), "seg")


def test_segment_header_with_wrong_magic_and_valid_crc_is_refused() -> None:
    from magnetar.storage._crc import crc32c

    fields = struct.pack(">4sHHQQI", b"XJNL", 1, 0, 3, 1, ALIGNMENT)
    block = fields + struct.pack(">I", crc32c(fields))
    with pytest.raises(CorruptionError, match="not a journal segment"):
        SegmentHeader.decode(block, "seg")


# -- records -----------------------------------------------------------------------------

def test_record_layout() -> None:
    out = bytearray()
    encode_record(out, SEGMENT_ID, 99, RecordType.FENCE, b"\x00" * 7 + b"\x05")
    assert len(out) == RECORD_HEADER_BYTES + 8
    _crc, length, lsn, kind, flags, reserved, check = struct.unpack_from(">IIQBBHI", out)
    assert (length, lsn, kind, flags, reserved) == (8, 99, RecordType.FENCE, 0, 0)
    assert check == 8 ^ 0xFFFFFFFF


def test_empty_payload_is_only_for_pad() -> None:
    with pytest.raises(AssertionError):
        encode_record(bytearray(), SEGMENT_ID, 1, RecordType.ADD_ENTRY, b"")
    out = bytearray()
    encode_record(out, SEGMENT_ID, 1, RecordType.PAD, b"")
    assert len(out) == RECORD_HEADER_BYTES


@given(entries=st.lists(st.binary(max_size=300), min_size=1, max_size=8),
       lsn=st.integers(1, 2**62), ledger_id=st.integers(0, 2**63), first=st.integers(0, 2**62))
def test_a_run_of_adds_encodes_as_one_add_record_each(entries: list[bytes], lsn: int,
                                                      ledger_id: int, first: int) -> None:
    """The writer's fast path writes exactly what `encode_record` writes for each add."""
    fast = bytearray()
    assert encode_adds(fast, SEGMENT_ID, lsn, ledger_id, first, entries) == lsn + len(entries)
    slow = bytearray()
    for i, data in enumerate(entries):
        encode_record(slow, SEGMENT_ID, lsn + i, RecordType.ADD_ENTRY,
                      struct.pack(">QQ", ledger_id, first + i) + data)
    assert fast == slow


@given(runs=st.lists(st.one_of(
    st.tuples(st.integers(0, 2**63), st.integers(0, 2**62),
              st.lists(st.binary(max_size=100), min_size=1, max_size=4)),
    st.tuples(st.just(None), st.just(0), st.lists(st.binary(min_size=1, max_size=50),
                                                  min_size=1, max_size=1))), max_size=8),
       lsn=st.integers(1, 2**62))
# Records that end exactly on the 512-byte boundary, so no PAD follows (hypothesis found it).
@example(runs=[(0, 0, [b"\0", b"\0" * 4, b"\0" * 9]), (None, 0, [b"\0"]), (None, 0, [b"\0"]),
               (None, 0, [b"\0" * 2]), (None, 0, [b"\0" * 17]), (0, 0, [b"", b"\0" * 12]),
               (0, 0, [b"", b"", b"\0" * 2, b"\0" * 7])], lsn=1)
def test_a_batch_of_runs_and_records_encodes_as_one_record_each(
        runs: list[tuple[int | None, int, list[bytes]]], lsn: int) -> None:
    """The writer's batch (runs of adds, single adds and other records in any order)
    writes exactly what `encode_record` writes for each record, then its PAD."""
    requests = [JournalRequest(RecordType.ADD_ENTRY, b"", None, None, first + len(datas) - 1,
                               entries=datas, ledger_id=ledger_id) if ledger_id is not None
                else JournalRequest(RecordType.FENCE, datas[0], None) for ledger_id, first, datas
                in runs]
    fast, after = encode_batch(requests, _Segment(SEGMENT_ID, None, 512, 1 << 20),  # type: ignore[arg-type]
                               lsn, 512, 7)
    slow = bytearray()
    for ledger_id, first, datas in runs:
        for i, data in enumerate(datas):
            payload = data if ledger_id is None else struct.pack(">QQ", ledger_id, first + i) + data
            encode_record(slow, SEGMENT_ID, lsn, RecordType.ADD_ENTRY if ledger_id is not None
                          else RecordType.FENCE, payload)
            lsn += 1
    records_bytes = len(slow)
    padded = pad_record(slow, SEGMENT_ID, lsn, 512, 512, 7)
    # A PAD follows unless the records end on the 512-byte boundary (or there are none).
    assert padded == (records_bytes % 512 != 0)
    assert fast == slow
    assert after == lsn + padded


record_lists = st.lists(
    st.tuples(st.sampled_from(KINDS), st.binary(min_size=1, max_size=3000)),
    max_size=30)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(records=record_lists, first_lsn=st.integers(1, 2**63))
def test_records_round_trip(tmp_path: Path, records: list[tuple[int, bytes]],
                            first_lsn: int) -> None:
    path = tmp_path / "segment.jnl"
    written = write_segment(path, records, first_lsn=first_lsn)
    found, result = scan(path, previous_lsn=first_lsn - 1)
    assert found == written
    assert result.clean
    assert result.problem == ""
    assert result.records == len(found)
    assert result.end_offset % ALIGNMENT == 0, "every batch ends on the alignment"
    expected_last = first_lsn - 1 + len(found)
    assert result.last_lsn == expected_last
    assert [lsn for lsn, *_ in found] == list(range(first_lsn, expected_last + 1))


@given(records=record_lists)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=30)
def test_scan_accepts_any_first_lsn_when_previous_is_unknown(
        tmp_path: Path, records: list[tuple[int, bytes]]) -> None:
    path = tmp_path / "segment.jnl"
    write_segment(path, records, first_lsn=1000)
    found, result = scan(path, previous_lsn=None)
    assert payloads(found) == [p for _, p in records]
    assert result.clean


def test_scan_from_the_middle(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    records = sample_records(6)
    written = write_segment(path, records)
    lsn, _, _, offset = written[3]
    found, result = scan(path, start=offset, previous_lsn=lsn - 1)
    assert payloads(found) == [p for _, p in records[3:]]
    assert result.clean


# -- PAD alignment -----------------------------------------------------------------------

@given(position=st.integers(0, 2**40), body=st.integers(0, 20_000),
       alignment_log2=st.integers(9, 16))
def test_pad_reaches_the_next_boundary(position: int, body: int, alignment_log2: int) -> None:
    alignment = 1 << alignment_log2
    out = bytearray(body)
    padded = pad_record(out, SEGMENT_ID, 1, position, alignment)
    end = position + body
    if end % alignment == 0:
        assert not padded
        assert len(out) == body, "nothing appended when already aligned"
        return
    assert padded
    added = len(out) - body
    assert (position + len(out)) % alignment == 0
    assert added >= RECORD_HEADER_BYTES, "the PAD carries a whole record header"
    assert added < alignment + RECORD_HEADER_BYTES, "the PAD is the shortest that fits"
    _crc, length, lsn, kind, _f, _r, check = struct.unpack_from(">IIQBBHI", out, body)
    assert kind == RecordType.PAD
    assert lsn == 1
    assert length == added - RECORD_HEADER_BYTES
    assert check == length ^ 0xFFFFFFFF
    assert out[body + RECORD_HEADER_BYTES:] == bytes(length)


def test_pad_when_the_gap_is_smaller_than_a_header() -> None:
    out = bytearray(ALIGNMENT - 10)
    assert pad_record(out, SEGMENT_ID, 1, 0, ALIGNMENT)
    assert len(out) == 2 * ALIGNMENT


def test_pad_when_the_gap_equals_a_header() -> None:
    out = bytearray(ALIGNMENT - RECORD_HEADER_BYTES)
    assert pad_record(out, SEGMENT_ID, 1, 0, ALIGNMENT)
    assert len(out) == ALIGNMENT  # a PAD with an empty payload


# -- where the scan stops ----------------------------------------------------------------

def test_clean_end_at_zero_header(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    records = sample_records()
    written = write_segment(path, records)
    found, result = scan(path)
    assert payloads(found) == [p for _, p in records]
    assert result.clean
    assert result.records == len(written)
    assert result.end_offset == 2 * ALIGNMENT
    assert result.last_lsn == written[-1][0]


def test_header_only_segment(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    write_segment(path, [], zeros_after=0)
    found, result = scan(path, previous_lsn=41)
    assert found == []
    assert result.clean
    assert (result.end_offset, result.last_lsn, result.records) == (ALIGNMENT, 41, 0)


def test_empty_preallocated_segment(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    write_segment(path, [], zeros_after=64 * 1024)
    found, result = scan(path)
    assert found == []
    assert result.clean
    assert result.end_offset == ALIGNMENT


def test_bad_length_check(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    records = sample_records()
    written = write_segment(path, records)
    bad_lsn, _, _, bad_offset = written[2]
    flip(path, bad_offset + 5)  # inside the length field
    found, result = scan(path)
    assert payloads(found) == [p for _, p in records[:2]]
    assert not result.clean
    assert "length check" in result.problem
    assert result.end_offset == bad_offset
    assert result.last_lsn == bad_lsn - 1
    assert result.records == 2


def test_truncated_in_length_zeroed(tmp_path: Path) -> None:
    # The tail zeroed in the middle of a length field (BookieJournalTest
    # testTruncatedInLenJournal): the torn record is not replayed.
    path = tmp_path / "segment.jnl"
    records = sample_records()
    written = write_segment(path, records)
    _, _, _, torn = written[3]
    data = bytearray(path.read_bytes())
    data[torn + 6:] = bytes(len(data) - torn - 6)
    path.write_bytes(bytes(data))
    found, result = scan(path)
    assert payloads(found) == [p for _, p in records[:3]]
    assert not result.clean
    assert result.end_offset == torn


def test_length_above_the_maximum(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    records = [(RecordType.ADD_ENTRY, b"a" * 100), (RecordType.ADD_ENTRY, b"b" * 5000)]
    written = write_segment(path, records)
    found, result = scan(path, record_bytes_max=1000)
    assert payloads(found) == [b"a" * 100]
    assert not result.clean
    assert "exceeds the maximum" in result.problem
    assert result.end_offset == written[1][3]


def test_crc_mismatch_in_payload(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    records = sample_records()
    written = write_segment(path, records)
    bad_offset = written[1][3]
    flip(path, bad_offset + RECORD_HEADER_BYTES + 50)
    found, result = scan(path)
    assert payloads(found) == [records[0][1]]
    assert not result.clean
    assert result.problem == "record CRC mismatch"
    assert result.end_offset == bad_offset
    assert result.records == 1


def test_crc_mismatch_in_type(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    records = sample_records()
    written = write_segment(path, records)
    flip(path, written[4][3] + 16)  # the type byte is covered by the CRC
    found, result = scan(path)
    assert payloads(found) == [p for _, p in records[:4]]
    assert result.problem == "record CRC mismatch"
    assert result.end_offset == written[4][3]


def test_record_from_another_segment(tmp_path: Path) -> None:
    # Records are seeded with their segment id: bytes left over from another segment (a
    # reused or renamed file) fail the CRC.
    path = tmp_path / "segment.jnl"
    records = sample_records(3)
    write_segment(path, records, segment_id=SEGMENT_ID + 1)
    data = bytearray(path.read_bytes())
    data[:ALIGNMENT] = SegmentHeader(SEGMENT_ID, 1, ALIGNMENT).encode()
    path.write_bytes(bytes(data))
    found, result = scan(path)
    assert found == []
    assert result.problem == "record CRC mismatch"
    assert result.end_offset == ALIGNMENT


def test_lsn_gap(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    out = bytearray()
    encode_record(out, SEGMENT_ID, 1, RecordType.FENCE, b"1" * 8)
    encode_record(out, SEGMENT_ID, 2, RecordType.FENCE, b"2" * 8)
    gap_offset = ALIGNMENT + len(out)
    encode_record(out, SEGMENT_ID, 4, RecordType.FENCE, b"4" * 8)
    path.write_bytes(SegmentHeader(SEGMENT_ID, 1, ALIGNMENT).encode() + bytes(out)
                     + bytes(ALIGNMENT))
    found, result = scan(path)
    assert payloads(found) == [b"1" * 8, b"2" * 8]
    assert not result.clean
    assert result.problem == "record LSN 4 does not follow 2"
    assert result.end_offset == gap_offset
    assert result.last_lsn == 2


def test_first_record_must_follow_previous_lsn(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    write_segment(path, sample_records(2), first_lsn=10)
    found, result = scan(path, previous_lsn=5)
    assert found == []
    assert not result.clean
    assert "does not follow 5" in result.problem
    assert result.end_offset == ALIGNMENT
    assert result.last_lsn == 5


def test_empty_non_pad_record(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    out = bytearray()
    encode_record(out, SEGMENT_ID, 1, RecordType.FENCE, b"x" * 8)
    bad = ALIGNMENT + len(out)
    encode_record(out, SEGMENT_ID, 2, RecordType.PAD, b"")
    out[bad - ALIGNMENT + 16] = RecordType.FENCE  # a PAD relabelled: the check fires first
    path.write_bytes(SegmentHeader(SEGMENT_ID, 1, ALIGNMENT).encode() + bytes(out)
                     + bytes(ALIGNMENT))
    found, result = scan(path)
    assert payloads(found) == [b"x" * 8]
    assert result.problem == "empty record"
    assert result.end_offset == bad


def test_truncated_in_entry(tmp_path: Path) -> None:
    # The file ends inside a record's payload: a short read.
    path = tmp_path / "segment.jnl"
    records = sample_records()
    written = write_segment(path, records, zeros_after=0)
    last_offset = written[4][3]
    with open(path, "r+b") as f:
        f.truncate(last_offset + RECORD_HEADER_BYTES + 30)
    found, result = scan(path)
    assert payloads(found) == [p for _, p in records[:4]]
    assert not result.clean
    assert result.problem == "record runs past the end of the file"
    assert result.end_offset == last_offset


def test_truncated_in_header_is_the_end_of_data(tmp_path: Path) -> None:
    # Fewer than a record header's bytes left: the end of the segment (design §12.1).
    path = tmp_path / "segment.jnl"
    records = sample_records(3)
    written = write_segment(path, records, pad=False, zeros_after=0)
    out = bytearray()
    encode_record(out, SEGMENT_ID, 4, RecordType.FENCE, b"y" * 8)
    with open(path, "ab") as f:
        f.write(bytes(out[:RECORD_HEADER_BYTES - 1]))
    found, result = scan(path)
    assert payloads(found) == [p for _, p in records]
    assert result.clean
    assert result.end_offset == written[-1][3] + record_size(records[-1][1])


def test_junk_at_end(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    records = sample_records(3)
    written = write_segment(path, records)
    end = written[-1][3] + record_size(written[-1][2])
    data = bytearray(path.read_bytes())
    data[end:end + 200] = os.urandom(199) + b"\xff"
    path.write_bytes(bytes(data))
    found, result = scan(path)
    assert payloads(found) == [p for _, p in records]
    assert not result.clean
    assert result.end_offset == end


def test_all_junk_segment_body(tmp_path: Path) -> None:
    path = tmp_path / "segment.jnl"
    path.write_bytes(SegmentHeader(SEGMENT_ID, 1, ALIGNMENT).encode() + b"\xa5" * 10_000)
    found, result = scan(path)
    assert found == []
    assert not result.clean
    assert result.end_offset == ALIGNMENT


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=80)
@given(records=st.lists(st.tuples(st.sampled_from(KINDS), st.binary(min_size=1, max_size=600)),
                        min_size=1, max_size=12),
       where=st.floats(0.0, 1.0, exclude_max=True), mask=st.integers(1, 255),
       cut=st.booleans())
def test_damage_anywhere_yields_the_records_before_it(
        tmp_path: Path, records: list[tuple[int, bytes]], where: float, mask: int,
        cut: bool) -> None:
    """Flip a byte, or truncate the file, anywhere after the header: the scan never raises
    and yields exactly the records that lie wholly before the damage."""
    path = tmp_path / "segment.jnl"
    written = write_segment(path, records)
    size = path.stat().st_size
    at = ALIGNMENT + int(where * (size - ALIGNMENT))
    if cut:
        with open(path, "r+b") as f:
            f.truncate(at)
    else:
        flip(path, at, mask)
    found, result = scan(path)
    intact = [w for w in written if w[3] + record_size(w[2]) <= at]
    assert [(lsn, kind, payload) for lsn, kind, payload, _ in found] == \
        [(lsn, kind, payload) for lsn, kind, payload, _ in intact]
    assert result.records == len(found)
    assert result.end_offset == (intact[-1][3] + record_size(intact[-1][2]) if intact
                                 else ALIGNMENT)
