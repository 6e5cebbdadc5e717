"""CRC32C: our function against crcmod's reference implementation."""

from __future__ import annotations

import importlib
import sys

import crcmod.predefined
from hypothesis import given
from hypothesis import strategies as st

from magnetar.storage._crc import crc32c

reference = crcmod.predefined.mkCrcFun("crc-32c")


def test_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert reference(b"123456789") == 0xE3069283


def test_empty_input_keeps_the_running_value() -> None:
    assert crc32c(b"") == 0
    assert crc32c(b"", 0x12345678) == 0x12345678


@given(st.binary(max_size=4096))
def test_equals_crcmod(data: bytes) -> None:
    assert crc32c(data) == reference(data)


@given(st.binary(max_size=2048), st.binary(max_size=2048))
def test_resumable(first: bytes, second: bytes) -> None:
    whole = crc32c(first + second)
    assert crc32c(second, crc32c(first)) == whole
    assert reference(second, reference(first)) == whole


@given(st.binary(min_size=1, max_size=512))
def test_accepts_bytearray_and_memoryview(data: bytes) -> None:
    expected = reference(data)
    assert crc32c(bytearray(data)) == expected
    assert crc32c(memoryview(data)) == expected
    assert crc32c(memoryview(b"xx" + data)[2:]) == expected


def test_crcmod_c_extension_loads() -> None:
    # Without the C extension crcmod falls back to pure Python, far too slow to be the
    # reference the storage design relies on.
    module = importlib.import_module("crcmod._crcfunext")
    assert hasattr(module, "_crc32r")  # CRC-32C is a reflected CRC
    assert sys.modules["crcmod.crcmod"]._usingExtension is True
