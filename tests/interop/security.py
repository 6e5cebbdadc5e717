"""Helpers of the security interop tests: a broker process with extra command-line flags and a
known admin port, certificates made with `cryptography`, and a raw client that authenticates."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from magnetar.broker.security._jwt import encode_token
from magnetar.codec import pb

from . import HOST, HTTP_TIMEOUT_S, HttpBrokerProcess, RawClient

SECRET = b"magnetar-interop-secret-key-32by"


def token(role: str = "alice", exp_in_s: float | None = None, key: bytes = SECRET) -> str:
    claims: dict[str, Any] = {"sub": role}
    if exp_in_s is not None:
        claims["exp"] = time.time() + exp_in_s
    return encode_token(claims, key)


@dataclass
class SecureBrokerProcess(HttpBrokerProcess):
    """A standalone broker with its admin API on a known port (security flags in
    `extra_args`), and a GET on that API that reports the status."""

    def http(self, path: str, bearer: str | None = None, *, base: str | None = None,
             context: ssl.SSLContext | None = None) -> tuple[int, Any]:
        """(status, decoded JSON or text) of a GET on the admin API."""
        url = (base or f"http://{HOST}:{self.http_port}") + path
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S,
                                        context=context) as answer:
                return answer.status, _decoded(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, _decoded(error.read())


def _decoded(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def start_secure(base: Path, *extra: str, config: tuple[str, ...] = ()) -> SecureBrokerProcess:
    process = SecureBrokerProcess(base / "data", base / "broker.log", config=config,
                                  extra_args=extra)
    process.start()
    return process


def raw_connect(port: int, auth_token: str | None, *, refresh: bool = True,
                method: str = "token", watchers: bool = False) -> tuple[RawClient, Any]:
    """A raw connection that sends CONNECT with a token; returns it and the first reply."""
    client = RawClient(port)
    connect = pb.CommandConnect(client_version="magnetar-interop", protocol_version=20,
                                auth_method_name=method if auth_token is not None else "none")
    if auth_token is not None:
        connect.auth_data = auth_token.encode()
    connect.feature_flags.supports_auth_refresh = refresh
    connect.feature_flags.supports_topic_watchers = watchers
    client.send(connect)
    return client, client.next_event()


# -- certificates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """PEM files: a CA, a server certificate for 127.0.0.1 (IP SAN) signed by it, a client
    certificate signed by it, and an unrelated CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
                 issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool,
                 server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def pem(cert: x509.Certificate, name: str) -> Path:
        path = directory / name
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key, other_key, server_key, client_key = key(), key(), key(), key()
    ca = pem(_certificate("magnetar-test-ca", ca_key, "magnetar-test-ca", ca_key, ca=True),
             "ca.pem")
    other = pem(_certificate("other-ca", other_key, "other-ca", other_key, ca=True),
                "other-ca.pem")
    server = pem(_certificate("127.0.0.1", server_key, "magnetar-test-ca", ca_key, ca=False,
                              server=True), "server.pem")
    client = pem(_certificate("client", client_key, "magnetar-test-ca", ca_key, ca=False),
                 "client.pem")
    _write_key(server_key, directory / "server.key")
    _write_key(client_key, directory / "client.key")
    return Pki(ca, server, directory / "server.key", client, directory / "client.key", other)
