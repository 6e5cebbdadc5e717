"""JSON Web Tokens in compact JWS form, what Pulsar's token authentication carries, signed
and verified by PyJWT.

Theory of operation
-------------------
A token is `base64url(header) "." base64url(claims) "." base64url(signature)`; the header
names the algorithm (`alg`), the claims hold the role (`sub` by default) and optionally `exp`
and `nbf` (seconds since the epoch). PyJWT parses, signs and verifies; this module decides
which tokens are acceptable and says why one is not.

Algorithms (`ALGORITHMS`): HS256/384/512 with a secret key (bytes), RS256/384/512 with an RSA
key pair, ES256/384/512 with an EC key pair on P-256/P-384/P-521 -- what Pulsar's
AuthenticationProviderToken takes. A verifying key allows exactly the algorithms of its kind
(`_allowed_for`: the three HS for a secret, the three RS for an RSA key, the one ES of the
key's curve), and that allow-list is what PyJWT verifies against, so a token can never choose
how its key is interpreted (no `alg: none`, no HMAC "signed" with a public key's bytes). The
header is read first, unverified, only to name the fault of a token outside the allow-list.

Verification refuses, with a `TokenError` (an `AuthenticationError`, wire code
AuthenticationError) whose message says what was wrong: a token longer than
`TOKEN_LENGTH_MAX_BYTES`, a malformed token, an unsigned one or an algorithm not allowed for
the key, a header naming a critical extension PyJWT does not implement (`crit`, RFC 7515
4.1.11), a signature that does not verify, `exp` at or before now less
the allowed clock skew, `nbf` after now plus the skew (both compared as the fractional seconds
they may be). Other registered claims (`aud`, `iat`, `iss`, `jti`, `sub`'s type) are not
checked, as Pulsar's provider does not check them unless configured (the role claim is
checked by `_auth.py`). Nothing is cached or changed by a refusal.

Key lengths are this module's policy, not PyJWT's warnings: a secret is used as given (what
`tokens create-secret-key` makes, or a file an operator chose), an RSA signing key has at least
`RSA_KEY_BITS_MIN` bits.
"""

from __future__ import annotations

import binascii
import json
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import jwt
import jwt.utils
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.types import Options
from jwt.warnings import InsecureKeyLengthWarning

from .._errors import AuthenticationError

__all__ = [
    "ALGORITHMS",
    "TOKEN_LENGTH_MAX_BYTES",
    "PrivateKey",
    "PublicKey",
    "SigningKey",
    "TokenError",
    "VerifyingKey",
    "algorithm_for_key",
    "decode_token",
    "encode_token",
    "parse_unverified",
]

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
SigningKey = bytes | PrivateKey
VerifyingKey = bytes | PublicKey

TOKEN_LENGTH_MAX_BYTES: Final = 64 * 1024  # longer "tokens" are refused unparsed
_B64URL: Final = re.compile(r"[A-Za-z0-9_-]*")
RSA_KEY_BITS_MIN: Final = 2048  # RFC 7518 3.3

# Algorithm -> the kind of key it takes: "secret", "RSA", or the EC curve's name.
ALGORITHMS: Final[dict[str, str]] = {
    "HS256": "secret", "HS384": "secret", "HS512": "secret",
    "RS256": "RSA", "RS384": "RSA", "RS512": "RSA",
    "ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1",
}
# PyJWT verifies the signature against the allow-list; of the registered claims it would check
# by default, Pulsar's provider checks only `exp` and `nbf`, and as possibly fractional
# NumericDates (PyJWT truncates them to whole seconds), so `decode_token` checks those two.
_DECODE_OPTIONS: Final[Options] = {
    "verify_signature": True, "verify_exp": False, "verify_nbf": False, "verify_iat": False,
    "verify_aud": False, "verify_iss": False, "verify_sub": False, "verify_jti": False,
    "require": [],
}


class TokenError(AuthenticationError):
    """A token that cannot be accepted; the message says why."""


def _key_kind(key: SigningKey | VerifyingKey) -> str:
    """"secret", "RSA", or the EC key's curve name (the values of `ALGORITHMS`)."""
    if isinstance(key, bytes):
        return "secret"
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return "RSA"
    return str(key.curve.name)


def _describe(kind: str) -> str:
    return {"secret": "secret key", "RSA": "RSA key"}.get(kind, f"EC key ({kind})")


def _allowed_for(key: SigningKey | VerifyingKey) -> list[str]:
    """The algorithm allow-list of a key: the algorithms of its kind."""
    kind = _key_kind(key)
    return [alg for alg, takes in ALGORITHMS.items() if takes == kind]


def _check_alg(alg: object, key: SigningKey | VerifyingKey) -> str:
    """`alg` when it is a supported algorithm for `key`, else TokenError naming the fault."""
    if not isinstance(alg, str) or alg.lower() == "none":
        raise TokenError(f"unsigned tokens (alg {alg!r}) are not accepted")
    if alg not in ALGORITHMS:
        raise TokenError(f"unsupported token algorithm {alg!r} (supported: "
                         f"{', '.join(ALGORITHMS)})")
    if alg not in _allowed_for(key):
        raise TokenError(f"the token's algorithm {alg} does not fit the verifying "
                         f"{_describe(_key_kind(key))}")
    if isinstance(key, bytes) and not key:
        raise TokenError("the secret key is empty")
    return alg


@contextmanager
def _key_length_is_ours() -> Iterator[None]:
    """PyJWT warns about short keys; the policy is this module's (see the module comment)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyLengthWarning)
        yield


def _checked_length(token: str) -> str:
    if len(token) > TOKEN_LENGTH_MAX_BYTES:
        raise TokenError(f"the token is longer than {TOKEN_LENGTH_MAX_BYTES} bytes")
    return token.strip()


def _malformed(token: str, error: jwt.PyJWTError) -> TokenError:
    """A TokenError naming which part of a token PyJWT refused as malformed: a diagnosis
    only, for the message (PyJWT's own words when no part is found at fault)."""
    parts = token.split(".")
    if len(parts) != 3:
        return TokenError(f"a token has 3 dot-separated parts, this one {len(parts)}")
    for text, part in ((parts[0], "header"), (parts[1], "claims"), (parts[2], "signature")):
        try:
            if not _B64URL.fullmatch(text):
                raise ValueError(text)
            data = jwt.utils.base64url_decode(text)
        except (binascii.Error, ValueError):
            return TokenError(f"the token's {part} is not base64url")
        if part == "signature":
            break
        try:
            value = json.loads(data)
        except ValueError:  # UnicodeDecodeError too
            return TokenError(f"the token's {part} is not JSON")
        if not isinstance(value, dict):
            return TokenError(f"the token's {part} is not a JSON object")
    return TokenError(f"malformed token: {error}")


def parse_unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims of a token, without checking anything but its form (`tokens
    show`).

    Raises:
        TokenError: the token is malformed.
    """
    token = _checked_length(token)
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as error:
        raise _malformed(token, error) from None
    return header, claims


def algorithm_for_key(key: SigningKey | VerifyingKey, alg: str | None = None) -> str:
    """The algorithm a key signs with: `alg` when given and it fits the key, else HS256 for a
    secret, RS256 for RSA, ES256/384/512 by the EC curve.

    Raises:
        TokenError: `alg` is unknown or does not fit the key.
    """
    allowed = _allowed_for(key)
    if alg is None:
        alg = allowed[0] if allowed else "ES256"
    return _check_alg(alg, key)


def encode_token(claims: dict[str, Any], key: SigningKey, alg: str | None = None) -> str:
    """Sign `claims` into a compact token (header `{"alg": ALG}`).

    Args:
        claims: JSON-able claims, e.g. `{"sub": "admin", "exp": 1767225600}`.
        key: the secret (HS) or the private key (RS, ES).
        alg: the algorithm (default: by the key, see `algorithm_for_key`).

    Raises:
        TokenError: the algorithm is unknown or does not fit the key, a public key was given,
            or an RSA key is shorter than `RSA_KEY_BITS_MIN` bits.
    """
    alg = algorithm_for_key(key, alg)
    if isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise TokenError(f"{alg[:2]} tokens are signed with a private key, not a public one")
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < RSA_KEY_BITS_MIN:
        raise TokenError(f"RSA keys have at least {RSA_KEY_BITS_MIN} bits")
    try:
        with _key_length_is_ours():
            return jwt.encode(claims, key, algorithm=alg, headers={"typ": None})
    except (jwt.PyJWTError, TypeError, ValueError) as error:
        raise TokenError(f"cannot sign the token: {error}") from None


def decode_token(token: str, key: VerifyingKey, *, now_s: float | None = None,
                 clock_skew_s: float = 0.0) -> dict[str, Any]:
    """Verify a token and return its claims.

    Args:
        token: the compact token.
        key: the secret (HS) or the public key (RS, ES) it must be signed with.
        now_s: the current time, seconds since the epoch (default: the clock).
        clock_skew_s: tolerance for `exp` and `nbf`.

    Raises:
        TokenError: malformed, unsigned, an algorithm not allowed for the key, a bad
            signature, expired or not yet valid (see the module comment).
    """
    assert clock_skew_s >= 0
    token = _checked_length(token)
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as error:
        raise _malformed(token, error) from None
    _check_alg(header.get("alg"), key)
    try:
        with _key_length_is_ours():
            claims: dict[str, Any] = jwt.decode(token, key, algorithms=_allowed_for(key),
                                                options=_DECODE_OPTIONS)
    except jwt.InvalidSignatureError:
        raise TokenError("the token's signature does not verify") from None
    except jwt.PyJWTError as error:
        raise _malformed(token, error) from None
    now = time.time() if now_s is None else now_s
    exp = _time_claim(claims, "exp")
    if exp is not None and exp <= now - clock_skew_s:
        raise TokenError(f"the token expired at {exp:.0f} (now {now:.0f})")
    nbf = _time_claim(claims, "nbf")
    if nbf is not None and nbf > now + clock_skew_s:
        raise TokenError(f"the token is not valid before {nbf:.0f} (now {now:.0f})")
    return claims


def _time_claim(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenError(f"the token's {name!r} claim is not a number of seconds")
    return float(value)
