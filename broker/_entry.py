"""A stored entry as the dispatchers see it: position, bytes, and the facts they need from its
MessageMetadata (batch size, sticky-key slot, deliver-at time, tags, publish time).

An entry stored with broker entry metadata (`_entry_metadata.py`) has its time taken from the
block's `broker_timestamp` (`timestamp`, what seek by time, TTL and the message-age backlog
quota compare), as upstream's `getEntryTimestamp` does; other entries use the producer's
publish time.

Parsing metadata costs a protobuf decode, so `EntryInfo` parses once, when first asked, and
remembers the answers. Tags follow the TDMQ convention: a message property whose value is
"TAGS" names a tag.
"""

from __future__ import annotations

from codec import parse_entry
from codec._proto import pulsar_api_pb2 as pb

from ._position import Position

__all__ = ["TAG_VALUE", "EntryInfo", "messages_in"]

TAG_VALUE = "TAGS"


def messages_in(metadata: pb.MessageMetadata) -> int:
    """How many messages an entry holds (a batch's size, at least 1; else 1)."""
    if metadata.HasField("num_messages_in_batch"):
        return max(1, metadata.num_messages_in_batch)
    return 1


class EntryInfo:
    """One entry read from a managed ledger."""

    __slots__ = ("_broker_timestamp", "_metadata", "data", "position", "slot")

    def __init__(self, position: Position, data: bytes):
        self.position = position
        self.data = data
        self._metadata: pb.MessageMetadata | None = None
        self._broker_timestamp: int | None = None  # from the 0x0e02 block, when it has one
        self.slot = 0  # the Key_Shared sticky-key slot, computed by the dispatcher

    @property
    def metadata(self) -> pb.MessageMetadata:
        if self._metadata is None:
            try:
                parsed = parse_entry(self.data, verify_checksum=False)
                self._metadata = parsed.metadata
                block = parsed.broker_entry_metadata
                if block is not None and block.HasField("broker_timestamp"):
                    self._broker_timestamp = int(block.broker_timestamp)
            except Exception:  # a stored entry we cannot parse: dispatch it as opaque
                self._metadata = pb.MessageMetadata(producer_name="", sequence_id=0,
                                                    publish_time=0)
        return self._metadata

    @property
    def batch_size(self) -> int:
        return messages_in(self.metadata)

    @property
    def deliver_at(self) -> int | None:
        metadata = self.metadata
        return metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None

    @property
    def publish_time(self) -> int:
        return int(self.metadata.publish_time)

    @property
    def timestamp(self) -> int:
        """The broker's timestamp (ms) when the entry carries one, else its publish time."""
        metadata = self.metadata  # parses, and finds the broker timestamp
        if self._broker_timestamp is not None:
            return self._broker_timestamp
        return int(metadata.publish_time)

    def tags(self) -> set[str]:
        return {p.key for p in self.metadata.properties if p.value == TAG_VALUE}
