"""Turning the options into positions: where each topic-partition starts and ends.

Runs where Spark plans (the driver's Python workers): resolves `earliest`/`latest`, JSON
offsets (a topic without a partition suffix applies to all its partitions), `startingTime`
(the position just before the first message published at or after it) and limits a streaming
batch to `maxRecordsPerTrigger` by reading ids forward from the start (exact with batches, and
it works with any broker).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._broker import last_position, partition_index
from ._options import EARLIEST, LATEST, MagnetarSparkError, Position

if TYPE_CHECKING:
    import magnetar

__all__ = ["limit_end", "resolve_position", "time_position"]

TIME_WAIT_MS = 2000  # how long a time lookup waits for the first message after the seek


def _explicit(offsets: dict[str, Position | str], topic: str) -> Position | str | None:
    if topic in offsets:
        return offsets[topic]
    base = topic.rsplit("-partition-", 1)[0] if partition_index(topic) >= 0 else None
    return offsets.get(base) if base else None


def resolve_position(client: magnetar.Client, topic: str,
                     option: str | dict[str, Position | str], default: str,
                     name: str) -> Position:
    """One topic-partition's position for a starting/ending option."""
    value = _explicit(option, topic) if isinstance(option, dict) else option
    if value is None:
        value = default
    if value == "earliest":
        return EARLIEST
    if value == LATEST:
        return last_position(client, topic)
    assert isinstance(value, Position), name
    return value


def check_offsets_topics(option: str | dict[str, Position | str], topics: list[str],
                         name: str) -> None:
    """A JSON offsets option may only name topics being read.

    Raises:
        MagnetarSparkError: it names another topic.
    """
    if not isinstance(option, dict):
        return
    bases = set(topics) | {t.rsplit("-partition-", 1)[0] for t in topics}
    unknown = sorted(set(option) - bases)
    if unknown:
        raise MagnetarSparkError(f"option {name}: {unknown} not among the topics read")


def time_position(client: magnetar.Client, topic: str, time_ms: int) -> Position | None:
    """The position just before the first message published at or after `time_ms` (None when
    there is none yet)."""
    import magnetar

    reader = client.create_reader(topic, magnetar.MessageId.earliest, receiver_queue_size=10)
    try:
        reader.seek(time_ms)
        try:
            first = reader.read_next(TIME_WAIT_MS).codec_id
        except magnetar.Timeout:
            return None
    finally:
        reader.close()
    if first.batch_index > 0:
        return Position(first.ledger_id, first.entry_id, first.batch_index - 1)
    return Position(first.ledger_id, first.entry_id - 1, -1)


def limit_end(client: magnetar.Client, topic: str, start: Position, end: Position,
              rows: int) -> Position:
    """The position `rows` messages after `start`, or `end` when fewer are stored."""
    from ._host import Endpoints
    from ._read import RangePartition, read_range

    if rows <= 0:
        return start
    part = RangePartition(topic, start, end, Endpoints("", None), False, 10_000)
    last, count = start, 0
    messages = read_range(client, part)
    try:
        for message in messages:
            m = message.codec_id
            last, count = Position(m.ledger_id, m.entry_id, m.batch_index), count + 1
            if count >= rows:
                return last
    finally:
        messages.close()
    return end
