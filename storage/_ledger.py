"""A ledger's in-memory state, and what `list_ledgers` reports of it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._index import LedgerRecord

__all__ = ["LedgerInfo", "LedgerState"]

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
