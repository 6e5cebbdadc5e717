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
from typing import TYPE_CHECKING, Any

from magnetar import Result

from ._broker import connect, enable_deduplication
from ._host import Endpoints
from ._options import MagnetarSparkError, complete

if TYPE_CHECKING:
    import magnetar

__all__ = ["Publisher", "WriteCommit", "check_write_schema"]

log = logging.getLogger(__name__)

PRODUCER_BUSY_WAIT_S = 30.0  # a failed attempt's producer may still hold the name this long
SEQUENCE_BATCH_SHIFT = 32  # streaming: rows per task per micro-batch < 2**32
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

    def publish(self, row: Mapping[str, Any]) -> None:
        topic = self.topic_option or row.get("topic")
        if not topic:
            raise MagnetarSparkError("a row has no topic (column topic is null, no option)")
        topic = complete(topic)
        key = _bytes(row.get("key"), "key")
        properties = row.get("properties") or {}
        if not isinstance(properties, dict):
            properties = dict(properties)
        self._producer(topic).send_async(
            _bytes(row.get("value"), "value"), self._done, properties=properties,
            partition_key=_key_text(key),
            event_timestamp=_millis(row.get("eventTime")), sequence_id=self.sequence)
        self.sequence += 1
        self.commit.rows[topic] = self.commit.rows.get(topic, 0) + 1
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


def rows_of(iterator: Iterator[Any]) -> Iterator[Mapping[str, Any]]:
    """Spark's Rows or Arrow record batches as mappings."""
    for item in iterator:
        if hasattr(item, "to_pylist"):
            for row in item.to_pylist():
                if isinstance(row.get("properties"), list):
                    row["properties"] = dict(row["properties"])
                yield row
        else:
            yield item.asDict()


def new_write_id() -> str:
    return uuid.uuid4().hex[:12]
