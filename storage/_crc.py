"""CRC32C (Castagnoli) for every checksum the storage writes.

The hardware-accelerated `crc32c` package computes it; `crcmod`'s predefined 'crc-32c'
function computes the same values and is kept as the reference the tests compare against.
The function is resumable: crc32c(b, crc32c(a)) == crc32c(a + b).
"""

from __future__ import annotations

from collections.abc import Callable

import crc32c as _crc32c

__all__ = ["crc32c", "crc32c_native"]


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of `data`, continuing from `value` (0 to start)."""
    return int(_crc32c.crc32c(data, value))


# The C function itself (the same values, an int), for hot loops that call it per record.
crc32c_native: Callable[[bytes | bytearray | memoryview, int], int] = _crc32c.crc32c

assert crc32c_native(b"123456789", 0) == crc32c(b"123456789")
assert crc32c(b"123456789") == 0xE3069283
