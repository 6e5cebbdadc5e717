"""The crash harness's model (see `crashtest` for the theory of operation): the seeded
payloads and metadata values, the storage configurations of each mode, the options and the
summary, what was acknowledged (`AckModel`), and the kill-mode side channel through which the
child reports every acknowledgement.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from .._config import StorageConfig
from .._journal import JournalMark
from .._ledger import CLOSED, FENCED, OPEN, LedgerInfo

if TYPE_CHECKING:
    pass


__all__ = ["AckModel", "CrashTestOptions", "CrashTestSummary", "apply_channel_line"]

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
