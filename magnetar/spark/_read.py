"""Reading: the row schema, one topic-partition range read into Arrow record batches, and
the batch (`spark.read`) reader's planning.

A `RangePartition` is `(start, end]` of one topic-partition (see `_options.py` for positions).
`read_range` opens a reader at the start entry (inclusive), skips what is not after `start`,
and stops at the first message past `end`: the same range gives the same rows every time,
which is what a streaming replay needs. A range whose end cannot be reached (the data was
deleted, or the topic) is data loss: an error naming `failOnDataLoss`, or with it false a
logged warning and the rows that are there. So is a start entry that is no longer stored.

Planning (`plan_ranges`) splits each topic-partition's range by ledger when the admin API lists
the ledgers (our broker, or a Pulsar one given `adminUrl`), so a large topic reads in parallel;
otherwise one range per topic-partition.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._broker import ledgers, partition_index
from ._host import Endpoints
from ._options import EARLIEST, MagnetarSparkError, Position

if TYPE_CHECKING:
    import pyarrow

    import magnetar

__all__ = ["SCHEMA", "RangePartition", "plan_ranges", "read_arrow", "read_range"]

log = logging.getLogger(__name__)

SCHEMA = ("key binary, value binary, topic string, partition int, messageId string, "
          "publishTime timestamp, eventTime timestamp, properties map<string,string>, "
          "producerName string")
ROWS_PER_BATCH_MAX = 8192  # rows in one Arrow record batch handed to Spark
RECEIVE_MAX = 1000  # messages one receive round trip takes from the reader's queue
WAIT_SLICE_MS = 1000  # a receive waits this long before asking whether more is stored


@dataclass(frozen=True)
class RangePartition:
    """One Spark input partition: `(start, end]` of one topic-partition."""

    topic: str
    start: Position
    end: Position
    endpoints: Endpoints
    fail_on_data_loss: bool
    poll_timeout_ms: int


def plan_ranges(endpoints: Endpoints, topic: str, start: Position, end: Position,
                fail_on_data_loss: bool, poll_timeout_ms: int) -> list[RangePartition]:
    """`(start, end]` of one topic-partition, split at ledger boundaries where known."""
    if end.key() <= start.key():
        return []
    listing = ledgers(endpoints, topic)
    pieces: list[tuple[Position, Position]] = []
    if listing:
        for ledger, entries in listing:
            if entries <= 0:
                continue
            low = max(start, Position(ledger, -1, -1), key=Position.key)
            high = min(end, Position(ledger, entries - 1, -1), key=Position.key)
            if low.key() < high.key():
                pieces.append((low, high))
        covered_from = min((p[0] for p in pieces), key=Position.key, default=None)
        if covered_from is None or (covered_from.key() > start.key() and start != EARLIEST):
            pieces = []  # the start is before the listed ledgers: one range reports the loss
    if not pieces:
        pieces = [(start, end)]
    return [RangePartition(topic, low, high, endpoints, fail_on_data_loss, poll_timeout_ms)
            for low, high in pieces]


def _key(message: magnetar.Message) -> tuple[int, int, int]:
    mid = message.codec_id
    return Position(mid.ledger_id, mid.entry_id, mid.batch_index).key()


def _loss(part: RangePartition, what: str) -> None:
    text = (f"data loss on {part.topic} in ({part.start}, {part.end}]: {what} (set option "
            f"failOnDataLoss=false to skip what is gone)")
    if part.fail_on_data_loss:
        raise MagnetarSparkError(text)
    log.warning("%s; skipped", text)


def read_range(client: magnetar.Client,
               part: RangePartition) -> Generator[magnetar.Message, None, None]:
    """The messages of `(part.start, part.end]`, in order (see the module comment).

    Raises:
        MagnetarSparkError: data loss with failOnDataLoss (the message says which range).
    """
    import magnetar

    start, end = part.start, part.end
    if end.key() <= start.key():
        return
    if start.ledger < 0:
        first = magnetar.MessageId.earliest
    else:
        first = magnetar.MessageId(ledger_id=start.ledger, entry_id=max(start.entry, 0))
    reader = client.create_reader(part.topic, first, start_message_id_inclusive=True,
                                  receiver_queue_size=RECEIVE_MAX)
    group = reader._group
    checked = start.entry < 0
    waited_ms = 0
    try:
        while True:
            try:
                batch = client._run(group.receive_some(WAIT_SLICE_MS, RECEIVE_MAX))
            except magnetar.Timeout:
                waited_ms += WAIT_SLICE_MS
                if not reader.has_message_available() or waited_ms >= part.poll_timeout_ms:
                    _loss(part, "the end of the range is not stored")
                    return
                continue
            waited_ms = 0
            for message, _generation in batch:
                mid = message.codec_id
                if not checked:
                    checked = True
                    if (mid.ledger_id, mid.entry_id) > (start.ledger, start.entry):
                        _loss(part, f"the start entry is gone (first stored: "
                                    f"{mid.ledger_id}:{mid.entry_id})")
                key = _key(message)
                if key > end.key():
                    return
                if key > start.key():
                    yield message
                if key == end.key():
                    return
    finally:
        reader.close()


def _arrow_schema() -> pyarrow.Schema:
    import pyarrow as pa

    return pa.schema([
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
        ("partition", pa.int32()), ("messageId", pa.string()),
        ("publishTime", pa.timestamp("us", tz="UTC")),
        ("eventTime", pa.timestamp("us", tz="UTC")),
        ("properties", pa.map_(pa.string(), pa.string())), ("producerName", pa.string())])


def _batch(schema: pyarrow.Schema, columns: list[list[Any]]) -> pyarrow.RecordBatch:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, schema,
                                                                     strict=True)],
        schema=schema)


def read_arrow(part: RangePartition) -> Iterator[pyarrow.RecordBatch]:
    """`read_range` as Arrow record batches of the row schema (`SCHEMA`)."""
    from ._broker import connect

    schema = _arrow_schema()
    index = partition_index(part.topic)
    client = connect(part.endpoints)
    try:
        columns: list[list[Any]] = [[] for _ in schema]
        key, value, topic, partition, mid, publish, event, props, producer = columns
        for message in read_range(client, part):
            m = message.codec_id
            key.append(message._key.encode() if message._key is not None else None)
            value.append(message._payload)
            topic.append(part.topic)
            partition.append(index)
            mid.append(f"{m.ledger_id}:{m.entry_id}:{m.batch_index}")
            publish.append(message._publish_time * 1000)
            event.append(message._event_time * 1000 if message._event_time else None)
            props.append(list(message._properties.items()))
            producer.append(message._producer)
            if len(key) >= ROWS_PER_BATCH_MAX:
                yield _batch(schema, columns)
                for column in columns:
                    column.clear()
        if key:
            yield _batch(schema, columns)
    finally:
        client.close()
