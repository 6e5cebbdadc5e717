"""Helpers shared by the storage tests: small configurations, a counting file-system
wrapper, and polling with a deadline."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from magnetar.storage import FileHandle, FileSystem, OsFileSystem, StorageConfig
from magnetar.storage._fs import LockHandle
from magnetar.storage.testing.simfs import SimFileSystem

KiB = 1024
MiB = 1024 * KiB

# Small enough that a test directory costs little; large enough for every test here.
_SMALL = StorageConfig(
    journal_prealloc_bytes=64 * KiB,
    journal_segment_bytes_max=4 * MiB,
    entry_size_bytes_max=256 * KiB,
    journal_record_bytes_max=512 * KiB,
    write_cache_bytes_max=8 * MiB,
    entry_log_bytes_max=4 * MiB,
    lmdb_map_bytes=256 * MiB,
)

WAIT_SECONDS_MAX = 20.0


def small_config(**overrides: Any) -> StorageConfig:
    """A `StorageConfig` with small files, with `overrides` applied."""
    return replace(_SMALL, **overrides)


def wait_until(predicate: Callable[[], bool], what: str,
               timeout: float = WAIT_SECONDS_MAX) -> None:
    """Poll `predicate` until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def journal_files(data_dir: str | os.PathLike[str]) -> list[str]:
    directory = os.path.join(data_dir, "journal")
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.endswith(".jnl"))


def entry_log_files(data_dir: str | os.PathLike[str]) -> list[str]:
    directory = os.path.join(data_dir, "entrylogs")
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.endswith(".log"))


class CountingFile:
    """A file of a `CountingFileSystem`: forwards everything, counts preads and syncs."""

    def __init__(self, owner: CountingFileSystem, inner: FileHandle):
        self._owner = owner
        self._inner = inner
        self.path = inner.path

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._owner.wrote(self.path, len(data))
        self._inner.pwrite(data, offset)

    def pread(self, size: int, offset: int) -> bytes:
        self._owner.count("pread", self.path)
        return self._inner.pread(size, offset)

    def size(self) -> int:
        return self._inner.size()

    def fdatasync(self) -> None:
        self._owner.count("sync", self.path)
        self._inner.fdatasync()

    def start_writeback(self, offset: int, length: int) -> None:
        self._owner.count("writeback", self.path)
        self._inner.start_writeback(offset, length)

    def fsync(self) -> None:
        self._owner.count("sync", self.path)
        self._inner.fsync()

    def truncate(self, size: int) -> None:
        self._inner.truncate(size)

    def close(self) -> None:
        self._inner.close()


class CountingFileSystem:
    """Wraps a real `FileSystem` (the OS one by default) and counts, per file, the syncs and
    preads that go through it, and the most bytes written between two syncs. Thread-safe."""

    def __init__(self, inner: FileSystem | None = None):
        self._inner: FileSystem = inner if inner is not None else OsFileSystem()
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()
        self._unsynced: dict[str, int] = {}  # bytes written to a file since its last sync
        self.synced_bytes_max: dict[str, int] = {}  # the most one sync of the file had
        self._unstarted: dict[str, int] = {}  # bytes written since the last sync or writeback
        # the most bytes a file had written and not yet handed to a writeback or a sync
        self.unstarted_bytes_max: dict[str, int] = {}

    def count(self, kind: str, path: str) -> None:
        with self._lock:
            self.counts[(kind, path)] += 1
            if kind in ("sync", "writeback"):
                unstarted = self._unstarted.pop(path, 0)
                self.unstarted_bytes_max[path] = max(self.unstarted_bytes_max.get(path, 0),
                                                     unstarted)
            if kind == "sync":
                unsynced = self._unsynced.pop(path, 0)
                self.synced_bytes_max[path] = max(self.synced_bytes_max.get(path, 0), unsynced)

    def wrote(self, path: str, size: int) -> None:
        with self._lock:
            self._unsynced[path] = self._unsynced.get(path, 0) + size
            self._unstarted[path] = self._unstarted.get(path, 0) + size

    def total(self, kind: str, directory: str | os.PathLike[str] | None = None) -> int:
        """How many `kind` operations hit files (in `directory`, when given)."""
        where = None if directory is None else os.path.abspath(os.fspath(directory))
        with self._lock:
            return sum(n for (k, path), n in self.counts.items()
                       if k == kind and (where is None or os.path.dirname(path) == where))

    def open(self, path: str, *, create: bool = False) -> CountingFile:
        return CountingFile(self, self._inner.open(path, create=create))

    def open_read(self, path: str) -> CountingFile:
        return CountingFile(self, self._inner.open_read(path))

    def remove(self, path: str) -> None:
        self._inner.remove(path)

    def listdir(self, path: str) -> list[str]:
        return self._inner.listdir(path)

    def exists(self, path: str) -> bool:
        return self._inner.exists(path)

    def makedirs(self, path: str) -> None:
        self._inner.makedirs(path)

    def fsync_dir(self, path: str) -> None:
        self.count("sync_dir", path)
        self._inner.fsync_dir(path)

    def lock(self, path: str) -> LockHandle:
        return self._inner.lock(path)

    def point(self, label: str) -> None:
        self._inner.point(label)


class SmallDisk(SimFileSystem):
    """A disk of `capacity_bytes` for the journal and the entry logs: once the files there
    hold that much, every write fails with ENOSPC; removing files makes room again."""

    def __init__(self, seed: int, root: Path, capacity_bytes: int):
        super().__init__(seed)
        self.root = root
        self.capacity_bytes = capacity_bytes

    def used_bytes(self) -> int:
        return sum(path.stat().st_size for sub in ("journal", "entrylogs")
                   for path in (self.root / sub).glob("*") if path.is_file())

    def tick(self, kind: str, path: str) -> None:
        if kind == "write" and self.used_bytes() >= self.capacity_bytes:
            raise OSError(errno.ENOSPC, "no space left (test disk)", path)
        super().tick(kind, path)
