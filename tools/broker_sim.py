"""Run the seeded broker simulation (`broker/testing/_simulation.py`) from the command line.

It prints `sim: seed S` first and a summary last, and exits with 1 when the broker broke an
invariant (each violation names the seed, step, topic, subscription and message id), so a
failure is replayed with the same `--seed`:

    python tools/broker_sim.py --seed 7 --steps 2000
    python tools/broker_sim.py --steps 20000 --threads --verbose
    python tools/broker_sim.py --seed 7 --steps 400 --trace 2> trace.txt
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Drive the broker service with random producers, consumers, acks, "
        "negative acks and restarts (clean, kill -9, power loss), checking its invariants.")
    parser.add_argument("--seed", type=int, default=None,
                        help="the seed (default: a random one, printed)")
    parser.add_argument("--steps", type=int, default=1000, help="operations to run")
    parser.add_argument("--topics", type=int, default=3, help="topics (at least 2)")
    parser.add_argument("--drain-every", type=int, default=75,
                        help="drain every subscription every this many steps")
    parser.add_argument("--threads", action="store_true",
                        help="run the storage's own threads instead of pumping its journal "
                        "from the event loop (not replayable step for step)")
    parser.add_argument("--dir", default=None,
                        help="keep the data here (default: a temporary directory)")
    parser.add_argument("--verbose", action="store_true",
                        help="a line after each drain and restart; broker warnings")
    parser.add_argument("--trace", action="store_true",
                        help="log every operation and delivery to stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.topics < 2 or args.steps < 0 or args.drain_every < 1:
        parser.error("--topics must be at least 2, --steps at least 0, --drain-every at least 1")
    # Runnable from a checkout without installing: the repository root holds `broker`.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from magnetar.broker.testing._simulation import SimulationConfig, run_simulation

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    print(f"sim: seed {seed}", flush=True)
    level = logging.DEBUG if args.trace else logging.WARNING if args.verbose else \
        logging.CRITICAL
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(message)s")
    if args.trace:
        for noisy in ("magnetar.storage", "magnetar.broker.ledger._managed_ledger",
                      "magnetar.broker.topics._service", "magnetar.broker.topics._topic",
                      "magnetar.broker.ledger._cursor", "asyncio"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    config = SimulationConfig(
        seed=seed, steps=args.steps, topics=args.topics, data_dir=args.dir,
        storage_threads=args.threads, drain_every_steps=args.drain_every,
        progress=(lambda line: print(line, flush=True)) if args.verbose else None)
    report = run_simulation(config)
    print(report.summary(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
