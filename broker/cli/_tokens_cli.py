"""`magnetar tokens`: keys and tokens for token authentication, like `pulsar tokens`.

Theory of operation
-------------------
* `create-secret-key [--output F] [--base64] [-a HS256]`: random bytes (32, 48 or 64 by the
  HMAC algorithm); raw bytes to the file or stdout, base64 text with `--base64`.
* `create-key-pair --output-private-key F --output-public-key F [-a RS256]`: an RSA-2048 or
  EC key pair, written as DER (PKCS#8 private key, SubjectPublicKeyInfo public key), the
  files `pulsar tokens create-key-pair` writes.
* `create (--secret-key K | --private-key K) --subject ROLE [--expiry-time 1h] [-a ALG]`:
  prints a signed token (`sub` = ROLE, `exp` when an expiry is given).
* `show TOKEN`: prints the header and claims without verifying anything.
* `validate (--secret-key K | --public-key K) TOKEN`: verifies signature and expiry, prints
  the claims; exits 1 with the reason when the token is not valid.

Keys are given as `_auth.read_key_source` takes them: a path, `file:///path` or
`data:;base64,...`. Every failure prints `magnetar tokens: <reason>` and exits 1 (2 for
usage errors); nothing is written when a key cannot be created.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import sys
import time
from typing import TYPE_CHECKING, Any, Final

__all__ = ["add_tokens_command", "parse_expiry_s"]

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

_SECRET_KEY_BYTES: Final = {"HS256": 32, "HS384": 48, "HS512": 64}
_EXPIRY_UNITS_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400,
                          "M": 30 * 86400, "y": 365 * 86400}
_EXPIRY = re.compile(r"(\d+)([smhdwMy]?)")
EXIT_INVALID: Final = 1


def parse_expiry_s(text: str) -> int:
    """`pulsar tokens`' relative times: `30s`, `10m`, `1h`, `7d`, `2w`, `6M`, `1y`, or seconds.

    Raises:
        argparse.ArgumentTypeError: not a positive number with an optional unit.
    """
    match = _EXPIRY.fullmatch(text.strip())
    if match is None or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"invalid expiry time {text!r}: use e.g. 30s, 10m, "
                                         "1h, 7d, 2w, 6M or 1y")
    return int(match.group(1)) * _EXPIRY_UNITS_S.get(match.group(2), 1)


def _fail(message: str) -> int:
    print(f"magnetar tokens: {message}", file=sys.stderr)
    return EXIT_INVALID


def _write(path: str | None, data: bytes, private: bool = False) -> None:
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def _cmd_create_secret_key(args: argparse.Namespace) -> int:
    key = secrets.token_bytes(_SECRET_KEY_BYTES[args.signature_algorithm])
    data = base64.b64encode(key) + (b"\n" if args.output is None else b"") if args.base64 \
        else key
    try:
        _write(args.output, data, private=True)
    except OSError as error:
        return _fail(f"cannot write {args.output}: {error.strerror or error}")
    return 0


def _cmd_create_key_pair(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    alg = args.signature_algorithm
    private: Any
    if alg.startswith("RS"):
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        curves: dict[str, ec.EllipticCurve] = {
            "ES256": ec.SECP256R1(), "ES384": ec.SECP384R1(), "ES512": ec.SECP521R1()}
        private = ec.generate_private_key(curves[alg])
    private_der = private.private_bytes(serialization.Encoding.DER,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    public_der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        _write(args.output_private_key, private_der, private=True)
        _write(args.output_public_key, public_der)
    except OSError as error:
        return _fail(f"cannot write the key pair: {error.strerror or error}")
    return 0


def _cmd_create(args: argparse.Namespace) -> int:
    from .._errors import BrokerError
    from ..security._jwt import SigningKey, encode_token
    from ..security._principal import read_key_source
    from ..security._token import load_private_key

    claims: dict[str, Any] = {"sub": args.subject}
    if args.expiry_time is not None:
        claims["exp"] = int(time.time()) + args.expiry_time
    try:
        key: SigningKey
        if args.secret_key:
            key = read_key_source(args.secret_key)
        else:
            key = load_private_key(read_key_source(args.private_key), args.private_key)
        print(encode_token(claims, key, args.signature_algorithm))
    except BrokerError as error:
        return _fail(str(error))
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from ..security._jwt import TokenError, parse_unverified

    try:
        header, claims = parse_unverified(_token_argument(args))
    except TokenError as error:
        return _fail(str(error))
    print(json.dumps(header, sort_keys=True))
    print(json.dumps(claims, sort_keys=True))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .._errors import BrokerError
    from ..security._jwt import VerifyingKey, decode_token
    from ..security._principal import read_key_source
    from ..security._token import load_public_key

    try:
        key: VerifyingKey
        if args.secret_key:
            key = read_key_source(args.secret_key)
        else:
            key = load_public_key(read_key_source(args.public_key), args.public_key)
        claims = decode_token(_token_argument(args), key)
    except BrokerError as error:
        return _fail(f"invalid token: {error}")
    print(json.dumps(claims, sort_keys=True))
    return 0


def _token_argument(args: argparse.Namespace) -> str:
    if args.token_file:
        try:
            with open(args.token_file) as file:
                return file.read().strip()
        except OSError as error:
            raise SystemExit(f"magnetar tokens: cannot read {args.token_file}: "
                             f"{error.strerror or error}") from None
    if not args.token:
        raise SystemExit("magnetar tokens: give a TOKEN or --token-file")
    return str(args.token).strip()


def add_tokens_command(sub: SubParsers) -> None:
    """Register `magnetar tokens` and its subcommands."""
    tokens = sub.add_parser(
        "tokens", help="create keys and tokens for token authentication",
        description="Keys and JWT tokens for the broker's token authentication (like "
        "pulsar tokens). Keys are a path, file:///path or data:;base64,...")
    commands = tokens.add_subparsers(dest="tokens_command", required=True, metavar="COMMAND")
    secret = commands.add_parser("create-secret-key", help="a random HMAC secret key")
    secret.add_argument("-o", "--output", default=None, help="write it here (default stdout)")
    secret.add_argument("-b", "--base64", action="store_true", help="base64 text, not bytes")
    secret.add_argument("-a", "--signature-algorithm", default="HS256",
                        choices=sorted(_SECRET_KEY_BYTES))
    secret.set_defaults(handler=_cmd_create_secret_key)
    pair = commands.add_parser("create-key-pair", help="an RSA or EC key pair (DER files)")
    pair.add_argument("--output-private-key", required=True, help="the private key file")
    pair.add_argument("--output-public-key", required=True, help="the public key file")
    pair.add_argument("-a", "--signature-algorithm", default="RS256",
                      choices=["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"])
    pair.set_defaults(handler=_cmd_create_key_pair)
    create = commands.add_parser("create", help="sign a token for a role")
    keys = create.add_mutually_exclusive_group(required=True)
    keys.add_argument("--secret-key", help="the secret key (HS tokens)")
    keys.add_argument("--private-key", help="the private key (RS/ES tokens)")
    create.add_argument("-s", "--subject", required=True, help="the role (the 'sub' claim)")
    create.add_argument("-e", "--expiry-time", type=parse_expiry_s, default=None,
                        help="valid for this long (e.g. 1h, 7d, 1y; default: no expiry)")
    create.add_argument("-a", "--signature-algorithm", default=None,
                        help="the algorithm (default HS256, RS256 or by the EC curve)")
    create.set_defaults(handler=_cmd_create)
    show = commands.add_parser("show", help="print a token's header and claims (unverified)")
    _token_arguments(show)
    show.set_defaults(handler=_cmd_show)
    validate = commands.add_parser("validate", help="verify a token and print its claims")
    verify_keys = validate.add_mutually_exclusive_group(required=True)
    verify_keys.add_argument("--secret-key", help="the secret key (HS tokens)")
    verify_keys.add_argument("--public-key", help="the public key (RS/ES tokens)")
    _token_arguments(validate)
    validate.set_defaults(handler=_cmd_validate)


def _token_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("token", nargs="?", default=None, help="the token")
    parser.add_argument("-f", "--token-file", default=None, help="read the token from a file")
