"""A stored entry as the dispatchers see it: position, bytes, and the facts they need from its
MessageMetadata (batch size, sticky-key slot, deliver-at time, tags, publish time).

Parsing metadata costs a protobuf decode, so `EntryInfo` parses once, when first asked, and
remembers the answers. Tags follow the TDMQ convention: a message property whose value is
"TAGS" names a tag.
"""

from __future__ import annotations

from codec import parse_entry
from codec._proto import pulsar_api_pb2 as pb

from ._position import Position

__all__ = ["TAG_VALUE", "EntryInfo"]

TAG_VALUE = "TAGS"


class EntryInfo:
    """One entry read from a managed ledger."""

    __slots__ = ("_metadata", "data", "position", "slot")

    def __init__(self, position: Position, data: bytes):
        self.position = position
        self.data = data
        self._metadata: pb.MessageMetadata | None = None
        self.slot = 0  # the Key_Shared sticky-key slot, computed by the dispatcher

    @property
    def metadata(self) -> pb.MessageMetadata:
        if self._metadata is None:
            try:
                self._metadata = parse_entry(self.data, verify_checksum=False).metadata
            except Exception:  # a stored entry we cannot parse: dispatch it as opaque
                self._metadata = pb.MessageMetadata(producer_name="", sequence_id=0,
                                                    publish_time=0)
        return self._metadata

    @property
    def batch_size(self) -> int:
        metadata = self.metadata
        if metadata.HasField("num_messages_in_batch"):
            return max(1, metadata.num_messages_in_batch)
        return 1

    @property
    def deliver_at(self) -> int | None:
        metadata = self.metadata
        return metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None

    @property
    def publish_time(self) -> int:
        return int(self.metadata.publish_time)

    def tags(self) -> set[str]:
        return {p.key for p in self.metadata.properties if p.value == TAG_VALUE}
