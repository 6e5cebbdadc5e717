"""The metadata store: a small transactional key-value API in the storage's LMDB
environment, for the broker's own state (topics, cursors, policies, dedup snapshots).

Two ways to write:

* `put`, `delete`, `transaction` commit an LMDB transaction at once (with fsync). Right for
  rare changes such as a topic's ledger list.
* `apply_journaled(ops)` rides the journal's group commit: the operations go into the
  write-cache overlay at once (reads see them), are journaled as one META_BATCH record,
  and the completion finishes when that record is durable; the next checkpoint folds
  them into LMDB. Right for frequent small updates such as cursor positions. While the
  disk is full, deletes-only batches commit to LMDB at once instead (`Storage.full`).

`MetadataStore` sees the engine through `MetadataHost` (the storage lock, the write cache's
overlay, the index, and two narrow calls), not through `Storage` itself.

META_BATCH payload: count u32, then per operation key length u32 ‖ key ‖ kind u8
(1 put, 0 delete) ‖ value length u32 ‖ value.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import lmdb

from ._completion import Completion
from ._errors import StorageError
from ._index import Index, MetaOp
from ._write_cache import WriteCache

__all__ = ["MetadataHost", "MetadataStore", "MetadataTransaction", "decode_meta_ops",
           "encode_meta_ops"]

_U32 = struct.Struct(">I")
META_KEY_BYTES_MAX = 511  # LMDB's default key size limit


def encode_meta_ops(ops: list[MetaOp]) -> bytes:
    out = bytearray(_U32.pack(len(ops)))
    for key, value in ops:
        out += _U32.pack(len(key)) + key
        if value is None:
            out += b"\x00" + _U32.pack(0)
        else:
            out += b"\x01" + _U32.pack(len(value)) + value
    return bytes(out)


def decode_meta_ops(raw: bytes) -> list[MetaOp]:
    (count,) = _U32.unpack_from(raw, 0)
    at = 4
    ops: list[MetaOp] = []
    for _ in range(count):
        (key_len,) = _U32.unpack_from(raw, at)
        key = raw[at + 4:at + 4 + key_len]
        at += 4 + key_len
        kind = raw[at]
        (value_len,) = _U32.unpack_from(raw, at + 1)
        value = raw[at + 5:at + 5 + value_len] if kind == 1 else None
        at += 5 + value_len
        ops.append((key, value))
    assert at == len(raw), "META_BATCH payload has trailing bytes"
    return ops


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or not 0 < len(key) <= META_KEY_BYTES_MAX:
        raise ValueError(f"metadata keys are 1..{META_KEY_BYTES_MAX} bytes, got {key!r:.60}")


class MetadataTransaction:
    """Operations applied together when the `transaction()` block ends without error."""

    def __init__(self, txn: Any, db: Any):
        self._txn = txn
        self._db = db

    def get(self, key: bytes) -> bytes | None:
        raw = self._txn.get(key, db=self._db)
        return None if raw is None else bytes(raw)

    def put(self, key: bytes, value: bytes) -> None:
        _check_key(key)
        self._txn.put(key, value, db=self._db)

    def delete(self, key: bytes) -> None:
        self._txn.delete(key, db=self._db)


class MetadataHost(Protocol):
    """What the metadata store needs of the engine (`Storage` is one)."""

    @property
    def lock(self) -> threading.Condition: ...

    @property
    def cache(self) -> WriteCache: ...

    @property
    def index(self) -> Index: ...

    @property
    def full(self) -> bool: ...

    def delete_meta_while_full(self, keys: list[bytes]) -> bool: ...

    def journal_meta(self, ops: list[MetaOp]) -> Completion[int]: ...


class MetadataStore:
    """Key-value metadata in the data directory's LMDB environment."""

    def __init__(self, store: MetadataHost):
        self._store = store

    def get(self, key: bytes) -> bytes | None:
        with self._store.lock:
            known, value = self._store.cache.get_meta(key)
        if known:
            return value
        with self._store.index.env.begin(db=self._store.index.kv) as txn:
            raw = txn.get(key)
            return None if raw is None else bytes(raw)

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every (key, value) whose key starts with `prefix`, in key order."""
        with self._store.lock:
            overlay = self._store.cache.meta_with_prefix(prefix)
        found: dict[bytes, bytes | None] = {}
        with self._store.index.env.begin(db=self._store.index.kv) as txn:
            cursor = txn.cursor()
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    found[bytes(key)] = bytes(value)
        found.update(overlay)
        return [(k, v) for k, v in sorted(found.items()) if v is not None]

    def put(self, key: bytes, value: bytes) -> None:
        with self.transaction() as txn:
            txn.put(key, value)

    def delete(self, key: bytes) -> None:
        with self.transaction() as txn:
            txn.delete(key)

    @contextmanager
    def transaction(self) -> Iterator[MetadataTransaction]:
        """A write transaction, committed durably when the block exits normally and
        aborted (nothing applied) when it raises. Keys with journaled operations still
        waiting for a checkpoint must not be written here.

        Raises:
            StorageError: LMDB refused the write or its commit (a full disk, a full map);
                nothing of the transaction was applied, and the engine goes on.
        """
        index = self._store.index
        try:
            with index.env.begin(write=True, db=index.kv) as txn:
                yield MetadataTransaction(txn, index.kv)
        except lmdb.Error as exc:
            raise StorageError(f"metadata write failed: {exc}") from exc

    def apply_journaled(self, ops: list[MetaOp]) -> Completion[int]:
        """Apply puts and deletes through the journal; visible to reads at once, durable
        when the completion finishes (see the module comment)."""
        for key, _ in ops:
            _check_key(key)
        store = self._store
        if store.full and all(value is None for _, value in ops) and \
                store.delete_meta_while_full([key for key, _ in ops]):
            return Completion.resolved(0)
        return store.journal_meta(ops)
