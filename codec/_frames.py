"""The events the frame layer hands out, and the sentinel for "need more bytes".

Events are frozen dataclasses (h11 style). They hold parsed protobuf messages, which the
protobuf runtime makes mutable; treat them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from google.protobuf.message import Message

from ._proto import pulsar_api_pb2 as pb

__all__ = ["NEED_DATA", "ChecksumMismatch", "ConnectionClosed", "Frame", "NeedData"]


class NeedData:
    """Sentinel type: `next_event()` needs more bytes before it can return an event."""

    _instance: NeedData | None = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

# BaseCommand keeps its one sub-command in the field whose number equals the type's value.
FIELD_OF_TYPE: Final = {f.number: f.name for f in pb.BaseCommand.DESCRIPTOR.fields if f.number > 1}


def command_body(command: pb.BaseCommand) -> Message:
    """The sub-command of a BaseCommand (e.g. its CommandSend for type SEND)."""
    body: Message = getattr(command, FIELD_OF_TYPE[command.type])
    return body


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame: a command, and for SEND/MESSAGE its metadata and payload.

    Attributes:
        command: the `BaseCommand`; `command.type` says which sub-command it holds.
        metadata: the entry's `MessageMetadata` (SEND and MESSAGE only).
        payload: the entry's payload as sent, possibly compressed or a batch (b"" otherwise).
        broker_entry_metadata: the broker's prefix on a MESSAGE (magic 0x0e02), if any.
        checksum: the CRC32C the frame carried, already verified; None if it carried none.
        entry: for SEND/MESSAGE, the bytes from the checksum magic (or from the metadata size
            when there is no magic) to the end: what a broker stores verbatim and dispatches.
    """

    command: pb.BaseCommand
    metadata: pb.MessageMetadata | None = None
    payload: bytes = b""
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None
    checksum: int | None = None
    entry: bytes = b""

    @property
    def type(self) -> int:
        """The command type (a `pb.BaseCommand.Type` value)."""
        return int(self.command.type)

    @property
    def body(self) -> Message:
        """The sub-command, e.g. the `CommandSend` of a SEND."""
        return command_body(self.command)


@dataclass(frozen=True, slots=True)
class ChecksumMismatch:
    """A SEND or MESSAGE whose CRC32C does not match its metadata and payload.

    The frame boundaries were intact, so the connection can go on. Pulsar's broker answers a SEND
    like this with SEND_ERROR `ChecksumError`; a consumer discards a MESSAGE like this and
    acknowledges it with `validation_error = ChecksumMismatch`. The metadata is not parsed: it may
    be the corrupt part.

    Attributes:
        command: the `BaseCommand` (outside the checksum, so usable).
        expected: the checksum the frame carried.
        actual: the checksum of the bytes that arrived.
    """

    command: pb.BaseCommand
    expected: int
    actual: int


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed its side (`receive_data(b"")`) at a frame boundary."""
