"""`check()` and `inspect()`: verify a data directory and describe what it holds."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._errors import CorruptionError
from ._journal import JournalMark, parse_segment_name
from ._ledger import DELETED

if TYPE_CHECKING:
    from ._storage import Storage

__all__ = ["CheckReport", "InspectReport", "check_storage", "inspect_storage"]

PROBLEMS_LISTED_MAX = 100


@dataclass
class CheckReport:
    """What `Storage.check` found. `ok` is True when `problems` is empty."""

    ledgers_checked: int = 0
    entries_checked: int = 0
    problems: list[str] = field(default_factory=list)
    problems_total: int = 0

    @property
    def ok(self) -> bool:
        return self.problems_total == 0

    def problem(self, text: str) -> None:
        self.problems_total += 1
        if len(self.problems) < PROBLEMS_LISTED_MAX:
            self.problems.append(text)

    def render(self) -> str:
        lines = [f"check: {self.ledgers_checked} ledgers, {self.entries_checked} entries, "
                 f"{self.problems_total} problems"]
        lines += [f"  - {p}" for p in self.problems]
        if self.problems_total > len(self.problems):
            lines.append(f"  ... and {self.problems_total - len(self.problems)} more")
        return "\n".join(lines)


def check_storage(store: Storage) -> CheckReport:
    report = CheckReport()
    with store.checkpoint_lock:
        with store.lock:
            ledgers = {i: (s.state, s.lac) for i, s in store.ledgers.items()}
            purging = set(store.purge_ledgers)  # deleted; the next checkpoint purges them
            cached = {(ledger_id, entry_id)
                      for half in (store.cache.active, store.cache.flushing) if half is not None
                      for ledger_id, entries in half.entries.items() for entry_id in entries}
        indexed: dict[int, set[int]] = {}
        for ledger_id, entry_id, location in store.index.iter_locations():
            report.entries_checked += 1
            indexed.setdefault(ledger_id, set()).add(entry_id)
            state = ledgers.get(ledger_id, (None, -1))[0]
            if state == DELETED and ledger_id in purging:
                continue
            if state is None or state == DELETED:
                report.problem(f"index holds ledger {ledger_id} entry {entry_id}, but the "
                               f"ledger is {state or 'unknown'}")
                continue
            try:
                store.reader.read(location, ledger_id, entry_id)
            except CorruptionError as exc:
                report.problem(str(exc))
            except OSError as exc:
                report.problem(f"ledger {ledger_id} entry {entry_id}: {exc}")
        for ledger_id, (state, lac) in sorted(ledgers.items()):
            if state == DELETED:
                continue
            report.ledgers_checked += 1
            have = indexed.get(ledger_id, set())
            absent = [e for e in range(lac + 1) if e not in have and (ledger_id, e) not in cached]
            if absent:
                report.problem(f"ledger {ledger_id} lacks entries {absent[:10]} at or below "
                               f"its LAC {lac}")
        _check_entry_logs(store, report)
    return report


def _check_entry_logs(store: Storage, report: CheckReport) -> None:
    for log_id in store.entry_logs:
        path = store.reader.path(log_id)
        if not os.path.exists(path):
            report.problem(f"entry log {path} is registered but missing")


@dataclass
class InspectReport:
    ledgers: list[tuple[int, str, int, dict[str, str]]]
    segments: list[tuple[int, int]]
    mark: JournalMark | None
    entry_logs: list[tuple[int, int, int, int, bool]]
    cache_bytes: int

    def render(self) -> str:
        lines = [f"mark: {self.mark}", f"write cache: {self.cache_bytes} bytes",
                 f"journal segments ({len(self.segments)}):"]
        lines += [f"  {sid:016x}.jnl  {size} bytes" for sid, size in self.segments]
        lines.append(f"entry logs ({len(self.entry_logs)}):")
        for log_id, size, total, live, sealed in self.entry_logs:
            ratio = live / total if total else 0.0
            lines.append(f"  {log_id:08x}.log  {size} bytes  live {live}/{total} "
                         f"({ratio:.0%}){'  sealed' if sealed else ''}")
        lines.append(f"ledgers ({len(self.ledgers)}):")
        for ledger_id, state, lac, metadata in self.ledgers:
            lines.append(f"  {ledger_id}  {state}  lac={lac}  {metadata or ''}")
        return "\n".join(lines)


def inspect_storage(store: Storage) -> InspectReport:
    with store.lock:
        ledgers = [(i, s.state, s.lac, dict(s.metadata))
                   for i, s in sorted(store.ledgers.items()) if s.state != DELETED]
        cache_bytes = store.cache.total_bytes()
    segments = []
    for name in store.fs.listdir(store.journal_dir):
        segment_id = parse_segment_name(name)
        if segment_id is not None:
            segments.append((segment_id, os.path.getsize(os.path.join(store.journal_dir, name))))
    with store.checkpoint_lock:
        logs = [(i, r.size, r.total_bytes, r.live_bytes(), r.sealed)
                for i, r in sorted(store.entry_logs.items())]
    return InspectReport(ledgers, sorted(segments), store.index.persisted_mark, logs,
                         cache_bytes)
