"""Streaming reads: new messages arrive, a restart from the checkpoint loses and repeats
nothing, read limits, the durable subscription that commit moves."""

from __future__ import annotations

from typing import Any

import pytest

import magnetar
import magnetar.spark

from ._helpers import admin, publish, topic_path

pytestmark = pytest.mark.spark


def _start(spark: Any, data_dir: str, topic: str, out: str, checkpoint: str,
           **options: str) -> Any:
    reader = (spark.readStream.format("magnetar").option("service", data_dir)
              .option("topic", topic).option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().select("value", "messageId").writeStream.format("parquet")
            .option("path", out).option("checkpointLocation", checkpoint).start())


def _values(spark: Any, out: str) -> list[bytes]:
    return [r.value for r in spark.read.parquet(out).collect()]


def test_stream_picks_up_new_messages_and_restarts_without_loss_or_duplicate(
        spark: Any, data_dir: str, client: magnetar.Client, topic: str, tmp_path: Any) -> None:
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    sent = publish(client, topic, 300)
    query = _start(spark, data_dir, topic, out, checkpoint, subscription="keep-" + topic[-6:])
    try:
        query.processAllAvailable()
        assert sorted(_values(spark, out)) == sorted(sent)
        sent += publish(client, topic, 200, first=300)
        query.processAllAvailable()
        assert sorted(_values(spark, out)) == sorted(sent)
    finally:
        query.stop()
    sent += publish(client, topic, 250, first=500)  # while no query runs
    query = _start(spark, data_dir, topic, out, checkpoint, subscription="keep-" + topic[-6:])
    try:
        query.processAllAvailable()
        sent += publish(client, topic, 50, first=750)
        query.processAllAvailable()
    finally:
        query.stop()
    values = _values(spark, out)
    assert len(values) == len(sent) == 800  # no duplicate
    assert sorted(values) == sorted(sent)  # no loss
    stats = admin(magnetar.spark.serve(data_dir).admin_url or "", "GET",
                  topic_path(topic) + "/internalStats")
    cursor = stats["cursors"]["keep-" + topic[-6:]]  # moved by commit: holds retention
    assert cursor["markDeletePosition"] != "-1:-1"


def test_max_records_per_trigger_limits_each_micro_batch(
        spark: Any, data_dir: str, client: magnetar.Client, topic: str, tmp_path: Any) -> None:
    """150 messages, then 250 more once the query runs: no row is read twice, and every
    micro-batch after the first run's holds at most 100 (pyspark 4.0/4.1 do not limit a
    run's first micro-batch; see _source.py)."""
    publish(client, topic, 150, batching=False)
    query = _start(spark, data_dir, topic, str(tmp_path / "out"), str(tmp_path / "cp"),
                   maxRecordsPerTrigger="100")
    try:
        query.processAllAvailable()
        first = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        publish(client, topic, 250, first=150, batching=False)
        query.processAllAvailable()
        rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert sum(first) == 150
    assert sum(rows) == 400  # nothing read twice
    assert max(rows[len(first):]) <= 100
    assert len(rows) - len(first) >= 3


def test_checkpoint_pointing_at_gone_data(spark: Any, data_dir: str, client: magnetar.Client,
                                          topic: str, tmp_path: Any) -> None:
    """The topic is deleted and published again while the query is stopped: the checkpoint's
    offset names an entry that is gone. With failOnDataLoss=true the restarted query stops
    with an error naming the range and the option; restarted again with false it logs the
    loss and reads what is there."""
    from pyspark.errors import StreamingQueryException

    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    before = publish(client, topic, 20)
    query = _start(spark, data_dir, topic, out, checkpoint)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    admin(magnetar.spark.serve(data_dir).admin_url or "", "DELETE",
          topic_path(topic) + "?force=true")
    after = publish(client, topic, 10, first=20)
    query = _start(spark, data_dir, topic, out, checkpoint, failOnDataLoss="true")
    try:
        with pytest.raises(StreamingQueryException,
                           match=rf"data loss on {topic} .*failOnDataLoss=false"):
            query.processAllAvailable()
    finally:
        query.stop()
    query = _start(spark, data_dir, topic, out, checkpoint, failOnDataLoss="false")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(_values(spark, out)) == sorted(before + after)
