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

from typing import Final, NamedTuple

from ._errors import PersistenceError, TopicTerminatedError

__all__ = [
    "EARLIEST",
    "LATEST",
    "InvalidPositionError",
    "ManagedLedgerClosedError",
    "ManagedLedgerError",
    "ManagedLedgerFencedError",
    "ManagedLedgerTerminatedError",
    "Position",
    "ack_set_to_int",
    "int_to_ack_set",
]

INT64_MAX: Final = (1 << 63) - 1
WORD_BITS: Final = 64
WORD_MASK: Final = (1 << WORD_BITS) - 1


class Position(NamedTuple):
    """An entry's place in a managed ledger; compares lexicographically."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


EARLIEST: Final = Position(-1, -1)
LATEST: Final = Position(INT64_MAX, INT64_MAX)

assert EARLIEST < Position(0, 0) < LATEST


def ack_set_to_int(words: list[int]) -> int:
    """A Java `long[]` bitset (signed or unsigned words) as one Python integer.

    Args:
        words: 64-bit words, least significant first; bit k is bit k % 64 of word k // 64.

    Returns:
        The bitmask, bit k of which is bit k of the bitset.
    """
    mask = 0
    for index, word in enumerate(words):
        mask |= (word & WORD_MASK) << (WORD_BITS * index)
    assert mask >= 0
    return mask


def int_to_ack_set(mask: int) -> list[int]:
    """A bitmask as Java `long[]` words, signed as the wire's `int64` ack_set wants them.

    Args:
        mask: a non-negative bitmask.

    Returns:
        The shortest word list holding every set bit (empty for 0), each word in
        [-2**63, 2**63).
    """
    assert mask >= 0
    words: list[int] = []
    while mask:
        word = mask & WORD_MASK
        words.append(word - (1 << WORD_BITS) if word > INT64_MAX else word)
        mask >>= WORD_BITS
    return words


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
