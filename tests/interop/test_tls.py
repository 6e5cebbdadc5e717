"""TLS against a real broker with certificates made in the fixture: the official client over
pulsar+ssl:// with hostname validation (and a token), an untrusted CA refused, LOOKUP's TLS
URL, plain and TLS listeners side by side, HTTPS for the admin API, and mutual TLS."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.codec import Frame, pb

from . import HOST, free_port
from .security import SECRET, Pki, SecureBrokerProcess, make_pki, raw_connect, start_secure, token

pytestmark = pytest.mark.interop

T = pb.BaseCommand
REFUSED_TIMEOUT_S = 1


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_flags(pki: Pki, tls_port: int) -> list[str]:
    return ["--tls-port", str(tls_port), "--tls-cert-file", str(pki.server_cert),
            "--tls-key-file", str(pki.server_key)]


@pytest.fixture(scope="module")
def tls_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[SecureBrokerProcess, int, int]]:
    """A broker with plain + TLS listeners, HTTPS admin, token authentication and
    authenticated /metrics; yields it, its TLS port and its HTTPS port."""
    base = tmp_path_factory.mktemp("tls-broker")
    key = base / "secret.key"
    key.write_bytes(SECRET)
    tls_port, https_port = free_port(), free_port()
    process = start_secure(base, *_tls_flags(pki, tls_port), "--https-port", str(https_port),
                           "--auth-token-secret-key", str(key),
                           config=("authenticate_metrics_endpoint=true",))
    yield process, tls_port, https_port
    process.cleanup()


def _client(url: str, trust: Path, timeout_s: int = 15, **options: object) -> pulsar.Client:
    return pulsar.Client(url, tls_trust_certs_file_path=str(trust), tls_validate_hostname=True,
                         operation_timeout_seconds=timeout_s,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **options)


def _round_trip(client: pulsar.Client, payload: bytes) -> bytes:
    topic = f"persistent://public/default/tls-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(topic, "s")
    client.create_producer(topic).send(payload)
    message = consumer.receive(5000)
    consumer.acknowledge(message)
    return bytes(message.data())


def test_produce_and_consume_over_tls_with_a_token(
        pki: Pki, tls_broker: tuple[SecureBrokerProcess, int, int]) -> None:
    _, tls_port, _ = tls_broker
    client = _client(f"pulsar+ssl://{HOST}:{tls_port}", pki.ca,
                     authentication=pulsar.AuthenticationToken(token()))
    try:
        assert _round_trip(client, b"over tls") == b"over tls"
    finally:
        client.close()


def test_plain_listener_serves_alongside(pki: Pki,
                                        tls_broker: tuple[SecureBrokerProcess, int, int]) -> None:
    broker, _, _ = tls_broker
    client = pulsar.Client(broker.url, authentication=pulsar.AuthenticationToken(token()),
                           operation_timeout_seconds=15,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        assert _round_trip(client, b"plain") == b"plain"
    finally:
        client.close()


def test_lookup_answers_the_tls_url(tls_broker: tuple[SecureBrokerProcess, int, int]) -> None:
    broker, tls_port, _ = tls_broker
    client, reply = raw_connect(broker.port, token())
    try:
        assert isinstance(reply, Frame)
        assert reply.type == T.CONNECTED
        answer = client.request(pb.CommandLookupTopic(
            topic="persistent://public/default/lookup-tls", request_id=1),
            T.LOOKUP_RESPONSE)
        assert answer.brokerServiceUrl == broker.url
        assert answer.brokerServiceUrlTls == f"pulsar+ssl://{HOST}:{tls_port}"
    finally:
        client.close()


def test_an_untrusted_ca_fails(pki: Pki, tls_broker: tuple[SecureBrokerProcess, int, int]) -> None:
    """The client cannot verify the server's certificate: its TLS handshake fails and it
    gives up at once with pulsar.ConnectError (observed with pulsar-client 3.13)."""
    _, tls_port, _ = tls_broker
    client = _client(f"pulsar+ssl://{HOST}:{tls_port}", pki.other_ca,
                     authentication=pulsar.AuthenticationToken(token()),
                     timeout_s=REFUSED_TIMEOUT_S)
    try:
        with pytest.raises(pulsar.ConnectError):
            client.create_producer("persistent://public/default/untrusted")
    finally:
        client.close()


def test_https_admin_and_authenticated_metrics(
        pki: Pki, tls_broker: tuple[SecureBrokerProcess, int, int]) -> None:
    broker, tls_port, https_port = tls_broker
    base = f"https://{HOST}:{https_port}"
    trusted = ssl.create_default_context(cafile=str(pki.ca))
    status, body = broker.http("/admin/v2/clusters", token(), base=base, context=trusted)
    assert (status, body) == (200, ["standalone"])
    status, body = broker.http("/admin/v2/clusters", base=base, context=trusted)
    assert status == 401
    # A loaded topic, so the page has its pulsar_ series whichever tests ran before on this
    # broker (alone, this test saw only the process's own series).
    client = _client(f"pulsar+ssl://{HOST}:{tls_port}", pki.ca,
                     authentication=pulsar.AuthenticationToken(token()))
    try:
        _round_trip(client, b"for the metrics")
    finally:
        client.close()
    # authenticate_metrics_endpoint=true: /metrics needs the token too, on either port.
    assert broker.http("/metrics")[0] == 401
    status, text = broker.http("/metrics", token())
    assert status == 200
    assert "pulsar_" in text
    # HTTP lookup names the TLS listener and the HTTPS admin port as well.
    status, lookup = broker.http("/lookup/v2/topic/persistent/public/default/https-lookup",
                                 token(), base=base, context=trusted)
    assert status == 200
    assert lookup["brokerUrl"] == broker.url
    assert lookup["brokerUrlTls"] == f"pulsar+ssl://{HOST}:{tls_port}"
    assert lookup["httpUrlTls"] == f"https://{HOST}:{https_port}"
    untrusted = ssl.create_default_context(cafile=str(pki.other_ca))
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        broker.http("/admin/v2/clusters", token(), base=base, context=untrusted)


def test_mutual_tls(pki: Pki, tmp_path: Path) -> None:
    tls_port = free_port()
    broker = start_secure(tmp_path, *_tls_flags(pki, tls_port), "--tls-trust-certs-file",
                          str(pki.ca), "--tls-require-trusted-client-cert")
    url = f"pulsar+ssl://{HOST}:{tls_port}"
    try:
        with_cert = _client(url, pki.ca, tls_certificate_file_path=str(pki.client_cert),
                            tls_private_key_file_path=str(pki.client_key))
        try:
            assert _round_trip(with_cert, b"mtls") == b"mtls"
        finally:
            with_cert.close()
        # Without a client certificate the broker fails the handshake; the client retries
        # until its operation timeout (observed with pulsar-client 3.13).
        without = _client(url, pki.ca, timeout_s=REFUSED_TIMEOUT_S)
        try:
            with pytest.raises(pulsar.Timeout):
                without.create_producer("persistent://public/default/no-client-cert")
        finally:
            without.close()
    finally:
        broker.cleanup()


def test_the_advertised_tls_url_can_be_set(pki: Pki, tmp_path: Path) -> None:
    advertised = "pulsar+ssl://broker.example.test:6651"
    broker = start_secure(tmp_path, *_tls_flags(pki, free_port()), "--advertised-url-tls",
                          advertised)
    try:
        client, reply = raw_connect(broker.port, None)
        try:
            assert isinstance(reply, Frame)
            assert reply.type == T.CONNECTED
            answer = client.request(pb.CommandLookupTopic(
                topic="persistent://public/default/advertised", request_id=3),
                T.LOOKUP_RESPONSE)
            assert answer.brokerServiceUrl == broker.url
            assert answer.brokerServiceUrlTls == advertised
        finally:
            client.close()
    finally:
        broker.cleanup()
