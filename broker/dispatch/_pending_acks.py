"""Pending acks: the entries a Shared or Key_Shared consumer holds unacknowledged.

Theory of operation
-------------------

Every consumer of a Shared or Key_Shared subscription has one `PendingAcksMap`:

    (ledger_id, entry_id) -> PendingAck(batch_size, slot)

An entry is added when it is dispatched and removed when the whole entry is acknowledged, when
it is redelivered, when the mark-delete position passes it (`remove_all_up_to`), or, all at
once, when the consumer closes (`for_each_and_close`). A batch entry counts once (broker
reference §2.7.2, §12).

Two hooks tie the map to the dispatcher's draining-hash state without the map knowing about
it. The *add hook* may refuse an add (the slot is draining for another consumer, or is waiting
in the replay queue); a refused entry is not sent. The *remove handler* hears every removal
(`closing` tells a close from an ack) and brackets the bulk removals with
`start_batch`/`end_batch`, so the draining tracker fires one unblock event per sweep. After
`for_each_and_close` the map refuses every add.

Storage is a dict per ledger, in insertion order. Entries are normally dispatched in position
order, so the dicts are normally sorted; an out-of-order add (a replayed entry) marks its
ledger unsorted and the next ordered walk re-sorts it once. Adds, lookups and removals are
O(1); a mark-delete sweep costs O(entries removed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, NamedTuple, Protocol, TypeVar

__all__ = [
    "PendingAck",
    "PendingAcksAddHook",
    "PendingAcksMap",
    "PendingAcksRemoveHandler",
]

K = TypeVar("K")
K_contra = TypeVar("K_contra", contravariant=True)

EntryVisitor = Callable[[int, int, int, int], None]  # ledger_id, entry_id, batch_size, slot


class PendingAck(NamedTuple):
    batch_size: int
    slot: int


PendingAcksAddHook = Callable[[K, int, int, int], bool]
"""`(consumer, ledger_id, entry_id, slot) -> allowed`: False refuses the add."""


class PendingAcksRemoveHandler(Protocol[K_contra]):
    """Hears removals from a consumer's pending acks (the dispatcher's draining bookkeeping)."""

    def handle_removing(self, consumer: K_contra, ledger_id: int, entry_id: int, slot: int,
                        closing: bool) -> None: ...

    def start_batch(self) -> None: ...

    def end_batch(self) -> None: ...


class _Ledger:
    __slots__ = ("entries", "sorted")

    def __init__(self) -> None:
        self.entries: dict[int, PendingAck] = {}
        self.sorted = True

    def ordered(self) -> dict[int, PendingAck]:
        if not self.sorted:
            self.entries = dict(sorted(self.entries.items()))
            self.sorted = True
        return self.entries


class PendingAcksMap(Generic[K]):
    """One consumer's pending acks, in position order."""

    def __init__(self, consumer: K, add_hook: PendingAcksAddHook[K] | None = None,
                 remove_handler: PendingAcksRemoveHandler[K] | None = None) -> None:
        """Args:
            consumer: the owner, passed to the hooks.
            add_hook: consulted before each add; may be set later through `add_hook`.
            remove_handler: told about each removal; may be set later.
        """
        self._consumer = consumer
        self.add_hook = add_hook
        self.remove_handler = remove_handler
        self._ledgers: dict[int, _Ledger] = {}
        self._size = 0
        self._closed = False

    def __len__(self) -> int:
        return self._size

    def __contains__(self, position: tuple[int, int]) -> bool:
        return self.get(*position) is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self, ledger_id: int, entry_id: int) -> PendingAck | None:
        ledger = self._ledgers.get(ledger_id)
        return None if ledger is None else ledger.entries.get(entry_id)

    def add(self, ledger_id: int, entry_id: int, batch_size: int, slot: int) -> bool:
        """Record a dispatched entry, if the map is open and the add hook allows it.

        Args:
            ledger_id, entry_id: the entry's position.
            batch_size: messages in the entry.
            slot: its sticky-key hash slot (0 when not Key_Shared).

        Returns:
            True if recorded (the entry may be sent); False if refused (it must not be sent).
            An entry already present is overwritten.
        """
        assert batch_size >= 1
        if self._closed:
            return False
        if self.add_hook is not None and not self.add_hook(
                self._consumer, ledger_id, entry_id, slot):
            return False
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = _Ledger()
        entries = ledger.entries
        if entry_id not in entries:
            self._size += 1
            if entries and entry_id < next(reversed(entries)):
                ledger.sorted = False
        entries[entry_id] = PendingAck(batch_size, slot)
        return True

    def remove(self, ledger_id: int, entry_id: int) -> PendingAck | None:
        """Remove one entry (ack or redelivery) and tell the remove handler.

        Returns:
            What was recorded, or None if the entry was not pending.
        """
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            return None
        removed = ledger.entries.pop(entry_id, None)
        if removed is None:
            return None
        self._size -= 1
        if not ledger.entries:
            del self._ledgers[ledger_id]
        if self.remove_handler is not None:
            self.remove_handler.handle_removing(self._consumer, ledger_id, entry_id,
                                                removed.slot, False)
        return removed

    def remove_all_up_to(self, ledger_id: int, entry_id: int,
                         on_removed: EntryVisitor | None = None) -> int:
        """Remove every entry at or below `(ledger_id, entry_id)` (the mark-delete passed it).

        Args:
            ledger_id, entry_id: the new mark-delete position, inclusive.
            on_removed: called per removed entry, in position order.

        Returns:
            The number of entries removed. The remove handler hears each of them, inside
            one batch.
        """
        doomed: list[tuple[int, int, PendingAck]] = []
        for lid in sorted(lid for lid in self._ledgers if lid <= ledger_id):
            for eid, ack in self._ledgers[lid].ordered().items():
                if lid == ledger_id and eid > entry_id:
                    break
                doomed.append((lid, eid, ack))
        if doomed:
            self._remove_many(doomed, on_removed)
        return len(doomed)

    def _remove_many(self, doomed: list[tuple[int, int, PendingAck]],
                     on_removed: EntryVisitor | None) -> None:
        handler = self.remove_handler
        if handler is not None:
            handler.start_batch()
        try:
            for lid, eid, ack in doomed:
                ledger = self._ledgers[lid]
                del ledger.entries[eid]
                self._size -= 1
                if not ledger.entries:
                    del self._ledgers[lid]
                if on_removed is not None:
                    on_removed(lid, eid, ack.batch_size, ack.slot)
                if handler is not None:
                    handler.handle_removing(self._consumer, lid, eid, ack.slot, False)
        finally:
            if handler is not None:
                handler.end_batch()

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        """`(ledger_id, entry_id, batch_size, slot)` in position order (a snapshot)."""
        return iter(self._ordered_items())

    def for_each(self, visit: EntryVisitor) -> None:
        """Call `visit(ledger_id, entry_id, batch_size, slot)` per entry, in position order."""
        for item in self._ordered_items():
            visit(*item)

    def for_each_and_close(self, visit: EntryVisitor) -> None:
        """Close the map and empty it: per entry, in position order, `visit` it and then tell
        the remove handler (`closing=True`), all inside one batch. Later adds are refused."""
        self._closed = True
        items = self._ordered_items()
        self._ledgers.clear()
        self._size = 0
        handler = self.remove_handler
        if handler is not None:
            handler.start_batch()
        try:
            for lid, eid, batch_size, slot in items:
                visit(lid, eid, batch_size, slot)
                if handler is not None:
                    handler.handle_removing(self._consumer, lid, eid, slot, True)
        finally:
            if handler is not None:
                handler.end_batch()

    def _ordered_items(self) -> list[tuple[int, int, int, int]]:
        items = [(lid, eid, ack.batch_size, ack.slot)
                 for lid in sorted(self._ledgers)
                 for eid, ack in self._ledgers[lid].ordered().items()]
        assert len(items) == self._size
        return items
