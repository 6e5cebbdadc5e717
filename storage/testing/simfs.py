"""A fault-injecting file system: the test seam for crashes, power loss and disk errors.

`SimFileSystem` forwards every call to the real file system (real files, real fsync), and
remembers what a power loss could still take away:

* for each file, every write since its last fsync/fdatasync, with the bytes it overwrote,
  and the file's size as of that sync;
* for each directory, the files created since its last `fsync_dir`.

`crash()` (or reaching the configured operation count or crash point) makes every later
call raise `SimulatedCrash`, as if the machine stopped there. `power_loss()` then decides,
with the seeded random generator, the fate of each unsynced write, newest first: keep it,
drop it (the old bytes come back), tear it (a prefix survives) or corrupt part of it. Bytes
that a newer surviving write covers are not touched again. Files whose creation was never
made durable may vanish. A process crash (`kill -9`) is the same with every write kept.

Removes, truncates and the LMDB environment are treated as durable at once: LMDB commits
with fsync, and the engine only removes or truncates what is already safe to lose.

Scripted disk errors: `fail_writes(errno_code, after=n)` and `fail_syncs(...)` make the
n+1-th and later writes (or syncs) raise `OSError(errno_code)` — ENOSPC, EIO — without a
crash.

Holds: `hold(kind, where)` makes every later operation of that kind ("write", "sync",
"read") on a path containing `where` wait, in the thread that makes it, until
`release(kind)`; `held(kind)` counts the operations waiting. A test can thereby keep a
checkpoint's entry-log sync or a cold read in progress as long as it needs to.

Everything is driven by the seed and by operation counts, so a run that drives the engine
from one thread (`StorageConfig(background_threads=False)`) replays exactly.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from dataclasses import dataclass, field

from .._fs import OsFile, OsFileSystem, OsLock

__all__ = ["CRASH_POINTS", "SimFileSystem", "SimulatedCrash"]

# The named crash points the engine marks (storage design §12.6), for harnesses that want
# to crash at each of them.
CRASH_POINTS = (
    "journal:before-write",
    "journal:before-sync",
    "journal:after-sync",
    "journal:delete-segment",
    "checkpoint:begin",
    "checkpoint:after-swap",
    "checkpoint:after-entrylog-write",
    "checkpoint:after-entrylog-sync",
    "checkpoint:before-index-commit",
    "checkpoint:after-index-commit",
    "entrylog:after-seal",
    "compaction:after-copy",
    "compaction:after-sync",
    "compaction:after-index-update",
    "gc:after-index-drop",
)


class SimulatedCrash(OSError):
    """The simulated machine has stopped; nothing more reaches the disk."""

    def __init__(self, where: str):
        super().__init__(errno.EIO, f"simulated crash at {where}")
        self.where = where


@dataclass
class _Write:
    offset: int
    length: int
    old: bytes  # the bytes it overwrote, within the file's size at the time
    size_before: int


@dataclass
class _FileState:
    durable_size: int
    unsynced: list[_Write] = field(default_factory=list)


class SimFile:
    def __init__(self, sim: SimFileSystem, real: OsFile):
        self._sim = sim
        self._real = real
        self.path = real.path

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        self._sim.tick("write", self.path)
        size = self._real.size()
        overlap = max(0, min(size, offset + len(data)) - offset)
        old = self._real.pread(overlap, offset) if overlap else b""
        self._sim.state(self.path, size).unsynced.append(_Write(offset, len(data), old, size))
        self._real.pwrite(data, offset)

    def pread(self, size: int, offset: int) -> bytes:
        self._sim.check_alive(self.path)
        self._sim.wait_if_held("read", self.path)
        return self._real.pread(size, offset)

    def size(self) -> int:
        self._sim.check_alive(self.path)
        return self._real.size()

    def fdatasync(self) -> None:
        self._sim.tick("sync", self.path)
        self._real.fdatasync()
        self._sim.synced(self.path, self._real.size())

    def start_writeback(self, offset: int, length: int) -> None:
        # Makes nothing durable: the writes stay unsynced (a power loss may still drop them).
        self._sim.check_alive(self.path)
        self._real.start_writeback(offset, length)

    def fsync(self) -> None:
        self.fdatasync()

    def truncate(self, size: int) -> None:
        self._sim.tick("write", self.path)
        self._real.truncate(size)
        self._real.fsync()
        self._sim.synced(self.path, size)

    def close(self) -> None:
        self._real.close()


class SimFileSystem:
    """See the module comment."""

    def __init__(self, seed: int, *, crash_at_op: int | None = None,
                 crash_at_point: str | None = None, point_hits: int = 1):
        self.rng = random.Random(seed)
        self._real = OsFileSystem()
        self.ops = 0
        self.crashed_at: str | None = None
        self.crash_at_op = crash_at_op
        self.crash_at_point = crash_at_point
        self._point_hits_left = point_hits
        self._files: dict[str, _FileState] = {}
        self._created: dict[str, list[str]] = {}
        self._fail: dict[str, tuple[int, int]] = {}  # kind -> (errno, ops left before)
        self._holds: dict[str, tuple[str, threading.Event]] = {}  # kind -> (where, gate)
        self._held: dict[str, int] = {}
        self._holds_lock = threading.Lock()

    # -- crash control --------------------------------------------------------------------

    @property
    def crashed(self) -> bool:
        return self.crashed_at is not None

    def crash(self, where: str = "explicit crash") -> None:
        if self.crashed_at is None:
            self.crashed_at = where

    def check_alive(self, where: str) -> None:
        if self.crashed_at is not None:
            raise SimulatedCrash(self.crashed_at)

    def tick(self, kind: str, path: str) -> None:
        self.check_alive(path)
        self.wait_if_held(kind, path)
        self.ops += 1
        if self.crash_at_op is not None and self.ops >= self.crash_at_op:
            self.crash(f"operation {self.ops} ({kind} {os.path.basename(path)})")
            raise SimulatedCrash(self.crashed_at or "")
        scripted = self._fail.get(kind)
        if scripted is not None:
            code, left = scripted
            if left <= 0:
                raise OSError(code, f"injected {errno.errorcode.get(code, code)}", path)
            self._fail[kind] = (code, left - 1)

    def point(self, label: str) -> None:
        self.check_alive(label)
        if label == self.crash_at_point:
            self._point_hits_left -= 1
            if self._point_hits_left <= 0:
                self.crash(f"crash point {label}")
                raise SimulatedCrash(label)

    def fail_writes(self, code: int, after: int = 0) -> None:
        self._fail["write"] = (code, after)

    def fail_syncs(self, code: int, after: int = 0) -> None:
        self._fail["sync"] = (code, after)

    def heal(self) -> None:
        self._fail.clear()

    def hold(self, kind: str, where: str = "") -> None:
        """Operations of `kind` on paths containing `where` wait until `release(kind)`."""
        with self._holds_lock:
            self._holds[kind] = (where, threading.Event())

    def release(self, kind: str) -> None:
        with self._holds_lock:
            found = self._holds.pop(kind, None)
        if found is not None:
            found[1].set()

    def held(self, kind: str) -> int:
        """How many operations of `kind` are waiting in a hold now."""
        with self._holds_lock:
            return self._held.get(kind, 0)

    def wait_if_held(self, kind: str, path: str) -> None:
        with self._holds_lock:
            found = self._holds.get(kind)
            if found is None or found[0] not in path:
                return
            self._held[kind] = self._held.get(kind, 0) + 1
        found[1].wait()
        with self._holds_lock:
            self._held[kind] -= 1

    # -- bookkeeping ---------------------------------------------------------------------

    def state(self, path: str, size: int) -> _FileState:
        found = self._files.get(path)
        if found is None:
            found = self._files[path] = _FileState(size)
        return found

    def synced(self, path: str, size: int) -> None:
        self._files[path] = _FileState(size)

    # -- the FileSystem interface --------------------------------------------------------

    def open(self, path: str, *, create: bool = False) -> SimFile:
        self.check_alive(path)
        existed = os.path.exists(path)
        if create and not existed:
            self.tick("create", path)
        real = self._real.open(path, create=create)
        if create and not existed:
            self._created.setdefault(os.path.dirname(path), []).append(path)
            self._files[path] = _FileState(0)
        return SimFile(self, real)

    def open_read(self, path: str) -> SimFile:
        self.check_alive(path)
        return SimFile(self, self._real.open_read(path))

    def remove(self, path: str) -> None:
        self.tick("remove", path)
        self._real.remove(path)
        self._files.pop(path, None)
        for created in self._created.values():
            if path in created:
                created.remove(path)

    def listdir(self, path: str) -> list[str]:
        self.check_alive(path)
        return self._real.listdir(path)

    def exists(self, path: str) -> bool:
        return self._real.exists(path)

    def makedirs(self, path: str) -> None:
        self._real.makedirs(path)

    def fsync_dir(self, path: str) -> None:
        self.tick("sync", path)
        self._real.fsync_dir(path)
        self._created.pop(path, None)

    def lock(self, path: str) -> OsLock:
        return self._real.lock(path)

    # -- power loss ----------------------------------------------------------------------

    def power_loss(self, *, keep_all: bool = False) -> dict[str, int]:
        """Apply the fate of every unsynced write and creation (see the module comment);
        with `keep_all`, only a process crash: every write survives. Returns counts of
        what happened. Call it after the engine has stopped."""
        fates = {"kept": 0, "dropped": 0, "torn": 0, "corrupted": 0, "files_lost": 0}
        if not keep_all:
            for path, state in sorted(self._files.items()):
                if state.unsynced and os.path.exists(path):
                    self._lose_writes(path, state, fates)
            for paths in self._created.values():
                for path in sorted(paths):
                    if os.path.exists(path) and self.rng.random() < 0.5:
                        os.remove(path)
                        fates["files_lost"] += 1
        else:
            fates["kept"] = sum(len(s.unsynced) for s in self._files.values())
        self._files.clear()
        self._created.clear()
        return fates

    def _lose_writes(self, path: str, state: _FileState, fates: dict[str, int]) -> None:
        decided: list[tuple[int, int]] = []
        final_size = state.durable_size
        fd = os.open(path, os.O_RDWR)
        try:
            for write in reversed(state.unsynced):
                fate = self.rng.choices(["kept", "dropped", "torn", "corrupted"],
                                        weights=[4, 3, 2, 1])[0]
                fates[fate] += 1
                keep_until = write.offset + write.length
                if fate == "dropped":
                    keep_until = write.offset
                elif fate == "torn":
                    keep_until = write.offset + self.rng.randrange(write.length + 1)
                elif fate == "corrupted":
                    self._corrupt(fd, write, decided)
                self._restore(fd, write, keep_until, decided)
                if keep_until > write.offset:
                    final_size = max(final_size, keep_until)
                decided.append((write.offset, write.offset + write.length))
            os.ftruncate(fd, max(final_size, state.durable_size))
            os.fsync(fd)
        finally:
            os.close(fd)

    def _restore(self, fd: int, write: _Write, keep_until: int,
                 decided: list[tuple[int, int]]) -> None:
        """Put back what the write overwrote, from `keep_until` to its end, except where a
        newer surviving write already decided the bytes."""
        for start, stop in _undecided(keep_until, write.offset + write.length, decided):
            old = write.old[start - write.offset: stop - write.offset]
            os.pwrite(fd, old + bytes(stop - start - len(old)), start)

    def _corrupt(self, fd: int, write: _Write, decided: list[tuple[int, int]]) -> None:
        start = write.offset + self.rng.randrange(write.length)
        stop = min(write.offset + write.length, start + 1 + self.rng.randrange(64))
        for a, b in _undecided(start, stop, decided):
            os.pwrite(fd, self.rng.randbytes(b - a), a)


def _undecided(start: int, stop: int, decided: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, stop) not covered by any decided range."""
    parts = [(start, stop)] if start < stop else []
    for a, b in decided:
        next_parts = []
        for s, e in parts:
            if b <= s or a >= e:
                next_parts.append((s, e))
                continue
            if s < a:
                next_parts.append((s, a))
            if b < e:
                next_parts.append((b, e))
        parts = next_parts
    return parts
