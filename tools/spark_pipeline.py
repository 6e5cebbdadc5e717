"""An example Spark job on Magnetar: per key and minute of event time, the count and the sum
of the message values (decimal text), from one topic into another.

    python tools/spark_pipeline.py --service ./data --source events --sink events-per-minute
    python tools/spark_pipeline.py --service pulsar://127.0.0.1:6650 --admin-url \\
        http://127.0.0.1:8080 --source events --sink events-per-minute --streaming

Batch mode aggregates what the source topic holds now; streaming mode keeps running
(a 1-minute watermark on event time; each window is written once, when the watermark passes
it) until interrupted; `--max-records-per-trigger` bounds its micro-batches. Output rows:
key = the input key, value = JSON `{"minute": ..., "count": ..., "sum": ...}`, eventTime =
the window's start. With `--publish N` the job first publishes N sample messages to the
source topic. `run` starts the job on a given SparkSession (the tests use theirs).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _publish(service: str, topic: str, count: int) -> None:
    import time

    import magnetar
    import magnetar.spark

    url = service if "://" in service and not service.startswith("file:") else \
        magnetar.spark.serve(service.removeprefix("file://")).service_url
    with magnetar.Client(url) as client:
        producer = client.create_producer(topic, batching_enabled=True,
                                          block_if_queue_full=True)
        now = int(time.time() * 1000)
        for i in range(count):
            producer.send_async(str(i % 100).encode(), None, partition_key=f"k{i % 5}",
                                event_timestamp=now - (count - i) * 10)
        producer.flush()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service", required=True, help="data directory or pulsar:// URL")
    parser.add_argument("--admin-url", help="the admin URL (pulsar:// services)")
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--streaming", action="store_true")
    parser.add_argument("--checkpoint", default="./spark-pipeline-checkpoint")
    parser.add_argument("--max-records-per-trigger", type=int, default=None,
                        help="streaming: at most this many source messages per micro-batch")
    parser.add_argument("--publish", type=int, default=0, help="publish N samples first")
    return parser.parse_args(argv)


def run(spark: Any, args: argparse.Namespace) -> Any:
    """The job on a SparkSession where `magnetar.spark.register` ran: batch mode writes and
    returns None; streaming mode returns the started query."""
    from pyspark.sql import functions as F

    if args.publish:
        _publish(args.service, args.source, args.publish)
    options = {"service": args.service, "topic": args.source}
    if args.admin_url:
        options["adminUrl"] = args.admin_url
    if args.streaming:
        reader = spark.readStream.format("magnetar").options(startingOffsets="earliest",
                                                             **options)
        if args.max_records_per_trigger:
            reader = reader.option("maxRecordsPerTrigger", args.max_records_per_trigger)
        source = reader.load()
    else:
        source = spark.read.format("magnetar").options(**options).load()
    events = source.select(
        "key", F.coalesce("eventTime", "publishTime").alias("time"),
        F.col("value").cast("string").cast("long").alias("amount"))
    if args.streaming:
        events = events.withWatermark("time", "1 minute")
    totals = events.groupBy("key", F.window("time", "1 minute").alias("w")).agg(
        F.count("*").alias("count"), F.sum("amount").alias("sum"))
    out = totals.select(
        "key", F.col("w.start").alias("eventTime"),
        F.to_json(F.struct(F.col("w.start").cast("string").alias("minute"), "count", "sum"))
        .cast("binary").alias("value"))
    sink = dict(options, topic=args.sink)
    if args.streaming:
        return out.writeStream.format("magnetar").options(**sink).outputMode("append") \
            .option("checkpointLocation", args.checkpoint).start()
    out.write.format("magnetar").options(**sink).mode("append").save()
    print(f"wrote {out.count()} per-minute rows to {args.sink}")
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import magnetar.spark

    spark = SparkSession.builder.master("local[2]").appName("magnetar-pipeline") \
        .config("spark.sql.shuffle.partitions", "2").getOrCreate()
    magnetar.spark.register(spark)
    query = run(spark, args)
    if query is not None:
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
    spark.stop()
    magnetar.spark.stop_brokers()
    return 0


if __name__ == "__main__":
    sys.exit(main())
