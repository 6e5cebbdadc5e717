"""The crash harness's powerloss mode (see `crashtest` for the theory of operation): a
seeded workload runs in process on the fault-injecting file system (`simfs`), which
crashes at a planned crash point or file operation and drops the unsynced writes; recovery
may crash again; then the verifier checks what was acknowledged.
"""

from __future__ import annotations

import errno
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._completion import Completion
from .._errors import (
    StorageError,
)
from .._ledger import OPEN
from .._storage import Storage
from .simfs import CRASH_POINTS, SimFileSystem

if TYPE_CHECKING:
    pass

from ._crash_model import (
    FILE_OPS_PER_STEP,
    RECOVERY_CRASH_OPS_MAX,
    AckModel,
    CrashTestSummary,
    entry_payload,
    ledger_metadata,
    meta_value,
    meta_version,
    payload_digest,
    powerloss_config,
)
from ._crash_verify import (
    _describe,
    _ModeState,
    _Run,
    _verify,
)

__all__: list[str] = []

log = logging.getLogger(__name__)

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
