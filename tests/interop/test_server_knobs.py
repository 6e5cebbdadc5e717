"""The server-level options of `magnetar standalone`: a short --keepalive-interval-s closes a
silent connection and keeps one that answers the broker's PINGs; --help explains each option."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from magnetar.broker.cli import build_parser
from magnetar.broker.wire._connection_view import (
    KEEPALIVE_INTERVAL_S_DEFAULT,
    PENDING_SENDS_MAX_DEFAULT,
)
from magnetar.codec import Frame, pb

from . import BrokerProcess, RawClient

T = pb.BaseCommand
KEEPALIVE_S = 0.3
PINGS_ANSWERED = 4  # the answering connection outlives this many intervals


@pytest.fixture(scope="module")
def quick_keepalive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("keepalive-broker")
    process = BrokerProcess(base / "data", base / "broker.log",
                            extra_args=("--keepalive-interval-s", str(KEEPALIVE_S),
                                        "--max-pending-sends", "10"))
    process.start()
    yield process
    process.cleanup()


def _answer_pings(client: RawClient, count: int) -> None:
    """Read frames, answering each broker PING, until `count` PINGs were answered."""
    answered = 0
    while answered < count:
        client.conn.receive_data(client.sock.recv(65536))
        for event in client.conn.events():
            assert isinstance(event, Frame), f"the broker closed an answering connection: {event}"
            if event.type == T.PING:
                client.send(pb.CommandPong())
                answered += 1


def test_short_keepalive_closes_a_silent_connection_and_keeps_an_answering_one(
        quick_keepalive: BrokerProcess) -> None:
    silent = RawClient(quick_keepalive.port, timeout_s=20 * KEEPALIVE_S)
    answering = RawClient(quick_keepalive.port, timeout_s=20 * KEEPALIVE_S)
    try:
        silent.handshake()
        answering.handshake()
        began = time.monotonic()
        _answer_pings(answering, PINGS_ANSWERED)  # the silent one sits meanwhile
        answering.send(pb.CommandPing())  # still served after several intervals
        answering.expect(T.PONG)
        assert silent.closed_by_broker(), "a connection that never answers PING is closed"
        assert time.monotonic() - began < 20 * KEEPALIVE_S
    finally:
        silent.close()
        answering.close()


def test_standalone_help_explains_the_server_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["standalone", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "keepAliveIntervalSeconds" in text
    assert "maxPendingPublishRequestsPerConnection" in text
    assert "--shutdown-grace-s" in text
    args = build_parser().parse_args(["standalone", "--data-dir", "d"])
    assert (args.keepalive_interval_s, args.max_pending_sends) == (None, None)  # not given
    from magnetar.broker.cli._config_file import build, merge

    options = build(merge(), data_dir_needed=False)  # the settings' defaults
    assert options.keepalive_interval_s == KEEPALIVE_INTERVAL_S_DEFAULT
    assert options.pending_sends_max == PENDING_SENDS_MAX_DEFAULT
    args = build_parser().parse_args(["standalone", "--data-dir", "d",
                                      "--keepalive-interval-s", "2.5", "--max-pending-sends", "7"])
    assert (args.keepalive_interval_s, args.max_pending_sends) == (2.5, 7)
