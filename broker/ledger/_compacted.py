"""`CompactedLedger`: a topic's compacted view, as the `__compaction` cursor records it.

Theory of operation
-------------------
Topic compaction (`topics/_compaction.py`, Pulsar's TwoPhaseCompactor) writes the latest
message of every key up to a *horizon* (a position of the topic) into a storage ledger of its
own, the compacted ledger, apart from the managed ledger's list, so trimming the topic never
touches it. Each of its entries is the original entry's position (two signed 64-bit integers,
big-endian) followed by the entry's bytes as stored in the topic (a batch rewritten so that
the messages it no longer holds are flagged `compacted_out`), in the topic's order.

Where it is recorded. The durable cursor `__compaction` (`COMPACTION_CURSOR_NAME`) holds it:
its mark-delete position is the horizon and its `properties` hold the compacted ledger's id
under `CompactedTopicLedger` (`COMPACTED_LEDGER_PROPERTY`, Pulsar's name). Both change in ONE
cursor write (`ManagedCursor.mark_delete(horizon, properties=...)`), so a crash leaves either
the previous view or the new one, never half of one. The cursor is durable: it holds back the
trimming of everything after the horizon, which is not compacted yet.

Storage ledgers of a compacted view carry the metadata `{"compacted": <ml name>}`
(`COMPACTED_LEDGER_TAG`), so that a ledger written by a compaction that never switched the
pointer (a crash, a failure) is found and deleted when the topic loads (`orphan_ledgers`).

Reads (`read_from`) find the first compacted entry at or after a position by binary search
(about log2(n) storage reads, remembered for the next read that continues where one ended)
and read forward from there. They touch only the storage and this object's immutable
fields, so they may run in a worker thread; a view replaced by a later compaction has its
ledger deleted, and a read still running on it then fails with `LedgerNotFoundError`.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field

from magnetar.storage import LedgerStorage

from ._position import Position

__all__ = [
    "COMPACTED_LEDGER_PROPERTY",
    "COMPACTED_LEDGER_TAG",
    "COMPACTION_CURSOR_NAME",
    "CompactedLedger",
    "decode_compacted_entry",
    "encode_compacted_entry",
    "orphan_ledgers",
]

COMPACTION_CURSOR_NAME = "__compaction"
COMPACTED_LEDGER_PROPERTY = "CompactedTopicLedger"
COMPACTED_LEDGER_TAG = "compacted"
COMPACTED_READ_CHUNK_ENTRIES_MAX = 64  # entries per storage read

_HEADER = struct.Struct(">qq")


def encode_compacted_entry(position: Position, entry: bytes) -> bytes:
    """A compacted ledger's entry: the original position, then the entry's bytes."""
    return _HEADER.pack(position.ledger_id, position.entry_id) + entry


def decode_compacted_entry(raw: bytes) -> tuple[Position, bytes]:
    """(original position, entry bytes) of a compacted ledger's entry.

    Raises:
        ValueError: shorter than its header (the ledger is not a compacted one).
    """
    if len(raw) < _HEADER.size:
        raise ValueError(f"compacted entry of {len(raw)} bytes is shorter than its header")
    ledger_id, entry_id = _HEADER.unpack_from(raw)
    return Position(ledger_id, entry_id), raw[_HEADER.size:]


def orphan_ledgers(storage: LedgerStorage, ml_name: str, in_force: int | None) -> list[int]:
    """The compacted ledgers of `ml_name` other than the one in force."""
    return [info.ledger_id for info in storage.list_ledgers(tagged=(COMPACTED_LEDGER_TAG, ml_name))
            if info.ledger_id != in_force]


@dataclass
class CompactedLedger:
    """One compacted view: `entries` entries in `ledger_id`, covering the topic up to and
    including `horizon`. Immutable but for its search hint."""

    storage: LedgerStorage
    ledger_id: int
    entries: int
    horizon: Position
    _hint: tuple[Position, int] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _position_at(self, index: int) -> Position:
        return decode_compacted_entry(self.storage.read_entry(self.ledger_id, index))[0]

    def index_at_or_after(self, position: Position) -> int:
        """Index of the first entry whose original position is >= `position` (`entries`
        when there is none). Raises what the storage read raises."""
        with self._lock:
            hint = self._hint
        if hint is not None and hint[0] == position:
            return hint[1]
        low, high = 0, self.entries  # the answer is in [low, high]
        while low < high:
            middle = (low + high) // 2
            if self._position_at(middle) < position:
                low = middle + 1
            else:
                high = middle
        return low

    def read_from(self, position: Position, max_entries: int,
                  max_bytes: int) -> list[tuple[Position, bytes]]:
        """Entries whose original position is >= `position`, in order: at most
        `max_entries`, stopping before the one that would go over `max_bytes` (but at
        least one when any is left). Empty once the view has no more.

        Raises:
            LedgerNotFoundError: the view was replaced and its ledger deleted meanwhile.
            CorruptionError, NoSuchEntryError, ValueError: the ledger cannot be read.
        """
        index = self.index_at_or_after(position)
        found: list[tuple[Position, bytes]] = []
        total = 0
        while index < self.entries and len(found) < max_entries:
            last = min(self.entries, index + max_entries - len(found),
                       index + COMPACTED_READ_CHUNK_ENTRIES_MAX) - 1
            for raw in self.storage.read_entries(self.ledger_id, index, last):
                original, entry = decode_compacted_entry(raw)
                if found and total + len(entry) > max_bytes:
                    return self._remember(found, index)
                found.append((original, entry))
                total += len(entry)
                index += 1
        return self._remember(found, index)

    def _remember(self, found: list[tuple[Position, bytes]],
                  next_index: int) -> list[tuple[Position, bytes]]:
        if found:
            last = found[-1][0]
            with self._lock:
                self._hint = (Position(last.ledger_id, last.entry_id + 1), next_index)
        return found
