"""A ledger's in-memory state, the table of all of them, and what `list_ledgers` reports."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._index import CLOSED, DELETED, FENCED, OPEN, STATES, LedgerRecord, MetadataPairs

__all__ = ["CLOSED", "DELETED", "FENCED", "OPEN", "LedgerInfo", "LedgerState", "LedgerTable"]


class LedgerState:
    """One ledger. Mutated under the storage lock, except `lac`, which the journal's
    syncer advances (entry ids of one ledger become durable in order). `metadata` is kept as
    its (key, value) pairs, the very tuples `LedgerTable` indexes it by: a tuple of one pair
    is a third of a one-key dict's size, and there is one ledger or more per topic."""

    __slots__ = ("lac", "ledger_id", "metadata", "next_entry_id", "state")

    def __init__(self, ledger_id: int, metadata: Mapping[str, str] | MetadataPairs,
                 state: str = OPEN, lac: int = -1):
        assert state in STATES
        self.ledger_id = ledger_id
        self.metadata: MetadataPairs = (metadata if isinstance(metadata, tuple)
                                        else tuple(metadata.items()))
        self.state = state
        self.lac = lac
        self.next_entry_id = lac + 1

    def record(self) -> LedgerRecord:
        last = self.next_entry_id - 1 if self.state == CLOSED else self.lac
        return LedgerRecord(self.ledger_id, self.state, last, dict(self.metadata))

    def info(self) -> LedgerInfo:
        return LedgerInfo(self.ledger_id, self.state, self.lac, dict(self.metadata))


class LedgerTable:
    """Every ledger of one data directory, the next ledger id, and what the next checkpoint
    must persist: the ledgers changed since the last one (`dirty`) and the deleted ones whose
    locations it must purge (`purge`). Recovery fills it, `Storage` changes it under its
    lock, and the checkpointer takes what changed (`take_changes`).

    `tagged` finds the ledgers whose metadata holds one (key, value) pair without a scan of
    every ledger (a managed ledger finds its own this way on open, among one per topic):
    `_by_tag` indexes every pair of the ledgers added or loaded, and forgets a ledger once it
    is deleted; `tagged` checks the state anyway (a deletion while the disk is full is not
    told here).

    Tombstones: a deleted ledger stays in the table (and its DELETED record in the index)
    only until replaying the journal can no longer bring it back, that is, until a persisted
    mark is past its LEDGER_DELETE record (and so past its LEDGER_CREATE and every add, which
    were journaled before it). `tombstones` queues (journal position, ledger id) in position
    order: the position is where the journal's acknowledged data ended when the delete was
    acknowledged (`Storage._on_durable`, appended without the storage lock: a deque append is
    atomic), or, for the tombstones a recovery found (loaded or replayed), the start of the
    journal's fresh segment (`recovered_tombstones`). A checkpoint takes the ones its mark
    covers (`take_purgeable`), deletes their records in the same LMDB transaction as it
    persists that mark, and then `forget`s them. The queue needs no limit of its own: it
    holds at most one entry per deleted ledger still in the table (a ledger is deleted
    once), and checkpoints drain it. The id counter stays where it was: the
    checkpoint persists `next_id` as `nextLedgerId`, which only grows, so no id comes back."""

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerState] = {}
        self.next_id = 1
        self.dirty: set[int] = set()
        self.purge: set[int] = set()
        self.tombstones: deque[tuple[tuple[int, int], int]] = deque()
        # Most tags are one ledger's: an id, a list of ids only for the others.
        self._by_tag: dict[tuple[str, str], int | list[int]] = {}

    def get(self, ledger_id: int) -> LedgerState | None:
        return self.ledgers.get(ledger_id)

    def __len__(self) -> int:
        return len(self.ledgers)

    def load(self, ledger: LedgerState) -> None:
        """A ledger as the index holds it (recovery): nothing to persist."""
        assert ledger.ledger_id not in self.ledgers
        self.ledgers[ledger.ledger_id] = ledger
        if ledger.state != DELETED:
            self._index(ledger)

    def load_many(self, ledgers: list[LedgerState]) -> None:
        """`load` of each (recovery loads every ledger of the index at open)."""
        table, index = self.ledgers, self._index
        for ledger in ledgers:
            assert ledger.ledger_id not in table
            table[ledger.ledger_id] = ledger
            if ledger.state != DELETED:
                index(ledger)

    def add(self, ledger: LedgerState) -> None:
        """A new ledger (created or replayed); the next checkpoint records it."""
        assert ledger.ledger_id not in self.ledgers
        self.ledgers[ledger.ledger_id] = ledger
        self._index(ledger)
        self.dirty.add(ledger.ledger_id)
        self.next_id = max(self.next_id, ledger.ledger_id + 1)

    def _index(self, ledger: LedgerState) -> None:
        by_tag = self._by_tag
        for tag in ledger.metadata:
            ids = by_tag.get(tag)
            if ids is None:
                by_tag[tag] = ledger.ledger_id
            elif isinstance(ids, int):
                by_tag[tag] = [ids, ledger.ledger_id]
            else:
                ids.append(ledger.ledger_id)

    def tagged(self, key: str, value: str) -> list[LedgerState]:
        """The ledgers not deleted whose metadata maps `key` to `value`, by id."""
        found = self._by_tag.get((key, value), ())
        ids = [found] if isinstance(found, int) else sorted(found)
        return [ledger for ledger in map(self.ledgers.__getitem__, ids)
                if ledger.state != DELETED]

    def changed(self, ledger_id: int, *, deleted: bool = False) -> None:
        """A ledger's state changed; a deleted one's locations are purged as well."""
        assert ledger_id in self.ledgers
        self.dirty.add(ledger_id)
        if deleted:
            self.purge.add(ledger_id)
            for tag in self.ledgers[ledger_id].metadata:
                ids = self._by_tag.get(tag)
                if ids == ledger_id:
                    del self._by_tag[tag]
                elif isinstance(ids, list) and ledger_id in ids:
                    ids.remove(ledger_id)
                    if len(ids) == 1:
                        self._by_tag[tag] = ids[0]

    def take_changes(self) -> tuple[list[LedgerRecord], list[int]]:
        """The records of the changed ledgers and the ids to purge, by id; both are then
        forgotten (a checkpoint persists them)."""
        records = [self.ledgers[i].record() for i in sorted(self.dirty)]
        purge = sorted(self.purge)
        self.dirty.clear()
        self.purge.clear()
        return records, purge

    def has_changes(self) -> bool:
        return bool(self.dirty)

    def recovered_tombstones(self, fresh_segment_id: int) -> None:
        """Queue every deleted ledger a recovery left in the table (before any live delete):
        a mark in the journal's fresh segment is past every record of theirs."""
        self.tombstones.extend(((fresh_segment_id, 0), ledger_id) for ledger_id, ledger
                               in self.ledgers.items() if ledger.state == DELETED)

    def purgeable(self, mark: tuple[int, int]) -> bool:
        """Whether a checkpoint persisting `mark` (segment, offset) would purge a tombstone."""
        tombstones = self.tombstones
        return bool(tombstones) and tombstones[0][0] <= mark

    def take_purgeable(self, mark: tuple[int, int], count_max: int) -> list[int]:
        """Up to `count_max` tombstones that `mark` (segment, offset) covers, out of the
        queue (the checkpoint that persists `mark` purges them; the one consumer)."""
        tombstones, taken = self.tombstones, list[int]()
        while tombstones and len(taken) < count_max and tombstones[0][0] <= mark:
            taken.append(tombstones.popleft()[1])
        return taken

    def forget(self, ledger_ids: list[int]) -> None:
        """Drop purged tombstones (their records left the index with a persisted mark)."""
        for ledger_id in ledger_ids:
            ledger = self.ledgers.pop(ledger_id)
            assert ledger.state == DELETED, f"purged ledger {ledger_id} is {ledger.state}"


@dataclass(frozen=True)
class LedgerInfo:
    """A ledger as `Storage.list_ledgers` reports it."""

    ledger_id: int
    state: str
    last_add_confirmed: int
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def entries(self) -> int:
        return self.last_add_confirmed + 1
