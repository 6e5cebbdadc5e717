"""Chunking: one large message sent as several entries, and its reassembly.

Theory of operation
-------------------

A producer with chunking enabled (and batching off) compresses a message first, then cuts the
compressed payload into pieces of at most `chunk size` bytes, where the chunk size is the
broker's `max_message_size` minus the size of the message's serialized metadata. Each piece is sent
as its own SEND (with `is_chunk = true`) and stored as its own entry. Every chunk repeats the
message's metadata (same `sequence_id`, same compression fields) plus four chunk fields:

| MessageMetadata field   | #  | value                                                        |
|-------------------------|----|--------------------------------------------------------------|
| uuid                    | 26 | `"<producer_name>-<sequence_id>"`, the same on every chunk   |
| num_chunks_from_msg     | 27 | N, the number of chunks                                      |
| total_chunk_msg_size    | 28 | the whole compressed payload's size                          |
| chunk_id                | 29 | 0 .. N-1                                                     |

The id of the reassembled message is a chunk message id: the last chunk's id with a reference to
the first chunk's (`MessageId.first_chunk`); acknowledging it means acknowledging every chunk.

Reassembly (`ChunkAssembler`) follows the Java client, which the Pulsar reference describes,
made sans-IO: instead of acknowledging or tracking ids itself, every call returns a
`ChunkResult` listing the chunk ids the consumer should acknowledge (`ack`: duplicates and
discarded messages that must not leave ack holes) and those it should leave unacknowledged so the
broker redelivers them (`redeliver`). The rules, per arriving chunk of message `uuid`:

| situation                                                  | outcome                           |
|------------------------------------------------------------|-----------------------------------|
| chunk 0, no pending message for `uuid`                     | start one (evicting the oldest    |
|                                                            | if `pending_chunked_messages_max` |
|                                                            | are pending: its chunks go to     |
|                                                            | `ack` if `auto_ack_oldest_on_full`|
|                                                            | else to `redeliver`)              |
| chunk 0 again                                              | restart; if the new chunk 0 is a  |
|                                                            | different entry, the old chunks   |
|                                                            | belong to a corrupt publish: ack  |
| chunk id = last + 1                                        | append; the last one completes    |
| chunk id <= last (a duplicate)                             | ignore; ack it if it is a         |
|                                                            | different entry than those held   |
| anything else (chunk 0 was never seen, or a gap)           | drop the pending message (its     |
|                                                            | chunks to `redeliver`); ack this  |
|                                                            | chunk if its publish time is older|
|                                                            | than the expiry, else redeliver   |

`expire(now_ms)` drops messages whose first chunk arrived more than
`incomplete_chunk_expiry_ms` ago and acknowledges their chunks. A chunk whose metadata is
inconsistent (bad ids, sizes that do not add up, a total above `chunked_message_size_bytes_max`)
raises `RemoteProtocolError` and leaves the assembler's state as it was.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from ._errors import LocalProtocolError, RemoteProtocolError
from ._message_id import MessageId
from ._proto import pulsar_api_pb2 as pb

__all__ = [
    "CHUNKED_MESSAGE_SIZE_BYTES_MAX_DEFAULT",
    "INCOMPLETE_CHUNK_EXPIRY_MS_DEFAULT",
    "PENDING_CHUNKED_MESSAGES_MAX_DEFAULT",
    "ChunkAssembler",
    "ChunkResult",
    "ChunkedMessage",
    "chunk_payload_size_bytes",
    "chunk_uuid",
    "split_into_chunks",
]

PENDING_CHUNKED_MESSAGES_MAX_DEFAULT: Final = 10  # maxPendingChunkedMessage; 0 = unlimited
INCOMPLETE_CHUNK_EXPIRY_MS_DEFAULT: Final = 60_000  # expireTimeOfIncompleteChunkedMessage
# Pulsar has no limit of its own on a reassembled message; this one keeps a hostile
# `total_chunk_msg_size` from reserving unbounded memory. total_chunk_msg_size is an int32.
CHUNKED_MESSAGE_SIZE_BYTES_MAX_DEFAULT: Final = 512 * 1024 * 1024


def chunk_uuid(producer_name: str, sequence_id: int) -> str:
    """The uuid the C++ client gives a chunked message: `"<producer_name>-<sequence_id>"`."""
    return f"{producer_name}-{sequence_id}"


def _with_chunk_fields(
    metadata: pb.MessageMetadata, uuid: str, num_chunks: int, total_size: int, chunk_id: int
) -> pb.MessageMetadata:
    chunk = pb.MessageMetadata()
    chunk.CopyFrom(metadata)
    chunk.uuid = uuid
    chunk.num_chunks_from_msg = num_chunks
    chunk.total_chunk_msg_size = total_size
    chunk.chunk_id = chunk_id
    return chunk


def chunk_payload_size_bytes(metadata: pb.MessageMetadata, max_message_size: int) -> int:
    """How many payload bytes go in one chunk, computed as the C++ client does.

    That is `max_message_size` minus the size of the message's metadata *before* the chunk
    fields are added, so a chunk's metadata plus payload may exceed `max_message_size` by the
    chunk fields' few bytes; brokers allow frames 10 KiB larger than `max_message_size` for that.
    Using the same figure makes our chunks byte-identical to the official client's.

    Args:
        metadata: the message's metadata, compression fields included, no chunk fields.
        max_message_size: the broker's `max_message_size` (from CONNECTED).

    Raises:
        LocalProtocolError: the metadata alone does not leave room for a payload byte.
    """
    room = max_message_size - metadata.ByteSize()
    if room < 1:
        raise LocalProtocolError(f"max_message_size {max_message_size} leaves no room for payload")
    return room


def split_into_chunks(
    metadata: pb.MessageMetadata,
    payload: bytes,
    *,
    chunk_size_bytes: int,
    uuid: str | None = None,
) -> list[tuple[pb.MessageMetadata, bytes]]:
    """Cut a (compressed) message into chunks, each with its own metadata.

    Args:
        metadata: the message's metadata, compression fields included.
        payload: the compressed payload.
        chunk_size_bytes: the most payload bytes per chunk (see `chunk_payload_size_bytes`).
        uuid: the chunk uuid (default `chunk_uuid(producer_name, sequence_id)`).

    Returns:
        `[(metadata, payload)]` unchanged when the payload fits in one chunk; otherwise one pair
        per chunk, in order, to send with `CommandSend.is_chunk = true`.
    """
    if chunk_size_bytes < 1:
        raise ValueError("chunk_size_bytes must be at least 1")
    if len(payload) <= chunk_size_bytes:
        return [(metadata, payload)]
    uuid = chunk_uuid(metadata.producer_name, metadata.sequence_id) if uuid is None else uuid
    total = len(payload)
    count = -(-total // chunk_size_bytes)
    return [
        (
            _with_chunk_fields(metadata, uuid, count, total, index),
            payload[index * chunk_size_bytes : (index + 1) * chunk_size_bytes],
        )
        for index in range(count)
    ]


@dataclass(frozen=True, slots=True)
class ChunkedMessage:
    """A reassembled chunked message.

    Attributes:
        message_id: the chunk message id (last chunk's id, `first_chunk` set).
        chunk_ids: every chunk's id, in chunk order; acknowledge all of them.
        metadata: the last chunk's metadata (compression fields apply to `payload`).
        payload: the whole payload, still compressed as the producer sent it.
    """

    message_id: MessageId
    chunk_ids: tuple[MessageId, ...]
    metadata: pb.MessageMetadata
    payload: bytes


@dataclass(frozen=True, slots=True)
class ChunkResult:
    """What one call to the assembler produced.

    Attributes:
        message: a completed message, or None.
        ack: chunk ids to acknowledge (duplicates and discarded messages).
        redeliver: chunk ids to leave unacknowledged for redelivery.
    """

    message: ChunkedMessage | None = None
    ack: tuple[MessageId, ...] = ()
    redeliver: tuple[MessageId, ...] = ()


@dataclass(slots=True)
class _Pending:
    num_chunks: int
    total_size: int
    received_ms: float
    ids: list[MessageId] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)
    size: int = 0

    @property
    def last_chunk_id(self) -> int:
        return len(self.ids) - 1

    def holds_entry(self, message_id: MessageId) -> bool:
        entry = message_id.entry()
        return any(held.entry() == entry for held in self.ids)


def _chunk_fields(metadata: pb.MessageMetadata, max_size: int) -> tuple[str, int, int, int]:
    for name in ("uuid", "num_chunks_from_msg", "total_chunk_msg_size", "chunk_id"):
        if not metadata.HasField(name):
            raise RemoteProtocolError(f"chunk metadata lacks {name}")
    num_chunks = metadata.num_chunks_from_msg
    total = metadata.total_chunk_msg_size
    chunk_id = metadata.chunk_id
    if num_chunks < 1:
        raise RemoteProtocolError(f"num_chunks_from_msg {num_chunks} is not positive")
    if not 0 <= chunk_id < num_chunks:
        raise RemoteProtocolError(f"chunk_id {chunk_id} is outside [0, {num_chunks})")
    if not 0 <= total <= max_size:
        raise RemoteProtocolError(f"total_chunk_msg_size {total} is outside [0, {max_size}]")
    return metadata.uuid, num_chunks, total, chunk_id


class ChunkAssembler:
    """Reassembles chunked messages on the consumer side (sans-IO; the caller owns the clock).

    Args:
        pending_chunked_messages_max: incomplete messages kept at once; 0 means unlimited.
        incomplete_chunk_expiry_ms: how long an incomplete message may wait; 0 disables expiry.
        auto_ack_oldest_on_full: acknowledge (rather than redeliver) the chunks of a message
            evicted because too many are pending.
        chunked_message_size_bytes_max: refuse messages that claim to be larger than this.
    """

    def __init__(
        self,
        *,
        pending_chunked_messages_max: int = PENDING_CHUNKED_MESSAGES_MAX_DEFAULT,
        incomplete_chunk_expiry_ms: float = INCOMPLETE_CHUNK_EXPIRY_MS_DEFAULT,
        auto_ack_oldest_on_full: bool = False,
        chunked_message_size_bytes_max: int = CHUNKED_MESSAGE_SIZE_BYTES_MAX_DEFAULT,
    ) -> None:
        if pending_chunked_messages_max < 0:
            raise ValueError("pending_chunked_messages_max must not be negative")
        if incomplete_chunk_expiry_ms < 0:
            raise ValueError("incomplete_chunk_expiry_ms must not be negative")
        self.pending_chunked_messages_max = pending_chunked_messages_max
        self.incomplete_chunk_expiry_ms = incomplete_chunk_expiry_ms
        self.auto_ack_oldest_on_full = auto_ack_oldest_on_full
        self.chunked_message_size_bytes_max = chunked_message_size_bytes_max
        # uuid -> pending message, oldest first.
        self._pending: OrderedDict[str, _Pending] = OrderedDict()

    def __len__(self) -> int:
        """The number of incomplete messages held."""
        return len(self._pending)

    @property
    def next_expiry_ms(self) -> float | None:
        """When the oldest incomplete message expires; None if none or expiry is off."""
        if not self._pending or not self.incomplete_chunk_expiry_ms:
            return None
        oldest = min(p.received_ms for p in self._pending.values())
        return oldest + self.incomplete_chunk_expiry_ms

    def add(
        self, message_id: MessageId, metadata: pb.MessageMetadata, payload: bytes, now_ms: float
    ) -> ChunkResult:
        """Take one chunk.

        Args:
            message_id: the chunk entry's id (from CommandMessage).
            metadata: the chunk's metadata (it must carry the four chunk fields).
            payload: the chunk's payload.
            now_ms: the caller's clock, in ms since the epoch (compared with publish times).

        Returns:
            The completed message when this was its last chunk, and the ids to ack or redeliver.

        Raises:
            RemoteProtocolError: the chunk metadata is inconsistent; the state is unchanged.
        """
        uuid, num_chunks, total, chunk_id = _chunk_fields(
            metadata, self.chunked_message_size_bytes_max
        )
        pending = self._pending.get(uuid)
        if chunk_id == 0:
            _check_fits(0, payload, total, num_chunks == 1)
            return self._start(uuid, message_id, metadata, payload, now_ms, pending)
        if pending is None or chunk_id != pending.last_chunk_id + 1:
            return self._out_of_order(uuid, message_id, metadata, chunk_id, now_ms, pending)
        if pending.num_chunks != num_chunks or pending.total_size != total:
            raise RemoteProtocolError(f"chunk {chunk_id} of {uuid!r} disagrees on count or size")
        _check_fits(pending.size, payload, total, chunk_id == num_chunks - 1)
        return self._append(uuid, pending, message_id, metadata, payload)

    def expire(self, now_ms: float) -> ChunkResult:
        """Drop incomplete messages older than the expiry and acknowledge their chunks.

        Returns:
            The ids to acknowledge (no message).
        """
        if not self.incomplete_chunk_expiry_ms:
            return ChunkResult()
        ack: list[MessageId] = []
        for uuid, pending in list(self._pending.items()):
            if now_ms > pending.received_ms + self.incomplete_chunk_expiry_ms:
                del self._pending[uuid]
                ack.extend(pending.ids)
        return ChunkResult(ack=tuple(ack))

    def _start(
        self,
        uuid: str,
        message_id: MessageId,
        metadata: pb.MessageMetadata,
        payload: bytes,
        now_ms: float,
        previous: _Pending | None,
    ) -> ChunkResult:
        ack: list[MessageId] = []
        redeliver: list[MessageId] = []
        if previous is not None:
            # Chunk 0 again. The same entry means a redelivery: nothing to acknowledge. A
            # different entry means the held chunks were a corrupt publish that will never be
            # delivered: acknowledge them so they leave no hole.
            del self._pending[uuid]
            if not previous.holds_entry(message_id):
                ack.extend(previous.ids)
        limit = self.pending_chunked_messages_max
        while limit and len(self._pending) >= limit:
            _, oldest = self._pending.popitem(last=False)
            (ack if self.auto_ack_oldest_on_full else redeliver).extend(oldest.ids)
        pending = _Pending(
            metadata.num_chunks_from_msg, metadata.total_chunk_msg_size, received_ms=now_ms
        )
        self._pending[uuid] = pending
        result = self._append(uuid, pending, message_id, metadata, payload)
        return ChunkResult(result.message, tuple(ack), tuple(redeliver))

    def _out_of_order(
        self,
        uuid: str,
        message_id: MessageId,
        metadata: pb.MessageMetadata,
        chunk_id: int,
        now_ms: float,
        pending: _Pending | None,
    ) -> ChunkResult:
        if pending is not None and chunk_id <= pending.last_chunk_id:
            # A duplicate of a chunk already held: ignore it, but acknowledge it when it is a
            # distinct entry (a duplicate publish), which would otherwise stay unacknowledged.
            if pending.holds_entry(message_id):
                return ChunkResult()
            return ChunkResult(ack=(message_id,))
        # A gap, or a chunk whose chunk 0 was never seen: the message cannot be completed.
        redeliver: list[MessageId] = []
        if pending is not None:
            del self._pending[uuid]
            redeliver.extend(pending.ids)
        expiry = self.incomplete_chunk_expiry_ms
        if expiry and now_ms > metadata.publish_time + expiry:
            return ChunkResult(ack=(message_id,), redeliver=tuple(redeliver))
        redeliver.append(message_id)
        return ChunkResult(redeliver=tuple(redeliver))

    def _append(
        self,
        uuid: str,
        pending: _Pending,
        message_id: MessageId,
        metadata: pb.MessageMetadata,
        payload: bytes,
    ) -> ChunkResult:
        pending.ids.append(message_id)
        pending.parts.append(bytes(payload))
        pending.size += len(payload)
        if len(pending.ids) < pending.num_chunks:
            return ChunkResult()
        del self._pending[uuid]
        first = pending.ids[0]
        whole_id = MessageId(
            message_id.ledger_id,
            message_id.entry_id,
            message_id.partition,
            first_chunk=first.entry(),
        )
        message = ChunkedMessage(whole_id, tuple(pending.ids), metadata, b"".join(pending.parts))
        return ChunkResult(message=message)


def _check_fits(held: int, payload: bytes, total: int, final: bool) -> None:
    size = held + len(payload)
    if size > total:
        raise RemoteProtocolError(f"chunks add up to more than total_chunk_msg_size {total}")
    if final and size != total:
        raise RemoteProtocolError(f"chunks add up to {size}, total_chunk_msg_size says {total}")
