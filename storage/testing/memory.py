"""`InMemoryLedgerStorage`: a `LedgerStorage` without a disk, with scripted failures.

Theory of operation
-------------------
The store keeps, per ledger, its state (open, fenced, closed, deleted), its accepted entries
and its last-add-confirmed (LAC), and a dict of metadata. A deleted ledger is dropped once
its deletion is durable (as `Storage` purges its tombstone), one deleted while the disk is
full stays a tombstone; ids are never handed out again either way. It behaves like `Storage` (the
shared conformance suite runs against both): ledger ids from 1, dense entry ids from 0,
refusals raised at once with the same error classes, writes answered by a `Completion`
that finishes once the write is "durable", the LAC advancing with it.

A write is applied to the in-memory state at once (as `Storage` applies it to its write
cache) and queued; it becomes durable in queue order, finished by the store's own thread
(as the journal's syncer finishes `Storage`'s writes), so a completion is never done when
the call that made it returns. After `hold_completions()`, writes wait until the test calls
`complete_pending()` (in the test's thread): a test can hold adds in flight, as a slow
journal would. `inline_completions=True` finishes every write in the calling thread before
the call returns, which the real engine does only by a rare race; it is there to shake out
callers that assume otherwise. Each queued write remembers how to undo itself.

Scripted failures:

* `fail_next_adds(n, error)`: the next n `add_entry` calls raise `error` and write nothing
  (what `Storage` does when its write cache stays full).
* `fail_writes(error)`: the next write to become durable fails with `error`, a
  `StorageFailedError` (a journal write hitting EIO): the store stops accepting writes and
  every queued write fails with it. Nothing acknowledged is lost.
* `set_disk_full(True)`: the same with `StorageFullError`, and `full` stays true. While
  full, `delete_ledger` and deletes-only `apply_journaled` still work (committed at once),
  and `try_resume_writes` returns False until `set_disk_full(False)`; then it undoes every
  write that never became durable (the failed adds' entry ids are handed out again) and
  accepts writes again.
* `fill_cache()` / `free_cache()`: while the "write cache" is full, `try_add_entry` returns
  None, `add_entry` blocks (up to `write_cache_wait_ms_max`, then `StorageError`) and
  `cache_space()` stays unfinished until `free_cache()` (or a failure, or `close`).
* `cold_reads(True)`: `try_read_entries` answers None, as if nothing were cached; with
  `hold_reads()`, `read_entries` blocks (in whatever thread calls it) until
  `release_reads()`; `reads_held` counts the reads waiting there.
* `corrupt_entry(ledger_id, entry_id)`: reads covering that entry raise `CorruptionError`.
* `fail_next_reads(n, error)`: the next n reads raise `error` (a read error that may pass).

Threads: every method may be called from any thread; one lock guards the state, and
completions are finished outside it, in queue order (their callbacks run in the finishing
thread, and may call back into the store).
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from .._adds import checked_runs, one_by_one
from .._completion import Completion
from .._config import StorageConfig
from .._errors import (
    CorruptionError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotFoundError,
    NoSuchEntryError,
    StorageClosedError,
    StorageError,
    StorageFailedError,
    StorageFullError,
)
from .._ledger import CLOSED, DELETED, FENCED, OPEN, LedgerInfo
from ._memory_metadata import InMemoryMetadata, InMemoryMetadataTransaction, _nothing

__all__ = ["InMemoryLedgerStorage", "InMemoryMetadata", "InMemoryMetadataTransaction"]


class _Ledger:
    __slots__ = ("entries", "lac", "ledger_id", "metadata", "state")

    def __init__(self, ledger_id: int, metadata: dict[str, str]):
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.state = OPEN
        self.entries: list[bytes] = []  # accepted, durable or not
        self.lac = -1

    def info(self) -> LedgerInfo:
        return LedgerInfo(self.ledger_id, self.state, self.lac, dict(self.metadata))


@dataclass
class _Pending:
    """A write applied in memory and waiting to become durable."""

    completion: Completion[int]
    value: int
    on_durable: Callable[[], object]
    undo: Callable[[], None]


class InMemoryLedgerStorage:
    """A `LedgerStorage` in memory, with scripted failures (see the module comment)."""

    def __init__(self, config: StorageConfig | None = None, *,
                 inline_completions: bool = False):
        """`inline_completions`: finish writes in the calling thread, before the call
        returns, instead of in the store's own thread (see the module comment)."""
        self.config = config or StorageConfig()
        self._lock = threading.RLock()
        self._finish_lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._inline = inline_completions
        self._worker: threading.Thread | None = None
        self._stopping = False
        self._ledgers: dict[int, _Ledger] = {}
        self._next_ledger_id = 1
        self._pending: list[_Pending] = []
        self._undo_on_resume: list[Callable[[], None]] = []
        self._hold = False
        self._refuse_adds: list[StorageError] = []
        self._fail_write: StorageFailedError | None = None
        self._disk_full = False
        self._corrupt: set[tuple[int, int]] = set()
        self._refuse_reads: list[StorageError | OSError] = []
        self._cache_full = False
        self._space_waiters: list[Completion[None]] = []
        self._cold = False
        self._reads_open = threading.Event()
        self._reads_open.set()
        self.reads_held = 0
        self.metadata = InMemoryMetadata(self)
        self.failed: StorageError | None = None
        self.closed = False

    # -- scripted behaviour -------------------------------------------------------------

    def hold_completions(self) -> None:
        """From now on, writes become durable only in `complete_pending`."""
        with self._lock:
            self._hold = True

    @property
    def pending_writes(self) -> int:
        """How many writes are queued, not yet durable."""
        with self._lock:
            return len(self._pending)

    def complete_pending(self, count: int | None = None) -> int:
        """Make the oldest `count` queued writes (all when None) durable, and stop holding
        when all are done. Returns how many finished."""
        finished = 0
        while count is None or finished < count:
            if not self._finish_one():
                break
            finished += 1
        if count is None:
            with self._lock:
                self._hold = False
            self._drain()
        return finished

    def fail_next_adds(self, count: int, error: StorageError) -> None:
        """The next `count` `add_entry` calls raise `error`; nothing is written."""
        assert count >= 0
        with self._lock:
            self._refuse_adds.extend([error] * count)

    def fail_writes(self, error: StorageFailedError) -> None:
        """The next write to become durable fails with `error`, and the store stops."""
        with self._lock:
            self._fail_write = error

    def set_disk_full(self, full: bool) -> None:
        """Switch the full disk on (the next write fails with `StorageFullError`) or off
        (`try_resume_writes` can succeed)."""
        with self._lock:
            self._disk_full = full
            if not full and isinstance(self._fail_write, StorageFullError):
                self._fail_write = None  # switched off before any write hit it
            if full and self.failed is None:
                self._fail_write = StorageFullError("disk full (scripted)",
                                                    path="memory:journal", errno=errno.ENOSPC)

    def fail_next_reads(self, count: int, error: StorageError | OSError) -> None:
        """The next `count` reads (`read_entry`, `read_entries`) raise `error`."""
        assert count >= 0
        with self._lock:
            self._refuse_reads.extend([error] * count)

    def fill_cache(self) -> None:
        """The write cache is full from now on (see the module comment)."""
        with self._lock:
            self._cache_full = True

    def free_cache(self) -> None:
        """The write cache has room again: waiting adds go on, `cache_space` finishes."""
        with self._lock:
            self._cache_full = False
            self._wake.notify_all()
        self._wake_space_waiters()

    def cold_reads(self, cold: bool) -> None:
        """Whether `try_read_entries` answers None (nothing cached)."""
        with self._lock:
            self._cold = cold

    def hold_reads(self) -> None:
        """`read_entries` blocks until `release_reads`."""
        self._reads_open.clear()

    def release_reads(self) -> None:
        self._reads_open.set()

    def corrupt_entry(self, ledger_id: int, entry_id: int) -> None:
        """Reads covering this entry raise `CorruptionError`."""
        with self._lock:
            self._corrupt.add((ledger_id, entry_id))

    # -- state ---------------------------------------------------------------------------

    @property
    def full(self) -> bool:
        return isinstance(self.failed, StorageFullError) and not self.closed

    def try_resume_writes(self) -> bool:
        """Accept writes again after a full disk, once `set_disk_full(False)` was called:
        the writes that never became durable are undone (see the module comment)."""
        with self._lock:
            if not self.full or self._disk_full:
                return False
            for undo in reversed(self._undo_on_resume):
                undo()
            self._undo_on_resume.clear()
            self.failed = None
            return True

    def close(self) -> None:
        """Finish the queued writes, refuse everything after, and stop the store's thread.
        Idempotent."""
        with self._lock:
            self.closed = True
            self._hold = False
            self._stopping = True
            self._wake.notify_all()
            worker = self._worker
        self._wake_space_waiters()
        self._reads_open.set()
        while self._finish_one():
            pass
        if worker is not None and worker is not threading.current_thread():
            worker.join()

    # -- ledgers -------------------------------------------------------------------------

    def create_ledger(self, metadata: dict[str, str] | None = None) -> Completion[int]:
        return self.start_ledger(metadata)[1]

    def start_ledger(self, metadata: dict[str, str] | None = None
                     ) -> tuple[int, Completion[int]]:
        metadata = dict(metadata or {})
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        with self._lock:
            self._check_writable()
            ledger_id = self._next_ledger_id
            self._next_ledger_id += 1
            self._ledgers[ledger_id] = _Ledger(ledger_id, metadata)

            def undo() -> None:
                del self._ledgers[ledger_id]
                self._next_ledger_id = ledger_id

            completion = self._queue(ledger_id, _nothing, undo)
        self._drain()
        return ledger_id, completion

    def add_entry(self, ledger_id: int, data: bytes) -> Completion[int]:
        """Raises like `Storage.add_entry`; plus the errors `fail_next_adds` scripted. Blocks
        while the scripted cache is full, as `Storage.add_entry` does."""
        return self.add_entries(ledger_id, [data])

    def add_entries(self, ledger_id: int, entries: Sequence[bytes]) -> Completion[int]:
        """As `Storage.add_entries`; a scripted refusal (`fail_next_adds`) refuses the run."""
        if (added := self.try_add_entries(ledger_id, entries)) is not None:
            return added
        wait_s = self.config.write_cache_wait_ms_max / 1000.0
        with self._lock:
            if not self._wake.wait_for(lambda: not self._cache_full or self.failed is not None
                                       or self.closed, wait_s):
                raise StorageError(f"write cache full for {self.config.write_cache_wait_ms_max}"
                                   " ms (scripted)")
        return self.add_entries(ledger_id, entries)

    def try_add_entry(self, ledger_id: int, data: bytes) -> Completion[int] | None:
        return self.try_add_entries(ledger_id, [data])

    def try_add_entries(self, ledger_id: int, entries: Sequence[bytes]) -> Completion[int] | None:
        """`add_entries` answering None while the scripted cache is full; one queued write."""
        added = self.try_add_runs([(ledger_id, entries)])
        return None if added is None else added[1]

    def try_add_runs(self, runs: Sequence[tuple[int, Sequence[bytes]]],
                     ) -> tuple[list[int], Completion[int]] | None:
        """As `Storage.try_add_runs`: every run checked first, then one queued write."""
        datas = checked_runs(runs, self.config.entry_size_bytes_max)
        with self._lock:
            self._check_writable()
            ledgers = [self._writable_ledger(ledger_id) for ledger_id, _ in runs]
            if self._cache_full:
                return None
            if self._refuse_adds:
                raise self._refuse_adds.pop(0)
            spans = []  # (ledger, first, last) of each run
            for ledger, run in zip(ledgers, datas, strict=True):
                spans.append((ledger, len(ledger.entries), len(ledger.entries) + len(run) - 1))
                ledger.entries.extend(run)

            def durable() -> None:
                for ledger, first, last in spans:
                    assert ledger.lac + 1 == first, "adds become durable in order"
                    ledger.lac = last

            def undo() -> None:
                for ledger, first, last in reversed(spans):
                    assert len(ledger.entries) == last + 1
                    del ledger.entries[first:]

            completion = self._queue(spans[-1][2], durable, undo)
        self._drain()
        return [last for _, _, last in spans], completion

    def cache_space(self) -> Completion[None]:
        with self._lock:
            if not self._cache_full or self.failed is not None or self.closed:
                return Completion.resolved(None)
            waiter: Completion[None] = Completion()
            self._space_waiters.append(waiter)
            return waiter

    def _wake_space_waiters(self) -> None:
        with self._lock:
            waiters, self._space_waiters = self._space_waiters, []
        for waiter in waiters:
            waiter.set_result(None)

    def fence(self, ledger_id: int) -> Completion[int]:
        with self._lock:
            self._check_writable()
            ledger = self._ledger(ledger_id)
            if ledger.state != OPEN:
                return Completion.resolved(ledger.lac)
            completion = self._change_state(ledger, FENCED, len(ledger.entries) - 1)
        self._drain()
        return completion

    def close_ledger(self, ledger_id: int) -> Completion[int]:
        with self._lock:
            self._check_writable()
            ledger = self._ledger(ledger_id)
            last = len(ledger.entries) - 1
            if ledger.state == CLOSED:
                return Completion.resolved(last)
            completion = self._change_state(ledger, CLOSED, last)
        self._drain()
        return completion

    def close_ledgers(self, ledger_ids: Sequence[int]) -> list[Completion[int]]:
        """As `Storage.close_ledgers` (one by one here); a missing ledger's completion fails."""
        with self._lock:
            self._check_writable()
        return one_by_one(self.close_ledger, ledger_ids)

    def delete_ledgers(self, ledger_ids: Sequence[int]) -> list[Completion[int]]:
        """As `Storage.delete_ledgers` (one by one here); a missing ledger's completion fails."""
        with self._lock:
            if not self.full:
                self._check_writable()
        return one_by_one(self.delete_ledger, ledger_ids)

    def delete_ledger(self, ledger_id: int) -> Completion[int]:
        with self._lock:
            if self.full:
                self._ledger(ledger_id).state = DELETED  # committed at once, as `Storage`
                return Completion.resolved(ledger_id)
            self._check_writable()
            completion = self._change_state(self._ledger(ledger_id), DELETED, ledger_id,
                                            partial(self._ledgers.pop, ledger_id))
        self._drain()
        return completion

    def _change_state(self, ledger: _Ledger, state: str, value: int,
                      on_durable: Callable[[], object] = _nothing) -> Completion[int]:
        before = ledger.state
        ledger.state = state

        def undo() -> None:
            ledger.state = before

        return self._queue(value, on_durable, undo)

    def last_add_confirmed(self, ledger_id: int) -> int:
        with self._lock:
            return self._ledger(ledger_id).lac

    def ledger_info(self, ledger_id: int) -> LedgerInfo:
        with self._lock:
            return self._ledger(ledger_id).info()

    def list_ledgers(self, tagged: tuple[str, str] | None = None) -> list[LedgerInfo]:
        with self._lock:
            return [led.info() for _, led in sorted(self._ledgers.items())
                    if led.state != DELETED and (tagged is None or tagged in led.metadata.items())]

    # -- reads ---------------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        return self.read_entries(ledger_id, entry_id, entry_id)[0]

    def read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes]:
        """Raises like `Storage.read_entries`; `CorruptionError` for `corrupt_entry`, and
        the errors `fail_next_reads` scripted. Blocks while reads are held."""
        if not self._reads_open.is_set():
            with self._lock:
                self.reads_held += 1
            self._reads_open.wait()
            with self._lock:
                self.reads_held -= 1
        return self._read(ledger_id, first, last)

    def try_read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes] | None:
        """Everything is in memory: the entries, unless `cold_reads` says None (after the
        same checks as `read_entries`)."""
        entries = self._read(ledger_id, first, last)
        with self._lock:
            return None if self._cold else entries

    def _read(self, ledger_id: int, first: int, last: int) -> list[bytes]:
        with self._lock:
            if self._refuse_reads:
                raise self._refuse_reads.pop(0)
            ledger = self._ledger(ledger_id)
            if first < 0 or last < first or last > ledger.lac:
                raise NoSuchEntryError(
                    f"ledger {ledger_id} has entries 0..{ledger.lac}; asked {first}..{last}")
            for entry_id in range(first, last + 1):
                if (ledger_id, entry_id) in self._corrupt:
                    raise CorruptionError(
                        f"ledger {ledger_id} entry {entry_id}: scripted corruption",
                        path=f"memory:ledger-{ledger_id}", offset=entry_id)
            return ledger.entries[first:last + 1]

    # -- internals -----------------------------------------------------------------------

    def _ledger(self, ledger_id: int) -> _Ledger:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None or ledger.state == DELETED:
            raise LedgerNotFoundError(f"ledger {ledger_id} does not exist")
        return ledger

    def _writable_ledger(self, ledger_id: int) -> _Ledger:
        ledger = self._ledger(ledger_id)
        if ledger.state == FENCED:
            raise LedgerFencedError(f"ledger {ledger_id} is fenced")
        if ledger.state == CLOSED:
            raise LedgerClosedError(f"ledger {ledger_id} is closed")
        return ledger

    def _check_writable(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self.closed:
            raise StorageClosedError("in-memory storage is closed")

    def _queue(self, value: int, on_durable: Callable[[], object],
               undo: Callable[[], None]) -> Completion[int]:
        """Queue a write applied in memory. Lock held; the caller drains after."""
        completion: Completion[int] = Completion()
        self._pending.append(_Pending(completion, value, on_durable, undo))
        return completion

    def _drain(self) -> None:
        """Have the queued writes finished unless held: by the store's thread, or here when
        inline. Called without the state lock, so that completion callbacks may call back
        into the store."""
        with self._lock:
            if self._hold or not self._pending:
                return
            if not self._inline:
                if self._worker is None and not self._stopping:
                    self._worker = threading.Thread(target=self._work, daemon=True,
                                                    name="memory-storage-journal")
                    self._worker.start()
                self._wake.notify()
                return
        while self._finish_one():
            pass

    def _work(self) -> None:
        """The store's thread: finishes queued writes in order, as a journal's syncer."""
        while True:
            with self._lock:
                while (self._hold or not self._pending) and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return  # `close` finishes what is left
            self._finish_one(unless_held=True)

    def _finish_one(self, *, unless_held: bool = False) -> bool:
        """Make the oldest queued write durable (or fail it, as scripted). The finish lock
        keeps completions in queue order across threads; it is reentrant for callbacks."""
        with self._finish_lock:
            with self._lock:
                if not self._pending or (unless_held and self._hold):
                    return False
                error = self._fail_write
                if error is not None:
                    failed, self._pending = self._pending, []
                    self._fail_write = None
                    if self.failed is None:
                        self.failed = error
                    self._undo_on_resume.extend(p.undo for p in failed)
                    self._wake.notify_all()
                else:
                    pending = self._pending.pop(0)
                    pending.on_durable()
            if error is not None:
                self._wake_space_waiters()
                for item in failed:
                    item.completion.set_exception(error)
            else:
                pending.completion.set_result(pending.value)
            return True


if TYPE_CHECKING:  # mypy checks that both implementations satisfy the Protocol
    from .._ledger_storage import LedgerStorage
    from .._storage import Storage

    def _conforms(real: Storage, memory: InMemoryLedgerStorage) -> list[LedgerStorage]:
        return [real, memory]
