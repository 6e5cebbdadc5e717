"""Writing: rows become messages, published once even when Spark runs a task again.

Each task publishes its rows with producers named after what stays the same when Spark retries
the task or replays the micro-batch, and with sequence ids from the row's place in it:

| write      | producer name                    | sequence id of row i            |
|------------|----------------------------------|---------------------------------|
| batch      | `spark-<write id>-<partition>`   | i                               |
| streaming  | `spark-<query id>-<partition>`   | (batch id << 32) + i            |

The write id is drawn once on the driver (the writer object is shipped to every attempt); the
query id and batch id are Spark's (`sql.streaming.queryId`, `streaming.sql.batchId`, the task's
local properties), the same after a restart from the checkpoint. With deduplication on the
topic (the writer turns it on through the admin API; option `deduplication=false` leaves it),
the broker drops every message whose sequence id is not above the last it stored from that
producer name: a retry republishes nothing that was already stored, and the task's rows come in
the same order (Spark recomputes a partition deterministically from deterministic input).

Columns: `value` (binary or string, required), optional `key` (binary or string), `topic`
(string; the `topic` option wins), `properties` (map<string,string>), `eventTime` (timestamp).
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from magnetar import Result

from ._broker import connect, enable_deduplication
from ._host import Endpoints
from ._options import MagnetarSparkError, complete

if TYPE_CHECKING:
    import magnetar

__all__ = ["Publisher", "WriteCommit", "check_write_schema", "column_chunks"]

log = logging.getLogger(__name__)

PRODUCER_BUSY_WAIT_S = 30.0  # a failed attempt's producer may still hold the name this long
SEQUENCE_BATCH_SHIFT = 32  # streaming: rows per task per micro-batch < 2**32
EMPTY_PROPERTIES: Mapping[str, str] = MappingProxyType({})
ROWS_PER_CHUNK = 4096  # Rows (not Arrow) turned into columns at a time
_COLUMNS = {"value", "key", "topic", "properties", "eventTime"}


@dataclass
class WriteCommit:
    """What one task reports: rows published per topic (duplicates dropped included)."""

    partition: int
    rows: dict[str, int] = field(default_factory=dict)


def check_write_schema(names: list[str], topic_option: str | None) -> None:
    """Raises MagnetarSparkError: no `value` column, no topic, or unknown columns."""
    if "value" not in names:
        raise MagnetarSparkError("the magnetar sink needs a 'value' column")
    if topic_option is None and "topic" not in names:
        raise MagnetarSparkError("option topic is required (or a 'topic' column)")
    unknown = sorted(set(names) - _COLUMNS)
    if unknown:
        raise MagnetarSparkError(f"the magnetar sink does not know the column(s) {unknown}; it "
                                 f"takes {sorted(_COLUMNS)}")


def _bytes(value: Any, column: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise MagnetarSparkError(f"column {column}: {type(value).__name__} is not binary or string")


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        raise MagnetarSparkError("column key: message keys must be UTF-8 text") from None


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    raise MagnetarSparkError(f"column eventTime: {type(value).__name__} is not a timestamp")


class Publisher:
    """One task's producers (see the module comment)."""

    def __init__(self, endpoints: Endpoints, topic_option: str | None, name: str,
                 first_sequence: int, deduplication: bool):
        self.endpoints = endpoints
        self.topic_option = topic_option
        self.name = name
        self.sequence = first_sequence
        self.deduplication = deduplication
        self.client: magnetar.Client = connect(endpoints)
        self.producers: dict[str, magnetar.Producer] = {}
        self.errors: list[BaseException] = []
        self.commit = WriteCommit(int(name.rsplit("-", 1)[1]))
        self.topics: dict[str | None, str] = {}  # topic column value -> complete name

    def _producer(self, topic: str) -> magnetar.Producer:
        import magnetar

        producer = self.producers.get(topic)
        if producer is not None:
            return producer
        if self.deduplication and self.topic_option is None:
            enable_deduplication(self.endpoints, topic)  # idempotent; the option's: on driver
        deadline = time.monotonic() + PRODUCER_BUSY_WAIT_S
        while True:
            try:
                producer = self.client.create_producer(
                    topic, producer_name=self.name, batching_enabled=True,
                    batching_max_publish_delay_ms=5, block_if_queue_full=True,
                    max_pending_messages=5000)
                break
            except magnetar.ProducerBusy:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the failed attempt's producer is being closed
        self.producers[topic] = producer
        return producer

    def _done(self, result: Result, _message_id: Any) -> None:
        if result != Result.Ok:
            self.errors.append(RuntimeError(f"a send failed: {result.name}"))

    def _topic(self, name: str | None) -> str:
        topic = self.topics.get(name)
        if topic is None:
            if not name:
                raise MagnetarSparkError("a row has no topic (column topic is null, no option)")
            topic = self.topics[name] = complete(name)
        return topic

    def publish_columns(self, columns: Mapping[str, list[Any]], rows: int) -> None:
        """Publish `rows` rows given as one list per column (the sink's columns, see the
        module comment), in order.

        Raises:
            MagnetarSparkError: a value of the wrong type, a row without a topic, or a key
                that is not UTF-8 (rows before it were queued).
        """
        from magnetar._producer import OutMessage

        values = columns["value"]
        keys = columns.get("key")
        properties = columns.get("properties")
        event_times = columns.get("eventTime")
        topics = columns.get("topic") if self.topic_option is None else None
        done = self._done
        sequence = self.sequence
        fixed = None if topics is not None else self._producer(self._topic(self.topic_option))
        send = fixed._sender.send_async if fixed is not None else None
        for i in range(rows):
            value = values[i]
            if value is not None and type(value) is not bytes:
                value = _bytes(value, "value")
            key = None if keys is None else _key_text(_bytes(keys[i], "key"))
            props = EMPTY_PROPERTIES if properties is None else _properties(properties[i])
            event = 0 if event_times is None else _millis(event_times[i]) or 0
            message = OutMessage(value, props, key, None, event, sequence)
            if send is not None:
                send(message, done)
            else:
                assert topics is not None
                topic = self._topic(topics[i])
                self._producer(topic)._sender.send_async(message, done)
                self.commit.rows[topic] = self.commit.rows.get(topic, 0) + 1
            sequence += 1
        if fixed is not None:
            topic = self._topic(self.topic_option)
            self.commit.rows[topic] = self.commit.rows.get(topic, 0) + rows
        self.sequence = sequence
        if self.errors:
            raise self.errors[0]

    def finish(self) -> WriteCommit:
        """Flush and close; raises the first publish error."""
        try:
            for producer in self.producers.values():
                producer.flush()
            if self.errors:
                raise self.errors[0]
            return self.commit
        finally:
            self.client.close()


def task_identity(streaming: bool, write_id: str) -> tuple[str, int]:
    """(producer name, first sequence id) of the running task (see the module comment)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    if not streaming:
        return f"spark-{write_id}-{partition}", 0
    query = context.getLocalProperty("sql.streaming.queryId") if context else None
    batch = context.getLocalProperty("streaming.sql.batchId") if context else None
    if query is None or batch is None:
        log.warning("no streaming query/batch id in the task: a replay may publish twice")
        return f"spark-{write_id}-{partition}", 0
    return f"spark-{query}-{partition}", int(batch) << SEQUENCE_BATCH_SHIFT


def column_chunks(iterator: Iterator[Any]) -> Iterator[tuple[dict[str, list[Any]], int]]:
    """Spark's Arrow record batches, or its Rows in chunks of `ROWS_PER_CHUNK`, as one list
    per column and the number of rows."""
    rows: list[Any] = []
    try:
        for item in iterator:
            if hasattr(item, "to_pylist"):
                yield {name: item.column(i).to_pylist()
                       for i, name in enumerate(item.schema.names)}, item.num_rows
                continue
            rows.append(item)
            if len(rows) >= ROWS_PER_CHUNK:
                yield _row_columns(rows), len(rows)
                rows = []
    except Exception:
        if rows:  # what the task computed before it failed is published, as row by row
            yield _row_columns(rows), len(rows)
        raise
    if rows:
        yield _row_columns(rows), len(rows)


def _row_columns(rows: list[Any]) -> dict[str, list[Any]]:
    dicts = [row.asDict() for row in rows]
    return {name: [row.get(name) for row in dicts] for name in dicts[0]}


def _properties(value: Any) -> Mapping[str, str]:
    """A properties cell: a dict (Rows), a list of pairs (Arrow) or null."""
    if not value:
        return EMPTY_PROPERTIES
    items = value.items() if isinstance(value, dict) else value
    out: dict[str, str] = {}
    for key, item in items:
        if not isinstance(key, str) or not isinstance(item, str):
            raise MagnetarSparkError(f"column properties: {key!r}: {item!r} is not string to "
                                     f"string")
        out[key] = item
    return out


def new_write_id() -> str:
    return uuid.uuid4().hex[:12]
