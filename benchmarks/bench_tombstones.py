"""Deleted-ledger tombstones: `Storage.open` time and ledger-table size after N create+delete
cycles (a broker that loads and closes N topics leaves N deleted ledgers behind).

    python benchmarks/bench_tombstones.py --quick
    python benchmarks/bench_tombstones.py --ledgers 10000 --dir /data

Each round creates 1,000 ledgers (all in flight together), deletes them in one batch and
checkpoints; then the directory is reopened `--opens` times. Printed: the median and
fastest open, the ledgers in the in-memory table and the ledger records in LMDB after
the last open (tombstones included; each open also creates one ledger and leaves it open),
the last id used and the id the next create got (never lower), and the index's size on
disk. Run it with `nice` on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

_ROUND_LEDGERS = 1000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Storage.open time and ledger-table size after N ledger create+delete "
        "cycles.")
    parser.add_argument("--ledgers", type=int, default=10_000,
                        help="ledgers created and deleted (default 10000)")
    parser.add_argument("--opens", type=int, default=5, help="reopens timed (default 5)")
    parser.add_argument("--quick", action="store_true", help="200 ledgers, 2 opens")
    parser.add_argument("--dir", default=None, help="scratch directory's parent (default: tmp)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Runnable from a checkout without installing: the repository root holds `storage`.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from magnetar.storage import Storage, StorageConfig

    ledgers, opens = (200, 2) if args.quick else (args.ledgers, args.opens)
    if ledgers < 1 or opens < 1:
        print("bench_tombstones: --ledgers and --opens must be at least 1", file=sys.stderr)
        return 2
    config = StorageConfig(lmdb_map_bytes=1 << 30)
    root = tempfile.mkdtemp(prefix="bench-tombstones-", dir=args.dir)
    try:
        store = Storage.open(root, config)
        last_id = 0
        for start in range(0, ledgers, _ROUND_LEDGERS):
            count = min(_ROUND_LEDGERS, ledgers - start)
            ids = [c.result(60) for c in [store.create_ledger({"topic": f"t{start + i}"})
                                          for i in range(count)]]
            for completion in store.delete_ledgers(ids):
                completion.result(60)
            store.checkpoint()
            last_id = ids[-1]
        store.close()
        seconds = []
        for _ in range(opens):
            started = time.perf_counter()
            store = Storage.open(root, config)
            seconds.append(time.perf_counter() - started)
            table, records = len(store.ledgers), len(store.index.load_ledgers())
            next_id = store.create_ledger().result(60)
            store.close()
        index_dir = os.path.join(root, "index")
        index_bytes = sum(os.path.getsize(os.path.join(index_dir, name))
                          for name in os.listdir(index_dir))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{ledgers} ledgers created and deleted; Storage.open median "
          f"{statistics.median(seconds) * 1000:.1f} ms (fastest {min(seconds) * 1000:.1f} ms) "
          f"over {opens}; ledger table {table}, LMDB ledger records {records}; last id "
          f"{last_id}, next create got {next_id}; index {index_bytes} bytes")
    return 0 if next_id > last_id else 1


if __name__ == "__main__":
    sys.exit(main())
