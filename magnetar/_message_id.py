"""`magnetar.MessageId`: a message's id as the official client shapes it.

The codec's `MessageId` is a dataclass whose fields (`ledger_id`, `entry_id`, ...) are
attributes; the official client's are methods (`ledger_id()`, `entry_id()`, ...), and one name
cannot be both. So the client hands applications this thin wrapper around the codec's id and
unwraps it at the boundary (`codec_id`): the core, the transports and the broker only ever see
the codec's class. Either class is accepted wherever the client takes an id, so code written
against the codec's ids keeps working.

Equality, ordering and hashing are the codec id's (ledger, entry, partition, batch index);
`str()` is the official client's `(ledger,entry,partition,batch)` form.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Final, TypeVar, overload

from magnetar.codec import MessageId as CodecMessageId
from magnetar.codec import RemoteProtocolError

from ._errors import InvalidConfiguration

__all__ = ["MessageId", "codec_id", "trusted_id"]

T = TypeVar("T")
_new = object.__new__


class MessageId:
    """The id of one message (see the module comment)."""

    __slots__ = ("_inner", "_parts", "_topic")
    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def __init__(self, partition: int = -1, ledger_id: int = -1, entry_id: int = -1,
                 batch_index: int = -1):
        """The official constructor's arguments, in its order.

        Raises:
            InvalidConfiguration: a value does not fit the id's integer fields."""
        try:
            self._inner: CodecMessageId | None = CodecMessageId(ledger_id, entry_id, partition,
                                                                batch_index)
        except (TypeError, ValueError) as exc:
            raise InvalidConfiguration(f"bad MessageId: {exc}") from None
        self._parts: tuple[int, int, int, int, int] | None = None
        self._topic: str | None = None

    @classmethod
    def wrap(cls, inner: CodecMessageId | MessageId) -> MessageId:
        """The wrapper of a codec id (a wrapper is returned as it is)."""
        if isinstance(inner, MessageId):
            return inner
        wrapped = _new(cls)
        wrapped._inner = inner
        wrapped._parts = None
        wrapped._topic = None
        return wrapped

    @classmethod
    def of_parts(cls, ledger_id: int, entry_id: int, partition: int, batch_index: int = -1,
                 batch_size: int = 0) -> MessageId:
        """The id of values the client took from a broker's answer (a send receipt), its codec
        id built only once something asks for it (a send callback may never look)."""
        made = _new(cls)
        made._inner = None
        made._parts = (ledger_id, entry_id, partition, batch_index, batch_size)
        made._topic = None
        return made

    @property
    def _id(self) -> CodecMessageId:
        inner = self._inner
        if inner is None:
            assert self._parts is not None
            inner = self._inner = trusted_id(*self._parts)
        return inner

    @property
    def codec(self) -> CodecMessageId:
        """The codec's id this wraps."""
        return self._id

    def ledger_id(self) -> int:
        return self._id.ledger_id

    def entry_id(self) -> int:
        return self._id.entry_id

    def partition(self) -> int:
        return self._id.partition

    def batch_index(self) -> int:
        return self._id.batch_index

    def batch_size(self) -> int:
        return self._id.batch_size

    def topic_name(self) -> str | None:
        """The topic given to `deserialize`, if any."""
        return self._topic

    def serialize(self) -> bytes:
        """The bytes the official client's `serialize()` produces for this id."""
        return self._id.serialize()

    @staticmethod
    def deserialize(data: bytes, topic: str | None = None) -> MessageId:
        """An id from `serialize()` bytes (ours or any official client's).

        Raises:
            InvalidConfiguration: the bytes are not a serialized message id."""
        try:
            wrapped = MessageId.wrap(CodecMessageId.deserialize(bytes(data)))
        except (RemoteProtocolError, TypeError, ValueError) as exc:
            raise InvalidConfiguration(f"not a serialized MessageId: {exc}") from None
        wrapped._topic = topic
        return wrapped

    def _other(self, other: object) -> CodecMessageId | None:
        if isinstance(other, MessageId):
            return other._id
        if isinstance(other, CodecMessageId):
            return other
        return None

    def __eq__(self, other: object) -> bool:
        inner = self._other(other)
        return NotImplemented if inner is None else self._id == inner

    def __hash__(self) -> int:
        return hash(self._id)

    def __lt__(self, other: MessageId | CodecMessageId) -> bool:
        return self._id < codec_id(other)

    def __le__(self, other: MessageId | CodecMessageId) -> bool:
        return self._id <= codec_id(other)

    def __gt__(self, other: MessageId | CodecMessageId) -> bool:
        return self._id > codec_id(other)

    def __ge__(self, other: MessageId | CodecMessageId) -> bool:
        return self._id >= codec_id(other)

    def __str__(self) -> str:
        return self._id.to_cpp_string()

    def __repr__(self) -> str:
        return f"MessageId{self._id.to_cpp_string()}"


MessageId.earliest = MessageId.wrap(CodecMessageId.earliest)
MessageId.latest = MessageId.wrap(CodecMessageId.latest)


@overload
def codec_id(value: MessageId | CodecMessageId) -> CodecMessageId: ...


@overload
def codec_id(value: T) -> T: ...


def codec_id(value: object) -> object:
    """The codec id of a client id; anything else unchanged (for the callers' own checks)."""
    return value._id if isinstance(value, MessageId) else value


_FIELDS: Final = ("ledger_id", "entry_id", "partition", "batch_index", "batch_size",
                  "first_chunk")
assert tuple(f.name for f in dataclasses.fields(CodecMessageId)) == _FIELDS
_SET = tuple(getattr(CodecMessageId, name).__set__ for name in _FIELDS)


def trusted_id(ledger_id: int, entry_id: int, partition: int, batch_index: int = -1,
               batch_size: int = 0) -> CodecMessageId:
    """A codec id built without its range checks, for values the client core took from a
    broker's answer or computed itself (the hot paths: a receipt's or a delivery's ids). Equal
    to `CodecMessageId(...)` of the same values; about a third of its cost."""
    made = _new(CodecMessageId)
    set_ledger, set_entry, set_partition, set_index, set_size, set_first = _SET
    set_ledger(made, ledger_id)
    set_entry(made, entry_id)
    set_partition(made, partition)
    set_index(made, batch_index)
    set_size(made, batch_size)
    set_first(made, None)
    return made
