"""The crash-recovery harness (`magnetar crashtest`): short runs of both modes, the
verifier catching what it must catch, replay by seed, and the command line."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from magnetar.storage import DataDirLockedError, Storage, StorageConfig
from magnetar.storage.testing.crashtest import (
    AckModel,
    CrashTestOptions,
    CrashTestSummary,
    Verifier,
    apply_channel_line,
    entry_payload,
    entry_size,
    ledger_metadata,
    payload_digest,
    run_crashtest,
    verify_config,
)
from magnetar.storage.testing.simfs import CRASH_POINTS

SUMMARY_LINE = re.compile(
    r"^crashtest: (\d+) iterations, (\d+) acknowledged entries verified, (\d+) violations$")
ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, mode: str, iterations: int, seed: int) -> tuple[CrashTestSummary, str]:
    out = io.StringIO()
    summary = run_crashtest(CrashTestOptions(data_dir=str(tmp_path), iterations=iterations,
                                             seed=seed, mode=mode, progress=False, out=out))
    return summary, out.getvalue()


def _assert_clean(summary: CrashTestSummary, text: str, iterations: int, seed: int) -> None:
    assert summary.violation_messages == []
    assert summary.violations == 0
    assert summary.iterations == iterations
    assert summary.acknowledged_verified > 0
    lines = text.strip().splitlines()
    assert lines[0] == f"crashtest: seed {seed}"
    match = SUMMARY_LINE.match(lines[-1])
    assert match is not None, lines[-1]
    assert match.groups() == (str(iterations), str(summary.acknowledged_verified), "0")


# -- short runs of both modes -----------------------------------------------------------

def test_powerloss_crash_at_every_crash_point_loses_nothing_acknowledged(
        tmp_path: Path, seed: int) -> None:
    summary, text = _run(tmp_path, "powerloss", 40, seed)
    _assert_clean(summary, text, 40, seed)
    assert summary.powerloss_iterations == 40
    # 20 iterations walk the named crash points (each reached at least once when its step
    # ran), 5 hit ENOSPC or EIO and then crash, 15 crash at a random file operation.
    always_reached = [p for p in CRASH_POINTS if p.startswith(("journal:before", "checkpoint:"))]
    assert all(summary.crash_points_hit.get(p, 0) >= 1 for p in always_reached), \
        summary.crash_points_hit
    assert summary.crash_points_hit["disk error"] == 5
    assert summary.crash_points_hit.get("operation", 0) >= 8


def test_kill_9_of_threaded_writer_loses_nothing_acknowledged(tmp_path: Path,
                                                             seed: int) -> None:
    summary, text = _run(tmp_path, "kill", 3, seed)
    _assert_clean(summary, text, 3, seed)
    assert summary.kill_iterations == 3
    assert summary.entries_read >= summary.acknowledged_verified


def test_corrupt_replayed_record_is_refused_and_the_loss_reported(tmp_path: Path,
                                                                  seed: int) -> None:
    """Issue 10 item 1 in the harness: after a crash, a byte flipped inside a record that
    recovery replays (a later batch proves it was synced) makes recovery refuse, naming the
    record; with skip_corrupt_journal_segments it opens and counts what it dropped."""
    summary, text = _run(tmp_path, "powerloss", 10, seed)
    _assert_clean(summary, text, 10, seed)
    assert summary.corrupt_cases + summary.corrupt_skipped == 4  # iterations 0, 3, 6, 9
    assert summary.corrupt_cases >= 1
    assert summary.corrupt_refused == summary.corrupt_cases
    assert (f"corrupt replayed record: {summary.corrupt_cases} cases, "
            f"{summary.corrupt_refused} refused") in text
    assert sorted(os.listdir(tmp_path)) == ["LOCK", "crashtest-powerloss"]  # the copy is gone


def test_powerloss_run_replays_exactly_from_its_seed(tmp_path: Path, seed: int) -> None:
    first, _ = _run(tmp_path / "a", "powerloss", 12, seed)
    second, _ = _run(tmp_path / "b", "powerloss", 12, seed)
    other, _ = _run(tmp_path / "c", "powerloss", 12, seed + 1)
    assert (first.acknowledged_verified, first.entries_read, first.crash_points_hit) == \
        (second.acknowledged_verified, second.entries_read, second.crash_points_hit)
    assert (first.acknowledged_verified, first.entries_read) != \
        (other.acknowledged_verified, other.entries_read)


# -- the verifier can fail --------------------------------------------------------------

def _write_ledger(store: Storage, model: AckModel, seed: int, entries: int,
                  corrupt: dict[int, bytes] | None = None) -> int:
    """Create a ledger and add entries through the engine, recording the acks."""
    corrupt = corrupt or {}
    ledger_id = store.wait(store.create_ledger(ledger_metadata(seed)))
    assert model.ledger_created(ledger_id, "test") == []
    for entry_id in range(entries):
        data = corrupt.get(entry_id, entry_payload(seed, ledger_id, entry_id))
        assert store.wait(store.add_entry(ledger_id, data)) == entry_id
        if entry_id not in corrupt:
            assert model.entry_added(ledger_id, entry_id, len(data), payload_digest(data)) == []
    return ledger_id


def test_verifier_passes_a_faithful_directory(tmp_path: Path, seed: int) -> None:
    model = AckModel(seed)
    with Storage.open(tmp_path, verify_config()) as store:
        _write_ledger(store, model, seed, 20)
    result = Verifier(seed).verify_dir(str(tmp_path), model, "clean")
    assert result.violations == []
    assert result.acknowledged_verified == 20
    assert result.entries_read == 20


def test_verifier_reports_acked_entries_of_a_ledger_deleted_behind_its_back(
        tmp_path: Path, seed: int) -> None:
    model = AckModel(seed)
    with Storage.open(tmp_path, verify_config()) as store:
        kept = _write_ledger(store, model, seed, 5)
        doomed = _write_ledger(store, model, seed, 8)
    with Storage.open(tmp_path, verify_config()) as store:
        store.wait(store.delete_ledger(doomed))
    result = Verifier(seed).verify_dir(str(tmp_path), model, "iteration 7 (seed 1)")
    assert len(result.violations) == 1
    message = result.violations[0]
    assert message.startswith("iteration 7 (seed 1): ")
    assert f"ledger {doomed} " in message
    assert "expected present with entries 0..7, found no such ledger" in message
    assert result.acknowledged_verified == 5  # the kept ledger's
    assert kept != doomed


def test_verifier_reports_bytes_that_differ_from_the_derived_payload(tmp_path: Path,
                                                                    seed: int) -> None:
    model = AckModel(seed)
    with Storage.open(tmp_path, verify_config()) as store:
        ledger_id = _write_ledger(store, model, seed, 4, corrupt={2: b"not the payload"})
    result = Verifier(seed).verify_dir(str(tmp_path), model, "ctx")
    want = entry_payload(seed, ledger_id, 2)
    assert result.violations == [
        f"ctx: ledger {ledger_id} (test): entry 2: expected {len(want)} bytes "
        f"{payload_digest(want)}, found 15 bytes {payload_digest(b'not the payload')}"]


def test_verifier_reports_an_acked_fence_that_did_not_hold(tmp_path: Path, seed: int) -> None:
    model = AckModel(seed)
    with Storage.open(tmp_path, verify_config()) as store:
        ledger_id = _write_ledger(store, model, seed, 3)
    assert model.ledger_fenced(ledger_id, 2, "test") == []
    result = Verifier(seed).verify_dir(str(tmp_path), model, "ctx")
    assert len(result.violations) == 1
    assert "expected state fenced (fence acknowledged at 2 (test)), found open" in \
        result.violations[0]


def test_verifier_reports_an_acked_delete_that_came_back(tmp_path: Path, seed: int) -> None:
    model = AckModel(seed)
    with Storage.open(tmp_path, verify_config()) as store:
        ledger_id = _write_ledger(store, model, seed, 2)
    model.ledger_deleted(ledger_id, "test")
    result = Verifier(seed).verify_dir(str(tmp_path), model, "ctx")
    assert result.violations == [f"ctx: ledger {ledger_id}: expected absent (delete "
                                 f"acknowledged (test)), found open with LAC 1"]


def test_verifier_reports_an_acked_entry_beyond_the_recovered_lac(tmp_path: Path,
                                                                  seed: int) -> None:
    model = AckModel(seed)
    with Storage.open(tmp_path, verify_config()) as store:
        ledger_id = _write_ledger(store, model, seed, 3)
    data = entry_payload(seed, ledger_id, 3)  # acknowledged, yet never written
    assert model.entry_added(ledger_id, 3, len(data), payload_digest(data)) == []
    result = Verifier(seed).verify_dir(str(tmp_path), model, "ctx")
    assert len(result.violations) == 1
    assert "expected entries 0..3 (acknowledged or recovered before), found LAC 2" in \
        result.violations[0]
    assert result.acknowledged_verified == 3


def test_verifier_reports_a_regressed_mark(tmp_path: Path, seed: int) -> None:
    model = AckModel(seed)
    Verifier(seed).verify_dir(str(tmp_path), model, "first")
    assert model.mark_floor is not None
    floor = model.mark_floor._replace(segment_id=model.mark_floor.segment_id + 100)
    model.mark_persisted(floor, "a checkpoint from the future")
    result = Verifier(seed).verify_dir(str(tmp_path), model, "ctx")
    assert len(result.violations) == 1
    assert "persisted mark regressed" in result.violations[0]
    assert "(a checkpoint from the future)" in result.violations[0]


def test_reopen_failure_is_fatal(tmp_path: Path, seed: int) -> None:
    with Storage.open(tmp_path, verify_config()) as store:
        _write_ledger(store, AckModel(seed), seed, 40)
    for name in os.listdir(tmp_path / "entrylogs"):
        os.remove(tmp_path / "entrylogs" / name)
    result = Verifier(seed).verify_dir(str(tmp_path), AckModel(seed), "ctx")
    assert result.fatal
    assert result.violations[0].startswith("ctx: reopen failed: CorruptionError: entry log")


# -- payloads and the side channel ------------------------------------------------------

def test_payload_sizes_span_one_byte_to_64_kib(seed: int) -> None:
    sizes = [entry_size(seed, ledger_id, entry_id)
             for ledger_id in range(1, 5) for entry_id in range(500)]
    assert min(sizes) == 1
    assert max(sizes) == 64 * 1024
    assert len(entry_payload(seed, 3, 7)) == entry_size(seed, 3, 7)
    assert entry_payload(seed, 3, 7) != entry_payload(seed + 1, 3, 7)


def test_channel_lines_update_the_model(seed: int) -> None:
    model = AckModel(seed)
    data = entry_payload(seed, 4, 0)
    lines = ["R", "C 4", f"A 4 0 {len(data)} {payload_digest(data)}", "F 4 0", "d 4",
             "M 3 4096 17"]
    assert [p for line in lines for p in apply_channel_line(model, line, "it")] == []
    expectation = model.ledgers[4]
    assert (expectation.last_required, expectation.state_required) == (0, "fenced")
    assert expectation.exact_lac == 0
    assert expectation.delete_requested
    assert model.mark_floor == (3, 4096, 17)
    assert apply_channel_line(model, "D 4", "it") == []
    assert 4 in model.deleted
    assert apply_channel_line(model, "A 9 0 1 00", "it") == [
        "ledger 9 entry 0 acknowledged for a ledger the harness does not know"]
    assert apply_channel_line(model, "X boom", "it") == ["child reported an error: boom"]
    assert apply_channel_line(model, "Q 1", "it") == ["unreadable side-channel line 'Q 1'"]


# -- the command line -------------------------------------------------------------------

def test_cli_crashtest_both_modes_exits_zero(tmp_path: Path, seed: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "magnetar.broker.cli", "crashtest", "--data-dir", str(tmp_path),
         "--iterations", "4", "--mode", "both", "--seed", str(seed), "--no-progress"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"crashtest: seed {seed}"
    match = SUMMARY_LINE.match(lines[-1])
    assert match is not None, proc.stdout
    assert match.group(1) == "4"
    assert int(match.group(2)) > 0
    assert match.group(3) == "0"
    assert sorted(os.listdir(tmp_path)) == ["LOCK", "crashtest-kill",
                                            "crashtest-kill.child.log", "crashtest-powerloss"]


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `directory`: (size, mtime in ns)."""
    return {str(path.relative_to(directory)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(directory.rglob("*"))}


def test_cli_crashtest_refuses_a_directory_a_broker_holds(tmp_path: Path, seed: int) -> None:
    with Storage.open(tmp_path) as store:
        store.add_entry(store.create_ledger({}).result(), b"acknowledged").result()
    # Held as a live broker holds its data directory; no background threads, so the store
    # itself writes nothing while the harness tries.
    with Storage.open(tmp_path, StorageConfig(background_threads=False)):
        before = _snapshot(tmp_path)
        proc = subprocess.run(
            [sys.executable, "-m", "magnetar.broker.cli", "crashtest", "--data-dir", str(tmp_path),
             "--iterations", "2", "--seed", str(seed), "--no-progress"],
            capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
        assert _snapshot(tmp_path) == before  # nothing written, nothing removed
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"magnetar crashtest: data directory {tmp_path} is locked by "
                           f"process {os.getpid()}\n")


def test_run_crashtest_holds_the_lock_while_it_runs(tmp_path: Path, seed: int) -> None:
    with Storage.open(tmp_path), pytest.raises(DataDirLockedError):
        _run(tmp_path, "powerloss", 1, seed)
    assert not (tmp_path / "crashtest-powerloss").exists()
    summary, _ = _run(tmp_path, "powerloss", 1, seed)  # released: it runs
    assert summary.violations == 0
    with Storage.open(tmp_path):  # and the harness let go of it afterwards
        pass


def test_cli_crashtest_rejects_an_unknown_mode(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "magnetar.broker.cli", "crashtest", "--data-dir", str(tmp_path),
         "--mode", "meteor"], capture_output=True, text=True, cwd=ROOT, timeout=60,
        check=False)
    assert proc.returncode == 2
    assert "invalid choice: 'meteor'" in proc.stderr


# -- long runs --------------------------------------------------------------------------

@pytest.mark.slow
def test_powerloss_long_run(tmp_path: Path, seed: int) -> None:
    summary, text = _run(tmp_path, "powerloss", 600, seed)
    _assert_clean(summary, text, 600, seed)
    assert all(summary.crash_points_hit.get(p, 0) >= 1 for p in CRASH_POINTS), \
        summary.crash_points_hit


@pytest.mark.slow
def test_kill_long_run(tmp_path: Path, seed: int) -> None:
    summary, text = _run(tmp_path, "kill", 60, seed)
    _assert_clean(summary, text, 60, seed)
