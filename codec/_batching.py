"""Batches as entries, and the containers that decide when a batch is full.

Theory of operation
-------------------

A batch travels as one entry: a `MessageMetadata` with `num_messages_in_batch`, and the batch
payload of `_batch_payload.py` (its layout and the `SingleMessage` fields are described there),
compressed as a whole. `build_batch` builds such an entry, `build_message` a non-batched one
(the message's fields move into the entry's metadata), and `unpack_messages` reads either kind
back into `SingleMessage`s.

The outer metadata follows the C++ client: `sequence_id` is the first message's, and the first
message's `partition_key` (with its base64 flag) and `ordering_key` are copied up so the broker's
Key_Shared dispatcher can route the entry. `compression`/`uncompressed_size` are written only when
the batch is compressed. Per-message keys, properties, event times, sequence ids and null values
live in each `SingleMessageMetadata`.

Containers
----------

A container collects messages and hands back `Batch` objects when a batch should be sent. It is
sans-IO: the caller passes the current time and asks `deadline_ms` when to call `expire`.

* `BatchContainer` (Pulsar's default): one open batch. Before adding, if the message does not fit
  (`batch_messages_max` reached, or the bytes would exceed `batch_size_bytes_max`) the open batch
  is closed first; after adding, a batch that reached either limit is closed at once. A message
  larger than the byte limit therefore travels alone. `batch_delay_ms_max` after the first message
  of a batch, `expire` closes it.
* `KeyBasedBatchContainer`: one batch per key (the ordering key if present, else the partition key;
  keyless messages share one batch), which is what Key_Shared subscriptions need. The limits apply
  to the container as a whole; closing it yields one batch per key, in the order of each key's
  first message (ascending first sequence id, as the C++ client sends them).

Why the split falls here: `_batch_payload.py` is the byte format alone and needs neither the
protobuf runtime nor compression; this module wraps it into entries, which is what the
containers' batches become (`Batch.build` is `build_batch`), so entries and containers stay
together and the payload module imports nothing of theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, cast

from ._batch_payload import (
    EMPTY_PROPERTIES,
    SingleMessage,
    decode_batch_payload,
    encode_batch_payload,
)
from ._compression import UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT, CompressionType, compress, decompress
from ._proto import pulsar_api_pb2 as pb

__all__ = [
    "BATCH_DELAY_MS_MAX_DEFAULT",
    "BATCH_MESSAGES_MAX_DEFAULT",
    "BATCH_SIZE_BYTES_MAX_DEFAULT",
    "Batch",
    "BatchContainer",
    "KeyBasedBatchContainer",
    "batch_key",
    "build_batch",
    "build_message",
    "unpack_messages",
]

BATCH_MESSAGES_MAX_DEFAULT: Final = 1000
BATCH_SIZE_BYTES_MAX_DEFAULT: Final = 128 * 1024
BATCH_DELAY_MS_MAX_DEFAULT: Final = 10  # the C++ and Python clients' default


# ---------------------------------------------------------------------------------------------
# Entries: metadata plus (compressed) payload
# ---------------------------------------------------------------------------------------------


def _base_metadata(
    producer_name: str, sequence_id: int, publish_time: int, schema_version: bytes | None
) -> pb.MessageMetadata:
    metadata = pb.MessageMetadata(
        producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time
    )
    if schema_version is not None:
        metadata.schema_version = schema_version
    return metadata


def _apply_compression(
    metadata: pb.MessageMetadata, compression: CompressionType | int, payload: bytes
) -> bytes:
    codec = CompressionType(compression)
    if codec is CompressionType.NONE:
        return payload
    metadata.compression = cast("pb.CompressionType", int(codec))
    metadata.uncompressed_size = len(payload)
    return compress(codec, payload)


def build_batch(
    messages: Sequence[SingleMessage],
    *,
    producer_name: str,
    publish_time: int,
    compression: CompressionType | int = CompressionType.NONE,
    schema_version: bytes | None = None,
) -> tuple[pb.MessageMetadata, bytes]:
    """Build the metadata and payload of a batch entry.

    Args:
        messages: one or more messages; the first one's sequence id (0 if absent) becomes the
            entry's, and its keys are copied to the entry's metadata.
        producer_name: the producer's name.
        publish_time: ms since the epoch.
        compression: the codec for the whole batch payload.
        schema_version: copied into the metadata when given.

    Returns:
        `(metadata, payload)`, ready for `encode_frame` or `Connection.send`.
    """
    if not messages:
        raise ValueError("a batch needs at least one message")
    first = messages[0]
    metadata = _base_metadata(producer_name, first.sequence_id or 0, publish_time, schema_version)
    if first.partition_key is not None:
        metadata.partition_key = first.partition_key
        if first.partition_key_b64_encoded:
            metadata.partition_key_b64_encoded = True
    if first.ordering_key is not None:
        metadata.ordering_key = first.ordering_key
    metadata.num_messages_in_batch = len(messages)
    payload = _apply_compression(metadata, compression, encode_batch_payload(messages))
    return metadata, payload


def build_message(
    message: SingleMessage,
    *,
    producer_name: str,
    publish_time: int,
    compression: CompressionType | int = CompressionType.NONE,
    schema_version: bytes | None = None,
) -> tuple[pb.MessageMetadata, bytes]:
    """Build the metadata and payload of a non-batched entry: the message's fields move into
    the entry's `MessageMetadata`.

    Returns:
        `(metadata, payload)`; a null value is an empty payload with `null_value` set.
    """
    metadata = _base_metadata(producer_name, message.sequence_id or 0, publish_time, schema_version)
    for key, value in message.properties.items():
        metadata.properties.add(key=key, value=value)
    if message.partition_key is not None:
        metadata.partition_key = message.partition_key
    if message.partition_key_b64_encoded:
        metadata.partition_key_b64_encoded = True
    if message.ordering_key is not None:
        metadata.ordering_key = message.ordering_key
    if message.event_time:
        metadata.event_time = message.event_time
    if message.payload is None:
        metadata.null_value = True
    if message.null_partition_key:
        metadata.null_partition_key = True
    payload = _apply_compression(metadata, compression, message.payload or b"")
    return metadata, payload


def unpack_messages(
    metadata: pb.MessageMetadata,
    payload: bytes,
    *,
    uncompressed_size_bytes_max: int = UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT,
) -> list[SingleMessage]:
    """The messages of one (complete, not chunked) entry, decompressed and unbatched.

    Args:
        metadata: the entry's metadata.
        payload: the entry's payload as sent (possibly compressed).
        uncompressed_size_bytes_max: the bound passed to `decompress`.

    Returns:
        For a batch, its messages with batch indexes 0..n-1 (compacted-out ones included, flagged);
        otherwise one message with batch index -1 built from the entry's metadata.

    Raises:
        RemoteProtocolError: decompression fails or the batch payload is malformed.
    """
    if int(metadata.compression) != CompressionType.NONE:
        payload = decompress(
            metadata.compression,
            payload,
            metadata.uncompressed_size,
            uncompressed_size_bytes_max=uncompressed_size_bytes_max,
        )
    if metadata.HasField("num_messages_in_batch"):
        return decode_batch_payload(
            payload, metadata.num_messages_in_batch, first_sequence_id=metadata.sequence_id
        )
    properties: Mapping[str, str] = EMPTY_PROPERTIES
    if metadata.properties:
        properties = {kv.key: kv.value for kv in metadata.properties}
    return [
        SingleMessage(
            payload=None if metadata.null_value else bytes(payload),
            properties=properties,
            partition_key=metadata.partition_key if metadata.HasField("partition_key") else None,
            partition_key_b64_encoded=metadata.partition_key_b64_encoded,
            ordering_key=metadata.ordering_key if metadata.HasField("ordering_key") else None,
            event_time=metadata.event_time,
            sequence_id=metadata.sequence_id,
            null_partition_key=metadata.null_partition_key,
        )
    ]


# ---------------------------------------------------------------------------------------------
# Containers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Batch:
    """A closed batch: the messages of one entry, in order.

    Attributes:
        messages: one or more messages.
    """

    messages: tuple[SingleMessage, ...]

    @property
    def sequence_id(self) -> int:
        """The first message's sequence id (0 if absent): the entry's and the SEND's."""
        return self.messages[0].sequence_id or 0

    @property
    def highest_sequence_id(self) -> int:
        """The last message's sequence id (or the first's plus count - 1 if absent)."""
        last = self.messages[-1].sequence_id
        return self.sequence_id + len(self.messages) - 1 if last is None else last

    @property
    def size_bytes(self) -> int:
        """The sum of the message bodies' sizes, as the containers count it."""
        return sum(len(m.payload or b"") for m in self.messages)

    def build(
        self,
        *,
        producer_name: str,
        publish_time: int,
        compression: CompressionType | int = CompressionType.NONE,
        schema_version: bytes | None = None,
    ) -> tuple[pb.MessageMetadata, bytes]:
        """`build_batch` of this batch's messages."""
        return build_batch(
            self.messages,
            producer_name=producer_name,
            publish_time=publish_time,
            compression=compression,
            schema_version=schema_version,
        )


@dataclass(slots=True)
class _Limits:
    batch_messages_max: int
    batch_size_bytes_max: int
    batch_delay_ms_max: float

    def __post_init__(self) -> None:
        if self.batch_messages_max < 1:
            raise ValueError("batch_messages_max must be at least 1")
        if self.batch_size_bytes_max < 1:
            raise ValueError("batch_size_bytes_max must be at least 1")
        if self.batch_delay_ms_max < 0:
            raise ValueError("batch_delay_ms_max must not be negative")


class _ContainerBase:
    """Counting, limits and the delay deadline shared by both containers."""

    def __init__(
        self,
        *,
        batch_messages_max: int = BATCH_MESSAGES_MAX_DEFAULT,
        batch_size_bytes_max: int = BATCH_SIZE_BYTES_MAX_DEFAULT,
        batch_delay_ms_max: float = BATCH_DELAY_MS_MAX_DEFAULT,
    ) -> None:
        self._limits = _Limits(batch_messages_max, batch_size_bytes_max, batch_delay_ms_max)
        # Puts one message in (each subclass's own: a bound list.append for the default one,
        # so `add` makes no Python call for it).
        self._insert: Callable[[SingleMessage], None]
        self._count = 0
        self._size_bytes = 0
        self._deadline_ms: float | None = None

    def __len__(self) -> int:
        """The number of messages waiting."""
        return self._count

    @property
    def size_bytes(self) -> int:
        """The bytes of message bodies waiting."""
        return self._size_bytes

    @property
    def deadline_ms(self) -> float | None:
        """When `expire` will close the waiting messages' batches; None when empty."""
        return self._deadline_ms

    def add(self, message: SingleMessage, now_ms: float) -> list[Batch]:
        """Add a message, closing batches as Pulsar's producers do.

        Args:
            message: the message (with its sequence id assigned by the producer).
            now_ms: the caller's clock; starts the delay when the container was empty.

        Returns:
            The batches closed by this call (possibly none), to send in order.
        """
        size = 0 if message.payload is None else len(message.payload)
        limits = self._limits
        closed: list[Batch] = []
        if self._count and (
            self._count >= limits.batch_messages_max
            or self._size_bytes + size > limits.batch_size_bytes_max
        ):
            closed = self.flush()
        if not self._count:
            self._deadline_ms = now_ms + limits.batch_delay_ms_max
        self._insert(message)
        self._count += 1
        self._size_bytes += size
        if (
            self._count >= limits.batch_messages_max
            or self._size_bytes >= limits.batch_size_bytes_max
        ):
            closed.extend(self.flush())
        return closed

    def add_many(self, messages: Sequence[SingleMessage], now_ms: float) -> list[Batch]:
        """`add` of each message in order (one call for a producer's run of messages).

        Returns:
            The batches the messages closed (possibly none), to send in order.
        """
        closed: list[Batch] = []
        for message in messages:
            closed += self.add(message, now_ms)
        return closed

    def expire(self, now_ms: float) -> list[Batch]:
        """Close everything if the delay has run out.

        Returns:
            The closed batches, or an empty list when the deadline is still ahead.
        """
        if self._deadline_ms is None or now_ms < self._deadline_ms:
            return []
        return self.flush()

    def flush(self) -> list[Batch]:
        """Close everything now (a producer's `flush()`, or its close).

        Returns:
            The closed batches, in sending order; empty when nothing waits.
        """
        batches = self._drain()
        self._count = 0
        self._size_bytes = 0
        self._deadline_ms = None
        return batches

    def _drain(self) -> list[Batch]:
        raise NotImplementedError


class BatchContainer(_ContainerBase):
    """Pulsar's default batch container: one batch at a time.

    Args:
        batch_messages_max: close a batch at this many messages (default 1000).
        batch_size_bytes_max: close a batch when its bodies reach this many bytes (128 KiB).
        batch_delay_ms_max: close a batch this long after its first message (10 ms).
    """

    def __init__(
        self,
        *,
        batch_messages_max: int = BATCH_MESSAGES_MAX_DEFAULT,
        batch_size_bytes_max: int = BATCH_SIZE_BYTES_MAX_DEFAULT,
        batch_delay_ms_max: float = BATCH_DELAY_MS_MAX_DEFAULT,
    ) -> None:
        super().__init__(
            batch_messages_max=batch_messages_max,
            batch_size_bytes_max=batch_size_bytes_max,
            batch_delay_ms_max=batch_delay_ms_max,
        )
        self._messages: list[SingleMessage] = []  # kept: `_insert` is its bound append
        self._insert = self._messages.append

    def add_many(self, messages: Sequence[SingleMessage], now_ms: float) -> list[Batch]:
        """`add` of each message in order, in one loop (a producer's burst of sends)."""
        limits = self._limits
        count_max, bytes_max = limits.batch_messages_max, limits.batch_size_bytes_max
        waiting = self._messages
        count, size_bytes = self._count, self._size_bytes
        closed: list[Batch] = []
        for message in messages:
            payload = message[0]  # `payload`
            size = 0 if payload is None else len(payload)
            if count and (count >= count_max or size_bytes + size > bytes_max):
                closed.append(Batch(tuple(waiting)))  # `flush`, inline
                waiting.clear()
                count = size_bytes = 0
            if not count:
                self._deadline_ms = now_ms + limits.batch_delay_ms_max
            waiting.append(message)
            count += 1
            size_bytes += size
            if count >= count_max or size_bytes >= bytes_max:
                closed.append(Batch(tuple(waiting)))
                waiting.clear()
                count = size_bytes = 0
                self._deadline_ms = None
        self._count, self._size_bytes = count, size_bytes
        return closed

    def _drain(self) -> list[Batch]:
        if not self._messages:
            return []
        batch = Batch(tuple(self._messages))
        self._messages.clear()
        return [batch]


BatchKey = tuple[str, bytes | str] | None


def batch_key(message: SingleMessage) -> BatchKey:
    """The key-based container's grouping key: the ordering key, else the partition key, else
    None. The two kinds of key never collide with each other."""
    if message.ordering_key is not None:
        return ("ordering", message.ordering_key)
    if message.partition_key is not None:
        return ("partition", message.partition_key)
    return None


class KeyBasedBatchContainer(_ContainerBase):
    """Pulsar's key-based batch container: one batch per key, keyless messages together.

    Args:
        batch_messages_max: close all batches when the container holds this many messages.
        batch_size_bytes_max: close all batches when the bodies reach this many bytes.
        batch_delay_ms_max: close all batches this long after the first message.
    """

    def __init__(
        self,
        *,
        batch_messages_max: int = BATCH_MESSAGES_MAX_DEFAULT,
        batch_size_bytes_max: int = BATCH_SIZE_BYTES_MAX_DEFAULT,
        batch_delay_ms_max: float = BATCH_DELAY_MS_MAX_DEFAULT,
    ) -> None:
        super().__init__(
            batch_messages_max=batch_messages_max,
            batch_size_bytes_max=batch_size_bytes_max,
            batch_delay_ms_max=batch_delay_ms_max,
        )
        # Insertion-ordered: a key's position is that of its first waiting message.
        self._groups: dict[BatchKey, list[SingleMessage]] = {}
        self._insert = self._insert_keyed

    def _insert_keyed(self, message: SingleMessage) -> None:
        self._groups.setdefault(batch_key(message), []).append(message)

    def _drain(self) -> list[Batch]:
        batches = [Batch(tuple(group)) for group in self._groups.values()]
        self._groups = {}
        return batches
