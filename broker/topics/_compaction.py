"""`TopicCompaction`: a persistent topic's compacted view and the compactions that renew it.

Theory of operation
-------------------
The view in force is a `CompactedLedger` (`ledger/_compacted.py`, which says where it is
recorded). `load` rebuilds it from the `__compaction` cursor and deletes every compacted ledger
of the topic that the cursor does not name: those a compaction wrote but never switched to.

A compaction (`trigger`: the admin API, `magnetar topics compact`, or the service's check of
the `compactionThreshold` policy) runs as one background task of the topic, at most one at a
time; `status` and `last_error` are what `GET .../compaction` reports (Pulsar's
LongRunningProcessStatus: NOT_RUN, RUNNING, SUCCESS, ERROR). Its steps:

1. open (create at the earliest entry) the durable `__compaction` cursor; the new horizon is
   the topic's last entry now; nothing new since the previous horizon is a success;
2. phase one in a worker thread (`_compactor.latest_per_key`) over the previous compacted
   ledger and the topic's entries after the previous horizon up to the new one;
3. create the new ledger (tagged as the topic's compacted ledger), then phase two chunk by
   chunk: a worker thread reads and filters (`_compactor.retained_entries`), the loop appends,
   each chunk awaited durable; then the ledger is closed (durable);
4. switch: ONE cursor write sets the mark-delete to the new horizon and the property to the
   new ledger (`ManagedCursor.mark_delete(..., properties=...)`);
5. the new view is in force (subscriptions reading it kick again); the previous ledger is
   deleted.

A failure or a crash before step 4 leaves the previous view in force; the new ledger is
deleted at once (a crash: when the topic next loads). A step-4 write that fails may still
reach the disk with a later write of the same cursor, so its new ledger is adopted, not
deleted, whenever the cursor's memory already names it.

The threshold (`maybe_trigger`) compares the `__compaction` cursor's backlog in bytes
(estimated from ledger sizes; the whole topic before the first compaction) with the topic's
`compactionThreshold` policy (0: never), as Pulsar's compaction monitor does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from magnetar.storage import LedgerNotFoundError, LedgerStorage

from .._tasks import spawn
from ..ledger._compacted import (
    COMPACTED_LEDGER_PROPERTY,
    COMPACTED_LEDGER_TAG,
    COMPACTION_CURSOR_NAME,
    CompactedLedger,
    orphan_ledgers,
)
from ..ledger._cursor import ManagedCursor
from ..ledger._managed_ledger import ManagedLedger
from ..ledger._position import Position
from ._compactor import Segment, latest_per_key, retained_entries

if TYPE_CHECKING:
    from ._topic import PersistentTopic

__all__ = ["NOT_RUN", "TopicCompaction"]

log = logging.getLogger(__name__)

NOT_RUN, RUNNING, SUCCESS, ERROR = "NOT_RUN", "RUNNING", "SUCCESS", "ERROR"


class TopicCompaction:
    """One persistent topic's compaction state (see the module comment)."""

    __slots__ = ("_task", "before_switch", "last_error", "runs", "status", "topic", "view")

    def __init__(self, topic: PersistentTopic, view: CompactedLedger | None):
        self.topic = topic
        self.view = view
        self.status = NOT_RUN
        self.last_error = ""
        self.runs = 0  # compactions that switched to a new view
        self._task: asyncio.Task[None] | None = None
        # Test seam: awaited between the new ledger being durable and the switch.
        self.before_switch: Callable[[], Awaitable[None]] | None = None

    @property
    def _ml(self) -> ManagedLedger:
        return self.topic.managed_ledger

    @property
    def _storage(self) -> LedgerStorage:
        return self.topic.managed_ledger.storage

    @classmethod
    async def load(cls, topic: PersistentTopic) -> TopicCompaction:
        """The view the `__compaction` cursor names; other compacted ledgers of the topic
        are deleted (their deletion failing is logged; the next load retries)."""
        ml = topic.managed_ledger
        cursor = ml.cursors.get(COMPACTION_CURSOR_NAME)
        view = None
        ledger_id = None if cursor is None else cursor.properties.get(COMPACTED_LEDGER_PROPERTY)
        if cursor is not None and ledger_id is not None:
            try:
                entries = ml.storage.last_add_confirmed(ledger_id) + 1
            except LedgerNotFoundError:
                log.error("topic %s: its compacted ledger %d is missing; no compacted view",
                          topic.name, ledger_id)
            else:
                view = CompactedLedger(ml.storage, ledger_id, entries,
                                       cursor.mark_delete_position)
        for orphan in orphan_ledgers(ml.storage, ml.name, ledger_id):
            await _delete_ledger(ml.storage, orphan)
            log.info("topic %s: deleted compacted ledger %d that was never in force",
                     topic.name, orphan)
        return cls(topic, view)

    # -- running -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def trigger(self) -> bool:
        """Start a compaction in the background; False when one is already running."""
        if self.running:
            return False
        self.status = RUNNING
        self._task = spawn(self._run(), self.topic.background, f"compaction of {self.topic.name}")
        return True

    async def wait(self) -> None:
        """Until the running compaction (if any) ends."""
        task = self._task
        if task is not None:
            await asyncio.wait([task])

    def backlog_bytes(self) -> int:
        """What the `__compaction` cursor has not compacted yet, in bytes (estimated)."""
        ml = self._ml
        cursor = ml.cursors.get(COMPACTION_CURSOR_NAME)
        if cursor is not None:
            return cursor.estimated_backlog_size_bytes()
        return ml.estimated_size_after(ml.first_position())

    def maybe_trigger(self) -> bool:
        """Trigger when the backlog reached the `compactionThreshold` policy."""
        threshold = self.topic.policies.compaction_threshold_bytes
        if threshold <= 0 or self.running or self.backlog_bytes() < threshold:
            return False
        log.info("topic %s: compaction backlog reached %d bytes; compacting", self.topic.name,
                 threshold)
        return self.trigger()

    async def _run(self) -> None:
        try:
            await self._compact()
        except asyncio.CancelledError:
            self.status, self.last_error = ERROR, "cancelled (the topic closed)"
            raise
        except Exception as exc:
            log.error("compaction of %s failed: %s: %s", self.topic.name, type(exc).__name__,
                      exc)
            self.status, self.last_error = ERROR, f"{type(exc).__name__}: {exc}"
        else:
            self.status, self.last_error = SUCCESS, ""

    async def _compact(self) -> None:
        ml = self._ml
        cursor = await ml.open_cursor(COMPACTION_CURSOR_NAME, "earliest")
        end = ml.last_confirmed_position
        previous = cursor.mark_delete_position
        if end.entry_id < 0 or end <= previous:
            return  # nothing new since the last compaction
        old = self.view
        segments = self._segments(old, previous, end)
        latest = await asyncio.to_thread(latest_per_key, self._storage, segments)
        new_id = await self._storage.create_ledger({COMPACTED_LEDGER_TAG: ml.name})
        try:
            entries = await self._write(new_id, segments, latest)
            if self.before_switch is not None:
                await self.before_switch()
            await self._switch(cursor, new_id, end)
        except BaseException:
            if cursor.properties.get(COMPACTED_LEDGER_PROPERTY) != new_id:
                await _delete_ledger(self._storage, new_id)
            else:  # the switch is in the cursor's memory: it will reach the disk
                self._adopt(new_id, self._storage.last_add_confirmed(new_id) + 1, end, old)
            raise
        self._adopt(new_id, entries, end, old)
        log.info("topic %s compacted up to %s: %d keys in ledger %d", self.topic.name, end,
                 entries, new_id)

    def _segments(self, old: CompactedLedger | None, previous: Position,
                  end: Position) -> list[Segment]:
        """The previous view, then the topic's entries in (previous, end]."""
        segments = []
        if old is not None and old.entries > 0:
            segments.append(Segment(old.ledger_id, 0, old.entries - 1, compacted=True))
        for ledger in self._ml.ledgers():
            if ledger.entries == 0 or ledger.ledger_id < previous.ledger_id \
                    or ledger.ledger_id > end.ledger_id:
                continue
            first = previous.entry_id + 1 if ledger.ledger_id == previous.ledger_id else 0
            last = end.entry_id if ledger.ledger_id == end.ledger_id else ledger.entries - 1
            if first <= last:
                segments.append(Segment(ledger.ledger_id, first, last))
        return segments

    async def _write(self, ledger_id: int, segments: list[Segment],
                     latest: dict[str, Any]) -> int:
        """Phase two into `ledger_id`; returns its entry count once it is closed."""
        storage = self._storage
        count = 0
        for segment in segments:
            for chunk in segment.chunks():
                kept = await asyncio.to_thread(retained_entries, storage, chunk, latest)
                completions = [storage.add_entry(ledger_id, data) for data in kept]
                for completion in completions:
                    await completion
                count += len(kept)
        last = await storage.close_ledger(ledger_id)
        assert last + 1 == count, (last, count)
        return count

    async def _switch(self, cursor: ManagedCursor, ledger_id: int, horizon: Position) -> None:
        properties = dict(cursor.properties)
        properties[COMPACTED_LEDGER_PROPERTY] = ledger_id
        await cursor.mark_delete(horizon, properties=properties)

    def _adopt(self, ledger_id: int, entries: int, horizon: Position,
               old: CompactedLedger | None) -> None:
        self.view = CompactedLedger(self._storage, ledger_id, entries, horizon)
        self.runs += 1
        for subscription in self.topic.all_subscriptions():
            if subscription.compacted.enabled:
                subscription.kick()  # reads the new view
        if old is not None and old.ledger_id != ledger_id:
            spawn(_delete_ledger(self._storage, old.ledger_id), self.topic.background,
                  f"deleting compacted ledger {old.ledger_id}")

    async def delete(self) -> None:
        """The topic is being deleted: cancel a running compaction, delete the view."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
        ml = self._ml
        for ledger_id in orphan_ledgers(self._storage, ml.name, None):
            await _delete_ledger(self._storage, ledger_id)
        self.view = None

    def stats(self) -> dict[str, Any]:
        """Pulsar's LongRunningProcessStatus."""
        return {"status": self.status, "lastError": self.last_error}


async def _delete_ledger(storage: LedgerStorage, ledger_id: int) -> None:
    try:
        await storage.delete_ledger(ledger_id)
    except LedgerNotFoundError:
        pass
    except Exception as exc:  # left behind: the next load deletes it
        log.warning("could not delete compacted ledger %d: %s", ledger_id, exc)
