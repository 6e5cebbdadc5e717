"""`Message`: one received message, with the official client's accessor methods.

A delivered entry -- one message, or a batch of many -- becomes one `Received` (what its
messages share: the entry's ids, topic, publish time, producer, redelivery count, the consumer
that received it) and one light `Message` per message holding that and the message's own part
(codec's `SingleMessage`). A batch message's `MessageId` is built only when asked for
(`codec_id`, `message_id()`): acknowledging through the `Message` never needs it.

Lazy messages: a batch of bare bodies (`codec.plain_batch_starts`) is queued without being
decoded -- each `Message` holds its entry, its batch index and where it starts in the batch
payload the entry keeps (`Received.payload`), and decodes its own part the first time an
accessor needs it (`_single`), on whichever thread asks. Until then it shares the batch's
bytes with the entry's other messages (as the official client's messages share their batch's
buffer): one message kept keeps its whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from magnetar.codec import MessageId, SingleMessage, plain_batch_message

from ._message_id import MessageId as ClientMessageId
from ._message_id import trusted_id

__all__ = ["Message", "Received", "lazy_messages"]


class Received:
    """What the messages of one delivered entry share. `message_id` is the id of a
    non-batched entry's one message (for a chunked message, the id naming every chunk);
    None for a batch, whose messages' ids carry their batch index. `generation` is the
    owner's (`TopicConsumer.generation`) when the entry arrived: once the owner's has moved
    (a broker close, a redelivery of everything), its messages not read yet are stale -- a
    read-ahead skips them, the broker sends them again."""

    __slots__ = ("batch_size", "chunk_ids", "entry_id", "first_sequence_id", "generation",
                 "ledger_id", "message_id", "owner", "partition", "payload", "producer_name",
                 "publish_time", "redelivery_count", "topic")

    def __init__(self, ledger_id: int, entry_id: int, partition: int, batch_size: int,
                 message_id: MessageId | None, topic: str, publish_time: int,
                 producer_name: str, redelivery_count: int, owner: Any,
                 chunk_ids: tuple[MessageId, ...] = (), generation: int = 0,
                 payload: bytes | None = None, first_sequence_id: int | None = None):
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.partition = partition
        self.batch_size = batch_size
        self.message_id = message_id
        self.topic = topic
        self.publish_time = publish_time
        self.producer_name = producer_name
        self.redelivery_count = redelivery_count
        self.owner = owner
        self.chunk_ids = chunk_ids
        self.generation = generation
        # A lazy batch's payload and sequence id (see the module comment); else None.
        self.payload = payload
        self.first_sequence_id = first_sequence_id


_new = object.__new__


def batch_indexes(messages: list[Message]) -> list[int]:
    """The batch index of each message (`Message.batch_index`, in one call)."""
    return [message._index for message in messages]


def received_message(entry: Received, single: SingleMessage) -> Message:
    """One message of `entry`, decoded already (no checks, no id yet)."""
    message = _new(Message)
    message._entry = entry
    message._decoded = single
    message._index = single.batch_index
    message._id = entry.message_id
    return message


def lazy_messages(entry: Received, starts: list[int]) -> list[Message]:
    """The messages of a plain batch (`entry.payload`; message i starts at `starts[i]`),
    decoded when asked for (see the module comment; the hot path: no checks, no id yet)."""
    out: list[Message] = []
    append = out.append
    for index, start in enumerate(starts):
        message = _new(Message)
        message._entry = entry
        message._decoded = None
        message._index = index
        message._at = start
        message._id = None
        append(message)
    return out


class Message:
    """A message as `receive()` and `read_next()` return it.

    The accessors are methods, as in the official client (`msg.data()`, `msg.properties()`).
    `owner` (internal) is the per-topic consumer that received it, so an ack finds its way back
    on multi-topic and partitioned consumers; `chunk_ids` lists every chunk of a chunked message.
    """

    __slots__ = ("_at", "_decoded", "_entry", "_id", "_index")

    def __init__(self, *, payload: bytes | None, message_id: MessageId, topic: str,
                 properties: Mapping[str, str], partition_key: str | None,
                 ordering_key: bytes | None, publish_time: int, event_time: int,
                 redelivery_count: int, producer_name: str, owner: Any = None,
                 chunk_ids: tuple[MessageId, ...] = ()):
        self._entry = Received(message_id.ledger_id, message_id.entry_id, message_id.partition,
                               message_id.batch_size, message_id, topic, publish_time,
                               producer_name, redelivery_count, owner, chunk_ids)
        self._decoded: SingleMessage | None = SingleMessage(
            payload=payload, properties=properties, partition_key=partition_key,
            ordering_key=ordering_key, event_time=event_time, batch_index=message_id.batch_index)
        self._index = message_id.batch_index
        self._at = -1  # where a lazy message starts in its entry's payload
        self._id: MessageId | None = message_id

    @property
    def _single(self) -> SingleMessage:
        """The message's own part, decoded now if it was not (a lazy message's)."""
        single = self._decoded
        if single is None:
            entry = self._entry
            assert entry.payload is not None
            single = self._decoded = plain_batch_message(entry.payload, self._at, self._index,
                                                         entry.first_sequence_id)
        return single

    def data(self) -> bytes:
        """The body; b"" for a null value (see `has_null_value`)."""
        return self._single.payload or b""

    def value(self) -> bytes:
        """The body (bytes schema only, in this client)."""
        return self.data()

    def has_null_value(self) -> bool:
        return self._single.payload is None

    def properties(self) -> dict[str, str]:
        return dict(self._single.properties)

    def partition_key(self) -> str:
        """The key; "" when the message has none (as the official client answers)."""
        return self._single.partition_key or ""

    def ordering_key(self) -> str:
        return (self._single.ordering_key or b"").decode("utf-8", "replace")

    def publish_timestamp(self) -> int:
        return self._entry.publish_time

    def event_timestamp(self) -> int:
        return self._single.event_time

    def message_id(self) -> ClientMessageId:
        """The id, as the official client shapes it (`ledger_id()`, `serialize()`, ...)."""
        return ClientMessageId.wrap(self.codec_id)

    @property
    def codec_id(self) -> MessageId:
        """The id as the client core and the codec handle it (internal)."""
        made = self._id
        if made is None:
            entry = self._entry
            made = self._id = trusted_id(entry.ledger_id, entry.entry_id, entry.partition,
                                         self._index, entry.batch_size)
        return made

    @property
    def owner(self) -> Any:
        return self._entry.owner

    @property
    def chunk_ids(self) -> tuple[MessageId, ...]:
        return self._entry.chunk_ids

    @property
    def received(self) -> Received:
        """What this message shares with the rest of its entry (internal)."""
        return self._entry

    @property
    def batch_index(self) -> int:
        """The index in its batch; -1 when not batched (internal)."""
        return self._index

    # What the Spark source reads directly (None where the accessors answer "" or 0).
    @property
    def _payload(self) -> bytes | None:
        return self._single.payload

    @property
    def _key(self) -> str | None:
        return self._single.partition_key

    @property
    def _publish_time(self) -> int:
        return self._entry.publish_time

    @property
    def _event_time(self) -> int:
        return self._single.event_time

    @property
    def _properties(self) -> Mapping[str, str]:
        return self._single.properties

    @property
    def _producer(self) -> str:
        return self._entry.producer_name

    def topic_name(self) -> str:
        return self._entry.topic

    def redelivery_count(self) -> int:
        return self._entry.redelivery_count

    def producer_name(self) -> str:
        return self._entry.producer_name

    def __repr__(self) -> str:
        return f"Message({self.codec_id}, {self._entry.topic}, {len(self.data())} bytes)"
