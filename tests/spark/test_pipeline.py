"""tools/spark_pipeline.py as a streaming job on the shared session, against the served data
directory: several micro-batches (maxRecordsPerTrigger), a watermark that closes three
minutes of event time, and the per-key, per-minute counts and sums in the output topic."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import magnetar

from .._scripts import load_script
from ._helpers import read_all

PIPELINE = Path(__file__).resolve().parents[2] / "tools" / "spark_pipeline.py"
MINUTE_MS = 60_000
BASE_MS = 1_700_000_040_000  # a whole minute
EVENTS_PER_MINUTE = 30
KEYS = 5
OUTPUT_DEADLINE_S = 60.0


def _load_pipeline() -> ModuleType:
    return load_script(PIPELINE, "spark_pipeline")


def _publish(client: magnetar.Client, topic: str, minutes: range, late: bool,
             expected: dict[tuple[str, int], tuple[int, int]]) -> None:
    """Events of the given minutes, and with `late` one ten minutes later (it moves the
    watermark past them); adds the expected (count, sum) per key and minute start."""
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    for minute in minutes:
        for i in range(EVENTS_PER_MINUTE):
            key, amount = f"k{i % KEYS}", i % 100
            at = BASE_MS + minute * MINUTE_MS + i * 1000
            producer.send_async(str(amount).encode(), None, partition_key=key,
                                event_timestamp=at)
            count, total = expected.get((key, at - at % MINUTE_MS), (0, 0))
            expected[(key, at - at % MINUTE_MS)] = (count + 1, total + amount)
    if late:
        producer.send_async(b"1", None, partition_key="late",
                            event_timestamp=BASE_MS + 13 * MINUTE_MS)
    producer.flush()
    producer.close()


def test_streaming_pipeline_writes_closed_windows(spark: Any, data_dir: str,
                                                 client: magnetar.Client, topic: str,
                                                 tmp_path: Path) -> None:
    """(The first minute is published before the query starts and the rest after its first
    micro-batch: pyspark 4.0/4.1 do not limit a run's first micro-batch.)"""
    pipeline = _load_pipeline()
    expected: dict[tuple[str, int], tuple[int, int]] = {}
    _publish(client, topic, range(1), False, expected)
    args = pipeline.parse(["--service", data_dir, "--source", topic, "--sink", topic + "-out",
                           "--streaming", "--checkpoint", str(tmp_path / "cp"),
                           "--max-records-per-trigger", "40"])
    query = pipeline.run(spark, args)
    try:
        query.processAllAvailable()
        _publish(client, topic, range(1, 3), True, expected)
        deadline = time.monotonic() + OUTPUT_DEADLINE_S
        while len(read_all(client, topic + "-out")) < len(expected):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the closed windows were not written in time"
            query.processAllAvailable()
        batches = {p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0}
    finally:
        query.stop()
    assert len(batches) >= 3  # 30 messages, then 61 at most 40 a micro-batch
    got = {}
    for message in read_all(client, topic + "-out"):
        row = json.loads(message.data())
        minute_ms = message.event_timestamp()
        assert row["minute"].startswith(time.strftime("%Y-%m-%d %H:%M",
                                                      time.gmtime(minute_ms / 1000)))
        got[(message.partition_key(), minute_ms)] = (row["count"], row["sum"])
    assert got == expected  # each closed window once; the late event's window is still open
