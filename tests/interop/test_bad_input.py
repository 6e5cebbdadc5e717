"""Bad input against a broker subprocess: seeded random and mutated frames, unknown commands,
commands out of order, oversized frames, and clients that stall half-way through a frame or
never speak. Each bad connection gets an answer (an error, or any frame that shows the stream
is still in sync) or is closed; the broker stays up; other connections carry on -- checked
with the official client after every batch.

A mutation can leave the broker legitimately waiting for bytes (a truncated frame, a length
that claims more than was sent): such a connection is "silent", which is allowed only when the
bytes sent really are an incomplete frame; the keep-alive closes it later (slow test)."""

from __future__ import annotations

import random
import socket
from collections import Counter
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.codec import (
    ConnectionClosed,
    Frame,
    RemoteProtocolError,
    SingleMessage,
    build_message,
    encode_frame,
    pb,
)
from magnetar.codec import base_command as wrap

from . import BrokerProcess, RawClient
from .conftest import new_client

pytestmark = pytest.mark.interop

T = pb.BaseCommand
FUZZ_CASES = 60
ANSWER_TIMEOUT_S = 0.5
RECEIVE_MS = 5000
UNKNOWN_COMMAND_TYPE = 250  # no BaseCommand.Type has this number
KEEPALIVE_S = 30.0  # the broker's default PING cadence; a silent peer is closed after two


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A private broker: fuzzing must not disturb the shared one's other tests."""
    base = tmp_path_factory.mktemp("bad-input-broker")
    process = BrokerProcess(base / "data", base / "broker.log")
    process.start()
    yield process
    process.cleanup()


def _assert_healthy(process: BrokerProcess, tag: str) -> None:
    """The broker process lives and a fresh official client produces and consumes."""
    assert process.process is not None
    assert process.process.poll() is None, f"the broker died:\n{process.log_tail()}"
    client = new_client(process.url)
    try:
        topic = f"persistent://public/default/health-{tag}"
        consumer = client.subscribe(topic, "health")
        client.create_producer(topic).send(f"ok-{tag}".encode())
        assert consumer.receive(RECEIVE_MS).data() == f"ok-{tag}".encode()
    finally:
        client.close()


def _valid_frames(rng: random.Random) -> list[bytes]:
    metadata, payload = build_message(SingleMessage(rng.randbytes(rng.randint(0, 300)),
                                                    sequence_id=0),
                                      producer_name="fuzz", publish_time=1_700_000_000_000)
    topic = "persistent://public/default/fuzz-target"
    return [
        encode_frame(wrap(pb.CommandConnect(client_version="fuzz", protocol_version=20))),
        encode_frame(wrap(pb.CommandPing())),
        encode_frame(wrap(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))),
        encode_frame(wrap(pb.CommandSubscribe(topic=topic, subscription="s", consumer_id=1,
                                              request_id=2, subType=pb.CommandSubscribe.Shared))),
        encode_frame(wrap(pb.CommandFlow(consumer_id=1, messagePermits=100))),
        encode_frame(wrap(pb.CommandSend(producer_id=1, sequence_id=0)), metadata, payload),
        encode_frame(wrap(pb.CommandLookupTopic(topic=topic, request_id=3))),
    ]


def _declared_total(data: bytes) -> int | None:
    return int.from_bytes(data[:4], "big") if len(data) >= 4 else None


def _mutate(rng: random.Random, frame: bytes) -> tuple[str, bytes]:
    kind = rng.choice(["bitflip", "truncate", "length-lie", "random", "huge", "splice"])
    data = bytearray(frame)
    if kind == "bitflip":
        for _ in range(rng.randint(1, 4)):
            bit = rng.randrange(len(data) * 8)
            data[bit // 8] ^= 1 << (bit % 8)
    elif kind == "truncate":
        del data[rng.randrange(1, len(data)):]
    elif kind == "length-lie":
        data[:4] = rng.randrange(0, 2 * len(data)).to_bytes(4, "big")
    elif kind == "random":
        data = bytearray(rng.randbytes(rng.randint(1, 200)))
    elif kind == "huge":
        data[:4] = rng.randrange(1 << 27, 1 << 32).to_bytes(4, "big")
    else:  # splice: a valid frame followed by the tail of another, mid-frame
        data += frame[rng.randrange(len(frame)):]
    return kind, bytes(data)


def _outcome(connection: RawClient) -> str:
    """'closed', 'answered' (some frame came back) or 'silent' (nothing within the timeout)."""
    try:
        event = connection.next_event()
    except (AssertionError, TimeoutError):
        return "silent"
    except OSError:
        return "closed"
    except RemoteProtocolError:
        return "answered"  # a frame our client's state machine did not expect (e.g. CONNECTED
        # to a CONNECT sent as raw bytes): the broker did answer
    if isinstance(event, ConnectionClosed):
        return "closed"
    return "answered"


def _incomplete(data: bytes) -> bool:
    """Whether the broker may still be waiting for the rest of a frame after `data`."""
    position = 0
    while position < len(data):
        total = _declared_total(data[position:])
        if total is None or position + 4 + total > len(data):
            return True
        position += 4 + total
    return False


def test_fuzzed_frames(target: BrokerProcess, seed: int) -> None:
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    for case in range(FUZZ_CASES):
        kind, data = _mutate(rng, rng.choice(_valid_frames(rng)))
        connection = RawClient(target.port, timeout_s=ANSWER_TIMEOUT_S)
        try:
            if rng.random() < 0.5:
                connection.handshake()
            connection.send_bytes(data)
            ping = encode_frame(wrap(pb.CommandPing()))
            try:
                connection.send_bytes(ping)
            except OSError:
                outcome = "closed"
            else:
                outcome = _outcome(connection)
        finally:
            connection.close()
        outcomes[f"{kind}:{outcome}"] += 1
        if outcome == "silent":
            assert _incomplete(data + ping), f"case {case} ({kind}) got no answer: {data!r}"
        if case % 20 == 19:
            _assert_healthy(target, f"fuzz-{case}")
    print(f"seed={seed} outcomes={dict(sorted(outcomes.items()))}")
    assert sum(outcomes.values()) == FUZZ_CASES


def test_unknown_command_type_is_an_error_or_a_close(target: BrokerProcess) -> None:
    connection = RawClient(target.port)
    connection.handshake()
    body = bytes([0x08]) + _varint(UNKNOWN_COMMAND_TYPE)  # BaseCommand.type only
    connection.send_bytes((len(body) + 4).to_bytes(4, "big") + len(body).to_bytes(4, "big")
                          + body)
    event = connection.next_event() if not connection.closed_by_broker() else None
    assert event is None or (isinstance(event, Frame) and event.type == T.ERROR)
    connection.close()
    _assert_healthy(target, "unknown-command")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_commands_out_of_order(target: BrokerProcess) -> None:
    before_connect = RawClient(target.port)
    before_connect.send_bytes(encode_frame(wrap(pb.CommandProducer(
        topic="persistent://public/default/x", producer_id=1, request_id=1))))
    assert before_connect.closed_by_broker()
    send_first = RawClient(target.port)
    send_first.handshake()
    metadata, payload = build_message(SingleMessage(b"early", sequence_id=0),
                                      producer_name="nobody", publish_time=1)
    send_first.send_bytes(encode_frame(wrap(pb.CommandSend(producer_id=7, sequence_id=0)),
                                       metadata, payload))
    assert send_first.closed_by_broker()
    flow = RawClient(target.port)
    flow.handshake()
    flow.send(pb.CommandFlow(consumer_id=99, messagePermits=10))
    flow.send(pb.CommandPing())  # FLOW for an unknown consumer is ignored: still in sync
    flow.expect(T.PONG)
    twice = RawClient(target.port)
    twice.handshake()
    twice.send_bytes(encode_frame(wrap(pb.CommandConnect(client_version="again",
                                                         protocol_version=20))))
    assert _outcome(twice) in {"closed", "answered"}
    for connection in (before_connect, send_first, flow, twice):
        connection.close()
    _assert_healthy(target, "out-of-order")


def test_oversized_frame_and_message(target: BrokerProcess) -> None:
    huge_frame = RawClient(target.port)
    huge_frame.handshake()
    huge_frame.send_bytes((1 << 31).to_bytes(4, "big") + b"\x00" * 64)
    assert huge_frame.closed_by_broker()
    client = new_client(target.url)
    try:
        producer = client.create_producer("persistent://public/default/too-big",
                                          batching_enabled=False)
        with pytest.raises(pulsar.PulsarException):
            producer.send(b"x" * (6 * 1024 * 1024))  # above the 5 MB default
        producer.send(b"small after")  # the producer itself survives
    finally:
        client.close()
    huge_frame.close()
    _assert_healthy(target, "oversized")


def test_stalled_and_silent_clients_do_not_block_others(target: BrokerProcess) -> None:
    ping = encode_frame(wrap(pb.CommandPing()))
    stalled = []
    for cut in (1, 3, 5, len(ping) - 1):
        connection = RawClient(target.port)
        connection.handshake()
        connection.send_bytes(ping[:cut])  # half a frame, then nothing
        stalled.append(connection)
    never = [socket.create_connection(("127.0.0.1", target.port)) for _ in range(5)]
    _assert_healthy(target, "while-stalled")
    finished = stalled[0]
    finished.send_bytes(ping[1:])  # the rest arrives late: the frame completes
    finished.expect(T.PONG)
    for connection in stalled:
        connection.close()
    for sock in never:
        sock.close()
    _assert_healthy(target, "after-stalled")


@pytest.mark.slow
def test_keepalive_closes_a_half_frame_and_a_mute_client(target: BrokerProcess) -> None:
    half = RawClient(target.port, timeout_s=3 * KEEPALIVE_S)
    half.handshake()
    half.send_bytes(encode_frame(wrap(pb.CommandPing()))[:5])
    mute = RawClient(target.port, timeout_s=3 * KEEPALIVE_S)
    try:
        assert half.closed_by_broker()
        assert mute.closed_by_broker()
    finally:
        half.close()
        mute.close()
    _assert_healthy(target, "keepalive")
