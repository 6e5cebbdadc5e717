"""The storage benchmark, run at its tiny scale: every cell is measured and reported in the
table, the JSON and the PNG. No timing thresholds: the figures only have to be there and
be positive."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from magnetar.storage.testing.benchmark import (
    ENTRY_SIZES,
    IN_FLIGHT,
    READ_KINDS,
    READ_SIZES,
    REPLAY_SIZES,
    TINY_SCALE,
    BenchOptions,
    run_storage_benchmark,
)

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """One tiny run shared by the tests of this module: (returned document, its output
    directory, what it printed)."""
    out = tmp_path_factory.mktemp("bench")
    (out / "affinity-before").write_text(repr(sorted(_affinity())), encoding="utf-8")
    options = BenchOptions(directory=str(out / "disk"), json_path=str(out / "bench.json"),
                           plot_path=str(out / "bench.png"), progress=False,
                           scale=TINY_SCALE)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        document = run_storage_benchmark(options)
    return document, out, printed.getvalue()


def _positive(record: dict[str, Any], *names: str) -> None:
    for name in names:
        assert record[name] > 0, f"{name} is {record[name]} in {record}"


def test_json_is_the_returned_document(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    document, out, _ = tiny_run
    assert json.loads((out / "bench.json").read_text(encoding="utf-8")) == document
    assert document["parameters"]["scale"]["name"] == "tiny"
    assert document["python"] == sys.version.split()[0]
    assert document["machine"]["nproc"] == os.cpu_count()
    assert len(document["machine"]["load_before"]) == 3


def test_limits_are_measured(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    limits = tiny_run[0]["limits"]
    _positive(limits, "fsync_append_per_s", "fsync_append_p50_ms", "fsync_append_p99_ms",
              "fsync_overwrite_per_s", "fsync_overwrite_p50_ms", "sequential_mb_per_s")
    assert limits["fsync_append_p50_ms"] <= limits["fsync_append_p99_ms"]
    samples = limits["samples"]
    assert [s["when"] for s in samples] == ["start", "end"]
    for measure in ("fsync_append_per_s", "fsync_overwrite_per_s", "sequential_mb_per_s"):
        assert limits[measure] == max(s[measure] for s in samples)


def test_every_append_cell_is_measured(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    appends = tiny_run[0]["appends"]
    cells = [(c["entry_bytes"], c["in_flight"], c["one_cpu"], c["runs"]) for c in appends]
    one_cpu = [(1024, 1, True, False)] if hasattr(os, "sched_setaffinity") else []
    runs = [(1024, max(IN_FLIGHT), False, True)]
    assert cells == [(size, n, False, False) for size in ENTRY_SIZES
                     for n in IN_FLIGHT] + runs + one_cpu
    for cell in appends:
        _positive(cell, "appends", "seconds", "appends_per_s", "mb_per_s", "p50_ms", "p99_ms",
                  "cpu_us_per_append", "vs_fsync", "vs_fsync_overwrite", "vs_bandwidth")
        assert cell["p50_ms"] <= cell["p99_ms"]
        assert cell["appends"] >= TINY_SCALE.cell_ops_min


def test_every_read_cell_is_measured(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    reads = tiny_run[0]["reads"]
    cells = [(r["entry_bytes"], r["kind"]) for r in reads]
    assert cells == [(size, kind) for size in READ_SIZES for kind in READ_KINDS]
    for read in reads:
        _positive(read, "entries_per_call", "entries", "seconds", "entries_per_s", "mb_per_s",
                  "vs_bandwidth")


def test_every_replay_cell_is_measured(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    replay = tiny_run[0]["replay"]
    assert [r["entry_bytes"] for r in replay] == list(REPLAY_SIZES)
    for cell in replay:
        _positive(cell, "journal_bytes", "records", "seconds", "mb_per_s", "vs_bandwidth",
                  "cpu_seconds", "flushed_seconds")
        # Every entry's record was replayed: at least the entry data came back.
        assert cell["journal_bytes"] >= TINY_SCALE.replay_bytes


def test_targets_have_verdicts(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    targets = tiny_run[0]["targets"]
    assert len(targets) == 5  # the 256-in-flight bar twice: single adds, and runs
    for target in targets:
        _positive(target, "measured", "required")
        assert target["passed"] == (target["measured"] >= target["required"])


def test_table_is_printed(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    document, _, printed = tiny_run
    for heading in ("Disk limits", "Durable appends", "Reads", "Journal replay", "Targets"):
        assert heading in printed
    verdicts = [line for line in printed.splitlines()
                if line.rstrip().endswith(("PASS", "MISS"))]
    # Each target in the targets section, and marked once more in its own section.
    assert len(verdicts) >= 2 * len(document["targets"])


def test_png_is_valid(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    raw = (tiny_run[1] / "bench.png").read_bytes()
    assert raw.startswith(PNG_SIGNATURE)
    chunks = list(_png_chunks(raw))
    assert chunks[0][0] == b"IHDR"
    assert chunks[-1][0] == b"IEND"
    width, height = struct.unpack(">II", chunks[0][1][:8])
    assert width > 0
    assert height > 0
    pixels = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    assert len(pixels) > width * height  # one filter byte per row, several bytes a pixel


def _png_chunks(raw: bytes) -> list[tuple[bytes, bytes]]:
    """(type, body) of each chunk; asserts every chunk's CRC."""
    chunks = []
    at = len(PNG_SIGNATURE)
    while at < len(raw):
        (length,) = struct.unpack_from(">I", raw, at)
        kind = raw[at + 4:at + 8]
        body = raw[at + 8:at + 8 + length]
        (crc,) = struct.unpack_from(">I", raw, at + 8 + length)
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r} chunk"
        chunks.append((kind, body))
        at += 12 + length
    return chunks


def _affinity() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


def test_cpu_affinity_is_restored(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    before = (tiny_run[1] / "affinity-before").read_text(encoding="utf-8")
    assert repr(sorted(_affinity())) == before


def test_scratch_directory_is_removed(tiny_run: tuple[dict[str, Any], Path, str]) -> None:
    assert os.listdir(tiny_run[1] / "disk") == []


def test_script_accepts_the_cli_options() -> None:
    script = REPO / "benchmarks" / "bench_storage.py"
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=60, check=True)
    for option in ("--quick", "--dir", "--json", "--plot"):
        assert option in done.stdout


def test_tombstone_benchmark_quick_run_reports_a_table_without_tombstones(
        tmp_path: Path) -> None:
    script = REPO / "benchmarks" / "bench_tombstones.py"
    done = subprocess.run([sys.executable, str(script), "--quick", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "200 ledgers created and deleted" in done.stdout
    # The 200 deleted ledgers are purged; the first open left one open ledger behind.
    assert "ledger table 1, LMDB ledger records 1; last id 200, next create got 202" in \
        done.stdout, done.stdout
    assert os.listdir(tmp_path) == []
