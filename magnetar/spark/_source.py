"""The `magnetar` data source: batch and streaming readers and writers (pyspark 4.0+).

Spark pickles the source, its readers, writers and partitions to its Python workers; they keep
only options, endpoints and positions, and open clients inside each method. Where each runs
and why a data directory is served by the driver: `_host.py`. Positions and offsets:
`_options.py`. Reading ranges: `_read.py`. Publishing once: `_write.py`.

Streaming offsets are `{"<topic-partition>": "ledger:entry:batch"}` (sorted keys); `read`
replays any `(start, end]` exactly, so Spark's checkpoint is the source of truth. `commit(end)`
moves a durable subscription (option `subscription`, default `spark-<random>`, deleted by
`stop` unless given) to `end`, so retention keeps what the stream has not committed yet.
`latestOffset` takes both signatures: `(start, limit)` (4.2+, admission control with
`ReadMaxRows`) and no arguments (pyspark 4.0/4.1): the limit then counts from the end of the
last batch Spark planned (`partitions`) or the previous answer; Spark 4.0/4.1 asks before it
says where a run starts (before `initialOffset`, or after a restart from a checkpoint), so the
first micro-batch of each run there is not limited -- a limit counted from a guessed start
could fall behind the checkpoint, and Spark would then read rows twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ._broker import connect, enable_deduplication, resolve, topic_partitions
from ._host import Endpoints, HostAddress
from ._options import (
    EARLIEST,
    Position,
    ReadOptions,
    WriteOptions,
    dump_offsets,
    parse_position,
)
from ._plan import check_offsets_topics, limit_end, resolve_position, time_position
from ._read import SCHEMA, RangePartition, plan_ranges, read_arrow
from ._write import (
    Publisher,
    WriteCommit,
    check_write_schema,
    column_chunks,
    new_write_id,
    task_identity,
)

__all__ = ["MagnetarDataSource"]

log = logging.getLogger(__name__)


class _Part(InputPartition):
    def __init__(self, ranges: list[RangePartition]):
        super().__init__(None)
        self.ranges = ranges


class MagnetarDataSource(DataSource):
    """`spark.read.format("magnetar")` and friends; register with `magnetar.spark.register`."""

    host: ClassVar[HostAddress | None] = None  # set on the class `register` builds
    parallelism: ClassVar[int] = 1  # the driver's default parallelism, set by `register`

    @classmethod
    def name(cls) -> str:
        return "magnetar"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(ReadOptions.parse(self.options, streaming=False), self.host,
                            self.parallelism)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(ReadOptions.parse(self.options, streaming=True), self.host,
                             self.parallelism)

    def writer(self, schema: StructType, overwrite: bool) -> _BatchWriter:
        return _BatchWriter(self._write_setup(schema), new_write_id())

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:
        return _StreamWriter(self._write_setup(schema), new_write_id())

    def _write_setup(self, schema: StructType) -> tuple[WriteOptions, Endpoints]:
        options = WriteOptions.parse(self.options)
        check_write_schema(list(schema.names), options.topic)
        endpoints = resolve(options, self.host)
        if options.topic is not None and options.deduplication:
            enable_deduplication(endpoints, options.topic)
        return options, endpoints


def _read_parts(partition: InputPartition) -> Iterator[Any]:
    assert isinstance(partition, _Part)
    for part in partition.ranges:
        yield from read_arrow(part)


class _Planner:
    options: ReadOptions
    parallelism: int

    def _pieces_min(self, topics: int) -> int:
        """Ranges per topic-partition at least: option minPartitions (default: the driver's
        default parallelism) shared among the topic-partitions."""
        wanted = self.options.min_partitions or self.parallelism
        return max(1, -(-wanted // max(1, topics)))


class _BatchReader(DataSourceReader, _Planner):
    def __init__(self, options: ReadOptions, host: HostAddress | None, parallelism: int):
        self.options = options
        self.parallelism = parallelism
        self.endpoints = resolve(options, host)

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        client = connect(self.endpoints)
        try:
            topics = topic_partitions(client, o.topics, o.pattern)
            check_offsets_topics(o.starting, topics, "startingOffsets")
            check_offsets_topics(o.ending, topics, "endingOffsets")
            parts: list[RangePartition] = []
            for topic in topics:
                start = resolve_position(client, topic, o.starting, "earliest",
                                         "startingOffsets")
                end = resolve_position(client, topic, o.ending, "latest", "endingOffsets")
                if o.starting_time_ms is not None:
                    at = time_position(client, topic, o.starting_time_ms)
                    start = end if at is None else max(start, at, key=Position.key)
                if o.ending_time_ms is not None:
                    at = time_position(client, topic, o.ending_time_ms)
                    if at is not None:
                        end = min(end, at, key=Position.key)
                parts.extend(plan_ranges(self.endpoints, topic, start, end,
                                         o.fail_on_data_loss, o.poll_timeout_ms,
                                         self._pieces_min(len(topics))))
        finally:
            client.close()
        return [_Part([p]) for p in parts] or [_Part([])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_parts(partition)


class _StreamReader(DataSourceStreamReader, _Planner):
    def __init__(self, options: ReadOptions, host: HostAddress | None, parallelism: int):
        self.options = options
        self.parallelism = parallelism
        self.endpoints = resolve(options, host)
        self.subscription = options.subscription or f"spark-{uuid.uuid4().hex[:12]}"
        # 4.0/4.1 (latestOffset without a start): where the query is, as far as Spark has
        # said -- the end of the last planned batch -- or this reader's last answer
        self._previous: dict[str, Position] | None = None
        self._client: Any = None
        self._cursors: dict[str, Any] = {}

    def _connected(self) -> Any:
        if self._client is None:
            self._client = connect(self.endpoints)
        return self._client

    def _topics(self) -> list[str]:
        o = self.options
        return topic_partitions(self._connected(), o.topics, o.pattern)

    def initialOffset(self) -> dict[str, str]:
        o, client = self.options, self._connected()
        topics = self._topics()
        check_offsets_topics(o.starting, topics, "startingOffsets")
        offsets: dict[str, Position] = {}
        for topic in topics:
            offsets[topic] = resolve_position(client, topic, o.starting, "latest",
                                              "startingOffsets")
            if o.starting_time_ms is not None:
                at = time_position(client, topic, o.starting_time_ms)
                offsets[topic] = at if at is not None else \
                    resolve_position(client, topic, "latest", "latest", "startingTime")
        if self._previous is None:  # 4.0/4.1 may ask latestOffset first: never go back
            self._previous = offsets
        return dump_offsets(offsets)

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        rows = self.options.max_records_per_trigger
        return ReadMaxRows(rows) if rows else ReadAllAvailable()

    def latestOffset(self, start: dict[str, str] | None = None,
                     limit: Any = None) -> dict[str, str]:
        client = self._connected()
        if start is not None:
            begin = {t: parse_position(p, "offset") for t, p in start.items()}
        else:
            begin = self._previous or {}
        rows = getattr(limit, "max_rows", None)
        if limit is None and start is None and self._previous is not None:
            rows = self.options.max_records_per_trigger  # 4.0/4.1: no admission control API
        from ._broker import last_position

        topics = self._topics()
        latest = {t: last_position(client, t) for t in topics}
        if rows is not None:
            share = max(1, rows // max(1, len(topics)))
            latest = {t: limit_end(client, t, begin.get(t, EARLIEST), latest[t], share)
                      for t in topics}
        for topic, position in begin.items():  # never behind the start (a deleted topic)
            if topic in latest and latest[topic].key() < position.key():
                latest[topic] = position
        self._previous = latest
        return dump_offsets(latest)

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        o = self.options
        self._previous = {t: parse_position(p, "end offset") for t, p in end.items()}
        parts: list[_Part] = []
        for topic in sorted(end):
            low = parse_position(start.get(topic, "earliest"), f"start offset of {topic}")
            high = parse_position(end[topic], f"end offset of {topic}")
            ranges = plan_ranges(self.endpoints, topic, low, high, o.fail_on_data_loss,
                                 o.poll_timeout_ms, self._pieces_min(len(end)))
            parts.extend(_Part([r]) for r in ranges)
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_parts(partition)

    def commit(self, end: dict[str, str]) -> None:
        """Move the durable subscription to `end` on every topic-partition."""
        import magnetar

        client = self._connected()
        for topic, text in sorted(end.items()):
            position = parse_position(text, f"committed offset of {topic}")
            if position.ledger < 0:
                continue
            try:
                consumer = self._cursors.get(topic)
                if consumer is None:
                    consumer = self._cursors[topic] = client.subscribe(
                        topic, self.subscription, receiver_queue_size=1,
                        initial_position=magnetar.InitialPosition.Earliest)
                consumer.seek(magnetar.MessageId(position.ledger, position.entry))
            except magnetar.PulsarException as exc:
                log.warning("moving subscription %s on %s to %s failed: %s",
                            self.subscription, topic, position, exc)

    def stop(self) -> None:
        if self._client is None:
            return
        for consumer in self._cursors.values():
            try:
                if self.options.subscription is None:
                    consumer.unsubscribe()
                else:
                    consumer.close()
            except Exception as exc:
                log.warning("closing the subscription %s failed: %s", self.subscription, exc)
        self._client.close()
        self._client = None


class _BatchWriter(DataSourceArrowWriter):
    def __init__(self, setup: tuple[WriteOptions, Endpoints], write_id: str):
        self.options, self.endpoints = setup
        self.write_id = write_id

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        name, first = task_identity(False, self.write_id)
        return _publish(self.options, self.endpoints, name, first, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("magnetar write %s: %d rows", self.write_id,
                 sum(sum(m.rows.values()) for m in messages if isinstance(m, _Commit)))


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, setup: tuple[WriteOptions, Endpoints], write_id: str):
        self.options, self.endpoints = setup
        self.write_id = write_id

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        name, first = task_identity(True, self.write_id)
        return _publish(self.options, self.endpoints, name, first, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("magnetar stream write: micro-batch %d aborted; its replay publishes only "
                    "what is missing", batchId)


class _Commit(WriterCommitMessage):
    def __init__(self, commit: WriteCommit):
        self.partition = commit.partition
        self.rows = commit.rows


def _publish(options: WriteOptions, endpoints: Endpoints, name: str, first: int,
             iterator: Iterator[Any]) -> WriterCommitMessage:
    publisher = Publisher(endpoints, options.topic, name, first, options.deduplication)
    try:
        for columns, rows in column_chunks(iterator):
            publisher.publish_columns(columns, rows)
    except BaseException:
        publisher.client.close()
        raise
    return _Commit(publisher.finish())

