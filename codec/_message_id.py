"""Message ids: `(ledger_id, entry_id, partition, batch_index)`, ordered and printed like Pulsar.

Theory of operation
-------------------

An entry's position in a topic is `(ledger_id, entry_id)`. A message id adds the partition index
of the topic (-1 for a non-partitioned topic) and the message's index inside a batch entry (-1 for
a message that is not batched). A chunked message spans several entries; its id is the id of its
*last* chunk plus a reference to its *first* chunk.

Ordering follows the Java client (`MessageIdImpl.compareTo`): ledger, then entry, then partition,
then batch index, all compared as signed integers, so `earliest` (-1, -1) sorts before every real
id and `latest` (2**63-1, 2**63-1) after. Equality and hashing use the same four fields, so a
chunk id equals the plain id of its last chunk, and `batch_size` never takes part.

String forms:

| form                 | non-batched         | batched                    | chunked          |
|----------------------|---------------------|----------------------------|------------------|
| Java (`str()`)       | `7:3:-1`            | `7:3:-1:2`                 | `first;last`     |
| C++/Python client    | `(7,3,-1,-1)`       | `(7,3,-1,2)`               | `(first);(last)` |

Serialized form: a `MessageIdData` protobuf, written exactly as the official Python client's
`MessageId.serialize()` (C++ client 4.2.0) writes it:

| field                      | # | written when                                              |
|----------------------------|---|-----------------------------------------------------------|
| ledgerId                   | 1 | always (uint64; -1 becomes 2**64-1, a 10-byte varint)     |
| entryId                    | 2 | always (same)                                             |
| partition                  | 3 | partition != -1                                           |
| batch_index                | 4 | batch_index != -1, and the id is not a chunk id           |
| batch_size                 | 6 | batch_size != 0, and the id is not a chunk id             |
| first_chunk_message_id     | 7 | chunk ids: ledgerId, entryId, and partition when the      |
|                            |   | *last* chunk's partition != -1 (the C++ client's rule)    |
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Final

from ._errors import RemoteProtocolError
from ._proto import pulsar_api_pb2 as pb
from ._wire import parse_message

__all__ = ["EARLIEST", "LATEST", "MessageId"]

INT64_MAX: Final = (1 << 63) - 1
INT32_MIN: Final = -(1 << 31)
INT32_MAX: Final = (1 << 31) - 1
UINT64_MASK: Final = (1 << 64) - 1


def _to_int64(value: int) -> int:
    """Reinterpret a uint64 from the wire as the signed long Pulsar means."""
    return value - (1 << 64) if value > INT64_MAX else value


@dataclass(frozen=True, slots=True, eq=False)
class MessageId:
    """The id of one message; immutable, ordered and hashable the way Pulsar orders ids.

    Attributes:
        ledger_id: the ledger of the entry (-1 for `earliest`).
        entry_id: the entry inside the ledger (-1 for `earliest`).
        partition: the partition index, or -1 for a non-partitioned topic.
        batch_index: the index inside a batch entry, or -1 for a non-batched message.
        batch_size: the number of messages in the batch, or 0 when unknown (kept for
            serialization only; not part of equality or ordering).
        first_chunk: for a chunked message, the id of its first chunk (this id is the last's).
    """

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1
    batch_size: int = 0
    first_chunk: MessageId | None = None
    # The official client's `MessageId.earliest` / `.latest` (set below, to EARLIEST, LATEST).
    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def __post_init__(self) -> None:
        for name in ("ledger_id", "entry_id"):
            value = getattr(self, name)
            if not -(1 << 63) <= value <= INT64_MAX:
                raise ValueError(f"{name} {value} does not fit a signed 64-bit integer")
        for name in ("partition", "batch_index", "batch_size"):
            value = getattr(self, name)
            if not INT32_MIN <= value <= INT32_MAX:
                raise ValueError(f"{name} {value} does not fit a signed 32-bit integer")
        if self.first_chunk is not None and self.first_chunk.first_chunk is not None:
            raise ValueError("the first chunk of a chunked message id cannot itself be chunked")

    # -- ordering ---------------------------------------------------------------------------

    def _key(self) -> tuple[int, int, int, int]:
        return (self.ledger_id, self.entry_id, self.partition, self.batch_index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: MessageId) -> bool:
        return self._key() < other._key()

    def __le__(self, other: MessageId) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: MessageId) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: MessageId) -> bool:
        return self._key() >= other._key()

    # -- views ------------------------------------------------------------------------------

    @property
    def is_chunk(self) -> bool:
        """Whether this is the id of a chunked message (it has a first chunk)."""
        return self.first_chunk is not None

    def entry(self) -> MessageId:
        """This id without batch index, batch size or chunk reference: its entry's position."""
        return MessageId(self.ledger_id, self.entry_id, self.partition)

    # -- strings ----------------------------------------------------------------------------

    def __str__(self) -> str:
        """The Java client's form: `ledger:entry:partition[:batch]`, chunks as `first;last`."""
        text = f"{self.ledger_id}:{self.entry_id}:{self.partition}"
        if self.batch_index != -1:
            text += f":{self.batch_index}"
        if self.first_chunk is not None:
            return f"{self.first_chunk};{text}"
        return text

    def to_cpp_string(self) -> str:
        """The C++ and Python clients' form: `(ledger,entry,partition,batch)`, chunks `(a);(b)`."""
        text = f"({self.ledger_id},{self.entry_id},{self.partition},{self.batch_index})"
        if self.first_chunk is not None:
            return f"{self.first_chunk.to_cpp_string()};{text}"
        return text

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """Parse either string form (Java's or the C++ client's), chunk ids included.

        Raises:
            RemoteProtocolError: the text is neither form.
        """
        parts = text.split(";")
        if len(parts) > 2:
            raise RemoteProtocolError(f"not a message id: {text!r}")
        ids = [_parse_one(part, text) for part in parts]
        if len(ids) == 1:
            return ids[0]
        first, last = ids
        return cls(
            last.ledger_id,
            last.entry_id,
            last.partition,
            last.batch_index,
            last.batch_size,
            first_chunk=first,
        )

    # -- protobuf ---------------------------------------------------------------------------

    def to_proto(self) -> pb.MessageIdData:
        """A `MessageIdData` carrying every field that is not at its "none" value."""
        data = pb.MessageIdData(
            ledgerId=self.ledger_id & UINT64_MASK, entryId=self.entry_id & UINT64_MASK
        )
        if self.partition != -1:
            data.partition = self.partition
        if self.batch_index != -1:
            data.batch_index = self.batch_index
        if self.batch_size != 0:
            data.batch_size = self.batch_size
        if self.first_chunk is not None:
            data.first_chunk_message_id.CopyFrom(self.first_chunk.to_proto())
        return data

    @classmethod
    def from_proto(cls, data: pb.MessageIdData) -> MessageId:
        """Build an id from a parsed `MessageIdData` (ledger and entry read as signed longs).

        Raises:
            RemoteProtocolError: the first chunk is itself a chunk id.
        """
        first = None
        if data.HasField("first_chunk_message_id"):
            inner = data.first_chunk_message_id
            if inner.HasField("first_chunk_message_id"):
                raise RemoteProtocolError("nested first_chunk_message_id")
            first = cls(
                _to_int64(inner.ledgerId),
                _to_int64(inner.entryId),
                inner.partition,
                inner.batch_index,
                inner.batch_size,
            )
        return cls(
            _to_int64(data.ledgerId),
            _to_int64(data.entryId),
            data.partition,
            data.batch_index,
            data.batch_size,
            first_chunk=first,
        )

    def serialize(self) -> bytes:
        """The bytes `pulsar.MessageId.serialize()` of the official Python client produces."""
        data = pb.MessageIdData(
            ledgerId=self.ledger_id & UINT64_MASK, entryId=self.entry_id & UINT64_MASK
        )
        if self.partition != -1:
            data.partition = self.partition
        first = self.first_chunk
        if first is None:
            if self.batch_index != -1:
                data.batch_index = self.batch_index
            if self.batch_size != 0:
                data.batch_size = self.batch_size
        else:
            inner = data.first_chunk_message_id
            inner.ledgerId = first.ledger_id & UINT64_MASK
            inner.entryId = first.entry_id & UINT64_MASK
            if self.partition != -1:
                inner.partition = first.partition
        return data.SerializeToString()

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        """Parse bytes from `serialize()`, from the official clients, or from Java's
        `toByteArray()` (which also writes `batch_size = 0`).

        Raises:
            RemoteProtocolError: the bytes are not a complete `MessageIdData`.
        """
        return cls.from_proto(parse_message(pb.MessageIdData, data, "MessageIdData"))


EARLIEST: Final = MessageId(-1, -1)
LATEST: Final = MessageId(INT64_MAX, INT64_MAX)
MessageId.earliest = EARLIEST
MessageId.latest = LATEST

_JAVA_FORM: Final = re.compile(r"(-?\d+):(-?\d+):(-?\d+)(?::(-?\d+))?")
_CPP_FORM: Final = re.compile(r"\((-?\d+),(-?\d+),(-?\d+),(-?\d+)\)")


def _parse_one(part: str, text: str) -> MessageId:
    match = _JAVA_FORM.fullmatch(part) or _CPP_FORM.fullmatch(part)
    if match is None:
        raise RemoteProtocolError(f"not a message id: {text!r}")
    ledger, entry, partition, batch = match.groups()
    try:
        return MessageId(
            int(ledger), int(entry), int(partition), -1 if batch is None else int(batch)
        )
    except ValueError as exc:
        raise RemoteProtocolError(f"message id out of range in {text!r}: {exc}") from None
