"""Who a client is: the `Principal` an authentication provider vouches for, the provider
interface, and reading the key and password files that providers are configured with."""

from __future__ import annotations

import abc
import base64
import binascii
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .._errors import ConfigurationError

__all__ = ["AUTH_METHOD_TOKEN", "KEY_FILE_BYTES_MAX", "AuthenticationProvider", "Principal",
           "read_key_source"]

AUTH_METHOD_TOKEN: Final = "token"  # the method name of token authentication (`_token.py`)
KEY_FILE_BYTES_MAX: Final = 1024 * 1024  # a key or password file larger than this is refused


@dataclass(frozen=True)
class Principal:
    """An authenticated client.

    Attributes:
        role: the role (Pulsar's principal): a token's role claim, a basic user, a
            certificate's common name, or the anonymous role.
        method: the authentication method that vouched for it.
        expires_at_s: when the credentials expire (seconds since the epoch; None: never).
    """

    role: str
    method: str
    expires_at_s: float | None = None

    def expired(self, now_s: float | None = None) -> bool:
        now = time.time() if now_s is None else now_s
        return self.expires_at_s is not None and self.expires_at_s <= now


def read_key_source(source: str) -> bytes:
    """The bytes of a key given as a path, `file:///path` or `data:[type][;base64],data`.

    Raises:
        ConfigurationError: the file cannot be read, is too large or empty, or the data URL
            is malformed.
    """
    if source.startswith("data:"):
        meta, sep, payload = source[5:].partition(",")
        if not sep:
            raise ConfigurationError(f"malformed key data URL (no comma): {source[:40]!r}")
        if meta.endswith(";base64") or meta == "base64":
            try:
                return base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise ConfigurationError("the key data URL is not valid base64") from None
        return urllib.parse.unquote_to_bytes(payload)
    path = Path(urllib.parse.urlparse(source).path if source.startswith("file:") else source)
    try:
        size = path.stat().st_size
        if size > KEY_FILE_BYTES_MAX:
            raise ConfigurationError(f"key file {path} is larger than {KEY_FILE_BYTES_MAX} B")
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    if not data:
        raise ConfigurationError(f"key file {path} is empty")
    return data


class AuthenticationProvider(abc.ABC):
    """One authentication method."""

    method_name: str

    @abc.abstractmethod
    def authenticate(self, auth_data: bytes, tls_common_name: str | None = None) -> Principal:
        """The principal the credentials prove.

        Raises:
            AuthenticationError: missing, malformed, invalid or expired credentials.
        """

    def costly(self, auth_data: bytes) -> bool:
        """Whether checking these credentials takes long enough to leave the event loop
        (`authenticate_off_loop`); most methods check at once."""
        return False

    async def authenticate_off_loop(self, auth_data: bytes,
                                    tls_common_name: str | None = None) -> Principal:
        """As `authenticate`, with any costly work done off the event loop's thread."""
        return self.authenticate(auth_data, tls_common_name)
