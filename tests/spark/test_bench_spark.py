"""The Spark benchmark (`benchmarks/bench_spark.py`) at a tiny scale on the shared session:
every row is measured for real and reported in the table and the JSON document. No timing
thresholds: the figures only have to be there and be positive."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_spark.py"


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_spark", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_spark_tiny_run(spark: Any, data_dir: str) -> None:
    bench = _load_bench()
    document = bench.run(spark, data_dir, messages=3000, warm=0)
    systems = [row["system"] for row in document["rows"]]
    assert systems == ["client publish", "client read", "source read, no Spark",
                       "spark read", "spark read, again", "spark write"]
    assert all(row["per_s"] > 0 and row["messages"] == 3000 for row in document["rows"])
    assert [t["target"] for t in document["targets"]][:2] == [
        "spark read rows/s (best of the two)", "spark write / client publish"]
    table = bench.render_table(json.loads(json.dumps(document)))
    for system in systems:
        assert system in table
