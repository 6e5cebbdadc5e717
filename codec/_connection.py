"""The sans-IO connection: bytes in, events out; commands in, bytes out.

Theory of operation
-------------------

A `Connection` knows which side it plays (`Role.CLIENT` or `Role.BROKER`) and tracks the
handshake. It never touches a socket: the caller feeds received bytes to `receive_data()`, pulls
events with `next_event()` until it returns `NEED_DATA`, and writes whatever `send()` returns.

    conn = Connection(Role.BROKER)
    conn.receive_data(sock.recv(65536))
    while (event := conn.next_event()) is not NEED_DATA:
        ...                       # Frame, ChecksumMismatch or ConnectionClosed
    sock.sendall(conn.send(base_command(pb.CommandPong())))

State machine. The handshake is a table keyed by (role, state, direction, command type); once
CONNECTED, any command the direction table allows may flow either way, and CONNECT/CONNECTED may
not repeat:

| role   | state      | direction | command        | next state |
|--------|------------|-----------|----------------|------------|
| client | IDLE       | sent      | CONNECT        | CONNECTING |
| client | CONNECTING | received  | AUTH_CHALLENGE | CONNECTING |
| client | CONNECTING | sent      | AUTH_RESPONSE  | CONNECTING |
| client | CONNECTING | received  | CONNECTED      | CONNECTED  |
| client | CONNECTING | received  | ERROR          | CLOSED     |
| broker | IDLE       | received  | CONNECT        | CONNECTING |
| broker | CONNECTING | sent      | AUTH_CHALLENGE | CONNECTING |
| broker | CONNECTING | received  | AUTH_RESPONSE  | CONNECTING |
| broker | CONNECTING | sent      | CONNECTED      | CONNECTED  |
| broker | CONNECTING | sent      | ERROR          | CLOSED     |

(ERROR during the handshake is how a broker rejects a connection; it closes the socket next.)

Direction: each command type is client-to-broker, broker-to-client, or both (CLOSE_PRODUCER,
CLOSE_CONSUMER, PING, PONG), per the wire reference's catalogue. On top of that a broker
connection refuses, by default, to send what the official C++ client (and so the Python client)
cannot handle -- REACHED_END_OF_TOPIC, GET_OR_CREATE_SCHEMA_RESPONSE, WATCH_TOPIC_*, transaction
replies -- because that client drops the whole connection on them (`peer_accepted_types`).

Errors. Bad input from the peer raises `RemoteProtocolError` from `next_event()` and puts the
connection in state ERROR, after which `next_event()` raises again; close the socket. A `send()`
the protocol forbids raises `LocalProtocolError`, sends nothing, and leaves the state unchanged.
Frames larger than `frame_size_bytes_max` are refused both ways; an incoming one is refused as
soon as its size prefix arrives, before its bytes are buffered.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from typing import Final

from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._framer import FRAME_SIZE_BYTES_MAX_DEFAULT, decode_frame, encode_frame
from ._frames import NEED_DATA, ChecksumMismatch, ConnectionClosed, Frame, NeedData
from ._proto import pulsar_api_pb2 as pb
from ._sends import Send, decode_plain_send_in

__all__ = [
    "BROKER_TO_CLIENT_TYPES",
    "CLIENT_TO_BROKER_TYPES",
    "CPP_CLIENT_ACCEPTED_TYPES",
    "Connection",
    "Event",
    "Role",
    "State",
]

T = pb.BaseCommand

CLIENT_TO_BROKER_TYPES: Final = frozenset(
    {
        T.CONNECT, T.SUBSCRIBE, T.PRODUCER, T.SEND, T.ACK, T.FLOW, T.UNSUBSCRIBE,
        T.CLOSE_PRODUCER, T.CLOSE_CONSUMER, T.PING, T.PONG, T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
        T.PARTITIONED_METADATA, T.LOOKUP, T.CONSUMER_STATS, T.SEEK, T.GET_LAST_MESSAGE_ID,
        T.GET_TOPICS_OF_NAMESPACE, T.GET_SCHEMA, T.AUTH_RESPONSE, T.GET_OR_CREATE_SCHEMA,
        T.NEW_TXN, T.ADD_PARTITION_TO_TXN, T.ADD_SUBSCRIPTION_TO_TXN, T.END_TXN,
        T.END_TXN_ON_PARTITION, T.END_TXN_ON_SUBSCRIPTION, T.TC_CLIENT_CONNECT_REQUEST,
        T.WATCH_TOPIC_LIST, T.WATCH_TOPIC_LIST_CLOSE,
    }
)  # fmt: skip

BROKER_TO_CLIENT_TYPES: Final = frozenset(
    {
        T.CONNECTED, T.SEND_RECEIPT, T.SEND_ERROR, T.MESSAGE, T.SUCCESS, T.ERROR,
        T.CLOSE_PRODUCER, T.CLOSE_CONSUMER, T.PRODUCER_SUCCESS, T.PING, T.PONG,
        T.PARTITIONED_METADATA_RESPONSE, T.LOOKUP_RESPONSE, T.CONSUMER_STATS_RESPONSE,
        T.REACHED_END_OF_TOPIC, T.GET_LAST_MESSAGE_ID_RESPONSE, T.ACTIVE_CONSUMER_CHANGE,
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE, T.GET_SCHEMA_RESPONSE, T.AUTH_CHALLENGE,
        T.ACK_RESPONSE, T.GET_OR_CREATE_SCHEMA_RESPONSE, T.NEW_TXN_RESPONSE,
        T.ADD_PARTITION_TO_TXN_RESPONSE, T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, T.END_TXN_RESPONSE,
        T.END_TXN_ON_PARTITION_RESPONSE, T.END_TXN_ON_SUBSCRIPTION_RESPONSE,
        T.TC_CLIENT_CONNECT_RESPONSE, T.WATCH_TOPIC_LIST_SUCCESS, T.WATCH_TOPIC_UPDATE,
        T.TOPIC_MIGRATED,
    }
)  # fmt: skip

# What the C++ client (3.5 to 4.2, inside the Python wheel) handles from a broker; anything else
# makes it close the connection (wire reference section 12). CONNECTED is the handshake reply.
CPP_CLIENT_ACCEPTED_TYPES: Final = frozenset(
    {
        T.CONNECTED, T.SEND_RECEIPT, T.SEND_ERROR, T.SUCCESS, T.ERROR,
        T.PARTITIONED_METADATA_RESPONSE, T.LOOKUP_RESPONSE, T.PRODUCER_SUCCESS,
        T.CLOSE_PRODUCER, T.CLOSE_CONSUMER, T.PING, T.PONG, T.AUTH_CHALLENGE,
        T.ACTIVE_CONSUMER_CHANGE, T.GET_LAST_MESSAGE_ID_RESPONSE,
        T.GET_TOPICS_OF_NAMESPACE_RESPONSE, T.GET_SCHEMA_RESPONSE, T.CONSUMER_STATS_RESPONSE,
        T.ACK_RESPONSE, T.TOPIC_MIGRATED, T.MESSAGE,
    }
)  # fmt: skip

_U32: Final = struct.Struct(">I")

Event = Frame | Send | ChecksumMismatch | ConnectionClosed


class Role(enum.Enum):
    """Which end of the connection this object speaks for."""

    CLIENT = "client"
    BROKER = "broker"


class State(enum.Enum):
    """Where the connection is in its life."""

    IDLE = "idle"  # nothing exchanged yet
    CONNECTING = "connecting"  # CONNECT sent (client) or received (broker); no CONNECTED yet
    CONNECTED = "connected"  # handshake done
    CLOSED = "closed"  # the peer closed, or the handshake was rejected
    ERROR = "error"  # the peer broke the protocol; only closing is left


class _Direction(enum.Enum):
    SENT = "sent"
    RECEIVED = "received"


_SENT = _Direction.SENT
_RECEIVED = _Direction.RECEIVED
_C = Role.CLIENT
_B = Role.BROKER

_HANDSHAKE: Final[dict[tuple[Role, State, _Direction, int], State]] = {
    (_C, State.IDLE, _SENT, T.CONNECT): State.CONNECTING,
    (_C, State.CONNECTING, _RECEIVED, T.AUTH_CHALLENGE): State.CONNECTING,
    (_C, State.CONNECTING, _SENT, T.AUTH_RESPONSE): State.CONNECTING,
    (_C, State.CONNECTING, _RECEIVED, T.CONNECTED): State.CONNECTED,
    (_C, State.CONNECTING, _RECEIVED, T.ERROR): State.CLOSED,
    (_B, State.IDLE, _RECEIVED, T.CONNECT): State.CONNECTING,
    (_B, State.CONNECTING, _SENT, T.AUTH_CHALLENGE): State.CONNECTING,
    (_B, State.CONNECTING, _RECEIVED, T.AUTH_RESPONSE): State.CONNECTING,
    (_B, State.CONNECTING, _SENT, T.CONNECTED): State.CONNECTED,
    (_B, State.CONNECTING, _SENT, T.ERROR): State.CLOSED,
}

_HANDSHAKE_ONLY: Final = frozenset({T.CONNECT, T.CONNECTED})


def _type_name(command_type: int) -> str:
    return str(T.Type.Name(command_type))


class Connection:
    """One end of a Pulsar binary-protocol connection, without I/O.

    Args:
        role: the side this object plays.
        frame_size_bytes_max: the largest frame accepted or sent (default: 5 MiB + 10 KiB).
        peer_accepted_types: for a broker, the command types the client can handle (default: the
            C++ client's list); None allows every broker-to-client type.
        plain_sends: for a broker, hand plain SENDs out as `Send` events, decoded without the
            protobuf runtime (`_sends.py`); other SENDs stay `Frame`s.
    """

    def __init__(
        self,
        role: Role,
        *,
        frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
        peer_accepted_types: frozenset[int] | None = CPP_CLIENT_ACCEPTED_TYPES,
        plain_sends: bool = False,
    ) -> None:
        self.role = role
        self._plain_sends = plain_sends and role is Role.BROKER
        self.frame_size_bytes_max = frame_size_bytes_max
        self.peer_accepted_types = peer_accepted_types if role is Role.BROKER else None
        self.state = State.IDLE
        self._buffer = bytearray()
        self._offset = 0  # bytes of _buffer already consumed
        self._eof = False
        self._error: ProtocolError | None = None
        self._deferred = False  # `_error` came after good frames: the next call raises it
        outgoing = CLIENT_TO_BROKER_TYPES if role is Role.CLIENT else BROKER_TO_CLIENT_TYPES
        incoming = BROKER_TO_CLIENT_TYPES if role is Role.CLIENT else CLIENT_TO_BROKER_TYPES
        self._allowed = {_SENT: outgoing, _RECEIVED: incoming}

    # -- receiving --------------------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet turned into events."""
        return len(self._buffer) - self._offset

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the peer (copied: the caller may reuse its buffer); `b""` means the
        peer closed its side.

        Raises:
            LocalProtocolError: data arrives after the end of the stream was signalled.
        """
        if self._eof:
            if data:
                raise LocalProtocolError("receive_data after the end of the stream")
            return
        if not data:
            self._eof = True
            return
        if self._offset and self._offset >= len(self._buffer) // 2:
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    def discard_received(self) -> None:
        """Drop every byte received and not yet turned into events, returning the buffer's
        memory (the connection is being closed; later bytes are not expected)."""
        self._buffer = bytearray()
        self._offset = 0

    def next_event(self) -> Event | NeedData:
        """The next event, or `NEED_DATA` when a whole frame has not arrived yet.

        Returns:
            A `Frame`, a `ChecksumMismatch` (a SEND/MESSAGE whose CRC32C failed; the connection
            stays usable), `ConnectionClosed` once the peer closed at a frame boundary, or
            `NEED_DATA`.

        Raises:
            RemoteProtocolError: the peer broke the protocol; the state becomes ERROR and every
                later call raises again.
        """
        self._raise_error()
        try:
            return self._next_event()
        except ProtocolError as exc:
            self.state = State.ERROR
            self._error = exc
            raise RemoteProtocolError(exc.reason) from None

    def events(self) -> Iterator[Event]:
        """Every event available now (stops at `NEED_DATA`), decoded in one pass over the
        buffer (`next_events`)."""
        while events := self.next_events():
            yield from events
            if isinstance(events[-1], ConnectionClosed):
                return

    def next_events(self) -> list[Event]:
        """Every event available now, decoded in one pass over the buffer: the frames of one
        socket read cost one call, not one each. An empty list means `NEED_DATA`; a
        `ConnectionClosed` comes last.

        Raises:
            RemoteProtocolError: as `next_event`, when the first frame available is bad. A bad
                frame after good ones ends the list at the good ones, and the next call raises.
        """
        self._raise_error()
        events: list[Event] = []
        try:
            self._decode_frames(events)
            if not events or self._eof:
                event = self._next_event()  # the end of the stream, or an incomplete frame
                if not isinstance(event, NeedData):
                    events.append(event)
        except ProtocolError as exc:
            self.state = State.ERROR
            self._error = exc
            if not events:
                raise RemoteProtocolError(exc.reason) from None
            self._deferred = True
        return events

    def _raise_error(self) -> None:
        """Raise the error the connection failed with, if it did: in full the first time
        after good frames were handed out, "already failed" after that."""
        if self._error is None:
            return
        if self._deferred:
            self._deferred = False
            raise RemoteProtocolError(self._error.reason)
        raise RemoteProtocolError(f"connection already failed: {self._error.reason}")

    def _decode_frames(self, events: list[Event]) -> None:
        """Append every whole frame of the buffer to `events` (stops at an incomplete one,
        and at a state that is not CONNECTED, where `_next_event` takes over).

        Raises:
            ProtocolError: a frame is bad; the good ones before it are in `events`.
        """
        buffer, pos, end = self._buffer, self._offset, len(self._buffer)
        limit = self.frame_size_bytes_max
        allowed = self._allowed[_RECEIVED]
        unpack = _U32.unpack_from
        plain_sends = self._plain_sends
        with memoryview(buffer) as view:
            while end - pos >= 4 and self.state is State.CONNECTED:
                total = unpack(buffer, pos)[0]
                if total > limit:
                    self._check_frame_size(total)
                if end - pos - 4 < total:
                    break
                start = pos + 4
                pos = self._offset = start + total
                if plain_sends and (send := decode_plain_send_in(buffer, view, start,
                                                                 pos)) is not None:
                    events.append(send)  # SEND: allowed from a client once CONNECTED
                    continue
                event = decode_frame(bytes(view[start:pos]))
                kind = event.command.type
                if kind not in allowed or kind in _HANDSHAKE_ONLY:
                    self._transition(_RECEIVED, kind)  # raises the reason
                events.append(event)

    def _next_event(self) -> Event | NeedData:
        if self.state is State.CLOSED and self._eof and not self.buffered_bytes:
            return ConnectionClosed()
        available = self.buffered_bytes
        if available >= 4:
            total = _U32.unpack_from(self._buffer, self._offset)[0]
            self._check_frame_size(total)
            if available >= 4 + total:
                start = self._offset + 4
                with memoryview(self._buffer) as view:  # one copy, and the view is released
                    frame = bytes(view[start : start + total])
                self._offset = start + total
                event = decode_frame(frame)
                self._transition(_RECEIVED, event.command.type)
                return event
        if not self._eof:
            return NEED_DATA
        if available:
            raise RemoteProtocolError(f"peer closed the connection inside a frame ({available} B)")
        self.state = State.CLOSED
        return ConnectionClosed()

    def _check_frame_size(self, total: int) -> None:
        if total > self.frame_size_bytes_max:
            raise RemoteProtocolError(
                f"frame of {total} bytes exceeds the limit of {self.frame_size_bytes_max}"
            )

    # -- sending ----------------------------------------------------------------------------

    def send(
        self,
        command: pb.BaseCommand,
        metadata: pb.MessageMetadata | None = None,
        payload: bytes = b"",
        *,
        entry: bytes | None = None,
        checksum: bool = True,
        broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
    ) -> bytes:
        """Serialize a command to send, after checking the protocol allows it now.

        Args:
            command: the BaseCommand (see `base_command`).
            metadata: SEND/MESSAGE only: the metadata, with `payload`.
            payload: SEND/MESSAGE only: the payload (already compressed or batched).
            entry: MESSAGE from a broker: stored entry bytes, sent verbatim instead.
            checksum: add the 0x0e01 magic and CRC32C when building from metadata.
            broker_entry_metadata: MESSAGE only: the 0x0e02 prefix.

        Returns:
            The bytes to write to the socket.

        Raises:
            LocalProtocolError: the command is not allowed in this state, direction or for this
                peer, a required field is missing, or the frame is too large. Nothing is sent and
                the state does not change.
        """
        next_state = self._check(_SENT, command.type)
        data = encode_frame(
            command,
            metadata,
            payload,
            entry=entry,
            checksum=checksum,
            broker_entry_metadata=broker_entry_metadata,
            frame_size_bytes_max=self.frame_size_bytes_max,
        )
        self.state = next_state
        return data

    def check_send(self, command_type: int) -> None:
        """Check that a command of this type may be sent now, as `send` checks it, for frames
        built without `send` (`message_frame`, `send_receipt_frame`) outside the handshake.

        Raises:
            LocalProtocolError: not allowed now, in this direction, or for this peer; or the
                command would change the handshake's state (send those with `send`).
        """
        if self._check(_SENT, command_type) is not self.state:
            raise LocalProtocolError(f"{_type_name(command_type)} changes the handshake's state")

    # -- the state machine ------------------------------------------------------------------

    def _check(self, direction: _Direction, command_type: int) -> State:
        """The state after this command, or the protocol error it would be."""
        if (
            self.state is State.CONNECTED
            and command_type in self._allowed[direction]
            and command_type not in _HANDSHAKE_ONLY
            and (
                direction is _RECEIVED
                or self.peer_accepted_types is None
                or command_type in self.peer_accepted_types
            )
        ):
            return State.CONNECTED  # the common case, decided without building messages
        error = LocalProtocolError if direction is _SENT else RemoteProtocolError
        name = _type_name(command_type)
        if self.state in (State.CLOSED, State.ERROR):
            raise error(f"{name} {direction.value} on a connection that is {self.state.value}")
        if command_type not in self._allowed[direction]:
            sender = self.role if direction is _SENT else _other(self.role)
            raise error(f"a {sender.value} does not send {name}")
        if (
            direction is _SENT
            and self.peer_accepted_types is not None
            and (command_type not in self.peer_accepted_types)
        ):
            raise error(f"the peer client cannot handle {name} and would drop the connection")
        if self.state is State.CONNECTED:
            raise error(f"{name} {direction.value} after the handshake")
        next_state = _HANDSHAKE.get((self.role, self.state, direction, command_type))
        if next_state is None:
            raise error(f"{name} {direction.value} during the handshake ({self.state.value})")
        return next_state

    def _transition(self, direction: _Direction, command_type: int) -> None:
        self.state = self._check(direction, command_type)


def _other(role: Role) -> Role:
    return Role.BROKER if role is Role.CLIENT else Role.CLIENT
