"""Basic authentication (Pulsar's AuthenticationProviderBasic) and TLS authentication
(AuthenticationProviderTls).

Theory of operation
-------------------
`BasicAuthenticationProvider` checks `user:password` against an htpasswd-style file read once
at start-up (`basic_auth_conf`: a path, `file:///path`, `data:...,` or the file's text in
base64, the forms Pulsar's basicAuthConf takes). Each line is `user:hash`; blank lines and
`#` comments are skipped. Hashes may be bcrypt (`$2a$`, `$2b$`, `$2y$`: `htpasswd -B`,
checked by the `bcrypt` library) or MD5-crypt (`$apr1$`: `htpasswd -m`, Pulsar's documented
form, and `$1$`), computed here with `hashlib`. Traditional DES crypt is refused when the
file is read (Python has no maintained implementation).

A bcrypt check costs milliseconds of CPU on the event loop, so a successful check is
remembered (`VERIFIED_CACHE_MAX` entries, keyed by the user and a keyed SHA-256 of the
password -- never the password): a client reconnecting with the same credentials does not pay
again. A failure is not remembered. The binary protocol sends `user:password` as the auth
data of method "basic"; HTTP sends `Authorization: Basic base64(user:password)`.

`TlsAuthenticationProvider` takes no data: the role is the common name of the client
certificate the TLS handshake verified (`peer_common_name`), as Pulsar's "tls" method does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections import OrderedDict
from typing import Any, Final

import bcrypt

from .._errors import AuthenticationError, ConfigurationError
from ._principal import AuthenticationProvider, Principal, read_key_source

__all__ = [
    "AUTH_METHOD_BASIC",
    "AUTH_METHOD_TLS",
    "VERIFIED_CACHE_MAX",
    "BasicAuthenticationProvider",
    "TlsAuthenticationProvider",
    "md5_crypt",
    "peer_common_name",
    "read_basic_auth_conf",
]

AUTH_METHOD_BASIC: Final = "basic"
AUTH_METHOD_TLS: Final = "tls"
VERIFIED_CACHE_MAX: Final = 1024  # successful (user, password digest) checks remembered
BASIC_REFUSED: Final = "Unknown user or invalid password"  # Pulsar's text for both cases
_BCRYPT_PREFIXES: Final = (b"$2a$", b"$2b$", b"$2y$")
_MD5_MAGICS: Final = ("$apr1$", "$1$")
_ITOA64: Final = "./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _to64(value: int, count: int) -> str:
    out = []
    for _ in range(count):
        out.append(_ITOA64[value & 0x3F])
        value >>= 6
    return "".join(out)


def md5_crypt(password: bytes, salt: str, magic: str = "$apr1$") -> str:
    """The MD5-crypt hash of `password` (`$apr1$`: Apache's variant; `$1$`: FreeBSD's)."""
    assert magic in _MD5_MAGICS
    salt_bytes = salt[:8].encode("ascii")
    alternate = hashlib.md5(password + salt_bytes + password).digest()
    digest = hashlib.md5(password + magic.encode() + salt_bytes)
    for left in range(len(password), 0, -16):
        digest.update(alternate[:min(16, left)])
    length = len(password)
    while length:
        digest.update(b"\0" if length & 1 else password[:1])
        length >>= 1
    final = digest.digest()
    for round_ in range(1000):
        step = hashlib.md5(password if round_ & 1 else final)
        if round_ % 3:
            step.update(salt_bytes)
        if round_ % 7:
            step.update(password)
        step.update(final if round_ & 1 else password)
        final = step.digest()
    groups = ((0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5))
    text = "".join(_to64((final[a] << 16) | (final[b] << 8) | final[c], 4)
                   for a, b, c in groups) + _to64(final[11], 2)
    return f"{magic}{salt[:8]}${text}"


def _hash_matches(password: bytes, stored: str) -> bool:
    if stored.encode().startswith(_BCRYPT_PREFIXES):
        try:
            return bcrypt.checkpw(password, stored.encode())
        except ValueError:
            return False
    for magic in _MD5_MAGICS:
        if stored.startswith(magic):
            salt = stored[len(magic):].split("$", 1)[0]
            return hmac.compare_digest(md5_crypt(password, salt, magic), stored)
    return False


def read_basic_auth_conf(source: str) -> dict[str, str]:
    """user -> password hash, from what `basic_auth_conf` names (see the module comment).

    Raises:
        ConfigurationError: unreadable, not one of the forms, a malformed line (its number is
            named, never its hash) or a hash of an unsupported kind.
    """
    if not source:
        raise ConfigurationError("basic authentication needs basic_auth_conf (the file of "
                                 "user:hash lines)")
    if source.startswith(("data:", "file:")) or os.path.exists(source):
        data = read_key_source(source)
    else:
        try:
            data = base64.b64decode(source, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError("basic_auth_conf is neither a readable file nor base64 "
                                     "text") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigurationError("basic_auth_conf is not UTF-8 text") from None
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed or ":" in hashed:
            raise ConfigurationError(f"basic_auth_conf line {number}: not 'user:hash'")
        if not (hashed.encode().startswith(_BCRYPT_PREFIXES) or hashed.startswith(_MD5_MAGICS)):
            raise ConfigurationError(f"basic_auth_conf line {number} (user {user!r}): only "
                                     "bcrypt ($2y$) and MD5-crypt ($apr1$, $1$) hashes are "
                                     "supported")
        users[user] = hashed
    if not users:
        raise ConfigurationError("basic_auth_conf lists no users")
    return users


class BasicAuthenticationProvider(AuthenticationProvider):
    """`user:password` against the hashes of `users` (see the module comment)."""

    method_name = AUTH_METHOD_BASIC

    def __init__(self, users: dict[str, str]):
        self.users = dict(users)
        self._key = os.urandom(32)  # keys the digests of remembered passwords
        self._verified: OrderedDict[tuple[str, bytes], None] = OrderedDict()

    def authenticate(self, auth_data: bytes, tls_common_name: str | None = None) -> Principal:
        user_bytes, sep, password = auth_data.partition(b":")
        if not sep or not user_bytes:
            raise AuthenticationError("basic: the credentials are not 'user:password'")
        try:
            user = user_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError("basic: the user name is not UTF-8") from None
        stored = self.users.get(user)
        if stored is None:
            raise AuthenticationError(BASIC_REFUSED, detail=f"unknown user {user[:64]!r}")
        memo = (user, hmac.new(self._key, password, hashlib.sha256).digest())
        if memo in self._verified:
            self._verified.move_to_end(memo)
            return Principal(user, self.method_name)
        if not _hash_matches(password, stored):
            raise AuthenticationError(BASIC_REFUSED, detail=f"wrong password for {user[:64]!r}")
        self._verified[memo] = None
        if len(self._verified) > VERIFIED_CACHE_MAX:
            self._verified.popitem(last=False)
        return Principal(user, self.method_name)


class TlsAuthenticationProvider(AuthenticationProvider):
    """The verified client certificate's common name is the role."""

    method_name = AUTH_METHOD_TLS

    def authenticate(self, auth_data: bytes, tls_common_name: str | None = None) -> Principal:
        if not tls_common_name:
            raise AuthenticationError("tls: no verified client certificate with a common name "
                                      "(connect over TLS with a certificate the broker trusts)")
        return Principal(tls_common_name, self.method_name)


def peer_common_name(peercert: Any) -> str | None:
    """The subject's common name of a certificate as `ssl.SSLSocket.getpeercert()` gives it
    (a dict only for a certificate the handshake verified; None otherwise)."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str) and value:
                return value
    return None
