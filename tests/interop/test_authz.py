"""Authorization against a real broker with three authentication providers (token, basic,
tls), an anonymous role and authorization on, as the official client's own test setup has it:
each action allowed and refused, the exact refusal frames on the raw protocol, the CLI's
grant commands, and grants that survive a restart."""

from __future__ import annotations

import json
import re
import select
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import _pulsar
import bcrypt
import pulsar
import pytest
from passlib.hash import des_crypt

from magnetar.broker.cli import main
from magnetar.codec import ConnectionClosed, Frame, pb

from . import HOST, RawClient, free_port, wait_for
from .security import (
    HTTP_TIMEOUT_S,
    SECRET,
    Pki,
    SecureBrokerProcess,
    make_pki,
    raw_connect,
    start_secure,
    token,
)

pytestmark = pytest.mark.interop

T = pb.BaseCommand
NS = "public/default"
UINT64_MAX = (1 << 64) - 1  # the request id of a refused CONNECT's ERROR
SLOW_ROUNDS = 11  # a bcrypt cost whose check takes far longer than a few PING round trips
REFUSED_TIMEOUT_S = 3  # the client's operation timeout where a refusal is expected
ADMIN_UP_S = 20  # how long the admin API may take to listen after the broker port
HTTPS_PORT = free_port()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("authz-pki"))


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[SecureBrokerProcess, int]]:
    base = tmp_path_factory.mktemp("authz-broker")
    key = base / "secret.key"
    key.write_bytes(SECRET)
    users = base / "users.htpasswd"
    users.write_text(f"bob:{bcrypt.hashpw(b'bobs-pw', bcrypt.gensalt(rounds=4)).decode()}\n"
                     f"dora:{des_crypt.hash('doras-pw')}\n"  # traditional DES crypt
                     f"slow:{bcrypt.hashpw(b'slow-pw', bcrypt.gensalt(SLOW_ROUNDS)).decode()}\n")
    tls_port = free_port()
    process = start_secure(
        base, "--auth-token-secret-key", str(key), "--tls-port", str(tls_port),
        "--https-port", str(HTTPS_PORT),
        "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
        "--tls-trust-certs-file", str(pki.ca),
        config=("authentication_providers=token,basic,tls", f"basic_auth_conf={users}",
                "anonymous_user_role=anon", "authorization_enabled=true",
                "superuser_roles=admin"))
    try:
        wait_for(lambda: _admin_up(process), ADMIN_UP_S, "the admin API")
        assert _admin(process, "POST", f"/admin/v2/namespaces/{NS}/permissions/bob",
                      ["produce"]) == 204
        assert _admin(process, "POST", f"/admin/v2/namespaces/{NS}/permissions/client",
                      ["consume"]) == 204
        assert _admin(process, "POST", f"/admin/v2/namespaces/{NS}/permissions/dora",
                      ["produce"]) == 204
        yield process, tls_port
    finally:
        process.cleanup()


def _admin_up(process: SecureBrokerProcess) -> bool:
    try:
        return _admin(process, "GET", "/admin/v2/clusters") == 200
    except urllib.error.URLError:
        return False


def _admin(process: SecureBrokerProcess, method: str, path: str, body: Any = None,
           role: str = "admin") -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{HOST}:{process.http_port}{path}", data=data, method=method,
        headers={"Authorization": f"Bearer {token(role)}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
            status: int = answer.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


def _topic(name: str) -> str:
    return f"persistent://{NS}/{name}-{uuid.uuid4().hex[:8]}"


def _client(url: str, auth: pulsar.Authentication | None = None, **options: Any
            ) -> pulsar.Client:
    return pulsar.Client(url, authentication=auth, operation_timeout_seconds=REFUSED_TIMEOUT_S,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **options)


def _tls_client(pki: Pki, tls_port: int) -> pulsar.Client:
    return _client(f"pulsar+ssl://{HOST}:{tls_port}",
                   pulsar.AuthenticationTLS(str(pki.client_cert), str(pki.client_key)),
                   tls_trust_certs_file_path=str(pki.ca))


def _can_produce(client: pulsar.Client, topic: str) -> bool:
    try:
        producer = client.create_producer(topic)
    except pulsar.AuthorizationError:
        return False
    producer.send(b"x")
    producer.close()
    return True


def _can_subscribe(client: pulsar.Client, topic: str) -> bool:
    try:
        client.subscribe(topic, f"sub-{uuid.uuid4().hex[:6]}").close()
    except pulsar.AuthorizationError:
        return False
    return True


def _can_read(client: pulsar.Client, topic: str) -> bool:
    try:
        client.create_reader(topic, pulsar.MessageId.earliest).close()
    except pulsar.AuthorizationError:
        return False
    return True


def test_each_role_produces_and_consumes_as_granted(
        broker: tuple[SecureBrokerProcess, int], pki: Pki) -> None:
    process, tls_port = broker
    topic = _topic("roles")
    clients = {
        "admin (token, superuser)": _client(process.url, pulsar.AuthenticationToken(
            token("admin"))),
        "bob (basic, produce)": _client(process.url, pulsar.AuthenticationBasic("bob",
                                                                                 "bobs-pw")),
        "dora (basic, DES crypt, produce)": _client(
            process.url, pulsar.AuthenticationBasic("dora", "doras-pw")),
        "client (tls certificate, consume)": _tls_client(pki, tls_port),
        "anon (no credentials)": _client(process.url),
        "mallory (token, no grant)": _client(process.url, pulsar.AuthenticationToken(
            token("mallory"))),
    }
    try:
        seen = {name: (_can_produce(c, topic), _can_subscribe(c, topic), _can_read(c, topic))
                for name, c in clients.items()}
        assert seen == {  # (produce, subscribe, read)
            "admin (token, superuser)": (True, True, True),
            "bob (basic, produce)": (True, False, False),
            "dora (basic, DES crypt, produce)": (True, False, False),
            "client (tls certificate, consume)": (False, True, True),
            "anon (no credentials)": (False, False, False),
            "mallory (token, no grant)": (False, False, False),
        }
        # a topic grant to the anonymous role opens that topic only
        local = topic.rsplit("/", 1)[1]
        assert _admin(process, "POST", f"/admin/v2/persistent/{NS}/{local}/permissions/anon",
                      ["produce"]) == 204
        assert _can_produce(clients["anon (no credentials)"], topic)
        assert not _can_produce(clients["anon (no credentials)"], _topic("other"))
    finally:
        for client in clients.values():
            client.close()


def test_bad_basic_password_is_refused(broker: tuple[SecureBrokerProcess, int]) -> None:
    process, _ = broker
    client = _client(process.url, pulsar.AuthenticationBasic("bob", "wrong"))
    try:
        with pytest.raises((pulsar.AuthenticationError, pulsar.ConnectError, pulsar.Timeout)):
            client.create_producer(_topic("bad-basic"))
    finally:
        client.close()
    assert "Unknown user or invalid password" in process.log_tail(200)
    assert "wrong" not in process.log_tail(200).replace("wrong password for", "")


def _refusal(client: RawClient, body: Any, reply_type: int) -> Any:
    client.send(body)
    return client.expect(reply_type).body


def test_refusals_on_the_raw_protocol(broker: tuple[SecureBrokerProcess, int]) -> None:
    process, _ = broker
    client, reply = raw_connect(process.port, token("mallory"), watchers=True)
    topic = _topic("raw")
    try:
        assert reply.type == T.CONNECTED
        error = _refusal(client, pb.CommandProducer(topic=topic, producer_id=1, request_id=1),
                         T.ERROR)
        assert (error.request_id, error.error, error.message) == (
            1, pb.AuthorizationError, "Client is not authorized to Produce")
        error = _refusal(client, pb.CommandSubscribe(
            topic=topic, subscription="s", subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1, request_id=2), T.ERROR)
        assert (error.request_id, error.error, error.message) == (
            2, pb.AuthorizationError, "Client is not authorized to subscribe")
        lookup = _refusal(client, pb.CommandLookupTopic(topic=topic, request_id=3),
                          T.LOOKUP_RESPONSE)
        assert (lookup.response, lookup.error, lookup.message) == (
            pb.CommandLookupTopicResponse.Failed, pb.AuthorizationError,
            "Client is not authorized to Lookup")
        partitions = _refusal(client, pb.CommandPartitionedTopicMetadata(
            topic=topic, request_id=4), T.PARTITIONED_METADATA_RESPONSE)
        assert (partitions.response, partitions.error, partitions.message) == (
            pb.CommandPartitionedTopicMetadataResponse.Failed, pb.AuthorizationError,
            "Client is not authorized to Get Partition Metadata")
        error = _refusal(client, pb.CommandGetTopicsOfNamespace(namespace=NS, request_id=5),
                         T.ERROR)
        assert (error.error, error.message) == (
            pb.AuthorizationError, "Client is not authorized to GetTopicsOfNamespace")
        schema = _refusal(client, pb.CommandGetSchema(topic=topic, request_id=6),
                          T.GET_SCHEMA_RESPONSE)
        assert (schema.error_code, schema.error_message) == (
            pb.AuthorizationError, "Client is not authorized to Get Schema")
        error = _refusal(client, pb.CommandWatchTopicList(
            request_id=7, watcher_id=1, namespace=NS, topics_pattern=".*"), T.ERROR)
        assert (error.request_id, error.error) == (7, pb.AuthorizationError)
        # the connection stays usable after refusals
        client.send(pb.CommandPing())
        assert client.expect(T.PONG) is not None
    finally:
        client.close()
    assert "role 'mallory' may not produce on" in process.log_tail(200)


def test_cli_grants_and_grants_survive_a_restart(
        broker: tuple[SecureBrokerProcess, int], capsys: pytest.CaptureFixture[str]) -> None:
    process, _ = broker
    admin_url = f"http://{HOST}:{process.http_port}"
    topic = _topic("cli")
    common = ["--admin-url", admin_url, "--auth-token", token("admin")]
    assert main(["topics", "grant-permission", topic, "--role", "carol", "--actions",
                 "produce,consume", *common]) == 0
    assert main(["topics", "permissions", topic, *common]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["carol"] == ["consume", "produce"]
    assert shown["bob"] == ["produce"]  # the namespace's grants are included
    assert main(["namespaces", "grant-permission", NS, "--role", "dave", "--actions",
                 "consume", *common]) == 0
    assert main(["namespaces", "revoke-permission", NS, "--role", "dave", *common]) == 0
    assert main(["namespaces", "permissions", NS, *common]) == 0
    assert "dave" not in json.loads(capsys.readouterr().out)
    assert main(["namespaces", "grant-permission", NS, "--role", "x", *common[:2],
                 "--auth-token", token("mallory"), "--actions", "consume"]) == 1
    assert "validateNamespaceOperation" in capsys.readouterr().err
    process.restart()
    carol = _client(process.url, pulsar.AuthenticationToken(token("carol")))
    consumer = _client(process.url, pulsar.AuthenticationToken(token("client")))  # ns consume
    locked = f"locked-{uuid.uuid4().hex[:6]}"
    try:
        assert _can_produce(carol, topic)
        assert _can_subscribe(carol, topic)
        assert not _can_produce(carol, _topic("not-granted"))
        assert main(["topics", "revoke-permission", topic, "--role", "carol", *common]) == 0
        assert not _can_produce(carol, topic)
        # subscription permissions: only the listed roles, until the list is empty again
        assert main(["namespaces", "grant-subscription-permission", NS, "--subscription",
                     locked, "--roles", "erin", *common]) == 0
        assert main(["namespaces", "subscription-permissions", NS, *common]) == 0
        assert json.loads(capsys.readouterr().out)[locked] == ["erin"]
        with pytest.raises(pulsar.AuthorizationError):
            consumer.subscribe(topic, locked)
        assert main(["namespaces", "revoke-subscription-permission", NS, "--subscription",
                     locked, "--role", "erin", *common]) == 0
        consumer.subscribe(topic, locked).close()
        assert main(["namespaces", "revoke-subscription-permission", NS, "--subscription",
                     "never-listed", "--role", "erin", *common]) == 1
        assert "couldn't find subscription" in capsys.readouterr().err
    finally:
        carol.close()
        consumer.close()


def test_tls_without_a_certificate_is_anonymous(broker: tuple[SecureBrokerProcess, int],
                                                pki: Pki) -> None:
    process, tls_port = broker
    topic = _topic("anon-tls")
    client = _client(f"pulsar+ssl://{HOST}:{tls_port}", tls_trust_certs_file_path=str(pki.ca))
    try:
        assert not _can_subscribe(client, topic)  # anon holds no consume grant
        local = topic.rsplit("/", 1)[1]
        assert _admin(process, "POST", f"/admin/v2/persistent/{NS}/{local}/permissions/anon",
                      ["consume"]) == 204
        assert _can_subscribe(client, topic)
    finally:
        client.close()


def test_the_admin_api_over_https_takes_the_client_certificate(
        broker: tuple[SecureBrokerProcess, int], pki: Pki) -> None:
    process, _ = broker
    topic = _topic("https")
    admin = _client(process.url, pulsar.AuthenticationToken(token("admin")))
    try:
        admin.create_producer(topic).close()
    finally:
        admin.close()
    path = f"/admin/v2/persistent/{NS}/{topic.rsplit('/', 1)[1]}/stats"
    base = f"https://{HOST}:{HTTPS_PORT}"
    with_cert = ssl.create_default_context(cafile=str(pki.ca))
    with_cert.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    status, _ = process.http(path, base=base, context=with_cert)
    assert status == 200  # role "client" (the certificate's CN) holds consume on the namespace
    status, body = process.http(path, base=base,
                                context=ssl.create_default_context(cafile=str(pki.ca)))
    assert (status, body["reason"]) == (401, "Unauthorized to validateTopicOperation for "
                                             f"operation [GET_STATS] on topic [{topic}]")


def test_get_schema_is_authorized(broker: tuple[SecureBrokerProcess, int]) -> None:
    """GET_SCHEMA needs lookup permission (produce or consume); the official client sends it
    without a lookup first, and gets AuthorizationError."""
    process, _ = broker
    topic = _topic("schema")
    admin = _client(process.url, pulsar.AuthenticationToken(token("admin")))
    bob = _client(process.url, pulsar.AuthenticationBasic("bob", "bobs-pw"))
    mallory = _client(process.url, pulsar.AuthenticationToken(token("mallory")))
    try:
        admin.create_producer(topic, schema=pulsar.schema.StringSchema()).close()
        assert bob._client.get_schema_info(topic, 0).schema_type() == _pulsar.SchemaType.STRING
        with pytest.raises(pulsar.AuthorizationError):
            mallory._client.get_schema_info(topic, 0)
    finally:
        for client in (admin, bob, mallory):
            client.close()
    assert f"role 'mallory' may not read the schema of {topic}" in process.log_tail(100)


def test_a_failed_authentication_closes_only_its_connection(
        broker: tuple[SecureBrokerProcess, int]) -> None:
    """The binary protocol's limit on authentication failures: one per connection (the
    refusal closes it; a second CONNECT would be a protocol error), while every other
    connection goes on."""
    process, _ = broker
    good, reply = raw_connect(process.port, token("admin"))
    try:
        assert reply.type == T.CONNECTED
        for attempt in range(3):  # each guess costs a new connection
            bad, refusal = raw_connect(process.port, f"bob:guess-{attempt}", method="basic")
            try:
                assert isinstance(refusal, Frame)
                assert refusal.type == T.ERROR, refusal
                error = refusal.command.error
                assert (error.request_id, error.error) == (UINT64_MAX, pb.AuthenticationError)
                assert error.message == "Failed to authenticate: Unknown user or invalid password"
                assert isinstance(bad.next_event(), ConnectionClosed)
            finally:
                bad.close()
        good.send(pb.CommandPing())
        assert good.expect(T.PONG) is not None
        topic = _topic("still-served")
        assert good.request(pb.CommandProducer(topic=topic, producer_id=1, request_id=1),
                            T.PRODUCER_SUCCESS).request_id == 1
    finally:
        good.close()


def test_a_slow_password_check_blocks_no_other_connection(
        broker: tuple[SecureBrokerProcess, int]) -> None:
    """A bcrypt check (here cost 11) runs off the broker's event loop: while a CONNECT's
    wrong password is being checked, another connection's PINGs are answered. (With the check
    on the loop, the loop reads that CONNECT before the first PING and answers the ERROR
    before any PONG.)"""
    process, _ = broker
    good, reply = raw_connect(process.port, token("admin"))
    guesser = RawClient(process.port)
    try:
        assert reply.type == T.CONNECTED
        guesser.send(pb.CommandConnect(client_version="magnetar-interop", protocol_version=20,
                                       auth_method_name="basic", auth_data=b"slow:wrong"))
        for _ in range(5):
            good.send(pb.CommandPing())
            good.expect(T.PONG)
        readable, _, _ = select.select([guesser.sock], [], [], 0)
        assert readable == [], "the refusal came before the other connection's PONGs"
        refusal = guesser.expect(T.ERROR).body
        assert refusal.message == "Failed to authenticate: Unknown user or invalid password"
        assert isinstance(guesser.next_event(), ConnectionClosed)
    finally:
        good.close()
        guesser.close()
    slow = _client(process.url, pulsar.AuthenticationBasic("slow", "slow-pw"))
    try:  # the right password, checked the same way, connects (no grant: refused to produce)
        assert not _can_produce(slow, _topic("slow"))
    finally:
        slow.close()
    assert "role 'slow' may not look up the partitions of" in process.log_tail(20)


def test_logs_name_role_action_resource_and_never_a_credential(
        broker: tuple[SecureBrokerProcess, int]) -> None:
    """Refused connections and requests, on the binary protocol and the admin API, each log
    a line; no token or password the clients sent appears anywhere in the broker's log."""
    process, _ = broker
    topic = _topic("no-secrets")
    secrets = {
        "refused role's token": token("mallory-secret-role"),
        "foreign token": token("admin", key=b"a key that is not the broker's!!"),
        "expired token": token("admin", exp_in_s=-60),
        "password": "p4ssw0rd-never-logged",
    }
    mallory = _client(process.url, pulsar.AuthenticationToken(secrets["refused role's token"]))
    try:
        assert not _can_produce(mallory, topic)
    finally:
        mallory.close()
    for name in ("foreign token", "expired token"):
        client, reply = raw_connect(process.port, secrets[name])
        client.close()
        assert reply.type == T.ERROR, name
    client, reply = raw_connect(process.port, f"bob:{secrets['password']}", method="basic")
    client.close()
    assert reply.type == T.ERROR
    local = topic.rsplit("/", 1)[1]
    assert _admin(process, "GET", f"/admin/v2/persistent/{NS}/{local}/stats",
                  role="mallory-secret-role") == 401
    assert process.http(f"/admin/v2/persistent/{NS}/{local}/stats",
                        secrets["foreign token"])[0] == 401
    log = process.log_path.read_text()
    assert f"role 'mallory-secret-role' may not look up the partitions of {topic}" in log
    assert (f"refused to role 'mallory-secret-role' (topic GET_STATS): Unauthorized to "
            f"validateTopicOperation for operation [GET_STATS] on topic [{topic}]") in log
    # each authentication failure names the provider (method) and the reason
    for method, reason in (("token", "signature does not verify"), ("token", "expired"),
                           ("basic", "Unknown user or invalid password: wrong password for "
                                     "'bob'")):
        assert re.search(rf"refusing the connection of \S+ \(method '{method}'\): .*{reason}",
                         log), (method, reason)
    for name, secret in secrets.items():
        assert secret not in log, name
        assert secret.split(".")[-1] not in log, f"{name}: its signature"
