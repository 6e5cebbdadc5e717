"""The storage benchmark's report (see `benchmark` for the theory of operation): the ratios
to the disk's limits, the targets, the JSON document, the table printed on stdout and the
optional chart (matplotlib, the `bench` extra).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from typing import Any

from ._bench_measure import _best_limits
from ._bench_model import (
    ENTRY_SIZES,
    IN_FLIGHT,
    KB,
    MB,
    TARGET_CATCH_UP_ENTRIES_PER_S_MIN,
    TARGET_PIPELINED_APPENDS_PER_S_MIN,
    TARGET_REPLAY_MB_PER_S_MIN,
    TARGET_SYNC_RATIO_MIN,
    AppendCell,
    BenchOptions,
    BenchScale,
    Target,
    _Results,
    _size_name,
)

__all__ = ["render_table", "write_plot"]

# -- ratios, targets, the document -------------------------------------------------------

def _add_ratios(results: _Results, scale: BenchScale) -> None:
    results.limits = limits = _best_limits(results.limit_samples, scale)
    bandwidth = limits.sequential_mb_per_s
    for cell in results.appends:
        cell.vs_fsync = cell.appends_per_s / limits.fsync_append_per_s
        cell.vs_fsync_overwrite = cell.appends_per_s / limits.fsync_overwrite_per_s
        cell.vs_bandwidth = cell.mb_per_s / bandwidth
    for read in results.reads:
        read.vs_bandwidth = read.mb_per_s / bandwidth
    for replay in results.replay:
        replay.vs_bandwidth = replay.mb_per_s / bandwidth


def _targets(results: _Results) -> list[Target]:
    limits = results.limits
    assert limits is not None
    sync = _find_append(results, KB, 1)
    piped = _find_append(results, KB, max(IN_FLIGHT))
    catch_up = next(r for r in results.reads if r.kind == "catch-up" and r.entry_bytes == KB)
    replay = next(r for r in results.replay if r.entry_bytes == KB)
    runs = next((c for c in results.appends if c.runs), None)
    sync_min = TARGET_SYNC_RATIO_MIN * limits.fsync_append_per_s
    targets = [
        Target(f"1 KB, 1 in flight >= {TARGET_SYNC_RATIO_MIN} x raw fsync rate",
               sync.appends_per_s, sync_min, "appends/s", sync.appends_per_s >= sync_min),
        Target(f"1 KB, {max(IN_FLIGHT)} in flight", piped.appends_per_s,
               TARGET_PIPELINED_APPENDS_PER_S_MIN, "appends/s",
               piped.appends_per_s >= TARGET_PIPELINED_APPENDS_PER_S_MIN),
        Target("catch-up reads, 1 KB entries", catch_up.entries_per_s,
               TARGET_CATCH_UP_ENTRIES_PER_S_MIN, "entries/s",
               catch_up.entries_per_s >= TARGET_CATCH_UP_ENTRIES_PER_S_MIN),
        Target("journal replay, 1 KB entries",
               replay.mb_per_s, TARGET_REPLAY_MB_PER_S_MIN, "MB/s",
               replay.mb_per_s >= TARGET_REPLAY_MB_PER_S_MIN),
    ]
    if runs is not None:  # the same bar for the cell that submits as the broker does
        targets.append(Target(f"1 KB, {runs.in_flight} in flight, freed slots as one run",
                              runs.appends_per_s, TARGET_PIPELINED_APPENDS_PER_S_MIN,
                              "appends/s",
                              runs.appends_per_s >= TARGET_PIPELINED_APPENDS_PER_S_MIN))
    return targets


def _find_append(results: _Results, entry_bytes: int, in_flight: int) -> AppendCell:
    return next(c for c in results.appends
                if c.entry_bytes == entry_bytes and c.in_flight == in_flight and not c.one_cpu
                and not c.runs)


def _document(options: BenchOptions, scale: BenchScale, results: _Results,
              load_before: tuple[float, float, float],
              load_after: tuple[float, float, float]) -> dict[str, Any]:
    assert results.limits is not None
    return {
        "benchmark": "storage",
        "parameters": {
            "directory": os.path.abspath(options.directory),
            "scale": dataclasses.asdict(scale),
            "entry_sizes": list(ENTRY_SIZES),
            "in_flight": list(IN_FLIGHT),
            "mb_bytes": MB,
        },
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "load_before": list(load_before),
            "load_after": list(load_after),
        },
        "limits": dataclasses.asdict(results.limits),
        "appends": [dataclasses.asdict(c) for c in results.appends],
        "reads": [dataclasses.asdict(c) for c in results.reads],
        "replay": [dataclasses.asdict(c) for c in results.replay],
        "targets": [dataclasses.asdict(t) for t in _targets(results)],
    }


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None



# -- the table ------------------------------------------------------------------------------

def render_table(document: dict[str, Any]) -> str:
    """The human-readable report of a benchmark document."""
    parts = [_render_header(document), _render_limits(document), _render_appends(document),
             _render_reads(document), _render_replay(document), _render_targets(document)]
    return "\n\n".join(parts)


def _render_header(document: dict[str, Any]) -> str:
    machine = document["machine"]
    load = " ".join(f"{x:.2f}" for x in machine["load_before"])
    load_after = " ".join(f"{x:.2f}" for x in machine["load_after"])
    return (f"Storage benchmark ({document['parameters']['scale']['name']} run) in "
            f"{document['parameters']['directory']}\n"
            f"{machine['nproc']} CPUs, {machine['platform']}, Python {document['python']}, "
            f"commit {(document['git_commit'] or 'unknown')[:12]}\n"
            f"load average before {load}, after {load_after}; MB = 2^20 bytes")


def _render_limits(document: dict[str, Any]) -> str:
    limits = document["limits"]
    rows = [
        ["write(1 KB) + fdatasync, growing file", f"{limits['fsync_append_per_s']:,.0f} /s",
         f"{limits['fsync_append_p50_ms']:.3f}", f"{limits['fsync_append_p99_ms']:.3f}"],
        ["pwrite(1 KB) + fdatasync, preallocated", f"{limits['fsync_overwrite_per_s']:,.0f} /s",
         f"{limits['fsync_overwrite_p50_ms']:.3f}", f"{limits['fsync_overwrite_p99_ms']:.3f}"],
        [f"sequential {limits['sequential_bytes'] // MB} MB, 1 MB writes + 1 fdatasync",
         f"{limits['sequential_mb_per_s']:,.1f} MB/s", "", ""],
    ]
    samples = "; ".join(
        f"{s['when']}: {s['fsync_append_per_s']:,.0f} /s, {s['fsync_overwrite_per_s']:,.0f} /s, "
        f"{s['sequential_mb_per_s']:,.1f} MB/s" for s in limits["samples"])
    return ("Disk limits (the better of two samples, taken at the start and the end)\n"
            + _table(["measure", "rate", "p50 ms", "p99 ms"], rows, "lrrr")
            + f"\n  samples: {samples}")


def _render_appends(document: dict[str, Any]) -> str:
    verdicts = _append_verdicts(document)
    rows = [[_size_name(cell["entry_bytes"]), f"{cell['in_flight']}{_cell_kind(cell)}",
             f"{cell['appends_per_s']:,.0f}", f"{cell['mb_per_s']:,.1f}",
             f"{cell['p50_ms']:.2f}", f"{cell['p99_ms']:.2f}",
             f"{cell['cpu_us_per_append']:.1f}", f"{cell['vs_fsync']:.2f}",
             f"{cell['vs_fsync_overwrite']:.2f}", f"{cell['vs_bandwidth']:.3f}",
             verdicts.get((cell["entry_bytes"], cell["in_flight"], _cell_kind(cell)), "")]
            for cell in document["appends"]]
    headers = ["entry", "in flight", "appends/s", "MB/s", "p50 ms", "p99 ms", "CPU us/add",
               "x fsync", "x fsync prealloc", "x bandwidth", "target"]
    return ("Durable appends (runs: the freed slots resubmitted as one add_entries run, as "
            "the broker\nsubmits a socket read's SENDs; otherwise one add per slot)\n"
            + _table(headers, rows, "lrrrrrrrrrl"))


def _cell_kind(cell: dict[str, Any]) -> str:
    return " (one CPU)" if cell["one_cpu"] else " (runs)" if cell["runs"] else ""


def _append_verdicts(document: dict[str, Any]) -> dict[tuple[int, int, str], str]:
    targets = document["targets"]
    verdicts = {(KB, 1, ""): _verdict(targets[0]),
                (KB, max(IN_FLIGHT), ""): _verdict(targets[1])}
    if len(targets) > 4:
        verdicts[(KB, max(IN_FLIGHT), " (runs)")] = _verdict(targets[4])
    return verdicts


def _render_reads(document: dict[str, Any]) -> str:
    catch_up_verdict = _verdict(document["targets"][2])
    rows = []
    for read in document["reads"]:
        is_target = read["kind"] == "catch-up" and read["entry_bytes"] == KB
        rows.append([read["kind"], _size_name(read["entry_bytes"]),
                     str(read["entries_per_call"]), f"{read['entries_per_s']:,.0f}",
                     f"{read['mb_per_s']:,.1f}", f"{read['vs_bandwidth']:.2f}",
                     catch_up_verdict if is_target else ""])
    headers = ["read", "entry", "per call", "entries/s", "MB/s", "x bandwidth", "target"]
    return "Reads\n" + _table(headers, rows, "llrrrrl")


def _render_replay(document: dict[str, Any]) -> str:
    rows = []
    for replay in document["replay"]:
        passed = replay["mb_per_s"] >= TARGET_REPLAY_MB_PER_S_MIN
        rows.append([_size_name(replay["entry_bytes"]), f"{replay['journal_bytes'] / MB:,.1f}",
                     f"{replay['records']:,}", f"{replay['seconds']:.3f}",
                     f"{replay['mb_per_s']:,.1f}", f"{replay['vs_bandwidth']:.2f}",
                     f"{replay['cpu_seconds']:.3f}", f"{replay['flushed_seconds']:.3f}",
                     "PASS" if passed else "MISS"])
    headers = ["entry", "journal MB", "records", "open s", "MB/s", "x bandwidth", "CPU s",
               "flushed s", "target"]
    return ("Journal replay (Storage.open after a kill with an un-checkpointed journal; "
            "flushed: until\nthe replayed entries are in entry logs and the index too)\n"
            + _table(headers, rows, "lrrrrrrrl"))


def _render_targets(document: dict[str, Any]) -> str:
    rows = [[t["name"], f"{t['measured']:,.1f} {t['unit']}", f">= {t['required']:,.1f}",
             _verdict(t)] for t in document["targets"]]
    return "Targets\n" + _table(["target", "measured", "required", "verdict"], rows, "lrrl")


def _verdict(target: dict[str, Any]) -> str:
    return "PASS" if target["passed"] else "MISS"


def _table(headers: list[str], rows: list[list[str]], align: str) -> str:
    assert len(align) == len(headers)
    assert all(len(row) == len(headers) for row in rows)
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        padded = [c.ljust(w) if a == "l" else c.rjust(w)
                  for c, w, a in zip(cells, widths, align, strict=True)]
        return ("  " + "  ".join(padded)).rstrip()

    rule = "  " + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(row) for row in rows])


# -- the chart -------------------------------------------------------------------------------

def write_plot(document: dict[str, Any], path: str) -> None:
    """A PNG with appends/s per cell against the raw fsync rate, and MB/s of appends,
    reads and replay against the sequential bandwidth."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 6.5), dpi=100)
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.25]})
    _plot_appends(left, document)
    _plot_bandwidth(right, document)
    figure.suptitle(f"Magnetar storage benchmark ({document['parameters']['scale']['name']} "
                    f"run, {document['machine']['nproc']} CPUs)")
    figure.tight_layout()
    figure.savefig(path, format="png")


def _plot_appends(axes: Any, document: dict[str, Any]) -> None:
    width = 0.8 / len(IN_FLIGHT)
    for slot, in_flight in enumerate(IN_FLIGHT):
        cells = [c for c in document["appends"]
                 if c["in_flight"] == in_flight and not c["one_cpu"] and not c["runs"]]
        positions = [ENTRY_SIZES.index(c["entry_bytes"]) + (slot - 1) * width for c in cells]
        axes.bar(positions, [c["appends_per_s"] for c in cells], width,
                 label=f"{in_flight} in flight")
    for cell in document["appends"]:
        if cell["one_cpu"]:
            axes.plot([ENTRY_SIZES.index(cell["entry_bytes"]) - width], [cell["appends_per_s"]],
                      marker="*", markersize=12, color="tab:red", linestyle="none",
                      label=f"{cell['in_flight']} in flight, one CPU")
        if cell["runs"]:
            axes.plot([ENTRY_SIZES.index(cell["entry_bytes"]) + width],
                      [cell["appends_per_s"]], marker="D", markersize=8, color="tab:green",
                      linestyle="none", label=f"{cell['in_flight']} in flight, runs")
    limits = document["limits"]
    axes.axhline(limits["fsync_append_per_s"], color="black", linestyle="--",
                 label="raw fsync/s (growing file)")
    axes.axhline(limits["fsync_overwrite_per_s"], color="grey", linestyle=":",
                 label="raw fsync/s (preallocated)")
    axes.axhline(TARGET_PIPELINED_APPENDS_PER_S_MIN, color="red", linestyle="-.",
                 label="target, 1 KB x 256")
    axes.set_yscale("log")
    axes.set_xticks(range(len(ENTRY_SIZES)), [_size_name(s) for s in ENTRY_SIZES])
    axes.set_xlabel("entry size")
    axes.set_ylabel("durable appends/s (log)")
    axes.set_title("Durable appends")
    axes.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)


def _plot_bandwidth(axes: Any, document: dict[str, Any]) -> None:
    bars: list[tuple[str, float, str]] = []  # label, MB/s, colour
    bars += [(f"append {_size_name(c['entry_bytes'])} x{c['in_flight']}", c["mb_per_s"],
              "tab:blue") for c in document["appends"]
             if c["in_flight"] == max(IN_FLIGHT) and not c["runs"]]
    bars += [(f"{r['kind']} {_size_name(r['entry_bytes'])}", r["mb_per_s"], "tab:green")
             for r in document["reads"]]
    bars += [(f"replay {_size_name(r['entry_bytes'])}", r["mb_per_s"], "tab:purple")
             for r in document["replay"]]
    positions = range(len(bars))
    axes.barh(positions, [mb for _, mb, _ in bars], color=[colour for _, _, colour in bars])
    axes.axvline(document["limits"]["sequential_mb_per_s"], color="black", linestyle="--",
                 label="sequential write bandwidth")
    axes.axvline(TARGET_REPLAY_MB_PER_S_MIN, color="tab:purple", linestyle="-.",
                 label="replay target")
    axes.set_xscale("log")
    axes.set_yticks(positions, [label for label, _, _ in bars], fontsize="small")
    axes.invert_yaxis()
    axes.set_xlabel("MB/s (log)")
    axes.set_title("Appends, reads and replay against the disk's bandwidth")
    axes.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
