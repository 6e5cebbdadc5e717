"""Writes: rows become messages; a task that fails half-way and is retried publishes nothing
twice (deduplication on; the same job with it off shows the retry did republish)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import magnetar

from ._helpers import read_all

pytestmark = pytest.mark.spark

ROWS = 4000


def _fail_once(index: int) -> int:
    """The row's index; the first attempt of partition 0 dies at its row 1000."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0 and \
            context.partitionId() == 0 and index % (ROWS // 2) == 1000:
        raise RuntimeError("simulated task failure")
    return index


def _failing(df: Any, column: str) -> Any:
    """`df` through a UDF that fails partition 0's first attempt part-way."""
    from pyspark.sql.functions import col, udf

    fail = udf(_fail_once, "long", useArrow=False)
    return df.where(fail(col(column)) >= 0)


def _frame(spark: Any) -> Any:
    df = spark.range(0, ROWS, 1, 2).selectExpr(
        "id", "concat('k', cast(id % 5 as string)) as key",
        "encode(concat('w', cast(id as string)), 'utf-8') as value",
        "map('n', cast(id as string)) as properties",
        "timestamp_millis(1700000000000 + id) as eventTime")
    return _failing(df, "id").drop("id")


def test_batch_write_publishes_rows(spark: Any, data_dir: str, client: magnetar.Client,
                                    topic: str) -> None:
    rows = [("a", b"1", {"p": "x"}), ("b", b"2", {})]
    df = spark.createDataFrame(rows, "key string, value binary, properties map<string,string>")
    df.write.format("magnetar").option("service", data_dir).option("topic", topic) \
        .mode("append").save()
    got = sorted((m.partition_key(), m.data(), m.properties()) for m in read_all(client, topic))
    assert got == [("a", b"1", {"p": "x"}), ("b", b"2", {})]


def test_a_retried_write_task_leaves_no_duplicate(spark: Any, data_dir: str,
                                                  client: magnetar.Client, topic: str) -> None:
    """Spark retries partition 0 after its first attempt failed part-way."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        _frame(spark).write.format("magnetar").option("service", data_dir) \
            .option("topic", topic).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    values = [m.data() for m in read_all(client, topic)]
    assert sorted(values) == sorted(f"w{i}".encode() for i in range(ROWS))


class _Row(dict[str, Any]):
    def asDict(self) -> dict[str, Any]:
        return dict(self)


def _rows(count: int, fail_at: int | None = None) -> Iterator[_Row]:
    for i in range(count):
        if i == fail_at:
            raise RuntimeError("simulated task failure")
        yield _Row(value=f"r{i}".encode(), key=f"k{i % 3}")


@pytest.mark.parametrize("deduplication", ["true", "false"])
def test_a_task_run_twice_publishes_its_rows_once(spark: Any, data_dir: str,
                                                  client: magnetar.Client, topic: str,
                                                  deduplication: str) -> None:
    """The writer's task code, run as Spark runs a retried attempt: the first attempt stored
    600 rows and failed, the second runs the same rows again (control: dedup off)."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    import magnetar.spark

    source = magnetar.spark.data_source()({"service": data_dir, "topic": topic,
                                           "deduplication": deduplication})
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    writer = source.writer(schema, False)
    with pytest.raises(RuntimeError, match="simulated"):
        writer.write(_rows(1000, fail_at=600))
    assert len(read_all(client, topic)) == 600  # the failed attempt's rows are stored
    writer.write(_rows(1000))
    values = [m.data() for m in read_all(client, topic)]
    assert set(values) == {f"r{i}".encode() for i in range(1000)}
    assert len(values) == (1000 if deduplication == "true" else 1600)


def test_stream_write_replayed_batch_publishes_once(spark: Any, data_dir: str,
                                                     client: magnetar.Client, topic: str,
                                                     tmp_path: Any) -> None:
    """A streaming copy topic -> topic2 whose micro-batch task fails once and is retried."""
    from ._helpers import publish

    publish(client, topic, 2000, batching=False)
    source = (spark.readStream.format("magnetar").option("service", data_dir)
              .option("topic", topic).option("startingOffsets", "earliest").load()
              .selectExpr("key", "value", "cast(substring(cast(value as string), 2) as long) as n"))
    failing = _failing(source, "n").drop("n")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    query = (failing.writeStream.format("magnetar").option("service", data_dir)
             .option("topic", topic + "-copy")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    values = [m.data() for m in read_all(client, topic + "-copy")]
    assert len(values) == 2000
    assert set(values) == {f"v{i}".encode() for i in range(2000)}
