"""Protobuf wire-format helpers shared by the codec's modules.

Two kinds of help live here:

* `parse_message` wraps the generated protobuf classes so that every way a message can be bad
  becomes a `RemoteProtocolError`: corrupt wire format (`DecodeError`), a missing proto2 `required`
  field (the runtime parses those without complaint), and a string field that is not UTF-8 (the
  runtime hands those back as `bytes`, which no caller expects). The last two are found in one
  walk of the fields the message holds, which costs less than the runtime's `IsInitialized`.
* Varint encoding and decoding for the hand-written `SingleMessageMetadata` codec in
  `_batch_payload.py`, the one hot path where the protobuf runtime's per-object cost matters.

Varint layout (protobuf base-128): seven payload bits per byte, least significant group first, the
high bit set on every byte but the last. A 64-bit value takes at most 10 bytes; a negative int32 or
int64 is written as its 64-bit two's complement, so it always takes 10.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message

from ._errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "VARINT_BYTES_MAX",
    "WIRE_BYTES",
    "WIRE_VARINT",
    "check_strings",
    "decode_varint",
    "encode_varint",
    "field_key",
    "holds_strings",
    "parse_message",
    "serialize_message",
]

VARINT_BYTES_MAX: Final = 10
UINT64_MASK: Final = (1 << 64) - 1

M = TypeVar("M", bound=Message)

# Precomputed encodings of the values below 2**14 (one or two bytes): payload sizes and small
# sequence ids hit this table instead of the loop.
_VARINT_CACHE_LIMIT: Final = 1 << 14


def _encode_varint_slow(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VARINT_CACHE: Final = tuple(_encode_varint_slow(v) for v in range(_VARINT_CACHE_LIMIT))


def encode_varint(value: int) -> bytes:
    """Encode `value` as a protobuf varint; negative values as 64-bit two's complement.

    Args:
        value: an integer in [-2**63, 2**64).

    Returns:
        1 to 10 bytes.
    """
    if 0 <= value < _VARINT_CACHE_LIMIT:
        return _VARINT_CACHE[value]
    # Three- and four-byte values (up to 2**28) are spelled out: sequence ids live there.
    if 0 < value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    if 0 < value < 0x10000000:
        return bytes(
            (
                (value & 0x7F) | 0x80,
                ((value >> 7) & 0x7F) | 0x80,
                ((value >> 14) & 0x7F) | 0x80,
                value >> 21,
            )
        )
    return _encode_varint_slow(value & UINT64_MASK)


WIRE_VARINT: Final = 0  # protobuf wire types of the fields the hand-built frames write
WIRE_BYTES: Final = 2


def field_key(number: int, wire_type: int) -> bytes:
    """A protobuf field's key as the runtime writes it: (number << 3 | wire type), a varint."""
    return encode_varint(number << 3 | wire_type)


def decode_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode an unsigned varint from `buf[pos:end]`.

    Args:
        buf: the buffer.
        pos: where the varint starts.
        end: where the readable region ends.

    Returns:
        `(value, position after the varint)`; the value is in [0, 2**64).

    Raises:
        RemoteProtocolError: the varint runs past `end` or is longer than 10 bytes.
    """
    result = 0
    shift = 0
    limit = min(end, pos + VARINT_BYTES_MAX)
    while pos < limit:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & UINT64_MASK, pos
        shift += 7
    if pos >= end:
        raise RemoteProtocolError("truncated varint")
    raise RemoteProtocolError("varint longer than 10 bytes")


# A checker per message type that raises TypeError when a string inside is not `str`. It is
# built once per type from the descriptor: a plan names what to do with each string or
# message field, and the check walks only the fields the message has (`ListFields`, one call
# into the runtime), so its cost follows what was sent, not how many fields the type declares
# (BaseCommand declares one per command); `"".join` refuses a `bytes` among the strings. This
# keeps the check cheap on the hot path (every command, and the metadata of every SEND and
# MESSAGE).
_Checker = Callable[[Any], None]
# Keyed by (full name, whether required fields are checked too).
_CHECKERS: dict[tuple[str, bool], _Checker | None] = {}
# The same checkers by generated class: reading a descriptor's full_name costs more than the
# check of a small message, so the hot path looks the class up instead.
_CHECKER_OF_CLASS: dict[tuple[type, bool], _Checker | None] = {}
_STRING, _STRINGS, _MESSAGE, _MESSAGES, _SCALAR = range(5)


class _MissingRequired(Exception):
    """A required field is absent (the check of `parse_message` then asks the runtime which)."""


def _checker(descriptor: Any, required: bool = False) -> _Checker | None:
    """The checker for a message type, or None when there is nothing to check (no strings,
    and with `required`, no required fields, at any depth). With `required`, the walk also
    counts the required fields present: the one pass replaces the runtime's `IsInitialized`."""
    key = (descriptor.full_name, required)
    if key in _CHECKERS:
        return _CHECKERS[key]
    _CHECKERS[key] = None  # breaks recursion (MessageIdData holds itself)
    # Keyed by the field descriptors themselves: ListFields hands back the same objects, and
    # hashing one is cheaper than reading its name (a third of the check's cost).
    plan: dict[FieldDescriptor, tuple[int, _Checker | None]] = {}
    needed = 0  # required fields the message must have
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            plan[field] = (_STRINGS if field.is_repeated else _STRING, None)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            child = _checker(field.message_type, required)
            if child is not None:
                plan[field] = (_MESSAGES if field.is_repeated else _MESSAGE, child)
        if required and field.is_required:
            needed += 1
            plan.setdefault(field, (_SCALAR, None))  # counted, nothing inside to check
    if not plan and not needed:
        return None
    join = "".join
    steps = plan.get
    required_fields = frozenset(field for field in descriptor.fields
                                if required and field.is_required)

    def check(message: Any) -> None:
        present = 0
        for field, value in message.ListFields():
            step = steps(field)
            if step is None:
                continue
            if field in required_fields:
                present += 1
            kind, child = step
            if kind == _STRING:
                join((value,))
            elif kind == _STRINGS:
                join(value)
            elif kind == _MESSAGE:
                child(value)  # type: ignore[misc]
            elif kind == _MESSAGES:
                for item in value:
                    child(item)  # type: ignore[misc]
        if present != needed:
            raise _MissingRequired

    _CHECKERS[key] = check
    return check


def holds_strings(descriptor: Any) -> bool:
    """Whether messages of this type can hold a string anywhere (else `check_strings` of
    one has nothing to check)."""
    return _checker(descriptor) is not None


def check_strings(message: Message, what: str) -> None:
    """Raise RemoteProtocolError if any string inside `message` is not valid UTF-8.

    The runtime hands such strings back as `bytes` (proto2 does not validate them); an unset
    string field reads as "" and passes.
    """
    _check(message, what, False)


def _check(message: Message, what: str, required: bool) -> None:
    """`check_strings`; with `required`, also what `IsInitialized` checks, in the same walk.

    Raises:
        RemoteProtocolError: a string is not UTF-8, or (`required`) a required field is
            missing, named as the runtime names it.
    """
    key = (type(message), required)
    try:
        checker = _CHECKER_OF_CLASS[key]
    except KeyError:
        checker = _CHECKER_OF_CLASS[key] = _checker(message.DESCRIPTOR, required)
    if checker is None:
        return
    try:
        checker(message)
    except TypeError:
        raise RemoteProtocolError(f"{what} holds a string that is not valid UTF-8") from None
    except _MissingRequired:
        missing = ", ".join(_initialization_errors(message))
        raise RemoteProtocolError(f"{what} lacks required fields: {missing}") from None


def _initialization_errors(message: Message) -> list[str]:
    # The runtime has the method on every message; the typing stubs leave it out.
    errors: list[str] = cast(Any, message).FindInitializationErrors()
    return errors


def parse_validated(cls: type[M], data: bytes, what: str) -> M:
    """Parse bytes that `parse_message` accepted before (a stored entry's metadata, checked
    when its SEND arrived): only the wire format is checked again, not required fields or
    UTF-8, which cost six times the parse itself.

    Raises:
        RemoteProtocolError: the bytes are not valid protobuf.
    """
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise RemoteProtocolError(f"{what} is not valid protobuf ({exc})") from None
    return message


def parse_message(cls: type[M], data: bytes, what: str, *, check_utf8: bool = True) -> M:
    """Parse `data` as a message of type `cls`, checking what the runtime does not.

    Args:
        cls: the generated message class.
        data: exactly the serialized message.
        what: a name for error messages ("BaseCommand", "MessageMetadata", ...).
        check_utf8: check string fields (a caller may check a part itself, see `check_strings`).

    Returns:
        The parsed message, with every required field present and every string valid UTF-8.

    Raises:
        RemoteProtocolError: the bytes are not a valid, complete message of that type.
    """
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise RemoteProtocolError(f"{what} is not valid protobuf ({exc})") from None
    if check_utf8:
        _check(message, what, True)  # required fields and strings in one walk
    elif not message.IsInitialized():
        missing = ", ".join(_initialization_errors(message))
        raise RemoteProtocolError(f"{what} lacks required fields: {missing}")
    return message


def serialize_message(message: Message, what: str) -> bytes:
    """Serialize `message`, refusing one that lacks a required field.

    Raises:
        LocalProtocolError: a required field is missing.
    """
    try:
        return message.SerializeToString()
    except EncodeError:
        missing = ", ".join(_initialization_errors(message))
        raise LocalProtocolError(f"{what} lacks required fields: {missing}") from None
