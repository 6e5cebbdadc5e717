"""The crash harness's verifier (see `crashtest` for the theory of operation): after every
crash, `Verifier` reopens the store and checks each acknowledged ledger, entry and metadata
value against the model; the run's state (`_Run`, `_ModeState`) collects what it reports.
Every few iterations `_corrupt_record_case` first corrupts a record the next recovery would
replay, in a copy, and checks the store refuses it and reports the loss.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import shutil
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Never

from .._config import StorageConfig
from .._errors import (
    CorruptionError,
    JournalCorruptionError,
    NoSuchEntryError,
    StorageError,
)
from .._fs import OsFileSystem
from .._index import Index
from .._journal import JournalMark, parse_segment_name
from .._journal_format import (
    RecordType,
    ScanResult,
    SegmentHeader,
    pad_synced_lsn,
    scan_segment,
)
from .._ledger import LedgerInfo
from .._storage import Storage

if TYPE_CHECKING:
    from tqdm import tqdm

from ._crash_model import (
    BAD_ENTRIES_REPORTED_MAX,
    CORRUPT_CASE_EVERY,
    READ_CHUNK_ENTRIES_MAX,
    STATE_RANK,
    VIOLATIONS_LISTED_MAX,
    AckModel,
    CrashTestOptions,
    CrashTestSummary,
    LedgerExpectation,
    entry_payload,
    ledger_metadata,
    meta_version,
    payload_digest,
    verify_config,
)

__all__ = ["Verification", "Verifier"]

log = logging.getLogger(__name__)

# -- the verifier -----------------------------------------------------------------------

@dataclass
class Verification:
    """The outcome of one verification. `fatal` is True when the directory could not be
    reopened (the run cannot go on on it)."""

    violations: list[str] = field(default_factory=list)
    acknowledged_verified: int = 0
    entries_read: int = 0
    fatal: bool = False
    mark: JournalMark | None = None


class Verifier:
    """Reopens a data directory and checks it against an `AckModel`."""

    def __init__(self, seed: int, config: StorageConfig | None = None):
        self.seed = seed
        self.config = config or verify_config()

    def verify_dir(self, data_dir: str, model: AckModel, context: str) -> Verification:
        """Open (recovering) `data_dir`, verify, adopt what it shows into `model`, close."""
        try:
            store = Storage.open(data_dir, self.config)
        except Exception as exc:
            return Verification([f"{context}: reopen failed: {_describe(exc)}"], fatal=True)
        try:
            return self.verify_store(store, model, context)
        finally:
            store.close()

    def verify_store(self, store: Storage, model: AckModel, context: str) -> Verification:
        """Verify an open store against `model`, then adopt what it shows."""
        result = Verification()
        self._check_mark(store, model, context, result)
        observed = {info.ledger_id: info for info in store.list_ledgers()}
        bad: dict[int, set[int]] = {}
        for ledger_id, reason in sorted(model.deleted.items()):
            if ledger_id in observed:
                info = observed[ledger_id]
                result.violations.append(
                    f"{context}: ledger {ledger_id}: expected absent ({reason}), found "
                    f"{info.state} with LAC {info.last_add_confirmed}")
        for ledger_id, info in sorted(observed.items()):
            if ledger_id in model.deleted:
                continue
            expectation = model.ledgers.get(ledger_id) or LedgerExpectation(
                ledger_id, "an unacknowledged create")
            bad[ledger_id] = self._check_ledger(store, expectation, info, context, result)
        for ledger_id, expectation in sorted(model.ledgers.items()):
            if ledger_id not in observed and not expectation.delete_requested:
                result.violations.append(
                    f"{context}: ledger {ledger_id} ({expectation.origin}): expected present "
                    f"with entries 0..{expectation.last_required}, found no such ledger")
        self._count_acks(model, observed, bad, result)
        meta = self._check_meta(store, model, context, result)
        self._check_store(store, context, result)
        model.adopt(observed, meta, context)
        return result

    def _check_meta(self, store: Storage, model: AckModel, context: str,
                    result: Verification) -> dict[bytes, int]:
        """Check the journaled metadata keys; returns the version each one holds."""
        found = {}
        for key, expectation in sorted(model.meta.items()):
            value = store.metadata.get(key)
            version = meta_version(self.seed, key, value)
            where = f"{context}: metadata key {key.decode()}"
            if version is None:
                result.violations.append(f"{where}: expected a value the workload wrote, "
                                         f"found {value!r:.80}")
                continue
            if version < expectation.floor:
                result.violations.append(
                    f"{where}: expected version {expectation.floor} or later "
                    f"({expectation.floor_reason}), found {version}")
            elif version > expectation.ceiling:
                result.violations.append(f"{where}: expected at most version "
                                         f"{expectation.ceiling} (the last requested), found "
                                         f"{version}")
            found[key] = version
        return found

    def _check_mark(self, store: Storage, model: AckModel, context: str,
                    result: Verification) -> None:
        mark = store.index.persisted_mark
        result.mark = mark
        if mark is None:
            result.violations.append(f"{context}: no persisted LastLogMark after recovery")
            return
        floor = model.mark_floor
        if floor is not None and (mark < floor or mark.lsn < floor.lsn):
            result.violations.append(
                f"{context}: persisted mark regressed: expected at least {tuple(floor)} "
                f"({model.mark_reason}), found {tuple(mark)}")
        model.mark_persisted(mark, f"recovery of {context}")

    def _check_ledger(self, store: Storage, expectation: LedgerExpectation, info: LedgerInfo,
                      context: str, result: Verification) -> set[int]:
        """Check one present ledger; returns the entries that did not read back right."""
        where = f"{context}: ledger {info.ledger_id} ({expectation.origin})"
        lac = info.last_add_confirmed
        problems = []
        if lac < expectation.last_required:
            problems.append(f"expected entries 0..{expectation.last_required} (acknowledged "
                            f"or recovered before), found LAC {lac}")
        if STATE_RANK.get(info.state, -1) < STATE_RANK[expectation.state_required]:
            problems.append(f"expected state {expectation.state_required} "
                            f"({expectation.state_reason}), found {info.state}")
        if expectation.exact_lac is not None and lac != expectation.exact_lac:
            problems.append(f"expected LAC {expectation.exact_lac} "
                            f"({expectation.exact_reason}), found {lac}")
        if info.metadata != ledger_metadata(self.seed):
            problems.append(f"expected metadata {ledger_metadata(self.seed)}, found "
                            f"{info.metadata}")
        problems += self._check_beyond_lac(store, info.ledger_id, lac)
        result.violations += [f"{where}: {p}" for p in problems]
        return self._check_entries(store, info.ledger_id, lac, where, result)

    def _check_beyond_lac(self, store: Storage, ledger_id: int, lac: int) -> list[str]:
        problems = []
        try:
            data = store.read_entry(ledger_id, lac + 1)
            problems.append(f"entry {lac + 1} beyond LAC {lac}: expected NoSuchEntryError, "
                            f"read {len(data)} bytes")
        except NoSuchEntryError:
            pass
        except Exception as exc:
            problems.append(f"entry {lac + 1} beyond LAC {lac}: expected NoSuchEntryError, "
                            f"got {_describe(exc)}")
        indexed = store.index.last_indexed_entry(ledger_id)
        if indexed > lac:
            problems.append(f"expected nothing indexed beyond LAC {lac}, found entry "
                            f"{indexed} in the index")
        return problems

    def _check_entries(self, store: Storage, ledger_id: int, lac: int, where: str,
                       result: Verification) -> set[int]:
        bad: set[int] = set()
        for first in range(0, lac + 1, READ_CHUNK_ENTRIES_MAX):
            last = min(lac, first + READ_CHUNK_ENTRIES_MAX - 1)
            for entry_id, found in self._read_range(store, ledger_id, first, last):
                result.entries_read += 1
                want = entry_payload(self.seed, ledger_id, entry_id)
                if found == want:
                    continue
                bad.add(entry_id)
                if len(bad) <= BAD_ENTRIES_REPORTED_MAX:
                    result.violations.append(
                        f"{where}: entry {entry_id}: expected {len(want)} bytes "
                        f"{payload_digest(want)}, found {_describe_found(found)}")
        if len(bad) > BAD_ENTRIES_REPORTED_MAX:
            result.violations.append(f"{where}: {len(bad)} entries in all failed to read back "
                                     f"(first {BAD_ENTRIES_REPORTED_MAX} listed)")
        return bad

    @staticmethod
    def _read_range(store: Storage, ledger_id: int, first: int,
                    last: int) -> Iterator[tuple[int, bytes | Exception]]:
        """(entry id, bytes or the error reading it) for first..last; a failing range is
        read again entry by entry to name the bad ones."""
        try:
            datas = store.read_entries(ledger_id, first, last)
            if len(datas) == last - first + 1:
                yield from zip(range(first, last + 1), datas, strict=True)
                return
        except (StorageError, OSError):
            pass
        for entry_id in range(first, last + 1):
            try:
                yield entry_id, store.read_entry(ledger_id, entry_id)
            except (StorageError, OSError) as exc:
                yield entry_id, exc

    @staticmethod
    def _count_acks(model: AckModel, observed: dict[int, LedgerInfo],
                    bad: dict[int, set[int]], result: Verification) -> None:
        for ack in model.new_acks:
            info = observed.get(ack.ledger_id)
            if info is None or ack.ledger_id in model.deleted:
                continue  # its delete was requested (else reported missing above)
            if ack.entry_id <= info.last_add_confirmed and \
                    ack.entry_id not in bad.get(ack.ledger_id, ()):
                result.acknowledged_verified += 1

    @staticmethod
    def _check_store(store: Storage, context: str, result: Verification) -> None:
        try:
            report = store.check()
        except Exception as exc:
            result.violations.append(f"{context}: check() raised {_describe(exc)}")
            return
        if not report.ok:
            result.violations.append(f"{context}: check() expected clean, found "
                                     f"{report.problems_total} problems: "
                                     + "; ".join(report.problems[:5]))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, AssertionError):
        frames = traceback.extract_tb(exc.__traceback__)[-3:]
        text += " at " + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                                     for f in reversed(frames))
    return text


def _describe_found(found: bytes | Exception) -> str:
    if isinstance(found, Exception):
        return _describe(found)
    return f"{len(found)} bytes {payload_digest(found)}"



# -- the run ----------------------------------------------------------------------------

class _Run:
    def __init__(self, options: CrashTestOptions, seed: int, out: IO[str]):
        self.options = options
        self.seed = seed
        self.out = out
        self.summary = CrashTestSummary(seed=seed)
        self.verifier = Verifier(seed)
        self.bar: tqdm[Never] | None = None

    def report(self, messages: list[str]) -> None:
        for message in messages:
            self.summary.violations += 1
            if len(self.summary.violation_messages) < VIOLATIONS_LISTED_MAX:
                self.summary.violation_messages.append(message)
                self._print(f"crashtest: VIOLATION {message}")

    def _print(self, text: str) -> None:
        if self.bar is not None and not self.bar.disable:
            self.bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def record(self, verification: Verification) -> None:
        self.report(verification.violations)
        self.summary.acknowledged_verified += verification.acknowledged_verified
        self.summary.entries_read += verification.entries_read


class _ModeState:
    """One mode's directory, model and iteration count."""

    def __init__(self, name: str, directory: str, seed: int):
        self.name = name
        self.directory = directory
        self.model = AckModel(seed)
        self.iterations = 0
        self.stopped = False



def _verify(run: _Run, mode: _ModeState, context: str) -> None:
    if mode.iterations % CORRUPT_CASE_EVERY == 0:  # before the reopen replays the journal
        _corrupt_record_case(run, mode)
    verification = run.verifier.verify_dir(mode.directory, mode.model, context)
    run.record(verification)
    if verification.fatal:
        mode.stopped = True



# -- corrupt replayed record --------------------------------------------------------------

@dataclass(frozen=True)
class _Victim:
    path: str
    offset: int
    length: int


def _replayed_victims(directory: str, config: StorageConfig) -> list[_Victim]:
    """Records recovery would replay that a later batch proves were synced (a PAD in the
    same segment claims an LSN at or above theirs)."""
    index = Index(os.path.join(directory, "index"), config.lmdb_map_bytes)
    try:
        mark = index.persisted_mark
    finally:
        index.close()
    journal_dir = os.path.join(directory, "journal")
    found = []
    for name in sorted(os.listdir(journal_dir)):
        segment_id = parse_segment_name(name)
        if segment_id is None or (mark is not None and segment_id < mark.segment_id):
            continue
        path = os.path.join(journal_dir, name)
        handle = OsFileSystem().open_read(path)
        try:
            try:
                header = SegmentHeader.decode(handle.pread(config.journal_alignment_bytes, 0),
                                              path)
            except CorruptionError:
                continue
            start = (mark.offset if mark is not None and segment_id == mark.segment_id
                     else header.alignment)
            result = ScanResult(start, -1, 0, True)
            records = [(r.offset, r.lsn, r.kind, len(r.payload),
                        pad_synced_lsn(r.payload) if r.kind == RecordType.PAD else 0)
                       for r in scan_segment(handle, header, start, None,
                                             config.journal_record_bytes_max, result)]
        finally:
            handle.close()
        claimed = 0  # the highest synced LSN claimed by a PAD after the record
        for offset, lsn, kind, length, claim in reversed(records):
            if kind != RecordType.PAD and length > 0 and claimed >= lsn:
                found.append(_Victim(path, offset, length))
            claimed = max(claimed, claim)
    return found


def _journal_digest(directory: str) -> dict[str, str]:
    """The journal as found. (A refused recovery may already have tidied the entry logs:
    removed an unregistered one or an uncommitted tail, which no checkpoint refers to.)"""
    digests = {}
    for sub in ("journal",):
        for name in sorted(os.listdir(os.path.join(directory, sub))):
            with open(os.path.join(directory, sub, name), "rb") as handle:
                digests[f"{sub}/{name}"] = hashlib.sha256(handle.read()).hexdigest()
    return digests


def _corrupt_record_case(run: _Run, mode: _ModeState) -> None:
    """The corrupt-replayed-record case on a copy of the directory (see the module
    comment); reports violations, counts the case."""
    index = mode.iterations
    rng = random.Random(f"{run.seed}/corrupt/{mode.name}/{index}")
    context = f"corrupt-record case after {mode.name} iteration {index} (seed {run.seed})"
    copy = mode.directory + ".corrupt"
    if not os.path.isdir(os.path.join(mode.directory, "journal")):
        run.summary.corrupt_skipped += 1  # killed before the directory was made
        return
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(mode.directory, copy, ignore=shutil.ignore_patterns("LOCK"))
    try:
        config = verify_config()
        victims = _replayed_victims(copy, config)
        if not victims:
            run.summary.corrupt_skipped += 1
            return
        run.summary.corrupt_cases += 1
        victim = rng.choice(victims)
        where = victim.offset + 24 + rng.randrange(victim.length)
        with open(victim.path, "r+b") as handle:
            handle.seek(where)
            byte = handle.read(1)[0]
            handle.seek(where)
            handle.write(bytes([byte ^ (1 << rng.randrange(8))]))
        context += f", byte {where} of {victim.path} flipped"
        problems = _check_refusal(copy, config, victim)
        if not problems:
            run.summary.corrupt_refused += 1
        run.report([f"{context}: {p}" for p in problems])
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _check_refusal(copy: str, config: StorageConfig, victim: _Victim) -> list[str]:
    before = _journal_digest(copy)
    try:
        Storage.open(copy, config).close()
    except JournalCorruptionError as exc:
        error = exc
    except (StorageError, OSError) as exc:
        return [f"recovery failed with {_describe(exc)}, not JournalCorruptionError"]
    else:
        return ["recovery started on a corrupt replayed record (acknowledged data lost)"]
    problems = []
    if (error.path, error.offset) != (victim.path, victim.offset):
        problems.append(f"refusal names {error.path} at {error.offset}, not the record at "
                        f"{victim.offset}")
    if error.records_after < 1:
        problems.append("refusal counts no valid record after the corrupt one")
    if _journal_digest(copy) != before:
        problems.append("the refused recovery changed the journal")
    try:
        store = Storage.open(copy, dataclasses.replace(config,
                                                       skip_corrupt_journal_segments=True))
    except (StorageError, OSError) as exc:
        return [*problems, f"skip_corrupt_journal_segments did not open: {_describe(exc)}"]
    with store:
        stats = store.replay_stats
        dropped = getattr(stats, "dropped_records", None)
        if dropped != error.records_after:
            problems.append(f"with the flag recovery reports {dropped} records dropped, the "
                            f"refusal counted {error.records_after}")
    return problems
