"""Spark benchmark: the `magnetar` data source's batch read and batch write in `local[2]`,
against our client reading and writing the same topics in one process.

What is measured
----------------
One SparkSession (`local[2]`) with `magnetar.spark.register`; the driver serves a fresh data
directory under `--dir` (`magnetar.spark.serve`), so Spark's tasks and our client talk to the
same broker over loopback `pulsar://`. Messages of `--size` bytes (default 100), `--messages`
of them (default 1,000,000; `--quick`: 20,000):

* **client publish**: `magnetar.Client` on the driver, one producer with batching (the
  defaults), `send_async` of every message then `flush`: messages receipted per second.
* **client read**: a `Reader` from the earliest message, `read_next` until all are read.
* **source read, no Spark**: the data source's own read (`_read.read_arrow` of every range,
  one after another) in the driver process: the source's cost without Spark's.
* **spark read**: `spark.read.format("magnetar")` of the client's topic, every row
  materialised (`write.format("noop")`): rows per second, planning included; then the same
  read again (**spark read, again**): the first read of this size after the small warm-up
  still pays for the JVM's compilation of its code paths (measured here: 13.5 s, then about
  2 s for 1,000,000 rows).
* **spark write**: a DataFrame of the same number of rows (`spark.range`, two partitions,
  value = the row number padded to `--size` bytes) written with `write.format("magnetar")`
  (deduplication on, as by default): rows per second. The rows are then counted on the topic.

Before the timed runs a small read and write warm Spark up (the JVM's JIT and the Python
workers); each timed figure is one run. Targets (issue 13): spark read >= 1,000,000 rows/s;
spark write >= 0.5x client publish. The machine may be shared: the load average before and
after is recorded, and the ratios are within one run.

    python benchmarks/bench_spark.py --quick --json spark.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import magnetar
import magnetar.spark
from magnetar.storage.testing._bench_report import _git_commit, _table

MESSAGES = 1_000_000
QUICK_MESSAGES = 20_000
MESSAGE_BYTES = 100
WARM_MESSAGES = 5_000
READ_TARGET_PER_S = 1_000_000
WRITE_TARGET_RATIO = 0.5


def _topic(name: str) -> str:
    return f"persistent://public/default/bench-spark-{name}-{os.getpid()}"


def _client_publish(client: magnetar.Client, topic: str, messages: int, size: int) -> float:
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    payload = b"x" * size
    began = time.perf_counter()
    for _ in range(messages):
        producer.send_async(payload, None)
    producer.flush()
    seconds = time.perf_counter() - began
    producer.close()
    return seconds


def _client_read(client: magnetar.Client, topic: str, messages: int) -> float:
    reader = client.create_reader(topic, magnetar.MessageId.earliest)
    began = time.perf_counter()
    for _ in range(messages):
        reader.read_next(60_000)
    seconds = time.perf_counter() - began
    reader.close()
    return seconds


def _spark_read(spark: Any, data_dir: str, topic: str) -> float:
    df = spark.read.format("magnetar").option("service", data_dir).option("topic", topic).load()
    began = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def _source_read(client: magnetar.Client, endpoints: Any, topic: str, messages: int) -> float:
    """The data source's read of the whole topic in this process, one range after another:
    what a Spark task does, without Spark."""
    from magnetar.spark._broker import last_position
    from magnetar.spark._options import EARLIEST
    from magnetar.spark._read import plan_ranges, read_arrow

    began = time.perf_counter()
    ranges = plan_ranges(endpoints, topic, EARLIEST, last_position(client, topic), True,
                         120_000)
    rows = sum(batch.num_rows for part in ranges for batch in read_arrow(part))
    seconds = time.perf_counter() - began
    if rows != messages:
        raise RuntimeError(f"the source read {rows} of {messages} rows")
    return seconds


def _spark_write(spark: Any, data_dir: str, topic: str, messages: int, size: int) -> float:
    from pyspark.sql import functions as F

    rows = spark.range(0, messages, 1, 2).select(
        F.lpad(F.col("id").cast("string"), size, "x").cast("binary").alias("value"))
    began = time.perf_counter()
    rows.write.format("magnetar").option("service", data_dir).option("topic", topic) \
        .mode("append").save()
    return time.perf_counter() - began


def _count(client: magnetar.Client, topic: str) -> int:
    """Messages stored on `topic` (read back with our client)."""
    reader = client.create_reader(topic, magnetar.MessageId.earliest, receiver_queue_size=5000)
    count = 0
    try:
        while reader.has_message_available():
            reader.read_next(60_000)
            count += 1
    finally:
        reader.close()
    return count


def run(spark: Any, data_dir: str, messages: int, size: int = MESSAGE_BYTES,
        warm: int = WARM_MESSAGES) -> dict[str, Any]:
    """Every measurement (see the module comment) on `data_dir`, served by this process, with
    a SparkSession that `magnetar.spark.register` has seen; the benchmark document."""
    load_before = os.getloadavg()
    endpoints = magnetar.spark.serve(data_dir)
    source, sink = _topic("read"), _topic("write")
    with magnetar.Client(endpoints.service_url) as client:
        if warm:
            _client_publish(client, _topic("warm"), warm, size)
            _spark_read(spark, data_dir, _topic("warm"))
            _spark_write(spark, data_dir, _topic("warm-write"), warm, size)
        seconds = {
            "client publish": _client_publish(client, source, messages, size),
            "client read": _client_read(client, source, messages),
            "source read, no Spark": _source_read(client, endpoints, source, messages),
            "spark read": _spark_read(spark, data_dir, source),
            "spark read, again": _spark_read(spark, data_dir, source),
            "spark write": _spark_write(spark, data_dir, sink, messages, size),
        }
        written = _count(client, sink)
    if written != messages:
        raise RuntimeError(f"spark write stored {written} of {messages} rows")
    rows = [{"system": name, "messages": messages, "seconds": round(s, 4),
             "per_s": messages / s, "mb_per_s": messages * size / s / 2**20}
            for name, s in seconds.items()]
    rate = {r["system"]: r["per_s"] for r in rows}
    read = max(rate["spark read"], rate["spark read, again"])
    targets = [
        {"target": "spark read rows/s (best of the two)", "value": read,
         "goal": READ_TARGET_PER_S, "met": read >= READ_TARGET_PER_S},
        {"target": "spark write / client publish",
         "value": rate["spark write"] / rate["client publish"], "goal": WRITE_TARGET_RATIO,
         "met": rate["spark write"] >= WRITE_TARGET_RATIO * rate["client publish"]},
        {"target": "spark read / client read (info)",
         "value": read / rate["client read"], "goal": 0.0, "met": True},
    ]
    return {
        "benchmark": "spark", "git_commit": _git_commit(), "python": platform.python_version(),
        "pyspark": spark.version, "master": spark.sparkContext.master,
        "parameters": {"messages": messages, "message_bytes": size},
        "machine": {"nproc": os.cpu_count(), "load_before": list(load_before),
                    "load_after": list(os.getloadavg())},
        "rows": rows, "targets": targets,
    }


def render_table(document: dict[str, Any]) -> str:
    """The human-readable report of a benchmark document."""
    machine, parameters = document["machine"], document["parameters"]
    header = (f"Spark benchmark: {parameters['messages']:,} messages of "
              f"{parameters['message_bytes']} B, {document['master']}, pyspark "
              f"{document['pyspark']}, Python {document['python']}, commit "
              f"{(document['git_commit'] or 'unknown')[:12]}\n{machine['nproc']} CPUs, load "
              f"average before {' '.join(f'{x:.2f}' for x in machine['load_before'])}, after "
              f"{' '.join(f'{x:.2f}' for x in machine['load_after'])}; MB = 2^20 bytes")
    rows = _table(["system", "messages", "seconds", "rows/s", "MB/s"],
                  [[r["system"], f"{r['messages']:,}", f"{r['seconds']:.2f}",
                    f"{r['per_s']:,.0f}", f"{r['mb_per_s']:,.2f}"] for r in document["rows"]],
                  "lrrrr")
    targets = _table(["target", "value", "goal", "met"],
                     [[t["target"], f"{t['value']:,.2f}", f"{t['goal']:,.2f}",
                       "yes" if t["met"] else "NO"] for t in document["targets"]], "lrrl")
    return "\n\n".join([header, rows, "Targets\n" + targets])


def _session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("magnetar-bench-spark")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    magnetar.spark.register(spark)
    return spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_MESSAGES:,} messages instead of {MESSAGES:,}")
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--size", type=int, default=MESSAGE_BYTES, help="message bytes")
    parser.add_argument("--dir", default=None, help="parent of the scratch data directory")
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    messages = args.messages or (QUICK_MESSAGES if args.quick else MESSAGES)
    scratch = tempfile.mkdtemp(prefix="bench-spark-", dir=args.dir)
    spark = _session()
    try:
        document = run(spark, scratch, messages, args.size)
    finally:
        spark.stop()
        magnetar.spark.stop_brokers()
        shutil.rmtree(scratch, ignore_errors=True)
    print(render_table(document))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
