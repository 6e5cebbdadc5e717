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
  materialised (`write.format("noop")`; a Python data source cannot prune columns, so `count`
  costs the same): rows per second, planning included. The first read of this size after the
  small warm-up still pays for the JVM's compilation of its code paths; **spark read, again**
  is the best of `REPEAT` more reads of the same topic (a warm JVM, as in a long-running
  application).
* **spark, no source (floor)**: the same number of rows of the same schema and sizes from a
  Python data source whose tasks only hand Spark prebuilt Arrow record batches, in as many
  partitions as the read (best of `REPEAT`): what Spark itself costs for these rows, the
  ceiling of any Python data source on this machine.
* **spark write**: a DataFrame of the same number of rows (`spark.range`, two partitions,
  value = the row number padded to `--size` bytes) written with `write.format("magnetar")`
  (deduplication on, as by default): rows per second. The rows are then counted on the topic.

Just before the Spark rows a small read and write warm Spark up (the JVM's JIT and the Python
workers, which Spark stops after a minute idle). Each row also gives the CPU seconds used
meanwhile by the driver process (which runs the broker), the JVM and its Python workers (from
/proc): steadier than rates on a shared machine (a process that exits during a row takes its
CPU seconds with it unless its parent reaps it). Targets (issue 13): spark read >= 1,000,000
rows/s; spark write >= 0.5x client publish. The machine may be shared: the load average before
and after is recorded, and the ratios are within one run.

    python benchmarks/bench_spark.py --quick --json spark.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import magnetar
import magnetar.spark
from magnetar.storage.testing._bench_report import _git_commit, _table

MESSAGES = 1_000_000
QUICK_MESSAGES = 20_000
MESSAGE_BYTES = 100
WARM_MESSAGES = 5_000
REPEAT = 3  # timed runs of "spark read, again" and of the floor: the best is reported
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


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by this process (the driver, with the broker it serves), the
    JVM it started and the JVM's Python workers (reaped children included), from /proc
    (Linux; empty elsewhere). The driver's own figure comes from getrusage, in microseconds:
    /proc counts clock ticks (10 ms), and a tiny run's publish of 3,000 messages can take
    less than one."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parents: dict[int, list[int]] = {}
    used: dict[int, float] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(pid)
        used[pid] = sum(int(x) for x in fields[11:15]) / tick
    groups = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        todo.extend(parents.get(pid, []))
        if pid not in used:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                program = os.path.basename(f.read().split(b"\0", 1)[0].decode(errors="replace"))
        except OSError:
            program = ""
        if pid == os.getpid():
            continue
        groups["jvm" if program == "java" else "python workers"] += used[pid]
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    groups["driver"] = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    return groups


def _timed(action: Callable[[], Any]) -> tuple[float, dict[str, float]]:
    """Wall seconds of `action()` (the seconds it returns, if it times itself) and the CPU
    seconds each process group used meanwhile."""
    before = _cpu_seconds()
    began = time.perf_counter()
    result = action()
    seconds = result if isinstance(result, float) else time.perf_counter() - began
    after = _cpu_seconds()
    return seconds, {k: round(after[k] - before.get(k, 0.0), 3) for k in after}


def _spark_read(spark: Any, data_dir: str, topic: str) -> None:
    df = spark.read.format("magnetar").option("service", data_dir).option("topic", topic).load()
    df.write.format("noop").mode("overwrite").save()


def _floor_source() -> type[Any]:
    """A Python data source of the row schema whose tasks only hand Spark prebuilt Arrow
    record batches (100 B values, ids and topic names like the read's): what Spark itself
    costs for these rows. Built in a function so cloudpickle ships it by value."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from magnetar.spark._read import ROWS_PER_BATCH_MAX, SCHEMA

    class Part(InputPartition):
        def __init__(self, rows: int, size: int, topic: str):
            super().__init__(None)
            self.rows, self.size, self.topic = rows, size, topic

    def batch(part: Any) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from magnetar.spark._columns import arrow_schema

        schema, n, us = arrow_schema(), ROWS_PER_BATCH_MAX, pa.timestamp("us", tz="UTC")
        offsets = np.arange(0, (n + 1) * part.size, part.size, dtype=np.int32)
        values = pa.Array.from_buffers(pa.binary(), n, [
            None, pa.py_buffer(offsets), pa.py_buffer(b"x" * (part.size * n))])
        ids = pc.binary_join_element_wise("10:", pc.cast(pa.array(np.arange(n)), pa.string()),
                                          "")
        no_properties = pa.MapArray.from_arrays(
            pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()),
            pa.array([], pa.string()), type=schema.field("properties").type)
        return pa.RecordBatch.from_arrays([
            pa.nulls(n, pa.binary()), values, pa.repeat(pa.scalar(part.topic), n),
            pa.array(np.full(n, -1, dtype=np.int32)), ids,
            pa.array(np.full(n, 1_700_000_000_000_000)).cast(us), pa.nulls(n, us),
            no_properties, pa.repeat(pa.scalar("standalone-0-0"), n)], schema=schema)

    class Reader(DataSourceReader):
        def __init__(self, rows: int, parts: int, size: int, topic: str):
            self.rows, self.parts, self.size, self.topic = rows, parts, size, topic

        def partitions(self) -> list[Part]:
            share = -(-self.rows // self.parts)
            return [Part(min(share, self.rows - i * share), self.size, self.topic)
                    for i in range(self.parts)]

        def read(self, partition: Any) -> Any:
            whole, left = batch(partition), partition.rows
            while left > 0:
                yield whole.slice(0, min(left, whole.num_rows))
                left -= whole.num_rows

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "magnetar-bench-floor"

        def schema(self) -> str:
            return SCHEMA

        def reader(self, schema: Any) -> Reader:
            o = self.options
            return Reader(int(o["rows"]), int(o["parts"]), int(o["size"]), o["topic"])

    return FloorSource


def _floor_read(spark: Any, rows: int, size: int, topic: str) -> None:
    spark.read.format("magnetar-bench-floor").option("rows", rows).option("size", size) \
        .option("parts", spark.sparkContext.defaultParallelism).option("topic", topic).load() \
        .write.format("noop").mode("overwrite").save()


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
        warm: int = WARM_MESSAGES, repeat: int = REPEAT) -> dict[str, Any]:
    """Every measurement (see the module comment) on `data_dir`, served by this process, with
    a SparkSession that `magnetar.spark.register` has seen; the benchmark document."""
    load_before = os.getloadavg()
    endpoints = magnetar.spark.serve(data_dir)
    source, sink = _topic("read"), _topic("write")
    spark.dataSource.register(_floor_source())
    with magnetar.Client(endpoints.service_url) as client:
        seconds = {
            "client publish": _timed(lambda: _client_publish(client, source, messages, size)),
            "client read": _timed(lambda: _client_read(client, source, messages)),
            "source read, no Spark": _timed(
                lambda: _source_read(client, endpoints, source, messages)),
        }
        if warm:  # just before the Spark rows: Spark stops Python workers idle for a minute
            _client_publish(client, _topic("warm"), warm, size)
            _spark_read(spark, data_dir, _topic("warm"))
            _floor_read(spark, warm, size, source)
            _spark_write(spark, data_dir, _topic("warm-write"), warm, size)
        seconds["spark read"] = _timed(lambda: _spark_read(spark, data_dir, source))
        seconds["spark read, again"] = min(
            (_timed(lambda: _spark_read(spark, data_dir, source)) for _ in range(repeat)),
            key=lambda timed: timed[0])
        seconds["spark, no source (floor)"] = min(
            (_timed(lambda: _floor_read(spark, messages, size, source)) for _ in range(repeat)),
            key=lambda timed: timed[0])
        seconds["spark write"] = _timed(
            lambda: _spark_write(spark, data_dir, sink, messages, size))
        written = _count(client, sink)
    if written != messages:
        raise RuntimeError(f"spark write stored {written} of {messages} rows")
    rows = [{"system": name, "messages": messages, "seconds": round(s, 4),
             "per_s": messages / s, "mb_per_s": messages * size / s / 2**20,
             "cpu_s": round(sum(cpu.values()), 3), "cpu_s_by_process": cpu}
            for name, (s, cpu) in seconds.items()]
    rate = {r["system"]: r["per_s"] for r in rows}
    read = max(rate["spark read"], rate["spark read, again"])
    floor = rate["spark, no source (floor)"]
    targets = [
        {"target": "spark read rows/s (best)", "value": read,
         "goal": READ_TARGET_PER_S, "met": read >= READ_TARGET_PER_S},
        {"target": "spark write / client publish",
         "value": rate["spark write"] / rate["client publish"], "goal": WRITE_TARGET_RATIO,
         "met": rate["spark write"] >= WRITE_TARGET_RATIO * rate["client publish"]},
        {"target": "spark read / client read (info)",
         "value": read / rate["client read"], "goal": 0.0, "met": True},
        {"target": "spark read / Spark's floor (info)", "value": read / floor, "goal": 0.0,
         "met": True},
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
    rows = _table(["system", "messages", "seconds", "rows/s", "MB/s", "CPU s",
                   "driver+broker / JVM / py workers"],
                  [[r["system"], f"{r['messages']:,}", f"{r['seconds']:.2f}",
                    f"{r['per_s']:,.0f}", f"{r['mb_per_s']:,.2f}", f"{r['cpu_s']:.2f}",
                    " / ".join(f"{v:.2f}" for v in r["cpu_s_by_process"].values())]
                   for r in document["rows"]], "lrrrrrr")
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
