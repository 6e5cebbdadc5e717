"""Reading: the row schema, one topic-partition range read into Arrow record batches, and
the batch (`spark.read`) reader's planning.

A `RangePartition` is `(start, end]` of one topic-partition (see `_options.py` for positions).
`read_arrow` reads it from whole entries (`_entries.EntryStream`: a non-durable subscription
from the start entry, inclusive) and decodes each entry's messages into Arrow columns in bulk
(`_columns.py`), keeping of the first and last entries only the batch indexes inside the
range; it stops at the end entry, so the same range gives the same rows every time, which is
what a streaming replay needs. The broker dispatches only confirmed entries, so a range is
never read past the last confirmed entry while producers write. A chunked message is left to
the client's reader (`read_range`, which reassembles chunks) from that entry on.

A range whose end cannot be reached (the data was deleted, or the topic) is data loss: an
error naming `failOnDataLoss`, or with it false a logged warning and the rows that are there.
So is a start entry that is no longer stored.

Planning (`plan_ranges`) splits each topic-partition's range by ledger when the admin API lists
the ledgers (our broker, or a Pulsar one given `adminUrl`), and within ledgers into at least
`pieces_min` ranges of about equal entry counts (option `minPartitions`, default the driver's
default parallelism), so a large topic reads in parallel; without a ledger listing, one range
per topic-partition.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._broker import ledgers, partition_index
from ._columns import Columns, arrow_schema
from ._entries import EntryStream, StreamClosed
from ._host import Endpoints
from ._options import BATCH_ALL, EARLIEST, MagnetarSparkError, Position

if TYPE_CHECKING:
    import pyarrow

    import magnetar

__all__ = ["SCHEMA", "RangePartition", "plan_ranges", "read_arrow", "read_range"]

log = logging.getLogger(__name__)

SCHEMA = ("key binary, value binary, topic string, partition int, messageId string, "
          "publishTime timestamp, eventTime timestamp, properties map<string,string>, "
          "producerName string")
ROWS_PER_BATCH_MAX = 32768  # rows in one Arrow record batch handed to Spark
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


def _split(low: Position, high: Position, entries: int) -> list[tuple[Position, Position]]:
    """`(low, high]` of one ledger cut after every `entries` entries."""
    cuts = [Position(low.ledger, e, -1) for e in range(low.entry + entries, high.entry, entries)]
    bounds = [low, *cuts, high]
    return list(itertools.pairwise(bounds))


def plan_ranges(endpoints: Endpoints, topic: str, start: Position, end: Position,
                fail_on_data_loss: bool, poll_timeout_ms: int,
                pieces_min: int = 1) -> list[RangePartition]:
    """`(start, end]` of one topic-partition, split at ledger boundaries where known, and
    within ledgers into at least `pieces_min` ranges of about equal entry counts."""
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
    elif pieces_min > len(pieces):
        entries = sum(high.entry - low.entry for low, high in pieces)
        step = max(1, -(-entries // pieces_min))
        pieces = [cut for low, high in pieces for cut in _split(low, high, step)]
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


def _message_batches(client: magnetar.Client,
                     part: RangePartition) -> Iterator[pyarrow.RecordBatch]:
    """`read_range` as Arrow record batches: the path for chunked messages."""
    import pyarrow as pa

    schema = arrow_schema()
    index = partition_index(part.topic)
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
            yield pa.RecordBatch.from_arrays(
                [pa.array(v, type=f.type) for v, f in zip(columns, schema, strict=True)],
                schema=schema)
            for column in columns:
                column.clear()
    if key:
        yield pa.RecordBatch.from_arrays(
            [pa.array(v, type=f.type) for v, f in zip(columns, schema, strict=True)],
            schema=schema)


def _bounds(ledger: int, entry: int, batched: bool, start: Position,
            end: Position) -> tuple[int, int]:
    """The batch indexes `[low, high)` of entry `ledger:entry` inside `(start, end]` (a
    non-batched entry: `(0, 1)` when it is inside, else `(0, 0)`)."""
    here = (ledger, entry)
    if not batched:
        inside = start.key() < (ledger, entry, BATCH_ALL) <= end.key()
        return (0, 1) if inside else (0, 0)
    low = 0
    if here == (start.ledger, start.entry):
        low = start.batch + 1 if start.batch >= 0 else BATCH_ALL
    high = BATCH_ALL
    if here == (end.ledger, end.entry) and end.batch >= 0:
        high = end.batch + 1
    return low, high


def _entry_batches(client: magnetar.Client,
                   part: RangePartition) -> Iterator[pyarrow.RecordBatch]:
    """The rows of `(part.start, part.end]` from whole entries (see the module comment).

    Raises:
        MagnetarSparkError: data loss with failOnDataLoss, or an entry that cannot be decoded.
    """
    from magnetar.codec import MessageId, ProtocolError

    start, end = part.start, part.end
    first = MessageId.earliest if start.ledger < 0 else \
        MessageId(start.ledger, max(start.entry, 0))
    stream = EntryStream(client, part.topic, first)
    columns = Columns(part.topic, partition_index(part.topic))
    checked = start.entry < 0
    passed = start  # the last position whose rows are all in `columns` or yielded
    waited_ms = 0
    try:
        while True:
            try:
                incoming = stream.next_entry(WAIT_SLICE_MS / 1000)
            except StreamClosed as exc:
                _loss(part, f"the broker closed the read ({exc})")
                break
            if incoming is None:
                if len(columns):
                    yield columns.take()
                waited_ms += WAIT_SLICE_MS
                if stream.last_stored() < (end.ledger, end.entry) or \
                        waited_ms >= part.poll_timeout_ms:
                    _loss(part, "the end of the range is not stored")
                    break
                continue
            waited_ms = 0
            here = (incoming.ledger_id, incoming.entry_id)
            if not checked:
                checked = True
                if here > (start.ledger, start.entry):
                    _loss(part, f"the start entry is gone (first stored: {here[0]}:{here[1]})")
            if here > (end.ledger, end.entry):
                break
            metadata = incoming.metadata
            if metadata.num_chunks_from_msg > 1:  # reassembled by the client's reader
                if len(columns):
                    yield columns.take()
                yield from _message_batches(client, replace(part, start=passed))
                return
            low, high = _bounds(*here, metadata.HasField("num_messages_in_batch"), start, end)
            try:
                columns.add(*here, metadata, incoming.payload, low, high)
            except ProtocolError as exc:
                raise MagnetarSparkError(f"unreadable entry {here[0]}:{here[1]} on "
                                         f"{part.topic}: {exc}") from None
            passed = Position(*here)
            if len(columns) >= ROWS_PER_BATCH_MAX:
                yield columns.take()
            if here == (end.ledger, end.entry):
                break
        if len(columns):
            yield columns.take()
    finally:
        stream.close()


def read_arrow(part: RangePartition) -> Iterator[pyarrow.RecordBatch]:
    """The rows of one range as Arrow record batches of the row schema (`SCHEMA`)."""
    from ._broker import connect

    if part.end.key() <= part.start.key():
        return
    client = connect(part.endpoints)
    try:
        yield from _entry_batches(client, part)
    finally:
        client.close()
