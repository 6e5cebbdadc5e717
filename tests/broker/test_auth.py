"""The token provider, the authentication service built from the configuration, key sources,
and a connection's refresh checks (AUTH_CHALLENGE, answers, expiry without refresh)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from magnetar.broker import BrokerConfig
from magnetar.broker._errors import AuthenticationError, ConfigurationError
from magnetar.broker.security._auth import (
    REFRESH_AUTH_DATA,
    AuthenticationService,
    AuthSession,
    read_key_source,
)
from magnetar.broker.security._jwt import encode_token
from magnetar.broker.security._token import (
    TokenAuthenticationProvider,
    load_private_key,
    load_public_key,
)
from magnetar.codec import pb

SECRET = b"0123456789abcdef0123456789abcdef"
EC_KEY = ec.generate_private_key(ec.SECP256R1())
DEADLINE_S = 5.0


def _token(role: str = "alice", exp_in_s: float | None = None, **extra: object) -> bytes:
    claims: dict[str, object] = {"sub": role, **extra}
    if exp_in_s is not None:
        claims["exp"] = time.time() + exp_in_s
    return encode_token(claims, SECRET).encode()


def _service(interval_s: float = 60.0) -> AuthenticationService:
    return AuthenticationService([TokenAuthenticationProvider(SECRET)], ("admin",), interval_s)


# -- key sources ------------------------------------------------------------------------------


def test_key_sources_path_file_url_and_data_url(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    path.write_bytes(SECRET)
    assert read_key_source(str(path)) == SECRET
    assert read_key_source(f"file://{path}") == SECRET
    encoded = base64.b64encode(SECRET).decode()
    assert read_key_source(f"data:;base64,{encoded}") == SECRET
    assert read_key_source("data:,plain%20text") == b"plain text"


def test_bad_key_sources_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read key file"):
        read_key_source(str(tmp_path / "missing.key"))
    (tmp_path / "empty.key").write_bytes(b"")
    with pytest.raises(ConfigurationError, match="is empty"):
        read_key_source(str(tmp_path / "empty.key"))
    with pytest.raises(ConfigurationError, match="not valid base64"):
        read_key_source("data:;base64,***")
    with pytest.raises(ConfigurationError, match="no comma"):
        read_key_source("data:;base64")


def test_public_and_private_keys_load_from_der_and_pem() -> None:
    public = EC_KEY.public_key()
    der = public.public_bytes(serialization.Encoding.DER,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    pem = public.public_bytes(serialization.Encoding.PEM,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    assert load_public_key(der).public_numbers() == public.public_numbers()
    assert load_public_key(pem).public_numbers() == public.public_numbers()
    private_der = EC_KEY.private_bytes(serialization.Encoding.DER,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption())
    loaded = load_private_key(private_der)
    assert isinstance(loaded, ec.EllipticCurvePrivateKey)
    assert loaded.private_numbers() == EC_KEY.private_numbers()
    with pytest.raises(ConfigurationError, match="not a DER or PEM public key"):
        load_public_key(b"garbage")
    with pytest.raises(ConfigurationError, match="not a DER or PEM private key"):
        load_private_key(b"-----BEGIN nonsense")


# -- the provider and the service -------------------------------------------------------------


def test_the_provider_returns_role_and_expiry() -> None:
    provider = TokenAuthenticationProvider(SECRET)
    principal = provider.authenticate(_token("alice", exp_in_s=30))
    assert principal.role == "alice"
    assert principal.method == "token"
    assert principal.expires_at_s is not None
    assert not principal.expired()
    assert principal.expired(principal.expires_at_s + 1)
    forever = provider.authenticate(_token("bob"))
    assert forever.expires_at_s is None
    assert not forever.expired(time.time() + 10**9)


def test_the_provider_needs_the_role_claim() -> None:
    with pytest.raises(AuthenticationError, match="no 'sub' claim"):
        TokenAuthenticationProvider(SECRET).authenticate(encode_token({"x": 1}, SECRET).encode())
    with pytest.raises(AuthenticationError, match="no 'sub' claim"):
        TokenAuthenticationProvider(SECRET).authenticate(_token(""))
    custom = TokenAuthenticationProvider(SECRET, role_claim="role")
    ops = encode_token({"sub": "ignored", "role": "ops"}, SECRET).encode()
    assert custom.authenticate(ops).role == "ops"


def test_the_provider_refuses_empty_binary_and_expired_tokens() -> None:
    provider = TokenAuthenticationProvider(SECRET)
    with pytest.raises(AuthenticationError, match="no token was sent"):
        provider.authenticate(b"")
    with pytest.raises(AuthenticationError, match="not ASCII"):
        provider.authenticate(b"\xff\xfe")
    with pytest.raises(AuthenticationError, match="expired"):
        provider.authenticate(_token(exp_in_s=-10))


def test_the_service_refuses_missing_and_unknown_methods() -> None:
    service = _service()
    with pytest.raises(AuthenticationError, match=r"authentication is required \(method: token"):
        service.authenticate("none", b"")
    with pytest.raises(AuthenticationError, match="method 'basic' is not enabled"):
        service.authenticate("basic", b"user:pass")
    assert service.authenticate("token", _token("admin")).role == "admin"


async def test_http_authentication_takes_a_bearer_header() -> None:
    service = _service()
    assert (await service.authenticate_http("Bearer " + _token().decode())).role == "alice"
    assert (await service.authenticate_http("bearer " + _token().decode())).role == "alice"
    with pytest.raises(AuthenticationError, match="authentication required"):
        await service.authenticate_http(None)
    with pytest.raises(AuthenticationError, match="method 'basic' is not enabled"):
        await service.authenticate_http("Basic dXNlcjpwYXNz")
    with pytest.raises(AuthenticationError, match="Bearer or the Basic scheme"):
        await service.authenticate_http("Digest x")
    with pytest.raises(AuthenticationError, match="signature"):
        await service.authenticate_http("Bearer " + encode_token({"sub": "a"}, b"x" * 32))


def test_from_config(tmp_path: Path) -> None:
    assert AuthenticationService.from_config(BrokerConfig()) is None
    with pytest.raises(ConfigurationError, match="exactly one of"):
        AuthenticationService.from_config(BrokerConfig(authentication_enabled=True))
    key = tmp_path / "secret.key"
    key.write_bytes(SECRET)
    service = AuthenticationService.from_config(BrokerConfig(
        authentication_enabled=True, token_secret_key=str(key), superuser_roles=("admin",),
        auth_refresh_check_interval_s=2.5))
    assert service is not None
    assert service.superuser_roles == {"admin"}
    assert service.refresh_check_interval_s == 2.5
    assert service.authenticate("token", _token()).role == "alice"
    public = tmp_path / "public.pem"
    public.write_bytes(EC_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    by_public = AuthenticationService.from_config(BrokerConfig(
        authentication_enabled=True, token_public_key=f"file://{public}"))
    assert by_public is not None
    signed = encode_token({"sub": "carol"}, EC_KEY).encode()
    assert by_public.authenticate("token", signed).role == "carol"
    with pytest.raises(AuthenticationError, match="does not fit"):
        by_public.authenticate("token", _token())


# -- refresh ----------------------------------------------------------------------------------


class _Wire:
    """What a session sends and whether it closed the connection."""

    def __init__(self) -> None:
        self.challenges: list[pb.CommandAuthChallenge] = []
        self.refusals: list[str] = []  # the texts of the ERRORs sent before a close
        self.closed = asyncio.Event()

    def send(self, challenge: pb.CommandAuthChallenge) -> bool:
        self.challenges.append(challenge)
        return True

    def refuse(self, message: str) -> None:
        assert not self.closed.is_set()
        self.refusals.append(message)

    def close(self) -> None:
        self.closed.set()


def _connect(token: bytes, refresh: bool = True) -> pb.CommandConnect:
    connect = pb.CommandConnect(client_version="test", protocol_version=20,
                                auth_method_name="token", auth_data=token)
    if refresh:
        connect.feature_flags.supports_auth_refresh = True
    return connect


def _session(wire: _Wire, token: bytes, refresh: bool = True,
             interval_s: float = 0.05) -> AuthSession:
    return _service(interval_s).start_session(_connect(token, refresh), wire.send, wire.close,
                                              "/test:1", "Magnetar-test",
                                              refuse=wire.refuse)


async def _until(condition: object, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _response(token: bytes) -> pb.CommandAuthResponse:
    return pb.CommandAuthResponse(client_version="test", protocol_version=20,
                                  response=pb.AuthData(auth_method_name="token",
                                                       auth_data=token))


async def test_an_expired_session_is_challenged_and_refreshed() -> None:
    wire = _Wire()
    session = _session(wire, _token(exp_in_s=0.2))
    await _until(lambda: wire.challenges, "a challenge")
    challenge = wire.challenges[0]
    assert challenge.challenge.auth_method_name == "token"
    assert challenge.challenge.auth_data == REFRESH_AUTH_DATA == b"PulsarAuthRefresh"
    assert challenge.server_version == "Magnetar-test"
    assert session.challenge_outstanding
    session.on_response(_response(_token(exp_in_s=60)))
    assert session.refreshes == 1
    assert not session.challenge_outstanding
    assert not wire.closed.is_set()
    session.stop()


async def test_an_unanswered_challenge_closes_the_connection() -> None:
    wire = _Wire()
    _session(wire, _token(exp_in_s=0.1))
    await asyncio.wait_for(wire.closed.wait(), DEADLINE_S)
    assert len(wire.challenges) == 1


@pytest.mark.parametrize(("answer", "reason"), [
    (lambda: _token(exp_in_s=-5), "expired"), (lambda: b"garbage", "3 dot-separated parts"),
    (lambda: _token("mallory", exp_in_s=60), "for another role")])
async def test_a_bad_answer_is_refused_and_closes_the_connection(answer: Callable[[], bytes],
                                                                 reason: str) -> None:
    """As Pulsar answers refused refreshed credentials: ERROR "Failed to authenticate", then
    the close. (Each answer is made when the test runs: one made at collection could expire
    before a long suite reaches the test.)"""
    wire = _Wire()
    session = _session(wire, _token(exp_in_s=0.1))
    await _until(lambda: wire.challenges, "a challenge")
    session.on_response(_response(answer()))
    assert wire.closed.is_set()
    assert len(wire.refusals) == 1
    assert wire.refusals[0].startswith("Failed to authenticate: ")
    assert reason in wire.refusals[0]
    assert session.principal.role == "alice"
    assert session.refreshes == 0


async def test_a_client_without_refresh_support_is_closed_on_expiry() -> None:
    wire = _Wire()
    _session(wire, _token(exp_in_s=0.1), refresh=False)
    await asyncio.wait_for(wire.closed.wait(), DEADLINE_S)
    assert wire.challenges == []
    assert wire.refusals == []  # closed without an ERROR, as Pulsar does


async def test_a_token_without_expiry_is_never_challenged() -> None:
    wire = _Wire()
    session = _session(wire, _token(), interval_s=0.01)
    ticks = 0
    while ticks < 10:  # ten check intervals pass
        await asyncio.sleep(0.01)
        ticks += 1
    assert wire.challenges == []
    assert not wire.closed.is_set()
    session.stop()


def test_a_refused_connect_starts_no_session() -> None:
    wire = _Wire()
    with pytest.raises(AuthenticationError, match="expired"):
        _session(wire, _token(exp_in_s=-1))
    with pytest.raises(AuthenticationError, match="authentication is required"):
        _service().start_session(pb.CommandConnect(client_version="x", protocol_version=20,
                                                   auth_method_name="none"),
                                 wire.send, wire.close, "/test:1", "v")
