"""The end-to-end benchmark (`benchmarks/bench_e2e.py`) at its tiny scale: a real broker
subprocess and the official client; every cell is measured and reported in the table, the
JSON and the PNG. No timing thresholds: the figures only have to be there and be positive."""

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

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench_e2e.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TinyRun = tuple[ModuleType, dict[str, Any], Path, str]


def _load_bench() -> ModuleType:
    return load_script(BENCH, "bench_e2e")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """One tiny run shared by the tests of this module: (the benchmark module, the returned
    document, the output directory, what it printed)."""
    bench = _load_bench()
    out = tmp_path_factory.mktemp("bench-e2e")
    options = bench.BenchOptions(directory=str(out / "disk"), json_path=str(out / "e2e.json"),
                                 plot_path=str(out / "e2e.png"), progress=False,
                                 scale=bench.TINY, rounds=2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        document = bench.run_e2e_benchmark(options)
    return bench, document, out, printed.getvalue()


def _positive(record: dict[str, Any], *names: str) -> None:
    for name in names:
        assert record[name] > 0, f"{name} is {record[name]} in {record}"


def test_json_is_the_returned_document(tiny_run: TinyRun) -> None:
    _, document, out, _ = tiny_run
    assert json.loads((out / "e2e.json").read_text(encoding="utf-8")) == document
    assert document["benchmark"] == "e2e"
    assert document["parameters"]["scale"]["name"] == "tiny"
    assert document["python"] == sys.version.split()[0]
    assert document["machine"]["nproc"] >= 1
    assert len(document["machine"]["load_before"]) == 3
    assert "git_commit" in document


def test_limits_are_measured(tiny_run: TinyRun) -> None:
    _, document, _, _ = tiny_run
    limits = document["limits"]
    _positive(limits, "fsync_append_per_s", "fsync_overwrite_per_s", "sequential_mb_per_s")
    assert [s["when"] for s in limits["samples"]] == ["start", "end"]


def test_every_cell_has_positive_figures(tiny_run: TinyRun) -> None:
    bench, document, _, _ = tiny_run
    cells = {(c["message_bytes"], c["batching"]): c for c in document["cells"]}
    assert set(cells) == {(size, b) for size in bench.MESSAGE_SIZES for b in bench.BATCHING}
    assert len(document["cells"]) == len(cells)
    for cell in cells.values():
        _positive(cell, "published", "publish_seconds", "publish_per_s", "publish_mb_per_s",
                  "latency_rate_per_s", "latency_messages", "latency_p50_ms",
                  "latency_p99_ms", "latency_max_ms", "consumed", "consume_seconds",
                  "consume_per_s", "consume_mb_per_s", "publish_vs_fsync",
                  "publish_vs_bandwidth", "consume_vs_bandwidth")
        assert cell["latency_p50_ms"] <= cell["latency_p99_ms"] <= cell["latency_max_ms"]
        assert cell["consumed"] == min(bench.TINY.consume_messages, cell["published"])


def test_the_png_is_a_png(tiny_run: TinyRun) -> None:
    _, _, out, _ = tiny_run
    data = (out / "e2e.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert data[12:16] == b"IHDR"
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    assert width > 0
    assert height > 0


def test_the_table_shows_every_cell(tiny_run: TinyRun) -> None:
    bench, document, out, printed = tiny_run
    assert printed.strip() == bench.render_table(document).strip()
    assert "Disk limits" in printed
    assert "Official client through the broker" in printed
    for size in ("1 KB", "100 B"):
        assert printed.count(f"  {size} ") == 2  # batching off and on
    assert not list((out / "disk").iterdir()), "the scratch directory was left behind"


def test_side_by_side_measures_both_brokers(tiny_run: TinyRun) -> None:
    """Magnetar and pulsar-lite (the peer's own binary, started by the run) each did every
    workload; a peer workload that stalled is flagged, never silently dropped."""
    _, document, _, printed = tiny_run
    peers = sys.modules["e2e_peers"]
    runs = {(w["broker"], w["name"]): w for w in document["side_by_side"]}
    assert set(runs) == {(b, n) for b in peers.BROKERS for n in peers.WORKLOADS}
    for (broker, _), run in runs.items():
        if broker == "magnetar" or not run["stalled"]:
            assert not run["stalled"], run
            _positive(run, "messages", "seconds", "per_s", "client_cpu_s", "wall_s")
    # The broker's CPU is read from /proc: Magnetar's (Python) can't do a workload for free.
    _positive(runs[("magnetar", "unbatched publish")], "broker_cpu_s")
    assert "Side by side with pulsar-lite" in printed
    assert "CPU us/msg" in printed
    for name in peers.WORKLOADS:
        assert f"  {name} " in printed


def test_side_by_side_rounds_are_kept_and_the_table_shows_their_medians(
        tiny_run: TinyRun) -> None:
    """With two rounds, each broker did every workload in each; the side-by-side records are
    each broker's median round (the lower rate of two), whole; every round is printed."""
    _, document, _, printed = tiny_run
    peers = sys.modules["e2e_peers"]
    rounds = document["side_by_side_rounds"]
    assert document["parameters"]["side_by_side_rounds"] == len(rounds) == 2
    expected = {(b, n) for b in peers.BROKERS for n in peers.WORKLOADS}
    for workloads in rounds:
        assert {(w["broker"], w["name"]) for w in workloads} == expected
    for median in document["side_by_side"]:
        runs = [w for workloads in rounds for w in workloads
                if (w["broker"], w["name"]) == (median["broker"], median["name"])]
        assert median in runs
        if median["name"] == peers.LATENCY:
            assert median["p99_ms"] == max(w["p99_ms"] for w in runs)
        else:
            assert median["per_s"] == min(w["per_s"] for w in runs)
    assert "each of the 2 rounds" in printed
    magnetar = [line.split() for line in printed.splitlines()
                if line.startswith("    Magnetar ")]
    for row in peers.rounds_rows(document):
        shown = [f"{x:.2f}" if row["figure"] == "p99_ms" else f"{x:,.0f}"
                 for x in row["magnetar"]]
        assert ["Magnetar", *shown] in magnetar


def _workload(peers: ModuleType, broker: str, name: str, per_s: float,
              p99_ms: float = 0.0) -> Any:
    workload = peers.Workload(broker, name)
    workload.per_s, workload.p99_ms = per_s, p99_ms
    return workload


def test_the_median_round_is_taken_whole_and_never_the_better_middle() -> None:
    """Rates: the median of an odd count, the lower middle of an even one; latency: the
    median p99, the higher middle of an even count. The record is the round's own."""
    _load_bench()
    peers = sys.modules["e2e_peers"]
    name = "unbatched publish"
    rates = [[_workload(peers, "magnetar", name, rate),
              _workload(peers, "magnetar", peers.LATENCY, 0.0, p99)]
             for rate, p99 in ((50.0, 3.0), (30.0, 9.0), (40.0, 1.0), (60.0, 2.0))]
    medians = peers.median_rounds(rates)
    assert medians[0] is rates[2][0]  # of 30, 40, 50, 60: the lower middle, 40
    assert medians[1] is rates[0][1]  # p99 of 1, 2, 3, 9: the higher middle, 3
    three = peers.median_rounds(rates[:3])
    assert (three[0].per_s, three[1].p99_ms) == (40.0, 3.0)
    assert peers.median_rounds(rates[:1]) == rates[0]


def test_many_topics_are_measured(tiny_run: TinyRun) -> None:
    """The many-topics workloads ran on their own broker: every topic created, a step row
    at least every quarter, the RSS read, the restart served the first topic again; the
    table shows the rows and the target checks."""
    bench, document, _, printed = tiny_run
    many = document["many_topics"]
    _positive(many, "many_producers_messages", "many_producers_per_s", "single_topic_per_s",
              "creation_seconds", "creation_per_s", "rss_peak_mb", "first_serve_seconds",
              "rss_after_restart_mb")
    assert many["topics"] == bench.TINY.many_topics
    steps = many["steps"]
    assert len(steps) >= 4
    assert steps[-1]["topics"] == bench.TINY.many_topics
    for step in steps:
        _positive(step, "topics", "seconds", "step_per_s", "rss_mb", "rss_allowed_mb",
                  "rss_anon_mb")
    assert "Many topics" in printed
    assert "restart serves the first topic" in printed
