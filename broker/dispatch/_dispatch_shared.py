"""The Shared dispatcher: round robin over consumers with permits, a replay queue, and
redelivery (broker reference §3.3 to §3.5).

Theory of operation
-------------------
Consumers are kept in priority order (0 first; join order within a level). Each round:

1. Due delayed messages move from the delayed tracker into the replay queue.
2. The replay queue (position-sorted) is read first; only when it is empty does the cursor
   read new entries. The read size is `min(total available permits, read batch size)`.
3. Entries go out round robin within the highest priority level that has a consumer with
   permits, at most `dispatcher_max_round_robin_batch_size` entries per turn (#24092);
   entries left over when nobody has permits go to the replay queue.

Every entry sent is recorded in the consumer's pending acks; the consumer's and the
subscription's unacked counts grow by its unacked messages. At `max_unacked_messages_per_
consumer` a consumer is blocked until acks bring it to half; at the per-subscription limit
no reads are issued until the total falls to half.

When a consumer leaves, its pending acks go back to the replay queue (their redelivery
count unchanged). A redelivery request (negative ack, ack timeout, redeliver-all) moves the
named pending acks to the replay queue with their redelivery count raised by one. When the
last consumer leaves, the replay queue and the redelivery counts are dropped (the counts are
kept when the broker stops or the topic unloads: `Subscription.clear_redelivery_counts`) and
the cursor rewinds when the next consumer arrives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sortedcontainers import SortedSet

from ..ledger._position import Position, ack_set_to_int
from ._consumer import Consumer
from ._dispatcher import Dispatcher
from ._entry import EntryInfo
from ._pending_acks import PendingAcksMap

if TYPE_CHECKING:
    from ._subscription import Subscription

__all__ = ["SharedDispatcher"]


class SharedDispatcher(Dispatcher):
    sub_type = "Shared"

    def __init__(self, subscription: Subscription):
        super().__init__(subscription)
        self.replay: SortedSet[Position] = SortedSet()
        self.total_unacked = 0
        self.blocked_on_unacked = False
        self._round_robin: dict[int, int] = {}  # priority level -> next index
        self._rewind_on_next_consumer = False

    # -- consumers -----------------------------------------------------------------------

    def _new_pending_acks(self, consumer: Consumer) -> PendingAcksMap[Consumer]:
        return PendingAcksMap(consumer)

    def add_consumer(self, consumer: Consumer) -> None:
        if self._rewind_on_next_consumer or not self.consumers:
            self._rewind_on_next_consumer = False
            self.sub.rewind()
        consumer.pending_acks = self._new_pending_acks(consumer)
        self.consumers.append(consumer)
        self.consumers.sort(key=lambda c: c.priority_level)  # stable: join order kept
        self.kick()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self._release_pending_acks(consumer)
        if not self.consumers:
            self.replay.clear()
            self.sub.clear_redelivery_counts()
            self.sub.clear_delayed()
            self._rewind_on_next_consumer = True
        self.kick()

    def _release_pending_acks(self, consumer: Consumer) -> None:
        pending: PendingAcksMap[Consumer] | None = consumer.pending_acks
        if pending is None:
            return
        returned: list[Position] = []

        def visit(ledger_id: int, entry_id: int, batch_size: int, slot: int) -> None:
            position = Position(ledger_id, entry_id)
            if not self.sub.is_acked(position):
                returned.append(position)

        pending.for_each_and_close(visit)
        self.total_unacked -= consumer.unacked_messages
        consumer.unacked_messages = 0
        self._add_to_replay(returned)
        self._check_subscription_unblock()

    # -- redelivery and acks -------------------------------------------------------------

    def redeliver(self, consumer: Consumer, positions: list[tuple[int, int]] | None) -> None:
        pending: PendingAcksMap[Consumer] | None = consumer.pending_acks
        if pending is None:
            return
        if positions is None:
            chosen = [(lid, eid, size) for lid, eid, size, _ in pending]
        else:
            chosen = [(lid, eid, found.batch_size) for lid, eid in positions
                      if (found := pending.get(lid, eid)) is not None]
        moved: list[Position] = []
        for ledger_id, entry_id, batch_size in chosen:
            if pending.remove(ledger_id, entry_id) is None:
                continue
            position = Position(ledger_id, entry_id)
            self._unacked_changed(consumer, -self._unacked_in_entry(position, batch_size))
            self.sub.increment_redelivery_count(position)
            moved.append(position)
        if positions is None:
            self.total_unacked -= consumer.unacked_messages
            consumer.unacked_messages = 0
            consumer.blocked_on_unacked = False
        self._add_to_replay(moved)
        self.kick()

    def acked(self, consumer: Consumer | None, positions: Sequence[tuple[int, int]],
              messages: int, remaining: dict[tuple[int, int], int] | None = None) -> None:
        """Whole entries acknowledged; `remaining` gives, for batches that were partially
        acknowledged before, how many of their messages this ack covered."""
        for ledger_id, entry_id in positions:
            self.replay.discard(Position(ledger_id, entry_id))
            owner = self._owner(consumer, ledger_id, entry_id)
            if owner is None:
                continue
            removed = owner.pending_acks.remove(ledger_id, entry_id)
            if removed is not None:
                covered = (remaining or {}).get((ledger_id, entry_id), removed.batch_size)
                self._unacked_changed(owner, -covered)
        self.kick()

    def batch_index_acked(self, consumer: Consumer, messages: int,
                          position: tuple[int, int] | None = None) -> None:
        """Some messages of a batch entry were acknowledged (not the whole entry); they are
        credited to the consumer holding the entry when it is not the one acking."""
        owner = self._owner(consumer, *position) if position is not None else None
        self._unacked_changed(owner or consumer, -messages)
        self.kick()

    def _unacked_in_entry(self, position: Position, batch_size: int) -> int:
        """Messages of an entry not yet acknowledged (a partially acked batch has fewer)."""
        words = self.sub.ack_set_for(position) if batch_size > 1 else None
        if words is None:
            return batch_size
        return bin(ack_set_to_int(words) & ((1 << batch_size) - 1)).count("1")

    def _owner(self, hint: Consumer | None, ledger_id: int, entry_id: int) -> Consumer | None:
        if hint is not None and hint.pending_acks is not None \
                and hint.pending_acks.get(ledger_id, entry_id) is not None:
            return hint
        for consumer in self.consumers:
            if consumer.pending_acks is not None \
                    and consumer.pending_acks.get(ledger_id, entry_id) is not None:
                return consumer
        return None

    def mark_delete_moved(self) -> None:
        """Sweep pending acks and replay entries at or below the new mark-delete."""
        mark = self.sub.mark_delete_position()
        while self.replay and self.replay[0] <= mark:
            self.replay.pop(0)
        for consumer in self.consumers:
            if consumer.pending_acks is None:
                continue
            removed_messages = 0

            def count(ledger_id: int, entry_id: int, batch_size: int, slot: int) -> None:
                nonlocal removed_messages
                removed_messages += batch_size

            consumer.pending_acks.remove_all_up_to(mark.ledger_id, mark.entry_id, count)
            if removed_messages:
                self._unacked_changed(consumer, -removed_messages)
        self.kick()

    def _unacked_changed(self, consumer: Consumer, delta: int) -> None:
        consumer.unacked_messages = max(0, consumer.unacked_messages + delta)
        self.total_unacked = max(0, self.total_unacked + delta)
        limit = self.sub.max_unacked_per_consumer()
        if delta > 0 and limit > 0 and consumer.unacked_messages >= limit:
            consumer.blocked_on_unacked = True
        elif consumer.blocked_on_unacked and (limit <= 0
                                              or consumer.unacked_messages <= limit // 2):
            consumer.blocked_on_unacked = False
        self._check_subscription_unblock()

    def _check_subscription_unblock(self) -> None:
        limit = self.sub.max_unacked_per_subscription()
        if limit <= 0:
            self.blocked_on_unacked = False
        elif self.total_unacked >= limit:
            self.blocked_on_unacked = True
        elif self.blocked_on_unacked and self.total_unacked < limit // 2:
            self.blocked_on_unacked = False

    def _add_to_replay(self, positions: list[Position]) -> None:
        mark = self.sub.mark_delete_position()
        self.replay.update(p for p in positions if p > mark)

    # -- dispatch ------------------------------------------------------------------------

    def total_available_permits(self) -> int:
        limit = self.sub.max_unacked_per_consumer()
        return sum(c.available_permits(limit) for c in self.consumers)

    def dispatch_round(self) -> bool:
        if not self.consumers or self.blocked_on_unacked:
            return False
        permits = self.total_available_permits()
        if permits <= 0:
            return False
        self._collect_due_delayed()
        limit = min(permits, self.sub.config.dispatcher_max_read_batch_size)
        if self.replay:
            positions = [self.replay[i] for i in range(min(limit, len(self.replay)))]
            entries, done = self.sub.read_positions(positions)
            for position in done:
                self.replay.discard(position)
            progressed = bool(done)
        else:
            entries, progressed = self.sub.read_new(limit, honour_delay=True)
        self.distribute(entries)
        return progressed

    def _collect_due_delayed(self) -> None:
        due = self.sub.due_delayed(self.sub.config.dispatcher_max_read_batch_size)
        if due:
            self._add_to_replay(due)

    def distribute(self, entries: list[EntryInfo]) -> None:
        index = 0
        limit = self.sub.max_unacked_per_consumer()
        while index < len(entries):
            consumer = self.next_consumer()
            if consumer is None:
                break
            permits = consumer.available_permits(limit)
            remaining = entries[index:]
            messages_left = sum(e.batch_size for e in remaining)
            average = max(1.0, messages_left / len(remaining))
            room = min(messages_left, permits)
            take = max(1, min(self.sub.config.dispatcher_max_round_robin_batch_size,
                              math.ceil(room / average)))
            chunk = remaining[:take]
            index += len(chunk)
            self.send_tracked(consumer, chunk)
        if index < len(entries):
            self._add_to_replay([e.position for e in entries[index:]])

    def send_tracked(self, consumer: Consumer, entries: list[EntryInfo], slot_of: bool = False,
                     ) -> list[EntryInfo]:
        """Record entries in the consumer's pending acks and send those accepted; returns
        the refused ones (the caller replays them)."""
        accepted: list[EntryInfo] = []
        refused: list[EntryInfo] = []
        pending: PendingAcksMap[Consumer] = consumer.pending_acks
        for entry in entries:
            ledger_id, entry_id = entry.position
            if pending.add(ledger_id, entry_id, entry.batch_size, entry.slot):
                accepted.append(entry)
            else:
                refused.append(entry)
        messages = self.deliver(consumer, accepted)
        self._unacked_changed(consumer, messages)
        return refused

    def next_consumer(self) -> Consumer | None:
        """Round robin within the highest priority level that has an available consumer."""
        limit = self.sub.max_unacked_per_consumer()
        levels: dict[int, list[Consumer]] = {}
        for consumer in self.consumers:
            levels.setdefault(consumer.priority_level, []).append(consumer)
        for level in sorted(levels):
            members = levels[level]
            start = self._round_robin.get(level, 0) % len(members)
            for step in range(len(members)):
                candidate = members[(start + step) % len(members)]
                if candidate.available_permits(limit) > 0:
                    self._round_robin[level] = (start + step + 1) % len(members)
                    return candidate
        return None
