"""The journal: an append-only log of records with group commit.

Theory of operation
-------------------
Every change to storage (an entry added, a ledger created, fenced, closed or deleted, a
metadata-store batch) is first applied in memory and then submitted here as a record. A
record's completion finishes only after the fdatasync that covers it.

Two threads do the work (or, with `background_threads=False`, the caller pumps both steps
in its own thread, deterministically):

* The writer takes every queued request (up to `journal_batch_bytes_max`), encodes them
  into one buffer, ends it with a PAD record to the alignment boundary (carrying the LSN
  synced so far, see `_journal_format.py`), and issues one `pwrite`. It then hands the
  batch to the syncer and goes on with the next batch; when nothing else is queued and no
  sync is under way it syncs the batch itself instead (no hand-off for a lone add).
* The syncer takes every batch handed over, issues ONE fdatasync for all of them, moves the
  in-memory mark to the end of the last one and calls `on_durable` with their requests.

While the syncer waits on the disk, requests pile up, so the next batch is larger: the
group grows with the load without any artificial delay, and a single request in flight
costs one write and one fdatasync. A thread that blocks on an add while the journal is idle
takes both roles for it (`try_lead`); a lone `add_entry` then wakes no thread at all.

Segments are preallocated with zeros (1 MiB when created, then `journal_prealloc_bytes` at
a time) so that a sync need not update the file's size; a zero record header ends the data.
A segment rolls over at `journal_segment_bytes_max`: the writer waits for the syncer to
drain, syncs and closes the old segment, and only then creates the next one, so that only
the newest segment can ever end in a torn record. A new segment is created on every open;
the journal never appends to a segment written by an earlier run.

Failure: an OSError from a write or a sync is fatal. Every request not yet durable fails
with `StorageFailedError`, later submissions fail at once, and the journal writes nothing
more. Reopening the data directory recovers from what is on disk. The journal remembers
where the last batch whose requests succeeded ends (`acknowledged_end`); once stopped,
`discard_unacknowledged` cuts everything after it (the failed requests' records, whole or
torn), so that a recovery in the same process (`Storage.try_resume_writes`, after a full
disk) replays exactly what was acknowledged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from ._completion import Completion
from ._config import StorageConfig
from ._errors import StorageClosedError, StorageFailedError, journal_io_error
from ._fs import FileSystem
from ._journal_batch import (
    CountedCondition,
    JournalRequest,
    _Batch,
    _Segment,
    create_segment,
    cut_after,
    delete_segments_before,
    encode_batch,
)
from ._journal_format import (
    JournalMark,
    parse_segment_name,
    segment_file_name,
)
from ._stats import StorageMetrics

__all__ = ["Journal", "JournalMark", "JournalRequest", "parse_segment_name", "segment_file_name"]

log = logging.getLogger(__name__)



DurableCallback = Callable[[list[JournalRequest]], None]
FailedCallback = Callable[[list[JournalRequest], BaseException], None]


class Journal:
    """The write-ahead journal of one data directory (see the module comment)."""

    def __init__(self, fs: FileSystem, directory: str, config: StorageConfig, *,
                 segment_id: int, last_lsn: int, on_durable: DurableCallback,
                 on_failed: FailedCallback, metrics: StorageMetrics | None = None):
        assert segment_id >= 1
        assert last_lsn >= 0
        self._fs = fs
        self._dir = directory
        self._config = config
        self._on_durable = on_durable
        self._on_failed = on_failed
        # fsync latency and group-commit size (one writer: whoever holds the syncer role),
        # bytes written (the writer role).
        self.metrics = metrics if metrics is not None else StorageMetrics()
        # `with self._mutex` is `with self._lock` without its Python-level wrappers (the
        # per-add paths use it).
        self._mutex = lock = threading.RLock()
        self._lock = CountedCondition(lock)  # (its notify_all is cheap with nobody waiting)
        # The writer's own condition (same lock): a submission wakes only the writer, and
        # only while it waits (`_writer_idle`).
        self._writer_wake = threading.Condition(lock)
        self._writer_idle = False
        # The syncer's own condition (same lock): woken when there may be a batch to sync or
        # the journal stops (`_notify_all`), not by every step of the writer.
        self._syncer_wake = threading.Condition(lock)
        self._queue: deque[JournalRequest] = deque()
        self._queued_records = 0  # records of the queued requests (a run of adds counts each)
        self._queued_bytes = 0  # their `size`
        self._room_waiters: list[Completion[None]] = []  # one per waiting managed ledger
        # Adds stop here (`has_room_for_adds`): a tenth of the queue stays for the records that
        # must not wait behind adds (cursor updates, ledger closes), so their submit never blocks.
        limit = config.journal_queue_requests_max
        self.add_requests_max = max(1, limit - limit // 10)
        self._sync_queue: deque[_Batch] = deque()
        self._sync_busy = False
        self._failed: StorageFailedError | None = None
        self._closing = False
        self._writer_done = False
        self._sync_now = False
        self._writing = False  # a thread owns the writer role (writer thread or a leader)
        self._leading = False  # a caller's thread owns the syncer role for its own batch
        self._next_lsn = last_lsn + 1
        self._segment = self._create_segment(segment_id)
        self.synced_mark = JournalMark(segment_id, self._segment.position, last_lsn)
        # (segment id, offset): the end of the last batch whose requests succeeded.
        self.acknowledged_end = (segment_id, self._segment.position)
        self._stopped = False
        self._last_sync_monotonic = time.monotonic()
        self._threads: list[threading.Thread] = []
        if config.background_threads:
            self._threads = [
                threading.Thread(target=self._writer_loop, name="journal-writer", daemon=True),
                threading.Thread(target=self._syncer_loop, name="journal-syncer", daemon=True),
            ]
            for thread in self._threads:
                thread.start()
        # `Completion.before_blocking` of an add: one bound method for all of them.
        self.lead: Callable[[], bool] = self.try_lead

    # -- segments ------------------------------------------------------------------------

    @property
    def current_segment_id(self) -> int:
        return self._segment.segment_id

    def _create_segment(self, segment_id: int) -> _Segment:
        return create_segment(self._fs, self._dir, self._config, segment_id, self._next_lsn)

    def _roll_over(self) -> None:
        """Close the full segment once everything in it is durable, then open the next."""
        self._wait_syncer_idle()
        old = self._segment
        old.handle.fdatasync()
        old.handle.close()
        self._segment = self._create_segment(old.segment_id + 1)
        log.info("journal rolled over to segment %d", self._segment.segment_id)

    def _wait_syncer_idle(self) -> None:
        if not self._threads:
            self._sync_once()
            return
        with self._lock:
            self._sync_now = True
            self._notify_all()
            while (self._sync_queue or self._sync_busy) and self._failed is None:
                self._lock.wait()
            if self._failed is not None:
                raise self._failed

    def delete_segments_before(self, mark_segment_id: int) -> list[int]:
        """Delete segments older than the persisted mark's segment, keeping the newest
        `journal_segments_kept_max` of them. Never touches the marked or current one."""
        assert mark_segment_id <= self._segment.segment_id
        return delete_segments_before(self._fs, self._dir, mark_segment_id,
                                      self._config.journal_segments_kept_max)

    # -- submitting ----------------------------------------------------------------------

    def submit(self, request: JournalRequest, *, defer_wake: bool = False) -> None:
        """Queue a record. Its completion (if any) finishes once the record is durable, or
        fails with `StorageFailedError`. Blocks while `journal_queue_requests_max` requests
        are queued.

        `defer_wake` (`Storage.add_entry`): a lone request into an idle journal whose
        caller may lead it (`try_lead`) does not wake the writer (a system call on the add's
        path and a context switch), as its caller most likely blocks and writes it itself;
        its completion wakes the writer on any other first use (`Completion.wake_work`), as
        does a lead that cannot start. Until then it waits for the next record or `close`."""
        with self._mutex:
            if (self._failed is None and not self._closing
                    and self._queued_records < self._config.journal_queue_requests_max):
                self._queue.append(request)  # the common case, first
                self._queued_records += request.records
                self._queued_bytes += request.size
                if self._writer_idle and not self._writing:  # (a leader wakes it after)
                    completion = request.completion
                    if (defer_wake and completion is not None
                            and completion.before_blocking is not None
                            and len(self._queue) == 1 and not self._sync_busy
                            and not self._sync_queue and self._config.journal_sync):
                        completion.wake_work = self.wake_writer
                    else:
                        self._writer_wake.notify()
                return
        self.submit_many([request])  # failed, closing or full: the slow path

    def wake_writer(self) -> None:
        """Wake the idle writer if anything is queued (see `submit`)."""
        with self._mutex:
            if self._queue and self._writer_idle and not self._writing:
                self._writer_wake.notify()

    def submit_many(self, requests: list[JournalRequest]) -> None:
        """`submit` each of `requests` in order, with one hold of the lock and one wake-up of
        the writer. The list is one submission: it blocks only while the queue is full before
        it, and may take the queue past `journal_queue_requests_max` as one long run may."""
        with self._lock:
            if self._failed is not None or self._closing:
                self._fail_requests(requests, self._failed or StorageClosedError("journal closed"))
                return
            while self._queued_records >= self._config.journal_queue_requests_max:
                self._lock.wait()
                if self._failed is not None:
                    self._fail_requests(requests, self._failed)
                    return
            self._queue.extend(requests)
            self._queued_records += sum([request.records for request in requests])
            self._queued_bytes += sum([request.size for request in requests])  # lists: no genexpr
            self._writer_wake.notify()  # (the writer may not be idle: harmless)

    def has_room_for_adds(self, records: int = 1) -> bool:
        """Whether `records` adds fit below `add_requests_max` now, or nothing is queued (a
        longer run then goes alone; its caller bounds it): `submit` would not wait."""
        with self._mutex:
            queued = self._queued_records
            return queued == 0 or queued + records <= self.add_requests_max

    def room_for_adds(self) -> Completion[None]:
        """Finishes once `has_room_for_adds` may say yes again: the writer took a batch, or
        the journal failed or is closing (the next add then raises). Never blocks."""
        with self._lock:
            if (self._queued_records < self.add_requests_max or self._failed is not None
                    or self._closing):
                return Completion.resolved(None)
            waiter: Completion[None] = Completion()
            self._room_waiters.append(waiter)
            return waiter

    def _wake_room_waiters(self) -> None:
        """Lock held: their callbacks only hand work to an event loop."""
        waiters, self._room_waiters = self._room_waiters, []
        for waiter in waiters:
            waiter.set_result(None)

    def try_lead(self) -> bool:
        """Write and sync what is queued in the caller's own thread, if the journal is
        otherwise idle; returns True if it did.

        Called by a thread about to block on an add's completion. A lone request (one
        add in flight) would otherwise cost three thread hand-offs (caller → writer →
        syncer → caller), each a wake-up on another CPU. When nothing is being written or
        synced, the waiting thread takes both roles for one batch instead; when anything
        is in progress it returns False at once and the background threads carry on with
        group commit as usual.
        """
        with self._mutex:
            if (self._writing or self._sync_busy or self._sync_queue or not self._queue
                    or self._failed is not None or self._closing or not self._threads
                    or not self._config.journal_sync):
                self.wake_writer()  # `submit` may have left it asleep
                return False
            self._writing = True
            self._leading = True
            taken = self._take_batch()
        segment = None
        try:
            segment = self._write_and_queue(*taken)
            if self._sync_queue:  # handed over, not synced inline (only a leader can now)
                self._sync_once()
        finally:
            rolls = (segment is not None  # (the syncer must be free to sync before it)
                     and segment.position >= self._config.journal_segment_bytes_max)
            self._end_lead(syncing=True, writing=not rolls)
            if segment is not None and rolls:
                self._maybe_roll_over(segment)
                self._end_lead(syncing=False, writing=True)
        return True

    def _end_lead(self, *, syncing: bool, writing: bool) -> None:
        """A leader gives up the syncer role and/or the writer role, waking whichever
        thread has work left (only those: each wake-up costs a context switch)."""
        with self._mutex:
            if syncing:
                self._leading = False
            if writing:
                self._writing = False
            self._lock.notify_all()
            if syncing and self._sync_queue:  # handed over while leading: the syncer's turn
                self._syncer_wake.notify()
            if writing and (self._queue or self._closing or self._failed is not None):
                self._writer_wake.notify()

    def pump(self) -> bool:
        """Without background threads: write and sync what is queued; whether it did."""
        assert not self._threads
        return self._write_once() | self._sync_once()

    def pending(self) -> int:  # records queued or written, not yet acknowledged
        with self._lock:
            return self._queued_records + sum(r.records for b in self._sync_queue
                                              for r in b.requests)

    # -- the writer ----------------------------------------------------------------------

    def _take_batch(self) -> tuple[list[JournalRequest], int]:
        """Take queued requests up to the batch byte limit (at least one), and count their
        records. Lock held."""
        limit = self._config.journal_batch_bytes_max
        queue = self._queue
        if self._queued_bytes <= limit:  # all of them (the common case: no loop over each)
            taken = list(queue)
            queue.clear()
            records = self._queued_records
            self._queued_records = self._queued_bytes = 0
        else:
            taken = []
            size = records = 0
            while queue and (not taken or size + queue[0].size <= limit):
                request = queue.popleft()
                size += request.size
                records += request.records
                taken.append(request)
            self._queued_records -= records
            self._queued_bytes -= size
        self._lock.notify_all()  # room for submissions waiting in `submit`
        if self._room_waiters and self._queued_records < self.add_requests_max:
            self._wake_room_waiters()
        return taken, records

    def _writer_loop(self) -> None:
        while True:
            with self._lock:
                while (not self._queue or self._writing) and not self._closing \
                        and self._failed is None:
                    self._writer_wait()
                while self._writing and self._failed is None:  # a leader finishes first
                    self._writer_wait()
                if self._failed is not None or (self._closing and not self._queue):
                    self._writer_done = True
                    self._notify_all()
                    return
                self._writing = True
                taken = self._take_batch()
            try:
                self._write_requests(*taken)
            finally:
                with self._lock:
                    self._writing = False
                    self._lock.notify_all()

    def _writer_wait(self) -> None:  # lock held
        self._writer_idle = True
        try:
            self._writer_wake.wait()
        finally:
            self._writer_idle = False

    def _write_once(self) -> bool:
        with self._lock:
            if not self._queue or self._failed is not None:
                return False
            taken = self._take_batch()
        self._write_requests(*taken)
        return True

    def _write_requests(self, requests: list[JournalRequest], records: int) -> None:
        segment = self._write_and_queue(requests, records)
        if segment is not None:
            self._maybe_roll_over(segment)

    def _write_and_queue(self, requests: list[JournalRequest], records: int) -> _Segment | None:
        """Encode and write one batch and hand it to the syncer; returns the segment
        written to, or None when the journal failed (the requests failed with it)."""
        segment = self._segment
        try:
            batch = self._encode(requests, segment)
            self._fs.point("journal:before-write")
            self._write_batch_bytes(segment, batch)
        except OSError as exc:
            self._fail(requests, journal_io_error(exc, segment.handle.path))
            return None
        done = _Batch(segment, segment.position, self._next_lsn - 1, requests,
                      records)
        if not self._config.journal_sync:
            self.acknowledged_end = (segment.segment_id, segment.position)
            self._on_durable(requests)
            done.requests = []
        with self._mutex:
            failed = self._failed
            # Nothing else to write and no sync under way: sync here rather than wake the
            # syncer (one thread hand-off less for a lone add); else hand over and go on.
            inline = (failed is None and bool(self._threads) and self._config.journal_sync
                      and not self._queue and not self._sync_queue and not self._sync_busy)
            if inline:
                self._sync_busy = True
            elif failed is None:
                self._sync_queue.append(done)
                self._notify_all()
        if failed is not None:
            # The journal failed while this batch was being written (a checkpoint or a sync
            # failed meanwhile): the syncer has stopped, so the batch must fail here.
            self._fail_requests(done.requests, failed)
            return None
        if inline:
            self._sync_batches([done])
        return segment

    def _maybe_roll_over(self, segment: _Segment) -> None:
        if segment.position >= self._config.journal_segment_bytes_max:
            try:
                self._roll_over()
            except (OSError, StorageFailedError) as exc:
                # StorageFailedError: the sync the rollover waited for failed.
                self._fail([], journal_io_error(exc, segment.handle.path))

    def _encode(self, requests: list[JournalRequest], segment: _Segment) -> bytearray:
        out, self._next_lsn = encode_batch(requests, segment, self._next_lsn,
                                           self._config.journal_alignment_bytes,
                                           self.synced_mark.lsn)
        return out

    def _write_batch_bytes(self, segment: _Segment, batch: bytearray) -> None:
        segment.write(batch, self._config.journal_prealloc_bytes)
        self.metrics.journal_bytes_written += len(batch)

    # -- the syncer ----------------------------------------------------------------------

    def _syncer_loop(self) -> None:
        while self._wait_for_sync_work():
            self._sync_once()

    def _wait_for_sync_work(self) -> bool:
        """Block until there is a batch to sync now; False when the syncer should stop.
        With `journal_sync=False` batches wait until `journal_sync_interval_ms` has passed
        since the last sync, unless a rollover or close asks for a sync at once."""
        interval = self._config.journal_sync_interval_ms / 1000.0
        with self._lock:
            while True:
                if self._failed is not None:
                    return False
                if self._sync_queue and not self._leading:
                    if self._config.journal_sync or self._closing or self._sync_now:
                        self._sync_now = False
                        return True
                    remaining = interval - (time.monotonic() - self._last_sync_monotonic)
                    if remaining <= 0:
                        return True
                    self._syncer_wake.wait(remaining)
                    continue
                if self._closing and self._writer_done:
                    return False
                self._syncer_wake.wait()

    def _sync_once(self) -> bool:
        with self._mutex:
            if not self._sync_queue or self._failed is not None:
                return False
            batches = list(self._sync_queue)
            self._sync_queue.clear()
            self._sync_busy = True
        self._sync_batches(batches)
        return True

    def _sync_batches(self, batches: list[_Batch]) -> None:
        """One fdatasync for `batches` (the caller holds the syncer role), then completes."""
        last = batches[-1]
        try:
            self._fs.point("journal:before-sync")
            started_ns = time.perf_counter_ns()
            last.segment.handle.fdatasync()
            self.metrics.journal_fsync_us.add((time.perf_counter_ns() - started_ns) // 1000)
            self.metrics.group_commit_records.add(sum(b.records for b in batches))
            # A simulated crash just after the sync: the batch is on disk but nobody hears
            # of it (allowed: durable without an acknowledgment). Inside the try so that the
            # syncer thread fails the requests instead of dying with them unanswered.
            self._fs.point("journal:after-sync")
        except OSError as exc:
            with self._lock:
                self._sync_busy = False
            self._fail([r for b in batches for r in b.requests],
                       journal_io_error(exc, last.segment.handle.path))
            return
        self._last_sync_monotonic = time.monotonic()
        assert last.end_offset >= self.synced_mark.offset or \
            last.segment.segment_id > self.synced_mark.segment_id
        self.synced_mark = JournalMark(last.segment.segment_id, last.end_offset, last.last_lsn)
        requests = last.requests if len(batches) == 1 else [
            r for b in batches for r in b.requests]
        if self._config.journal_sync:
            self.acknowledged_end = (last.segment.segment_id, last.end_offset)
        if requests:
            self._on_durable(requests)
        with self._mutex:
            self._sync_busy = False
            self._lock.notify_all()  # a rollover waiting for the syncer to be idle

    def _notify_all(self) -> None:  # lock held: wake the writer, the syncer, room waiters
        self._lock.notify_all()
        self._writer_wake.notify_all()
        self._syncer_wake.notify_all()

    # -- failure and shutdown ------------------------------------------------------------

    @property
    def failed(self) -> StorageFailedError | None:
        return self._failed

    def fail(self, error: StorageFailedError) -> None:
        """Stop writing: another part of the engine hit a fatal I/O error."""
        self._fail([], error)

    def _fail(self, requests: list[JournalRequest], error: StorageFailedError) -> None:
        with self._lock:
            first = self._failed is None
            if first:
                self._failed = error
            pending = list(self._queue) + [r for b in self._sync_queue for r in b.requests]
            self._queue.clear()
            self._queued_records = self._queued_bytes = 0
            self._sync_queue.clear()
            self._notify_all()
            self._wake_room_waiters()
        if first:
            log.error("journal failed, refusing further writes: %s", error)
        self._fail_requests(requests + pending, self._failed or error)

    def _fail_requests(self, requests: list[JournalRequest], error: BaseException) -> None:
        if requests:
            self._on_failed(requests, error)

    def close(self) -> None:
        """Write and sync everything queued, stop the threads and close the segment."""
        with self._lock:
            self._closing = True
            self._notify_all()
            self._wake_room_waiters()
        if self._threads:
            for thread in self._threads:
                thread.join()
        else:
            while self.pump():
                pass
        with self._lock:
            leftovers = list(self._queue) + [r for b in self._sync_queue for r in b.requests]
            self._queue.clear()
            self._queued_records = self._queued_bytes = 0
            self._sync_queue.clear()
        self._fail_requests(leftovers, self._failed or StorageClosedError("journal is closed"))
        try:
            if self._failed is None:
                self._segment.handle.fdatasync()
        except OSError as exc:
            log.error("final journal sync failed: %s", exc)
        finally:
            self._segment.handle.close()

    def rebind(self, on_durable: DurableCallback, on_failed: FailedCallback) -> None:
        """Report to other callbacks from now on (a recovered engine taking over)."""
        self._on_durable = on_durable
        self._on_failed = on_failed

    def discard_unacknowledged(self) -> None:
        """Cut what follows `acknowledged_end`: truncate its segment there and remove any
        later segment. Only once stopped (`abandon`), after a failure.

        Raises:
            OSError: the truncation failed; the directory is as a crash would leave it.
        """
        assert self._stopped
        assert self._failed is not None
        cut_after(self._fs, self._dir, *self.acknowledged_end)

    def abandon(self) -> None:
        """Stop the threads without writing anything more (a simulated crash). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        with self._lock:
            if self._failed is None:
                self._failed = StorageFailedError("journal abandoned")
            self._closing = True
            self._notify_all()
            self._wake_room_waiters()
        for thread in self._threads:
            thread.join()
        self._segment.handle.close()
