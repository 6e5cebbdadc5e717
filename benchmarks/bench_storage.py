"""Storage benchmark: durable appends, reads and journal replay against the disk's limits.

The same as `magnetar bench storage`; see `storage/testing/benchmark.py` for what is measured.

    python benchmarks/bench_storage.py --quick
    python benchmarks/bench_storage.py --dir /data --json bench.json --plot bench.png
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Measure raw fsync rate and sequential bandwidth, then durable appends "
        "(100 B, 1 KB, 64 KB; 1, 16 and 256 in flight; 1 KB x256 also as add_entries runs), "
        "tailing and catch-up reads, and "
        "journal replay, in a temporary directory on the disk of --dir.")
    parser.add_argument("--quick", action="store_true", help="a short run (seconds)")
    parser.add_argument("--dir", default=".", help="run on the disk holding this directory")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    parser.add_argument("--plot", default=None, help="write a PNG chart here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Runnable from a checkout without installing: the repository root holds `storage`.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from magnetar.storage.testing.benchmark import BenchOptions, run_storage_benchmark

    run_storage_benchmark(BenchOptions(directory=args.dir, quick=args.quick,
                                       json_path=args.json, plot_path=args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
