"""A ledger's in-memory state, the table of all of them, and what `list_ledgers` reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._index import LedgerRecord

__all__ = ["LedgerInfo", "LedgerState", "LedgerTable"]

OPEN = "open"
FENCED = "fenced"
CLOSED = "closed"
DELETED = "deleted"
STATES = (OPEN, FENCED, CLOSED, DELETED)


class LedgerState:
    """One ledger. Mutated under the storage lock, except `lac`, which the journal's
    syncer advances (entry ids of one ledger become durable in order)."""

    __slots__ = ("lac", "ledger_id", "metadata", "next_entry_id", "state")

    def __init__(self, ledger_id: int, metadata: dict[str, str], state: str = OPEN,
                 lac: int = -1):
        assert state in STATES
        self.ledger_id = ledger_id
        self.metadata = metadata
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
    told here)."""

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerState] = {}
        self.next_id = 1
        self.dirty: set[int] = set()
        self.purge: set[int] = set()
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
        for tag in ledger.metadata.items():
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
            for tag in self.ledgers[ledger_id].metadata.items():
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
