"""Frames: the byte layout of one Pulsar command on the wire, without any state.

Theory of operation
-------------------

Every integer in a frame header is unsigned 32-bit big-endian; the magics are 16-bit.

Simple command (everything but SEND and MESSAGE):

| offset | size        | content                                         |
|--------|-------------|-------------------------------------------------|
| 0      | 4           | totalSize = 4 + commandSize                     |
| 4      | 4           | commandSize                                     |
| 8      | commandSize | serialized BaseCommand                          |

Payload command (SEND from a client, MESSAGE from a broker):

| part                          | size  | content                                          |
|-------------------------------|-------|--------------------------------------------------|
| totalSize                     | 4     | bytes after this field, to the end               |
| commandSize                   | 4     |                                                  |
| command                       | var   | BaseCommand (SEND or MESSAGE)                    |
| brokerEntryMetadata magic     | 2     | 0x0e02, optional, MESSAGE only                   |
| brokerEntryMetadataSize       | 4     | optional                                         |
| brokerEntryMetadata           | var   | BrokerEntryMetadata, optional                    |
| magic                         | 2     | 0x0e01: a checksum follows (optional)            |
| checksum                      | 4     | CRC32C of everything from metadataSize to the end|
| metadataSize                  | 4     |                                                  |
| metadata                      | var   | MessageMetadata                                  |
| payload                       | rest  | implied by totalSize                             |

The part from the magic (or from metadataSize when there is no magic) to the end is the *entry*:
a broker stores it verbatim and sends it back after a CommandMessage, so the producer's checksum
and metadata reach consumers unchanged (`encode_entry` / `parse_entry`). A broker that keeps
broker entry metadata stores the entry behind the 0x0e02 block (`prefix_broker_entry_metadata`);
such a *prefixed entry* is exactly the tail of a MESSAGE frame that carries the block, and
`parse_entry` accepts it too. `split_broker_entry_metadata` separates the two again.

CRC32C is Castagnoli (reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF), as in
iSCSI and SSE4.2; crc32c(b"123456789") = 0xE3069283. The magic and the checksum itself are not
covered.

Decoding trusts nothing: every length is checked against what is left, the BaseCommand must be
complete (proto2 required fields) and carry the sub-command its type names, a simple command may
not have trailing bytes, and a frame may not exceed `frame_size_bytes_max` (Pulsar's
`max_message_size` plus 10 KiB of room for command and metadata). Failures raise
`RemoteProtocolError`; a frame that is well formed but fails its checksum decodes to a
`ChecksumMismatch` event.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c as _crc32c
from google.protobuf.message import Message

from ._errors import LocalProtocolError, RemoteProtocolError
from ._frames import FIELD_OF_TYPE, ChecksumMismatch, Frame
from ._proto import pulsar_api_pb2 as pb
from ._wire import (
    WIRE_VARINT,
    check_strings,
    field_key,
    holds_strings,
    parse_message,
    parse_validated,
    serialize_message,
)

__all__ = [
    "BROKER_ENTRY_METADATA_BYTES_MAX",
    "FRAME_PADDING_BYTES",
    "FRAME_SIZE_BYTES_MAX_DEFAULT",
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "MAX_MESSAGE_SIZE_DEFAULT",
    "PAYLOAD_COMMAND_TYPES",
    "Entry",
    "base_command",
    "crc32c",
    "decode_frame",
    "encode_entry",
    "encode_frame",
    "entry_payload",
    "entry_payload_bytes",
    "holds_one_message",
    "parse_entry",
    "prefix_broker_entry_metadata",
    "split_broker_entry_metadata",
    "strip_broker_entry_metadata",
]

MAGIC_CRC32C: Final = 0x0E01
MAGIC_BROKER_ENTRY_METADATA: Final = 0x0E02
MAX_MESSAGE_SIZE_DEFAULT: Final = 5 * 1024 * 1024  # Pulsar's maxMessageSize
# Pulsar's room for command and metadata above maxMessageSize (Commands.MESSAGE_SIZE_FRAME_
# PADDING): the one definition, which the broker's frame and message limits both use.
FRAME_PADDING_BYTES: Final = 10 * 1024
FRAME_SIZE_BYTES_MAX_DEFAULT: Final = MAX_MESSAGE_SIZE_DEFAULT + FRAME_PADDING_BYTES
# The most a 0x0e02 block adds in front of a stored entry: magic (2), size (4), and a
# BrokerEntryMetadata of two 64-bit varint fields (1-byte tag + up to 10 bytes each).
BROKER_ENTRY_METADATA_BYTES_MAX: Final = 2 + 4 + 2 * (1 + 10)

PAYLOAD_COMMAND_TYPES: Final = frozenset({pb.BaseCommand.SEND, pb.BaseCommand.MESSAGE})
# Empty sub-commands: a frame that omits them still means the command.
_EMPTY_BODY_TYPES: Final = frozenset({pb.BaseCommand.PING, pb.BaseCommand.PONG})
# The sub-command fields whose message type can hold strings (the others have none to check).
_FIELDS_WITH_STRINGS: Final = frozenset(
    field.name for field in pb.BaseCommand.DESCRIPTOR.fields
    if field.message_type is not None and holds_strings(field.message_type))

_U32: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")
_MAGIC_CRC32C_BYTES: Final = _U16.pack(MAGIC_CRC32C)
_MAGIC_BROKER_ENTRY_METADATA_BYTES: Final = _U16.pack(MAGIC_BROKER_ENTRY_METADATA)
# The first byte of any key of `MessageMetadata.num_messages_in_batch` (`holds_one_message`):
# the key's low seven bits, as the last byte of its varint or followed by more (an overlong
# key, which the runtime accepts too).
_BATCH_COUNT_KEY: Final = field_key(
    pb.MessageMetadata.DESCRIPTOR.fields_by_name["num_messages_in_batch"].number, WIRE_VARINT)
assert len(_BATCH_COUNT_KEY) == 1
_BATCH_COUNT_KEY_LONG: Final = bytes((_BATCH_COUNT_KEY[0] | 0x80,))

# Sub-command class -> (type, BaseCommand field name), from the rule "field number = type".
_TYPE_OF_BODY: Final = {
    f.message_type.full_name: (f.number, f.name)
    for f in pb.BaseCommand.DESCRIPTOR.fields
    if f.number > 1 and f.message_type is not None
}


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C (Castagnoli) of `data`, continuing from `value` (0 to start)."""
    return int(_crc32c.crc32c(data, value))


assert crc32c(b"123456789") == 0xE3069283


def base_command(body: Message) -> pb.BaseCommand:
    """Wrap a sub-command in a BaseCommand with the matching type.

    Args:
        body: e.g. `pb.CommandSend(producer_id=1, sequence_id=0)`.

    Returns:
        `BaseCommand(type=SEND, send=body)`.
    """
    entry = _TYPE_OF_BODY.get(body.DESCRIPTOR.full_name)
    if entry is None:
        raise TypeError(f"{type(body).__name__} is not a sub-command of BaseCommand")
    command_type, name = entry
    command = pb.BaseCommand(type=command_type)  # type: ignore[arg-type]
    getattr(command, name).CopyFrom(body)
    return command


@dataclass(frozen=True, slots=True)
class Entry:
    """The stored form of a message: an entry split into its parts.

    Attributes:
        metadata: the entry's MessageMetadata.
        payload: the payload (possibly compressed or a batch).
        checksum: the verified CRC32C, or None when the entry carries none.
        broker_entry_metadata: the broker's 0x0e02 block of a prefixed entry, else None.
    """

    metadata: pb.MessageMetadata
    payload: bytes
    checksum: int | None
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None


def encode_entry(metadata: pb.MessageMetadata, payload: bytes, *, checksum: bool = True) -> bytes:
    """The entry bytes of a message: [magic, CRC32C,] metadata size, metadata, payload.

    Args:
        metadata: the message metadata (all required fields set).
        payload: the payload as it should travel (already compressed or batched).
        checksum: write the 0x0e01 magic and CRC32C (what every protocol >= 6 peer does).

    Raises:
        LocalProtocolError: the metadata lacks a required field.
    """
    meta = serialize_message(metadata, "MessageMetadata")
    body = _U32.pack(len(meta)) + meta
    if not checksum:
        return body + payload
    value = crc32c(payload, crc32c(body))
    return _MAGIC_CRC32C_BYTES + _U32.pack(value) + body + payload


def encode_frame(
    command: pb.BaseCommand,
    metadata: pb.MessageMetadata | None = None,
    payload: bytes = b"",
    *,
    entry: bytes | None = None,
    checksum: bool = True,
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
    frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
) -> bytes:
    """Serialize one frame.

    Args:
        command: the BaseCommand.
        metadata: for SEND/MESSAGE, the metadata (with `payload`); None otherwise.
        payload: for SEND/MESSAGE, the payload.
        entry: for SEND/MESSAGE, stored entry bytes to send verbatim instead of metadata and
            payload (how a broker dispatches).
        checksum: with `metadata`, whether to add the magic and CRC32C.
        broker_entry_metadata: for MESSAGE, the broker's 0x0e02 prefix.
        frame_size_bytes_max: refuse to build a larger frame.

    Returns:
        The frame, size prefix included.

    Raises:
        LocalProtocolError: a required field is missing, the payload part does not match the
            command type, or the frame would exceed `frame_size_bytes_max`.
    """
    command_bytes = serialize_message(command, "BaseCommand")
    carries_payload = command.type in PAYLOAD_COMMAND_TYPES
    if metadata is not None and entry is not None:
        raise LocalProtocolError("give metadata and payload, or entry, not both")
    if carries_payload != (metadata is not None or entry is not None):
        name = pb.BaseCommand.Type.Name(command.type)
        raise LocalProtocolError(
            f"{name} {'needs' if carries_payload else 'cannot carry'} a payload"
        )
    if broker_entry_metadata is not None and command.type != pb.BaseCommand.MESSAGE:
        raise LocalProtocolError("only MESSAGE frames carry broker entry metadata")
    tail = b""
    if metadata is not None:
        tail = encode_entry(metadata, payload, checksum=checksum)
    elif entry is not None:
        tail = entry
    if broker_entry_metadata is not None:
        tail = prefix_broker_entry_metadata(broker_entry_metadata, tail)
    total = 4 + len(command_bytes) + len(tail)
    if total > frame_size_bytes_max:
        raise LocalProtocolError(f"frame of {total} bytes exceeds {frame_size_bytes_max}")
    return _U32.pack(total) + _U32.pack(len(command_bytes)) + command_bytes + tail


def _split_entry(entry: bytes | memoryview) -> tuple[int | None, int, int]:
    """(checksum on the wire or None, offset of metadataSize, offset of the metadata's end)."""
    size = len(entry)
    pos = 0
    checksum = None
    if size >= 2 and entry[:2] == _MAGIC_CRC32C_BYTES:
        if size < 6:
            raise RemoteProtocolError("entry ends inside its checksum")
        checksum = _U32.unpack_from(entry, 2)[0]
        pos = 6
    if size - pos < 4:
        raise RemoteProtocolError("entry ends before its metadata size")
    meta_end = pos + 4 + _U32.unpack_from(entry, pos)[0]
    if meta_end > size:
        raise RemoteProtocolError("entry metadata runs past the end of the frame")
    return checksum, pos, meta_end


def _broker_entry_metadata_end(data: bytes | memoryview, pos: int) -> int:
    """The end of the 0x0e02 block at `pos`, or `pos` when there is none there."""
    if bytes(data[pos : pos + 2]) != _MAGIC_BROKER_ENTRY_METADATA_BYTES:
        return pos
    if len(data) - pos < 6:
        raise RemoteProtocolError("entry ends inside the broker entry metadata size")
    end: int = pos + 6 + _U32.unpack_from(data, pos + 2)[0]
    if end > len(data):
        raise RemoteProtocolError("broker entry metadata runs past the end of the entry")
    return end


def prefix_broker_entry_metadata(metadata: pb.BrokerEntryMetadata, entry: bytes) -> bytes:
    """`entry` behind a 0x0e02 block: the form a broker stores and sends to clients that
    declared `supports_broker_entry_metadata`.

    Raises:
        LocalProtocolError: `entry` already carries a block.
    """
    if entry[:2] == _MAGIC_BROKER_ENTRY_METADATA_BYTES:
        raise LocalProtocolError("the entry already carries broker entry metadata")
    block = serialize_message(metadata, "BrokerEntryMetadata")
    return _MAGIC_BROKER_ENTRY_METADATA_BYTES + _U32.pack(len(block)) + block + entry


def split_broker_entry_metadata(entry: bytes) -> tuple[pb.BrokerEntryMetadata | None, bytes]:
    """(the 0x0e02 block or None, the entry without it); an entry without one is returned as
    it is.

    Raises:
        RemoteProtocolError: the block is truncated or invalid.
    """
    end = _broker_entry_metadata_end(entry, 0)
    if end == 0:
        return None, entry
    block = parse_message(pb.BrokerEntryMetadata, entry[6:end], "BrokerEntryMetadata")
    return block, entry[end:]


def strip_broker_entry_metadata(entry: bytes) -> bytes:
    """The entry without its 0x0e02 block (unchanged when it has none); the block is not
    decoded.

    Raises:
        RemoteProtocolError: the block's size runs past the end of the entry.
    """
    end = _broker_entry_metadata_end(entry, 0)
    return entry[end:] if end else entry


def parse_entry(entry: bytes, *, verify_checksum: bool = True) -> Entry:
    """Split stored entry bytes into metadata and payload.

    Args:
        entry: bytes as `Frame.entry` or `encode_entry` give them, or a prefixed entry
            (`prefix_broker_entry_metadata`).
        verify_checksum: check the CRC32C when the entry carries one.

    Raises:
        RemoteProtocolError: the entry is truncated, its metadata is invalid, or its checksum
            does not match.
    """
    broker_entry_metadata = None
    if entry[:2] == _MAGIC_BROKER_ENTRY_METADATA_BYTES:
        broker_entry_metadata, entry = split_broker_entry_metadata(entry)
    checksum, start, meta_end = _split_entry(entry)
    if verify_checksum and checksum is not None:
        actual = crc32c(memoryview(entry)[start:])
        if actual != checksum:
            raise RemoteProtocolError(f"entry checksum {checksum:#010x} != computed {actual:#010x}")
    metadata = parse_message(pb.MessageMetadata, entry[start + 4 : meta_end], "MessageMetadata")
    return Entry(metadata, entry[meta_end:], checksum, broker_entry_metadata)


def entry_payload(entry: bytes) -> bytes:
    """The payload of stored entry bytes (as `parse_entry` takes them), found from the size
    fields alone: the metadata is not parsed and the checksum not verified.

    Raises:
        RemoteProtocolError: the entry is truncated.
    """
    start = _broker_entry_metadata_end(entry, 0)
    meta_end = _split_entry(entry[start:] if start else entry)[2]
    return entry[start + meta_end :]


def parse_entry_metadata(entry: bytes, *, validated: bool = False,
                         ) -> tuple[pb.MessageMetadata, int, pb.BrokerEntryMetadata | None]:
    """What `parse_entry(entry, verify_checksum=False)` tells but the payload itself: (the
    metadata, the payload's length, the 0x0e02 block or None). Only the metadata's bytes are
    copied, not the payload (a broker asks this of every entry it dispatches).

    `validated`: the entry's metadata was checked when it arrived (a stored entry), so only
    its wire format is checked again (`parse_validated`), not required fields or UTF-8.

    Raises:
        RemoteProtocolError: the entry is truncated or its metadata (or block) is invalid.
    """
    parse = parse_validated if validated else parse_message
    view = memoryview(entry)
    start = _broker_entry_metadata_end(view, 0)
    block = (parse(pb.BrokerEntryMetadata, bytes(view[6:start]), "BrokerEntryMetadata")
             if start else None)
    _, pos, meta_end = _split_entry(view[start:])
    metadata = parse(pb.MessageMetadata, bytes(view[start + pos + 4 : start + meta_end]),
                     "MessageMetadata")
    return metadata, len(entry) - start - meta_end, block


def holds_one_message(entry: bytes) -> bool:
    """Whether a stored entry (as `parse_entry_metadata` takes it) is certainly a single
    message: its metadata's bytes hold no byte that can start a key of
    `num_messages_in_batch`, so the field is absent whatever else they hold (the metadata
    need not be parsed to know it). False when they hold one (parse to know) or when the
    entry's sizes run past its end (parsing tells what is wrong). A scan of the metadata's
    bytes and no parse: a broker asks this of every entry it dispatches.
    """
    size = len(entry)
    pos = 0
    if entry.startswith(_MAGIC_BROKER_ENTRY_METADATA_BYTES):
        if size < 6:
            return False
        pos = 6 + _U32.unpack_from(entry, 2)[0]
    if entry.startswith(_MAGIC_CRC32C_BYTES, pos):
        pos += 6
    if size - pos < 4:
        return False
    start = pos + 4
    end = start + _U32.unpack_from(entry, pos)[0]
    return (end <= size and entry.find(_BATCH_COUNT_KEY, start, end) < 0
            and entry.find(_BATCH_COUNT_KEY_LONG, start, end) < 0)


def entry_payload_bytes(entry: bytes) -> int:
    """The length of `entry_payload(entry)`, found without copying the payload.

    Raises:
        RemoteProtocolError: the entry is truncated.
    """
    start = _broker_entry_metadata_end(entry, 0)
    meta_end = _split_entry(memoryview(entry)[start:] if start else entry)[2]
    return len(entry) - start - meta_end


def decode_frame(frame: bytes) -> Frame | ChecksumMismatch:
    """Decode one frame given without its 4-byte totalSize prefix.

    Args:
        frame: exactly `totalSize` bytes.

    Returns:
        A `Frame`, or a `ChecksumMismatch` for an intact SEND/MESSAGE with a bad CRC32C.

    Raises:
        RemoteProtocolError: the frame is malformed in any other way.
    """
    if len(frame) < 4:
        raise RemoteProtocolError(f"frame of {len(frame)} bytes has no command size")
    command_end = 4 + _U32.unpack_from(frame, 0)[0]
    if command_end > len(frame):
        raise RemoteProtocolError("command size runs past the end of the frame")
    # Strings are checked on the sub-command only: the envelope holds none of its own, and
    # walking its sixty optional fields would cost more than the rest of the decode.
    command = parse_message(pb.BaseCommand, frame[4:command_end], "BaseCommand", check_utf8=False)
    kind = command.type
    field = FIELD_OF_TYPE[kind]
    if command.HasField(field):
        if field in _FIELDS_WITH_STRINGS:  # not SEND's, for one
            check_strings(getattr(command, field), "BaseCommand")
    elif kind not in _EMPTY_BODY_TYPES:
        name = pb.BaseCommand.Type.Name(kind)
        raise RemoteProtocolError(f"{name} command without its sub-command")
    if kind not in PAYLOAD_COMMAND_TYPES:
        if command_end != len(frame):
            raise RemoteProtocolError(f"{len(frame) - command_end} bytes after a simple command")
        return Frame(command)
    return _decode_payload(command, frame, command_end)


def _decode_payload(command: pb.BaseCommand, frame: bytes, pos: int) -> Frame | ChecksumMismatch:
    broker_entry_metadata = None
    if command.type == pb.BaseCommand.MESSAGE and frame[pos : pos + 2] == (
        _MAGIC_BROKER_ENTRY_METADATA_BYTES
    ):
        end = _broker_entry_metadata_end(frame, pos)
        broker_entry_metadata = parse_message(
            pb.BrokerEntryMetadata, frame[pos + 6 : end], "BrokerEntryMetadata"
        )
        pos = end
    entry = frame[pos:]
    checksum, start, meta_end = _split_entry(entry)
    if checksum is not None:
        actual = crc32c(memoryview(entry)[start:])
        if actual != checksum:
            return ChecksumMismatch(command, checksum, actual)
    metadata = parse_message(pb.MessageMetadata, entry[start + 4 : meta_end], "MessageMetadata")
    return Frame(command, metadata, entry[meta_end:], broker_entry_metadata, checksum, entry)
