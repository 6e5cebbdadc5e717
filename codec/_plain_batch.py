"""Plain batches: the batch payloads a consumer can hand out without decoding them first.

Theory of operation
-------------------
Most batch messages carry nothing but their body: their `SingleMessageMetadata` holds
`payload_size` and, optionally, `sequence_id` (what producers write for bare bytes), and the
body is shorter than 16 KiB (`payload_size` in one or two varint bytes). `plain_batch_starts`
walks a batch payload once and returns where each message starts when every message is such
a plain one -- with no properties, key, event time, null value or `compacted_out` flag to
act on, the receiver needs nothing else to queue them -- or None, and the caller decodes the
batch in full (`decode_batch_payload`). `plain_batch_message` decodes one message of a batch
`plain_batch_starts` accepted, when it is asked for (its body is copied out only then).

The walk accepts exactly the messages `decode_batch_payload` decodes to a bare body: the same
bytes give the same `SingleMessage` either way. Most batches need no walk in Python at all:
when their messages share one layout -- the first message's size prefix, `payload_size` and
`sequence_id` tag, and a sequence id varint of the same width -- they start every `stride`
bytes, and a handful of strided slices (`_uniform_starts`) check every message's fixed bytes
and varint continuation bits at once.
"""

from __future__ import annotations

import struct
from typing import Final

from ._batch_payload import EMPTY_PROPERTIES, SingleMessage
from ._wire import decode_varint

__all__ = ["plain_batch_message", "plain_batch_starts"]

_U32: Final = struct.Struct(">I")
_PAYLOAD_SIZE_TAG: Final = 0x18  # field 3, varint
_SEQUENCE_ID_TAG: Final = 0x40  # field 8, varint
_VARINT_BYTES_MAX: Final = 10
_new_tuple = tuple.__new__


def plain_batch_starts(payload: bytes, num_messages: int) -> list[int] | None:
    """The offset of each message of an uncompressed batch payload when every one is plain
    (see the module comment) and they fill the payload exactly; None otherwise (an odd or
    malformed payload included: the full decode reports what is wrong with it)."""
    if num_messages <= 0:
        return None
    uniform = _uniform_starts(payload, num_messages)
    if uniform is not None:
        return uniform
    buf = payload
    end = len(buf)
    unpack_u32 = _U32.unpack_from
    starts: list[int] = []
    append = starts.append
    pos = 0
    for _ in range(num_messages):
        start = pos + 4
        if start > end:
            return None
        meta_end = start + unpack_u32(buf, pos)[0]
        if meta_end > end or meta_end - start < 2 or buf[start] != _PAYLOAD_SIZE_TAG:
            return None
        byte = buf[start + 1]
        if byte < 0x80:
            size, cursor = byte, start + 2
        elif meta_end - start >= 3 and buf[start + 2] < 0x80:
            size, cursor = (byte & 0x7F) | (buf[start + 2] << 7), start + 3
        else:
            return None
        if cursor != meta_end:  # then only a well-formed sequence_id may follow
            width = meta_end - cursor - 1
            if buf[cursor] != _SEQUENCE_ID_TAG or not 0 < width <= _VARINT_BYTES_MAX or \
                    buf[meta_end - 1] >= 0x80 or \
                    (width > 1 and min(buf[cursor + 1:meta_end - 1]) < 0x80):
                return None
        append(pos)
        pos = meta_end + size
    return starts if pos == end else None


def _uniform_starts(buf: bytes, count: int) -> list[int] | None:
    """`plain_batch_starts` for a batch whose plain messages share the first one's layout
    (see the module comment); None when they do not (then the caller walks it)."""
    end = len(buf)
    if end < 6 or buf[4] != _PAYLOAD_SIZE_TAG:
        return None
    meta_end = 4 + _U32.unpack_from(buf, 0)[0]
    byte = buf[5]
    if byte < 0x80:
        size, fixed = byte, 6
    elif end > 6 and buf[6] < 0x80:
        size, fixed = (byte & 0x7F) | (buf[6] << 7), 7
    else:
        return None
    stride = meta_end + size
    if fixed > meta_end or stride * count != end:
        return None
    if fixed < meta_end:  # a sequence id: its tag is fixed too, its varint's bytes are not
        if buf[fixed] != _SEQUENCE_ID_TAG or not 0 < meta_end - fixed - 1 <= _VARINT_BYTES_MAX:
            return None
        fixed += 1
    for offset in range(fixed):  # the same size prefix, payload_size and tag in each
        column = buf[offset::stride]
        if column.count(column[0]) != count:
            return None
    for offset in range(fixed, meta_end - 1):  # varint bytes that continue...
        if min(buf[offset::stride]) < 0x80:
            return None
    if fixed < meta_end and max(buf[meta_end - 1::stride]) >= 0x80:  # ...and the last one
        return None
    return list(range(0, end, stride))


def plain_batch_message(payload: bytes, start: int, batch_index: int,
                        first_sequence_id: int | None) -> SingleMessage:
    """The message at `start` of a payload `plain_batch_starts` accepted, as
    `decode_batch_payload` gives it (without its own sequence id, it gets
    `first_sequence_id + batch_index`; None leaves it absent)."""
    buf = payload
    cursor = start + 4
    meta_end = cursor + _U32.unpack_from(buf, start)[0]
    byte = buf[cursor + 1]
    if byte < 0x80:
        size, cursor = byte, cursor + 2
    else:
        size, cursor = (byte & 0x7F) | (buf[cursor + 2] << 7), cursor + 3
    sequence: int | None
    if cursor < meta_end:
        sequence = decode_varint(buf, cursor + 1, meta_end)[0]
    else:
        sequence = None if first_sequence_id is None else first_sequence_id + batch_index
    return _new_tuple(SingleMessage, (
        buf[meta_end:meta_end + size], EMPTY_PROPERTIES, None, False, None, 0, sequence, False,
        batch_index, False))
