"""Batch reads: content, partitioned topics, ledger splits, offsets and time, bad options."""

from __future__ import annotations

import time
from typing import Any

import pytest

import magnetar
import magnetar.spark

from ._helpers import admin, publish, read_all, retention_pass, topic_path

pytestmark = pytest.mark.spark


def _load(spark: Any, data_dir: str, **options: str) -> Any:
    reader = spark.read.format("magnetar").option("service", data_dir)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_of_100000_messages_equals_what_was_published(
        spark: Any, data_dir: str, client: magnetar.Client, topic: str) -> None:
    values = publish(client, topic, 100_000)
    table = _load(spark, data_dir, topic=topic).toArrow()
    assert table.num_rows == 100_000
    assert sorted(table.column("value").to_pylist()) == sorted(values)
    rows = table.slice(0, 3).to_pylist()
    assert [r["key"] for r in rows] == [b"k0", b"k1", b"k2"]
    assert rows[1]["properties"] == [("i", "1")]
    assert rows[1]["topic"] == topic
    assert rows[1]["partition"] == -1
    assert rows[1]["eventTime"].timestamp() * 1000 == 1_700_000_000_001
    assert rows[1]["producerName"]
    ids = table.column("messageId").to_pylist()
    assert len(set(ids)) == 100_000  # `ledger:entry:batch`, one per message


def test_batch_read_splits_by_ledger(spark: Any, data_dir: str, client: magnetar.Client,
                                     topic: str) -> None:
    """Each ledger is its own Spark partition: unload rolls the ledger between batches. A
    retention pass before the read keeps both (the namespace's retention; see conftest.py)."""
    endpoints = magnetar.spark.serve(data_dir)
    assert endpoints.admin_url is not None
    values = publish(client, topic, 300)
    admin(endpoints.admin_url, "PUT", topic_path(topic) + "/unload")
    values += publish(client, topic, 300, first=300)
    stats = admin(endpoints.admin_url, "GET", topic_path(topic) + "/internalStats")
    filled = [ledger for ledger in stats["ledgers"] if ledger["entries"] > 0]
    assert len(filled) >= 2
    retention_pass(data_dir)
    df = _load(spark, data_dir, topic=topic)
    assert df.rdd.getNumPartitions() == len(filled)
    assert sorted(r.value for r in df.select("value").collect()) == sorted(values)


def test_partitioned_topic(spark: Any, data_dir: str, client: magnetar.Client,
                           topic: str) -> None:
    endpoints = magnetar.spark.serve(data_dir)
    assert endpoints.admin_url is not None
    admin(endpoints.admin_url, "PUT", topic_path(topic) + "/partitions", 3)
    values = publish(client, topic, 3000, batching=False)
    rows = _load(spark, data_dir, topic=topic).select("value", "partition", "topic").collect()
    assert sorted(r.value for r in rows) == sorted(values)
    assert {r.partition for r in rows} == {0, 1, 2}
    assert all(r.topic == f"{topic}-partition-{r.partition}" for r in rows)
    pattern = _load(spark, data_dir, topicsPattern=topic.rsplit("/", 1)[1] + "-.*")
    assert pattern.count() == 3000


def test_json_offsets_select_a_range(spark: Any, data_dir: str, client: magnetar.Client,
                                     topic: str) -> None:
    publish(client, topic, 40)  # batched: ids carry batch indexes
    ordered = _load(spark, data_dir, topic=topic).select("value", "messageId").collect()
    by_value = {bytes(r.value): r.messageId for r in ordered}
    start, end = by_value[b"v9"], by_value[b"v29"]
    rows = _load(spark, data_dir, topic=topic, startingOffsets=f'{{"{topic}": "{start}"}}',
                 endingOffsets=f'{{"{topic}": "{end}"}}').select("value").collect()
    assert sorted(r.value for r in rows) == sorted(f"v{i}".encode() for i in range(10, 30))


def _clock_past(ms: int) -> None:
    deadline = time.monotonic() + 5
    while time.time() * 1000 <= ms and time.monotonic() < deadline:
        pass  # until the clock is past the last publish time


def _last_publish_ms(spark: Any, data_dir: str, topic: str) -> int:
    last = _load(spark, data_dir, topic=topic).agg({"publishTime": "max"}).collect()[0][0]
    return round(last.timestamp() * 1000)


def test_starting_and_ending_time(spark: Any, data_dir: str, client: magnetar.Client,
                                  topic: str) -> None:
    """Three groups published apart in time; startingTime and endingTime select by publish
    time (from the first message at or after startingTime, up to before endingTime)."""
    first = publish(client, topic, 50)
    begin_ms = _last_publish_ms(spark, data_dir, topic) + 1
    _clock_past(begin_ms)
    middle = publish(client, topic, 30, first=50)
    end_ms = _last_publish_ms(spark, data_dir, topic) + 1
    _clock_past(end_ms)
    last = publish(client, topic, 20, first=80)

    def values(**options: str) -> list[bytes]:
        return sorted(r.value for r in _load(spark, data_dir, topic=topic, **options)
                      .select("value").collect())

    assert values(startingTime=str(begin_ms)) == sorted(middle + last)
    assert values(endingTime=str(end_ms)) == sorted(first + middle)
    assert values(startingTime=str(begin_ms), endingTime=str(end_ms)) == sorted(middle)


def test_http_service_url(spark: Any, data_dir: str, client: magnetar.Client,
                          topic: str) -> None:
    """`service` as the broker's http:// URL: lookups over HTTP, the admin API at the same
    URL (ledger listing), for a read and a write."""
    http = magnetar.spark.serve(data_dir).admin_url
    assert http is not None
    assert http.startswith("http://")
    values = publish(client, topic, 500)
    df = spark.read.format("magnetar").option("service", http).option("topic", topic).load()
    assert sorted(r.value for r in df.select("value").collect()) == sorted(values)
    df.select("key", "value").write.format("magnetar").option("service", http) \
        .option("topic", topic + "-copy").mode("append").save()
    assert sorted(m.data() for m in read_all(client, topic + "-copy")) == sorted(values)


@pytest.mark.parametrize(("options", "named"), [
    ({"topic": "no-such-topic-anywhere"}, "option topic"),
    ({"topic": "x", "topics": "y"}, "exactly one of the options topic, topics, topicsPattern"),
    ({"topic": "x", "startingOffsets": "{not json"}, "option startingOffsets: malformed JSON"),
    ({"topic": "x", "endingOffsets": '{"x": "1:two"}'}, "option endingOffsets"),
    ({"topic": "x", "startingOffsets": "latest"}, "option startingOffsets"),
    ({"topic": "x", "failOnDataLoss": "maybe"}, "option failOnDataLoss"),
    ({"topic": "x", "colour": "red"}, "unknown option"),
])
def test_bad_options_name_the_option(spark: Any, data_dir: str, client: magnetar.Client,
                                     options: dict[str, str], named: str) -> None:
    publish(client, "x", 1)
    with pytest.raises(Exception, match=named) as caught:
        _load(spark, data_dir, **options).collect()
    assert "MagnetarSparkError" in str(caught.value)


def test_data_directory_without_register_is_a_clear_error(spark: Any, tmp_path: Any) -> None:
    from magnetar.spark._source import MagnetarDataSource

    spark.dataSource.register(MagnetarDataSource)  # the bare class: no broker host
    try:
        with pytest.raises(Exception, match=r"needs magnetar.spark.register\(spark\)"):
            _load(spark, str(tmp_path), topic="x").collect()
    finally:
        magnetar.spark.register(spark)
