"""Payload compression, byte-compatible with Pulsar's clients.

Theory of operation
-------------------

A producer compresses the *whole* payload of an entry once: the body of a single message, or the
entire batch payload (every size prefix, single-message metadata and body). The entry's
`MessageMetadata` is never compressed; it records the codec in `compression` (present only when
compressed) and the length before compression in `uncompressed_size`. Chunked messages are
compressed before they are split and decompressed after reassembly.

| codec  | value | format on the wire                              | Python library            |
|--------|-------|-------------------------------------------------|---------------------------|
| NONE   | 0     | the bytes as they are                           | -                         |
| LZ4    | 1     | one raw LZ4 *block*, no frame, no size prefix   | `lz4.block`               |
| ZLIB   | 2     | a zlib stream with its 2-byte header (`78 9c`)  | `zlib` (level 6)          |
| ZSTD   | 3     | one standard zstd frame (with content size)     | `zstandard` (level 3)     |
| SNAPPY | 4     | raw snappy: varint length, then the elements    | `snappy` (python-snappy)  |

LZ4 blocks carry no length, which is why Pulsar sends `uncompressed_size`: the decoder needs it to
size its output buffer.

Decompression is where a hostile or corrupt entry could exhaust memory (a few kilobytes that
claim or expand to gigabytes). `decompress` therefore checks the claimed size against
`uncompressed_size_bytes_max` *before* allocating, bounds every library call by the claimed size,
and then requires the output to be exactly `uncompressed_size` bytes. Any failure, including the
libraries' own exceptions, becomes a `RemoteProtocolError`. Bytes after the end of the stream
are refused too, except after a ZSTD frame: the `zstandard` library stops at the frame's end
without reporting what follows (Pulsar's clients would refuse them as a second, bad frame).
"""

from __future__ import annotations

import enum
import zlib
from typing import Final

import lz4.block
import snappy
import zstandard

from ._errors import RemoteProtocolError
from ._wire import decode_varint

__all__ = [
    "UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT",
    "CompressionType",
    "compress",
    "decompress",
]

# Pulsar's default maximum message size (5 MiB). A consumer treats a payload that would decompress
# to more than its connection's max message size as corrupt, so this is the default bound.
UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT: Final = 5 * 1024 * 1024

ZLIB_LEVEL: Final = 6  # zlib's default, and what the Java and C++ clients use
ZSTD_LEVEL: Final = 3  # the level Pulsar's clients use


class CompressionType(enum.IntEnum):
    """Pulsar's `CompressionType` enum; the values are the wire values."""

    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4


_ZSTD_COMPRESSOR: Final = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
_ZSTD_DECOMPRESSOR: Final = zstandard.ZstdDecompressor()


def compress(compression: CompressionType | int, data: bytes) -> bytes:
    """Compress `data` the way Pulsar's producers do.

    Args:
        compression: the codec.
        data: the uncompressed payload.

    Returns:
        The compressed payload (for NONE, `data` itself).

    Raises:
        ValueError: `compression` is not one of Pulsar's codecs.
    """
    codec = CompressionType(compression)
    if codec is CompressionType.NONE:
        return data
    if codec is CompressionType.LZ4:
        return bytes(lz4.block.compress(data, mode="default", store_size=False))
    if codec is CompressionType.ZLIB:
        return zlib.compress(data, ZLIB_LEVEL)
    if codec is CompressionType.ZSTD:
        return bytes(_ZSTD_COMPRESSOR.compress(data))
    return bytes(snappy.compress(data))


def decompress(
    compression: CompressionType | int,
    data: bytes,
    uncompressed_size: int,
    *,
    uncompressed_size_bytes_max: int = UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT,
) -> bytes:
    """Decompress a payload, trusting nothing about it.

    Args:
        compression: the codec named by the entry's metadata (any int; unknown ones are rejected).
        data: the compressed payload.
        uncompressed_size: the metadata's `uncompressed_size`.
        uncompressed_size_bytes_max: refuse payloads that claim to be larger than this.

    Returns:
        Exactly `uncompressed_size` bytes.

    Raises:
        RemoteProtocolError: unknown codec, a size above the bound, corrupt data, or output whose
            length differs from `uncompressed_size`.
    """
    try:
        codec = CompressionType(compression)
    except ValueError:
        raise RemoteProtocolError(f"unknown compression type {compression}") from None
    if uncompressed_size < 0 or uncompressed_size > uncompressed_size_bytes_max:
        raise RemoteProtocolError(
            f"uncompressed size {uncompressed_size} is outside [0, {uncompressed_size_bytes_max}]"
        )
    if codec is CompressionType.NONE:
        output = data
    else:
        try:
            output = _DECOMPRESSORS[codec](data, uncompressed_size)
        except RemoteProtocolError:
            raise
        except Exception as exc:
            # The codec libraries raise their own exception types (LZ4BlockError, ZstdError,
            # snappy.UncompressError, zlib.error, ...) on corrupt input; all mean the same here.
            raise RemoteProtocolError(f"{codec.name} payload is corrupt ({exc})") from None
    if len(output) != uncompressed_size:
        raise RemoteProtocolError(
            f"{codec.name} payload decompressed to {len(output)} bytes, "
            f"metadata says {uncompressed_size}"
        )
    return output


def _lz4_decompress(data: bytes, size: int) -> bytes:
    if size == 0:
        # lz4 refuses a zero-sized destination; the empty input compresses to one zero token.
        if data != b"\x00":
            raise RemoteProtocolError("LZ4 payload for an empty message is corrupt")
        return b""
    return bytes(lz4.block.decompress(data, uncompressed_size=size))


def _zlib_decompress(data: bytes, size: int) -> bytes:
    decompressor = zlib.decompressobj()
    output = decompressor.decompress(data, size + 1)
    if not decompressor.eof or decompressor.unused_data or decompressor.unconsumed_tail:
        raise RemoteProtocolError("ZLIB payload is truncated, too long, or has trailing bytes")
    return output


def _zstd_decompress(data: bytes, size: int) -> bytes:
    declared = zstandard.frame_content_size(data)
    if declared not in (-1, size):
        raise RemoteProtocolError(f"ZSTD frame declares {declared} bytes, metadata says {size}")
    return bytes(_ZSTD_DECOMPRESSOR.decompress(data, max_output_size=size))


def _snappy_decompress(data: bytes, size: int) -> bytes:
    declared, _ = decode_varint(data, 0, len(data))
    if declared != size:
        raise RemoteProtocolError(f"SNAPPY payload declares {declared} bytes, metadata says {size}")
    return bytes(snappy.uncompress(data))


_DECOMPRESSORS: Final = {
    CompressionType.LZ4: _lz4_decompress,
    CompressionType.ZLIB: _zlib_decompress,
    CompressionType.ZSTD: _zstd_decompress,
    CompressionType.SNAPPY: _snappy_decompress,
}
