"""The raw-socket SEND benchmark (`benchmarks/bench_send.py`) at a tiny scale: a real broker
subprocess receipts every SEND of both workloads, and each is reported with its rate and the
broker's CPU per message, split by thread. No timing thresholds."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from .._scripts import load_script

pytestmark = pytest.mark.interop

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_send.py"


def test_both_workloads_are_measured_and_reported(tmp_path: Path) -> None:
    bench = load_script(BENCH, "bench_send")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert bench.main(["--quick", "--seconds", "0.3", "--producers", "3",
                           "--dir", str(tmp_path)]) == 0
    lines = [line for line in printed.getvalue().splitlines() if line.startswith("round")]
    assert [line.split()[3] for line in lines] == ["one", "3"]
    for line in lines:
        found = re.search(r"([\d,]+)/s  broker CPU +([\d.]+) us/msg \(main ([\d.]+), "
                          r"others ([\d.]+)\)", line)
        assert found is not None, line
        rate, total, main, others = (float(x.replace(",", "")) for x in found.groups())
        assert rate > 0
        assert total > 0
        assert main + others == pytest.approx(total, abs=0.2)
