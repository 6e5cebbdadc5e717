"""Dispatchers: how a subscription's entries reach its consumers.

Theory of operation
-------------------
A dispatcher runs on the broker's event loop and never blocks. Anything that may let it make
progress — entries added to the topic, permits from a FLOW, an ack, a consumer joining or
leaving, a redelivery request, a delayed message falling due — calls `kick()`, which
schedules one `_run` on the loop (at most one is pending). `_run` calls `dispatch_round()`
until it reports no more progress, at most `ROUNDS_PER_TURN_MAX` times before yielding the
loop to other work.

`dispatch_round` is the subscription type's rule:

* `SingleActiveConsumerDispatcher` (Exclusive, Failover): one active consumer receives
  everything, read in order from the cursor, up to its permits (a round reads the entries
  its permits cover, `entries_for_permits`). Redelivery rewinds the
  cursor to the first unacknowledged entry. For Failover the active consumer follows the
  rules of broker reference §3.6 (priority, then name; partition index modulo candidates on
  a partitioned topic; a consistent-hash ring of the consumer names on a non-partitioned
  one), every consumer hears about a change, and the first read after a change waits
  `active_consumer_failover_delay_ms`.
* `SharedDispatcher` and `KeySharedDispatcher` live in their own modules.

`deliver()` is common: it turns entries into `Delivery` records (with the cursor's ack set
for partially acknowledged batches and the redelivery count), charges the consumer's
permits in messages, and hands them to the consumer's sink.

Reads that need the disk: a subscription serves a round's read from the storage's memory
when it can; otherwise it hands the read to the managed ledger's loader (worker threads) and
the round raises `ReadPending` before it changed anything. When the load has finished the
subscription kicks the dispatcher, and the round runs again and finds the entries loaded
(see `Subscription.read_new`: one read in flight per subscription, results re-validated).

Read failures: a round that cannot read its entries never dies silently inside the loop.
Stored data that fails its checks or is missing below the last confirmed entry
(`CorruptionError`, `NoSuchEntryError`) cannot be read by any later round either: the
subscription reports it to its topic (`Subscription.read_failed`), which logs it with the
file and offset, marks itself failed and closes its consumers. Any other storage error, and
an OS error from the disk (EIO: it may pass, and the storage layer names no corruption), is
logged and the round is retried after `DISPATCH_RETRY_DELAY_S`; anything else (but a
broken assertion, which is never caught) is a bug, logged with its traceback, and fails the
topic the same way.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from magnetar.codec import murmur3_32, sticky_key
from magnetar.storage import CorruptionError, NoSuchEntryError, StorageError

from ..ledger._position import unacked_in_ack_set
from ._consumer import Consumer, Delivery
from ._entry import EntryInfo

if TYPE_CHECKING:
    from ._subscription import Subscription

__all__ = ["Dispatcher", "ReadPending", "SingleActiveConsumerDispatcher", "entries_for_permits",
           "failover_ring_choice"]

log = logging.getLogger(__name__)

ROUNDS_PER_TURN_MAX = 16
DISPATCH_RETRY_DELAY_S = 1.0  # after a storage error that may pass (not a corruption)
FAILOVER_RING_POINTS = 100


class ReadPending(Exception):  # an outcome, not an error
    """The round's read needs the disk: it was handed to the loader (or one is already in
    flight for the subscription). The round ends without progress; the subscription kicks
    the dispatcher when the load has finished, and the same round runs again."""


class Dispatcher:
    """Common scheduling and delivery (see the module comment)."""

    sub_type = ""

    def __init__(self, subscription: Subscription):
        self.sub = subscription
        self.consumers: list[Consumer] = []
        self.closed = False
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        self._timers: list[asyncio.TimerHandle] = []

    # -- scheduling ----------------------------------------------------------------------

    def kick(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def kick_later(self, delay_s: float) -> None:
        """Kick after `delay_s`, unless a pending timer already fires by then (its kick
        re-arms what is still needed). Fired timers are forgotten."""
        if self.closed:
            return
        now = self._loop.time()
        when = now + max(0.0, delay_s)
        self._timers = [t for t in self._timers if not t.cancelled() and t.when() > now]
        if any(t.when() <= when for t in self._timers):
            return
        self._timers.append(self._loop.call_later(max(0.0, delay_s), self.kick))

    def _run(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        try:
            for _ in range(ROUNDS_PER_TURN_MAX):
                if not self.dispatch_round():
                    return
        except ReadPending:
            return
        except (CorruptionError, NoSuchEntryError) as exc:
            self.sub.read_failed(exc)
            return
        except (StorageError, OSError) as exc:
            log.warning("dispatch on %s/%s failed, retrying in %.1f s: %s",
                        self.sub.topic_name, self.sub.name, DISPATCH_RETRY_DELAY_S, exc)
            self.kick_later(DISPATCH_RETRY_DELAY_S)
            return
        except AssertionError:
            raise  # a broken invariant is never caught (asyncio logs it with its traceback)
        except Exception as exc:
            log.exception("dispatch on %s/%s failed unexpectedly", self.sub.topic_name,
                          self.sub.name)
            self.sub.read_failed(exc)
            return
        self.kick()  # more to do: yield the loop first

    def dispatch_round(self) -> bool:
        raise NotImplementedError

    # -- consumers -----------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.kick()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        self.kick()

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.add_permits(permits)
        self.kick()

    def redeliver(self, consumer: Consumer, positions: list[tuple[int, int]] | None) -> None:
        raise NotImplementedError

    def acked(self, consumer: Consumer | None, positions: Sequence[tuple[int, int]],
              messages: int, remaining: dict[tuple[int, int], int] | None = None) -> None:
        """The subscription acknowledged these entries (whole ones); `remaining`: messages
        this ack covered of batches that were partially acknowledged before."""
        self.kick()

    def mark_delete_moved(self) -> None:
        self.kick()

    def close(self) -> None:
        self.closed = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    # -- delivery ------------------------------------------------------------------------

    def deliver(self, consumer: Consumer, entries: list[EntryInfo]) -> int:
        """Send entries to a consumer; returns the messages charged to its permits."""
        if not entries:
            return 0
        sub = self.sub
        partition, epoch = sub.partition, consumer.epoch
        redelivery_count = sub.redelivery_count if sub.cursor.redelivery else None  # any?
        deliveries: list[Delivery] = []
        messages = 0
        for entry in entries:
            position = entry.position
            batch_size = entry.batch_size
            ack_set = None
            unacked = batch_size
            if batch_size > 1:
                ack_set = sub.ack_set_for(position)
                if ack_set is not None:
                    unacked = unacked_in_ack_set(ack_set, batch_size)
            messages += unacked
            deliveries.append(Delivery(
                position[0], position[1], partition, entry.data,
                0 if redelivery_count is None else redelivery_count(position), ack_set, epoch,
                batch_size))
        consumer.record_sent(deliveries, messages)
        sub.messages_dispatched(consumer, messages, deliveries)
        consumer.sink.deliver(consumer, deliveries)
        return messages


def entries_for_permits(consumer: Consumer, permits: int) -> int:
    """How many entries an Exclusive/Failover round reads for `permits` (> 0) messages with
    `precise_dispatcher_flow_control` (Pulsar's option; its default reads one entry per
    permit): the permits over the consumer's average messages per entry, rounded up. A
    consumer of batches so receives about what its receiver queue has room for with each
    FLOW, rather than up to a read's worth of batches (5 MB) with its first permits, and its
    queue is refilled in steps as it empties instead of draining before each burst (issue 14,
    batched consume). Permits may still go below zero (an entry is never split), by less than
    one entry's messages when its entries hold alike counts. Before its first dispatch the
    consumer's average is unknown: one entry, which sets it (and reaches the consumer sooner
    than a whole read's worth from the disk); the same turn's next round reads the rest."""
    assert permits > 0
    if not consumer.has_average:
        return 1
    return max(1, math.ceil(permits / consumer.avg_messages_per_entry))


def failover_ring_choice(consumers: list[Consumer], topic_name: str) -> Consumer | None:
    """The active consumer of a non-partitioned Failover topic: the owner of the first ring
    point at or after the topic's hash (broker reference §3.6)."""
    ring: dict[int, Consumer] = {}
    for consumer in consumers:
        for point in range(FAILOVER_RING_POINTS):
            ring[murmur3_32(f"{consumer.consumer_name}{point}".encode())] = consumer
    if not ring:
        return None
    target = murmur3_32(topic_name.encode())
    keys = sorted(ring)
    for key in keys:
        if key >= target:
            return ring[key]
    return ring[keys[0]]


class SingleActiveConsumerDispatcher(Dispatcher):
    """Exclusive and Failover."""

    def __init__(self, subscription: Subscription, sub_type: str):
        super().__init__(subscription)
        assert sub_type in ("Exclusive", "Failover")
        self.sub_type = sub_type
        self.active: Consumer | None = None
        self._waiting_failover_delay = False

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        if not self._update_active() and self.sub_type == "Failover":
            consumer.sink.active_consumer_changed(consumer, consumer is self.active)
        self.kick()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        self._update_active()
        self.kick()

    def _candidates(self) -> list[Consumer]:
        ordered = sorted(self.consumers, key=lambda c: (c.priority_level, c.consumer_name))
        if not ordered:
            return []
        top = ordered[0].priority_level
        return [c for c in ordered if c.priority_level == top]

    def _pick_active(self) -> Consumer | None:
        if self.sub_type == "Exclusive":
            return self.consumers[0] if self.consumers else None
        candidates = self._candidates()
        if not candidates:
            return None
        if self.sub.partition >= 0:
            return candidates[self.sub.partition % len(candidates)]
        return failover_ring_choice(candidates, self.sub.topic_name)

    def _update_active(self) -> bool:
        """Recompute the active consumer; returns True if it changed."""
        chosen = self._pick_active()
        if chosen is self.active:
            return False
        self.active = chosen
        delay_ms = self.sub.config.active_consumer_failover_delay_ms
        if self.sub_type == "Failover" and delay_ms > 0:
            # The rewind, the notifications and the first read wait for the delay; a change
            # while it runs is picked up when it ends (one pending delay at a time).
            if chosen is not None and not self._waiting_failover_delay:
                self._waiting_failover_delay = True
                self._timers.append(self._loop.call_later(delay_ms / 1000.0,
                                                          self._failover_delay_over))
        else:
            self.sub.rewind()
            self._notify_active()
        return True

    def _notify_active(self) -> None:
        """ActiveConsumerChange to every consumer (Failover only)."""
        if self.sub_type == "Failover" and self.active is not None:
            for consumer in self.consumers:
                consumer.sink.active_consumer_changed(consumer, consumer is self.active)

    def _failover_delay_over(self) -> None:
        self._waiting_failover_delay = False
        if self.closed:
            return
        self.sub.rewind()
        self._notify_active()
        self.kick()

    def redeliver(self, consumer: Consumer, positions: list[tuple[int, int]] | None) -> None:
        if consumer is not self.active or self._waiting_failover_delay:
            return
        self.sub.rewind()
        self.kick()

    def dispatch_round(self) -> bool:
        consumer = self.active
        if consumer is None or self._waiting_failover_delay or consumer.closed:
            return False
        permits = consumer.available_permits(0)
        if permits <= 0:
            return False
        config = self.sub.config
        wanted = (entries_for_permits(consumer, permits) if config.precise_dispatcher_flow_control
                  else permits)
        limit = min(wanted, config.dispatcher_max_read_batch_size)
        entries, more = self.sub.read_new(limit, honour_delay=False)
        if consumer.key_shared_ranges:
            entries = [e for e in entries if _in_ranges(e, consumer.key_shared_ranges)]
        self.deliver(consumer, entries)
        return more


def _in_ranges(entry: EntryInfo, ranges: tuple[tuple[int, int], ...]) -> bool:
    from magnetar.codec import hash_range_slot

    slot = hash_range_slot(sticky_key(entry.metadata))
    return any(start <= slot <= end for start, end in ranges)
