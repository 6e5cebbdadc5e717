"""The metadata store of `InMemoryLedgerStorage` (`memory.py`): a dict, with transactions and
journaled batches that become durable with the store's other writes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from .._completion import Completion
from .._index import MetaOp
from .._metadata import _check_key


class _Owner(Protocol):
    """What the metadata uses of its `InMemoryLedgerStorage`."""

    _lock: threading.RLock

    @property
    def full(self) -> bool: ...

    def _check_writable(self) -> None: ...

    def _queue(self, value: int, on_durable: Callable[[], None],
               undo: Callable[[], None]) -> Completion[int]: ...

    def _drain(self) -> None: ...

__all__ = ["InMemoryMetadata", "InMemoryMetadataTransaction"]


class InMemoryMetadataTransaction:
    """Buffered operations, applied by `InMemoryMetadata.transaction` on success."""

    def __init__(self, store: InMemoryMetadata):
        self._store = store
        self.ops: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self.ops:
            return self.ops[key]
        return self._store.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        _check_key(key)
        self.ops[key] = bytes(value)

    def delete(self, key: bytes) -> None:
        self.ops[key] = None


class InMemoryMetadata:
    """The metadata of an `InMemoryLedgerStorage` (see `storage._metadata`)."""

    def __init__(self, owner: _Owner):
        self._owner = owner
        self._values: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        with self._owner._lock:
            return self._values.get(key)

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        with self._owner._lock:
            return sorted((k, v) for k, v in self._values.items() if k.startswith(prefix))

    def put(self, key: bytes, value: bytes) -> None:
        with self.transaction() as txn:
            txn.put(key, value)

    def delete(self, key: bytes) -> None:
        with self.transaction() as txn:
            txn.delete(key)

    @contextmanager
    def transaction(self) -> Iterator[InMemoryMetadataTransaction]:
        txn = InMemoryMetadataTransaction(self)
        yield txn
        with self._owner._lock:
            self._apply(list(txn.ops.items()))

    def apply_journaled(self, ops: list[MetaOp]) -> Completion[int]:
        """Visible at once, durable when the completion finishes.

        Raises:
            ValueError: a bad key; nothing applied.
            StorageFailedError, StorageClosedError: the store accepts no writes.
        """
        for key, _ in ops:
            _check_key(key)
        owner = self._owner
        with owner._lock:
            if owner.full and all(value is None for _, value in ops):
                self._apply(ops)  # straight to the "index", as `Storage` does when full
                return Completion.resolved(0)
            owner._check_writable()
            before = [(key, self._values.get(key)) for key, _ in ops]
            self._apply(ops)
            completion = owner._queue(0, _nothing,
                                      lambda: self._apply(list(reversed(before))))
        owner._drain()
        return completion

    def _apply(self, ops: list[MetaOp]) -> None:
        for key, value in ops:
            if value is None:
                self._values.pop(key, None)
            else:
                self._values[key] = bytes(value)


def _nothing() -> None:
    return None
