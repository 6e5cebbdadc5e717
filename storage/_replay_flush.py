"""The flushes of a journal replay: the write-cache halves that fill up while `recover`
replays the journal go to entry logs and the index one at a time, in a helper thread (with
background threads) while replay goes on into the other half. See `ReplayFlusher`.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import TYPE_CHECKING, Protocol

from ._config import StorageConfig
from ._journal import JournalMark
from ._ledger import LedgerTable
from ._write_cache import WriteCache

if TYPE_CHECKING:
    from ._checkpoint import Checkpointer
    from ._index import LedgerRecord
    from ._write_cache import CacheHalf

__all__ = ["FlushTarget", "ReplayFlusher"]

log = logging.getLogger(__name__)


class FlushTarget(Protocol):
    """What a replay's flushes use of the engine (`_recovery.RecoveryTarget` extends it)."""

    config: StorageConfig
    cache: WriteCache
    ledgers: LedgerTable
    checkpointer: Checkpointer
    lock: threading.Condition


class ReplayFlusher:
    """Flushes the write-cache halves that fill up during replay: in order, one at a time,
    each committing the mark just past its last record.

    With background threads a flush runs in a helper thread while replay goes on into
    the other half; its entry-log writes, fdatasync and LMDB commit release the GIL, so
    the disk works while the journal is parsed. Without them (deterministic simulations)
    every flush runs in line, as all other I/O does.

    A flush holds the checkpoint lock from its start (taken by the replaying thread, before
    the cache swap) to its end (released by the flush, once its half has left the cache
    under the storage lock): a checkpoint, GC, `check` or a close after a `detach`ed open
    thereby waits for it, and never finds a half still flushing.
    """

    def __init__(self, store: FlushTarget):
        self._store = store
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._handoff = threading.Lock()  # who reports a failed flush: `wait` or the flush
        self._detached = False

    def flush(self, mark: JournalMark) -> None:
        """Wait for the previous flush, then flush the active half, covered by `mark`.

        Raises the previous flush's error (an OSError, a StorageError).
        """
        self.wait()
        store = self._store
        store.checkpointer.lock.acquire()  # released by `_run`
        try:
            half = store.cache.swap()
            records, purge = store.ledgers.take_changes()
        except BaseException:
            store.checkpointer.lock.release()
            raise
        job = partial(self._run, half, records, purge, mark)
        if not store.config.background_threads:
            job()
            self.wait()
            return
        self._thread = threading.Thread(target=job, name="storage-replay-flush", daemon=True)
        self._thread.start()

    def _run(self, half: CacheHalf, records: list[LedgerRecord], purge: list[int],
             mark: JournalMark) -> None:
        store = self._store
        try:
            store.checkpointer.flush(half, records, purge, mark)
            with store.lock:
                store.cache.clear_flushing()
                store.lock.notify_all()
        except BaseException as exc:  # the half stays, as after a failed checkpoint
            with self._handoff:
                self._error = exc
                detached = self._detached
            if detached:  # the open has returned: fail the engine as a checkpoint would
                store.checkpointer.fail(exc)
        finally:
            store.checkpointer.lock.release()

    @property
    def busy(self) -> bool:
        """A flush may be under way (not waited for yet)."""
        return self._thread is not None

    def wait(self) -> None:
        """Wait for the flush under way, if any; once it succeeded its half has left the
        cache. Raises its error (the half then stays, as after a failed checkpoint)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def detach(self) -> None:
        """Stop waiting for the flush under way (`recover(flush_in_background=True)`): from
        now on it fails the engine itself if it fails. Raises its error when it has
        already failed."""
        with self._handoff:
            self._detached = True
            error, self._error = self._error, None
        if error is not None:
            raise error

    def wait_quietly(self) -> None:
        """`wait` while another error is on its way out: a flush error is only logged."""
        try:
            self.wait()
        except BaseException as exc:
            log.error("journal replay stopped; the flush under way failed too: %s", exc)
