"""Basic and TLS authentication providers, several providers at once and the anonymous role
(security/_basic.py, security/_auth.py), with real password files."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import bcrypt
import pytest
from passlib.hash import des_crypt

from magnetar.broker._config import BrokerConfig
from magnetar.broker._errors import AuthenticationError, ConfigurationError
from magnetar.broker.security._auth import AuthenticationService
from magnetar.broker.security._basic import (
    BasicAuthenticationProvider,
    hash_kind,
    peer_common_name,
    read_basic_auth_conf,
)
from magnetar.broker.security._jwt import encode_token
from magnetar.codec import pb

SECRET = b"providers-test-secret-key-32byte"
# `openssl passwd -apr1 -salt abcdefgh secret` printed this.
APR1_SECRET = "$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/"
# glibc's crypt(3) printed these: Python 3.11's `crypt.crypt("magnetar", "Mg")`, and `$1$`
# with salt abcdefgh for "secret" (perl's `crypt` agrees on the DES one).
DES_MAGNETAR = "Mgz20N7bO1vq6"
MD5_SECRET = "$1$abcdefgh$cHJi5PXp/ki/ktXzqlk6I1"


def _conf(path: Path) -> Path:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"# users\nbob:{hashed}\n\nann:{APR1_SECRET}\n")
    return path


def test_hash_kinds() -> None:
    bcrypt_hash = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    assert [hash_kind(h) for h in (bcrypt_hash, bcrypt_hash.replace("$2b$", "$2y$"),
                                   APR1_SECRET, MD5_SECRET, DES_MAGNETAR)] == [
        "bcrypt", "bcrypt", "apr_md5_crypt", "md5_crypt", "des_crypt"]
    # truncated, a salt without its checksum, plain text, another kind
    for bad in (DES_MAGNETAR[:12], "Mg", "$apr1$abcdefgh", APR1_SECRET[:-3], "$2y$04$short",
                "plaintext-password", "$6$salt$" + "x" * 86, ""):
        assert hash_kind(bad) is None, bad


def test_des_crypt_hashes(tmp_path: Path) -> None:
    """Traditional DES crypt (13 characters), which Pulsar's provider checks: one hash made
    by the library here, one made by glibc."""
    path = tmp_path / "users"
    path.write_text(f"carol:{des_crypt.hash('s3cret')}\ndave:{DES_MAGNETAR}\n"
                    f"erin:{MD5_SECRET}\n")
    provider = BasicAuthenticationProvider(read_basic_auth_conf(str(path)))
    assert provider.authenticate(b"carol:s3cret").role == "carol"
    assert provider.authenticate(b"dave:magnetar").role == "dave"
    assert provider.authenticate(b"erin:secret").role == "erin"
    for bad in (b"carol:s3creT", b"carol:", b"dave:magnetaR", b"dave:magneta", b"dave:x\0y",
                b"erin:Secret"):
        with pytest.raises(AuthenticationError, match="Unknown user or invalid password"):
            provider.authenticate(bad)


def test_malformed_hash_lines_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "users"
    for hashed in (DES_MAGNETAR[:12], "$apr1$abcdefgh", "$2y$04$short", "plaintext-pw"):
        path.write_text(f"# users\ndave:{DES_MAGNETAR}\ncarol:{hashed}\n")
        with pytest.raises(ConfigurationError) as caught:
            read_basic_auth_conf(str(path))
        message = str(caught.value)
        assert message.startswith(f"basic_auth_conf {path} line 3 (user 'carol'): not a "
                                  "complete bcrypt"), message
        assert hashed not in message
    with pytest.raises(ConfigurationError, match=r"basic_auth_conf \(base64 text\) line 1"):
        read_basic_auth_conf(base64.b64encode(b"carol:Mg\n").decode())


def test_basic_provider_checks_bcrypt_and_apr1(tmp_path: Path) -> None:
    provider = BasicAuthenticationProvider(read_basic_auth_conf(str(_conf(tmp_path / "p"))))
    assert provider.authenticate(b"bob:s3cret").role == "bob"
    assert provider.authenticate(b"bob:s3cret").role == "bob"  # the remembered check
    assert provider.authenticate(b"ann:secret").role == "ann"
    for bad in (b"bob:wrong", b"ann:wrong", b"nobody:s3cret"):
        with pytest.raises(AuthenticationError, match="Unknown user or invalid password"):
            provider.authenticate(bad)
    with pytest.raises(AuthenticationError, match="not 'user:password'"):
        provider.authenticate(b"no-colon")


def test_basic_conf_forms_and_errors(tmp_path: Path) -> None:
    path = _conf(tmp_path / "p")
    as_base64 = base64.b64encode(path.read_bytes()).decode()
    for source in (str(path), f"file://{path}", f"data:;base64,{as_base64}", as_base64):
        assert set(read_basic_auth_conf(source)) == {"bob", "ann"}
    bad = tmp_path / "bad"
    bad.write_text("carol:plaintext-password\n")
    with pytest.raises(ConfigurationError, match=r"line 1 .*not a complete bcrypt") as caught:
        read_basic_auth_conf(str(bad))
    assert "plaintext-password" not in str(caught.value)
    bad.write_text("just-a-name\n")
    with pytest.raises(ConfigurationError, match="line 1: not 'user:hash'"):
        read_basic_auth_conf(str(bad))
    with pytest.raises(ConfigurationError, match="neither a readable file nor base64"):
        read_basic_auth_conf("/no/such/file!")


def test_peer_common_name() -> None:
    cert = {"subject": ((("countryName", "NL"),), (("commonName", "client-app"),))}
    assert peer_common_name(cert) == "client-app"
    assert peer_common_name({}) is None
    assert peer_common_name(None) is None  # no verified certificate


def _service(tmp_path: Path, anonymous: str = "") -> AuthenticationService:
    key = tmp_path / "secret.key"
    key.write_bytes(SECRET)
    config = BrokerConfig(authentication_enabled=True,
                          authentication_providers=("token", "basic", "tls"),
                          token_secret_key=str(key), basic_auth_conf=str(_conf(tmp_path / "p")),
                          anonymous_user_role=anonymous)
    service = AuthenticationService.from_config(config)
    assert service is not None
    return service


async def test_several_providers_chosen_by_method(tmp_path: Path) -> None:
    service = _service(tmp_path)
    assert service.authenticate("token", encode_token({"sub": "t"}, SECRET).encode()).role == "t"
    assert service.authenticate("basic", b"bob:s3cret").role == "bob"
    assert service.authenticate("tls", b"", tls_common_name="client").role == "client"
    with pytest.raises(AuthenticationError, match="no verified client certificate"):
        service.authenticate("tls", b"")
    with pytest.raises(AuthenticationError, match="authentication is required"):
        service.authenticate("none", b"")
    basic = "Basic " + base64.b64encode(b"bob:s3cret").decode()
    assert (await service.authenticate_http(basic)).role == "bob"
    assert (await service.authenticate_http(None, tls_common_name="client")).role == "client"
    with pytest.raises(AuthenticationError, match="Unknown user"):
        await service.authenticate_http("Basic " + base64.b64encode(b"bob:nope").decode())


async def test_anonymous_role(tmp_path: Path) -> None:
    service = _service(tmp_path, anonymous="anon")
    for method in ("", "none", "athenz"):  # no credentials, or a method not enabled
        principal = service.authenticate(method, b"")
        assert (principal.role, principal.method) == ("anon", "anonymous")
    assert (await service.authenticate_http(None)).role == "anon"
    with pytest.raises(AuthenticationError):  # bad credentials are not anonymous
        service.authenticate("basic", b"bob:nope")


async def test_http_credentials_no_provider_accepts_are_anonymous_without_a_method(
        tmp_path: Path) -> None:
    """Pulsar's HTTP authentication: without `X-Pulsar-Auth-Method-Name`, credentials that no
    provider accepts leave the request anonymous when there is an anonymous role; naming the
    method, or having no anonymous role, still refuses them."""
    bad_basic = "Basic " + base64.b64encode(b"bob:nope").decode()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    anonymous = _service(tmp_path / "a", anonymous="anon")
    for header in (bad_basic, "Bearer x.y.z", "Digest abc", "Basic !!!"):
        principal = await anonymous.authenticate_http(header)
        assert (principal.role, principal.method) == ("anon", "anonymous"), header
    with pytest.raises(AuthenticationError, match="Unknown user"):
        await anonymous.authenticate_http(bad_basic, method="basic")
    with pytest.raises(AuthenticationError, match="Unknown user"):
        await _service(tmp_path / "b").authenticate_http(bad_basic)


def test_unknown_provider_and_missing_conf(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="kerberos"):
        AuthenticationService.from_config(BrokerConfig(
            authentication_enabled=True, authentication_providers=("kerberos",)))
    with pytest.raises(ConfigurationError, match="needs basic_auth_conf"):
        AuthenticationService.from_config(BrokerConfig(
            authentication_enabled=True, authentication_providers=("basic",)))



async def test_off_loop_checks_remember_successes_and_are_bounded(tmp_path: Path) -> None:
    users = read_basic_auth_conf(str(_conf(tmp_path / "p")))
    provider = BasicAuthenticationProvider(users, checks_pending_max=1)
    assert provider.costly(b"bob:s3cret")
    assert not provider.costly(b"nobody:x")  # refused without a hash
    assert (await provider.authenticate_off_loop(b"bob:s3cret")).role == "bob"
    assert not provider.costly(b"bob:s3cret")  # remembered: checked on the loop from now on
    with pytest.raises(AuthenticationError, match="Unknown user or invalid password"):
        await provider.authenticate_off_loop(b"bob:wrong")
    assert provider.costly(b"bob:wrong")  # a failure is not remembered
    first = asyncio.ensure_future(provider.authenticate_off_loop(b"ann:wrong"))
    for _ in range(100):  # loop turns, until the first check is on a hash thread
        if provider.checks_pending:
            break
        await asyncio.sleep(0)
    assert provider.checks_pending == 1
    with pytest.raises(AuthenticationError, match="too many password checks in progress"):
        await provider.authenticate_off_loop(b"bob:another-guess")
    with pytest.raises(AuthenticationError, match="Unknown user or invalid password"):
        await first
    assert provider.checks_pending == 0
    assert (await provider.authenticate_off_loop(b"bob:s3cret")).role == "bob"


async def test_refreshed_basic_credentials_are_checked_off_the_loop(tmp_path: Path) -> None:
    """An AUTH_RESPONSE carrying a password goes through the hash threads too; a wrong one is
    refused (ERROR, then the close), the right one refreshes the session."""
    service = _service(tmp_path)
    refusals: list[str] = []
    closed: list[bool] = []
    connect = pb.CommandConnect(client_version="t", protocol_version=20,
                                auth_method_name="basic", auth_data=b"bob:s3cret")
    session = service.start_session(connect, lambda challenge: True, lambda: closed.append(True),
                                    "/test:1", "Magnetar-test", refuse=refusals.append)
    try:
        answer = pb.CommandAuthResponse(response=pb.AuthData(auth_method_name="basic",
                                                             auth_data=b"bob:other"))
        assert session.costly(answer)
        await session.on_response_off_loop(answer)
        assert refusals == ["Failed to authenticate: Unknown user or invalid password"]
        assert closed == [True]
    finally:
        session.stop()
    session = service.start_session(connect, lambda challenge: True, lambda: None, "/test:2",
                                    "Magnetar-test")
    await session.on_response_off_loop(pb.CommandAuthResponse(response=pb.AuthData(
        auth_method_name="basic", auth_data=b"bob:s3cret")))
    assert (session.refreshes, session.principal.role) == (1, "bob")
    session.stop()
