"""Draining hashes: the slots a Key_Shared consumer must finish before another may take them.

Theory of operation
-------------------

PIP-379's contract is that messages of one key are unacknowledged at one consumer at a time.
When an AUTO_SPLIT selector moves a slot from consumer A to consumer B while A still holds
pending acks in that slot, the slot is *draining* for A: the dispatcher registers one reference
per such pending ack (`add_entry`), and every later removal of one of those pending acks drops
a reference (`reduce_ref_count`). Until the count reaches zero, `should_block` tells the
dispatcher not to send the slot to anyone but A (broker reference §2.7.2).

    slot -> DrainingHashEntry(consumer, ref_count, blocked_count)

* `add_entry(consumer, slot)` creates the entry or bumps its count. Slot 0 ("hash not set")
  and a slot already draining for another consumer are invariant violations.
* `reduce_ref_count(consumer, slot, closing)` drops a reference; at zero the entry goes away,
  the consumer's `drainingHashesClearedTotal` rises, and, when dispatch was blocked on the slot
  (`blocked_count > 0`) and the removal is not the consumer closing, an *unblock* event fires:
  the dispatcher schedules a read. Between `start_batch()` and the matching `end_batch()`
  (nestable) events collapse into one, fired with slot -1 when the outermost batch ends.
* `should_block(consumer, slot)`: no entry, don't block. An entry of this same consumer means
  the slot came back to its draining owner, so the entry is dropped and nothing blocks.
  Otherwise the entry's `blocked_count` rises and the dispatch is blocked.

Per consumer the tracker keeps the set of its draining slots and a cleared counter, which the
topic stats report (`consumer_stats`). Plain synchronous state for one dispatcher; consumers are
keyed by identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from ._selectors import STICKY_KEY_HASH_NOT_SET

__all__ = [
    "UNBLOCKED_IN_BATCH",
    "ConsumerDrainingStats",
    "DrainingHash",
    "DrainingHashEntry",
    "DrainingHashesTracker",
]

K = TypeVar("K")

UNBLOCKED_IN_BATCH: Final = -1  # the slot an end-of-batch unblock event carries


@dataclass(eq=False)
class DrainingHashEntry(Generic[K]):
    """One draining slot: its owner, pending-ack references and blocked dispatch attempts."""

    consumer: K
    ref_count: int = 0
    blocked_count: int = 0


@dataclass(frozen=True)
class DrainingHash:
    """One draining slot as the consumer stats report it."""

    hash: int
    unack_msgs: int
    blocked_attempts: int

    def to_json(self) -> dict[str, int]:
        return {"hash": self.hash, "unackMsgs": self.unack_msgs,
                "blockedAttempts": self.blocked_attempts}


@dataclass(frozen=True)
class ConsumerDrainingStats:
    """A consumer's draining counters (all zero for a consumer that never drained)."""

    draining_hashes_count: int = 0
    draining_hashes_cleared_total: int = 0
    draining_hashes_unacked_messages: int = 0
    draining_hashes: tuple[DrainingHash, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The topic-stats fields, with Pulsar's names."""
        return {
            "drainingHashesCount": self.draining_hashes_count,
            "drainingHashesClearedTotal": self.draining_hashes_cleared_total,
            "drainingHashesUnackedMessages": self.draining_hashes_unacked_messages,
            "drainingHashes": [h.to_json() for h in self.draining_hashes],
        }


@dataclass
class _ConsumerCounters:
    slots: set[int] = field(default_factory=set)
    cleared_total: int = 0


class DrainingHashesTracker(Generic[K]):
    """The draining slots of one Key_Shared dispatcher."""

    def __init__(self, name: str, on_unblocked: Callable[[int], None]) -> None:
        """Args:
            name: the dispatcher's name, for error messages.
            on_unblocked: called with the slot that stopped blocking, or with -1 once at the
                end of an outermost batch in which some slot did.
        """
        self._name = name
        self._on_unblocked = on_unblocked
        self._entries: dict[int, DrainingHashEntry[K]] = {}
        self._counters: dict[K, _ConsumerCounters] = {}
        self._batch_depth = 0
        self._unblocked_in_batch = False

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def batch_depth(self) -> int:
        return self._batch_depth

    def get_entry(self, slot: int) -> DrainingHashEntry[K] | None:
        """The entry of a draining slot, or None."""
        return self._entries.get(slot)

    def add_entry(self, consumer: K, slot: int) -> None:
        """Register one pending ack of `consumer` in a slot it no longer owns.

        Raises:
            ValueError: slot 0.
            RuntimeError: the slot is already draining for another consumer (state unchanged).
        """
        if slot == STICKY_KEY_HASH_NOT_SET:
            raise ValueError("sticky key hash 0 cannot drain")
        entry = self._entries.get(slot)
        if entry is None:
            entry = self._entries[slot] = DrainingHashEntry(consumer)
            self._counters.setdefault(consumer, _ConsumerCounters()).slots.add(slot)
        elif entry.consumer is not consumer:
            raise RuntimeError(self._conflict(entry.consumer, consumer, slot))
        entry.ref_count += 1

    def reduce_ref_count(self, consumer: K, slot: int, closing: bool) -> None:
        """Drop one reference of `consumer` to `slot`; a slot that is not draining is ignored.

        Args:
            consumer: the consumer whose pending ack went away.
            slot: the pending ack's slot.
            closing: the pending ack went away because the consumer is closing; then no
                unblock event fires (the close itself triggers a read).

        Raises:
            RuntimeError: the slot is draining for another consumer (state unchanged).
        """
        entry = self._entries.get(slot) if slot != STICKY_KEY_HASH_NOT_SET else None
        if entry is None:
            return
        if entry.consumer is not consumer:
            raise RuntimeError(self._conflict(entry.consumer, consumer, slot))
        entry.ref_count -= 1
        assert entry.ref_count >= 0
        if entry.ref_count > 0:
            return
        del self._entries[slot]
        self._cleared(consumer, slot)
        if entry.blocked_count > 0 and not closing:
            if self._batch_depth > 0:
                self._unblocked_in_batch = True
            else:
                self._on_unblocked(slot)

    def should_block(self, consumer: K, slot: int) -> bool:
        """Whether dispatching `slot` to `consumer` must wait for the slot to drain.

        A slot draining for `consumer` itself has come back to its owner: the entry is
        dropped and nothing blocks. A slot draining for another consumer blocks, and the
        attempt is counted (it makes the eventual release fire an unblock event).
        """
        entry = self._entries.get(slot) if slot != STICKY_KEY_HASH_NOT_SET else None
        if entry is None:
            return False
        if entry.consumer is consumer:
            del self._entries[slot]
            self._cleared(consumer, slot)
            return False
        entry.blocked_count += 1
        return True

    def start_batch(self) -> None:
        """Begin a batch of removals; unblock events wait for the outermost `end_batch`."""
        self._batch_depth += 1

    def end_batch(self) -> None:
        """End a batch; the outermost end fires one event (slot -1) if any slot unblocked."""
        assert self._batch_depth > 0, "end_batch without start_batch"
        self._batch_depth -= 1
        if self._batch_depth == 0 and self._unblocked_in_batch:
            self._unblocked_in_batch = False
            self._on_unblocked(UNBLOCKED_IN_BATCH)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """`start_batch()` ... `end_batch()` as a context manager."""
        self.start_batch()
        try:
            yield
        finally:
            self.end_batch()

    def clear(self) -> None:
        """Forget every draining slot and every consumer's counters (last consumer left)."""
        self._entries.clear()
        self._counters.clear()

    def consumer_removed(self, consumer: K) -> None:
        """Drop a departed consumer's stats entry."""
        self._counters.pop(consumer, None)

    def consumer_stats(self, consumer: K) -> ConsumerDrainingStats:
        """The consumer's draining counters and its draining slots, ascending."""
        counters = self._counters.get(consumer)
        if counters is None:
            return ConsumerDrainingStats()
        hashes = tuple(
            DrainingHash(slot, entry.ref_count, entry.blocked_count)
            for slot in sorted(counters.slots)
            if (entry := self._entries.get(slot)) is not None)
        return ConsumerDrainingStats(
            draining_hashes_count=len(hashes),
            draining_hashes_cleared_total=counters.cleared_total,
            draining_hashes_unacked_messages=sum(h.unack_msgs for h in hashes),
            draining_hashes=hashes)

    def _cleared(self, consumer: K, slot: int) -> None:
        counters = self._counters.get(consumer)
        if counters is not None:
            counters.slots.discard(slot)
            counters.cleared_total += 1

    def _conflict(self, owner: K, other: K, slot: int) -> str:
        return (f"consumer {owner} is already draining hash {slot} in dispatcher {self._name}; "
                f"the same hash is being used for consumer {other}")
