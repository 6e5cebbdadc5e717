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

Layout: this module runs the harness and its kill mode; `_crash_model` holds the payloads,
configurations, options, summary and acknowledgement model, `_crash_verify` the verifier,
`_crash_powerloss` the powerloss mode, and `_crashtest_child` the kill mode's child process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .._errors import (
    DataDirLockedError,
)
from .._fs import LockHandle, OsFileSystem
from .simfs import CRASH_POINTS

if TYPE_CHECKING:
    pass

from ._crash_model import (
    CHILD_STARTUP_S_MAX,
    CHILD_STDERR_TAIL_BYTES_MAX,
    AckModel,
    CrashTestOptions,
    CrashTestSummary,
    LedgerExpectation,
    MetaExpectation,
    _ChannelReader,
    apply_channel_line,
    entry_payload,
    entry_size,
    kill_config,
    ledger_metadata,
    meta_value,
    meta_version,
    payload_digest,
    powerloss_config,
    verify_config,
)
from ._crash_powerloss import (
    _powerloss_iteration,
)
from ._crash_verify import (
    Verification,
    Verifier,
    _ModeState,
    _Run,
    _verify,
)

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
    "lock_scratch_dir",
    "meta_value",
    "meta_version",
    "payload_digest",
    "powerloss_config",
    "run_crashtest",
    "verify_config",
]

log = logging.getLogger(__name__)
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
    lock = lock_scratch_dir(options.data_dir)
    try:
        return _run_locked(options)
    finally:
        lock.release()


def lock_scratch_dir(data_dir: str) -> LockHandle:
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



# -- kill mode --------------------------------------------------------------------------

def _child_command(run: _Run, mode: _ModeState) -> list[str]:
    return [sys.executable, "-m", "magnetar.storage.testing._crashtest_child",
            "--data-dir", mode.directory, "--seed", str(run.seed),
            "--iteration", str(mode.iterations)]


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
