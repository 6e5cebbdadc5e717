"""Spark's `magnetar` data source: topics read and written by Spark jobs (the `spark` extra).

    import magnetar.spark
    magnetar.spark.register(spark)
    df = spark.read.format("magnetar").option("service", "./data").option("topic", "t").load()

Options, columns and semantics: `_source.py` (and the README's Spark section); how a data
directory is shared with Spark's worker processes: `_host.py`.

| module        | what                                                               |
|---------------|--------------------------------------------------------------------|
| `_source.py`  | the DataSource, batch/stream readers and writers                   |
| `_options.py` | options checked; positions and offsets                             |
| `_plan.py`    | options to positions (earliest/latest/JSON/time, read limits)      |
| `_read.py`    | the row schema; one range read as Arrow record batches             |
| `_entries.py` | whole entries of a topic-partition (a non-durable subscription)    |
| `_columns.py` | entries decoded into Arrow columns in bulk                         |
| `_write.py`   | rows published once (producer names and sequence ids)              |
| `_broker.py`  | endpoints, topic-partitions, last ids, ledgers, deduplication      |
| `_host.py`    | the driver's brokers on data directories                           |
"""

from __future__ import annotations

from typing import Any

from ._host import Endpoints, serve, stop_brokers
from ._options import MagnetarSparkError

__all__ = ["Endpoints", "MagnetarSparkError", "data_source", "register", "serve",
           "stop_brokers"]


def data_source(parallelism: int = 1) -> type[Any]:
    """The data source class for this process, carrying its broker host's address (see
    `_host.py`) and the default number of ranges a read is split into; built here so
    cloudpickle ships it, and the address, by value."""
    from ._host import host
    from ._source import MagnetarDataSource

    address = host()

    class RegisteredMagnetarSource(MagnetarDataSource):
        pass

    RegisteredMagnetarSource.host = address
    RegisteredMagnetarSource.parallelism = max(1, parallelism)
    return RegisteredMagnetarSource


def register(spark: Any) -> None:
    """Register the `magnetar` format with a SparkSession (run it in the driver). Data
    directories given as `service` are then served by this process until it exits or
    `stop_brokers()` is called."""
    spark.dataSource.register(data_source(spark.sparkContext.defaultParallelism))
