"""Token authentication (Pulsar's AuthenticationProviderToken): the provider, and the keys
that verify and sign tokens. A module of its own, imported only when token authentication is
enabled (and by `magnetar tokens`): it loads jwt and cryptography, a tenth of a second of a
broker's start otherwise (see `_auth.py` for the service that uses it)."""

from __future__ import annotations

import logging

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from .._config import BrokerConfig
from .._errors import ConfigurationError
from ._jwt import PrivateKey, PublicKey, TokenError, VerifyingKey, decode_token
from ._principal import AUTH_METHOD_TOKEN, AuthenticationProvider, Principal, read_key_source

__all__ = ["TokenAuthenticationProvider", "load_private_key", "load_public_key",
           "token_provider"]

log = logging.getLogger(__name__)


# -- keys -------------------------------------------------------------------------------------


def load_public_key(data: bytes, where: str = "public key") -> PublicKey:
    """An RSA or EC public key from DER (SubjectPublicKeyInfo) or PEM bytes.

    Raises:
        ConfigurationError: not such a key.
    """
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_der_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{where}: not a DER or PEM public key ({exc})") from None
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise ConfigurationError(f"{where}: only RSA and EC public keys are supported")
    return key


def load_private_key(data: bytes, where: str = "private key") -> PrivateKey:
    """An RSA or EC private key from DER (PKCS#8) or PEM bytes, unencrypted.

    Raises:
        ConfigurationError: not such a key.
    """
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{where}: not a DER or PEM private key ({exc})") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ConfigurationError(f"{where}: only RSA and EC private keys are supported")
    return key


# -- the provider --------------------------------------------------------------------------------


class TokenAuthenticationProvider(AuthenticationProvider):
    """JWT tokens signed with a secret key or a key pair (see `_jwt.py`).

    Args:
        key: the secret (bytes) or the public key that verifies tokens.
        role_claim: the claim holding the role (Pulsar's tokenAuthClaim, default "sub").
        clock_skew_s: tolerance on `exp`/`nbf` (Pulsar's tokenAllowedClockSkewSeconds).
    """

    method_name = AUTH_METHOD_TOKEN

    def __init__(self, key: VerifyingKey, role_claim: str = "sub", clock_skew_s: float = 0.0):
        assert role_claim, "the role claim needs a name"
        assert clock_skew_s >= 0
        self.key = key
        self.role_claim = role_claim
        self.clock_skew_s = clock_skew_s

    def authenticate(self, auth_data: bytes, tls_common_name: str | None = None) -> Principal:
        if not auth_data:
            raise TokenError("no token was sent")
        try:
            token = auth_data.decode("ascii")
        except UnicodeDecodeError:
            raise TokenError("the token is not ASCII text") from None
        claims = decode_token(token, self.key, clock_skew_s=self.clock_skew_s)
        role = claims.get(self.role_claim)
        if not isinstance(role, str) or not role:
            raise TokenError(f"the token has no {self.role_claim!r} claim (the role)")
        exp = claims.get("exp")
        return Principal(role, self.method_name,
                         None if exp is None else float(exp) + self.clock_skew_s)


def token_provider(config: BrokerConfig) -> TokenAuthenticationProvider:
    """The provider the configuration's token settings describe.

    Raises:
        ConfigurationError: neither or both keys, or a key that cannot be read.
    """
    if bool(config.token_secret_key) == bool(config.token_public_key):
        raise ConfigurationError("token authentication needs exactly one of "
                                 "token_secret_key and token_public_key")
    key: VerifyingKey
    if config.token_secret_key:
        key = read_key_source(config.token_secret_key)
    else:
        key = load_public_key(read_key_source(config.token_public_key),
                              config.token_public_key)
    log.info("token authentication: %s key", "secret" if isinstance(key, bytes) else "public")
    return TokenAuthenticationProvider(key, config.token_auth_claim,
                                       config.token_allowed_clock_skew_s)
