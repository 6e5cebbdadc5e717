"""Named advertised listeners (`--advertised-listeners`, `_listeners.py`) with the official
client's `listener_name`, frame by frame (LOOKUP's advertised_listener_name) and over the HTTP
lookup (`listenerName` / `X-Pulsar-ListenerName`; the C++ client's HTTP lookup sends neither,
so that part is checked with plain HTTP requests).

The broker under test advertises two listeners for its one port: `internal` names the port
itself, `ext` a TCP relay on another loopback port that counts the connections it carries.
A client that asks for `ext` must end up talking to the broker through the relay."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.codec import pb

from . import HOST, HTTP_TIMEOUT_S, BrokerProcess, HttpBrokerProcess, RawClient, free_port, wait_for
from .conftest import OPERATION_TIMEOUT_S
from .security import SecureBrokerProcess, make_pki

pytestmark = pytest.mark.interop

T = pb.BaseCommand
RECEIVE_MS = 5000
RELAY_CHUNK_BYTES = 65536
RELAY_DEADLINE_S = 5.0
FAILING_LOOKUP_TIMEOUT_S = 5  # operation timeout of clients whose lookups must fail


class Relay:
    """A TCP relay from a loopback port to the broker's port; counts its connections."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.connections = 0
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                relay.connections += 1
                with socket.create_connection((HOST, relay.target_port)) as upstream:
                    pump = threading.Thread(target=_pump, args=(upstream, self.request),
                                            daemon=True)
                    pump.start()
                    _pump(self.request, upstream)
                    pump.join(RELAY_DEADLINE_S)

        self.server = socketserver.ThreadingTCPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(RELAY_DEADLINE_S)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until either side closes, then close both directions."""
    with contextlib.suppress(OSError):
        while data := source.recv(RELAY_CHUNK_BYTES):
            sink.sendall(data)
    for each in (source, sink):
        with contextlib.suppress(OSError):
            each.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def relay_and_broker(tmp_path_factory: pytest.TempPathFactory,
                     ) -> Iterator[tuple[Relay, HttpBrokerProcess]]:
    port = free_port()
    relay = Relay(port)
    base = tmp_path_factory.mktemp("listeners-broker")
    process = HttpBrokerProcess(base / "data", base / "broker.log", port=port, config=(
        f"advertised_listeners=internal:pulsar://{HOST}:{port},ext:{relay.url}",))
    process.start()
    yield relay, process
    process.cleanup()
    relay.close()


@pytest.fixture
def relay(relay_and_broker: tuple[Relay, HttpBrokerProcess]) -> Relay:
    return relay_and_broker[0]


@pytest.fixture
def listening(relay_and_broker: tuple[Relay, HttpBrokerProcess]) -> HttpBrokerProcess:
    return relay_and_broker[1]


def _client(url: str, listener_name: str | None,
            timeout_s: int = OPERATION_TIMEOUT_S) -> pulsar.Client:
    return pulsar.Client(url, listener_name=listener_name, operation_timeout_seconds=timeout_s,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _lookup(port: int, topic: str, listener: str | None) -> pb.CommandLookupTopicResponse:
    connection = RawClient(port)
    try:
        connection.handshake()
        request = pb.CommandLookupTopic(topic=topic, request_id=7)
        if listener is not None:
            request.advertised_listener_name = listener
        reply: pb.CommandLookupTopicResponse = connection.request(request,
                                                                   T.LOOKUP_RESPONSE)
        return reply
    finally:
        connection.close()


# -- the official client ----------------------------------------------------------------------


def test_a_named_listener_the_broker_has_is_where_the_client_connects(
        relay: Relay, listening: HttpBrokerProcess, topic: str) -> None:
    before = relay.connections
    client = _client(listening.url, "ext")
    try:
        producer = client.create_producer(topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        producer.send(b"through ext")
        assert reader.read_next(RECEIVE_MS).data() == b"through ext"
    finally:
        client.close()
    assert relay.connections > before, "the client connected to the ext listener's URL"


def test_no_listener_name_gets_the_internal_listener(relay: Relay, listening: HttpBrokerProcess,
                                                     topic: str) -> None:
    before = relay.connections
    client = _client(listening.url, None)
    try:
        client.create_producer(topic).send(b"direct")
    finally:
        client.close()
    assert relay.connections == before


def test_a_listener_name_the_broker_lacks_fails_the_producer(listening: HttpBrokerProcess,
                                                             topic: str) -> None:
    client = _client(listening.url, "test", FAILING_LOOKUP_TIMEOUT_S)
    try:
        with pytest.raises(pulsar.ConnectError):
            client.create_producer(topic)
    finally:
        client.close()


def test_a_listener_name_without_listeners_configured_fails(broker: BrokerProcess,
                                                            topic: str) -> None:
    """The issue's reproduction: Pulsar looks the name up and fails; it is not ignored."""
    client = _client(broker.url, "test", FAILING_LOOKUP_TIMEOUT_S)
    try:
        with pytest.raises(pulsar.ConnectError):
            client.create_producer(topic)
    finally:
        client.close()


# -- frame by frame -----------------------------------------------------------------------------


def test_lookup_answers_the_named_listeners_url(relay: Relay, listening: HttpBrokerProcess,
                                                topic: str) -> None:
    ext = _lookup(listening.port, topic, "ext")
    assert (ext.response, ext.brokerServiceUrl, ext.HasField("brokerServiceUrlTls")) == (
        pb.CommandLookupTopicResponse.Connect, relay.url, False)
    for default in (None, "", "  "):
        reply = _lookup(listening.port, topic, default)
        assert (reply.response, reply.brokerServiceUrl) == (
            pb.CommandLookupTopicResponse.Connect, listening.url)
    internal = _lookup(listening.port, topic, "internal")
    assert internal.brokerServiceUrl == listening.url


def test_lookup_of_a_missing_listener_fails_as_pulsar_does(listening: HttpBrokerProcess,
                                                           broker: BrokerProcess,
                                                           topic: str) -> None:
    for port in (listening.port, broker.port):  # with listeners configured, and without
        reply = _lookup(port, topic, "nope")
        assert (reply.response, reply.error, reply.message) == (
            pb.CommandLookupTopicResponse.Failed, pb.ServiceNotReady,
            "the broker do not have nope listener")
        assert not reply.HasField("brokerServiceUrl")


# -- HTTP lookup --------------------------------------------------------------------------------


def _http_lookup(process: HttpBrokerProcess, topic: str, query: str = "",
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    local = topic.removeprefix("persistent://")
    request = urllib.request.Request(
        f"http://{HOST}:{process.http_port}/lookup/v2/topic/persistent/{local}{query}",
        headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_http_lookup_answers_the_named_listener(relay: Relay, listening: HttpBrokerProcess,
                                                topic: str) -> None:
    status, data = _http_lookup(listening, topic, "?listenerName=ext")
    assert (status, data["brokerUrl"], data["nativeUrl"]) == (200, relay.url, relay.url)
    status, data = _http_lookup(listening, topic, headers={"X-Pulsar-ListenerName": "ext"})
    assert (status, data["brokerUrl"]) == (200, relay.url)
    status, data = _http_lookup(listening, topic, "?listenerName=internal",
                                headers={"X-Pulsar-ListenerName": "ext"})
    assert (status, data["brokerUrl"]) == (200, listening.url), "the query parameter wins"
    status, data = _http_lookup(listening, topic)
    assert (status, data["brokerUrl"]) == (200, listening.url)
    status, data = _http_lookup(listening, topic, "?listenerName=nope")
    assert (status, data) == (500, {"reason": "the broker do not have nope listener"})


# -- TLS ----------------------------------------------------------------------------------------


def test_listeners_with_tls_answer_both_urls(tmp_path: Path, topic: str) -> None:
    pki = make_pki(tmp_path)
    port, tls_port, other, other_tls = (free_port() for _ in range(4))
    internal = f"pulsar://{HOST}:{port}", f"pulsar+ssl://{HOST}:{tls_port}"
    ext = f"pulsar://{HOST}:{other}", f"pulsar+ssl://{HOST}:{other_tls}"
    listeners = ",".join([f"internal:{internal[0]}", f"internal:{internal[1]}",
                          f"ext:{ext[0]}", f"ext:{ext[1]}"])
    flags = ("--tls-port", str(tls_port), "--tls-cert-file", str(pki.server_cert),
             "--tls-key-file", str(pki.server_key), "--advertised-listeners", listeners)
    process = SecureBrokerProcess(tmp_path / "data", tmp_path / "broker.log", port=port,
                                  extra_args=flags)
    process.start()
    try:
        reply = _lookup(port, topic, "ext")
        assert (reply.brokerServiceUrl, reply.brokerServiceUrlTls) == ext
        reply = _lookup(port, topic, None)
        assert (reply.brokerServiceUrl, reply.brokerServiceUrlTls) == internal
        client = pulsar.Client(internal[1], listener_name="internal",
                               tls_trust_certs_file_path=str(pki.ca),
                               tls_validate_hostname=True,
                               operation_timeout_seconds=OPERATION_TIMEOUT_S,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            client.create_producer(topic).send(b"over TLS")
            reader = client.create_reader(topic, pulsar.MessageId.earliest)
            assert reader.read_next(RECEIVE_MS).data() == b"over TLS"
        finally:
            client.close()
    finally:
        process.cleanup()


# -- start-up ---------------------------------------------------------------------------------


def test_listeners_with_tls_urls_but_no_tls_port_stop_the_broker(tmp_path: Path) -> None:
    port = free_port()
    process = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", port=port, config=(
        f"advertised_listeners=a:pulsar://{HOST}:{port},a:pulsar+ssl://{HOST}:{free_port()}",))
    with pytest.raises(AssertionError, match="exited with 1"):
        process.start()
    log = process.log_tail()
    assert "cannot start: advertised_listeners: listener 'a' has a pulsar+ssl:// URL" in log
    assert "Traceback" not in log
    wait_for(lambda: process.process is not None and process.process.poll() is not None,
             RELAY_DEADLINE_S, "the refused broker's exit")

