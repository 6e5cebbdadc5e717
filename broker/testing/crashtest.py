"""The crash-recovery harness for the whole broker: `magnetar crashtest broker`.

Theory of operation
-------------------
Each iteration runs a realistic workload against a broker through the official
`pulsar-client` in the harness process (`_crash_workload`: batched and unbatched named
producers with deduplication on, explicit and client-assigned sequence ids, delayed
messages; Shared and Key_Shared consumers acknowledging and negatively acknowledging; a
protocol consumer whose acks come back with receipts, `_crash_receipts`; our own client
(`magnetar`) on a `retry` subscription, retrying a seeded subset of messages through the
retry topic with `reconsume_later` and dead-lettering some, `_crash_retry`), crashes the
broker at a moment the seeded generator picks, restarts it on the same data directory and
checks what it recovered (`_crash_check`). Each mode keeps one data directory for all its
iterations (every start is a crash recovery; the broker restarted for the checks runs the
next iteration's workload), and each iteration uses a topic of its own.

* **kill** — `magnetar standalone` in a subprocess (`_crash_brokers.BrokerProcess`) on a
  free loopback port, SIGKILLed by PID a seeded 0.05..`crash_after_s_max` s into the
  workload. A `kill -9` keeps the page cache: this tests process crashes.
* **powerloss** — the broker in process, on a loop in a thread, over a `Storage` on the
  fault-injecting `SimFileSystem` (`_crash_brokers.InProcessBroker`); the official client
  connects over loopback as to any broker. The disk stops at a named storage crash point, at
  a file operation a seeded count ahead, or at a seeded time (whichever plan the generator
  picks; a plan not reached by `crash_after_s_max` ends at that time); then the broker stops
  without I/O and the unsynced writes are dropped, torn or corrupted.

The checks, after each restart (what the durability contract promises; see README
"Durability"):

* a re-created named producer: `last_sequence_id` at least its last acknowledged sequence
  id and at most the last one it sent (the dedup state recovered);
* resending, with the same sequence ids, every publish that was not acknowledged and a few
  that were: nothing is stored twice;
* a reader from the earliest, the whole topic: every message at most once, with the bytes
  sent; every acknowledged publish (and acknowledged resend) is there, unless every
  subscription acknowledged it (its ledger may then be trimmed);
* each subscription, drained without acknowledging: every acknowledged publish not
  acknowledged there is delivered (delayed ones once due): its cursor kept it;
* the `receipt` subscription: no message whose ack came back with a receipt is delivered
  again (the ack's cursor change was durable before the receipt);
* the `retry` subscription (`_crash_retry`): `reconsume_later` stores the copy before it
  acknowledges the message, so every acknowledged publish ends acknowledged (on the topic
  or after retries), still on the topic, in the retry topic or in the dead-letter topic --
  possibly in two generations (a crash between the copy and the ack: a duplicate, allowed),
  never in none; each copy found was asked for and carries the right REAL_TOPIC,
  ORIGIN_MESSAGE_ID and RECONSUMETIMES. The run counts the states.

An ack of the official client (Python API: no ack receipts; the C++ client groups acks) is
only *attempted*: the message may come again after a crash; the run counts those
redeliveries and allows them. A message delivered and acknowledged although its publish was
never acknowledged is fine. Anything the clients saw that the broker must never send (bytes
the workload never sent) is a violation too.

Reproducibility: the seed picks the workload's actions, the crash plan and the simulated
disk's fates, and is printed first; `--seed` replays them. Threads, sockets and the broker's
own timing are real, so two runs of one seed interleave differently: what a seed fixes is
the plan, not the instant.

Layout: `_crash_book` (options, summary, payloads, the book of acknowledgements),
`_crash_brokers` (the broker in a subprocess or in process), `_crash_workload`,
`_crash_receipts`, `_crash_retry`, `_crash_check`, and this module (the run and its report).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Never

from magnetar.storage.testing.crashtest import lock_scratch_dir
from magnetar.storage.testing.simfs import CRASH_POINTS, SimFileSystem, SimulatedCrash

from ._crash_book import (
    VIOLATIONS_LISTED_MAX,
    AckBook,
    BrokerCrashTestOptions,
    BrokerCrashTestSummary,
)
from ._crash_brokers import BrokerProcess, InProcessBroker
from ._crash_check import Verification, verify_after_restart
from ._crash_workload import Workload

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["BrokerCrashTestOptions", "BrokerCrashTestSummary", "run_broker_crashtest"]

CRASH_AFTER_S_MIN = 0.05
FILE_OPS_AHEAD_MAX = 400  # a powerloss plan stops the disk this many file operations ahead, at most
STEP_INTERVAL_S = 0.005
# The crash points a broker's storage passes (compaction and GC need far more garbage than a
# short run makes).
BROKER_CRASH_POINTS = tuple(p for p in CRASH_POINTS if p.split(":")[0] in ("journal", "checkpoint"))

Broker = BrokerProcess | InProcessBroker


def run_broker_crashtest(options: BrokerCrashTestOptions) -> BrokerCrashTestSummary:
    """Run the harness (see the module comment) and print its report.

    Prints `crashtest broker: seed <S>` first, a progress bar on stderr (unless
    `options.progress` is False), every violation as one line as it is found, and last
    `crashtest broker: <N> iterations, <M> acknowledged messages verified (<R> retried, <D>
    dead-lettered), <V> violations`.

    Returns:
        The summary; `violations` is 0 when nothing was wrong. A mode whose broker could not
        be started again stops there (its directory is left as found).

    Raises:
        DataDirLockedError: another process holds `data_dir`'s lock; nothing was written.
        OSError: the scratch directory cannot be created or cleared.
    """
    lock = lock_scratch_dir(options.data_dir)
    try:
        return _Run(options).run()
    finally:
        lock.release()


@dataclass
class _Mode:
    name: str
    directory: str
    broker: Broker | None = None
    iterations: int = 0
    stopped: bool = False


class _Run:
    def __init__(self, options: BrokerCrashTestOptions):
        self.options = options
        self.seed = options.seed if options.seed is not None else secrets.randbelow(2**31)
        self.out: IO[str] = options.out or sys.stdout
        self.summary = BrokerCrashTestSummary(seed=self.seed)
        self.bar: tqdm[Never] | None = None

    def run(self) -> BrokerCrashTestSummary:
        from tqdm import tqdm

        print(f"crashtest broker: seed {self.seed}", file=self.out, flush=True)
        modes = self._prepare_modes()
        schedule = self._schedule()
        with _quiet_logs(), tqdm(total=len(schedule), desc="crashtest broker", unit="crash",
                                 file=sys.stderr, disable=not self.options.progress) as bar:
            self.bar = bar
            try:
                for name in schedule:
                    mode = modes[name]
                    if not mode.stopped:
                        self._iteration(mode)
                        mode.iterations += 1
                    bar.update(1)
                    bar.set_postfix(violations=self.summary.violations, refresh=False)
            finally:
                self.bar = None
                for mode in modes.values():
                    _stop(mode)
        self._finish(modes)
        return self.summary

    def _prepare_modes(self) -> dict[str, _Mode]:
        modes = {}
        for name in ("kill", "powerloss"):
            directory = os.path.join(os.path.abspath(self.options.data_dir), f"broker-{name}")
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(directory + ".log")
            modes[name] = _Mode(name, directory)
        return modes

    def _schedule(self) -> list[str]:
        if self.options.mode == "both":
            return ["kill" if i % 2 == 0 else "powerloss" for i in range(self.options.iterations)]
        return [self.options.mode] * self.options.iterations

    def report(self, context: str, violations: list[tuple[int, str]]) -> None:
        for count, line in violations:
            self.summary.violations += count
            if len(self.summary.violation_messages) < VIOLATIONS_LISTED_MAX:
                self.summary.violation_messages.append(f"{context}: {line}")
                self._print(f"crashtest broker: VIOLATION {context}: {line}")

    def _print(self, text: str) -> None:
        if self.bar is not None and not self.bar.disable:
            self.bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    # -- one iteration -----------------------------------------------------------------

    def _iteration(self, mode: _Mode) -> None:
        index = mode.iterations
        rng = random.Random(f"{self.seed}/broker-{mode.name}/{index}")
        context = f"{mode.name} iteration {index} (seed {self.seed}"
        try:
            broker = mode.broker or self._start(mode, rng)
        except Exception as error:
            self.report(context + ")", [(1, f"the broker did not start: {_describe(error)}")])
            mode.stopped = True
            return
        mode.broker = None
        topic = f"persistent://public/default/crashtest-{mode.name}-{index}"
        book = AckBook()
        workload = Workload(broker.url, broker.port, topic, self.seed, book, rng,
                            self.options.delay_ms_max)
        try:
            workload.start()
            context += self._run_and_crash(broker, workload, rng) + ")"
        except Exception as error:  # the workload could not start: a broker bug, or no broker
            workload.stop()
            self.report(context + ")", [(1, f"the workload failed: {_describe(error)}")])
            _crash_quietly(broker)
            self._restart(mode, rng, context + ")")
            return
        workload.stop()
        restarted = self._restart(mode, rng, context)
        if restarted is None:
            return
        self.report(context, [(1, f"a client saw: {e}") for e in book.errors])
        try:
            verification = verify_after_restart(restarted.url, topic, self.seed, book, rng)
        except Exception as error:
            self.report(context, [(1, f"the checks after the restart failed: "
                                      f"{_describe(error)}")])
            return
        self._record(context, verification)

    def _start(self, mode: _Mode, rng: random.Random) -> Broker:
        """A broker on the mode's directory (recovering it from the last crash)."""
        if mode.name == "kill":
            process = BrokerProcess(mode.directory, mode.directory + ".log")
            process.start()
            return process
        return InProcessBroker(mode.directory, SimFileSystem(rng.getrandbits(32)))

    def _restart(self, mode: _Mode, rng: random.Random, context: str) -> Broker | None:
        try:
            mode.broker = self._start(mode, rng)
        except Exception as error:
            self.report(context, [(1, f"the broker did not start again after the crash: "
                                      f"{_describe(error)} (stopped; {mode.directory} left "
                                      f"as found)")])
            mode.stopped = True
            return None
        return mode.broker

    def _run_and_crash(self, broker: Broker, workload: Workload, rng: random.Random) -> str:
        """Run the workload until the planned crash, crash, and say how (for the context)."""
        began = time.monotonic()
        crash_after_s = rng.uniform(CRASH_AFTER_S_MIN, self.options.crash_after_s_max)
        if isinstance(broker, BrokerProcess):
            _run_until(workload, lambda: time.monotonic() - began >= crash_after_s)
            broker.kill()
            return f", SIGKILL {crash_after_s * 1000:.0f} ms into the workload"
        kind, plan = _plan_powerloss(broker.fs, rng)
        deadline_s = crash_after_s if kind == "time" else self.options.crash_after_s_max
        _run_until(workload, lambda: broker.fs.crashed or time.monotonic() - began >= deadline_s)
        cause = kind if broker.fs.crashed else "time"
        where = broker.fs.crashed_at or f"{(time.monotonic() - began) * 1000:.0f} ms"
        fates = broker.power_loss(where)
        self.summary.crashes[cause] = self.summary.crashes.get(cause, 0) + 1
        lost = ", ".join(f"{k} {v}" for k, v in fates.items() if v) or "nothing unsynced"
        return f", plan: {plan}; the disk stopped at {where}; power loss: {lost}"

    def _record(self, context: str, verification: Verification) -> None:
        self.report(context, verification.violations)
        summary = self.summary
        summary.acknowledged_verified += verification.acknowledged_verified
        summary.receipted_acks_verified += verification.receipted_acks_verified
        summary.attempted_acks_redelivered += verification.attempted_acks_redelivered
        summary.resends += verification.resends
        summary.resends_dropped += verification.resends_dropped
        summary.retried_verified += verification.retried_verified
        summary.dead_lettered_verified += verification.dead_lettered_verified
        summary.retry_duplicates += verification.retry_duplicates
        for state, count in verification.retry_states.items():
            summary.retry_states[state] = summary.retry_states.get(state, 0) + count

    def _finish(self, modes: dict[str, _Mode]) -> None:
        summary = self.summary
        summary.kill_iterations = modes["kill"].iterations
        summary.powerloss_iterations = modes["powerloss"].iterations
        summary.iterations = summary.kill_iterations + summary.powerloss_iterations
        for mode in modes.values():
            if mode.stopped:
                print(f"crashtest broker: stopped on {mode.directory} (left as found for "
                      "inspection)", file=self.out)
        print(f"crashtest broker: acks with a receipt verified: "
              f"{summary.receipted_acks_verified}; acks without one redelivered (allowed): "
              f"{summary.attempted_acks_redelivered}; resends: {summary.resends}, dropped as "
              f"duplicates: {summary.resends_dropped}", file=self.out)
        states = ", ".join(f"{count} {state}" for state, count in summary.retry_states.items())
        print(f"crashtest broker: subscription retry, acknowledged publishes: {states or 'none'}; "
              f"found in two generations (allowed): {summary.retry_duplicates}", file=self.out)
        if summary.powerloss_iterations:
            crashes = ", ".join(f"{k} {v}" for k, v in sorted(summary.crashes.items()))
            print(f"crashtest broker: powerloss crashes by cause: {crashes}", file=self.out)
        print(summary.line(), file=self.out, flush=True)


def _plan_powerloss(fs: SimFileSystem, rng: random.Random) -> tuple[str, str]:
    """Arm the simulated disk to stop at a crash point or a file operation ahead, or
    nowhere (the harness stops it at a time). Returns (kind, description)."""
    choice = rng.random()
    if choice < 0.4:
        fs.crash_at_point = rng.choice(BROKER_CRASH_POINTS)
        return "crash point", f"crash point {fs.crash_at_point}"
    if choice < 0.7:
        ahead = rng.randint(1, FILE_OPS_AHEAD_MAX)
        fs.crash_at_op = fs.ops + ahead
        return "file operation", f"file operation {ahead} ahead"
    return "time", "a time"


def _run_until(workload: Workload, crash_now: Callable[[], bool]) -> None:
    """Step the workload until `crash_now()`, a step every `STEP_INTERVAL_S` (a pace, so a
    run publishes thousands of messages, not millions)."""
    while not crash_now():
        workload.step()
        time.sleep(STEP_INTERVAL_S)


def _crash_quietly(broker: Broker) -> None:
    if isinstance(broker, BrokerProcess):
        broker.kill()
    else:
        with contextlib.suppress(Exception):
            broker.power_loss("after a failed workload")


def _stop(mode: _Mode) -> None:
    """Shut the mode's last broker down cleanly."""
    broker, mode.broker = mode.broker, None
    if broker is None:
        return
    with contextlib.suppress(Exception):
        broker.stop()


def _describe(error: BaseException) -> str:
    text = str(error).strip().replace("\n", " | ")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Every crash makes the broker and the engine log errors (in process, for the
    powerloss mode), and a storage thread that meets the stopped simulated disk at a crash
    point ends with `SimulatedCrash`; they are the point here, not news."""
    logger = logging.getLogger("magnetar")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    hook = threading.excepthook

    def quiet_hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.exc_value, SimulatedCrash):
            hook(args)

    threading.excepthook = quiet_hook
    try:
        yield
    finally:
        threading.excepthook = hook
        logger.setLevel(level)

