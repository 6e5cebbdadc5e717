"""Our client over TLS (`pulsar+ssl://`) against a standalone broker with a TLS listener and
certificates made in the fixture: a round trip with hostname validation, and a broker whose
certificate the client does not trust refused with a clear error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import magnetar
from tests.interop import HOST, free_port
from tests.interop.security import Pki, SecureBrokerProcess, make_pki, start_secure

pytestmark = pytest.mark.interop

RECEIVE_MS = 5000


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[tuple[SecureBrokerProcess, Pki, str]]:
    """A broker with a TLS listener; yields it, its PKI and its pulsar+ssl:// URL."""
    base = tmp_path_factory.mktemp("client-tls-broker")
    pki = make_pki(base)
    port = free_port()
    process = start_secure(base, "--tls-port", str(port), "--tls-cert-file",
                           str(pki.server_cert), "--tls-key-file", str(pki.server_key))
    yield process, pki, f"pulsar+ssl://{HOST}:{port}"
    process.cleanup()


def test_round_trip_over_tls(tls_broker: tuple[SecureBrokerProcess, Pki, str]) -> None:
    _, pki, url = tls_broker
    topic = f"persistent://public/default/tls-{uuid.uuid4().hex[:8]}"
    with magnetar.Client(url, tls_trust_certs_file_path=str(pki.ca),
                         tls_validate_hostname=True) as client:
        consumer = client.subscribe(topic, "sub")
        producer = client.create_producer(topic, batching_enabled=True)
        sent = [producer.send(f"m{i}".encode()) for i in range(3)]
        received = [consumer.receive(RECEIVE_MS) for _ in range(3)]
        for message in received:
            consumer.acknowledge(message)
        assert [m.data() for m in received] == [b"m0", b"m1", b"m2"]
        assert [m.message_id() for m in received] == sent


def test_an_untrusted_broker_is_refused(tls_broker: tuple[SecureBrokerProcess, Pki, str],
                                        ) -> None:
    _, pki, url = tls_broker
    with pytest.raises(magnetar.ConnectError, match="cannot connect"):
        magnetar.Client(url, tls_trust_certs_file_path=str(pki.other_ca),
                        connection_timeout_ms=5000)
