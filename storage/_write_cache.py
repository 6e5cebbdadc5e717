"""The double-buffered write cache.

Adds land in the active half (before their journal record is even queued: a checkpoint
that captures the journal mark and then swaps halves is thereby sure to hold every entry
the mark covers). A checkpoint swaps the halves, writes the flushing half to an entry log,
commits the index, and only then clears it; readers look in the active half, then the
flushing half, then the index, so an entry is always in one of them. Tailing reads are
served from here.

Metadata-store operations that ride the journal (`MetadataStore.put_journaled`) are
buffered the same way, as the overlay that reads consult first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._index import MetaOp

__all__ = ["CacheHalf", "WriteCache"]


@dataclass
class CacheHalf:
    # ledger id -> entry id -> data. Nested dicts of ints and bytes hold no object the
    # cyclic GC tracks, so a full cache costs its collections nothing (a dict keyed by
    # (ledger, entry) tuples is traversed whole by every full collection).
    entries: dict[int, dict[int, bytes]] = field(default_factory=dict)
    meta: dict[bytes, bytes | None] = field(default_factory=dict)
    entry_bytes: int = 0

    def meta_ops(self) -> list[MetaOp]:
        return sorted(self.meta.items())


class WriteCache:
    """Two halves; the caller holds the storage lock around every method."""

    def __init__(self, half_bytes_max: int):
        assert half_bytes_max > 0
        self.half_bytes_max = half_bytes_max
        self.active = CacheHalf()
        self.flushing: CacheHalf | None = None

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        ledger = self.active.entries.get(ledger_id)
        if ledger is None:
            ledger = self.active.entries[ledger_id] = {}
        previous = ledger.get(entry_id)
        if previous is not None:  # journal replay rewrites an entry: last write wins
            self.active.entry_bytes -= len(previous)
        ledger[entry_id] = data
        self.active.entry_bytes += len(data)

    def put_new(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        """`put` of a new add, whose id no entry of the cache holds (`put_run` of one)."""
        active = self.active
        ledger = active.entries.get(ledger_id)
        if ledger is None:
            ledger = active.entries[ledger_id] = {}
        ledger[entry_id] = data
        active.entry_bytes += len(data)

    def put_run(self, ledger_id: int, first: int, entries: list[bytes]) -> None:
        """`put` for entries `first`, `first + 1`, ... of a ledger: new adds, whose ids no
        entry of the cache holds (replay, which may rewrite one, uses `put`)."""
        ledger = self.active.entries.get(ledger_id)
        if ledger is None:
            ledger = self.active.entries[ledger_id] = {}
        size = 0
        for entry_id, data in enumerate(entries, first):
            ledger[entry_id] = data
            size += len(data)
        self.active.entry_bytes += size

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        ledger = self.active.entries.get(ledger_id)
        found = None if ledger is None else ledger.get(entry_id)
        if found is None and self.flushing is not None:
            ledger = self.flushing.entries.get(ledger_id)
            found = None if ledger is None else ledger.get(entry_id)
        return found

    def get_range(self, ledger_id: int, first: int, last: int) -> list[bytes | None]:
        """`get` for each entry of `first`..`last`, looking up the ledger once per half."""
        assert first <= last
        active = self.active.entries.get(ledger_id)
        flushing = None if self.flushing is None else self.flushing.entries.get(ledger_id)
        if active is None and flushing is None:  # a catch-up read: all in the entry logs
            return [None] * (last - first + 1)
        found = [None if active is None else active.get(e) for e in range(first, last + 1)]
        if flushing is not None:
            found = [data if data is not None else flushing.get(first + i)
                     for i, data in enumerate(found)]
        return found

    def put_meta(self, key: bytes, value: bytes | None) -> None:
        self.active.meta[key] = value

    def get_meta(self, key: bytes) -> tuple[bool, bytes | None]:
        """(found, value): found is False when the overlay does not know the key."""
        if key in self.active.meta:
            return True, self.active.meta[key]
        if self.flushing is not None and key in self.flushing.meta:
            return True, self.flushing.meta[key]
        return False, None

    def meta_with_prefix(self, prefix: bytes) -> dict[bytes, bytes | None]:
        merged: dict[bytes, bytes | None] = {}
        halves = [self.flushing, self.active] if self.flushing is not None else [self.active]
        for half in halves:
            assert half is not None
            merged.update((k, v) for k, v in half.meta.items() if k.startswith(prefix))
        return merged

    def active_full(self) -> bool:
        return self.active.entry_bytes >= self.half_bytes_max

    def swap(self) -> CacheHalf:
        """Make the active half the flushing one. Only one flush at a time."""
        assert self.flushing is None, "a checkpoint is already flushing"
        self.flushing, self.active = self.active, CacheHalf()
        return self.flushing

    def clear_flushing(self) -> None:
        assert self.flushing is not None
        self.flushing = None

    def total_bytes(self) -> int:
        flushing = self.flushing.entry_bytes if self.flushing is not None else 0
        return self.active.entry_bytes + flushing
