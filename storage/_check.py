"""`check()` and `inspect()`: verify a data directory and describe what it holds.

`Storage.check`/`Storage.inspect` look at an open store. `check_data_dir` and
`inspect_data_dir` (`magnetar storage check|inspect`) never write: they take no exclusive
lock (a shared `flock` on LOCK while they run, so a broker cannot start meanwhile; none on
a copy without LOCK), open LMDB read-only without its lock file, run no recovery, and
report what recovery WOULD do (`plan_recovery`) next to what they find. A directory a live
process holds is refused with `DataDirLockedError` naming its PID.

The checks of an open store see it through `CheckedStore` (its locks, ledger table, write
cache, entry logs, index and journal directory), not through `Storage` itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import lmdb

from ._config import StorageConfig
from ._entry_log import EntryLogReader
from ._entry_logs import EntryLogs
from ._errors import CorruptionError, DataDirLockedError
from ._fs import OsFileSystem
from ._index import Index
from ._journal import JournalMark, parse_segment_name
from ._ledger import DELETED, LedgerTable
from ._recovery import RecoveryPlan, plan_recovery
from ._write_cache import WriteCache

if TYPE_CHECKING:
    import threading

    from ._checkpoint import Checkpointer
    from ._fs import FileSystem

__all__ = [
    "CheckReport",
    "CheckedStore",
    "InspectReport",
    "check_data_dir",
    "check_storage",
    "inspect_data_dir",
    "inspect_storage",
]

PROBLEMS_LISTED_MAX = 100


class CheckedStore(Protocol):
    """What `check_storage` and `inspect_storage` read of an open store (`Storage`)."""

    @property
    def lock(self) -> threading.Condition: ...

    @property
    def checkpointer(self) -> Checkpointer: ...

    @property
    def ledgers(self) -> LedgerTable: ...

    @property
    def cache(self) -> WriteCache: ...

    @property
    def logs(self) -> EntryLogs: ...

    @property
    def index(self) -> Index: ...

    @property
    def fs(self) -> FileSystem: ...

    @property
    def journal_dir(self) -> str: ...


@dataclass
class CheckReport:
    """What `Storage.check` found. `ok` is True when `problems` is empty."""

    ledgers_checked: int = 0
    entries_checked: int = 0
    problems: list[str] = field(default_factory=list)
    problems_total: int = 0
    notes: list[str] = field(default_factory=list)  # what recovery would do (read-only)

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
        if self.notes:
            lines.append("recovery (not run; the directory was only read):")
            lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def check_storage(store: CheckedStore) -> CheckReport:
    report = CheckReport()
    with store.checkpointer.lock:
        with store.lock:
            ledgers = {i: (s.state, s.lac) for i, s in store.ledgers.ledgers.items()}
            purging = set(store.ledgers.purge)  # deleted; the next checkpoint purges them
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
                store.logs.reader.read(location, ledger_id, entry_id)
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


def _check_entry_logs(store: CheckedStore, report: CheckReport) -> None:
    for log_id in store.logs.records:
        path = store.logs.path(log_id)
        if not os.path.exists(path):
            report.problem(f"entry log {path} is registered but missing")


@dataclass
class InspectReport:
    ledgers: list[tuple[int, str, int, dict[str, str]]]
    segments: list[tuple[int, int]]
    mark: JournalMark | None
    entry_logs: list[tuple[int, int, int, int, bool]]
    cache_bytes: int
    notes: list[str] = field(default_factory=list)  # what recovery would do (read-only)
    problems: list[str] = field(default_factory=list)  # what would make it refuse

    def render(self) -> str:
        cache = (f"write cache: {self.cache_bytes} bytes" if not self.notes else
                 f"journal to replay: {self.cache_bytes} bytes of entries")
        lines = [f"mark: {self.mark}", cache, f"journal segments ({len(self.segments)}):"]
        lines += [f"  {sid:016x}.jnl  {size} bytes" for sid, size in self.segments]
        lines.append(f"entry logs ({len(self.entry_logs)}):")
        for log_id, size, total, live, sealed in self.entry_logs:
            ratio = live / total if total else 0.0
            lines.append(f"  {log_id:08x}.log  {size} bytes  live {live}/{total} "
                         f"({ratio:.0%}){'  sealed' if sealed else ''}")
        lines.append(f"ledgers ({len(self.ledgers)}):")
        for ledger_id, state, lac, metadata in self.ledgers:
            lines.append(f"  {ledger_id}  {state}  lac={lac}  {metadata or ''}")
        if self.notes:
            lines.append("recovery (not run; the directory was only read):")
            lines += [f"  {n}" for n in self.notes]
        if self.problems:
            lines.append(f"recovery would refuse to start ({len(self.problems)} problems):")
            lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def inspect_storage(store: CheckedStore) -> InspectReport:
    with store.lock:
        ledgers = [(i, s.state, s.lac, dict(s.metadata))
                   for i, s in sorted(store.ledgers.ledgers.items()) if s.state != DELETED]
        cache_bytes = store.cache.total_bytes()
    segments = []
    for name in store.fs.listdir(store.journal_dir):
        segment_id = parse_segment_name(name)
        if segment_id is not None:
            segments.append((segment_id, os.path.getsize(os.path.join(store.journal_dir, name))))
    with store.checkpointer.lock:
        logs = [(i, r.size, r.total_bytes, r.live_bytes(), r.sealed)
                for i, r in sorted(store.logs.records.items())]
    return InspectReport(ledgers, sorted(segments), store.index.persisted_mark, logs,
                         cache_bytes)


# -- read-only, on a data directory --------------------------------------------------------

@contextlib.contextmanager
def _shared_lock(data_dir: str) -> Iterator[None]:
    """Hold a shared lock on the data directory's LOCK file, if there is one.

    Raises:
        DataDirLockedError: a live process holds the exclusive lock.
        FileNotFoundError: `data_dir` is not a directory.
    """
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(errno.ENOENT, "no such data directory", data_dir)
    try:
        fd = os.open(os.path.join(data_dir, "LOCK"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise DataDirLockedError(data_dir, int(text) if text.isdigit() else None) from None
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _read_only(data_dir: str, config: StorageConfig) -> Iterator[tuple[Index, RecoveryPlan]]:
    with _shared_lock(data_dir):
        index = Index(os.path.join(data_dir, "index"), config.lmdb_map_bytes, readonly=True)
        try:
            yield index, plan_recovery(data_dir, config, OsFileSystem(), index)
        finally:
            index.close()


def _index_problem(data_dir: str, exc: lmdb.Error, doing: str) -> str:
    path = os.path.join(data_dir, "index", "data.mdb")
    return f"index {path} is unreadable ({doing}): {type(exc).__name__}: {exc}"


def check_data_dir(data_dir: str, config: StorageConfig | None = None) -> CheckReport:
    """Verify a data directory without writing to it (see the module comment): what
    recovery would do or refuse, every indexed entry against the entry logs (CRC, ids),
    each ledger's entries 0..LAC in the index or in the journal recovery would replay,
    and the LMDB index itself. Each problem names the file and offset where known.

    Raises:
        DataDirLockedError: a live process holds the directory (nothing was read).
        FileNotFoundError: `data_dir` is not a directory.
    """
    config = config or StorageConfig()
    data_dir = os.path.abspath(data_dir)
    report = CheckReport()
    try:
        with _read_only(data_dir, config) as (index, plan):
            report.notes = plan.actions
            for problem in plan.problems:
                report.problem(problem)
            _check_index_entries(data_dir, config, index, plan, report)
    except lmdb.Error as exc:
        report.problem(_index_problem(data_dir, exc, "reading it"))
    return report


def _check_index_entries(data_dir: str, config: StorageConfig, index: Index,
                         plan: RecoveryPlan, report: CheckReport) -> None:
    reader = EntryLogReader(OsFileSystem(), os.path.join(data_dir, "entrylogs"),
                            config.open_entry_logs_max)
    indexed: dict[int, set[int]] = {}
    try:
        for ledger_id, entry_id, location in index.iter_locations():
            report.entries_checked += 1
            indexed.setdefault(ledger_id, set()).add(entry_id)
            ledger = plan.ledgers.get(ledger_id)
            if ledger is None or ledger.state == DELETED:
                if ledger is None:
                    report.problem(f"index holds ledger {ledger_id} entry {entry_id}, but "
                                   "the ledger is unknown")
                continue  # a deleted ledger's locations go with the next checkpoint
            try:
                reader.read(location, ledger_id, entry_id)
            except CorruptionError as exc:
                report.problem(f"ledger {ledger_id} entry {entry_id}: {exc}")
            except OSError as exc:
                report.problem(f"ledger {ledger_id} entry {entry_id}: {exc}")
    except lmdb.Error as exc:
        report.problem(_index_problem(data_dir, exc, "reading entry locations after "
                                      f"{report.entries_checked} entries"))
        return
    finally:
        reader.close()
    for ledger_id, ledger in sorted(plan.ledgers.items()):
        if ledger.state == DELETED:
            continue
        report.ledgers_checked += 1
        have = indexed.get(ledger_id, set()) | plan.replayed.get(ledger_id, set())
        absent = [e for e in range(ledger.lac + 1) if e not in have]
        if absent:
            report.problem(f"ledger {ledger_id} lacks entries {absent[:10]} at or below "
                           f"its LAC {ledger.lac}")


def inspect_data_dir(data_dir: str, config: StorageConfig | None = None) -> InspectReport:
    """Describe a data directory without writing to it: the ledgers as recovery would
    leave them, the journal segments, the mark, the entry logs, and what recovery would
    do (see the module comment).

    Raises:
        DataDirLockedError: a live process holds the directory.
        FileNotFoundError: `data_dir` is not a directory.
        lmdb.Error: the index cannot be read (`check_data_dir` reports it).
    """
    config = config or StorageConfig()
    data_dir = os.path.abspath(data_dir)
    with _read_only(data_dir, config) as (index, plan):
        ledgers = [(i, s.state, s.lac, dict(s.metadata))
                   for i, s in sorted(plan.ledgers.items()) if s.state != DELETED]
        journal_dir = os.path.join(data_dir, "journal")
        segments = []
        for name in sorted(os.listdir(journal_dir)):
            segment_id = parse_segment_name(name)
            if segment_id is not None:
                segments.append((segment_id, os.path.getsize(os.path.join(journal_dir, name))))
        logs = [(i, r.size, r.total_bytes, r.live_bytes(), r.sealed)
                for i, r in sorted(plan.entry_logs.items())]
        return InspectReport(ledgers, segments, index.persisted_mark, logs, plan.entry_bytes,
                             plan.actions, plan.problems)
