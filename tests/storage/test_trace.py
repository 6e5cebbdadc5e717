"""The opt-in latency trace (`_trace.py`): off unless asked for, bounded, and it records the
journal's and the checkpoint's steps of a real storage in their order."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path

import pytest

from magnetar.storage import Storage, latency_trace
from magnetar.storage._trace import LatencyTrace

from .helpers import small_config, wait_until


def test_the_trace_is_off_without_a_path_and_records_nothing() -> None:
    assert LatencyTrace(None).on is False
    assert LatencyTrace("").on is False
    assert LatencyTrace("/tmp/x").on is True


def test_the_ring_buffer_keeps_the_newest_events_up_to_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    trace = LatencyTrace(str(path), events_max=3)
    for value in range(5):
        trace.mark("read", value, value + 1)
    trace.dump()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(kind, a, b) for _, kind, a, b in lines] == [("read", 2, 3), ("read", 3, 4),
                                                         ("read", 4, 5)]
    assert [ns for ns, *_ in lines] == sorted(ns for ns, *_ in lines)


def test_a_traced_storage_records_its_journal_and_checkpoint_steps_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(latency_trace, "on", True)
    monkeypatch.setattr(latency_trace, "events", type(latency_trace.events)(maxlen=10_000))
    with Storage.open(tmp_path, small_config(checkpoint_interval_ms=3_600_000)) as store:
        ledger = store.create_ledger().result(10)
        latency_trace.events.clear()
        assert store.add_entry(ledger, b"x" * 100).result(10) == 0
        # `result` returns once the completion is set; "durable" follows it in that thread.
        wait_until(lambda: any(e[1] == "durable" for e in latency_trace.events), "durable")
        store.checkpoint()
    kinds = [kind for _, kind, _, _ in latency_trace.events]
    journal = [k for k in kinds if k.startswith("journal:") or k == "durable"]
    assert journal[:4] == ["journal:before-write", "journal:before-sync",
                           "journal:after-sync", "durable"]
    steps = [k for k in kinds if k.startswith("checkpoint:")]
    assert steps[:2] == ["checkpoint:begin", "checkpoint:after-swap"]
    assert steps.index("checkpoint:after-index-commit") < steps.index("checkpoint:flushed") \
        < steps.index("checkpoint:freed")


def test_the_trace_records_gc_collections_with_their_generation(tmp_path: Path) -> None:
    trace = LatencyTrace(str(tmp_path / "t"))
    gc.callbacks.append(trace._on_gc)
    try:
        gc.collect(1)
    finally:
        gc.callbacks.remove(trace._on_gc)
    assert [(kind, a) for _, kind, a, _ in trace.events] == [("gc0", 1), ("gc1", 1)]


async def test_the_lag_probe_records_a_loop_kept_busy(tmp_path: Path) -> None:
    trace = LatencyTrace(str(tmp_path / "t"))
    trace.start_lag_probe(asyncio.get_running_loop())
    await asyncio.sleep(0)
    time.sleep(0.01)  # the stimulus: the loop does not run for 10 ms
    deadline = time.monotonic() + 10
    while not any(kind == "lag" for _, kind, _, _ in trace.events):
        assert time.monotonic() < deadline, "no lag recorded"
        await asyncio.sleep(0.001)
    lag_us = next(a for _, kind, a, _ in trace.events if kind == "lag")
    assert lag_us >= 5_000
