"""Crash at every named crash point (storage design §12.6), lose power, reopen, verify.

One deterministic workload (no background threads) creates ledgers, writes entries in
group-committed batches, checkpoints, rotates entry logs and journal segments (both are
kept small), fences a ledger, deletes ledgers and runs GC, so that it passes every label
in `storage.testing.simfs.CRASH_POINTS`. A `SimFileSystem` stops it at the n-th pass of one label
(or at the n-th file operation), `power_loss()` drops, tears or corrupts what was not
synced, and a plain reopen must then show:

* every acknowledged entry (its completion finished with a result before the crash),
  byte-identical; entries past the LAC unreadable; any entry at or below the LAC exactly
  the bytes that were submitted for that id (an unacknowledged one may reappear, whole);
* every acknowledged fence and delete in force, every acknowledged create present, and a
  new ledger's id above every id the workload saw (a purged tombstone's id stays used);
* `check().ok`, and a directory that keeps working: a new add survives a clean restart.
"""

from __future__ import annotations

import errno
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from magnetar.storage import (
    Completion,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotFoundError,
    NoSuchEntryError,
    Storage,
    StorageConfig,
    StorageError,
    StorageFailedError,
    StorageFullError,
)
from magnetar.storage.testing.simfs import CRASH_POINTS, SimFileSystem

CONFIG = StorageConfig(
    background_threads=False,
    journal_alignment_bytes=512,
    journal_prealloc_bytes=2048,
    journal_segment_bytes_max=8192,
    journal_segments_kept_max=1,
    entry_log_bytes_max=8192,
    entry_size_bytes_max=4096,
    journal_record_bytes_max=8192,
    write_cache_bytes_max=1 << 20,
    lmdb_map_bytes=64 << 20,
)
HITS_PER_POINT_MAX = 3
SWEEP_ITERATIONS = 50
SLOW_SWEEP_ITERATIONS = 2000


class CountingFileSystem(SimFileSystem):
    """A SimFileSystem that also counts how often each crash point is passed."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.passes: Counter[str] = Counter()

    def point(self, label: str) -> None:
        self.passes[label] += 1
        super().point(label)


@dataclass
class Model:
    """What the workload asked for and what the engine acknowledged."""

    submitted: dict[int, list[bytes]] = field(default_factory=dict)
    acked_lac: dict[int, int] = field(default_factory=dict)
    created: set[int] = field(default_factory=set)
    fenced: set[int] = field(default_factory=set)
    fence_asked: set[int] = field(default_factory=set)
    closed: dict[int, int] = field(default_factory=dict)
    close_asked: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    delete_asked: set[int] = field(default_factory=set)
    create_pending: bool = False

    def writable(self) -> list[int]:
        stopped = self.fence_asked | self.close_asked | self.delete_asked
        return [i for i in sorted(self.created) if i not in stopped]


def acked(completion: Completion[int]) -> bool:
    return completion.done() and completion.exception() is None


class Workload:
    """Drives one store through the workload, recording acknowledgements in a Model."""

    def __init__(self, store: Storage, rng: random.Random, model: Model):
        self.store = store
        self.rng = rng
        self.model = model

    def create(self) -> None:
        self.model.create_pending = True
        completion = self.store.create_ledger({"workload": "crash-points"})
        ledger_id = self.store.wait(completion)
        self.model.created.add(ledger_id)
        self.model.submitted[ledger_id] = []
        self.model.acked_lac[ledger_id] = -1
        self.model.create_pending = False

    def entry_size(self, ledger_id: int) -> int:
        if ledger_id % 4 == 3:  # the ledger that gets deleted: big entries
            return self.rng.randint(1500, 3000)
        return self.rng.randint(40, 400)

    def add_round(self) -> None:
        """A few adds to every writable ledger, all in flight together, then wait."""
        pending: list[tuple[int, int, Completion[int]]] = []
        for ledger_id in self.model.writable():
            for _ in range(self.rng.randint(1, 3)):
                entry_id = len(self.model.submitted[ledger_id])
                data = f"{ledger_id}/{entry_id}/".encode() + self.rng.randbytes(
                    self.entry_size(ledger_id))
                completion = self.store.add_entry(ledger_id, data)
                self.model.submitted[ledger_id].append(data)
                pending.append((ledger_id, entry_id, completion))
        try:
            for _, _, completion in pending:
                self.store.wait(completion)
        finally:
            for ledger_id, entry_id, completion in pending:
                if acked(completion):
                    assert completion.result(0) == entry_id
                    self.model.acked_lac[ledger_id] = max(self.model.acked_lac[ledger_id],
                                                          entry_id)

    def fence(self, ledger_id: int) -> None:
        self.model.fence_asked.add(ledger_id)
        self.store.wait(self.store.fence(ledger_id))
        self.model.fenced.add(ledger_id)

    def close(self, ledger_id: int) -> None:
        self.model.close_asked.add(ledger_id)
        last = self.store.wait(self.store.close_ledger(ledger_id))
        self.model.closed[ledger_id] = last

    def delete(self, ledger_id: int, *, gc_while_in_flight: bool = False) -> None:
        """Delete a ledger; optionally run GC while the delete is queued but not yet
        durable (a crash then may lose the delete, and must not lose the entries)."""
        self.model.delete_asked.add(ledger_id)
        completion = self.store.delete_ledger(ledger_id)
        if gc_while_in_flight:
            self.store.gc()
        self.store.wait(completion)
        self.model.deleted.add(ledger_id)

    def run(self) -> None:
        for _ in range(4):
            self.create()
        first, second, third, fourth = sorted(self.model.created)
        for round_number in range(8):
            self.add_round()
            if round_number == 2:
                self.fence(second)
            if round_number % 2 == 1:
                self.store.checkpoint()
            if round_number == 5:
                self.delete(third)
                self.store.checkpoint()
                self.delete(fourth, gc_while_in_flight=True)
        self.close(first)
        self.store.checkpoint()
        self.store.gc()
        self.create()
        for _ in range(2):
            self.add_round()
        self.store.checkpoint()
        self.store.gc()


def run_until_crash(data_dir: Path, sim: SimFileSystem, seed: int) -> Model:
    """Open the store on `sim` and run the workload until it ends or the simulated
    machine stops; then abandon the store and apply the power loss."""
    model = Model()
    store: Storage | None = None
    try:
        store = Storage.open(data_dir, CONFIG, fs=sim)
        Workload(store, random.Random(seed), model).run()
    except (StorageError, OSError):
        if not sim.crashed:
            raise  # a real failure, not the simulated crash
    if store is not None:
        store.abandon()
    sim.power_loss()
    return model


def verify(data_dir: Path, model: Model) -> None:
    store = Storage.open(data_dir, CONFIG)
    try:
        verify_ledgers(store, model)
        report = store.check()
        assert report.ok, report.render()
        # No id comes back, whatever the crash left of the deleted ledgers' tombstones.
        assert store.wait(store.create_ledger({})) > max(model.submitted, default=0)
        survivor = next((i for i in model.writable() if store.ledger_info(i).state == "open"),
                        None)
        if survivor is not None:
            lac = store.last_add_confirmed(survivor)
            assert store.wait(store.add_entry(survivor, b"after recovery")) == lac + 1
    finally:
        store.close()
    with Storage.open(data_dir, CONFIG) as store:
        assert store.check().ok
        if survivor is not None:
            assert store.read_entry(survivor, lac + 1) == b"after recovery"


def verify_ledgers(store: Storage, model: Model) -> None:
    present = {info.ledger_id: info for info in store.list_ledgers()}
    known = set(model.submitted)
    extra = set(present) - known
    # Only a create that was in flight at the crash may show up unannounced, empty.
    assert len(extra) <= (1 if model.create_pending else 0), extra
    for ledger_id in extra:
        assert present[ledger_id].last_add_confirmed == -1
    for ledger_id in sorted(known):
        if ledger_id in model.deleted:
            assert ledger_id not in present
            with pytest.raises(LedgerNotFoundError):
                store.read_entry(ledger_id, 0)
            continue
        if ledger_id not in present:
            assert ledger_id in model.delete_asked, f"ledger {ledger_id} lost"
            continue
        lac = present[ledger_id].last_add_confirmed
        verify_entries(store, model, ledger_id, lac)
        state = present[ledger_id].state
        if ledger_id in model.fenced:
            assert state == "fenced"
            with pytest.raises(LedgerFencedError):
                store.add_entry(ledger_id, b"refused")
        elif ledger_id in model.closed:
            assert state == "closed"
            assert lac == model.closed[ledger_id]
            with pytest.raises(LedgerClosedError):
                store.add_entry(ledger_id, b"refused")
        elif ledger_id not in model.fence_asked | model.close_asked:
            assert state == "open"


def verify_entries(store: Storage, model: Model, ledger_id: int, lac: int) -> None:
    submitted = model.submitted[ledger_id]
    assert lac >= model.acked_lac[ledger_id], (
        f"ledger {ledger_id}: acknowledged up to {model.acked_lac[ledger_id]}, "
        f"recovered only up to {lac}")
    assert lac < len(submitted)
    if lac >= 0:
        assert store.read_entries(ledger_id, 0, lac) == submitted[:lac + 1]
    with pytest.raises(NoSuchEntryError):
        store.read_entry(ledger_id, lac + 1)


def clean_run(data_dir: Path, seed: int) -> CountingFileSystem:
    sim = CountingFileSystem(seed)
    model = run_until_crash(data_dir, sim, seed)
    assert not sim.crashed
    assert len(model.deleted) == 2
    assert len(model.fenced) == 1
    assert len(model.closed) == 1
    verify(data_dir, model)
    return sim


def test_workload_reaches_every_crash_point(tmp_path: Path, seed: int) -> None:
    sim = clean_run(tmp_path, seed)
    missing = [label for label in CRASH_POINTS if sim.passes[label] == 0]
    assert not missing, f"the workload never passes {missing}"
    assert set(sim.passes) <= set(CRASH_POINTS), "a crash point not listed in CRASH_POINTS"


def hits_to_try(passes: int) -> list[int]:
    """Up to HITS_PER_POINT_MAX pass numbers spread over 1..passes."""
    if passes <= HITS_PER_POINT_MAX:
        return list(range(1, passes + 1))
    step = (passes - 1) / (HITS_PER_POINT_MAX - 1)
    return sorted({1 + round(i * step) for i in range(HITS_PER_POINT_MAX)})


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_point(tmp_path: Path, seed: int, point: str) -> None:
    passes = clean_run(tmp_path / "clean", seed).passes[point]
    assert passes > 0, f"the workload never reaches {point}"
    for hit in hits_to_try(passes):
        data_dir = tmp_path / f"hit{hit}"
        sim = SimFileSystem(seed + hit, crash_at_point=point, point_hits=hit)
        model = run_until_crash(data_dir, sim, seed)
        assert sim.crashed_at == f"crash point {point}", (point, hit, sim.crashed_at)
        verify(data_dir, model)


def sweep(tmp_path: Path, seed: int, iterations: int, workloads: int) -> None:
    """Crash at a random file operation of the workload, `iterations` times over
    `workloads` different workload seeds."""
    rng = random.Random(seed)
    per_workload = max(1, iterations // workloads)
    done = 0
    while done < iterations:
        workload_seed = rng.randrange(2**32)
        total_ops = clean_run(tmp_path / f"clean{done}", workload_seed).ops
        for _ in range(min(per_workload, iterations - done)):
            op = rng.randint(1, total_ops)
            data_dir = tmp_path / f"run{done}"
            sim = SimFileSystem(rng.randrange(2**32), crash_at_op=op)
            model = run_until_crash(data_dir, sim, workload_seed)
            assert sim.crashed, f"operation {op} of {total_ops} never came"
            verify(data_dir, model)
            done += 1


def test_crash_at_random_operation(tmp_path: Path, seed: int) -> None:
    sweep(tmp_path, seed, SWEEP_ITERATIONS, workloads=2)


@pytest.mark.slow
def test_crash_at_random_operation_long(tmp_path: Path, seed: int) -> None:
    sweep(tmp_path, seed, SLOW_SWEEP_ITERATIONS, workloads=40)


# -- disk errors (§12.6 #21) --------------------------------------------------------------

@pytest.mark.parametrize(("kind", "code"), [("write", errno.ENOSPC), ("write", errno.EIO),
                                            ("sync", errno.EIO)])
def test_journal_disk_error_stops_engine(tmp_path: Path, seed: int, kind: str,
                                         code: int) -> None:
    sim = SimFileSystem(seed)
    store = Storage.open(tmp_path, CONFIG, fs=sim)
    ledger_id = store.wait(store.create_ledger({}))
    datas = [f"entry {i}".encode() for i in range(5)]
    for data in datas:
        store.wait(store.add_entry(ledger_id, data))
    if kind == "write":
        sim.fail_writes(code)
    else:
        sim.fail_syncs(code)
    failing = store.add_entry(ledger_id, b"never acknowledged")
    expected = StorageFullError if code == errno.ENOSPC else StorageFailedError
    with pytest.raises(expected):
        store.wait(failing)
    assert isinstance(store.failed, expected)
    with pytest.raises(expected):
        store.add_entry(ledger_id, b"refused at once")
    assert store.read_entries(ledger_id, 0, 4) == datas  # reads go on
    store.abandon()
    sim.heal()
    sim.power_loss()
    with Storage.open(tmp_path, CONFIG) as store:
        lac = store.last_add_confirmed(ledger_id)
        assert lac in (4, 5)  # the failed add was written or not, but never acknowledged
        assert store.read_entries(ledger_id, 0, 4) == datas
        if lac == 5:
            assert store.read_entry(ledger_id, 5) == b"never acknowledged"
        assert store.check().ok
