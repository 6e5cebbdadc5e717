"""`Message`: one received message, with the official client's accessor methods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from magnetar.codec import MessageId

from ._message_id import MessageId as ClientMessageId

__all__ = ["Message"]


class Message:
    """A message as `receive()` and `read_next()` return it.

    The accessors are methods, as in the official client (`msg.data()`, `msg.properties()`).
    `owner` (internal) is the per-topic consumer that received it, so an ack finds its way back
    on multi-topic and partitioned consumers; `chunk_ids` lists every chunk of a chunked message.
    """

    __slots__ = ("_event_time", "_id", "_key", "_ordering_key", "_payload", "_producer",
                 "_properties", "_publish_time", "_redelivery_count", "_topic", "chunk_ids",
                 "owner")

    def __init__(self, *, payload: bytes | None, message_id: MessageId, topic: str,
                 properties: Mapping[str, str], partition_key: str | None,
                 ordering_key: bytes | None, publish_time: int, event_time: int,
                 redelivery_count: int, producer_name: str, owner: Any = None,
                 chunk_ids: tuple[MessageId, ...] = ()):
        self._payload = payload
        self._id = message_id
        self._topic = topic
        self._properties = properties
        self._key = partition_key
        self._ordering_key = ordering_key
        self._publish_time = publish_time
        self._event_time = event_time
        self._redelivery_count = redelivery_count
        self._producer = producer_name
        self.owner = owner
        self.chunk_ids = chunk_ids

    def data(self) -> bytes:
        """The body; b"" for a null value (see `has_null_value`)."""
        return self._payload or b""

    def value(self) -> bytes:
        """The body (bytes schema only, in this client)."""
        return self.data()

    def has_null_value(self) -> bool:
        return self._payload is None

    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    def partition_key(self) -> str:
        """The key; "" when the message has none (as the official client answers)."""
        return self._key or ""

    def ordering_key(self) -> str:
        return (self._ordering_key or b"").decode("utf-8", "replace")

    def publish_timestamp(self) -> int:
        return self._publish_time

    def event_timestamp(self) -> int:
        return self._event_time

    def message_id(self) -> ClientMessageId:
        """The id, as the official client shapes it (`ledger_id()`, `serialize()`, ...)."""
        return ClientMessageId.wrap(self._id)

    @property
    def codec_id(self) -> MessageId:
        """The id as the client core and the codec handle it (internal)."""
        return self._id

    def topic_name(self) -> str:
        return self._topic

    def redelivery_count(self) -> int:
        return self._redelivery_count

    def producer_name(self) -> str:
        return self._producer

    def __repr__(self) -> str:
        return f"Message({self._id}, {self._topic}, {len(self.data())} bytes)"
