"""Compression: every codec round-trips, writes the format Pulsar's clients write, and refuses
bad or oversized input with RemoteProtocolError only (the byte-for-byte comparison with the
official client's output is in test_interop_client.py)."""

from __future__ import annotations

import zlib

import lz4.block
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.codec import (
    UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT,
    CompressionType,
    RemoteProtocolError,
    compress,
    decompress,
)

from .helpers import decode_whole_prefixes_trailing

CODECS = list(CompressionType)
SAMPLE = b"Pulsar batches compress well because they repeat themselves. " * 40


@settings(max_examples=40, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=2000))
def test_every_codec_round_trips(codec: CompressionType, data: bytes) -> None:
    packed = compress(codec, data)
    assert decompress(codec, packed, len(data)) == data


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_decoding_whole_prefixes_and_trailing(codec: CompressionType) -> None:
    packed = compress(codec, SAMPLE)

    def decode(data: bytes) -> bytes:
        return decompress(codec, data, len(SAMPLE))

    # NONE has no framing: a prefix is just shorter data, which the size check refuses; the
    # others refuse truncated streams outright. ZSTD stops at the end of its frame.
    ignored = codec is CompressionType.ZSTD
    assert decode_whole_prefixes_trailing(decode, packed, trailing_ignored=ignored) == SAMPLE


def test_formats_are_the_ones_pulsar_uses() -> None:
    assert compress(CompressionType.NONE, SAMPLE) == SAMPLE
    # LZ4: a raw block, no frame and no size prefix; only the uncompressed size recovers it.
    lz4_data = compress(CompressionType.LZ4, SAMPLE)
    assert lz4.block.decompress(lz4_data, uncompressed_size=len(SAMPLE)) == SAMPLE
    assert not lz4_data.startswith(b"\x04\x22\x4d\x18")  # not the LZ4 frame magic
    # ZLIB: a zlib stream with its header, default level.
    zlib_data = compress(CompressionType.ZLIB, SAMPLE)
    assert zlib_data[:2] == b"\x78\x9c"
    assert zlib.decompress(zlib_data) == SAMPLE
    # ZSTD: one standard frame that records its content size.
    zstd_data = compress(CompressionType.ZSTD, SAMPLE)
    assert zstd_data[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.frame_content_size(zstd_data) == len(SAMPLE)
    # SNAPPY: raw snappy, starting with the varint length, not the framing format.
    snappy_data = compress(CompressionType.SNAPPY, SAMPLE)
    assert snappy_data[:2] == bytes([(len(SAMPLE) & 0x7F) | 0x80, len(SAMPLE) >> 7])
    assert snappy.uncompress(snappy_data) == SAMPLE


def test_wire_values() -> None:
    assert [c.value for c in CompressionType] == [0, 1, 2, 3, 4]
    assert [c.name for c in CompressionType] == ["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_claimed_size_above_the_bound_is_refused_before_decompressing(
    codec: CompressionType,
) -> None:
    packed = compress(codec, SAMPLE)
    with pytest.raises(RemoteProtocolError, match="outside"):
        decompress(codec, packed, 1 << 40)
    with pytest.raises(RemoteProtocolError, match="outside"):
        decompress(codec, packed, len(SAMPLE), uncompressed_size_bytes_max=len(SAMPLE) - 1)
    with pytest.raises(RemoteProtocolError, match="outside"):
        decompress(codec, packed, -1)
    assert UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT == 5 * 1024 * 1024


def test_a_bomb_cannot_expand_past_its_claimed_size() -> None:
    # 64 MiB of zeros compress to little; claiming a small size must not decompress them all.
    bomb = b"\x00" * (64 * 1024 * 1024)
    for codec in (CompressionType.ZLIB, CompressionType.ZSTD, CompressionType.LZ4):
        packed = compress(codec, bomb)
        assert len(packed) < 1024 * 1024
        with pytest.raises(RemoteProtocolError):
            decompress(codec, packed, 1000)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_wrong_uncompressed_size_is_refused(codec: CompressionType) -> None:
    packed = compress(codec, SAMPLE)
    for claimed in (len(SAMPLE) - 1, len(SAMPLE) + 1, 0):
        with pytest.raises(RemoteProtocolError):
            decompress(codec, packed, claimed)


def test_unknown_codec_is_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown compression"):
        decompress(9, b"", 0)
    with pytest.raises(ValueError, match="9"):
        compress(9, b"")


@settings(max_examples=80, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=300), size=st.integers(0, 5000))
def test_garbage_gives_protocol_error_only(codec: CompressionType, data: bytes, size: int) -> None:
    try:
        output = decompress(codec, data, size)
    except RemoteProtocolError:
        return
    assert len(output) == size


@pytest.mark.parametrize("codec", CODECS[1:], ids=lambda c: c.name)
def test_bit_flips_of_real_payloads_give_protocol_error_or_the_right_size(
    codec: CompressionType,
) -> None:
    packed = compress(codec, SAMPLE[:300])
    for position in range(len(packed)):
        for bit in (0, 3, 7):
            flipped = bytearray(packed)
            flipped[position] ^= 1 << bit
            try:
                output = decompress(codec, bytes(flipped), 300)
            except RemoteProtocolError:
                continue
            assert len(output) == 300
