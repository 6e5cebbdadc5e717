"""A persistent topic's backlog and its quotas (broker reference §7.3).

The backlog is what the slowest durable subscription has not yet acknowledged. Its size
(`estimated_backlog_bytes`) is the managed ledger's estimate of the bytes after that
subscription's mark-delete position; its age (`oldest_unacked_publish_time`) is the time of
the oldest entry any durable subscription still waits for. The namespace's `backlog_quota_map`
bounds both (`destination_storage` by size, `message_age` by age, -1: no limit): a new producer
is refused while one is exceeded under the `producer_request_hold` (retried by the client) or
`producer_exception` policy (`refuse_producer_over_quota`); `consumer_backlog_eviction` is the
service's maintenance (`BrokerService`), which moves the slowest cursors forward.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .._errors import ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException
from .._names import TopicName
from .._namespaces import EffectivePolicies
from ..dispatch._entry import EntryInfo
from ..dispatch._subscription import Subscription
from ..ledger._managed_ledger import ManagedLedger

__all__ = ["BacklogQuotas", "estimated_backlog_bytes", "exceeded_backlog_quota",
           "oldest_unacked_publish_time", "refuse_producer_over_quota"]


class BacklogQuotas:
    """A persistent topic's backlog figures and quota checks, as methods of the topic."""

    __slots__ = ()

    name: TopicName
    policies: EffectivePolicies
    managed_ledger: ManagedLedger
    subscriptions: dict[str, Subscription]

    def exceeded_backlog_quota(self) -> str | None:
        """The policy of the first backlog quota exceeded, or None."""
        return exceeded_backlog_quota(self.policies, self.managed_ledger,
                                      list(self.subscriptions.values()), time.time() * 1000)

    def backlog_quota_exceeded(self) -> bool:
        return self.exceeded_backlog_quota() is not None

    def oldest_unacked_publish_time(self) -> int | None:
        """Time (ms) of the oldest unacknowledged entry over durable subscriptions, or None."""
        return oldest_unacked_publish_time(self.managed_ledger,
                                           list(self.subscriptions.values()))

    def _check_backlog_quota(self) -> None:
        refuse_producer_over_quota(self.exceeded_backlog_quota(), self.name)

    def estimated_backlog_bytes(self) -> int:
        return estimated_backlog_bytes(self.managed_ledger, list(self.subscriptions.values()))


def exceeded_backlog_quota(policies: EffectivePolicies, ml: ManagedLedger,
                           subscriptions: Sequence[Subscription], now_ms: float) -> str | None:
    """The policy of the first backlog quota exceeded ("destination_storage" by size,
    then "message_age" by the oldest unacknowledged message), or None."""
    limit = policies.backlog_quota_limit_bytes
    if limit >= 0 and estimated_backlog_bytes(ml, subscriptions) > limit:
        return policies.backlog_quota_policy
    age_limit_s = policies.backlog_quota_limit_s
    if age_limit_s >= 0:
        oldest = oldest_unacked_publish_time(ml, subscriptions)
        if oldest is not None and now_ms - oldest > age_limit_s * 1000:
            return policies.backlog_quota_age_policy
    return None


def oldest_unacked_publish_time(ml: ManagedLedger, subscriptions: Sequence[Subscription],
                                ) -> int | None:
    """Time (ms) of the oldest unacknowledged entry over durable subscriptions -- its
    broker timestamp when stored with one, else its publish time -- or None when nothing
    is unacknowledged."""
    oldest: int | None = None
    for subscription in subscriptions:
        if not subscription.durable or subscription.backlog() == 0:
            continue
        position = ml.next_valid_position(subscription.cursor.mark_delete_position)
        while position <= ml.last_confirmed_position and subscription.is_acked(position):
            position = ml.next_valid_position(position)
        if position > ml.last_confirmed_position:
            continue
        published = EntryInfo(position, ml.read_entry(position)).timestamp
        oldest = published if oldest is None else min(oldest, published)
    return oldest


def estimated_backlog_bytes(ml: ManagedLedger, subscriptions: Sequence[Subscription]) -> int:
    """The stored bytes after the slowest durable subscription's mark-delete position (0
    without durable subscriptions)."""
    durable = [s.cursor for s in subscriptions if s.durable]
    if not durable:
        return 0
    slowest = min(c.mark_delete_position for c in durable)
    return int(ml.estimated_size_after(slowest))


def refuse_producer_over_quota(policy: str | None, topic: TopicName) -> None:
    """Raise the error a new producer gets under the exceeded quota's `policy` (None: no
    quota exceeded; `consumer_backlog_eviction` admits producers).

    Raises:
        ProducerBlockedQuotaExceededError: `producer_request_hold`.
        ProducerBlockedQuotaExceededException: `producer_exception`.
    """
    if policy is None:
        return
    message = f"Cannot create producer on topic with backlog quota exceeded ({topic})"
    if policy == "producer_request_hold":
        raise ProducerBlockedQuotaExceededError(message)
    if policy == "producer_exception":
        raise ProducerBlockedQuotaExceededException(message)
