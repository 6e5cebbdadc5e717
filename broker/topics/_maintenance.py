"""`Maintenance`: the broker service's periodic tasks (a base class of `BrokerService`).

Theory of operation
-------------------
Maintenance (`run_maintenance`, every second from `start`): the stats interval (rates and
per-interval histograms, every `stats_update_frequency_s`, over the topics active since the
last one: `_stats_interval.py`),
time-based retention trimming,
message TTL, backlog quotas (producer hold/exception disconnect producers;
consumer_backlog_eviction skips the slowest cursor), dedup snapshots by time and purging of
inactive producers' dedup state, compaction of topics whose `compactionThreshold` is reached
(`_compaction.py`). Each task honours its own interval; a pass over the loaded topics lets
the event loop run every `MAINTENANCE_TOPICS_PER_TURN` topics. While the disk is full
(`storage_full`: publishes are refused, see `_topic.py`), every
`storage_full_check_interval_s` it asks the storage to resume writes in a worker thread
(`Storage.try_resume_writes`); once there is room, writes resume without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from magnetar.storage import LedgerStorage, StorageError, StorageFullError

from .._config import BrokerConfig
from ._stats_interval import StatsInterval
from ._topic import PersistentTopic

if TYPE_CHECKING:
    from ._service import Topic

__all__ = ["MAINTENANCE_INTERVAL_S", "MAINTENANCE_TOPICS_PER_TURN", "Maintenance"]

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL_S = 1.0
MAINTENANCE_TOPICS_PER_TURN = 500  # topics a maintenance pass handles between loop turns


class Maintenance:
    """The periodic tasks over the service's loaded topics (module comment)."""

    config: BrokerConfig
    storage: LedgerStorage
    clock: Callable[[], float]
    topics: dict[str, Topic]
    closed: bool
    stats_interval: StatsInterval
    _last_run: dict[str, float]

    @property
    def storage_full(self) -> bool:
        """Whether the storage refuses writes because the disk is full."""
        return isinstance(self.storage.failed, StorageFullError)

    async def _maintenance_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            try:
                await self.run_maintenance()
            except Exception as exc:  # keep the loop alive; the next round retries
                log.error("maintenance failed: %s", exc)

    def _due(self, task: str, interval_s: float, now: float) -> bool:
        last = self._last_run.get(task)
        if last is not None and now - last < interval_s:
            return False
        self._last_run[task] = now
        return True

    async def run_maintenance(self, *, force: bool = False) -> dict[str, int]:
        """One round of the periodic tasks; `force` ignores their intervals."""
        now = self.clock()
        config = self.config
        done = {"trimmed": 0, "expired": 0, "evicted": 0, "producers_disconnected": 0}
        if force or self._due("stats", config.stats_update_frequency_s, now):
            self.update_stats()
        if self.storage_full and (force or self._due(
                "storage_full", config.storage_full_check_interval_s, now)):
            await self.resume_writes_if_room()
        retention = force or self._due("retention", config.retention_check_interval_s, now)
        ttl = force or self._due("ttl", config.message_expiry_check_interval_s, now)
        quota = force or self._due("quota", config.backlog_quota_check_interval_s, now)
        compaction = force or self._due(
            "compaction", config.broker_service_compaction_monitor_interval_s, now)
        if retention or ttl or quota or compaction:
            done["compactions"] = 0
            async for topic in self._each_persistent_topic():
                if retention:
                    done["trimmed"] += len(topic.managed_ledger.trim_consumed_ledgers())
                if ttl:
                    done["expired"] += await self._expire(topic)
                if quota:
                    evicted, dropped = await self._enforce_backlog_quota(topic)
                    done["evicted"] += evicted
                    done["producers_disconnected"] += dropped
                if compaction and topic.policies.compaction_threshold_bytes > 0:
                    done["compactions"] += topic.compaction.maybe_trigger()
            if not compaction:
                del done["compactions"]
        # Every round, but only the topics with a dedup state (a check of each loaded topic).
        for topic in [t for t in self.topics.values()
                      if isinstance(t, PersistentTopic) and t.dedup is not None]:
            await self._dedup_housekeeping(topic, now)
        return done

    async def _each_persistent_topic(self) -> AsyncIterator[PersistentTopic]:
        """The loaded persistent topics, each still loaded when its turn comes, the event
        loop served after every `MAINTENANCE_TOPICS_PER_TURN` (a pass over many topics is
        not one long turn of the loop)."""
        for count, topic in enumerate(list(self.topics.values()), 1):
            if count % MAINTENANCE_TOPICS_PER_TURN == 0:
                await asyncio.sleep(0)
            if isinstance(topic, PersistentTopic) and \
                    self.topics.get(str(topic.name)) is topic and not topic.fenced:
                yield topic

    def update_stats(self, now: float | None = None) -> None:
        """Close the stats interval: every loaded topic's rates and histogram windows
        now show the interval that ends at `now` (monotonic seconds; default: now). Only
        the topics active since the last interval are walked (`_stats_interval.py`)."""
        self.stats_interval.close(time.monotonic() if now is None else now, self.topics)

    async def resume_writes_if_room(self) -> bool:
        """While the disk is full: let the storage resume writes if there is room again
        (a recovery, in a worker thread). Returns whether writes resumed."""
        if not self.storage_full:
            return False
        try:
            resumed = await asyncio.to_thread(self.storage.try_resume_writes)
        except StorageError as exc:
            log.error("storage cannot resume writes: %s", exc)
            return False
        if resumed:
            log.info("the disk has room again: publishing resumed")
        return resumed

    async def _expire(self, topic: PersistentTopic) -> int:
        ttl = topic.policies.message_ttl_s
        if ttl <= 0:
            return 0
        total = 0
        for subscription in list(topic.subscriptions.values()):
            if subscription.backlog() == 0:
                continue
            total += await subscription.expire_messages(ttl)
        return total

    async def _enforce_backlog_quota(self, topic: PersistentTopic) -> tuple[int, int]:
        policy = topic.exceeded_backlog_quota()
        if policy is None:
            return 0, 0
        if policy == "consumer_backlog_eviction":
            evicted = 0
            if topic.policies.backlog_quota_limit_bytes >= 0:
                evicted += await self._evict(topic)
            age_limit_s = topic.policies.backlog_quota_limit_s
            if age_limit_s >= 0:  # expire what is older than 90% of the age limit
                for subscription in list(topic.subscriptions.values()):
                    evicted += await subscription.expire_messages(int(age_limit_s * 0.9))
            return evicted, 0
        dropped = len(topic.producers) + len(topic.access.waiters)
        topic.disconnect_producers("backlog quota exceeded")
        return 0, dropped

    async def _evict(self, topic: PersistentTopic) -> int:
        limit = topic.policies.backlog_quota_limit_bytes
        skipped = 0
        if limit < 0 or topic.estimated_backlog_bytes() <= limit:
            return 0
        for _ in range(100):  # bounded: each pass skips a share of the slowest backlog
            durable = [s for s in topic.subscriptions.values() if s.durable]
            if not durable or topic.estimated_backlog_bytes() <= 0.9 * limit:
                break
            slowest = min(durable, key=lambda s: s.cursor.mark_delete_position)
            backlog = slowest.backlog()
            size = topic.estimated_backlog_bytes()
            if backlog == 0 or size <= 0:
                break
            share = (size - 0.9 * limit) / size
            count = max(1, int(backlog * share))
            before = slowest.cursor.mark_delete_position
            await slowest.skip(count)
            skipped += count
            if slowest.cursor.mark_delete_position == before:
                break
        return skipped

    async def _dedup_housekeeping(self, topic: PersistentTopic, now: float) -> None:
        state = topic.dedup
        if state is None:
            return
        timeout_ms = self.config.broker_deduplication_producer_inactivity_timeout_s * 1000
        now_ms = now * 1000  # the service clock is in seconds, the dedup state's in ms
        state.purge_inactive(now_ms, timeout_ms)
        if state.should_snapshot(now_ms):
            await topic._take_dedup_snapshot()
