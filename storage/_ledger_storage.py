"""`LedgerStorage`: what the broker needs of a ledger store, as a Protocol.

Theory of operation
-------------------
The broker (the managed ledger, its cursors, the service, the namespace and schema
registries) depends on this interface, not on `Storage`, so that its tests can run against
the real engine and against `storage.testing.memory.InMemoryLedgerStorage` (scripted
failures, no disk) alike. Both promise the same behaviour, checked by one shared suite
(`tests/storage/test_ledger_storage_conformance.py`):

* Ledger ids are handed out by `create_ledger`; entry ids are dense from 0 in each ledger.
* Writes return a `Completion` that finishes once the write is durable; an add's completion
  gives its entry id, and the ledger's last-add-confirmed (LAC) advances at that moment.
  Adds of one ledger complete in order.
* Refusals are raised at once and leave nothing written: `EntryTooLargeError`,
  `LedgerNotFoundError`, `LedgerFencedError`, `LedgerClosedError`, and `failed` (a
  `StorageFailedError`) or `StorageClosedError` once the store accepts no writes. A write
  that fails after it was accepted fails its completion instead.
* Reads return entries at or below the LAC only (`NoSuchEntryError` beyond), or raise
  `CorruptionError` for bytes that fail their checks.
* `add_entry` may block while the write cache is full (back-pressure for threads);
  `try_add_entry` refuses instead (None) and `cache_space` finishes when to try again.
  `add_entries`/`try_add_entries` do the same for a run of entries of one ledger as one
  write (one lock hold, one journal request, one completion), and `try_add_runs` for runs
  of several ledgers (one lock hold, one completion).
  `try_read_entries` serves a range from memory or says None (it would need the disk).
  An event loop uses only these, and `read_entries` from a worker thread.
* `full` is true while a full disk stopped the writes; `try_resume_writes` turns writes back
  on when there is room (adds that failed are gone, every acknowledged one is kept).

The metadata store is a small key-value store with durable transactions and journaled
batches (see `storage._metadata`); `LedgerMetadata` is the part of it the broker uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from ._completion import Completion
from ._config import StorageConfig
from ._errors import StorageError
from ._index import MetaOp
from ._ledger import LedgerInfo

__all__ = ["LedgerMetadata", "LedgerMetadataTransaction", "LedgerStorage"]


class LedgerMetadataTransaction(Protocol):
    """Operations applied together when the transaction block ends without error."""

    def get(self, key: bytes) -> bytes | None:
        """The value as this transaction sees it (its own writes included)."""

    def put(self, key: bytes, value: bytes) -> None:
        """Raises ValueError: the key is not 1..`META_KEY_BYTES_MAX` bytes."""

    def delete(self, key: bytes) -> None: ...


class LedgerMetadata(Protocol):
    """Key-value metadata beside the ledgers."""

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with `prefix`, in key order."""

    def put(self, key: bytes, value: bytes) -> None:
        """A durable put, committed before it returns."""

    def delete(self, key: bytes) -> None:
        """A durable delete, committed before it returns."""

    def transaction(self) -> AbstractContextManager[LedgerMetadataTransaction]:
        """A write transaction, committed durably when the block exits normally and
        aborted (nothing applied) when it raises."""

    def apply_journaled(self, ops: list[MetaOp]) -> Completion[int]:
        """Puts (value) and deletes (None), visible to reads at once, durable when the
        completion finishes.

        Raises:
            ValueError: a key is not 1..`META_KEY_BYTES_MAX` bytes; nothing applied.
            StorageFailedError, StorageClosedError: the store accepts no writes.
        """


class LedgerStorage(Protocol):
    """A ledger store: what `ManagedLedger` and the broker use (see the module comment)."""

    @property
    def metadata(self) -> LedgerMetadata: ...

    @property
    def config(self) -> StorageConfig:
        """The settings; the broker checks its largest entry against `entry_size_bytes_max`."""

    @property
    def failed(self) -> StorageError | None:
        """The error that stopped the writes, or None while they are accepted."""

    @property
    def closed(self) -> bool: ...

    @property
    def full(self) -> bool:
        """Whether writes are refused because the disk was full."""

    def try_resume_writes(self) -> bool:
        """After a full disk: accept writes again if there is room now. Returns whether
        writes resumed. May block: call it from a worker thread, not an event loop."""

    def create_ledger(self, metadata: dict[str, str] | None = None) -> Completion[int]:
        """A new ledger; the completion gives its id once the creation is durable."""

    def start_ledger(self, metadata: dict[str, str] | None = None
                     ) -> tuple[int, Completion[int]]:
        """`create_ledger` with the id at once: what is submitted after it (adds to the
        ledger, a metadata record naming it) is never durable without the creation, and
        fails if the creation fails."""

    def add_entry(self, ledger_id: int, data: bytes) -> Completion[int]:
        """Append an entry; the completion gives its entry id once durable. May block the
        calling thread while the write cache is full: not from an event loop."""

    def try_add_entry(self, ledger_id: int, data: bytes) -> Completion[int] | None:
        """`add_entry` that never blocks: None (nothing written) while the write cache is
        full; `cache_space` tells when to try again. Raises as `add_entry`."""

    def add_entries(self, ledger_id: int, entries: Sequence[bytes]) -> Completion[int]:
        """Append a run of entries (consecutive ids) as one write: the completion gives the
        last entry id once all are durable, or fails for all. All or nothing: a refusal
        writes none of them. The caller bounds the run. May block like `add_entry`."""

    def try_add_entries(self, ledger_id: int,
                        entries: Sequence[bytes]) -> Completion[int] | None:
        """`add_entries` that never blocks: None (none written) as `try_add_entry`."""

    def try_add_runs(self, runs: Sequence[tuple[int, Sequence[bytes]]],
                     ) -> tuple[list[int], Completion[int]] | None:
        """`try_add_entries` for runs of several ledgers (ledger id, entries; a ledger may
        come more than once), in order, as one write: each run's last entry id, and one
        completion that finishes once every run is durable (giving the last run's last id)
        or fails for all (any of them may then be durable). None (none written) as
        `try_add_entry`; a refusal of any run raises before any is written."""

    def cache_space(self) -> Completion[None]:
        """Finishes (never fails) once `try_add_entry` may accept again, or the store stopped
        accepting writes (the next try raises). Never blocks."""

    def fence(self, ledger_id: int) -> Completion[int]:
        """Refuse later adds; gives the last entry accepted before the fence."""

    def close_ledger(self, ledger_id: int) -> Completion[int]:
        """Close at the last accepted entry; gives that entry id once it is durable."""

    def close_ledgers(self, ledger_ids: Sequence[int]) -> list[Completion[int]]:
        """`close_ledger` of each, as one write (one lock hold, one journal submission): a
        completion each, in order; a ledger that does not exist gets a failed one
        (`LedgerNotFoundError`). Raises as `close_ledger` when the store accepts no writes
        (nothing closed)."""

    def delete_ledgers(self, ledger_ids: Sequence[int]) -> list[Completion[int]]:
        """`delete_ledger` of each, as `close_ledgers` closes them."""

    def delete_ledger(self, ledger_id: int) -> Completion[int]:
        """Delete a ledger; its entries become unreadable at once."""

    def last_add_confirmed(self, ledger_id: int) -> int: ...

    def ledger_info(self, ledger_id: int) -> LedgerInfo: ...

    def list_ledgers(self, tagged: tuple[str, str] | None = None) -> list[LedgerInfo]:
        """Every ledger that is not deleted, by id; with `tagged` = (key, value), only those
        whose metadata maps key to value (without reading every ledger's)."""

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes: ...

    def read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes]:
        """Entries `first`..`last` (inclusive), all at or below the LAC. May read the disk:
        not from an event loop."""

    def try_read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes] | None:
        """`read_entries` from memory only: None when some entry would need the disk.
        Never blocks on the disk. Raises as `read_entries`."""
