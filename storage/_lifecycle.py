"""A ledger's life in the engine: created, fenced, closed, deleted, one at a time or many
at once (`Storage.start_ledger`, `fence`, `close_ledger(s)`, `delete_ledger(s)`).

Each change is applied to the ledger table under the storage lock (the next checkpoint
persists it) and journaled as one record; its completion finishes once that record is
durable (see `_storage.py`). A batch (`end_ledgers`) makes one lock hold and one journal
submission of its records.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Sequence
from typing import Protocol

from ._completion import Completion
from ._errors import LedgerNotFoundError
from ._journal import Journal, JournalRequest
from ._journal_format import RecordType
from ._ledger import CLOSED, DELETED, FENCED, OPEN, LedgerState, LedgerTable

__all__ = ["close_ledger", "delete_ledger", "end_ledgers", "fence", "start_ledger"]

_U64 = struct.Struct(">Q")
_CLOSE = struct.Struct(">Qq")


class _Engine(Protocol):
    """The parts of `Storage` that the ledger lifecycle uses."""

    lock: threading.Condition
    journal: Journal | None
    ledgers: LedgerTable

    def _check_writable(self) -> None: ...

    def _ledger(self, ledger_id: int) -> LedgerState: ...

    def _journal_op(self, kind: RecordType, payload: bytes, value: int) -> Completion[int]: ...


def start_ledger(engine: _Engine, metadata: dict[str, str]) -> tuple[int, Completion[int]]:
    with engine.lock:
        engine._check_writable()
        ledger_id = engine.ledgers.next_id
        engine.ledgers.add(LedgerState(ledger_id, metadata))
        payload = _U64.pack(ledger_id) + json.dumps(metadata, sort_keys=True).encode()
        return ledger_id, engine._journal_op(RecordType.LEDGER_CREATE, payload, ledger_id)


def fence(engine: _Engine, ledger_id: int) -> Completion[int]:
    with engine.lock:
        engine._check_writable()
        ledger = engine._ledger(ledger_id)
        if ledger.state != OPEN:
            return Completion.resolved(ledger.lac)
        ledger.state = FENCED
        engine.ledgers.changed(ledger_id)
        return engine._journal_op(RecordType.FENCE, _U64.pack(ledger_id),
                                  ledger.next_entry_id - 1)


def close_ledger(engine: _Engine, ledger_id: int) -> Completion[int]:
    with engine.lock:
        engine._check_writable()
        ledger = engine._ledger(ledger_id)
        last = ledger.next_entry_id - 1
        if ledger.state == CLOSED:
            return Completion.resolved(last)
        ledger.state = CLOSED
        engine.ledgers.changed(ledger_id)
        return engine._journal_op(RecordType.LEDGER_CLOSE, _CLOSE.pack(ledger_id, last), last)


def end_ledgers(engine: _Engine, ledger_ids: Sequence[int],
                state: str) -> list[Completion[int]]:
    """Close (`state` CLOSED) or delete (DELETED) ledgers: one lock hold, one journal
    submission of their records, a completion each."""
    completions: list[Completion[int]] = []
    requests: list[JournalRequest] = []
    with engine.lock:
        engine._check_writable()
        for ledger_id in ledger_ids:
            try:
                ledger = engine._ledger(ledger_id)
            except LedgerNotFoundError as error:
                completions.append(Completion.failed(error))
                continue
            last = ledger.next_entry_id - 1
            if state == CLOSED and ledger.state == CLOSED:
                completions.append(Completion.resolved(last))
                continue
            ledger.state = state
            completion: Completion[int] = Completion()
            completions.append(completion)
            if state == CLOSED:
                engine.ledgers.changed(ledger_id)
                requests.append(JournalRequest(RecordType.LEDGER_CLOSE, _CLOSE.pack(
                    ledger_id, last), completion, None, last))
            else:
                engine.ledgers.changed(ledger_id, deleted=True)
                requests.append(JournalRequest(RecordType.LEDGER_DELETE, _U64.pack(
                    ledger_id), completion, None, ledger_id))
        if requests:
            assert engine.journal is not None
            engine.journal.submit_many(requests)
    return completions


def delete_ledger(engine: _Engine, ledger_id: int) -> Completion[int]:
    """`Storage.delete_ledger` while the disk is not full."""
    with engine.lock:
        engine._check_writable()
        ledger = engine._ledger(ledger_id)
        ledger.state = DELETED
        engine.ledgers.changed(ledger_id, deleted=True)
        return engine._journal_op(RecordType.LEDGER_DELETE, _U64.pack(ledger_id), ledger_id)
