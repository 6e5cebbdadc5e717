"""JSON Web Tokens in compact JWS form: what Pulsar's token authentication carries.

Theory of operation
-------------------
A token is `base64url(header) "." base64url(claims) "." base64url(signature)`, unpadded
base64url each, where the header is a JSON object naming the algorithm (`alg`) and the claims
a JSON object (`sub`: the role; `exp`: expiry, seconds since the epoch, optional). The
signature covers the first two parts as ASCII.

Algorithms: HS256/384/512 (HMAC with a shared secret key: bytes), RS256/384/512 (RSA
PKCS#1 v1.5) and ES256/384/512 (ECDSA on P-256/P-384/P-521, the signature being the raw
`r || s` of fixed width, not DER). Signing takes the secret or the private key; verifying
the secret or the public key. `cryptography` does the primitives; the token format is ours.

Verification refuses, before looking at the signature: a token not made of three parts, a part
that is not base64url, a header or claims that are not JSON objects, `alg: none` or any
algorithm not in `ALGORITHMS`, and an algorithm whose family does not fit the key (an HMAC
token checked against a public key, an RS token against an EC key, an ES256 token against a
P-384 key...) -- the classic confusion attacks. HMAC signatures are compared in constant time.
Then the time claims: `exp` at or before now (less the allowed clock skew) and `nbf` after
now are refused. Every refusal raises `TokenError` (an `AuthenticationError`, wire code
AuthenticationError) whose message says what was wrong; nothing is cached or changed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

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
RSA_KEY_BITS_MIN: Final = 2048  # RFC 7518 3.3


@dataclass(frozen=True)
class _Algorithm:
    family: str  # "HS", "RS" or "ES"
    digest: Any  # hashlib constructor (HS) or cryptography hash class (RS, ES)
    curve: type[ec.EllipticCurve] | None = None  # ES only
    coordinate_bytes: int = 0  # ES only: width of r and of s


ALGORITHMS: Final[dict[str, _Algorithm]] = {
    "HS256": _Algorithm("HS", hashlib.sha256),
    "HS384": _Algorithm("HS", hashlib.sha384),
    "HS512": _Algorithm("HS", hashlib.sha512),
    "RS256": _Algorithm("RS", hashes.SHA256),
    "RS384": _Algorithm("RS", hashes.SHA384),
    "RS512": _Algorithm("RS", hashes.SHA512),
    "ES256": _Algorithm("ES", hashes.SHA256, ec.SECP256R1, 32),
    "ES384": _Algorithm("ES", hashes.SHA384, ec.SECP384R1, 48),
    "ES512": _Algorithm("ES", hashes.SHA512, ec.SECP521R1, 66),
}


class TokenError(AuthenticationError):
    """A token that cannot be accepted; the message says why."""


# -- base64url and JSON -----------------------------------------------------------------------


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str, part: str) -> bytes:
    if not text or any(c not in _B64URL_CHARS for c in text) or len(text) % 4 == 1:
        raise TokenError(f"the token's {part} is not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenError(f"the token's {part} is not base64url") from None


_B64URL_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _json_object(data: bytes, part: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise TokenError(f"the token's {part} is not JSON") from None
    if not isinstance(value, dict):
        raise TokenError(f"the token's {part} is not a JSON object")
    return value


def _split(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
    """Header, claims, signature and the signed bytes of a token, unverified."""
    if len(token) > TOKEN_LENGTH_MAX_BYTES:
        raise TokenError(f"the token is longer than {TOKEN_LENGTH_MAX_BYTES} bytes")
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise TokenError(f"a token has 3 dot-separated parts, this one {len(parts)}")
    header = _json_object(_b64decode(parts[0], "header"), "header")
    claims = _json_object(_b64decode(parts[1], "claims"), "claims")
    signature = _b64decode(parts[2], "signature") if parts[2] else b""
    return header, claims, signature, f"{parts[0]}.{parts[1]}".encode("ascii")


def parse_unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims of a token, without checking anything but its form (`tokens
    show`).

    Raises:
        TokenError: the token is malformed.
    """
    header, claims, _, _ = _split(token)
    return header, claims


# -- keys and algorithms ----------------------------------------------------------------------


def algorithm_for_key(key: SigningKey | VerifyingKey, alg: str | None = None) -> str:
    """The algorithm a key signs with: `alg` when given and it fits the key, else HS256 for a
    secret, RS256 for RSA, ES256/384/512 by the EC curve.

    Raises:
        TokenError: `alg` is unknown or does not fit the key.
    """
    if alg is None:
        if isinstance(key, bytes):
            alg = "HS256"
        elif isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
            alg = "RS256"
        else:
            alg = {"secp256r1": "ES256", "secp384r1": "ES384",
                   "secp521r1": "ES512"}.get(key.curve.name, "ES256")
    _check_key(_algorithm(alg), alg, key)
    return alg


def _algorithm(alg: object) -> _Algorithm:
    if not isinstance(alg, str) or alg.lower() == "none":
        raise TokenError(f"unsigned tokens (alg {alg!r}) are not accepted")
    found = ALGORITHMS.get(alg)
    if found is None:
        raise TokenError(f"unsupported token algorithm {alg!r} (supported: "
                         f"{', '.join(ALGORITHMS)})")
    return found


def _check_key(algorithm: _Algorithm, alg: str, key: SigningKey | VerifyingKey) -> None:
    if algorithm.family == "HS":
        fits = isinstance(key, bytes)
    elif algorithm.family == "RS":
        fits = isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey)
    else:
        fits = (isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey)
                and algorithm.curve is not None and isinstance(key.curve, algorithm.curve))
    if not fits:
        raise TokenError(f"the token's algorithm {alg} does not fit the verifying "
                         f"{_key_kind(key)}")
    if isinstance(key, bytes) and not key:
        raise TokenError("the secret key is empty")


def _key_kind(key: SigningKey | VerifyingKey) -> str:
    if isinstance(key, bytes):
        return "secret key"
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return "RSA key"
    return f"EC key ({key.curve.name})"


# -- signing and verifying --------------------------------------------------------------------


def _sign(algorithm: _Algorithm, key: SigningKey, data: bytes) -> bytes:
    if algorithm.family == "HS":
        assert isinstance(key, bytes)
        return hmac.new(key, data, algorithm.digest).digest()
    if algorithm.family == "RS":
        if not isinstance(key, rsa.RSAPrivateKey):
            raise TokenError("RS tokens are signed with an RSA private key")
        return key.sign(data, padding.PKCS1v15(), algorithm.digest())
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TokenError("ES tokens are signed with an EC private key")
    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(algorithm.digest())))
    width = algorithm.coordinate_bytes
    return r.to_bytes(width, "big") + s.to_bytes(width, "big")


def _verify(algorithm: _Algorithm, key: VerifyingKey, data: bytes, signature: bytes) -> bool:
    if algorithm.family == "HS":
        assert isinstance(key, bytes)
        expected = hmac.new(key, data, algorithm.digest).digest()
        return hmac.compare_digest(expected, signature)
    try:
        if algorithm.family == "RS":
            assert isinstance(key, rsa.RSAPublicKey)
            key.verify(signature, data, padding.PKCS1v15(), algorithm.digest())
            return True
        assert isinstance(key, ec.EllipticCurvePublicKey)
        width = algorithm.coordinate_bytes
        if len(signature) != 2 * width:
            return False
        r = int.from_bytes(signature[:width], "big")
        s = int.from_bytes(signature[width:], "big")
        key.verify(encode_dss_signature(r, s), data, ec.ECDSA(algorithm.digest()))
        return True
    except InvalidSignature:
        return False


def encode_token(claims: dict[str, Any], key: SigningKey, alg: str | None = None) -> str:
    """Sign `claims` into a compact token.

    Args:
        claims: JSON-able claims, e.g. `{"sub": "admin", "exp": 1767225600}`.
        key: the secret (HS) or the private key (RS, ES).
        alg: the algorithm (default: by the key, see `algorithm_for_key`).

    Raises:
        TokenError: the algorithm is unknown or does not fit the key.
    """
    alg = algorithm_for_key(key, alg)
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < RSA_KEY_BITS_MIN:
        raise TokenError(f"RSA keys have at least {RSA_KEY_BITS_MIN} bits")
    header = {"alg": alg}
    signed = (_b64encode(json.dumps(header, separators=(",", ":")).encode()) + "."
              + _b64encode(json.dumps(claims, separators=(",", ":")).encode()))
    signature = _sign(ALGORITHMS[alg], key, signed.encode("ascii"))
    return f"{signed}.{_b64encode(signature)}"


def decode_token(token: str, key: VerifyingKey, *, now_s: float | None = None,
                 clock_skew_s: float = 0.0) -> dict[str, Any]:
    """Verify a token and return its claims.

    Args:
        token: the compact token.
        key: the secret (HS) or the public key (RS, ES) it must be signed with.
        now_s: the current time, seconds since the epoch (default: the clock).
        clock_skew_s: tolerance for `exp` and `nbf`.

    Raises:
        TokenError: malformed, unsigned, the wrong algorithm for the key, a bad signature,
            expired or not yet valid (see the module comment).
    """
    assert clock_skew_s >= 0
    header, claims, signature, signed = _split(token)
    alg = header.get("alg")
    algorithm = _algorithm(alg)
    assert isinstance(alg, str)
    _check_key(algorithm, alg, key)
    if not signature or not _verify(algorithm, key, signed, signature):
        raise TokenError("the token's signature does not verify")
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
