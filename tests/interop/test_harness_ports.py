"""The interop harness's ports: a broker whose picked port another process took meanwhile
starts again on fresh ports, and is only declared ready by its own log line, never by a
stranger answering on the port; a port given by the test, or kept for a restart, is not
changed behind the test's back, and a collision there fails with the broker's own reason."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import HOST, BrokerProcess, HttpBrokerProcess, RawClient

pytestmark = pytest.mark.interop


@contextlib.contextmanager
def _listening(port: int) -> Iterator[int]:
    """Another program listening on `port` (0: any free one); yields the port. It accepts,
    and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen()
        yield int(listener.getsockname()[1])


@pytest.fixture
def stranger() -> Iterator[int]:
    """A port some other program listens on."""
    with _listening(0) as port:
        yield port


def _handshake_works(process: BrokerProcess) -> bool:
    client = RawClient(process.port)
    try:
        return client.handshake().server_version.startswith("Magnetar")
    finally:
        client.close()


def test_a_picked_port_taken_meanwhile_is_picked_again(tmp_path: Path, stranger: int) -> None:
    process = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    process.port = stranger  # as if the pick collided with the stranger
    try:
        process.start()
        assert process.port != stranger
        assert _handshake_works(process)
        assert process.log_path.read_text().count("address already in use") == 1
    finally:
        process.cleanup()


def test_a_taken_admin_port_is_picked_again_too(tmp_path: Path, stranger: int) -> None:
    process = HttpBrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    process.http_port = stranger
    try:
        process.start()
        assert process.http_port != stranger
        assert process.get_json("/admin/v2/clusters") == ["standalone"]
    finally:
        process.cleanup()


def test_a_port_the_test_chose_is_kept_and_its_collision_reported(tmp_path: Path,
                                                                 stranger: int) -> None:
    process = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", port=stranger)
    with pytest.raises(AssertionError, match="address already in use"):
        process.start()
    assert process.port == stranger


def test_a_restart_keeps_its_port(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    try:
        process.start()
        port = process.port
        process.stop()
        with _listening(port), pytest.raises(AssertionError, match="address already in use"):
            process.start()
        assert process.port == port
        process.start()  # the thief is gone: the same port again
        assert process.port == port
        assert _handshake_works(process)
    finally:
        process.cleanup()
