"""`Storage`: the ledger store of one data directory.

Theory of operation
-------------------
A data directory holds:

    LOCK          the owner's OS lock and PID
    journal/      journal segments (`_journal.py`)
    entrylogs/    entry logs (`_entry_log.py`)
    index/        the LMDB environment (`_index.py`)

An add (`_adds.py`) or a ledger's creation, fence, close or deletion (`_lifecycle.py`) is
applied in memory first (an entry goes into the write cache and the ledger's next entry id
advances), then its journal record is queued; the add's completion finishes
once the journal's group commit has synced it, and the ledger's last-add-confirmed (LAC)
advances at the same moment. Reads serve entries up to the LAC from the write cache or,
once checkpointed, from the entry logs through the index.

The engine state is owned by parts built here and handed what they need: the ledger table
(`LedgerTable`: ledgers, the next id, what changed since the last checkpoint), the entry-log
manager (`EntryLogs`: the registry of entry logs, the one being written, the reader), the
`Checkpointer` and the `GarbageCollector`. `Storage` calls them through narrow methods;
recovery, `check` and the metadata store see it through small Protocols of their own, so
no module of the engine imports this one.

A checkpoint (`_checkpoint.py`, every `checkpoint_interval_ms` or when the cache fills)
captures the journal's synced mark, swaps the cache halves, appends the flushing half to
the current entry log, fsyncs it, and commits the locations, the ledger records and the
mark in one LMDB transaction; journal segments wholly before the mark are then deleted.

Opening a directory recovers it (`_recovery.py`): the journal is replayed from the
persisted mark into the cache, a fresh journal segment starts, and a checkpoint makes the
result durable outside the journal; with background threads the open returns before that
checkpoint (the checkpoint thread runs it at once; the journal covers the data meanwhile).
Garbage collection (`_gc.py`) drops entry logs whose ledgers are all deleted and compacts
the ones that are mostly dead. A deleted ledger's record (its tombstone) goes with the
first checkpoint whose mark is past its delete record (`LedgerTable`): until then a replay
could meet the ledger's create; from then on none can, and the persisted id counter keeps
its id from being handed out again.

A full disk (`StorageFullError`) fails the engine like any I/O error, but need not end it:
`try_resume_writes` (the owner calls it periodically while `full`) stops the failed journal,
cuts the journal after its last acknowledged record, and recovers the directory into a fresh
engine state exactly as an open would (replay, a new segment, a checkpoint). When that
succeeds, the recovered state replaces the failed one under the lock and writes resume;
when the disk is still full, nothing changes and a later call tries again. Adds that failed
are gone (their ids are handed out again); every acknowledged one is kept.

While full, deleting frees space without the journal (which needs room): `delete_ledger`
commits the deletion straight to the index (the ledger record, its locations, the entry
logs' live counts) and removes every entry log left without live data; metadata deletes
(`MetadataStore.apply_journaled` with deletes only) commit straight to the index too. A
later replay never revives a deleted ledger; the metadata deletes are journaled again once
writes resume, so that a replayed older put cannot bring a key back.

Threads: callers may use a `Storage` from any number of threads and from asyncio (a
`Completion` is awaitable). An event loop must not wait: it adds with `try_add_entry`
(refused, not held, while the write cache is full; `cache_space` finishes when to try again)
and reads with `try_read_entries` (memory only), sending reads that need the disk to a
worker thread. One lock guards the in-memory state; the journal has its
writer and syncer threads, and a checkpoint thread runs checkpoints and GC.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

import lmdb

from ._adds import AddedRuns, add_one, add_run, add_runs, one_by_one
from ._checkpoint import Checkpointer
from ._completion import Completion, set_results
from ._config import StorageConfig
from ._entry_logs import EntryLogs
from ._errors import (
    CorruptionError,
    DataDirLockedError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotFoundError,
    NoSuchEntryError,
    StorageClosedError,
    StorageError,
    StorageFailedError,
    StorageFullError,
)
from ._fs import FileSystem, LockHandle, OsFileSystem
from ._gc import GarbageCollector
from ._index import CheckpointWrite, Index, MetaOp
from ._journal import Journal, JournalRequest, segment_file_name
from ._journal_format import RecordType
from ._ledger import CLOSED, DELETED, FENCED, LedgerInfo, LedgerState, LedgerTable
from ._lifecycle import close_ledger as _close_ledger
from ._lifecycle import delete_ledger as _delete_ledger
from ._lifecycle import end_ledgers as _end_ledgers
from ._lifecycle import fence as _fence
from ._lifecycle import start_ledger as _start_ledger
from ._metadata import MetadataStore, encode_meta_ops
from ._recovery import ReplayStats, recover
from ._stats import StorageMetrics
from ._trace import trace
from ._write_cache import WriteCache

__all__ = ["Storage"]

log = logging.getLogger(__name__)


T = TypeVar("T")
_DELETE = int(RecordType.LEDGER_DELETE)


class Storage:
    """The ledger store of one data directory. Open it with `Storage.open`."""

    def __init__(self, data_dir: str, config: StorageConfig, fs: FileSystem,
                 lock: LockHandle, index: Index, metrics: StorageMetrics | None = None):
        """Internal: use `Storage.open`."""
        self.data_dir = data_dir
        # What the engine has done (`_stats.py`); a state recovered in place (after a full
        # disk) keeps counting into the same figures.
        self.metrics = metrics if metrics is not None else StorageMetrics()
        self.config = config
        self.fs = fs
        self.journal_dir = os.path.join(data_dir, "journal")
        self.entry_log_dir = os.path.join(data_dir, "entrylogs")
        self.index = index
        self._dir_lock = lock
        self.mutex = threading.RLock()  # `lock`'s own: the add path takes it directly
        self.lock = threading.Condition(self.mutex)
        self.cache = WriteCache(config.write_cache_bytes_max // 2)
        self.ledgers = LedgerTable()
        self.logs = EntryLogs(fs, self.entry_log_dir, config)
        self.checkpointer = Checkpointer(
            fs=fs, config=config, lock=self.lock, cache=self.cache, ledgers=self.ledgers,
            logs=self.logs, index=index, failure=self._failure, on_failure=self.fail_with)
        self.collector = GarbageCollector(
            fs=fs, config=config, logs=self.logs, index=index,
            checkpoint_lock=self.checkpointer.lock, failure=self._failure,
            on_failure=self.fail_with, metrics=self.metrics)
        self.journal: Journal | None = None
        self.failed: StorageError | None = None
        self.closed = False
        self._checkpoint_wanted = threading.Event()
        self._stop = threading.Event()
        self._background: threading.Thread | None = None
        self._last_gc = time.monotonic()
        self.replay_stats: ReplayStats | None = None
        self.metadata = MetadataStore(self)
        self._resume_lock = threading.Lock()
        self._meta_deleted_while_full: list[bytes] = []
        self._space_waiters: list[Completion[None]] = []  # `cache_space`; bounded by callers

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], config: StorageConfig | None = None,
             *, fs: FileSystem | None = None) -> Storage:
        """Open (creating if needed) and recover a data directory.

        Raises:
            DataDirLockedError: another process owns the directory.
            CorruptionError: recovery found corruption it must not repair silently (a bad
                record in an older journal segment, a missing marked segment, a missing
                entry log, a damaged journal record with valid records after it:
                `JournalCorruptionError`); the journal is left as found.
        """
        config = config or StorageConfig()
        fs = fs or OsFileSystem()
        path = os.path.abspath(os.fspath(data_dir))
        for sub in ("", "journal", "entrylogs", "index"):
            fs.makedirs(os.path.join(path, sub))
        try:
            lock = fs.lock(os.path.join(path, "LOCK"))
        except BlockingIOError as exc:
            raise DataDirLockedError(path, getattr(exc, "owner_pid", None)) from None
        try:
            index = Index(os.path.join(path, "index"), config.lmdb_map_bytes)
        except BaseException:
            lock.release()
            raise
        store = cls(path, config, fs, lock, index)
        started = time.monotonic()
        try:  # with background threads, the open returns before the replay's flush
            stats = recover(store, flush_in_background=config.background_threads)
        except BaseException:
            store.abandon()
            raise
        store.metrics.replay_seconds = time.monotonic() - started
        store.metrics.replay_records = stats.records
        if config.background_threads:
            store._checkpoint_wanted.set()  # the replayed records leave the journal now
            store._background = threading.Thread(target=store._background_loop,
                                                 name="storage-checkpoint", daemon=True)
            store._background.start()
        return store

    def start_journal(self, segment_id: int, last_lsn: int) -> None:
        """Internal (recovery): open the journal on a fresh segment."""
        assert self.journal is None
        self.journal = Journal(self.fs, self.journal_dir, self.config, segment_id=segment_id,
                               last_lsn=last_lsn, on_durable=self._on_durable,
                               on_failed=self._on_failed, metrics=self.metrics)
        self.checkpointer.attach(self.journal)
        self.ledgers.recovered_tombstones(segment_id)

    def close(self) -> None:
        """Finish queued writes, checkpoint, and release the directory. Idempotent. Waits
        for a `try_resume_writes` under way."""
        with self._resume_lock:
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        self._wake_space_waiters()
        self._stop_background()
        if self.journal is not None:
            self.journal.close()
        if self.failed is None:
            try:
                self.checkpoint()
            except StorageError as exc:
                log.error("final checkpoint failed: %s", exc)
        self._release()
        log.info("storage %s closed", self.data_dir)

    def abandon(self) -> None:
        """Stop without writing anything more: what a crash would leave (tests)."""
        with self.lock:
            self.closed = True
            if self.failed is None:
                self.failed = StorageClosedError("storage abandoned")
            self.lock.notify_all()
        self._wake_space_waiters()
        self._stop_background()
        if self.journal is not None:
            self.journal.abandon()
        self._release()

    def _stop_background(self) -> None:
        self._stop.set()
        self._checkpoint_wanted.set()
        if self._background is not None and self._background is not threading.current_thread():
            self._background.join()

    def _release(self) -> None:
        with self.checkpointer.lock:  # a replay flush the open did not wait for ends first
            pass
        self.logs.close()
        self.index.close()
        self._dir_lock.release()

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- a full disk ---------------------------------------------------------------------

    @property
    def full(self) -> bool:
        """Whether writes are refused because the disk was full (see `try_resume_writes`)."""
        return isinstance(self.failed, StorageFullError) and not self.closed

    def try_resume_writes(self) -> bool:
        """After a full disk: recover in place and accept writes again, if there is room now
        (see the module comment). Returns True when writes resumed, False when the engine
        is not stopped by a full disk or there is still no room (it then stays as it was).
        Blocks for a recovery: call it from a worker thread, not an event loop.

        Raises:
            CorruptionError: recovery found corruption; the engine stays failed.
        """
        with self._resume_lock:
            if not self.full:
                return False
            self._stop_background()
            assert self.journal is not None
            self.journal.abandon()
            try:
                self.journal.discard_unacknowledged()
                with self.lock:
                    writer, self.logs.writer = self.logs.writer, None
                if writer is not None:
                    writer.close()
            except OSError as exc:
                log.warning("storage %s: still cannot write (%s); writes stay off",
                            self.data_dir, exc)
                return False
            fresh = Storage(self.data_dir, self.config, self.fs, self._dir_lock, self.index,
                            self.metrics)
            try:
                recover(fresh)
            except (OSError, StorageFailedError) as exc:
                fresh._discard_failed_recovery()
                log.warning("storage %s: still cannot write (%s); writes stay off",
                            self.data_dir, exc)
                return False
            self._take_over(fresh)
        log.warning("storage %s: there is room on the disk again; writes resumed",
                    self.data_dir)
        return True

    def _delete_while_full(self, ledger_id: int) -> Completion[int]:
        """`delete_ledger` on a full disk, straight to the index. Resume lock held.

        Raises:
            LedgerNotFoundError: no such ledger; nothing changed.
            StorageFailedError: removing a dead entry log failed (it stays referenced
                or is removed at the next start); the deletion itself is committed.
        """
        with self.lock:
            ledger = self._ledger(ledger_id)
            ledger.state = DELETED
            dead = self.collector.delete_while_full(ledger.record())
        log.info("ledger %d deleted while the disk is full; entry logs freed: %s",
                 ledger_id, dead)
        return Completion.resolved(ledger_id)

    def delete_meta_while_full(self, keys: list[bytes]) -> bool:
        """Internal (`MetadataStore`): delete metadata keys straight in the index while the
        disk is full; returns False (nothing done) when it is not full."""
        with self._resume_lock:
            if not self.full:
                return False
            with self.lock:
                self.index.commit_checkpoint(CheckpointWrite(
                    mark=None, meta_ops=[(key, None) for key in keys]))
                for key in keys:
                    self.cache.put_meta(key, None)
                self._meta_deleted_while_full.extend(keys)
        return True

    def _discard_failed_recovery(self) -> None:
        """A recovery into this (fresh) state failed: stop what it started, and remove the
        journal segment it created when nothing refers to it."""
        if self.journal is not None:
            self.journal.abandon()
            segment_id = self.journal.current_segment_id
            mark = self.index.persisted_mark
            if mark is None or mark.segment_id < segment_id:
                path = os.path.join(self.journal_dir, segment_file_name(segment_id))
                try:
                    self.fs.remove(path)
                except OSError as exc:
                    log.debug("could not remove %s: %s", path, exc)
        self.logs.close()

    def _take_over(self, fresh: Storage) -> None:
        """Adopt a recovered state (see `try_resume_writes`). Reads in flight on the old
        state keep working: its reader stays open until the storage closes."""
        assert fresh.journal is not None
        with self.lock:
            fresh.logs.take_readers_of(self.logs)
            self.cache = fresh.cache
            self.ledgers = fresh.ledgers
            self.logs = fresh.logs
            self.checkpointer = fresh.checkpointer
            self.checkpointer.rebind(self.lock, self._failure, self.fail_with)
            self.collector = fresh.collector
            self.collector.rebind(self._failure, self.fail_with)
            self.journal = fresh.journal
            self.replay_stats = fresh.replay_stats
            fresh.journal.rebind(self._on_durable, self._on_failed)
            self.failed = None
            self.lock.notify_all()
            redo, self._meta_deleted_while_full = self._meta_deleted_while_full, []
        if redo:  # a replayed older put must not bring these keys back
            self.metadata.apply_journaled([(key, None) for key in redo])
        if self.config.background_threads:
            self._stop.clear()
            self._background = threading.Thread(target=self._background_loop,
                                                name="storage-checkpoint", daemon=True)
            self._background.start()

    # -- ledgers -------------------------------------------------------------------------

    def create_ledger(self, metadata: dict[str, str] | None = None) -> Completion[int]:
        """Create a ledger; the completion gives its id once the creation is durable.

        Raises:
            StorageClosedError, StorageFailedError: nothing was created.
        """
        return self.start_ledger(metadata)[1]

    def start_ledger(self, metadata: dict[str, str] | None = None
                     ) -> tuple[int, Completion[int]]:
        """`create_ledger`, with the new ledger's id at once. What is submitted after it is
        journaled after the creation, so it is never durable without it: adds to the
        ledger, or a metadata record naming it, need not wait for the creation first.

        Raises:
            StorageClosedError, StorageFailedError: nothing was created.
        """
        metadata = dict(metadata or {})
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        return _start_ledger(self, metadata)

    def add_entry(self, ledger_id: int, data: bytes) -> Completion[int]:
        """Append an entry; the completion gives its entry id once it is durable.

        Entry ids are dense from 0. Usable from any thread; `await` the completion from
        asyncio. While the write cache is full and its other half is still being flushed,
        this BLOCKS the calling thread (up to `write_cache_wait_ms_max`): an event loop
        calls `try_add_entry` and awaits `cache_space` instead. A lone add is written once
        its completion is first used, or with the next record (`Journal.submit`).

        Raises:
            EntryTooLargeError: above `entry_size_bytes_max`; nothing written.
            LedgerNotFoundError, LedgerFencedError, LedgerClosedError: nothing written.
            StorageFailedError, StorageClosedError: the engine accepts no writes.
            StorageError: the cache stayed full for `write_cache_wait_ms_max` (or, without
                background threads, nobody runs the checkpoint that would free it).
        """
        added = add_one(self, ledger_id, data, journal_may_wait=True)
        return added if added is not None else self.add_entries(ledger_id, [data])

    def add_entries(self, ledger_id: int, entries: Sequence[bytes]) -> Completion[int]:
        """Append a run of entries to one ledger as `add_entry` each, under one hold of the
        lock and as one journal request: they get consecutive entry ids, and the one
        completion gives the LAST id once all of them are durable (the first is that id
        minus `len(entries) - 1`). All or nothing: a refusal writes none of them.

        The caller bounds the run (a connection's SENDs of one socket read): it is
        journaled whole, even beyond `journal_batch_bytes_max`.

        Raises:
            As `add_entry`.
        """
        deadline = time.monotonic() + self.config.write_cache_wait_ms_max / 1000.0
        while True:
            added = add_run(self, ledger_id, entries, journal_may_wait=True)
            if added is not None:
                return added
            if not self.config.background_threads:
                raise StorageError("write cache is full; run a checkpoint")
            with self.lock:
                while self._cache_waits():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StorageError(
                            f"write cache full for {self.config.write_cache_wait_ms_max} ms "
                            f"(write_cache_bytes_max={self.config.write_cache_bytes_max})")
                    self.lock.wait(remaining)
                    self._check_writable()

    def try_add_entry(self, ledger_id: int, data: bytes) -> Completion[int] | None:
        """`add_entry` that never waits: None (nothing written) while the write cache is
        full and its other half is still being flushed, or while the journal's queue is
        full (`Journal.has_room_for_adds`); `cache_space()` tells when to try again. Takes
        the storage lock only for in-memory work.

        Raises:
            As `add_entry`, but never for a full cache.
        """
        return add_one(self, ledger_id, data, journal_may_wait=False)

    def try_add_entries(self, ledger_id: int, entries: Sequence[bytes]) -> Completion[int] | None:
        """`add_entries` that never waits, as `try_add_entry`: None (none written) when the
        cache is full, or the journal's queue has no room for the whole run.

        Raises:
            As `add_entry`, but never for a full cache.
        """
        return add_run(self, ledger_id, entries, journal_may_wait=False)

    def try_add_runs(self, runs: Sequence[tuple[int, Sequence[bytes]]]) -> AddedRuns | None:
        """`try_add_entries` for runs of several ledgers (ledger id, entries) as one write
        (`_adds.py`): one lock hold, and one completion that finishes once every run is
        durable (or fails for all); returns each run's last entry id with it. None (none
        written) as `try_add_entries`; a refusal of any run writes none of them.

        Raises:
            As `add_entry` for any of the runs, but never for a full cache.
        """
        return add_runs(self, runs, journal_may_wait=False)

    def cache_space(self) -> Completion[None]:
        """Finishes once `try_add_entry` may accept an entry again: the journal's writer
        took a batch from its full queue, the flushing half is written out, or the engine
        stopped or closed (the next try then raises). Already finished when there is room
        now. Never blocks."""
        journal = self.journal
        if journal is not None and not journal.has_room_for_adds():
            return journal.room_for_adds()
        with self.lock:
            if not self._cache_waits() or self.failed is not None or self.closed:
                return Completion.resolved(None)
            waiter: Completion[None] = Completion()
            self._space_waiters.append(waiter)
            return waiter

    def _cache_waits(self) -> bool:
        """Whether an add would have to wait for cache space. Lock held."""
        return self.cache.active_full() and self.cache.flushing is not None

    def _wake_space_waiters(self) -> None:
        """The cache may have room (a flush finished) or the engine stopped: finish every
        `cache_space` waiter (outside the lock: their callbacks may call back in)."""
        with self.lock:
            waiters, self._space_waiters = self._space_waiters, []
        for waiter in waiters:
            waiter.set_result(None)

    def fence(self, ledger_id: int) -> Completion[int]:
        """Fence a ledger: later adds fail with LedgerFencedError (adds already accepted
        still complete). The completion finishes once the fence is durable, and gives
        the last entry accepted before the fence (the LAC once those adds complete).
        Fencing a closed or fenced ledger is a no-op."""
        return _fence(self, ledger_id)

    def close_ledger(self, ledger_id: int) -> Completion[int]:
        """Close a ledger at its last accepted entry; the completion gives that entry id
        once the close (and so every entry before it) is durable."""
        return _close_ledger(self, ledger_id)

    def close_ledgers(self, ledger_ids: Sequence[int]) -> list[Completion[int]]:
        """`close_ledger` for each of `ledger_ids`, with one lock hold and one journal
        submission (a broker closing many topics at once). A ledger that does not exist gets
        a failed completion; the others are closed as `close_ledger` would.

        Raises:
            StorageFailedError, StorageClosedError: nothing was closed.
        """
        return _end_ledgers(self, ledger_ids, CLOSED)

    def delete_ledgers(self, ledger_ids: Sequence[int]) -> list[Completion[int]]:
        """`delete_ledger` for each of `ledger_ids`, as `close_ledgers` closes them. While
        the disk is full, each is deleted as `delete_ledger` does it then (at once).

        Raises:
            StorageFailedError, StorageClosedError: nothing was deleted (while the disk is
                full: the ones before the failing one were).
        """
        if self.full:
            return one_by_one(self.delete_ledger, ledger_ids)
        return _end_ledgers(self, ledger_ids, DELETED)

    def delete_ledger(self, ledger_id: int) -> Completion[int]:
        """Delete a ledger. Its entries become unreadable at once; their space is
        reclaimed by later checkpoints and GC. The completion finishes once durable.
        While the disk is full, the deletion is committed at once and frees the entry logs
        it leaves without live data (see the module comment)."""
        if self.full:
            with self._resume_lock:
                if self.full:
                    return self._delete_while_full(ledger_id)
        return _delete_ledger(self, ledger_id)

    def journal_meta(self, ops: list[MetaOp]) -> Completion[int]:
        """Internal (`MetadataStore.apply_journaled`): put the operations in the cache's
        overlay (reads see them at once) and journal them as one META_BATCH record.

        Raises:
            StorageFailedError, StorageClosedError: nothing was applied.
        """
        payload = encode_meta_ops(ops)
        with self.lock:
            self._check_writable()
            for key, value in ops:
                self.cache.put_meta(key, value)
            return self._journal_op(RecordType.META_BATCH, payload, 0)

    def _journal_op(self, kind: RecordType, payload: bytes, value: int) -> Completion[int]:
        completion: Completion[int] = Completion()
        assert self.journal is not None
        self.journal.submit(JournalRequest(kind, payload, completion, None, value))
        return completion

    def last_add_confirmed(self, ledger_id: int) -> int:
        with self.lock:
            return self._ledger(ledger_id).lac

    def ledger_info(self, ledger_id: int) -> LedgerInfo:
        with self.lock:
            return self._ledger(ledger_id).info()

    def list_ledgers(self, tagged: tuple[str, str] | None = None) -> list[LedgerInfo]:
        """Every ledger that is not deleted, by id; with `tagged` = (key, value), only those
        whose metadata maps key to value (found through an index, not a scan)."""
        with self.lock:
            if tagged is not None:
                return [ledger.info() for ledger in self.ledgers.tagged(*tagged)]
            return [ledger.info() for _, ledger in sorted(self.ledgers.ledgers.items())
                    if ledger.state != DELETED]

    def _ledger(self, ledger_id: int) -> LedgerState:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None or ledger.state == DELETED:
            raise LedgerNotFoundError(f"ledger {ledger_id} does not exist")
        return ledger

    def _writable_ledger(self, ledger_id: int) -> LedgerState:
        ledger = self._ledger(ledger_id)
        if ledger.state == FENCED:
            raise LedgerFencedError(f"ledger {ledger_id} is fenced")
        if ledger.state == CLOSED:
            raise LedgerClosedError(f"ledger {ledger_id} is closed")
        return ledger

    def _check_writable(self) -> None:
        if self.failed is not None:
            # The one failure is raised to every caller from now on: each raise starts its
            # traceback afresh, or the frames of every earlier raise would pile up on it.
            raise self.failed.with_traceback(None)
        if self.closed:
            raise StorageClosedError(f"storage {self.data_dir} is closed")

    # -- journal callbacks (run in the journal's threads) --------------------------------

    def _on_durable(self, requests: list[JournalRequest]) -> None:
        for request in requests:  # (every add of a group passes here: kept lean)
            ledger = request.ledger
            entry_id = request.entry_id
            if isinstance(ledger, LedgerState):
                assert entry_id - request.records == ledger.lac, "adds become durable in order"
                ledger.lac = entry_id
            elif request.kind == _DELETE:  # a tombstone: purged once a mark passes here
                assert self.journal is not None
                self.ledgers.tombstones.append((self.journal.acknowledged_end, entry_id))
        set_results([request.completion for request in requests],  # one run (LACs first)
                    [request.entry_id for request in requests])
        if trace.on:
            trace.mark("durable", len(requests))

    def _on_failed(self, requests: list[JournalRequest], error: BaseException) -> None:
        if isinstance(error, StorageFailedError):
            self._mark_failed(error)
        for request in requests:
            if request.completion is not None:
                request.completion.set_exception(error)

    def _mark_failed(self, error: StorageError) -> None:
        with self.lock:
            if self.failed is None:
                self.failed = error
                log.error("storage %s stops accepting writes: %s", self.data_dir, error)
            self.lock.notify_all()
        self._wake_space_waiters()

    # -- reads ---------------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        return self.read_entries(ledger_id, entry_id, entry_id)[0]

    def read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes]:
        """Entries `first`..`last` (inclusive) of a ledger, all at or below its LAC.

        Raises:
            LedgerNotFoundError: no such ledger.
            NoSuchEntryError: the range is empty or goes beyond the LAC.
            CorruptionError: a stored record fails its checks (names file and offset), or
                the index cannot be read (names the index directory).
        """
        with self.lock:
            ledger = self._ledger(ledger_id)
            if first < 0 or last < first or last > ledger.lac:
                raise NoSuchEntryError(
                    f"ledger {ledger_id} has entries 0..{ledger.lac}; asked {first}..{last}")
            found = self.cache.get_range(ledger_id, first, last)
        missing = [first + i for i, data in enumerate(found) if data is None]
        if missing:
            self._fill_from_entry_logs(ledger_id, missing, found, first)
        return [data for data in found if data is not None]

    def try_read_entries(self, ledger_id: int, first: int, last: int) -> list[bytes] | None:
        """`read_entries` served from memory only: None (nothing read) when some entry of
        the range is not in the write cache and would have to come from the disk. Never
        touches the disk; holds the storage lock for a dictionary lookup per entry.

        Raises:
            LedgerNotFoundError, NoSuchEntryError: as `read_entries`.
        """
        with self.lock:
            ledger = self._ledger(ledger_id)
            if first < 0 or last < first or last > ledger.lac:
                raise NoSuchEntryError(
                    f"ledger {ledger_id} has entries 0..{ledger.lac}; asked {first}..{last}")
            found = self.cache.get_range(ledger_id, first, last)
        if any(data is None for data in found):
            return None
        return [data for data in found if data is not None]

    def _fill_from_entry_logs(self, ledger_id: int, missing: list[int],
                              found: list[bytes | None], first: int) -> None:
        for attempt in range(2):
            try:
                located = self.index.locations(ledger_id, missing[0], missing[-1])
                wanted = [(e, loc) for e, loc in located if found[e - first] is None]
                datas = self.logs.reader.read_run(ledger_id, wanted,
                                             self.config.read_batch_bytes_max)
                break
            except FileNotFoundError as exc:
                if attempt == 1:  # not a compaction race: the indexed log is gone
                    raise CorruptionError(
                        f"ledger {ledger_id}: the entry log the index points at is missing",
                        path=str(exc.filename), offset=0) from exc
            except lmdb.Error as exc:  # a damaged index page
                raise CorruptionError(
                    f"ledger {ledger_id}: the index cannot be read ({type(exc).__name__}: "
                    f"{exc})", path=os.path.join(self.data_dir, "index"), offset=0) from exc
        for (entry_id, _), data in zip(wanted, datas, strict=True):
            found[entry_id - first] = data
        absent = [e for e in missing if found[e - first] is None]
        if absent:
            raise NoSuchEntryError(
                f"ledger {ledger_id} entries {absent[:5]} are at or below the LAC but not "
                "stored (see `magnetar storage check`)")

    # -- checkpoints, GC, checks ---------------------------------------------------------

    def checkpoint(self) -> None:
        """Flush the write cache to an entry log and persist the journal mark.

        Raises:
            StorageFailedError: an entry-log write or sync failed; the engine then accepts
                no writes (what was acknowledged stays recoverable from the journal).
        """
        try:
            self.checkpointer.checkpoint()
        finally:
            self._wake_space_waiters()  # the flushed half is free (or the engine failed)

    def gc(self) -> dict[str, int]:
        """Drop entry logs with no live data and compact mostly-dead ones. Returns
        counts of what was done.

        Raises:
            StorageFailedError: an I/O error; the engine then accepts no writes, and
                reopening the directory removes whichever copy GC left unreferenced.
        """
        return self.collector.collect()

    @property
    def write_cache_bytes(self) -> int:
        """Entry bytes in the write cache (both halves), read without the lock: a figure
        for reports, possibly a moment old."""
        return self.cache.total_bytes()

    @property
    def entry_log_bytes(self) -> int:
        """Bytes of the entry logs on disk as the index records them (committed data),
        read without the lock like `write_cache_bytes`."""
        return sum(record.size for record in list(self.logs.records.values()))

    def check(self) -> CheckReport:
        """Verify the index against the entry logs and each ledger's 0..LAC."""
        from ._check import check_storage

        return check_storage(self)

    def inspect(self) -> InspectReport:
        from ._check import inspect_storage

        return inspect_storage(self)

    def pump(self) -> bool:
        """Without background threads: write and sync what the journal has queued."""
        assert self.journal is not None
        return self.journal.pump()

    def wait(self, completion: Completion[T], timeout: float | None = None) -> T:
        """The completion's result; without background threads, pumps the journal."""
        if self.config.background_threads:
            return completion.result(timeout)
        while not completion.done() and self.pump():
            pass
        return completion.result(0)

    def _failure(self) -> StorageError | None:
        """What stopped the engine, if anything (the checkpointer's and GC's probe)."""
        return self.failed

    def fail_with(self, error: StorageFailedError) -> None:
        """Internal: a fatal I/O error outside the journal (checkpoint, GC)."""
        self._mark_failed(error)
        if self.journal is not None:
            self.journal.fail(error)

    def _background_loop(self) -> None:
        interval = self.config.checkpoint_interval_ms / 1000.0
        while not self._stop.is_set():
            self._checkpoint_wanted.wait(interval)
            self._checkpoint_wanted.clear()
            if self._stop.is_set() or self.failed is not None:
                return
            self._run_quietly(self.checkpoint)
            if time.monotonic() - self._last_gc >= self.config.gc_interval_ms / 1000.0:
                self._last_gc = time.monotonic()
                self._run_quietly(self.gc)

    def _run_quietly(self, step: Callable[[], object]) -> None:
        try:
            step()
        except StorageError as exc:
            log.error("background %s failed: %s", getattr(step, "__name__", step), exc)


from ._check import CheckReport, InspectReport  # noqa: E402  (type names for the API)
