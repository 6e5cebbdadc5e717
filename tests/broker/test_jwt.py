"""Our compact-JWS tokens: every algorithm round-trips, and each way a token can be wrong is
refused with a message that says which."""

from __future__ import annotations

import base64
import hmac
import json
import re
import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from magnetar.broker._errors import AuthenticationError
from magnetar.broker.security._jwt import (
    ALGORITHMS,
    TokenError,
    algorithm_for_key,
    decode_token,
    encode_token,
    parse_unverified,
)

SECRET = b"s" * 32
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEYS = {"ES256": ec.generate_private_key(ec.SECP256R1()),
           "ES384": ec.generate_private_key(ec.SECP384R1()),
           "ES512": ec.generate_private_key(ec.SECP521R1())}


def _keys(alg: str) -> tuple[object, object]:
    """(signing key, verifying key) for an algorithm."""
    if alg.startswith("HS"):
        return SECRET, SECRET
    private = RSA_KEY if alg.startswith("RS") else EC_KEYS[alg]
    return private, private.public_key()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _signed(signed_part: str) -> str:
    """`signed_part` with a valid HS256 signature by SECRET (a well-signed malformed token)."""
    return f"{signed_part}.{_b64(hmac.new(SECRET, signed_part.encode(), 'sha256').digest())}"


def _forge(header: dict[str, object], claims: dict[str, object], signature: bytes = b"x") -> str:
    return ".".join([_b64(json.dumps(header).encode()), _b64(json.dumps(claims).encode()),
                     _b64(signature)])


@pytest.mark.parametrize("alg", sorted(ALGORITHMS))
def test_each_algorithm_round_trips(alg: str) -> None:
    signing, verifying = _keys(alg)
    token = encode_token({"sub": "alice", "exp": time.time() + 60}, signing, alg)  # type: ignore[arg-type]
    header, _ = parse_unverified(token)
    assert header == {"alg": alg}
    claims = decode_token(token, verifying)  # type: ignore[arg-type]
    assert claims["sub"] == "alice"


@pytest.mark.parametrize("alg", ["HS256", "RS256", "ES256"])
def test_a_tampered_signature_or_payload_is_refused(alg: str) -> None:
    signing, verifying = _keys(alg)
    token = encode_token({"sub": "alice"}, signing, alg)  # type: ignore[arg-type]
    head, body, signature = token.split(".")
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    with pytest.raises(TokenError, match="signature does not verify"):
        decode_token(f"{head}.{body}.{flipped}", verifying)  # type: ignore[arg-type]
    other_body = _b64(json.dumps({"sub": "mallory"}).encode())
    with pytest.raises(TokenError, match="signature does not verify"):
        decode_token(f"{head}.{other_body}.{signature}", verifying)  # type: ignore[arg-type]


def test_a_token_signed_with_another_secret_is_refused() -> None:
    token = encode_token({"sub": "alice"}, b"another secret key of 32 bytes!!")
    with pytest.raises(TokenError, match="signature does not verify"):
        decode_token(token, SECRET)


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_is_refused_even_without_a_signature(alg: str) -> None:
    unsigned = _forge({"alg": alg}, {"sub": "admin"}, b"")
    assert unsigned.endswith(".")
    with pytest.raises(TokenError, match="unsigned tokens"):
        decode_token(unsigned, SECRET)
    with pytest.raises(TokenError, match="unsigned tokens"):
        decode_token(_forge({"alg": alg}, {"sub": "admin"}, b"sig"), SECRET)


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(TokenError, match="unsupported token algorithm 'PS256'"):
        decode_token(_forge({"alg": "PS256"}, {"sub": "a"}), SECRET)


def test_an_hmac_token_is_not_accepted_against_a_public_key() -> None:
    """The classic confusion: HS256 'signed' with the public key's bytes."""
    public = RSA_KEY.public_key()
    with pytest.raises(TokenError, match="HS256 does not fit the verifying RSA key"):
        decode_token(encode_token({"sub": "a"}, SECRET, "HS256"), public)


@pytest.mark.parametrize(("alg", "verifying_alg", "kind"), [
    ("RS256", "ES256", "EC key"), ("ES256", "RS256", "RSA key"),
    ("ES256", "ES384", "EC key (secp384r1)"), ("RS256", "HS256", "secret key")])
def test_the_key_type_must_fit_the_algorithm(alg: str, verifying_alg: str, kind: str) -> None:
    signing, _ = _keys(alg)
    _, verifying = _keys(verifying_alg)
    token = encode_token({"sub": "a"}, signing, alg)  # type: ignore[arg-type]
    with pytest.raises(TokenError, match=re.escape(f"does not fit the verifying {kind}")):
        decode_token(token, verifying)  # type: ignore[arg-type]


def test_signing_needs_the_matching_key_kind() -> None:
    with pytest.raises(TokenError, match="does not fit"):
        encode_token({"sub": "a"}, RSA_KEY, "HS256")
    with pytest.raises(TokenError, match="does not fit"):
        encode_token({"sub": "a"}, SECRET, "ES256")
    assert algorithm_for_key(EC_KEYS["ES384"]) == "ES384"
    assert algorithm_for_key(RSA_KEY.public_key()) == "RS256"


def test_expired_and_not_yet_valid_tokens_are_refused() -> None:
    now = 1_800_000_000.0
    expired = encode_token({"sub": "a", "exp": int(now) - 1}, SECRET)
    with pytest.raises(TokenError, match="expired"):
        decode_token(expired, SECRET, now_s=now)
    assert decode_token(expired, SECRET, now_s=now, clock_skew_s=5)["sub"] == "a"
    at_now = encode_token({"sub": "a", "exp": int(now)}, SECRET)
    with pytest.raises(TokenError, match="expired"):
        decode_token(at_now, SECRET, now_s=now)
    early = encode_token({"sub": "a", "nbf": int(now) + 60}, SECRET)
    with pytest.raises(TokenError, match="not valid before"):
        decode_token(early, SECRET, now_s=now)
    bad_exp = encode_token({"sub": "a", "exp": "tomorrow"}, SECRET)
    with pytest.raises(TokenError, match="'exp' claim is not a number"):
        decode_token(bad_exp, SECRET, now_s=now)


@pytest.mark.parametrize(("token", "message"), [
    ("abc", "3 dot-separated parts, this one 1"),
    ("a.b.c.d", "3 dot-separated parts, this one 4"),
    ("!!.e30.AA", "header is not base64url"),
    # PyJWT tolerates '=' padding (the hand-written parser refused it); the signature,
    # which covers the exact text, still refuses the token.
    (_b64(b'{"alg":"HS256"}') + ".e30=.AA", "signature does not verify"),
    (_b64(b"not json") + ".e30.AA", "header is not JSON"),
    (_b64(b"[1]") + ".e30.AA", "header is not a JSON object"),
    (_signed(_b64(b'{"alg":"HS256"}') + "." + _b64(b'"text"')),
     "claims is not a JSON object"),
    (_b64(b'{"alg":"HS256"}') + ".e30.A", "signature is not base64url"),
])
def test_malformed_tokens_name_their_fault(token: str, message: str) -> None:
    with pytest.raises(TokenError, match=message):
        decode_token(token, SECRET)


def test_token_errors_are_authentication_errors_with_the_wire_code() -> None:
    with pytest.raises(AuthenticationError) as caught:
        decode_token("x", SECRET)
    assert caught.value.code == 3  # ServerError.AuthenticationError


def test_oversized_tokens_are_refused_unparsed() -> None:
    with pytest.raises(TokenError, match="longer than"):
        decode_token("a" * (64 * 1024 + 1), SECRET)


# -- PyJWT underneath (issue 11, section 4) ------------------------------------------------


def test_tokens_are_the_ones_the_earlier_encoder_made() -> None:
    """`tokens create` output is unchanged: the same header (no `typ`), bytes for bytes."""
    token = encode_token({"sub": "alice", "exp": 1900000000}, b"k" * 32)
    assert token == ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsImV4cCI6MTkwMDAwMDAwMH0."
                     "mgu7v4g0LC6d4t99Ge_iHOSfAcAMW5nqeTZkiwvZvyA")
    assert decode_token(token, b"k" * 32, now_s=1_800_000_000)["sub"] == "alice"


@pytest.mark.parametrize("extension", [{"crit": ["x-policy"], "x-policy": 1},
                                       {"crit": ["b64"], "b64": False}])
def test_a_critical_header_extension_is_refused(extension: dict[str, object]) -> None:
    """RFC 7515 4.1.11: a token naming a critical extension the verifier does not know is
    invalid, even when well signed (the hand-written verifier accepted both); RFC 7797's
    `b64: false` payload is not taken for claims either."""
    header = _b64(json.dumps({"alg": "HS256", **extension}).encode())
    token = _signed(f"{header}.{_b64(json.dumps({'sub': 'a'}).encode())}")
    with pytest.raises(TokenError, match=r"critical extension|'b64'"):
        decode_token(token, SECRET)


def test_claims_pulsar_does_not_check_are_not_checked() -> None:
    """`aud`, a future `iat`, a numeric `jti` or `sub` pass, as with Pulsar's provider."""
    claims = {"sub": 7, "role": "alice", "aud": "elsewhere", "iat": int(time.time()) + 3600,
              "jti": 5}
    token = encode_token(claims, SECRET)
    assert decode_token(token, SECRET)["role"] == "alice"
