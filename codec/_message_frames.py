"""MESSAGE frames built without the protobuf runtime: a broker writes one per delivered entry,
and building `BaseCommand(type=MESSAGE, message=CommandMessage(...))` then serializing it cost
more than the rest of a delivery (issue 14). The bytes are those the runtime produces for the
same fields (fields in number order, proto2 presence: every field the broker sets is written,
`ack_set` unpacked, negative int32/int64 values as 10-byte varints); tests/codec/
test_message_frames.py checks it byte for byte over arbitrary values. Field numbers come from
the descriptors, so they are defined once.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from ._errors import LocalProtocolError
from ._proto import pulsar_api_pb2 as pb
from ._receipts import MESSAGE_ID_ENTRY_KEY, MESSAGE_ID_LEDGER_KEY
from ._wire import (
    _VARINT_CACHE,
    _VARINT_CACHE_LIMIT,
    UINT64_MASK,
    WIRE_BYTES,
    WIRE_VARINT,
    encode_varint,
    field_key,
)

__all__ = ["MessageFrameHeads", "message_frame", "message_frame_head"]

_SIZES: Final = struct.Struct(">II")
_MESSAGE_FIELDS: Final = pb.CommandMessage.DESCRIPTOR.fields_by_name
_ID_FIELDS: Final = pb.MessageIdData.DESCRIPTOR.fields_by_name
_BODY_FIELD: Final = pb.BaseCommand.DESCRIPTOR.fields_by_name["message"].number
_TYPE_FIELD: Final = pb.BaseCommand.DESCRIPTOR.fields_by_name["type"].number
_COMMAND_HEAD: Final = (field_key(_TYPE_FIELD, WIRE_VARINT) + encode_varint(pb.BaseCommand.MESSAGE)
                       + field_key(_BODY_FIELD, WIRE_BYTES))
_CONSUMER: Final = field_key(_MESSAGE_FIELDS["consumer_id"].number, WIRE_VARINT)
_MESSAGE_ID: Final = field_key(_MESSAGE_FIELDS["message_id"].number, WIRE_BYTES)
_REDELIVERY: Final = field_key(_MESSAGE_FIELDS["redelivery_count"].number, WIRE_VARINT)
_ACK_SET: Final = field_key(_MESSAGE_FIELDS["ack_set"].number, WIRE_VARINT)
_EPOCH: Final = field_key(_MESSAGE_FIELDS["consumer_epoch"].number, WIRE_VARINT)
_PARTITION: Final = field_key(_ID_FIELDS["partition"].number, WIRE_VARINT)
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_SMALL_VARINTS: Final = _VARINT_CACHE
_SMALL: Final = _VARINT_CACHE_LIMIT
_PARTITION_NONE: Final = _PARTITION + encode_varint(-1)  # a topic that is not partitioned
# The one-byte keys `message_frame_head` counts as one byte each.
assert all(len(key) == 1 for key in (_CONSUMER, _MESSAGE_ID, _REDELIVERY, MESSAGE_ID_LEDGER_KEY,
                                     MESSAGE_ID_ENTRY_KEY, _PARTITION))


def message_frame(consumer_id: int, ledger_id: int, entry_id: int, partition: int,
                  redelivery_count: int, entry: bytes, *, ack_set: Sequence[int] = (),
                  consumer_epoch: int | None = None,
                  frame_size_bytes_max: int | None = None) -> bytes:
    """The whole frame (size prefixes included) of
    `CommandMessage(consumer_id, MessageIdData(ledgerId, entryId, partition),
    redelivery_count, ack_set, consumer_epoch)` followed by the stored `entry` verbatim:
    `message_frame_head(...) + entry`.

    Raises:
        LocalProtocolError: the frame would exceed `frame_size_bytes_max` (nothing built).
    """
    return message_frame_head(consumer_id, ledger_id, entry_id, partition, redelivery_count,
                              len(entry), ack_set=ack_set, consumer_epoch=consumer_epoch,
                              frame_size_bytes_max=frame_size_bytes_max) + entry


def message_frame_head(consumer_id: int, ledger_id: int, entry_id: int, partition: int,
                       redelivery_count: int, entry_bytes: int, *, ack_set: Sequence[int] = (),
                       consumer_epoch: int | None = None,
                       frame_size_bytes_max: int | None = None) -> bytes:
    """The bytes of `message_frame` before its entry (of `entry_bytes` bytes): the size
    prefixes and the command. A broker writes them and the stored entry as separate buffers
    (one gathering write), so the entry is not copied into a frame. Negative ledger and entry
    ids go out as their uint64 form. The ids are the broker's own (asserted to fit their
    types).

    Built in one join: every length is known from the varints' lengths, so the nested
    messages are not joined one by one (a broker calls this once per delivered entry).

    Raises:
        LocalProtocolError: the frame would exceed `frame_size_bytes_max` (nothing built).
    """
    assert 0 <= consumer_id <= UINT64_MASK
    assert 0 <= redelivery_count <= 0xFFFFFFFF
    assert _INT32_MIN <= partition <= _INT32_MAX
    assert entry_bytes >= 0
    ledger = encode_varint(ledger_id & UINT64_MASK)
    entry = encode_varint(entry_id & UINT64_MASK)
    part = _PARTITION_NONE if partition == -1 else _PARTITION + encode_varint(partition)
    ids_size = 2 + len(ledger) + len(entry) + len(part)  # the two keys are one byte each
    small = _SMALL_VARINTS  # the encodings of values below 2**14: ids, counts, sizes
    consumer = small[consumer_id] if consumer_id < _SMALL else encode_varint(consumer_id)
    redelivery = (small[redelivery_count] if redelivery_count < _SMALL
                  else encode_varint(redelivery_count))
    tail = b""
    if ack_set or consumer_epoch is not None:
        tail = _tail(ack_set, consumer_epoch)
    ids_size_varint = small[ids_size]  # at most 3 * 11 bytes
    body_size = (3 + len(consumer) + len(ids_size_varint) + ids_size + len(redelivery)
                 + len(tail))  # three one-byte keys: consumer, message id, redelivery
    body_size_varint = small[body_size] if body_size < _SMALL else encode_varint(body_size)
    command_size = len(_COMMAND_HEAD) + len(body_size_varint) + body_size
    total = 4 + command_size + entry_bytes
    if frame_size_bytes_max is not None and total > frame_size_bytes_max:
        raise LocalProtocolError(f"frame of {total} bytes exceeds {frame_size_bytes_max}")
    return b"".join((_SIZES.pack(total, command_size), _COMMAND_HEAD, body_size_varint,
                     _CONSUMER, consumer, _MESSAGE_ID, ids_size_varint,
                     MESSAGE_ID_LEDGER_KEY, ledger, MESSAGE_ID_ENTRY_KEY, entry, part,
                     _REDELIVERY, redelivery, tail))


def _tail(ack_set: Sequence[int], consumer_epoch: int | None) -> bytes:
    """The ack set's and the epoch's fields (after the redelivery count)."""
    parts: list[bytes] = []
    for word in ack_set:
        assert _INT64_MIN <= word <= _INT64_MAX
        parts += (_ACK_SET, encode_varint(word))
    if consumer_epoch is not None:
        assert 0 <= consumer_epoch <= UINT64_MASK
        parts += (_EPOCH, encode_varint(consumer_epoch))
    return b"".join(parts)


class MessageFrameHeads:
    """`message_frame_head` for the deliveries of one write to one consumer: the bytes
    before the entry id and after it are built once per (ledger, partition, redelivery
    count, epoch) and entry-id width, so each head costs a varint, a pack and a join. A head
    with an ack set, or with a negative id, is built by `message_frame_head` itself; the
    bytes are the same either way (tests/codec/test_message_frames.py).

    Args:
        consumer_id, frame_size_bytes_max: as `message_frame_head`'s, shared by every head.
    """

    __slots__ = ("_consumer_id", "_key", "_size_max", "_widths")

    def __init__(self, consumer_id: int, *, frame_size_bytes_max: int | None = None):
        assert 0 <= consumer_id <= UINT64_MASK
        self._consumer_id = consumer_id
        self._size_max = frame_size_bytes_max
        self._key: tuple[int, int, int, int | None] | None = None
        # Per entry-id width: (the command's bytes before the entry id, those after, the
        # command's size).
        self._widths: dict[int, tuple[bytes, bytes, int]] = {}

    def head(self, ledger_id: int, entry_id: int, partition: int, redelivery_count: int,
             entry_bytes: int, ack_set: Sequence[int] = (),
             consumer_epoch: int | None = None) -> bytes:
        """`message_frame_head(consumer_id, ledger_id, entry_id, ...)`.

        Raises:
            LocalProtocolError: the frame would exceed `frame_size_bytes_max` (nothing built).
        """
        if ack_set or ledger_id < 0 or entry_id < 0:
            return message_frame_head(
                self._consumer_id, ledger_id, entry_id, partition, redelivery_count,
                entry_bytes, ack_set=ack_set, consumer_epoch=consumer_epoch,
                frame_size_bytes_max=self._size_max)
        key = (ledger_id, partition, redelivery_count, consumer_epoch)
        if key != self._key:
            self._key = key
            self._widths = {}
        entry = encode_varint(entry_id)
        shape = self._widths.get(len(entry))
        if shape is None:
            shape = self._widths[len(entry)] = self._shape(len(entry))
        before, after, command_size = shape
        assert entry_bytes >= 0
        total = 4 + command_size + entry_bytes
        if self._size_max is not None and total > self._size_max:
            raise LocalProtocolError(f"frame of {total} bytes exceeds {self._size_max}")
        return b"".join((_SIZES.pack(total, command_size), before, entry, after))

    def _shape(self, entry_width: int) -> tuple[bytes, bytes, int]:
        """The command around an entry id of `entry_width` bytes, for the current key."""
        assert self._key is not None
        ledger_id, partition, redelivery_count, epoch = self._key
        assert 0 <= redelivery_count <= 0xFFFFFFFF
        assert _INT32_MIN <= partition <= _INT32_MAX
        ledger = encode_varint(ledger_id)
        part = _PARTITION_NONE if partition == -1 else _PARTITION + encode_varint(partition)
        tail = b"" if epoch is None else _tail((), epoch)
        after = b"".join((part, _REDELIVERY, encode_varint(redelivery_count), tail))
        consumer = encode_varint(self._consumer_id)
        ids_size = 2 + len(ledger) + entry_width + len(part)
        body_size = (2 + len(consumer) + len(encode_varint(ids_size)) + ids_size
                     + len(after) - len(part))  # `after` holds the partition (in the ids)
        before = b"".join((_COMMAND_HEAD, encode_varint(body_size), _CONSUMER, consumer,
                           _MESSAGE_ID, encode_varint(ids_size), MESSAGE_ID_LEDGER_KEY, ledger,
                           MESSAGE_ID_ENTRY_KEY))
        return before, after, len(before) + entry_width + len(after)
