"""The Key_Shared dispatcher of Pulsar 4.0 (PIP-379; broker reference §2.7).

Theory of operation
-------------------
Every entry has a sticky-key slot (§2.1 and 2.2); the selector maps a slot to one consumer.
What keeps per-key order when consumers come and go is *draining*: when a consumer joins
(or leaves) and the selector moves slots away from an existing consumer, every pending ack
that consumer holds in a moved slot is registered in the `DrainingHashesTracker`. While a
slot drains, entries of that slot are not sent to its new owner; they wait in the replay
queue (with their slot) until the old owner has acknowledged, redelivered or closed. The
release of the last reference fires an unblock event, which schedules a read after
`key_shared_unblocking_interval_ms`.

One dispatch round over a batch of entries (Normal read from the cursor, or Replay read of
queued positions), per §2.7.3:

* an entry whose slot was already blocked earlier in this batch is blocked too (#23874);
* no selected consumer, no permits, (Normal read) the slot waiting in the replay queue,
  or the slot draining for another consumer: the entry is blocked;
* otherwise it goes to the selected consumer.

Blocked entries go to the replay queue with their slot. A Normal read asks for at most
the consumers' total permits, and reads stop while the replay queue holds `look-ahead
limit` entries. A Replay read that sends nothing makes the next round read new entries
instead (look-ahead), as long as some other consumer has permits.
`allow_out_of_order_delivery` turns draining and the replay-slot blocking off. STICKY mode
never drains.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from magnetar.codec import sticky_key

from ..ledger._position import Position
from ._consumer import Consumer
from ._dispatch_shared import SharedDispatcher
from ._draining import DrainingHashesTracker
from ._entry import EntryInfo
from ._pending_acks import PendingAcksMap
from ._selectors import HashRange, ImpactedConsumers, StickyKeyConsumerSelector, new_selector

if TYPE_CHECKING:
    from ._subscription import Subscription

__all__ = ["KeySharedDispatcher"]

# A replay round examines at most this many times the read size from the head of the queue.
REPLAY_SCAN_FACTOR_MAX = 10

LOOK_AHEAD_UNLIMITED = 2**31  # no look-ahead limit configured at all


class KeySharedDispatcher(SharedDispatcher):
    sub_type = "Key_Shared"

    def __init__(self, subscription: Subscription, *, sticky: bool, allow_out_of_order: bool):
        super().__init__(subscription)
        self.key_shared_mode = "STICKY" if sticky else "AUTO_SPLIT"
        self.allow_out_of_order = allow_out_of_order
        self.selector: StickyKeyConsumerSelector[Consumer] = new_selector(
            subscription.config, sticky=sticky)
        self.draining_enabled = not sticky and not allow_out_of_order
        self.draining: DrainingHashesTracker[Consumer] = DrainingHashesTracker(
            subscription.name, self._on_unblocked)
        self.replay_slots: dict[Position, int] = {}
        self.slot_counts: Counter[int] = Counter()
        self._unblock_scheduled = False
        self._skip_replay_once = False  # look ahead: the next round reads new entries

    # -- pending-ack hooks ---------------------------------------------------------------

    def _new_pending_acks(self, consumer: Consumer) -> PendingAcksMap[Consumer]:
        pending: PendingAcksMap[Consumer] = PendingAcksMap(
            consumer, add_hook=self._may_add, remove_handler=self)
        return pending

    def _may_add(self, consumer: Consumer, ledger_id: int, entry_id: int, slot: int) -> bool:
        if not self.draining_enabled or slot == 0:
            return True
        entry = self.draining.get_entry(slot)
        return entry is None or entry.consumer is consumer

    def handle_removing(self, consumer: Consumer, ledger_id: int, entry_id: int, slot: int,
                        closing: bool) -> None:
        if self.draining_enabled and slot != 0:
            self.draining.reduce_ref_count(consumer, slot, closing)

    def start_batch(self) -> None:
        self.draining.start_batch()

    def end_batch(self) -> None:
        self.draining.end_batch()

    def _on_unblocked(self, slot: int) -> None:
        if not self._unblock_scheduled:
            self._unblock_scheduled = True
            delay = self.sub.config.key_shared_unblocking_interval_ms / 1000.0
            self._loop.call_later(delay, self._unblocked_read)

    def _unblocked_read(self) -> None:
        self._unblock_scheduled = False
        self.kick()

    # -- consumers -----------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        """Raises ConsumerAssignError (nothing changed) when the selector refuses."""
        impacted = self.selector.add_consumer(consumer)
        super().add_consumer(consumer)
        self._register_draining(impacted, skip=consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        impacted = self.selector.remove_consumer(consumer)
        self._register_draining(impacted, skip=consumer)
        super().remove_consumer(consumer)
        self.draining.consumer_removed(consumer)
        if not self.consumers:
            self.draining.clear()
            self.replay_slots.clear()
            self.slot_counts.clear()

    def _register_draining(self, impacted: ImpactedConsumers[Consumer] | None,
                           skip: Consumer) -> None:
        if impacted is None or not self.draining_enabled:
            return
        for owner, ranges in impacted.added.items():
            self._release_returned(owner, ranges)
        for owner, ranges in impacted.removed.items():
            if owner is skip or owner.pending_acks is None:
                continue
            for _lid, _eid, _size, slot in owner.pending_acks:
                if slot and any(r.start <= slot <= r.end for r in ranges):
                    self.draining.add_entry(owner, slot)

    def _release_returned(self, owner: Consumer, ranges: tuple[HashRange, ...]) -> None:
        """Slots that came back to the consumer draining them stop draining at once
        (#24736)."""
        for slot_range in ranges:
            for slot in list(self.draining_slots_of(owner)):
                if slot_range.start <= slot <= slot_range.end:
                    entry = self.draining.get_entry(slot)
                    while entry is not None and entry.consumer is owner and entry.ref_count:
                        self.draining.reduce_ref_count(owner, slot, closing=True)
                        entry = self.draining.get_entry(slot)

    def draining_slots_of(self, consumer: Consumer) -> list[int]:
        return [h.hash for h in self.draining.consumer_stats(consumer).draining_hashes]

    def _release_pending_acks(self, consumer: Consumer) -> None:
        pending: PendingAcksMap[Consumer] | None = consumer.pending_acks
        if pending is None:
            return
        returned: list[tuple[Position, int]] = []

        def visit(ledger_id: int, entry_id: int, batch_size: int, slot: int) -> None:
            position = Position(ledger_id, entry_id)
            if not self.sub.is_acked(position):
                returned.append((position, slot))

        pending.for_each_and_close(visit)
        self.total_unacked -= consumer.unacked_messages
        consumer.unacked_messages = 0
        for position, slot in returned:
            self._replay_with_slot(position, slot)
        self._check_subscription_unblock()

    # -- replay queue with slots ---------------------------------------------------------

    def _replay_with_slot(self, position: Position, slot: int) -> None:
        if position <= self.sub.mark_delete_position() or position in self.replay:
            return
        self.replay.add(position)
        if slot:
            self.replay_slots[position] = slot
            self.slot_counts[slot] += 1

    def _replay_removed(self, position: Position) -> None:
        slot = self.replay_slots.pop(position, 0)
        if slot:
            self.slot_counts[slot] -= 1
            if self.slot_counts[slot] <= 0:
                del self.slot_counts[slot]

    def acked(self, consumer: Consumer | None, positions: Sequence[tuple[int, int]],
              messages: int, remaining: dict[tuple[int, int], int] | None = None) -> None:
        for ledger_id, entry_id in positions:
            self._replay_removed(Position(ledger_id, entry_id))
        super().acked(consumer, positions, messages, remaining)

    def mark_delete_moved(self) -> None:
        mark = self.sub.mark_delete_position()
        for position in [p for p in self.replay_slots if p <= mark]:
            self._replay_removed(position)
        super().mark_delete_moved()

    # -- dispatch ------------------------------------------------------------------------

    def look_ahead_limit(self) -> int:
        """How many entries the replay queue may hold before Normal reads stop (§2.7.4):
        the per-consumer threshold times the consumers, capped by the per-subscription
        one; when that is not positive, the unacked-message limits (non-positive ones
        meaning unlimited)."""
        config = self.sub.config
        consumers = max(1, len(self.consumers))
        per_consumer = config.key_shared_look_ahead_msg_in_replay_threshold_per_consumer
        per_subscription = config.key_shared_look_ahead_msg_in_replay_threshold_per_subscription
        if per_consumer <= 0:
            limit = per_subscription
        else:
            limit = min(per_consumer * consumers, per_subscription)
        if limit > 0:
            return limit
        unacked_limits = [v for v in (self.sub.max_unacked_per_subscription(),
                                      consumers * self.sub.max_unacked_per_consumer())
                          if v > 0]
        return min(unacked_limits) if unacked_limits else LOOK_AHEAD_UNLIMITED

    def dispatch_round(self) -> bool:
        if not self.consumers or self.blocked_on_unacked:
            return False
        if self.total_available_permits() <= 0:
            return False
        self._collect_due_delayed()
        limit = self.sub.config.dispatcher_max_read_batch_size
        replay = [] if self._skip_replay_once else self._replay_candidates(limit)
        self._skip_replay_once = False
        if replay:
            entries, done = self.sub.read_positions(replay)
            for position in done:
                self.replay.discard(position)
                self._replay_removed(position)
            sent = self._dispatch_batch(entries, normal=False)
            if sent > 0 or len(entries) < len(done):
                return True
            self._skip_replay_once = self._should_look_ahead(entries)
            return self._skip_replay_once
        room = self.look_ahead_limit() - len(self.replay)
        if room <= 0:
            return False
        to_read = min(limit, room, self.total_available_permits())
        entries, progressed = self.sub.read_new(to_read, honour_delay=True)
        self._dispatch_batch(entries, normal=True)
        return progressed

    def _should_look_ahead(self, entries: list[EntryInfo]) -> bool:
        """A replay read sent nothing: read new entries next (skipping the replay queue
        once) if the replay queue is under the look-ahead limit and a consumer none of
        these entries was meant for has permits (§2.7.3 step 4). Without this, positions
        that pass the replay filter unchecked (out-of-order delivery, unknown slots) but
        cannot be sent would keep every other consumer from new entries."""
        if len(self.replay) >= self.look_ahead_limit():
            return False
        involved = {self.selector.select(entry.slot) for entry in entries}
        limit = self.sub.max_unacked_per_consumer()
        return any(c not in involved and c.available_permits(limit) > 0
                   for c in self.consumers)

    def _replay_candidates(self, limit: int) -> list[Position]:
        """Replay positions worth reading now (§2.7.3 replay-position filter). At most
        `REPLAY_SCAN_FACTOR_MAX * limit` positions from the head of the queue are
        examined, and the scan stops once no consumer has permits left, so one round costs
        O(limit) however long the queue is."""
        chosen: list[Position] = []
        failed_slots: set[int] = set()
        permits = {c: c.available_permits(self.sub.max_unacked_per_consumer())
                   for c in self.consumers}
        with_permits = sum(1 for p in permits.values() if p > 0)
        scan_max = REPLAY_SCAN_FACTOR_MAX * limit
        unknown_slots = len(self.replay) - len(self.replay_slots)
        for scanned, position in enumerate(self.replay):
            if len(chosen) >= limit or scanned >= scan_max or with_permits == 0:
                break
            if unknown_slots == 0 and len(failed_slots) >= len(self.slot_counts):
                break  # every slot waiting in the queue has failed this pass
            slot = self.replay_slots.get(position, 0)
            if self.allow_out_of_order or slot == 0:
                chosen.append(position)
                continue
            if slot in failed_slots:
                continue
            consumer = self.selector.select(slot)
            if consumer is None or permits.get(consumer, 0) <= 0 or not self._may_add(
                    consumer, position.ledger_id, position.entry_id, slot):
                failed_slots.add(slot)
                continue
            permits[consumer] -= 1
            if permits[consumer] == 0:
                with_permits -= 1
            chosen.append(position)
        return chosen

    def _dispatch_batch(self, entries: list[EntryInfo], *, normal: bool) -> int:
        limit = self.sub.max_unacked_per_consumer()
        permits = {c: c.available_permits(limit) for c in self.consumers}
        groups: dict[Consumer, list[EntryInfo]] = {}
        blocked_slots: set[int] = set()
        blocked: list[EntryInfo] = []
        for entry in entries:
            entry.slot = self.selector.slot_for(sticky_key(entry.metadata))
            consumer = self._choose(entry, permits, blocked_slots, normal)
            if consumer is None:
                blocked_slots.add(entry.slot)
                blocked.append(entry)
                continue
            permits[consumer] -= entry.batch_size
            groups.setdefault(consumer, []).append(entry)
        sent = 0
        for consumer, group in groups.items():
            refused = self.send_tracked(consumer, group)
            sent += len(group) - len(refused)
            blocked.extend(refused)
        for entry in blocked:
            self._replay_with_slot(entry.position, entry.slot)
        return sent

    def _choose(self, entry: EntryInfo, permits: dict[Consumer, int], blocked_slots: set[int],
                normal: bool) -> Consumer | None:
        slot = entry.slot
        if slot in blocked_slots:
            return None
        consumer = self.selector.select(slot)
        if consumer is None or permits.get(consumer, 0) <= 0:
            return None
        if normal and not self.allow_out_of_order and self.slot_counts.get(slot, 0) > 0:
            return None
        if self.draining_enabled and self.draining.should_block(consumer, slot):
            return None
        return consumer

    def close(self) -> None:
        super().close()
        self.draining.clear()
