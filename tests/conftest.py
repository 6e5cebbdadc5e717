"""Shared pytest configuration: seeds for simulation tests."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed",
        action="store",
        type=int,
        default=None,
        help="seed for the seeded simulation tests (default: a fixed seed per test)",
    )


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """The simulation seed: --seed when given, else a fixed per-test default. Printed so a
    failing run can be reproduced."""
    given = request.config.getoption("--seed")
    value = int(given) if given is not None else 20261122
    print(f"seed={value}")
    return value


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`, `--dist loadgroup`) each test file runs whole on one
    worker, in its order, as in a serial run (module-scoped brokers see the file's earlier
    tests); every Spark test goes to one worker, which starts the one SparkSession (a JVM) they
    share, instead of one per worker."""
    for item in items:
        spark = item.get_closest_marker("spark") is not None
        group = "spark" if spark else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
