"""The Spark benchmark (`benchmarks/bench_spark.py`) at a tiny scale on the shared session:
every row is measured for real and reported in the table and the JSON document. No timing
thresholds: the figures only have to be there and be positive."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from .._scripts import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_spark.py"


def _load_bench() -> ModuleType:
    return load_script(BENCH, "bench_spark")


def test_bench_spark_tiny_run(spark: Any, data_dir: str) -> None:
    bench = _load_bench()
    document = bench.run(spark, data_dir, messages=3000, warm=0, repeat=1)
    systems = [row["system"] for row in document["rows"]]
    assert systems == ["client publish", "client read", "source read, no Spark",
                       "spark read", "spark read, again", "spark, no source (floor)",
                       "spark write"]
    assert all(row["per_s"] > 0 and row["messages"] == 3000 for row in document["rows"])
    assert all(row["cpu_s"] > 0 for row in document["rows"])
    assert [t["target"] for t in document["targets"]][:2] == [
        "spark read rows/s (best)", "spark write / client publish"]
    table = bench.render_table(json.loads(json.dumps(document)))
    for system in systems:
        assert system in table
