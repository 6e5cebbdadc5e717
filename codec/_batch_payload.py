"""The batch payload: many messages in one entry's payload, and `SingleMessage`, one of them.

Theory of operation
-------------------

A batch is one entry whose metadata has `num_messages_in_batch` (its *presence* is what marks
the payload as a batch, even when the value is 1). The payload, before compression, is the
concatenation of one element per message:

| part                    | size               | content                                    |
|-------------------------|--------------------|--------------------------------------------|
| singleMetaSize          | 4, uint32 BE       | length of the next part                    |
| SingleMessageMetadata   | singleMetaSize     | protobuf, fields below                     |
| payload                 | payload_size       | the message body (empty for a null value)  |

`SingleMessageMetadata` fields, written in field-number order and only when not at their
default, exactly as the protobuf runtime would write them:

| field                      | # | tag  | wire        | `SingleMessage` attribute                  |
|----------------------------|---|------|-------------|--------------------------------------------|
| properties                 | 1 | 0x0a | KeyValue    | `properties` (one KeyValue per item)       |
| partition_key              | 2 | 0x12 | string      | `partition_key` (None = absent)            |
| payload_size               | 3 | 0x18 | int32, req. | `len(payload)`                             |
| compacted_out              | 4 | 0x20 | bool        | `compacted_out`                            |
| event_time                 | 5 | 0x28 | uint64      | `event_time` (0 = absent)                  |
| partition_key_b64_encoded  | 6 | 0x30 | bool        | `partition_key_b64_encoded`                |
| ordering_key               | 7 | 0x3a | bytes       | `ordering_key` (None = absent)             |
| sequence_id                | 8 | 0x40 | uint64      | `sequence_id` (None = absent)              |
| null_value                 | 9 | 0x48 | bool        | `payload is None`                          |
| null_partition_key         |10 | 0x50 | bool        | `null_partition_key`                       |

This one message type is encoded and decoded by hand rather than through the protobuf runtime:
there is one per message, and the runtime's per-object cost (about a microsecond each way) would
by itself use up the throughput budget. The hand-written reader follows protobuf's rules: unknown
fields are skipped by wire type, a known field with the wrong wire type is treated as unknown,
the last occurrence of a repeated scalar wins, and the required `payload_size` must be present.
Tests compare both directions with the runtime.

`batch_last_sequence_id` answers only the last message's sequence id (what deduplication needs
when a SEND states no highest id): it first checks whether the payload's tail holds a message
with the expected id, in time independent of the batch size, and otherwise skips over the
other messages reading only their sizes.

Why a module of its own: this is the byte format alone -- `SingleMessage`, the hand-written
`SingleMessageMetadata` encoder and reader, and `batch_last_sequence_id` over the same bytes.
It needs neither the protobuf runtime nor compression. `_batching.py` builds whole entries
around it (metadata, compression) and holds the containers that decide when a batch is full;
the broker's deduplication and `_plain_batch.py` use only this part.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, NamedTuple

from ._errors import RemoteProtocolError
from ._wire import decode_varint, encode_varint

__all__ = [
    "SingleMessage",
    "batch_last_sequence_id",
    "decode_batch_payload",
    "encode_batch_payload",
    "encode_single_metadata",
]

EMPTY_PROPERTIES: Final[Mapping[str, str]] = MappingProxyType({})
INT32_MAX: Final = (1 << 31) - 1

# How many places at the payload's tail `batch_last_sequence_id` tries for the expected last
# message (per search) before it walks the batch instead.
TAIL_CANDIDATES_MAX: Final = 8

_U32: Final = struct.Struct(">I")
# Size prefixes for the common single-message-metadata lengths, computed once.
_U32_SMALL: Final = tuple(_U32.pack(n) for n in range(256))
# The encoded `payload_size` field (tag 0x18 and varint) for bodies below 16 KiB.
_PAYLOAD_SIZE_FIELDS: Final = tuple(b"\x18" + encode_varint(n) for n in range(16384))


class SingleMessage(NamedTuple):
    """One message as it travels inside a batch (and, for a non-batched entry, the same fields
    taken from the entry's metadata).

    Attributes:
        payload: the body; None for a null value (a tombstone), which is not the same as b"".
        properties: application properties.
        partition_key: the message key; None when absent.
        partition_key_b64_encoded: the key is the base64 text of a binary key.
        ordering_key: the Key_Shared ordering key; None when absent.
        event_time: application event time in ms; 0 when not set.
        sequence_id: the producer's sequence id for this message; None when absent.
        null_partition_key: the key was explicitly set to null.
        batch_index: the index in its batch (set by the decoders; -1 when not batched).
        compacted_out: compaction removed this message; consumers skip it (decoders only).
    """

    payload: bytes | None = b""
    properties: Mapping[str, str] = EMPTY_PROPERTIES
    partition_key: str | None = None
    partition_key_b64_encoded: bool = False
    ordering_key: bytes | None = None
    event_time: int = 0
    sequence_id: int | None = None
    null_partition_key: bool = False
    batch_index: int = -1
    compacted_out: bool = False


# ---------------------------------------------------------------------------------------------
# The batch payload
# ---------------------------------------------------------------------------------------------


def _length_delimited(tag: bytes, data: bytes) -> bytes:
    return tag + encode_varint(len(data)) + data


def _encode_single_metadata_full(message: SingleMessage, payload_size: int) -> bytes:
    parts: list[bytes] = []
    for key, value in message.properties.items():
        entry = _length_delimited(b"\x0a", key.encode()) + _length_delimited(
            b"\x12", value.encode()
        )
        parts.append(_length_delimited(b"\x0a", entry))
    if message.partition_key is not None:
        parts.append(_length_delimited(b"\x12", message.partition_key.encode()))
    parts.append(b"\x18" + encode_varint(payload_size))
    if message.compacted_out:
        parts.append(b"\x20\x01")
    if message.event_time:
        parts.append(b"\x28" + encode_varint(message.event_time))
    if message.partition_key_b64_encoded:
        parts.append(b"\x30\x01")
    if message.ordering_key is not None:
        parts.append(_length_delimited(b"\x3a", message.ordering_key))
    if message.sequence_id is not None:
        parts.append(b"\x40" + encode_varint(message.sequence_id))
    if message.payload is None:
        parts.append(b"\x48\x01")
    if message.null_partition_key:
        parts.append(b"\x50\x01")
    return b"".join(parts)


def encode_single_metadata(message: SingleMessage) -> bytes:
    """The serialized `SingleMessageMetadata` of one message (what the protobuf runtime writes)."""
    payload = message.payload
    return _encode_single_metadata_full(message, 0 if payload is None else len(payload))


def encode_batch_payload(messages: Iterable[SingleMessage]) -> bytes:
    """Concatenate messages into an (uncompressed) batch payload.

    Args:
        messages: the messages, in batch order; `batch_index` is ignored.

    Returns:
        The batch payload bytes.
    """
    parts: list[bytes] = []
    append = parts.append
    u32_small = _U32_SMALL
    size_fields = _PAYLOAD_SIZE_FIELDS
    for message in messages:
        payload, properties, key, b64, ordering, event_time, sequence, null_key, _, compacted = \
            message
        if (
            payload is None
            or properties
            or key is not None
            or ordering is not None
            or event_time
            or b64
            or null_key
            or compacted
        ):
            meta = _encode_single_metadata_full(message, 0 if payload is None else len(payload))
            body = b"" if payload is None else payload
        else:
            size = len(payload)  # the common case -- a body and a sequence id -- without a list
            meta = size_fields[size] if size < 16384 else b"\x18" + encode_varint(size)
            if sequence is not None:  # three varint bytes inline: where sequence ids live
                meta += bytes((0x40, (sequence & 0x7F) | 0x80, ((sequence >> 7) & 0x7F) | 0x80,
                               sequence >> 14)) if 0x4000 <= sequence < 0x200000 else \
                    b"\x40" + encode_varint(sequence)
            body = payload
        size = len(meta)
        append(u32_small[size] if size < 256 else _U32.pack(size))
        append(meta)
        append(body)
    return b"".join(parts)


def _skip_field(buf: bytes, pos: int, end: int, wire_type: int) -> int:
    if wire_type == 0:
        return decode_varint(buf, pos, end)[1]
    if wire_type == 1:
        pos += 8
    elif wire_type == 2:
        length, pos = decode_varint(buf, pos, end)
        pos += length
    elif wire_type == 5:
        pos += 4
    else:
        raise RemoteProtocolError(f"SingleMessageMetadata has a field of wire type {wire_type}")
    if pos > end:
        raise RemoteProtocolError("SingleMessageMetadata field runs past its end")
    return pos


def _read_bytes(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    length, pos = decode_varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise RemoteProtocolError("SingleMessageMetadata field runs past its end")
    return buf[pos:stop], stop


def _read_text(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    data, pos = _read_bytes(buf, pos, end)
    try:
        return data.decode("utf-8"), pos
    except UnicodeDecodeError:
        raise RemoteProtocolError("SingleMessageMetadata string is not valid UTF-8") from None


def _read_key_value(buf: bytes, pos: int, end: int) -> tuple[str, str, int]:
    data, pos = _read_bytes(buf, pos, end)
    key: str | None = None
    value: str | None = None
    inner, stop = 0, len(data)
    while inner < stop:
        tag, inner = decode_varint(data, inner, stop)
        if tag == 0x0A:
            key, inner = _read_text(data, inner, stop)
        elif tag == 0x12:
            value, inner = _read_text(data, inner, stop)
        else:
            inner = _skip_field(data, inner, stop, tag & 7)
    if key is None or value is None:
        raise RemoteProtocolError("KeyValue lacks its required key or value")
    return key, value, pos


def _read_bool(buf: bytes, pos: int, end: int) -> tuple[bool, int]:
    value, pos = decode_varint(buf, pos, end)
    return value != 0, pos


def decode_batch_payload(
    payload: bytes, num_messages: int, *, first_sequence_id: int | None = None
) -> list[SingleMessage]:
    """Split an uncompressed batch payload back into its messages.

    Args:
        payload: the batch payload.
        num_messages: the metadata's `num_messages_in_batch`.
        first_sequence_id: the entry's sequence id; a message without its own sequence id gets
            `first_sequence_id + batch_index` (None leaves it absent).

    Returns:
        `num_messages` messages with `batch_index` 0, 1, ...

    Raises:
        RemoteProtocolError: the payload is truncated, has trailing bytes, or holds a malformed
            `SingleMessageMetadata`.
    """
    if num_messages < 0:
        raise RemoteProtocolError(f"negative num_messages_in_batch {num_messages}")
    buf = bytes(payload)
    end = len(buf)
    pos = 0
    messages: list[SingleMessage] = []
    append = messages.append
    new = tuple.__new__
    unpack_u32 = _U32.unpack_from
    empty = EMPTY_PROPERTIES
    for index in range(num_messages):
        if end - pos < 4:
            raise RemoteProtocolError(
                f"batch payload ends before message {index} of {num_messages}"
            )
        start = pos + 4
        meta_end = start + unpack_u32(buf, pos)[0]
        if meta_end > end:
            raise RemoteProtocolError(f"metadata of batch message {index} runs past the payload")
        # Fast path for what producers write most: `payload_size` (one or two varint bytes),
        # then optionally `sequence_id` (one to four), and nothing else. The metadata's length
        # tells how long the sequence id's varint is, so it is decoded without a loop. Anything
        # else, or anything odd, takes the general loop below.
        cursor = -1
        if meta_end - start >= 2 and buf[start] == 0x18:
            byte = buf[start + 1]
            if byte < 0x80:
                payload_size = byte
                cursor = start + 2
            elif meta_end - start >= 3 and buf[start + 2] < 0x80:
                payload_size = (byte & 0x7F) | (buf[start + 2] << 7)
                cursor = start + 3
        sequence: int | None = None
        if 0 < cursor < meta_end and buf[cursor] == 0x40:
            width = meta_end - cursor - 1
            b0 = buf[cursor + 1] if width else 0x80
            if width == 1 and b0 < 0x80:
                sequence = b0
            elif width == 2 and b0 >= 0x80 and buf[cursor + 2] < 0x80:
                sequence = (b0 & 0x7F) | (buf[cursor + 2] << 7)
            elif width == 3 and b0 >= 0x80 and buf[cursor + 2] >= 0x80 and buf[cursor + 3] < 0x80:
                sequence = (b0 & 0x7F) | ((buf[cursor + 2] & 0x7F) << 7) | (buf[cursor + 3] << 14)
            elif (
                width == 4
                and b0 >= 0x80
                and buf[cursor + 2] >= 0x80
                and buf[cursor + 3] >= 0x80
                and buf[cursor + 4] < 0x80
            ):
                sequence = (
                    (b0 & 0x7F)
                    | ((buf[cursor + 2] & 0x7F) << 7)
                    | ((buf[cursor + 3] & 0x7F) << 14)
                    | (buf[cursor + 4] << 21)
                )
            if sequence is not None:
                cursor = meta_end
        if cursor == meta_end:
            stop = meta_end + payload_size
            if stop > end:
                raise RemoteProtocolError(f"body of batch message {index} runs past the payload")
            if sequence is None and first_sequence_id is not None:
                sequence = first_sequence_id + index
            append(
                new(
                    SingleMessage,
                    (
                        buf[meta_end:stop],
                        empty,
                        None,
                        False,
                        None,
                        0,
                        sequence,
                        False,
                        index,
                        False,
                    ),
                )
            )
            pos = stop
            continue
        pos = start
        payload_size = -1
        properties: Mapping[str, str] = EMPTY_PROPERTIES
        key: str | None = None
        b64 = False
        ordering: bytes | None = None
        event_time = 0
        sequence = None
        null_value = False
        null_key = False
        compacted = False
        while pos < meta_end:
            tag = buf[pos]
            pos += 1
            if tag == 0x18:  # payload_size: one varint byte in the usual case
                value = buf[pos] if pos < meta_end else 0x80
                if value < 0x80:
                    pos += 1
                else:
                    value, pos = decode_varint(buf, pos, meta_end)
                payload_size = value if value <= INT32_MAX else value - (1 << 64)
            elif tag == 0x40:
                sequence, pos = decode_varint(buf, pos, meta_end)
            elif tag == 0x12:
                key, pos = _read_text(buf, pos, meta_end)
            elif tag == 0x0A:
                k, v, pos = _read_key_value(buf, pos, meta_end)
                if properties is EMPTY_PROPERTIES:
                    properties = {}
                properties[k] = v  # type: ignore[index]
            elif tag == 0x28:
                event_time, pos = decode_varint(buf, pos, meta_end)
            elif tag == 0x3A:
                ordering, pos = _read_bytes(buf, pos, meta_end)
            elif tag == 0x48:
                null_value, pos = _read_bool(buf, pos, meta_end)
            elif tag == 0x30:
                b64, pos = _read_bool(buf, pos, meta_end)
            elif tag == 0x20:
                compacted, pos = _read_bool(buf, pos, meta_end)
            elif tag == 0x50:
                null_key, pos = _read_bool(buf, pos, meta_end)
            else:
                if tag >= 0x80:
                    tag, pos = decode_varint(buf, pos - 1, meta_end)
                if tag >> 3 == 0:
                    raise RemoteProtocolError("SingleMessageMetadata has field number 0")
                pos = _skip_field(buf, pos, meta_end, tag & 7)
        if payload_size < 0:
            raise RemoteProtocolError(f"batch message {index} has no valid payload_size")
        stop = meta_end + payload_size
        if stop > end:
            raise RemoteProtocolError(f"body of batch message {index} runs past the payload")
        if sequence is None and first_sequence_id is not None:
            sequence = first_sequence_id + index
        append(
            new(
                SingleMessage,
                (
                    None if null_value else buf[meta_end:stop],
                    properties,
                    key,
                    b64,
                    ordering,
                    event_time,
                    sequence,
                    null_key,
                    index,
                    compacted,
                ),
            )
        )
        pos = stop
    if pos != end:
        raise RemoteProtocolError(f"{end - pos} bytes after the last of {num_messages} messages")
    return messages


def _tail_sequence_id_matches(buf: bytes, expected: int) -> bool:
    """Whether the payload ends with one well-formed message whose metadata ends with
    `sequence_id == expected` (as the clients write it: sequence_id is the last field they
    set but for a null value) and whose body runs to the end. Looks only at the tail, so it
    costs the same for any batch size: the encoded field is searched from the end, the size
    prefix (its two high bytes are zero below 64 KiB of metadata) is searched back from
    there, and the candidate is decoded; at most `TAIL_CANDIDATES_MAX` tries of each."""
    field = b"\x40" + encode_varint(expected)
    end = len(buf)
    field_stop = end
    for _ in range(TAIL_CANDIDATES_MAX):
        found = buf.rfind(field, 0, field_stop)
        if found < 0:
            return False
        field_stop = found + len(field) - 1  # the next try may overlap this one
        meta_end = found + len(field)
        zeros_stop = found
        for _ in range(TAIL_CANDIDATES_MAX):
            zeros = buf.rfind(b"\x00\x00", 0, zeros_stop)
            if zeros < 0:
                break
            zeros_stop = zeros + 1
            for start in (zeros, zeros - 1):
                if start >= 0 and _U32.unpack_from(buf, start)[0] == meta_end - start - 4:
                    try:
                        last = decode_batch_payload(buf[start:], 1)[0]
                    except RemoteProtocolError:
                        continue
                    if last.sequence_id == expected:
                        return True
    return False


def batch_last_sequence_id(
    payload: bytes, num_messages: int, *, expected: int | None = None
) -> int | None:
    """The `sequence_id` of the last message of an uncompressed batch payload.

    To find the last message the others are skipped, reading only each one's metadata size
    and `payload_size`. With `expected`, a tail that holds a well-formed message ending with
    `sequence_id == expected` answers `expected` without the walk: that is the common case of
    consecutive ids, where `expected` is the first id plus `num_messages - 1`, and it costs a
    few microseconds whatever the batch size, where the walk costs about one per message. (A
    last body that itself ended with bytes forging such a message could make a wrong guess
    pass; only the producer that wrote it is affected.)

    Args:
        payload: the batch payload, decompressed.
        num_messages: the metadata's `num_messages_in_batch`, > 0.
        expected: the id the caller expects the last message to carry, or None.

    Returns:
        The last message's sequence id; None when it carries none.

    Raises:
        RemoteProtocolError: the payload is malformed (as `decode_batch_payload` finds it).
    """
    if num_messages <= 0:
        raise RemoteProtocolError(f"a batch of {num_messages} messages has no last message")
    buf = bytes(payload)
    if expected is not None and expected >= 0 and _tail_sequence_id_matches(buf, expected):
        return expected
    end = len(buf)
    pos = 0
    unpack_u32 = _U32.unpack_from
    try:
        for index in range(num_messages - 1):
            start = pos + 4
            meta_end = start + unpack_u32(buf, pos)[0]
            if meta_end > end:
                raise RemoteProtocolError(
                    f"metadata of batch message {index} runs past the payload")
            payload_size = -1
            cursor = start
            while cursor < meta_end:  # every field: the last `payload_size` wins
                tag = buf[cursor]
                if tag == 0x18:
                    byte = buf[cursor + 1]
                    if byte < 0x80:
                        payload_size = byte
                        cursor += 2
                    else:
                        payload_size, cursor = decode_varint(buf, cursor + 1, meta_end)
                        if payload_size > INT32_MAX:
                            payload_size -= 1 << 64
                elif tag == 0x40:  # sequence_id, the other field clients always write
                    cursor = decode_varint(buf, cursor + 1, meta_end)[1]
                else:
                    if tag >= 0x80:
                        tag, cursor = decode_varint(buf, cursor, meta_end)
                    else:
                        cursor += 1
                    if tag >> 3 == 0:
                        raise RemoteProtocolError("SingleMessageMetadata has field number 0")
                    cursor = _skip_field(buf, cursor, meta_end, tag & 7)
            if cursor != meta_end:
                raise RemoteProtocolError("SingleMessageMetadata field runs past its end")
            if payload_size < 0:
                raise RemoteProtocolError(f"batch message {index} has no valid payload_size")
            pos = meta_end + payload_size
            if pos > end:
                raise RemoteProtocolError(f"body of batch message {index} runs past the payload")
    except (IndexError, struct.error):
        raise RemoteProtocolError(
            f"batch payload ends inside one of its first {num_messages - 1} messages") from None
    return decode_batch_payload(buf[pos:], 1)[0].sequence_id
