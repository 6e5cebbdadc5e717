"""Positions: where an entry sits in a managed ledger.

Theory of operation
-------------------
A position is `(ledger_id, entry_id)`. A managed ledger is a list of storage ledgers with rising
ids, and entry ids run 0..n-1 inside each, so the plain tuple order (ledger first, then entry) is
the order in which entries were written. Two sentinels bracket every real position:
`EARLIEST = (-1, -1)` sorts before all of them and `LATEST = (2**63-1, 2**63-1)` after.

`(L, -1)` names "the position just before the first entry of ledger L". Cursors use it as a
mark-delete position meaning "nothing in L acknowledged yet" (Pulsar's convention).

Which position follows which depends on the ledger layout (the last entry of ledger L is followed
by entry 0 of the next ledger), so that arithmetic lives in the managed ledger; this module only
holds the value type, the word-level helpers for batch-index ack sets, which are Java
`long[]` bitsets (bit k in word k // 64, bit k % 64; a set bit means "not acknowledged yet"), and
the errors the managed ledger and its cursors raise (here so that `_managed_ledger` and `_cursor`
need each other only for typing).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from .._errors import PersistenceError, TopicTerminatedError

__all__ = [
    "EARLIEST",
    "EMPTY_MAP",
    "LATEST",
    "InvalidPositionError",
    "ManagedLedgerClosedError",
    "ManagedLedgerError",
    "ManagedLedgerFencedError",
    "ManagedLedgerTerminatedError",
    "Position",
    "ack_set_to_int",
    "ack_set_words_max",
    "int_to_ack_set",
    "keys_between",
    "unacked_in_ack_set",
]

INT64_MAX: Final = (1 << 63) - 1
WORD_BITS: Final = 64
WORD_MASK: Final = (1 << WORD_BITS) - 1
WORD_BYTES: Final = WORD_BITS // 8


class Position(NamedTuple):
    """An entry's place in a managed ledger; compares lexicographically."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


EARLIEST: Final = Position(-1, -1)
# The one empty map of every cursor's bitsets, property maps and redelivery counts while they
# are empty (one per loaded topic otherwise); read-only, so a stray write fails loudly.
EMPTY_MAP: Final[Mapping[Any, Any]] = MappingProxyType({})
LATEST: Final = Position(INT64_MAX, INT64_MAX)

assert EARLIEST < Position(0, 0) < LATEST


def keys_between(table: Collection[Position], first: Position, last: Position,
                 ) -> list[Position]:
    """The positions of `table` in first..last (entries of one ledger), lowest first: looked
    up one by one when the run is shorter than the table, else found by a walk of it."""
    if not table:
        return []
    if last.entry_id - first.entry_id < len(table):
        ledger_id = first.ledger_id
        return [p for e in range(first.entry_id, last.entry_id + 1)
                if (p := Position(ledger_id, e)) in table]
    return sorted(p for p in table if first <= p <= last)


def ack_set_to_int(words: list[int]) -> int:
    """A Java `long[]` bitset (signed or unsigned words) as one Python integer.

    Linear in the number of words (one byte string, one conversion): ack sets come from
    clients, so no step may cost more than their length.

    Args:
        words: 64-bit words, least significant first; bit k is bit k % 64 of word k // 64.

    Returns:
        The bitmask, bit k of which is bit k of the bitset.
    """
    if not words:
        return 0
    packed = struct.pack(f"<{len(words)}Q", *[word & WORD_MASK for word in words])
    mask = int.from_bytes(packed, "little")
    assert mask >= 0
    return mask


def int_to_ack_set(mask: int) -> list[int]:
    """A bitmask as Java `long[]` words, signed as the wire's `int64` ack_set wants them.

    Linear in the size of the mask.

    Args:
        mask: a non-negative bitmask.

    Returns:
        The shortest word list holding every set bit (empty for 0), each word in
        [-2**63, 2**63).
    """
    assert mask >= 0
    count = (mask.bit_length() + WORD_BITS - 1) // WORD_BITS
    if count == 0:
        return []
    return list(struct.unpack(f"<{count}q", mask.to_bytes(count * WORD_BYTES, "little")))


def ack_set_words_max(batch_size: int) -> int:
    """How many `long[]` words an ack set of a batch of `batch_size` messages may have."""
    assert batch_size >= 1
    return (batch_size + WORD_BITS - 1) // WORD_BITS


def unacked_in_ack_set(words: list[int], batch_size: int) -> int:
    """How many of the first `batch_size` indexes an ack set still holds (set bits)."""
    assert batch_size >= 1
    kept = words[:ack_set_words_max(batch_size)]
    return (ack_set_to_int(kept) & ((1 << batch_size) - 1)).bit_count()


class ManagedLedgerError(PersistenceError):
    """A managed-ledger or cursor operation failed (wire code PersistenceError)."""


class ManagedLedgerClosedError(ManagedLedgerError):
    """The managed ledger (or cursor) is closed or deleted; reopen the topic and retry."""

    retriable = True


class ManagedLedgerFencedError(ManagedLedgerError):
    """A ledger rollover failed half-way; the managed ledger takes no more writes until it
    is reopened (what was acknowledged stays readable)."""

    retriable = True


class ManagedLedgerTerminatedError(ManagedLedgerError, TopicTerminatedError):
    """The managed ledger is terminated: it takes no more entries (wire code
    TopicTerminatedError)."""

    code = TopicTerminatedError.code
    retriable = False


class InvalidPositionError(ManagedLedgerError):
    """A position that the operation cannot take: beyond the last confirmed entry, not an
    entry of the ledger, or a mark-delete that would move backwards."""

    retriable = False
