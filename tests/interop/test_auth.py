"""Token authentication against a real broker: the CONNECT refusal form (wire reference 5.1),
the AUTH_CHALLENGE/AUTH_RESPONSE refresh frame by frame, the official client with good, bad
and refreshing tokens, the admin API's bearer check, and the CLI's --auth-token."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.cli import main
from magnetar.codec import ConnectionClosed, Frame, pb

from . import HOST, wait_for
from .security import SECRET, SecureBrokerProcess, raw_connect, start_secure, token

pytestmark = pytest.mark.interop

T = pb.BaseCommand
UINT64_MAX = (1 << 64) - 1
REFRESH_CHECK_S = 0.5  # the broker's auth_refresh_check_interval_s in this module
REJECT_TIMEOUT_S = 1  # the client's operation timeout where a refusal is expected


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBrokerProcess]:
    base = tmp_path_factory.mktemp("auth-broker")
    key = base / "secret.key"
    key.write_bytes(SECRET)
    process = start_secure(base, "--auth-token-secret-key", str(key),
                           config=(f"auth_refresh_check_interval_s={REFRESH_CHECK_S}",
                                   "superuser_roles=admin"))
    yield process
    process.cleanup()


def _client(broker: SecureBrokerProcess, auth: pulsar.Authentication | None,
            timeout_s: int = 15) -> pulsar.Client:
    return pulsar.Client(broker.url, authentication=auth, operation_timeout_seconds=timeout_s,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _topic(name: str) -> str:
    return f"persistent://public/default/{name}-{uuid.uuid4().hex[:8]}"


# -- the wire ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("credentials", "reason"), [
    (None, "authentication is required"),
    ("not-a-token", "3 dot-separated parts"),
    (token(key=b"some other secret key of 32 byte"), "signature does not verify"),
    (token(exp_in_s=-10), "expired"),
])
def test_a_refused_connect_is_error_minus_one_then_close(
        auth_broker: SecureBrokerProcess, credentials: str | None, reason: str) -> None:
    client, reply = raw_connect(auth_broker.port, credentials)
    try:
        assert isinstance(reply, Frame)
        assert reply.type == T.ERROR, reply
        error = reply.command.error
        assert error.request_id == UINT64_MAX
        assert error.error == pb.AuthenticationError
        assert reason in error.message
        assert isinstance(client.next_event(), ConnectionClosed)
    finally:
        client.close()


def test_an_unknown_method_is_refused(auth_broker: SecureBrokerProcess) -> None:
    client, reply = raw_connect(auth_broker.port, "user:pass", method="basic")
    try:
        assert isinstance(reply, Frame)
        assert reply.type == T.ERROR
        assert "method 'basic' is not enabled" in reply.command.error.message
    finally:
        client.close()


def test_challenge_answered_keeps_the_connection(auth_broker: SecureBrokerProcess) -> None:
    client, reply = raw_connect(auth_broker.port, token(exp_in_s=0.5))
    try:
        assert isinstance(reply, Frame)
        assert reply.type == T.CONNECTED
        challenge: pb.CommandAuthChallenge = client.expect(T.AUTH_CHALLENGE).body
        assert challenge.challenge.auth_method_name == "token"
        assert challenge.challenge.auth_data == b"PulsarAuthRefresh"
        client.send(pb.CommandAuthResponse(
            client_version="magnetar-interop", protocol_version=20,
            response=pb.AuthData(auth_method_name="token", auth_data=token().encode())))
        # Refreshed for good (no expiry): the connection serves requests, nothing else comes.
        topic = _topic("refreshed")
        success = client.request(pb.CommandProducer(topic=topic, producer_id=1, request_id=7),
                                 T.PRODUCER_SUCCESS)
        assert success.request_id == 7
        client.send(pb.CommandPing())
        assert client.next_event().type == T.PONG  # type: ignore[union-attr]
    finally:
        client.close()


@pytest.mark.parametrize("answer", [None, token(exp_in_s=-1), token("mallory")])
def test_challenge_unanswered_or_badly_answered_closes(
        auth_broker: SecureBrokerProcess, answer: str | None) -> None:
    client, reply = raw_connect(auth_broker.port, token(exp_in_s=0.5))
    try:
        assert isinstance(reply, Frame)
        assert reply.type == T.CONNECTED
        client.expect(T.AUTH_CHALLENGE)
        if answer is not None:
            client.send(pb.CommandAuthResponse(
                client_version="magnetar-interop", protocol_version=20,
                response=pb.AuthData(auth_method_name="token", auth_data=answer.encode())))
        assert client.closed_by_broker()
    finally:
        client.close()


def test_expiry_without_refresh_support_closes(auth_broker: SecureBrokerProcess) -> None:
    client, reply = raw_connect(auth_broker.port, token(exp_in_s=0.5), refresh=False)
    try:
        assert isinstance(reply, Frame)
        assert reply.type == T.CONNECTED
        assert isinstance(client.next_event(), ConnectionClosed)  # no challenge before it
    finally:
        client.close()


# -- the official client ----------------------------------------------------------------------


def test_a_good_token_produces_and_consumes(auth_broker: SecureBrokerProcess) -> None:
    client = _client(auth_broker, pulsar.AuthenticationToken(token("admin")))
    try:
        topic = _topic("good-token")
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        producer.send(b"hello")
        message = consumer.receive(5000)
        assert message.data() == b"hello"
        consumer.acknowledge(message)
    finally:
        client.close()


def test_a_refused_client_fails_with_timeout(auth_broker: SecureBrokerProcess) -> None:
    """What the official client (C++ inside, pulsar-client 3.13) really does with a refused
    CONNECT: it treats the ERROR as a dropped connection and retries its lookup until the
    operation timeout, so `pulsar.Timeout` is raised, not `pulsar.AuthenticationError`
    (apache/pulsar-client-cpp issue 227). Pulsar's own broker answers the same way."""
    client = _client(auth_broker, pulsar.AuthenticationToken("not-a-token"),
                     timeout_s=REJECT_TIMEOUT_S)
    began = time.monotonic()
    try:
        with pytest.raises(pulsar.Timeout):
            client.create_producer(_topic("refused"))
        assert time.monotonic() - began < REJECT_TIMEOUT_S + 5
    finally:
        client.close()
    assert "refusing the connection" in auth_broker.log_path.read_text()


def test_refresh_keeps_a_consumer_receiving(auth_broker: SecureBrokerProcess) -> None:
    issued: list[float] = []
    role = f"refresher-{uuid.uuid4().hex[:8]}"

    def supplier() -> str:
        issued.append(time.monotonic())
        return token(role, exp_in_s=1.0)

    client = _client(auth_broker, pulsar.AuthenticationToken(supplier))
    try:
        topic = _topic("refresh")
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        sent = 0
        # Several token lifetimes: each expiry is refreshed in place over the same connection.
        wait_for(lambda: len(issued) >= 3, 15, "two refreshes")
        for sent in range(5):
            producer.send(f"m{sent}".encode())
            message = consumer.receive(5000)
            assert message.data() == f"m{sent}".encode()
            consumer.acknowledge(message)
        assert sent == 4
        assert consumer.is_connected()
        assert producer.is_connected()
    finally:
        client.close()
    log = auth_broker.log_path.read_text()
    # One connection all along (never re-established), refreshed in place each time.
    assert log.count(f"authenticated as '{role}'") == 1
    assert log.count(f"credentials of '{role}' on") >= 2


# -- admin HTTP and the CLI -------------------------------------------------------------------


def test_admin_api_needs_a_bearer_token(auth_broker: SecureBrokerProcess) -> None:
    status, body = auth_broker.http("/admin/v2/tenants")
    assert status == 401
    assert "Authentication required" in body["reason"]
    status, body = auth_broker.http("/admin/v2/tenants", bearer="garbage")
    assert status == 401
    assert "3 dot-separated parts" in body["reason"]
    status, body = auth_broker.http("/admin/v2/tenants", bearer=token(exp_in_s=-1))
    assert (status, "expired" in body["reason"]) == (401, True)
    status, body = auth_broker.http("/admin/v2/tenants", bearer=token("admin"))
    assert (status, "public" in body) == (200, True)


def test_metrics_are_open_by_default(auth_broker: SecureBrokerProcess) -> None:
    status, body = auth_broker.http("/metrics")
    assert status == 200
    assert "magnetar_journal_fsync_latency_seconds" in body  # the broker's own, not only Python's


def test_cli_commands_take_auth_tokens(auth_broker: SecureBrokerProcess, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """In process: a `magnetar produce` subprocess sometimes aborts at interpreter exit inside
    the C++ client's teardown ("terminate called without an active exception"), with or
    without authentication, after its work is done."""
    topic = _topic("cli")
    token_file = tmp_path / "token"
    token_file.write_text(token("admin") + "\n")
    assert main(["produce", topic, "-m", "via-cli", "--url", auth_broker.url,
                 "--auth-token-file", str(token_file), "--timeout-s", "20"]) == 0
    assert "1 messages successfully produced" in capsys.readouterr().out
    admin_url = f"http://{HOST}:{auth_broker.http_port}"
    assert main(["topics", "list", "public/default", "--admin-url", admin_url,
                 "--auth-token", token("admin")]) == 0
    assert topic in capsys.readouterr().out.split()
    assert main(["topics", "list", "public/default", "--admin-url", admin_url]) == 1
    assert "HTTP 401" in capsys.readouterr().err
