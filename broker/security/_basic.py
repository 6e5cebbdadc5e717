"""Basic authentication (Pulsar's AuthenticationProviderBasic) and TLS authentication
(AuthenticationProviderTls).

Theory of operation
-------------------
`BasicAuthenticationProvider` checks `user:password` against an htpasswd-style file read once
at start-up (`basic_auth_conf`: a path, `file:///path`, `data:...,` or the file's text in
base64, the forms Pulsar's basicAuthConf takes). Each line is `user:hash`; blank lines and `#`
comments are skipped. A hash is bcrypt (`$2a$`, `$2b$`, `$2y$`: `htpasswd -B`), MD5-crypt
(`$apr1$`: `htpasswd -m`, Pulsar's documented form; FreeBSD's `$1$`) or traditional DES crypt
(13 characters: `htpasswd -d`, what Pulsar's provider checks every hash other than `$apr1$` as;
it reads only a password's first 8 characters). One library checks them all: libpass (the
maintained fork of passlib, imported as `passlib`), whose bcrypt uses the `bcrypt` package and
whose crypt forms are its own pure-Python code, since the standard `crypt` module is gone from
Python 3.13. Every line's hash is parsed when the file is read, so a malformed or truncated
hash, or one of another kind, stops the broker with the file and the line named (never the
hash).

A hash check costs CPU: milliseconds for bcrypt at `htpasswd -B`'s cost 5, a second at
Python bcrypt's default cost 12. A successful check is remembered (`VERIFIED_CACHE_MAX`
entries, keyed by the user and a keyed SHA-256 of the password -- never the password): a
client reconnecting with the same credentials does not pay again. A failure is not
remembered. The broker's connections and admin requests check through
`authenticate_off_loop`, which computes the hash on `HASH_THREADS_MAX` threads, at most
`HASH_CHECKS_PENDING_MAX` checks at once (more are refused, not queued): a client retrying a
wrong password, or guessing, never stalls the event loop and so never blocks another
connection. The binary protocol sends `user:password` as the auth data of method "basic";
HTTP sends `Authorization: Basic base64(user:password)`.

`TlsAuthenticationProvider` takes no data: the role is the common name of the client
certificate the TLS handshake verified (`peer_common_name`), as Pulsar's "tls" method does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import urllib.parse
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from passlib.context import CryptContext

from .._errors import AuthenticationError, ConfigurationError
from ._principal import AuthenticationProvider, Principal, read_key_source

__all__ = [
    "AUTH_METHOD_BASIC",
    "AUTH_METHOD_TLS",
    "HASH_CHECKS_PENDING_MAX",
    "HASH_SCHEMES",
    "HASH_THREADS_MAX",
    "VERIFIED_CACHE_MAX",
    "BasicAuthenticationProvider",
    "TlsAuthenticationProvider",
    "hash_kind",
    "peer_common_name",
    "read_basic_auth_conf",
]

AUTH_METHOD_BASIC: Final = "basic"
AUTH_METHOD_TLS: Final = "tls"
VERIFIED_CACHE_MAX: Final = 1024  # successful (user, password digest) checks remembered
HASH_THREADS_MAX: Final = 2  # threads computing password hashes (bcrypt releases the GIL)
HASH_CHECKS_PENDING_MAX: Final = 64  # password checks running or queued on them at once
BASIC_REFUSED: Final = "Unknown user or invalid password"  # Pulsar's text for both cases
# The hash kinds of an htpasswd file, by passlib's scheme names: `htpasswd -B`, `-m` (and
# FreeBSD's `$1$`), `-d` (traditional DES crypt, 13 characters: Pulsar's "crypt" form).
HASH_SCHEMES: Final = ("bcrypt", "apr_md5_crypt", "md5_crypt", "des_crypt")
_HASHES: Final = CryptContext(schemes=list(HASH_SCHEMES))
_KINDS: Final = "bcrypt ($2y$), MD5-crypt ($apr1$, $1$) or DES crypt (13 characters)"


def hash_kind(hashed: str) -> str | None:
    """The scheme of a complete hash of one of the supported kinds (`HASH_SCHEMES`), or None
    (another kind, or a malformed or truncated hash)."""
    try:
        scheme = _HASHES.identify(hashed)
        if scheme is None:
            return None
        parsed = _HASHES.handler(scheme).from_string(hashed)
    except (ValueError, TypeError):
        return None
    # a salt alone ("ab", "$apr1$salt") parses as a configuration string without a checksum
    return str(scheme) if getattr(parsed, "checksum", None) else None


def _hash_matches(password: bytes, stored: str) -> bool:
    try:
        return bool(_HASHES.verify(password, stored))
    except (ValueError, TypeError):  # NUL bytes; over 72 bytes for bcrypt
        return False


def _where(source: str) -> str:
    """How an error names the password file: its path, or the form of the inline data."""
    if source.startswith("data:"):
        return "basic_auth_conf (data URL)"
    if source.startswith("file:"):
        return f"basic_auth_conf {urllib.parse.urlparse(source).path}"
    if os.path.exists(source):
        return f"basic_auth_conf {source}"
    return "basic_auth_conf (base64 text)"


def read_basic_auth_conf(source: str) -> dict[str, str]:
    """user -> password hash, from what `basic_auth_conf` names (see the module comment).

    Raises:
        ConfigurationError: unreadable, not one of the forms, a malformed line or a hash of
            an unsupported kind (the file and the line's number are named, never the hash).
    """
    if not source:
        raise ConfigurationError("basic authentication needs basic_auth_conf (the file of "
                                 "user:hash lines)")
    where = _where(source)
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
        raise ConfigurationError(f"{where} is not UTF-8 text") from None
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed or ":" in hashed:
            raise ConfigurationError(f"{where} line {number}: not 'user:hash'")
        if hash_kind(hashed) is None:
            raise ConfigurationError(f"{where} line {number} (user {user[:64]!r}): not a "
                                     f"complete {_KINDS} hash")
        users[user] = hashed
    if not users:
        raise ConfigurationError(f"{where} lists no users")
    return users


class BasicAuthenticationProvider(AuthenticationProvider):
    """`user:password` against the hashes of `users` (see the module comment).

    Args:
        checks_pending_max: password checks running or queued on the hash threads at once
            (`authenticate_off_loop`); a check beyond it is refused.
    """

    method_name = AUTH_METHOD_BASIC

    def __init__(self, users: dict[str, str], checks_pending_max: int = HASH_CHECKS_PENDING_MAX):
        assert checks_pending_max >= 1
        self.users = dict(users)
        self.checks_pending_max = checks_pending_max
        self.checks_pending = 0
        self._key = os.urandom(32)  # keys the digests of remembered passwords
        self._verified: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._threads: ThreadPoolExecutor | None = None  # made at the first off-loop check

    def _parse(self, auth_data: bytes) -> tuple[str, bytes, tuple[str, bytes]]:
        """(user, password, memo key) of known user's credentials.

        Raises:
            AuthenticationError: not `user:password`, or an unknown user.
        """
        user_bytes, sep, password = auth_data.partition(b":")
        if not sep or not user_bytes:
            raise AuthenticationError("basic: the credentials are not 'user:password'")
        try:
            user = user_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError("basic: the user name is not UTF-8") from None
        if user not in self.users:
            raise AuthenticationError(BASIC_REFUSED, detail=f"unknown user {user[:64]!r}")
        return user, password, (user, hmac.new(self._key, password, hashlib.sha256).digest())

    def _remembered(self, memo: tuple[str, bytes]) -> bool:
        if memo in self._verified:
            self._verified.move_to_end(memo)
            return True
        return False

    def _checked(self, user: str, memo: tuple[str, bytes], matches: bool) -> Principal:
        if not matches:
            raise AuthenticationError(BASIC_REFUSED, detail=f"wrong password for {user[:64]!r}")
        self._verified[memo] = None
        if len(self._verified) > VERIFIED_CACHE_MAX:
            self._verified.popitem(last=False)
        return Principal(user, self.method_name)

    def costly(self, auth_data: bytes) -> bool:
        """Whether checking these credentials means computing a hash (not remembered)."""
        try:
            _, _, memo = self._parse(auth_data)
        except AuthenticationError:
            return False  # refused without a hash
        return memo not in self._verified

    def authenticate(self, auth_data: bytes, tls_common_name: str | None = None) -> Principal:
        user, password, memo = self._parse(auth_data)
        if self._remembered(memo):
            return Principal(user, self.method_name)
        return self._checked(user, memo, _hash_matches(password, self.users[user]))

    async def authenticate_off_loop(self, auth_data: bytes,
                                    tls_common_name: str | None = None) -> Principal:
        """As `authenticate`, with the hash computed on one of `HASH_THREADS_MAX` threads, so
        that a costly hash (bcrypt at cost 12 takes a second) stalls no other connection. The
        remembered checks stay on the event loop's thread, which alone touches them.

        Raises:
            AuthenticationError: as `authenticate`; or `checks_pending_max` checks are already
                running or queued (refused at once, nothing is queued).
        """
        user, password, memo = self._parse(auth_data)
        if self._remembered(memo):
            return Principal(user, self.method_name)
        if self.checks_pending >= self.checks_pending_max:
            raise AuthenticationError("basic: too many password checks in progress, try again",
                                      detail=f"{self.checks_pending} checks pending")
        if self._threads is None:
            self._threads = ThreadPoolExecutor(HASH_THREADS_MAX,
                                               thread_name_prefix="magnetar-password-check")
        self.checks_pending += 1
        try:
            matches = await asyncio.get_running_loop().run_in_executor(
                self._threads, _hash_matches, password, self.users[user])
        finally:
            self.checks_pending -= 1
        return self._checked(user, memo, matches)


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
