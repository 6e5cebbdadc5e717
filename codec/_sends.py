"""Plain SENDs decoded with little help from the protobuf runtime: `decode_plain_send`.

Theory of operation
-------------------
A broker decodes one SEND per published entry, and the ordinary decode (`decode_frame`:
the runtime's `BaseCommand`, its `IsInitialized`, the metadata with `parse_message`'s
checks, a `Frame`) cost more than the rest of the broker's work on the entry. Most SENDs are
*plain*: a command written as the runtime writes it -- `type = SEND`, then the `send` field
holding only scalar fields of `CommandSend` (no message id) -- whose entry's metadata holds
only the fields in `PLAIN_METADATA_FIELDS`: of those the broker's publish path reads only
the batch count, which it checks itself (no chunk, delay, highest sequence id, transaction,
marker or encryption field). For those, `decode_plain_send` walks the command's bytes
itself, parses the metadata with the runtime and checks it in one pass over the fields it
holds (plain ones only, the required ones present, every string UTF-8), verifies the
checksum, and returns a `Send`. Metadata holding the three required fields alone, in number
order, then possibly the batch count -- what the official client writes for a lone message
and for a batch -- is recognised by its bytes instead of that pass (`_OFFICIAL_TAIL`),
leaving only the producer name's UTF-8 to check.

`decode_plain_send_in` reads the frame where it lies, in a connection's receive buffer, and
copies out only the entry: no copy of the whole frame first, no copy for the checksum, and
for a batch none of its payload.

Everything else -- any other field or layout, a varint of ten bytes, metadata the runtime
refuses or that is not plain, a string that is not UTF-8, a missing required field, a bad
checksum -- returns None, and the caller decodes the frame the ordinary way, which accepts
or refuses it exactly as before: the walk never decides an error, it only takes the frames
it is sure of. tests/codec/test_sends.py checks it against `decode_frame` over arbitrary
commands and metadata (hypothesis): whatever it accepts, `decode_frame` accepts with the
same values, metadata and entry.
"""

from __future__ import annotations

import re
import struct
from typing import Final, NamedTuple, cast

from crc32c import crc32c as _crc32c
from google.protobuf.message import DecodeError

from ._framer import MAGIC_CRC32C, crc32c
from ._proto import pulsar_api_pb2 as pb

__all__ = ["PLAIN_METADATA_FIELDS", "Send", "decode_plain_send", "decode_plain_send_in"]

_U32: Final = struct.Struct(">I")
_MAGIC: Final = struct.pack(">H", MAGIC_CRC32C)
# How the runtime starts a SEND: `type` (field 1, varint) = SEND, then `send` (field 6, bytes).
_SEND_HEAD: Final = bytes((1 << 3 | 0, pb.BaseCommand.SEND, 6 << 3 | 2))

# CommandSend's fields as varint keys (field number << 3 | wire type 0).
_SEND_FIELDS: Final = pb.CommandSend.DESCRIPTOR.fields_by_name
_PRODUCER_ID: Final = _SEND_FIELDS["producer_id"].number << 3
_SEQUENCE_ID: Final = _SEND_FIELDS["sequence_id"].number << 3
_NUM_MESSAGES: Final = _SEND_FIELDS["num_messages"].number << 3
_TXN_LEAST: Final = _SEND_FIELDS["txnid_least_bits"].number << 3
_TXN_MOST: Final = _SEND_FIELDS["txnid_most_bits"].number << 3
_HIGHEST: Final = _SEND_FIELDS["highest_sequence_id"].number << 3
_IGNORED_SEND_KEYS: Final = frozenset(  # read by nobody on a broker: walked past
    _SEND_FIELDS[name].number << 3 for name in ("is_chunk", "marker"))
_INT32_MAX: Final = (1 << 31) - 1
_new: Final = tuple.__new__

_SCALAR, _STRING, _STRINGS, _KEY_VALUES = range(4)
# The metadata fields a plain SEND may carry, and what to check in each. Of these the
# broker's publish path reads only num_messages_in_batch, whose count it checks (it also
# reads chunk_id, num_chunks_from_msg, deliver_at_time, highest_sequence_id; transaction and
# marker fields mean a refusal), so a plain SEND is a message or a batch, neither chunked
# nor delayed.
PLAIN_METADATA_FIELDS: Final = {
    "producer_name": _STRING, "sequence_id": _SCALAR, "publish_time": _SCALAR,
    "properties": _KEY_VALUES, "replicated_from": _STRING, "partition_key": _STRING,
    "replicate_to": _STRINGS, "compression": _SCALAR, "uncompressed_size": _SCALAR,
    "event_time": _SCALAR, "schema_version": _SCALAR, "partition_key_b64_encoded": _SCALAR,
    "ordering_key": _SCALAR, "null_value": _SCALAR, "null_partition_key": _SCALAR,
    "num_messages_in_batch": _SCALAR,
}
_META_FIELDS: Final = pb.MessageMetadata.DESCRIPTOR.fields_by_name
# Keyed by the field descriptors, which `ListFields` hands back (hashing one is cheap).
_PLAIN_CHECKS: Final = {_META_FIELDS[name]: kind for name, kind in PLAIN_METADATA_FIELDS.items()}
_REQUIRED: Final = frozenset(field for field in pb.MessageMetadata.DESCRIPTOR.fields
                             if field.is_required)
assert _PLAIN_CHECKS.keys() >= _REQUIRED
# The official client's metadata: the name (bytes), the two required varints, and for a
# batch its count (a varint), in number order.
_NAME_KEY: Final = _META_FIELDS["producer_name"].number << 3 | 2
_OFFICIAL_TAIL: Final = re.compile(  # after the name: sequence id, publish time[, count]
    b"%c[\x80-\xff]{0,9}[\x00-\x7f]%c[\x80-\xff]{0,9}[\x00-\x7f](?:%c[\x80-\xff]{0,9}[\x00-\x7f])?"
    % (_META_FIELDS["sequence_id"].number << 3, _META_FIELDS["publish_time"].number << 3,
       _META_FIELDS["num_messages_in_batch"].number << 3),
    re.DOTALL)
_official_tail: Final = _OFFICIAL_TAIL.fullmatch
assert {field.name for field in _REQUIRED} == {"producer_name", "sequence_id", "publish_time"}
assert _crc32c(b"123456789") == crc32c(b"123456789")  # the codec's one CRC, called directly


class Send(NamedTuple):
    """A plain SEND (see the module comment): its `CommandSend` values, metadata and entry.

    Attributes:
        producer_id, sequence_id: as sent.
        highest_sequence_id: as sent; None when the command did not state it.
        num_messages: as sent (1 when absent).
        txnid_least_bits, txnid_most_bits: as sent (0 when absent).
        metadata: the entry's metadata, plain (`PLAIN_METADATA_FIELDS`).
        entry: as `Frame.entry`: from the checksum magic (or the metadata size) to the end.
        payload_bytes: the length of the entry's payload.
        checksum: the CRC32C the frame carried, already verified; None if it carried none.
    """

    producer_id: int
    sequence_id: int
    highest_sequence_id: int | None
    num_messages: int
    txnid_least_bits: int
    txnid_most_bits: int
    metadata: pb.MessageMetadata
    entry: bytes
    payload_bytes: int
    checksum: int | None


def _varint(data: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of a varint at `pos` of at most nine bytes, all before
    `end`; (-1, pos) otherwise (a ten-byte varint is left to the runtime)."""
    value = shift = 0
    limit = min(end, pos + 9)
    while pos < limit:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, pos


def _plain_metadata(data: bytes | bytearray) -> pb.MessageMetadata | None:
    """`data` parsed as a MessageMetadata when it is complete, holds plain fields only and
    only UTF-8 strings; None otherwise."""
    metadata = pb.MessageMetadata()
    try:
        # The runtime parses any buffer; its stubs name only bytes.
        metadata.ParseFromString(cast(bytes, data))
    except DecodeError:
        return None
    # The shape every official client writes: the required fields alone, once each, in
    # number order, then a batch's count (`_OFFICIAL_TAIL`), the name shorter than 128
    # bytes. Then only the name's UTF-8 is left to check, without walking `ListFields`.
    if data[0] == _NAME_KEY and (name_bytes := data[1]) < 0x80 and \
            _official_tail(data, 2 + name_bytes) is not None:
        return metadata if type(metadata.producer_name) is str else None
    required = 0
    checks, str_ = _PLAIN_CHECKS, str
    for field, value in metadata.ListFields():
        kind = checks.get(field)
        if kind is None:
            return None
        if field in _REQUIRED:
            required += 1
        if kind == _STRING:
            if type(value) is not str_:
                return None  # the runtime hands a string that is not UTF-8 back as bytes
        elif kind == _STRINGS:
            if not all(type(item) is str_ for item in value):
                return None
        elif kind == _KEY_VALUES and not all(
                item.HasField("key") and item.HasField("value") and type(item.key) is str_
                and type(item.value) is str_ for item in value):
            return None
    return metadata if required == len(_REQUIRED) else None


def decode_plain_send(frame: bytes) -> Send | None:
    """A plain SEND's `Send` (see the module comment); None for any other frame, which
    `decode_frame` then decodes (or refuses).

    Args:
        frame: one frame without its 4-byte totalSize prefix.
    """
    with memoryview(frame) as view:
        return decode_plain_send_in(frame, view, 0, len(frame))


def decode_plain_send_in(buffer: bytes | bytearray, view: memoryview, start: int,
                         end: int) -> Send | None:
    """`decode_plain_send` of the frame at `buffer[start:end]`, read where it lies: a
    connection decodes a SEND in its receive buffer, and copies out only the entry, once.
    The `Send` holds nothing of `buffer`.

    Args:
        buffer: holds the frame (without its 4-byte totalSize prefix) at [start, end).
        view: `memoryview(buffer)`, through which the checksum and the entry are read.
    """
    if end - start < 8 or buffer[start + 4] != _SEND_HEAD[0] or \
            buffer[start + 5] != _SEND_HEAD[1] or buffer[start + 6] != _SEND_HEAD[2]:
        return None
    command_end = start + 4 + _U32.unpack_from(buffer, start)[0]
    if command_end > end:
        return None
    length, pos = buffer[start + 7], start + 8
    if length >= 0x80:
        length, pos = _varint(buffer, start + 7, command_end)
    if length < 0 or pos + length != command_end:
        return None
    producer_id = sequence_id = highest = -1
    num_messages, least, most = 1, 0, 0
    while pos < command_end:
        key = buffer[pos]
        pos += 1
        if pos >= command_end:
            return None
        value = buffer[pos]  # one to three bytes spelled out: ids up to 2**21 are the rule
        if value < 0x80:
            pos += 1
        elif pos + 1 < command_end and (second := buffer[pos + 1]) < 0x80:
            value = value & 0x7F | second << 7
            pos += 2
        elif pos + 2 < command_end and (third := buffer[pos + 2]) < 0x80:
            value = value & 0x7F | (buffer[pos + 1] & 0x7F) << 7 | third << 14
            pos += 3
        else:
            value, pos = _varint(buffer, pos, command_end)
            if value < 0:
                return None
        if key == _PRODUCER_ID:
            producer_id = value
        elif key == _SEQUENCE_ID:
            sequence_id = value
        elif key == _HIGHEST:
            highest = value
        elif key == _NUM_MESSAGES and value <= _INT32_MAX:
            num_messages = value
        elif key == _TXN_LEAST:
            least = value
        elif key == _TXN_MOST:
            most = value
        elif key not in _IGNORED_SEND_KEYS:
            return None
    if producer_id < 0 or sequence_id < 0:
        return None
    # The entry: [magic, checksum,] metadata size, metadata, payload.
    pos = command_end
    checksum = None
    if end - pos >= 2 and buffer[pos] == _MAGIC[0] and buffer[pos + 1] == _MAGIC[1]:
        if end - pos < 10:
            return None
        checksum = _U32.unpack_from(buffer, pos + 2)[0]
        pos += 6
    elif end - pos < 4:
        return None
    meta_end = pos + 4 + _U32.unpack_from(buffer, pos)[0]
    if meta_end > end:
        return None
    metadata = _plain_metadata(buffer[pos + 4:meta_end])
    if metadata is None:
        return None
    if checksum is not None and _crc32c(view[pos:end]) != checksum:
        return None
    # tuple.__new__: `Send(...)` would run the NamedTuple's Python-level __new__.
    return _new(Send, (producer_id, sequence_id, None if highest < 0 else highest,
                       num_messages, least, most, metadata, bytes(view[command_end:end]),
                       end - meta_end, checksum))
