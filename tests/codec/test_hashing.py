"""Hashes: Pulsar's vectors (broker reference 1.3 and the client HashTest), the seed's example,
the Key_Shared slot functions, the sticky key, and BoostHash checked against the wheel itself."""

from __future__ import annotations

import base64
import ctypes
import glob
import os
import random

import pulsar
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.codec import (
    KEY_HASH_RANGE_SIZE,
    NONE_KEY,
    boost_hash,
    consistent_hashing_slot,
    hash_range_slot,
    java_string_hash,
    java_string_hash_utf8,
    key_hash_slot,
    murmur3_32,
    murmur3_32_raw,
    pb,
    sticky_key,
)

# key, raw murmur3_32, masked (Pulsar), JavaStringHash -- broker reference table 1.3
VECTORS = [
    ("", 0, 0, 0),
    ("hello", 613153351, 613153351, 99162322),
    ("k1", 4257636394, 2110152746, 3366),
    ("k2", 3627450312, 1479966664, 3367),
    ("key1", 2610364709, 462881061, 3288498),
    ("key2", 1936800180, 1936800180, 3288499),
    ("key01", 2187180580, 39696932, 101943456),
    ("key02", 751761803, 751761803, 101943457),
]


@pytest.mark.parametrize(("key", "raw", "masked", "java"), VECTORS)
def test_upstream_vectors(key: str, raw: int, masked: int, java: int) -> None:
    assert murmur3_32_raw(key) == raw
    assert murmur3_32(key) == masked
    assert murmur3_32(key.encode()) == masked
    assert java_string_hash(key) == java


def test_java_string_hash_long_vectors_mask_rather_than_abs() -> None:
    assert java_string_hash("keykeykeykeykey1") == 434058482
    # hashCode is -2104505005 here; masking the sign bit (not abs) gives the vector.
    assert java_string_hash("keykeykey2") == 42978643 == -2104505005 & 0x7FFFFFFF


def test_java_string_hash_walks_utf16_units_and_the_cpp_variant_utf8_bytes() -> None:
    assert java_string_hash("é") == 0xE9
    assert java_string_hash("😀") == (31 * 0xD83D + 0xDE00) & 0x7FFFFFFF
    assert (
        java_string_hash_utf8("é") == ((31 * (0xC3 - 256) + (0xA9 - 256)) & 0xFFFFFFFF) & 0x7FFFFFFF
    )
    for ascii_key in ("", "abc", "keykeykeykeykey1"):
        assert java_string_hash_utf8(ascii_key) == java_string_hash(ascii_key)


def test_the_seed_example() -> None:
    assert murmur3_32_raw("Order-3459134") == 3112179635
    assert murmur3_32_raw("Order-3459134") % KEY_HASH_RANGE_SIZE == 6067
    assert hash_range_slot("Order-3459134") == 6067


SLOTS = [
    ("key1", 7357, 293),
    ("key2", 44326, 14772),
    ("k1", 56817, 24618),
    ("k2", 55295, 32712),
    ("hello", 7892, 64071),
    ("a", 42456, 27058),
    ("", 1, 1),
    ("NONE_KEY", 56505, 48803),
]


@pytest.mark.parametrize(("key", "consistent", "hash_range"), SLOTS)
def test_key_shared_slots(key: str, consistent: int, hash_range: int) -> None:
    assert consistent_hashing_slot(key) == consistent
    assert hash_range_slot(key) == hash_range
    assert key_hash_slot(key, 1, 65535) == consistent
    assert key_hash_slot(key, 0, 65535) == hash_range


@settings(max_examples=200, deadline=None)
@given(key=st.binary(max_size=40))
def test_slots_stay_in_range_and_never_zero(key: bytes) -> None:
    assert 1 <= consistent_hashing_slot(key) <= 65535
    assert 1 <= hash_range_slot(key) <= 65535
    assert 1 <= key_hash_slot(key, 0, 63) <= 63
    assert murmur3_32(key) == _murmur3_reference(key) & 0x7FFFFFFF


def test_slot_range_must_be_sane() -> None:
    with pytest.raises(ValueError, match="range"):
        key_hash_slot("k", 10, 5)


def _murmur3_reference(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 written out from its definition, to cross-check the mmh3 package."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed
    rounded = len(data) & ~3
    for i in range(0, rounded, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    k = 0
    tail = data[rounded:]
    for i, byte in enumerate(tail):
        k |= byte << (8 * i)
    if tail:
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        h ^= (k * c2) & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


def _metadata(**fields: object) -> pb.MessageMetadata:
    return pb.MessageMetadata(
        producer_name="standalone-0-3", sequence_id=17, publish_time=1, **fields
    )  # type: ignore[arg-type]


def test_sticky_key_precedence() -> None:
    binary = b"\x00\xffkey"
    assert sticky_key(_metadata(ordering_key=b"ord", partition_key="pk")) == b"ord"
    assert sticky_key(_metadata(partition_key="pk")) == b"pk"
    encoded = base64.b64encode(binary).decode()
    flagged = _metadata(partition_key=encoded, partition_key_b64_encoded=True)
    assert sticky_key(flagged) == binary
    not_base64 = _metadata(partition_key="not base64!", partition_key_b64_encoded=True)
    assert sticky_key(not_base64) == b"not base64!"
    assert sticky_key(_metadata()) == b"standalone-0-3-17"
    assert sticky_key(pb.MessageMetadata()) == NONE_KEY


# -- BoostHash against the official wheel ----------------------------------------------------------

_BOOST_SYMBOL = (
    "_ZN6pulsar9BoostHash8makeHashERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
)


class _StdString(ctypes.Structure):
    # libstdc++'s std::string: data pointer, size, then capacity / small-string buffer.
    _fields_ = [
        ("data", ctypes.c_char_p),
        ("size", ctypes.c_size_t),
        ("capacity", ctypes.c_size_t),
        ("unused", ctypes.c_size_t),
    ]


def _wheel_boost_hash() -> object:
    directory = os.path.join(os.path.dirname(pulsar.__file__), "..", "pulsar_client.libs")
    [path] = glob.glob(os.path.join(directory, "libpulsar-*.so"))
    function = ctypes.CDLL(path)[_BOOST_SYMBOL]
    function.restype = ctypes.c_int32
    return function


@pytest.mark.interop
def test_boost_hash_matches_the_wheels_own_function() -> None:
    """Calls pulsar::BoostHash::makeHash inside the official wheel (it reads only the string's
    data pointer and size) and compares with ours on random keys of every length up to 64."""
    function = _wheel_boost_hash()
    this = ctypes.create_string_buffer(64)  # the method does not use its object
    rng = random.Random(20261122)
    keys = [bytes(rng.getrandbits(8) for _ in range(n)) for n in range(65) for _ in range(20)]
    keys += [b"order-1", "é".encode(), b""]
    for key in keys:
        buffer = ctypes.create_string_buffer(key, len(key) or 1)
        text = _StdString(ctypes.cast(buffer, ctypes.c_char_p), len(key), len(key), 0)
        assert function(this, ctypes.byref(text)) == boost_hash(key), key  # type: ignore[operator]


def test_boost_hash_known_values() -> None:
    # Values of the wheel's function (see the interop test above), pinned for machines without it.
    assert boost_hash("") == 2133126054
    assert boost_hash("a") == 2135870748
    assert boost_hash("key1") == 2071103098
    assert boost_hash("hello world!!") == 1663343466
    assert boost_hash("key1") == boost_hash(b"key1")
