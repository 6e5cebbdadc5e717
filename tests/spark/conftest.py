"""One SparkSession (local[2], two attempts per task) and one served data directory for all
Spark tests; each test uses topics of its own."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import magnetar
import magnetar.spark

from ._helpers import admin

pytestmark = pytest.mark.spark

_names = itertools.count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With pyspark 4.0 and 4.1 the driver's collects leave unclosed sockets to the garbage
    collector (seen here: one per collect, each to another JVM port; none with 4.3): with
    those versions, and only for these tests, that warning is not an error. Our own sockets
    stay checked with the pyspark the project installs."""
    import pyspark

    if tuple(int(x) for x in pyspark.__version__.split(".")[:2]) >= (4, 2):
        return
    here = os.path.dirname(__file__)
    ignore = pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(ignore)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need this venv's pyarrow
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2,2]").appName("magnetar-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.pythonUDF.arrow.enabled", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    magnetar.spark.register(session)
    try:
        yield session
    finally:
        session.stop()
        magnetar.spark.stop_brokers()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> str:
    return str(tmp_path_factory.mktemp("spark-data"))


@pytest.fixture(scope="session")
def client(spark: Any, data_dir: str) -> Iterator[magnetar.Client]:
    """A client of the broker the driver serves on `data_dir` (the Spark tasks' broker).

    The namespace keeps everything (retention -1/-1): the batch reads here read topics that
    have no subscription, whose closed ledgers only retention keeps (Pulsar's rule). Without
    it the broker's first retention pass, 1 s after it starts, deleted a ledger that a test
    had just rolled (unload) while the session's first, slow, Spark read was planning:
    test_batch_read_splits_by_ledger then read one ledger, in one partition, when it ran
    first."""
    endpoints = magnetar.spark.serve(data_dir)
    assert endpoints.admin_url is not None
    admin(endpoints.admin_url, "POST", "/admin/v2/namespaces/public/default/retention",
          {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    with magnetar.Client(endpoints.service_url) as c:
        yield c


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/spark-{os.getpid()}-{next(_names)}"
