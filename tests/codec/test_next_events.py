"""`Connection.next_events`: every frame of the buffer decoded in one pass gives the events
`next_event` gives one at a time; a bad frame after good ones is raised on the next call,
after the good ones were handed out (as `next_event` would have)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.codec import (
    ConnectionClosed,
    Frame,
    RemoteProtocolError,
    Role,
    State,
    base_command,
    encode_frame,
    pb,
)

from .helpers import connected

T = pb.BaseCommand
PING = encode_frame(base_command(pb.CommandPing()))


def _send(sequence_id: int, payload: bytes) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
    return encode_frame(base_command(pb.CommandSend(producer_id=1, sequence_id=sequence_id)),
                        metadata, payload)


def _one_at_a_time(data: bytes) -> list[object]:
    conn = connected(Role.BROKER)
    conn.receive_data(data)
    conn.receive_data(b"")
    events: list[object] = []
    while not events or not isinstance(events[-1], ConnectionClosed):
        events.append(conn.next_event())
    return events


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.binary(max_size=64)), max_size=12),
       st.integers(1, 64))
def test_one_pass_gives_what_next_event_gives(frames: list[tuple[bool, bytes]],
                                              chunk: int) -> None:
    data = b"".join(_send(i, payload) if is_send else PING
                    for i, (is_send, payload) in enumerate(frames))
    conn = connected(Role.BROKER)
    got: list[object] = []
    for start in range(0, len(data), chunk):
        conn.receive_data(data[start : start + chunk])
        got.extend(conn.next_events())
    conn.receive_data(b"")
    got.extend(conn.next_events())
    assert got == _one_at_a_time(data)
    assert conn.state is State.CLOSED


def test_all_frames_of_a_read_come_from_one_call() -> None:
    conn = connected(Role.BROKER)
    conn.receive_data(PING * 3 + _send(7, b"x" * 100) + PING[:5])
    events = conn.next_events()
    assert [e.type for e in events if isinstance(e, Frame)] == [T.PING] * 3 + [T.SEND]
    assert conn.buffered_bytes == 5
    assert conn.next_events() == []


@pytest.mark.parametrize("bad", [
    b"\x00\x00\x00\x05\x00\x00\x00\x01\x08",  # a command that is not valid protobuf
    b"\x7f\xff\xff\xff",  # over the frame size limit
])
def test_a_bad_frame_after_good_ones_is_raised_by_the_next_call(bad: bytes) -> None:
    conn = connected(Role.BROKER)
    conn.receive_data(PING * 2 + bad)
    assert [e.type for e in conn.next_events() if isinstance(e, Frame)] == [T.PING] * 2
    assert conn.state is State.ERROR
    with pytest.raises(RemoteProtocolError):
        conn.next_events()
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


def test_a_command_from_the_wrong_side_after_good_ones_is_raised_next() -> None:
    conn = connected(Role.BROKER)
    wrong = encode_frame(base_command(pb.CommandSuccess(request_id=1)))  # broker-to-client
    conn.receive_data(PING + wrong)
    assert len(conn.next_events()) == 1
    with pytest.raises(RemoteProtocolError, match="SUCCESS"):
        conn.next_events()
