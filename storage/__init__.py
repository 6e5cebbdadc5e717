"""Magnetar storage: a BookKeeper-style ledger store (journal with group commit, write cache,
entry logs, LMDB index, LastLogMark checkpoints, recovery, GC).

The public surface is re-exported here; modules with a leading underscore are internal.
The harnesses (`storage.testing`: crash test, benchmark, fault-injecting file system) are
not imported here; `magnetar crashtest` and `magnetar bench storage` load them.
"""

from ._check import CheckReport, InspectReport, check_data_dir, inspect_data_dir
from ._completion import Completion
from ._config import StorageConfig
from ._errors import (
    CorruptionError,
    DataDirLockedError,
    EntryTooLargeError,
    JournalCorruptionError,
    LedgerClosedError,
    LedgerExistsError,
    LedgerFencedError,
    LedgerNotFoundError,
    NoSuchEntryError,
    StorageClosedError,
    StorageError,
    StorageFailedError,
    StorageFullError,
)
from ._fs import FileHandle, FileSystem, OsFileSystem
from ._journal import JournalMark
from ._ledger import LedgerInfo
from ._ledger_storage import LedgerMetadata, LedgerMetadataTransaction, LedgerStorage
from ._metadata import META_KEY_BYTES_MAX, MetadataStore, MetadataTransaction
from ._stats import (
    FSYNC_LATENCY_BUCKETS_US,
    GROUP_COMMIT_BUCKETS_RECORDS,
    Buckets,
    BucketsSnapshot,
    StorageMetrics,
)
from ._storage import Storage
from ._trace import trace as latency_trace

__all__ = [
    "FSYNC_LATENCY_BUCKETS_US",
    "GROUP_COMMIT_BUCKETS_RECORDS",
    "META_KEY_BYTES_MAX",
    "Buckets",
    "BucketsSnapshot",
    "CheckReport",
    "Completion",
    "CorruptionError",
    "DataDirLockedError",
    "EntryTooLargeError",
    "FileHandle",
    "FileSystem",
    "InspectReport",
    "JournalCorruptionError",
    "JournalMark",
    "LedgerClosedError",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerInfo",
    "LedgerMetadata",
    "LedgerMetadataTransaction",
    "LedgerNotFoundError",
    "LedgerStorage",
    "MetadataStore",
    "MetadataTransaction",
    "NoSuchEntryError",
    "OsFileSystem",
    "Storage",
    "StorageClosedError",
    "StorageConfig",
    "StorageError",
    "StorageFailedError",
    "StorageFullError",
    "StorageMetrics",
    "check_data_dir",
    "inspect_data_dir",
    "latency_trace",
]
