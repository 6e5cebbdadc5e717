"""The broker benchmark (`benchmarks/bench_broker.py`) at its tiny scale: every cell is
measured and reported, in the table and in the JSON. No timing thresholds: the figures only
have to be there and be positive."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .._scripts import load_script

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench_broker.py"


def _load_bench() -> ModuleType:
    return load_script(BENCH, "bench_broker")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, dict[str, Any],
                                                                 Path, str]:
    """One tiny run shared by the tests of this module: (the benchmark module, the returned
    document, the JSON path, what it printed)."""
    bench = _load_bench()
    out = tmp_path_factory.mktemp("bench-broker")
    options = bench.BenchOptions(directory=str(out / "disk"), json_path=str(out / "bench.json"),
                                 progress=False, scale=bench.TINY)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        document = bench.run_broker_benchmark(options)
    return bench, document, out / "bench.json", printed.getvalue()


def _positive(record: dict[str, Any], *names: str) -> None:
    for name in names:
        assert record[name] > 0, f"{name} is {record[name]} in {record}"


def test_json_is_the_returned_document(tiny_run: tuple[ModuleType, dict[str, Any], Path,
                                                       str]) -> None:
    _, document, json_path, _ = tiny_run
    assert json.loads(json_path.read_text(encoding="utf-8")) == document
    assert document["benchmark"] == "broker"
    assert document["parameters"]["scale"]["name"] == "tiny"
    assert document["parameters"]["message_bytes"] == 1024
    assert document["python"] == sys.version.split()[0]
    assert "git_commit" in document


def test_limits_are_measured(tiny_run: tuple[ModuleType, dict[str, Any], Path, str]) -> None:
    _, document, _, _ = tiny_run
    limits = document["limits"]
    _positive(limits, "fsync_append_per_s", "fsync_overwrite_per_s", "sequential_mb_per_s")
    assert [s["when"] for s in limits["samples"]] == ["start", "end"]


def test_every_publish_cell_is_there(tiny_run: tuple[ModuleType, dict[str, Any], Path,
                                                     str]) -> None:
    bench, document, _, _ = tiny_run
    cells = {(c["batching"], c["in_flight"]): c for c in document["publish"]}
    assert set(cells) == {(b, n) for b in (False, True) for n in bench.PUBLISH_IN_FLIGHT}
    for (batching, _), cell in cells.items():
        _positive(cell, "messages", "entries", "seconds", "messages_per_s", "entries_per_s",
                  "mb_per_s", "p50_ms", "p99_ms", "vs_fsync", "vs_bandwidth")
        per_entry = bench.BATCH_MESSAGES if batching else 1
        assert cell["messages"] == cell["entries"] * per_entry


def test_every_dispatch_cell_is_there(tiny_run: tuple[ModuleType, dict[str, Any], Path,
                                                      str]) -> None:
    bench, document, _, _ = tiny_run
    cells = {(c["batching"], c["sub_type"]): c for c in document["dispatch"]}
    assert set(cells) == {(b, t) for b in (False, True) for t in bench.SUB_TYPES}
    scale = bench.TINY
    for (batching, sub_type), cell in cells.items():
        _positive(cell, "messages", "entries", "acks", "seconds", "messages_per_s",
                  "entries_per_s", "mb_per_s", "vs_fsync", "vs_bandwidth")
        expected = scale.dispatch_batched_messages if batching else scale.dispatch_messages
        assert cell["messages"] == expected
        assert cell["consumers"] == (1 if sub_type == "Exclusive" else 2)


def test_the_table_shows_every_cell(tiny_run: tuple[ModuleType, dict[str, Any], Path,
                                                    str]) -> None:
    bench, document, _, printed = tiny_run
    assert printed.strip() == bench.render_table(document).strip()
    for heading in ("Disk limits", "Durable publish", "Dispatch + durable ack"):
        assert heading in printed
    for sub_type in bench.SUB_TYPES:
        assert printed.count(f"  {sub_type} ") == 2  # batching off and on
