"""Helpers shared by the codec tests: the three ways every decoder test feeds its input, and
small builders for frames."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

from magnetar.codec import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    Event,
    RemoteProtocolError,
    Role,
    State,
    base_command,
    pb,
)

T = TypeVar("T")

# The first bytes of a PING frame: what "trailing data" looks like on a real stream, the start of
# the next frame. A decoder must leave it buffered and ask for more.
TRAILING = bytes.fromhex("0000000900000005")

CONNECT = base_command(
    pb.CommandConnect(client_version="test-client", protocol_version=20, auth_method_name="none")
)
CONNECTED = base_command(
    pb.CommandConnected(server_version="test-broker", protocol_version=20, max_message_size=5242880)
)


def connected_pair() -> tuple[Connection, Connection]:
    """A client and a broker connection that have completed the handshake."""
    client = Connection(Role.CLIENT)
    broker = Connection(Role.BROKER)
    broker.receive_data(client.send(CONNECT))
    assert len(list(broker.events())) == 1
    client.receive_data(broker.send(CONNECTED))
    assert len(list(client.events())) == 1
    assert client.state is State.CONNECTED
    assert broker.state is State.CONNECTED
    return client, broker


def connected(role: Role) -> Connection:
    """A connection of the given role, past the handshake (the peer's half is discarded)."""
    client, broker = connected_pair()
    return client if role is Role.CLIENT else broker


def _drain(conn: Connection) -> list[Event]:
    events: list[Event] = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        assert not isinstance(event, type(NEED_DATA))
        events.append(event)
        if isinstance(event, ConnectionClosed):
            return events


def receive_three_ways(make: Callable[[], Connection], data: bytes) -> list[Event]:
    """Feed `data` whole, one byte at a time, and followed by the start of another frame.

    All three must give the same events; with the trailing bytes, those bytes must stay buffered
    and the connection must ask for more. Returns the events.
    """
    whole = make()
    whole.receive_data(data)
    expected = _drain(whole)
    assert whole.buffered_bytes == 0

    bytewise = make()
    events: list[Event] = []
    for i in range(len(data)):
        bytewise.receive_data(data[i : i + 1])
        events.extend(_drain(bytewise))
    assert events == expected

    trailing = make()
    trailing.receive_data(data + TRAILING)
    assert _drain(trailing) == expected
    assert trailing.buffered_bytes == len(TRAILING)
    assert trailing.next_event() is NEED_DATA

    in_one_pass = make()  # `next_events`: the same events, from one call per state change
    in_one_pass.receive_data(data + TRAILING)
    assert list(in_one_pass.events()) == expected
    assert in_one_pass.buffered_bytes == len(TRAILING)
    assert in_one_pass.next_events() == []
    return expected


def _feed_all(conn: Connection, chunks: Sequence[bytes]) -> None:
    for chunk in chunks:
        conn.receive_data(chunk)
        _drain(conn)
    conn.receive_data(b"")
    _drain(conn)


def reject_three_ways(make: Callable[[], Connection], data: bytes) -> str:
    """Feed bad `data` whole and one byte at a time; both must raise RemoteProtocolError (and
    nothing else), and so must the next call. Returns the reason."""
    reasons = []
    for chunks in ([data], [data[i : i + 1] for i in range(len(data))]):
        conn = make()
        with pytest.raises(RemoteProtocolError) as info:
            _feed_all(conn, chunks)
        assert conn.state is State.ERROR
        with pytest.raises(RemoteProtocolError):
            conn.next_event()
        reasons.append(info.value.reason)
    assert reasons[0] == reasons[1]
    in_one_pass = make()  # `events` (one pass per call): the same reason
    in_one_pass.receive_data(data)
    in_one_pass.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        list(in_one_pass.events())
    assert info.value.reason == reasons[0]
    with pytest.raises(RemoteProtocolError):
        in_one_pass.next_events()
    return reasons[0]


def decode_whole_prefixes_trailing(
    decode: Callable[[bytes], T],
    data: bytes,
    *,
    strict: bool = True,
    trailing_ignored: bool = False,
) -> T:
    """The three ways for a decoder that takes a complete buffer: the whole input decodes; every
    strict prefix (the input arriving byte by byte) raises RemoteProtocolError -- or, when
    `strict` is False (formats where a prefix can itself be valid), at least never decodes to the
    same result nor raises anything else. With trailing bytes the decoder raises
    RemoteProtocolError, or, for a format documented to stop at its own end
    (`trailing_ignored`), returns the same result."""
    result = decode(data)
    for candidate in [data[:i] for i in range(len(data))]:
        try:
            other = decode(candidate)
        except RemoteProtocolError:
            continue
        assert not strict, f"{candidate!r} decoded although it is not the whole input"
        assert other != result
    with_trailing = data + b"\x00\x01"
    if trailing_ignored:
        assert decode(with_trailing) == result
    else:
        with pytest.raises(RemoteProtocolError):
            decode(with_trailing)
    return result
