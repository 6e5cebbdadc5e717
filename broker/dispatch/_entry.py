"""A stored entry as the dispatchers see it: position, bytes, and the facts they need from its
MessageMetadata (batch size, sticky-key slot, deliver-at time, tags, publish time).

An entry stored with broker entry metadata (`_entry_metadata.py`) has its time taken from the
block's `broker_timestamp` (`timestamp`, what seek by time, TTL and the message-age backlog
quota compare), as upstream's `getEntryTimestamp` does; other entries use the producer's
publish time.

Parsing metadata costs a protobuf decode, so `EntryInfo` parses once, when first asked, and
remembers the answers; its batch size needs no parse when the metadata's bytes show it cannot
be a batch. Tags follow the TDMQ convention: a message property whose value is
"TAGS" names a tag.

Batch sizes. `num_messages_in_batch` is the client's claim, and the broker does work in
proportion to it (batch-index bitsets, permits, the index interceptor), so a claim is bounded by
what the entry can hold -- every message of a batch takes at least `SINGLE_MESSAGE_BYTES_MIN`
bytes of the (uncompressed) payload -- and by `MESSAGES_IN_BATCH_MAX`. A SEND whose claim breaks
a bound is refused (`batch_count_error`); an entry stored before that check with an absurd claim
is read as holding `messages_in` messages: at least 1, at most what it can hold.
`messages_in` is the one definition of an entry's message count: the publish counters, the
index interceptor, deduplication and the dispatchers (`EntryInfo.batch_size`) all use it
(`messages_in_entry` when they hold the entry's bytes), so they never disagree.
"""

from __future__ import annotations

from typing import Final

from magnetar.codec import (
    RemoteProtocolError,
    entry_payload_bytes,
    holds_one_message,
    parse_entry_metadata,
    pb,
)

from ..ledger._position import Position

__all__ = [
    "MESSAGES_IN_BATCH_MAX",
    "SINGLE_MESSAGE_BYTES_MIN",
    "TAG_VALUE",
    "EntryInfo",
    "batch_capacity",
    "batch_count_error",
    "messages_in",
    "messages_in_entry",
]

TAG_VALUE = "TAGS"
# Each message of a batch payload: a 4-byte size, then a SingleMessageMetadata holding at least
# its required payload_size (tag + 1-byte varint), then its (possibly empty) body.
SINGLE_MESSAGE_BYTES_MIN: Final = 4 + 2
# The most messages a batch may claim: what an uncompressed batch within Pulsar's default
# maxMessageSize (5 MiB) can hold at the minimum size per message (873,813).
MESSAGES_IN_BATCH_MAX: Final = (5 * 1024 * 1024) // SINGLE_MESSAGE_BYTES_MIN


def batch_capacity(metadata: pb.MessageMetadata, payload_bytes: int) -> int:
    """The most messages an entry with this metadata and a payload of `payload_bytes` can
    hold: its uncompressed size (the payload's own for NONE, else the metadata's
    `uncompressed_size`) over `SINGLE_MESSAGE_BYTES_MIN`, capped at `MESSAGES_IN_BATCH_MAX`."""
    uncompressed = (payload_bytes if metadata.compression == pb.NONE
                    else metadata.uncompressed_size)
    return min(MESSAGES_IN_BATCH_MAX, uncompressed // SINGLE_MESSAGE_BYTES_MIN)


def batch_count_error(metadata: pb.MessageMetadata, payload_bytes: int) -> str | None:
    """Why a SEND's `num_messages_in_batch` is refused (one line), or None when it is not a
    batch or the count is one the payload can hold."""
    if not metadata.HasField("num_messages_in_batch"):
        return None
    count = metadata.num_messages_in_batch
    if count < 1:
        return f"num_messages_in_batch {count} is below 1"
    if count > MESSAGES_IN_BATCH_MAX:
        return f"num_messages_in_batch {count} is above the limit {MESSAGES_IN_BATCH_MAX}"
    capacity = batch_capacity(metadata, payload_bytes)
    if count > capacity:
        return (f"num_messages_in_batch {count} is more than the payload can hold ({capacity} "
                f"messages of at least {SINGLE_MESSAGE_BYTES_MIN} bytes)")
    return None


def messages_in(metadata: pb.MessageMetadata, payload_bytes: int | None = None) -> int:
    """How many messages an entry holds: 1 unless it is a batch; a batch's claimed size
    clamped to [1, what it can hold] (`batch_capacity`; `MESSAGES_IN_BATCH_MAX` when the
    payload size is not given)."""
    if not metadata.HasField("num_messages_in_batch"):
        return 1
    limit = (MESSAGES_IN_BATCH_MAX if payload_bytes is None
             else batch_capacity(metadata, payload_bytes))
    return max(1, min(metadata.num_messages_in_batch, limit))


def messages_in_entry(metadata: pb.MessageMetadata, entry: bytes) -> int:
    """`messages_in` for an entry's bytes (as sent, or stored with a 0x0e02 block): its
    payload's length is found from the size fields without copying it. An entry too short
    to hold its metadata is bounded by `MESSAGES_IN_BATCH_MAX` alone."""
    if not metadata.HasField("num_messages_in_batch"):
        return 1
    try:
        payload_bytes: int | None = entry_payload_bytes(entry)
    except RemoteProtocolError:
        payload_bytes = None
    return messages_in(metadata, payload_bytes)


class EntryInfo:
    """One entry read from a managed ledger."""

    __slots__ = ("_broker_timestamp", "_metadata", "_payload_bytes", "data", "position", "slot")

    def __init__(self, position: Position, data: bytes):
        self.position = position
        self.data = data
        self._metadata: pb.MessageMetadata | None = None
        self._broker_timestamp: int | None = None  # from the 0x0e02 block, when it has one
        self._payload_bytes = 0  # the payload's length, known with the metadata
        self.slot = 0  # the Key_Shared sticky-key slot, computed by the dispatcher

    @property
    def metadata(self) -> pb.MessageMetadata:
        if self._metadata is None:
            try:
                self._metadata, self._payload_bytes, block = parse_entry_metadata(
                    self.data, validated=True)  # checked when its SEND arrived
                if block is not None and block.HasField("broker_timestamp"):
                    self._broker_timestamp = int(block.broker_timestamp)
            except Exception:  # a stored entry we cannot parse: dispatch it as opaque
                self._metadata = pb.MessageMetadata(producer_name="", sequence_id=0,
                                                    publish_time=0)
        return self._metadata

    @property
    def batch_size(self) -> int:
        """The messages the entry holds (`messages_in`: a stored claim is clamped). An entry
        whose metadata's bytes cannot hold a batch count is one message without a parse
        (`holds_one_message`: an unbatched backlog is dispatched without parsing it)."""
        if self._metadata is None and holds_one_message(self.data):
            return 1
        metadata = self.metadata  # parses, and finds the payload's length
        return messages_in(metadata, self._payload_bytes)

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
