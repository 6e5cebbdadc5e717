"""The hash functions Pulsar routes and dispatches with.

Theory of operation
-------------------

Three string hashes decide which *partition* a keyed message goes to (`hash(key) % partitions`).
Each is masked to a non-negative 31-bit value with `& 0x7FFFFFFF` (masked, not `abs`):

| scheme             | used by                                  | over                          |
|--------------------|------------------------------------------|-------------------------------|
| `murmur3_32`       | brokers; clients configured for it       | UTF-8 bytes, seed 0           |
| `java_string_hash` | the Java client's default                | UTF-16 units, `h = 31*h + c`  |
| `boost_hash`       | the C++ client's default (so Python's)   | bytes (Boost >= 1.81)         |

`boost_hash` reproduces `boost::hash<std::string>` as compiled into the official Python wheel
(Boost 1.81 or later on a 64-bit platform, checked against the wheel's machine code): a
multiply-xor ("mulx") hash over 8-byte little-endian words, the tail read as one or two 4-byte
words or up to three single bytes, then masked to 31 bits. The C++ client also has a
`JavaStringHash` that walks UTF-8 bytes as *signed* chars; `java_string_hash_utf8` is that variant,
which agrees with Java only for ASCII keys.

The broker's Key_Shared dispatcher uses Murmur3 too. A message's *sticky key* (ordering key,
else partition key -- base64-decoded when flagged -- else `producer_name-sequence_id`, else
`NONE_KEY`) is hashed into a slot of the selector's key-hash range:

    slot = (murmur3_32(key) & 0x7FFFFFFF) % (end - start + 1) + start;  slot 0 becomes 1

| selector                      | mode                          | range       |
|-------------------------------|-------------------------------|-------------|
| consistent hashing (default)  | AUTO_SPLIT                    | [1, 65535]  |
| hash-range auto-split         | AUTO_SPLIT, consistent off    | [0, 65535]  |
| hash-range exclusive          | STICKY                        | [0, 65535]  |

Slot 0 is reserved by Pulsar as "hash not set", hence the remapping.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

import mmh3

from ._proto import pulsar_api_pb2 as pb

__all__ = [
    "KEY_HASH_RANGE_SIZE",
    "NONE_KEY",
    "boost_hash",
    "consistent_hashing_slot",
    "hash_range_slot",
    "java_string_hash",
    "java_string_hash_utf8",
    "key_hash_slot",
    "murmur3_32",
    "murmur3_32_raw",
    "sticky_key",
]

INT31_MASK: Final = 0x7FFFFFFF
UINT64_MASK: Final = (1 << 64) - 1
KEY_HASH_RANGE_SIZE: Final = 65536  # Pulsar's DEFAULT_RANGE_SIZE, 2 << 15
NONE_KEY: Final = b"NONE_KEY"

_BOOST_Q: Final = 0x9E3779B97F4A7C15  # 2**64 / golden ratio
_BOOST_K: Final = 0xDF442D22CE4859B9  # _BOOST_Q * _BOOST_Q mod 2**64


def _as_bytes(key: str | bytes) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key


def murmur3_32_raw(key: str | bytes) -> int:
    """MurmurHash3 x86 32-bit, seed 0, unsigned: the value before Pulsar masks it.

    Args:
        key: bytes, or a string hashed as UTF-8.

    Returns:
        An integer in [0, 2**32).
    """
    return int(mmh3.hash(_as_bytes(key), 0, signed=False))


def murmur3_32(key: str | bytes) -> int:
    """Pulsar's `Murmur3_32Hash.makeHash`: Murmur3 x86 32-bit, seed 0, masked to 31 bits."""
    return murmur3_32_raw(key) & INT31_MASK


def java_string_hash(key: str) -> int:
    """Java's `String.hashCode()` over UTF-16 code units, masked to 31 bits (Java client)."""
    value = 0
    data = key.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        value = (31 * value + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return value & INT31_MASK


def java_string_hash_utf8(key: str | bytes) -> int:
    """The C++ client's `JavaStringHash`: the same recurrence over UTF-8 bytes as signed chars."""
    value = 0
    for byte in _as_bytes(key):
        signed = byte - 256 if byte > 127 else byte
        value = (31 * value + signed) & 0xFFFFFFFF
    return value & INT31_MASK


def _mulx(x: int, y: int) -> int:
    product = x * y
    return (product ^ (product >> 64)) & UINT64_MASK


def boost_hash(key: str | bytes) -> int:
    """The C++ client's default `BoostHash` (so the official Python client's key routing).

    Args:
        key: bytes, or a string hashed as UTF-8.

    Returns:
        `boost::hash<std::string>` of the key (Boost >= 1.81, 64-bit), masked to 31 bits.
    """
    data = _as_bytes(key)
    n = len(data)
    w = _mulx(_BOOST_Q, _BOOST_K)  # seed 0: mulx(seed + q, k)
    h = w ^ n
    pos = 0
    while n - pos >= 8:
        w = (w + _BOOST_Q) & UINT64_MASK
        word = int.from_bytes(data[pos : pos + 8], "little")
        h ^= _mulx((word + w) & UINT64_MASK, _BOOST_K)
        pos += 8
    tail = data[pos:]
    size = len(tail)
    if size >= 4:
        high = int.from_bytes(tail[size - 4 :], "little")
        low = int.from_bytes(tail[:4], "little")
        word = ((high << ((size - 4) * 8)) | low) & UINT64_MASK
    elif size >= 1:
        x1 = (size - 1) & 2
        x2 = size >> 1
        word = (tail[x1] << (x1 * 8)) | (tail[x2] << (x2 * 8)) | tail[0]
    else:
        word = 0
    w = (w + _BOOST_Q) & UINT64_MASK
    h ^= _mulx((word + w) & UINT64_MASK, _BOOST_K)
    return _mulx((h + w) & UINT64_MASK, _BOOST_K) & INT31_MASK


def key_hash_slot(key: str | bytes, range_start: int, range_end: int) -> int:
    """Pulsar's `makeStickyKeyHash`: the slot of `key` in the inclusive range [start, end].

    Args:
        key: the sticky key (bytes, or a string hashed as UTF-8).
        range_start: the first slot of the selector's key-hash range.
        range_end: the last slot (inclusive).

    Returns:
        `murmur3_32(key) % (end - start + 1) + start`, with 0 replaced by 1.
    """
    if not 0 <= range_start <= range_end:
        raise ValueError(f"bad key-hash range [{range_start}, {range_end}]")
    slot = murmur3_32(key) % (range_end - range_start + 1) + range_start
    return 1 if slot == 0 else slot


def consistent_hashing_slot(key: str | bytes) -> int:
    """Slot for the consistent-hashing selector (Key_Shared AUTO_SPLIT, the default): [1, 65535]."""
    return key_hash_slot(key, 1, KEY_HASH_RANGE_SIZE - 1)


def hash_range_slot(key: str | bytes) -> int:
    """Slot for the hash-range selectors (AUTO_SPLIT without consistent hashing, and STICKY):
    [0, 65535], with 0 remapped to 1."""
    return key_hash_slot(key, 0, KEY_HASH_RANGE_SIZE - 1)


def sticky_key(metadata: pb.MessageMetadata) -> bytes:
    """The bytes Pulsar 4.0's Key_Shared dispatcher hashes for an entry (`resolveStickyKey`).

    Args:
        metadata: the entry-level metadata (for a batch, the outer metadata).

    Returns:
        The ordering key if present; else the partition key (base64-decoded when
        `partition_key_b64_encoded` is set; UTF-8 otherwise); else `producer_name-sequence_id`.
        `NONE_KEY` is what Pulsar uses when even those are missing, which a parsed metadata never
        is (both are required fields); a partition key flagged base64 that does not decode falls
        back to its UTF-8 bytes.
    """
    if metadata.HasField("ordering_key"):
        return bytes(metadata.ordering_key)
    if metadata.HasField("partition_key"):
        if metadata.partition_key_b64_encoded:
            try:
                return base64.b64decode(metadata.partition_key, validate=True)
            except (binascii.Error, ValueError):
                pass
        return bytes(metadata.partition_key.encode("utf-8"))
    if metadata.HasField("producer_name") and metadata.HasField("sequence_id"):
        return f"{metadata.producer_name}-{metadata.sequence_id}".encode()
    return NONE_KEY
