"""The crash-recovery harness behind `magnetar crashtest`.

Theory of operation
-------------------
The harness crashes the storage engine over and over on one data directory and, after
every crash, reopens the directory and checks that nothing acknowledged was lost and
nothing unacknowledged became half-visible. Two kinds of crash:

* **kill** — a child process (`storage.testing._crashtest_child`) runs the real threaded engine:
  several writer threads with many adds in flight, fences, closes, deletes, explicit
  checkpoints and GC beside the background ones. Every acknowledgement is written at
  once to a pipe, one short line per event (`os.write`; what reached the pipe before the
  child died is still readable). The parent SIGKILLs the child by PID after a seeded
  random delay, reads the pipe to its end, reopens and verifies. A `kill -9` keeps the
  page cache, so this tests process crashes: ordering, replay, the threads.
* **powerloss** — in-process over `SimFileSystem`, with `background_threads=False` so a
  seed replays exactly. The workload pumps the journal and runs checkpoints and GC at
  seeded moments; the file layer crashes at a named crash point (storage design §12.6)
  or at a random operation, then `power_loss()` drops, tears or corrupts unsynced
  writes. Some iterations also crash the recovery that follows, before the final
  reopen (crash during recovery must converge).

Payloads are never stored by the harness: the size and bytes of entry `e` of ledger `l`
are derived from (seed, l, e) (`entry_size`, `entry_payload`), so any entry found on
disk can be checked, acknowledged or not.

What the verifier knows (`AckModel`) accumulates over iterations: after a successful
reopen, everything the reopened store shows is durable (recovery ends with a checkpoint),
so the observed state becomes the floor for later iterations, and the acknowledgements
of the next iteration raise it. After each crash:

| check                                  | expectation                                   |
|----------------------------------------|-----------------------------------------------|
| ledger known (acked create, recovered) | present, unless its delete was requested      |
| acked delete                           | absent, for ever                              |
| every entry 0..LAC of every ledger     | the derived bytes, exactly                    |
| acked entry                            | at or below the recovered LAC                 |
| entry LAC+1                            | NoSuchEntryError; the index holds nothing above the LAC |
| acked fence / close                    | fenced or closed; LAC = the acked last entry  |
| recovered fenced / closed              | stays so, with the same LAC                   |
| persisted LastLogMark                  | never lower than one persisted before         |
| `Storage.check()`                      | clean                                         |

A delete that was requested but not acknowledged may or may not have happened; a ledger
whose create was never acknowledged may appear (it is then checked like any other).

**Corrupt replayed record** — every `CORRUPT_CASE_EVERY`-th iteration of each mode also
copies the crashed directory, flips one byte inside a journal record that recovery will
replay and that a later batch proves was synced (its PAD claims the record's LSN), and
checks on the copy: recovery must refuse with `JournalCorruptionError` naming that file
and offset and leave the journal as found; with `skip_corrupt_journal_segments` it must open
and report the loss (`ReplayStats.dropped_records` = the error's count). An iteration with
no such record (nothing replayed after the mark, no directory yet) counts as skipped. The
copy is removed.

The scratch directory is locked for the whole run with the same OS lock (`LOCK`, holding
our PID) that `Storage.open` takes, so a run refuses a directory a live broker (or another
run) holds, before writing anything, and a broker cannot open it meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Never

from .._completion import Completion
from .._config import StorageConfig
from .._errors import (
    CorruptionError,
    DataDirLockedError,
    JournalCorruptionError,
    NoSuchEntryError,
    StorageError,
)
from .._fs import LockHandle, OsFileSystem
from .._index import Index
from .._journal import JournalMark, parse_segment_name
from .._journal_format import (
    RecordType,
    ScanResult,
    SegmentHeader,
    pad_synced_lsn,
    scan_segment,
)
from .._ledger import CLOSED, FENCED, OPEN, LedgerInfo
from .._storage import Storage
from .simfs import CRASH_POINTS, SimFileSystem

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "AckModel",
    "CrashTestOptions",
    "CrashTestSummary",
    "LedgerExpectation",
    "MetaExpectation",
    "Verification",
    "Verifier",
    "apply_channel_line",
    "entry_payload",
    "entry_size",
    "kill_config",
    "ledger_metadata",
    "meta_value",
    "meta_version",
    "payload_digest",
    "powerloss_config",
    "run_crashtest",
    "verify_config",
]

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
ENTRY_BYTES_MAX = 64 * KiB
VIOLATIONS_LISTED_MAX = 200
BAD_ENTRIES_REPORTED_MAX = 5  # per ledger and verification
READ_CHUNK_ENTRIES_MAX = 32
CHILD_STARTUP_S_MAX = 60.0
CHILD_STDERR_TAIL_BYTES_MAX = 2000
RECOVERY_CRASH_OPS_MAX = 60
FILE_OPS_PER_STEP = 5  # measured: a powerloss workload step does about 5 file operations
DIGEST_BYTES = 8
CORRUPT_CASE_EVERY = 3  # iterations of a mode between corrupt-replayed-record cases
STATE_RANK = {OPEN: 0, FENCED: 1, CLOSED: 2}


# -- payloads ---------------------------------------------------------------------------

def entry_size(seed: int, ledger_id: int, entry_id: int) -> int:
    """The size of entry `entry_id` of ledger `ledger_id` under `seed`: 1 B to 64 KiB,
    mostly small, with both extremes now and then."""
    raw = hashlib.blake2b(f"{seed}:{ledger_id}:{entry_id}".encode(), digest_size=8).digest()
    value = int.from_bytes(raw, "big")
    bucket, value = value % 100, value // 100
    if bucket < 2:
        return 1
    if bucket < 4:
        return ENTRY_BYTES_MAX
    if bucket < 60:
        return 1 + value % 256
    if bucket < 90:
        return 257 + value % (4 * KiB - 256)
    return 4 * KiB + 1 + value % (ENTRY_BYTES_MAX - 4 * KiB)


def entry_payload(seed: int, ledger_id: int, entry_id: int) -> bytes:
    """The bytes of entry `entry_id` of ledger `ledger_id` under `seed`."""
    size = entry_size(seed, ledger_id, entry_id)
    data = hashlib.shake_128(f"{seed}:{ledger_id}:{entry_id}:{size}".encode()).digest(size)
    assert len(data) == size
    return data


def payload_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


def ledger_metadata(seed: int) -> dict[str, str]:
    return {"crashtest-seed": str(seed)}


def meta_value(seed: int, key: bytes, version: int) -> bytes:
    """The value a workload writes as `version` of metadata key `key`."""
    return f"{seed}/{key.decode()}/{version}".encode()


def meta_version(seed: int, key: bytes, value: bytes | None) -> int | None:
    """The version a stored value holds: -1 for absent, None when it is not a value the
    workload could have written."""
    if value is None:
        return -1
    prefix = f"{seed}/{key.decode()}/".encode()
    tail = value[len(prefix):]
    if not value.startswith(prefix) or not tail.isdigit():
        return None
    return int(tail)


# -- configurations ---------------------------------------------------------------------

def kill_config(rng: random.Random | None = None) -> StorageConfig:
    """The kill-mode child's engine: background threads on, small segments, logs and cache
    so that rollovers, rotations and compactions happen within a second; the checkpoint
    and GC intervals vary with `rng`."""
    rng = rng or random.Random(0)
    return StorageConfig(
        entry_size_bytes_max=ENTRY_BYTES_MAX,
        journal_segment_bytes_max=1 * MiB,
        journal_prealloc_bytes=256 * KiB,
        journal_segments_kept_max=1,
        write_cache_bytes_max=1 * MiB,
        checkpoint_interval_ms=rng.choice([20, 50, 100, 300]),
        entry_log_bytes_max=1 * MiB,
        gc_interval_ms=rng.choice([100, 300, 1000]),
        lmdb_map_bytes=1024 * MiB,
    )


def powerloss_config() -> StorageConfig:
    """The in-process engine: no threads (the workload pumps), tiny segments and logs."""
    return StorageConfig(
        background_threads=False,
        entry_size_bytes_max=ENTRY_BYTES_MAX,
        journal_segment_bytes_max=64 * KiB,
        journal_prealloc_bytes=16 * KiB,
        journal_segments_kept_max=1,
        write_cache_bytes_max=256 * KiB,
        entry_log_bytes_max=256 * KiB,
        lmdb_map_bytes=1024 * MiB,
    )


def verify_config() -> StorageConfig:
    """What the verifier reopens with: no threads, nothing written but recovery's and the
    closing checkpoint."""
    return StorageConfig(background_threads=False, entry_size_bytes_max=ENTRY_BYTES_MAX,
                         lmdb_map_bytes=1024 * MiB)


# -- options and summary ----------------------------------------------------------------

@dataclass
class CrashTestOptions:
    """What `run_crashtest` does.

    `data_dir` is a scratch directory: the harness replaces its `crashtest-kill` and
    `crashtest-powerloss` subdirectories and leaves anything else there alone. `mode` is
    'kill', 'powerloss' or 'both' (iterations alternate, kill first). `seed` None picks
    one at random (it is printed).
    """

    data_dir: str
    iterations: int
    seed: int | None = None
    mode: str = "both"
    progress: bool = True
    kill_delay_s_max: float = 0.6
    powerloss_steps_max: int = 80
    out: IO[str] | None = None  # where the seed, violations and summary go (stdout)

    def __post_init__(self) -> None:
        assert self.mode in ("kill", "powerloss", "both"), self.mode
        assert self.iterations >= 0
        assert self.kill_delay_s_max > 0
        assert self.powerloss_steps_max >= 1


@dataclass
class CrashTestSummary:
    """What a run found. `violations` counts every violation; `violation_messages` lists
    the first `VIOLATIONS_LISTED_MAX`. `acknowledged_verified` counts acknowledged adds
    found intact by the verification after the crash that followed them (each once;
    later verifications read them again, which `entries_read` counts).
    `crash_points_hit` counts powerloss crashes by crash point, plus 'operation' (a
    random file operation) and 'disk error'."""

    seed: int
    iterations: int = 0
    kill_iterations: int = 0
    powerloss_iterations: int = 0
    acknowledged_verified: int = 0
    entries_read: int = 0
    violations: int = 0
    violation_messages: list[str] = field(default_factory=list)
    crash_points_hit: dict[str, int] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    corrupt_cases: int = 0  # a replayed record was corrupted on a copy
    corrupt_refused: int = 0  # ... and recovery refused, then reported the loss with the flag
    corrupt_skipped: int = 0  # no record to corrupt (nothing replayed after the mark)

    def line(self) -> str:
        return (f"crashtest: {self.iterations} iterations, {self.acknowledged_verified} "
                f"acknowledged entries verified, {self.violations} violations")


# -- what was acknowledged --------------------------------------------------------------

@dataclass
class LedgerExpectation:
    """What a ledger must look like after the next crash (see the module table)."""

    ledger_id: int
    origin: str
    last_required: int = -1
    state_required: str = OPEN
    state_reason: str = ""
    exact_lac: int | None = None
    exact_reason: str = ""
    delete_requested: bool = False


@dataclass
class MetaExpectation:
    """A journaled metadata key: its stored version must lie in floor..ceiling (-1 is
    absent)."""

    floor: int = -1
    floor_reason: str = "never acknowledged"
    ceiling: int = -1


@dataclass(frozen=True)
class AckedEntry:
    ledger_id: int
    entry_id: int
    size: int
    digest: str


class AckModel:
    """Everything acknowledged (or verified after a reopen) so far. Methods that take an
    acknowledgement return harness-level problems (an ack that cannot be right) as
    messages; the caller reports them as violations."""

    def __init__(self, seed: int):
        self.seed = seed
        self.ledgers: dict[int, LedgerExpectation] = {}
        self.deleted: dict[int, str] = {}  # ledger id -> why it must stay absent
        self.mark_floor: JournalMark | None = None
        self.mark_reason = ""
        self.new_acks: list[AckedEntry] = []
        self.meta: dict[bytes, MetaExpectation] = {}

    def ledger_created(self, ledger_id: int, origin: str) -> list[str]:
        if ledger_id in self.ledgers or ledger_id in self.deleted:
            return [f"ledger id {ledger_id} acknowledged as created again ({origin})"]
        self.ledgers[ledger_id] = LedgerExpectation(ledger_id, origin)
        return []

    def entry_added(self, ledger_id: int, entry_id: int, size: int, digest: str) -> list[str]:
        expectation = self.ledgers.get(ledger_id)
        if expectation is None:
            return [f"ledger {ledger_id} entry {entry_id} acknowledged for a ledger the "
                    "harness does not know"]
        want = entry_payload(self.seed, ledger_id, entry_id)
        if size != len(want) or digest != payload_digest(want):
            return [f"ledger {ledger_id} entry {entry_id} acknowledged with {size} bytes "
                    f"{digest}, but the derived payload is {len(want)} bytes "
                    f"{payload_digest(want)} (harness bug)"]
        expectation.last_required = max(expectation.last_required, entry_id)
        self.new_acks.append(AckedEntry(ledger_id, entry_id, size, digest))
        return []

    def ledger_fenced(self, ledger_id: int, last: int, origin: str) -> list[str]:
        return self._sealed(ledger_id, FENCED, last, f"fence acknowledged at {last} ({origin})")

    def ledger_closed(self, ledger_id: int, last: int, origin: str) -> list[str]:
        return self._sealed(ledger_id, CLOSED, last, f"close acknowledged at {last} ({origin})")

    def _sealed(self, ledger_id: int, state: str, last: int, reason: str) -> list[str]:
        expectation = self.ledgers.get(ledger_id)
        if expectation is None:
            return [f"ledger {ledger_id}: {reason} for a ledger the harness does not know"]
        if STATE_RANK[state] >= STATE_RANK[expectation.state_required]:
            expectation.state_required, expectation.state_reason = state, reason
        if expectation.exact_lac is None:
            expectation.exact_lac, expectation.exact_reason = last, reason
        expectation.last_required = max(expectation.last_required, last)
        return []

    def delete_requested(self, ledger_id: int) -> None:
        expectation = self.ledgers.get(ledger_id)
        if expectation is not None:
            expectation.delete_requested = True

    def ledger_deleted(self, ledger_id: int, origin: str) -> None:
        self.ledgers.pop(ledger_id, None)
        self.deleted[ledger_id] = f"delete acknowledged ({origin})"

    def meta_requested(self, key: bytes, version: int) -> None:
        expectation = self.meta.setdefault(key, MetaExpectation())
        expectation.ceiling = max(expectation.ceiling, version)

    def meta_acked(self, key: bytes, version: int, origin: str) -> list[str]:
        expectation = self.meta.get(key)
        if expectation is None or version > expectation.ceiling:
            return [f"metadata key {key!r} version {version} acknowledged but never "
                    "requested"]
        if version > expectation.floor:
            expectation.floor = version
            expectation.floor_reason = f"acknowledged in {origin}"
        return []

    def mark_persisted(self, mark: JournalMark, origin: str) -> None:
        if self.mark_floor is None or mark > self.mark_floor:
            self.mark_floor, self.mark_reason = mark, origin

    def adopt(self, observed: dict[int, LedgerInfo], meta: dict[bytes, int],
              origin: str) -> None:
        """After a verified reopen: what the store shows is durable from now on."""
        for key, version in meta.items():
            self.meta[key] = MetaExpectation(version, f"recovered in {origin}", version)
        for ledger_id in sorted(set(self.ledgers) - set(observed)):
            del self.ledgers[ledger_id]
            self.deleted[ledger_id] = f"gone after the reopen of {origin}"
        for ledger_id, info in observed.items():
            if ledger_id in self.deleted:
                continue  # reported as a violation; keep expecting it gone
            expectation = self.ledgers.setdefault(
                ledger_id, LedgerExpectation(ledger_id, f"recovered in {origin}"))
            lac = info.last_add_confirmed
            expectation.last_required = lac
            expectation.delete_requested = False
            expectation.state_required = info.state
            expectation.state_reason = f"recovered as {info.state} in {origin}"
            if info.state in (FENCED, CLOSED):
                expectation.exact_lac = lac
                expectation.exact_reason = f"recovered {info.state} at {lac} in {origin}"
            else:
                expectation.exact_lac = None
        self.new_acks = []


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


# -- the kill-mode side channel ---------------------------------------------------------
#
# One line per event, written by the child with a single os.write (atomic on a pipe for
# lines under PIPE_BUF):
#
#   R                               ready: the store is open, the workload starts
#   C <ledger>                      create acknowledged
#   A <ledger> <entry> <size> <digest>   add acknowledged
#   F <ledger> <last>               fence acknowledged
#   L <ledger> <last>               close acknowledged
#   d <ledger>                      delete requested (written before the call)
#   D <ledger>                      delete acknowledged
#   m <key> <version>               metadata update requested (written before the call)
#   K <key> <version>               metadata update acknowledged
#   M <segment> <offset> <lsn>      a persisted mark seen after a checkpoint
#   X <text>                        the child hit an unexpected error and exits

def apply_channel_line(model: AckModel, line: str, origin: str) -> list[str]:
    """Apply one side-channel line to `model`; returns problems to report."""
    kind, _, rest = line.partition(" ")
    fields = rest.split()
    if kind == "R":
        return []
    if kind == "X":
        return [f"child reported an error: {rest}"]
    numbers = [int(f) for f in fields if f.lstrip("-").isdigit()]
    if kind == "C" and len(numbers) == 1 == len(fields):
        return model.ledger_created(numbers[0], f"acknowledged create in {origin}")
    if kind == "A" and len(fields) == 4 and all(f.isdigit() for f in fields[:3]):
        return model.entry_added(int(fields[0]), int(fields[1]), int(fields[2]), fields[3])
    if kind == "F" and len(numbers) == 2:
        return model.ledger_fenced(numbers[0], numbers[1], origin)
    if kind == "L" and len(numbers) == 2:
        return model.ledger_closed(numbers[0], numbers[1], origin)
    if kind == "d" and len(numbers) == 1:
        model.delete_requested(numbers[0])
        return []
    if kind == "D" and len(numbers) == 1:
        model.ledger_deleted(numbers[0], origin)
        return []
    if kind in ("m", "K") and len(fields) == 2 and fields[1].isdigit():
        key, version = fields[0].encode(), int(fields[1])
        if kind == "K":
            return model.meta_acked(key, version, origin)
        model.meta_requested(key, version)
        return []
    if kind == "M" and len(numbers) == 3:
        model.mark_persisted(JournalMark(*numbers), f"checkpoint in {origin}")
        return []
    return [f"unreadable side-channel line {line!r}"]


class _ChannelReader(threading.Thread):
    """Reads the child's side channel to its end, so the child never blocks on a full
    pipe."""

    def __init__(self, stream: IO[bytes]):
        super().__init__(name="crashtest-channel", daemon=True)
        self._stream = stream
        self.lines: list[str] = []
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            for raw in self._stream:
                if not raw.endswith(b"\n"):
                    break  # cut short by the kill: never a complete event
                line = raw.decode("ascii", "replace").rstrip("\n")
                self.lines.append(line)
                if line == "R":
                    self.ready.set()
        finally:
            self.ready.set()


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


def run_crashtest(options: CrashTestOptions) -> CrashTestSummary:
    """Run the crash-recovery harness (see the module comment) and print its report.

    Prints `crashtest: seed <S>` first, a progress bar on stderr (unless
    `options.progress` is False), every violation as it is found, and last the line
    `crashtest: <N> iterations, <M> acknowledged entries verified, <V> violations`.

    Returns:
        The summary; `violations` is 0 when nothing was wrong.

    Raises:
        DataDirLockedError: another process (a broker, another run) holds `data_dir`'s
            lock; nothing was written there.
        OSError: the scratch directory cannot be created or cleared.
    """
    lock = _lock_scratch_dir(options.data_dir)
    try:
        return _run_locked(options)
    finally:
        lock.release()


def _lock_scratch_dir(data_dir: str) -> LockHandle:
    """Take the OS lock of `data_dir` (its `LOCK` file, as `Storage.open` does), so the
    harness never writes into a directory a broker or another run holds, and none opens it
    while the harness runs.

    Raises:
        DataDirLockedError: another process holds it; nothing was written.
    """
    path = os.path.abspath(data_dir)
    os.makedirs(path, exist_ok=True)
    try:
        return OsFileSystem().lock(os.path.join(path, "LOCK"))
    except BlockingIOError as exc:
        raise DataDirLockedError(path, getattr(exc, "owner_pid", None)) from None


def _run_locked(options: CrashTestOptions) -> CrashTestSummary:
    from tqdm import tqdm

    seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
    out = options.out or sys.stdout
    run = _Run(options, seed, out)
    print(f"crashtest: seed {seed}", file=out, flush=True)
    modes = _prepare_modes(options, seed)
    schedule = _schedule(options)
    with _quiet_storage_logs(), tqdm(total=len(schedule), desc="crashtest", unit="crash",
                                     file=sys.stderr, disable=not options.progress) as bar:
        run.bar = bar
        for name in schedule:
            mode = modes[name]
            if mode.stopped:
                continue
            if name == "kill":
                _kill_iteration(run, mode)
            else:
                _powerloss_iteration(run, mode)
            mode.iterations += 1
            bar.update(1)
            bar.set_postfix(violations=run.summary.violations, refresh=False)
        run.bar = None
    _finish(run, modes)
    return run.summary


def _prepare_modes(options: CrashTestOptions, seed: int) -> dict[str, _ModeState]:
    os.makedirs(options.data_dir, exist_ok=True)
    modes = {}
    for name in ("kill", "powerloss"):
        directory = os.path.join(os.path.abspath(options.data_dir), f"crashtest-{name}")
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(directory + ".child.log")
        modes[name] = _ModeState(name, directory, seed)
    return modes


def _schedule(options: CrashTestOptions) -> list[str]:
    if options.mode == "both":
        return ["kill" if i % 2 == 0 else "powerloss" for i in range(options.iterations)]
    return [options.mode] * options.iterations


def _finish(run: _Run, modes: dict[str, _ModeState]) -> None:
    summary = run.summary
    summary.kill_iterations = modes["kill"].iterations
    summary.powerloss_iterations = modes["powerloss"].iterations
    summary.iterations = summary.kill_iterations + summary.powerloss_iterations
    summary.stopped = [m.directory for m in modes.values() if m.stopped]
    for directory in summary.stopped:
        print(f"crashtest: stopped on {directory} (left as found for inspection)",
              file=run.out)
    if summary.powerloss_iterations:
        reached = sum(1 for p in CRASH_POINTS if summary.crash_points_hit.get(p))
        print(f"crashtest: crash points reached: {reached} of {len(CRASH_POINTS)}; "
              f"crashes at random operations: {summary.crash_points_hit.get('operation', 0)}; "
              f"disk errors: {summary.crash_points_hit.get('disk error', 0)}", file=run.out)
    if summary.corrupt_cases or summary.corrupt_skipped:
        print(f"crashtest: corrupt replayed record: {summary.corrupt_cases} cases, "
              f"{summary.corrupt_refused} refused and reported the loss with the flag, "
              f"{summary.corrupt_skipped} skipped (nothing replayed)", file=run.out)
    print(summary.line(), file=run.out, flush=True)


@contextlib.contextmanager
def _quiet_storage_logs() -> Iterator[None]:
    """Every crash makes the engine log errors; they are the point here, not news."""
    logger = logging.getLogger("magnetar.storage")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _verify(run: _Run, mode: _ModeState, context: str) -> None:
    if mode.iterations % CORRUPT_CASE_EVERY == 0:  # before the reopen replays the journal
        _corrupt_record_case(run, mode)
    verification = run.verifier.verify_dir(mode.directory, mode.model, context)
    run.record(verification)
    if verification.fatal:
        mode.stopped = True


# -- kill mode --------------------------------------------------------------------------

def _child_command(run: _Run, mode: _ModeState) -> list[str]:
    return [sys.executable, "-m", "magnetar.storage.testing._crashtest_child", "--data-dir", mode.directory,
            "--seed", str(run.seed), "--iteration", str(mode.iterations)]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _kill_iteration(run: _Run, mode: _ModeState) -> None:
    index = mode.iterations
    rng = random.Random(f"{run.seed}/kill/{index}")
    early = rng.random() < 0.1
    delay = rng.uniform(0.0, 0.3) if early else rng.uniform(0.02, run.options.kill_delay_s_max)
    context = (f"kill iteration {index} (seed {run.seed}, SIGKILL "
               f"{delay * 1000:.0f} ms after {'spawn' if early else 'ready'})")
    log_path = mode.directory + ".child.log"
    with open(log_path, "wb") as child_log:
        proc = subprocess.Popen(_child_command(run, mode), stdout=subprocess.PIPE,
                                stderr=child_log, env=_child_env())
        assert proc.stdout is not None
        reader = _ChannelReader(proc.stdout)
        reader.start()
        try:
            if not early:
                reader.ready.wait(CHILD_STARTUP_S_MAX)
            exited = _wait_or_kill(proc, delay)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join()
            proc.stdout.close()
    problems = []
    for line in reader.lines:
        problems += apply_channel_line(mode.model, line, context)
    if exited:
        problems.append(f"child exited with code {proc.returncode} before the kill; stderr: "
                        f"{_tail(log_path)}")
    run.report([f"{context}: {p}" for p in problems])
    _verify(run, mode, context)


def _wait_or_kill(proc: subprocess.Popen[bytes], delay: float) -> bool:
    """SIGKILL the child after `delay` seconds; True when it exited on its own before."""
    try:
        proc.wait(timeout=delay)
        return True
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def _tail(path: str) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - CHILD_STDERR_TAIL_BYTES_MAX))
        return handle.read().decode("utf-8", "replace").strip().replace("\n", " | ")


# -- powerloss mode ---------------------------------------------------------------------

@dataclass
class _Pending:
    kind: str
    ledger_id: int
    value: int
    completion: Completion[int]
    key: bytes = b""


class _PowerlossWorkload:
    """A seeded single-threaded workload over a store without background threads. Adds
    stay in flight across steps; the journal is pumped at seeded moments."""

    LEDGERS_OPEN_MAX = 3
    LEDGERS_RETIRED_MAX = 2
    ENTRIES_PER_LEDGER_MAX = 48
    BATCH_ENTRIES_MAX = 12
    META_KEYS = tuple(f"crashtest/powerloss/{k}".encode() for k in range(4))

    def __init__(self, store: Storage, fs: SimFileSystem, rng: random.Random,
                 model: AckModel, origin: str):
        self.store = store
        self.fs = fs
        self.rng = rng
        self.model = model
        self.origin = origin
        self.problems: list[str] = []
        self.disk_errors = False
        self.pending: list[_Pending] = []
        self.open: dict[int, int] = {}  # ledger id -> next entry id
        self.retired: list[int] = []
        self.meta_versions = {key: meta_version(model.seed, key, store.metadata.get(key))
                              for key in self.META_KEYS}
        for info in store.list_ledgers():
            if info.state == OPEN:
                self.open[info.ledger_id] = info.last_add_confirmed + 1
            else:
                self.retired.append(info.ledger_id)

    def run(self, steps: int) -> None:
        """Run until the file layer crashes or `steps` are done (then crash it). With
        `disk_errors`, errors are expected and the workload goes on through them (so an
        engine that acknowledged anything after failing would be caught)."""
        for _ in range(steps):
            try:
                self._step()
                if self.rng.random() < 0.6:
                    self.store.pump()
            except (StorageError, OSError) as exc:
                if not self.fs.crashed and not self.disk_errors:
                    self.problems.append(f"workload step failed without a crash: "
                                         f"{_describe(exc)}")
                    self.fs.crash("unexpected error")
            self.harvest()
            if self.fs.crashed:
                return
        self.fs.heal()
        self.fs.crash("end of workload")

    def _step(self) -> None:
        choice = self.rng.random()
        if not self.open or (choice < 0.08 and len(self.open) < self.LEDGERS_OPEN_MAX):
            self._create()
        elif choice < 0.62:
            self._add_batch()
        elif choice < 0.68:
            self._seal("fence")
        elif choice < 0.74:
            self._seal("close")
        elif choice < 0.80:
            self._update_meta()
        elif choice < 0.86:
            self.store.checkpoint()
        elif choice < 0.93:
            self.store.gc()
        else:
            while self.store.pump():
                pass
        while len(self.retired) > self.LEDGERS_RETIRED_MAX:
            self._delete(self.retired.pop(0))

    def _create(self) -> None:
        completion = self.store.create_ledger(ledger_metadata(self.model.seed))
        ledger_id = self.store.wait(completion)
        self.problems += self.model.ledger_created(ledger_id,
                                                   f"acknowledged create in {self.origin}")
        self.open[ledger_id] = 0

    def _add_batch(self) -> None:
        ledger_id = self.rng.choice(sorted(self.open))
        for _ in range(self.rng.randint(1, self.BATCH_ENTRIES_MAX)):
            entry_id = self.open[ledger_id]
            data = entry_payload(self.model.seed, ledger_id, entry_id)
            self.pending.append(_Pending("add", ledger_id, entry_id,
                                         self.store.add_entry(ledger_id, data)))
            self.open[ledger_id] = entry_id + 1
        if self.open[ledger_id] >= self.ENTRIES_PER_LEDGER_MAX:
            self._seal("close", ledger_id)

    def _seal(self, kind: str, ledger_id: int | None = None) -> None:
        if ledger_id is None:
            ledger_id = self.rng.choice(sorted(self.open))
        last = self.open.pop(ledger_id) - 1
        call = self.store.fence if kind == "fence" else self.store.close_ledger
        self.retired.append(ledger_id)
        self.pending.append(_Pending(kind, ledger_id, last, call(ledger_id)))

    def _update_meta(self) -> None:
        """A journaled metadata-store update (the path cursor positions take)."""
        key = self.rng.choice(self.META_KEYS)
        current = self.meta_versions[key]
        version = (current if current is not None else -1) + 1
        self.meta_versions[key] = version
        self.model.meta_requested(key, version)
        completion = self.store.metadata.apply_journaled(
            [(key, meta_value(self.model.seed, key, version))])
        self.pending.append(_Pending("meta", 0, version, completion, key=key))

    def _delete(self, ledger_id: int) -> None:
        self.model.delete_requested(ledger_id)
        self.pending.append(_Pending("delete", ledger_id, ledger_id,
                                     self.store.delete_ledger(ledger_id)))

    def harvest(self) -> None:
        """Move finished completions into the model (acks) or the problems."""
        still = []
        for pending in self.pending:
            if not pending.completion.done():
                still.append(pending)
            elif pending.completion.exception() is None:
                self._acknowledged(pending, pending.completion.result(0))
            elif not self.fs.crashed and not self.disk_errors:
                error = pending.completion.exception()
                assert error is not None
                self.problems.append(f"{pending.kind} on ledger {pending.ledger_id} failed "
                                     f"without a crash: {_describe(error)}")
        self.pending = still

    def _acknowledged(self, pending: _Pending, value: int) -> None:
        ledger_id = pending.ledger_id
        if pending.kind == "meta":
            self.problems += self.model.meta_acked(pending.key, pending.value, self.origin)
            return
        if value != pending.value:
            self.problems.append(f"{pending.kind} on ledger {ledger_id} completed with "
                                 f"{value}, expected {pending.value}")
        if pending.kind == "add":
            data = entry_payload(self.model.seed, ledger_id, value)
            self.problems += self.model.entry_added(ledger_id, value, len(data),
                                                    payload_digest(data))
        elif pending.kind == "fence":
            self.problems += self.model.ledger_fenced(ledger_id, value, self.origin)
        elif pending.kind == "close":
            self.problems += self.model.ledger_closed(ledger_id, value, self.origin)
        else:
            self.model.ledger_deleted(ledger_id, self.origin)


@dataclass(frozen=True)
class _CrashPlan:
    """How one powerloss iteration ends: at a named crash point (its `hits`-th time), at
    a file operation, or by a disk error (`disk_error` 'write' or 'sync' failing with
    `errno_code` from the `after`+1-th such call on) followed by a crash."""

    point: str | None = None
    hits: int = 1
    op: int | None = None
    disk_error: str | None = None
    errno_code: int = 0
    after: int = 0

    def describe(self) -> str:
        if self.point is not None:
            return f"crash point {self.point} (hit {self.hits})"
        if self.disk_error is not None:
            return (f"{errno.errorcode[self.errno_code]} on {self.disk_error} "
                    f"{self.after + 1}, then a crash")
        return f"crash at operation {self.op}"

    def arm(self, fs: SimFileSystem) -> None:
        """Script the disk error (once the store is open)."""
        if self.disk_error == "write":
            fs.fail_writes(self.errno_code, after=self.after)
        elif self.disk_error == "sync":
            fs.fail_syncs(self.errno_code, after=self.after)


def _crash_plan(rng: random.Random, index: int, steps: int) -> _CrashPlan:
    """Even iterations go through the named crash points in turn; of the odd ones, one in
    four hits a disk error and the others crash at a random file operation (a workload
    step does about 5 of them)."""
    if index % 2 == 0:
        return _CrashPlan(point=CRASH_POINTS[(index // 2) % len(CRASH_POINTS)],
                          hits=rng.randint(1, 3))
    if index % 8 == 3:
        return _CrashPlan(disk_error=rng.choice(["write", "sync"]),
                          errno_code=rng.choice([errno.ENOSPC, errno.EIO]),
                          after=rng.randint(0, 2 * steps))
    return _CrashPlan(op=rng.randint(1, FILE_OPS_PER_STEP * steps))


def _powerloss_iteration(run: _Run, mode: _ModeState) -> None:
    index = mode.iterations
    rng = random.Random(f"{run.seed}/powerloss/{index}")
    plan = _crash_plan(rng, index, run.options.powerloss_steps_max)
    fs = SimFileSystem(rng.getrandbits(32), crash_at_op=plan.op, crash_at_point=plan.point,
                       point_hits=plan.hits)
    context = f"powerloss iteration {index} (seed {run.seed}, {plan.describe()})"
    problems = _run_powerloss_workload(run, mode, fs, rng, plan, context)
    crashed_at = fs.crashed_at or "?"
    _count_crash(run.summary, "disk error" if plan.disk_error else crashed_at)
    fates = fs.power_loss()
    context += f", crashed at {crashed_at}, power loss {_fates(fates)}"
    if rng.random() < 0.2:
        note, more = _crash_recovery(mode, rng)
        context += note
        problems += more
    run.report([f"{context}: {p}" for p in problems])
    _verify(run, mode, context)


def _count_crash(summary: CrashTestSummary, crashed_at: str) -> None:
    if crashed_at.startswith("crash point "):
        key = crashed_at.removeprefix("crash point ")
    elif crashed_at.startswith("operation "):
        key = "operation"
    elif crashed_at == "disk error":
        key = crashed_at
    else:
        return
    summary.crash_points_hit[key] = summary.crash_points_hit.get(key, 0) + 1


def _run_powerloss_workload(run: _Run, mode: _ModeState, fs: SimFileSystem,
                            rng: random.Random, plan: _CrashPlan, context: str) -> list[str]:
    try:
        store = Storage.open(mode.directory, powerloss_config(), fs=fs)
    except (StorageError, OSError) as exc:
        if fs.crashed:
            return []  # crashed during recovery: the next reopen must converge
        return [f"open with the fault-injecting file layer failed without a crash: "
                f"{_describe(exc)}"]
    workload = _PowerlossWorkload(store, fs, rng, mode.model, context)
    workload.disk_errors = plan.disk_error is not None
    plan.arm(fs)
    problems: list[str] = []
    try:
        workload.run(run.options.powerloss_steps_max)
    except Exception as exc:
        problems.append(f"engine raised {_describe(exc)}")
        fs.crash("engine error")
    finally:
        store.abandon()
        workload.harvest()
        if store.index.persisted_mark is not None:
            mode.model.mark_persisted(store.index.persisted_mark, f"checkpoint in {context}")
    return problems + workload.problems


def _crash_recovery(mode: _ModeState, rng: random.Random) -> tuple[str, list[str]]:
    """Crash the recovery itself at a random operation, then lose power again. Returns
    a note for the context and problems found."""
    op = rng.randint(1, RECOVERY_CRASH_OPS_MAX)
    fs = SimFileSystem(rng.getrandbits(32), crash_at_op=op)
    problems = []
    try:
        store = Storage.open(mode.directory, powerloss_config(), fs=fs)
    except Exception as exc:
        if not fs.crashed:
            problems.append(f"recovery failed without a crash: {_describe(exc)}")
    else:
        fs.crash("after recovery")
        store.abandon()
        if store.index.persisted_mark is not None:
            mode.model.mark_persisted(store.index.persisted_mark, "a completed recovery")
    fates = fs.power_loss()
    return f"; recovery crashed at {fs.crashed_at}, power loss {_fates(fates)}", problems


def _fates(fates: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in fates.items() if v) or "nothing unsynced"



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
