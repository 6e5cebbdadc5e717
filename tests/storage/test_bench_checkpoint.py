"""The checkpoint-cost benchmark (`benchmarks/bench_checkpoint.py`) at a tiny scale: it runs
real checkpoints beside its probe thread and reports every figure. No timing thresholds."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from .._scripts import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_checkpoint.py"


def test_a_quick_run_reports_the_checkpoints_cost(tmp_path: Path) -> None:
    bench = load_script(BENCH, "bench_checkpoint")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert bench.main(["--quick", "--dir", str(tmp_path)]) == 0
    (line,) = [line for line in printed.getvalue().splitlines() if "this:" in line]
    found = re.search(r"CPU ([\d.]+) ms, wall ([\d.]+) ms; GC during it ([\d.]+) collections "
                      r"\(([\d.]+) ms\); probe waits p50 (\d+) p99 (\d+) max (\d+) us", line)
    assert found is not None, line
    cpu, wall = float(found.group(1)), float(found.group(2))
    assert cpu > 0
    assert wall > 0
    assert list(tmp_path.iterdir()) == [], "its data directories are removed"
