"""The client benchmark (`benchmarks/bench_client.py`) at its tiny scale: every system runs
for real (the embedded broker, a broker subprocess with our client and the official one,
persist-queue) and every cell is reported in the table, the JSON and the PNG. No timing
thresholds: the figures only have to be there and be positive."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .._scripts import load_script

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench_client.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TinyRun = tuple[ModuleType, dict[str, Any], Path, str]


def _load_bench() -> ModuleType:
    return load_script(BENCH, "bench_client")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    bench = _load_bench()
    out = tmp_path_factory.mktemp("bench-client")
    options = bench.BenchOptions(directory=str(out / "disk"), json_path=str(out / "c.json"),
                                 plot_path=str(out / "c.png"), progress=False,
                                 scale=bench.TINY)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        document = bench.run_client_benchmark(options)
    return bench, document, out, printed.getvalue()


def test_json_is_the_returned_document(tiny_run: TinyRun) -> None:
    _, document, out, _ = tiny_run
    assert json.loads((out / "c.json").read_text(encoding="utf-8")) == document
    assert document["benchmark"] == "client"
    assert document["parameters"]["scale"]["name"] == "tiny"
    assert document["parameters"]["message_bytes"] == 1024
    assert "synchronous=2" in document["parameters"]["persist_queue"]  # SQLite FULL: durable
    assert document["limits"]["fsync_append_per_s"] > 0


def test_every_cell_has_positive_figures(tiny_run: TinyRun) -> None:
    bench, document, _, _ = tiny_run
    keys = {(c["system"], c["workload"], c["in_flight"], c["batching"])
            for c in document["cells"]}
    expected = {(s, w, f, b) for s in bench.CLIENT_SYSTEMS for w in bench.WORKLOADS
                for f in bench.IN_FLIGHT for b in bench.BATCHING}
    expected |= {(s, w, 1, None) for s in bench.QUEUE_SYSTEMS for w in bench.WORKLOADS}
    assert keys == expected
    assert len(document["cells"]) == len(expected)
    for cell in document["cells"]:
        for name in ("messages", "seconds", "per_s", "mb_per_s", "vs_fsync"):
            assert cell[name] > 0, f"{name} is {cell[name]} in {cell}"


def test_targets_are_evaluated(tiny_run: TinyRun) -> None:
    _, document, _, _ = tiny_run
    names = [t["target"] for t in document["targets"]]
    assert len(names) == 2 + 1 + 8  # vs persist-queue x2, embedded rate, tcp/official x8
    for target in document["targets"]:
        assert target["value"] > 0
        assert target["met"] == (target["value"] >= target["goal"])


def test_the_png_and_the_table(tiny_run: TinyRun) -> None:
    bench, document, out, printed = tiny_run
    data = (out / "c.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert printed.strip() == bench.render_table(document).strip()
    for system in (*bench.CLIENT_SYSTEMS, *bench.QUEUE_SYSTEMS):
        assert f"  {system} " in printed
    assert not list((out / "disk").iterdir()), "the scratch directory was left behind"


def test_cell_options_name_a_bad_value(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load_bench()
    for option in ("--workloads", "--in-flight", "--batching"):
        assert bench.main([option, "nope"]) == 2
        error = capsys.readouterr().err
        assert option in error
        assert "'nope'" in error
        assert "Traceback" not in error
    assert bench._subset("256", {"1": 1, "256": 256}, "--in-flight") == (256,)
    assert bench._subset("on,off", {"off": False, "on": True}, "--batching") == (True, False)
