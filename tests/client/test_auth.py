"""Token authentication over TCP: refused without a token, accepted with one, and refreshed
through AUTH_CHALLENGE from a token supplier, against a standalone broker requiring tokens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import magnetar
from tests.interop import wait_for
from tests.interop.security import SECRET, SecureBrokerProcess, start_secure, token

pytestmark = pytest.mark.interop

REFRESH_CHECK_S = 0.5
RECEIVE_MS = 5000


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBrokerProcess]:
    base = tmp_path_factory.mktemp("client-auth-broker")
    key = base / "secret.key"
    key.write_bytes(SECRET)
    process = start_secure(base, "--auth-token-secret-key", str(key),
                           config=(f"auth_refresh_check_interval_s={REFRESH_CHECK_S}",))
    yield process
    process.cleanup()


def test_no_token_is_refused(auth_broker: SecureBrokerProcess) -> None:
    with pytest.raises(magnetar.ConnectError, match="authentication"):
        magnetar.Client(auth_broker.url, operation_timeout_seconds=5)


def test_a_token_over_binary_and_http_lookup(auth_broker: SecureBrokerProcess) -> None:
    auth = magnetar.AuthenticationToken(token())
    for index, url in enumerate((auth_broker.url,
                                 f"http://127.0.0.1:{auth_broker.http_port}")):
        with magnetar.Client(url, authentication=auth) as client:
            consumer = client.subscribe(f"auth-topic-{index}", "sub")
            client.create_producer(f"auth-topic-{index}").send(url.encode())
            assert consumer.receive(RECEIVE_MS).data() == url.encode()


def test_an_expiring_token_is_refreshed_on_challenge(auth_broker: SecureBrokerProcess) -> None:
    issued: list[str] = []

    def supplier() -> str:
        issued.append(token(exp_in_s=1.5))
        return issued[-1]

    with magnetar.Client(auth_broker.url,
                         authentication=magnetar.AuthenticationToken(supplier)) as client:
        consumer = client.subscribe("refresh-topic", "sub")
        producer = client.create_producer("refresh-topic")
        wait_for(lambda: len(issued) >= 2, 10, "the broker's AUTH_CHALLENGE")
        producer.send(b"after the refresh")
        assert consumer.receive(RECEIVE_MS).data() == b"after the refresh"
