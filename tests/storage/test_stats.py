"""The engine's own figures: bucket placement (upper-inclusive bounds, overflow), and the
journal's fsync and group-commit histograms counting one observation per fdatasync."""

from __future__ import annotations

from pathlib import Path

from magnetar.storage import Buckets, Storage
from tests.storage.helpers import small_config
from tests.storage.test_journal import JournalHarness, payload


def test_a_value_goes_to_the_first_bound_at_or_above_it() -> None:
    buckets = Buckets([10, 100])
    for value in (0, 10, 11, 100, 101, 10_000):
        buckets.add(value)
    snapshot = buckets.snapshot()
    assert snapshot.counts == (2, 2, 2)  # <=10, <=100, overflow
    assert snapshot.count == 6
    assert snapshot.sum == 10_222
    buckets.add(5)
    assert snapshot.counts == (2, 2, 2), "a snapshot does not move"


def test_one_fsync_of_a_batch_is_one_observation_of_its_size(tmp_path: Path) -> None:
    harness = JournalHarness(tmp_path / "journal", small_config(background_threads=False))
    for i in range(100):
        harness.submit(payload(i))
    assert harness.journal.pump()
    metrics = harness.journal.metrics
    fsyncs = metrics.journal_fsync_us.snapshot()
    groups = metrics.group_commit_records.snapshot()
    assert fsyncs.count == groups.count == 1
    assert groups.sum == 100  # the requests: the PAD record is not counted
    assert groups.counts[groups.bounds.index(128)] == 1
    assert metrics.journal_bytes_written >= 100 * len(payload(0))
    harness.journal.close()


def test_storage_counts_replay_and_gc_into_one_set_of_figures(tmp_path: Path) -> None:
    with Storage.open(tmp_path, small_config()) as store:
        ledger = store.wait(store.create_ledger())
        for i in range(10):
            store.wait(store.add_entry(ledger, payload(i)))
        assert store.metrics.journal_fsync_us.snapshot().count > 0
        store.checkpoint()
        assert store.write_cache_bytes == 0
        assert store.entry_log_bytes > 0
        runs = store.metrics.gc_runs
        store.gc()
        assert store.metrics.gc_runs == runs + 1
        assert store.metrics.journal_fsync_us is store.journal.metrics.journal_fsync_us
    with Storage.open(tmp_path, small_config()) as store:
        assert store.metrics.replay_seconds > 0
