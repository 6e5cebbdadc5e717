"""The one module that touches files.

Every open, write, read, fsync, truncate, remove and directory sync the storage engine does
goes through a `FileSystem`. `OsFileSystem` is the real one: raw file descriptors, `pwrite`,
`pread`, `fdatasync`, no Python-level buffering. Tests and the power-loss crash harness swap
in `storage.testing.simfs.SimFileSystem`, which forwards to the real one but remembers every
write that has not been synced, so that a simulated power loss can keep, drop, tear or corrupt
each of them.

`point(label)` marks a named crash point in the engine (the checkpoint and compaction
steps of the storage design's crash list). It does nothing on a real file system; the
simulated one can crash there.

The LMDB index does its own I/O (it commits with fsync; a committed transaction is durable
and atomic). It is the one exception, and the crash harness models it as such.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import sys
from collections.abc import Callable
from typing import Protocol

from ._trace import trace

__all__ = ["FileHandle", "FileSystem", "LockHandle", "OsFileSystem"]


class FileHandle(Protocol):
    """An open file. Offsets are absolute; there is no file position."""

    path: str

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Write all of `data` at `offset`. Not durable until `fdatasync`/`fsync`."""

    def pread(self, size: int, offset: int) -> bytes:
        """Read up to `size` bytes at `offset`; fewer at the end of the file."""

    def size(self) -> int: ...

    def fdatasync(self) -> None:
        """Make every write so far durable (data, and the size needed to read it)."""

    def start_writeback(self, offset: int, length: int) -> None:
        """Start writing the range's dirty pages to the disk and return without waiting for
        them: a hint that spreads a big write over time, so that the `fdatasync` which
        follows has little left to do. It makes nothing durable and may do nothing."""

    def fsync(self) -> None: ...

    def truncate(self, size: int) -> None: ...

    def close(self) -> None: ...


class LockHandle(Protocol):
    def release(self) -> None: ...


class FileSystem(Protocol):
    def open(self, path: str, *, create: bool = False) -> FileHandle:
        """Open for reading and writing; `create` makes the file if it does not exist.
        A newly created file's name is durable only after `fsync_dir` of its directory."""

    def open_read(self, path: str) -> FileHandle: ...

    def remove(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def makedirs(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None: ...

    def lock(self, path: str) -> LockHandle:
        """Take an exclusive OS lock on `path` and write our PID into it.

        Raises:
            BlockingIOError: another process holds it; `.owner_pid` names that process
                when the file says.
        """

    def point(self, label: str) -> None:
        """A named crash point; no effect on a real file system."""


class OsFile:
    """A file opened with `os.open`: raw descriptor, no buffering."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd = fd

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            assert written > 0
            view = view[written:]
            offset += written

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def fdatasync(self) -> None:
        os.fdatasync(self._fd)

    def start_writeback(self, offset: int, length: int) -> None:
        _start_writeback(self._fd, offset, length)

    def fsync(self) -> None:
        os.fsync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsLock:
    def __init__(self, fd: int):
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


class OsFileSystem:
    """The real file system."""

    def open(self, path: str, *, create: bool = False) -> OsFile:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        return OsFile(path, os.open(path, flags, 0o644))

    def open_read(self, path: str) -> OsFile:
        return OsFile(path, os.open(path, os.O_RDONLY | os.O_CLOEXEC))

    def remove(self, path: str) -> None:
        os.remove(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def lock(self, path: str) -> OsLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            owner = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                error = BlockingIOError(exc.errno, f"{path} is locked")
                error.owner_pid = owner  # type: ignore[attr-defined]
                raise error from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        return OsLock(fd)

    def point(self, label: str) -> None:
        if trace.on:  # the opt-in latency trace (`_trace.py`): journal and checkpoint steps
            trace.mark(label)


# sync_file_range(2) with SYNC_FILE_RANGE_WRITE: queue the range's dirty pages for writeback
# and return (Linux; the standard library does not wrap it). A ctypes call releases the GIL.
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """`FileHandle.start_writeback` on a descriptor; a failure is ignored (a hint: the
    `fdatasync` that makes the range durable reports any I/O error)."""
    if _sync_file_range is not None and length > 0:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)
