"""The storage error hierarchy.

Every error the storage engine raises on purpose derives from `StorageError`. Each class
carries a `code` naming the Pulsar `ServerError` the broker answers with when the error
reaches a client, and a `retriable` flag. Programmer errors (broken invariants) surface as
`AssertionError` and are never caught.
"""

from __future__ import annotations

import errno

__all__ = [
    "CorruptionError",
    "DataDirLockedError",
    "EntryTooLargeError",
    "JournalCorruptionError",
    "LedgerClosedError",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerNotFoundError",
    "NoSuchEntryError",
    "StorageClosedError",
    "StorageError",
    "StorageFailedError",
    "StorageFullError",
    "journal_io_error",
]

# Values of the wire's ServerError enum that storage errors map to.
SERVER_ERROR_UNKNOWN = 0
SERVER_ERROR_METADATA = 1
SERVER_ERROR_PERSISTENCE = 2
SERVER_ERROR_SERVICE_NOT_READY = 6
SERVER_ERROR_TOPIC_TERMINATED = 15
SERVER_ERROR_NOT_ALLOWED = 22


class StorageError(Exception):
    """Root of the storage errors. `code` is the wire ServerError value."""

    code: int = SERVER_ERROR_PERSISTENCE
    retriable: bool = False


class StorageClosedError(StorageError):
    """The storage was closed; nothing more can be done through this handle."""

    code = SERVER_ERROR_SERVICE_NOT_READY
    retriable = True


class StorageFailedError(StorageError):
    """A write or fsync failed (EIO, ENOSPC, ...). The engine stopped accepting writes; what
    was acknowledged before the failure is durable, and reopening the data directory
    recovers it. Pending adds fail with this error."""

    def __init__(self, message: str, *, path: str | None = None, errno: int | None = None):
        super().__init__(message)
        self.path = path
        self.errno = errno


class StorageFullError(StorageFailedError):
    """The disk is full (ENOSPC). Like every `StorageFailedError`, the engine stops
    accepting writes until it is reopened."""


class DataDirLockedError(StorageError):
    """Another process owns the data directory."""

    code = SERVER_ERROR_SERVICE_NOT_READY

    def __init__(self, data_dir: str, owner_pid: int | None):
        owner = f"process {owner_pid}" if owner_pid is not None else "another process"
        super().__init__(f"data directory {data_dir} is locked by {owner}")
        self.data_dir = data_dir
        self.owner_pid = owner_pid


class CorruptionError(StorageError):
    """Stored bytes failed a check (CRC, magic, length, sequence). Names the file and the
    byte offset where the bad data starts."""

    code = SERVER_ERROR_PERSISTENCE

    def __init__(self, message: str, *, path: str, offset: int):
        super().__init__(f"{message} ({path} at offset {offset})")
        self.path = path
        self.offset = offset


class JournalCorruptionError(CorruptionError):
    """A journal record recovery must replay is damaged, and valid records written after it
    show it is not a torn tail: starting would lose acknowledged data. Recovery refuses and
    leaves the directory as found; `skip_corrupt_journal_segments` accepts the loss.
    `records_after`/`bytes_after` count the valid records found after the bad one."""

    def __init__(self, message: str, *, path: str, offset: int, records_after: int,
                 bytes_after: int):
        super().__init__(message, path=path, offset=offset)
        self.records_after = records_after
        self.bytes_after = bytes_after


class LedgerNotFoundError(StorageError):
    """No ledger with that id exists (never created, or deleted)."""

    code = SERVER_ERROR_METADATA


class LedgerExistsError(StorageError):
    """A ledger with that id already exists."""

    code = SERVER_ERROR_METADATA


class LedgerFencedError(StorageError):
    """The ledger was fenced; adds are refused. Nothing is written by the refused add."""

    code = SERVER_ERROR_TOPIC_TERMINATED


class LedgerClosedError(StorageError):
    """The ledger was closed; adds are refused. Nothing is written by the refused add."""

    code = SERVER_ERROR_TOPIC_TERMINATED


class NoSuchEntryError(StorageError):
    """The entry is beyond the ledger's last-add-confirmed, or the ledger has none."""

    code = SERVER_ERROR_PERSISTENCE


class EntryTooLargeError(StorageError):
    """The entry exceeds `entry_size_bytes_max`. Nothing is written."""

    code = SERVER_ERROR_NOT_ALLOWED


def journal_io_error(exc: OSError | StorageFailedError, path: str) -> StorageFailedError:
    """The storage error an OSError from a journal write or sync stands for (a full disk:
    StorageFullError)."""
    if isinstance(exc, StorageFailedError):
        return exc
    cls = StorageFullError if exc.errno == errno.ENOSPC else StorageFailedError
    return cls(f"journal I/O failed on {path}: {exc.strerror or exc}", path=path,
               errno=exc.errno)
