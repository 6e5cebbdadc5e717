"""What the client-side subcommands of `magnetar` share (`_admin_cli`, `_client_cli`,
`_admin_cli_schemas`): the admin HTTP request (`admin_request`, `AdminHttpError`), printing
its answer, the security options (`--auth-token[-file]`, `--tls-trust-certs-file`), values
with units (`parse_duration_s`, `parse_size_bytes`), topic and namespace paths, and the
builders of pulsar-admin style groups and commands (`_group`, `_command`, `_call`,
`_policy_commands`). See `_admin_cli` for the theory of operation.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from email.message import Message
from typing import TYPE_CHECKING, Any

__all__ = ["AdminHttpError", "admin_request", "admin_request_raw", "parse_duration_s",
           "parse_size_bytes"]

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
HTTP_TIMEOUT_S = 30.0
Handler = Callable[[argparse.Namespace], int]
if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_UNIT_BYTES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_QUANTITY = re.compile(r"(-?\d+)([a-zA-Z]?)")
MB = 1 << 20


class AdminHttpError(Exception):
    """The admin API answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason


# -- values ---------------------------------------------------------------------------------


def parse_duration_s(text: str) -> int:
    """`pulsar-admin`'s relative times: `90`, `90s`, `10m`, `3h`, `2d`, `1w`, `-1`.

    Raises:
        argparse.ArgumentTypeError: not a number with an optional known unit.
    """
    match = _QUANTITY.fullmatch(text.strip())
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _UNIT_SECONDS):
        raise argparse.ArgumentTypeError(f"invalid time '{text}': use e.g. 30s, 10m, 3h, 2d")
    value = int(match.group(1))
    return value if value < 0 else value * _UNIT_SECONDS.get(unit, 1)


def parse_size_bytes(text: str) -> int:
    """`pulsar-admin`'s sizes: `4096`, `10k`, `10M`, `16G`, `3T`, `-1`.

    Raises:
        argparse.ArgumentTypeError: not a number with an optional known unit.
    """
    match = _QUANTITY.fullmatch(text.strip())
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _UNIT_BYTES):
        raise argparse.ArgumentTypeError(f"invalid size '{text}': use e.g. 4096, 10M, 16G")
    value = int(match.group(1))
    return value if value < 0 else value * _UNIT_BYTES.get(unit, 1)


def _count(text: str) -> int:
    """A number of entries: at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count '{text}': not a number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid count {value}: must be at least 1")
    return value


def _age_s(text: str) -> int:
    """`parse_duration_s`, not negative: how old messages must be to expire."""
    value = parse_duration_s(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid time '{text}': must not be negative")
    return value


def _message_id(text: str) -> dict[str, int]:
    """`latest`, `earliest` or `ledger:entry[:partition]` as a MessageId body."""
    lowered = text.strip().lower()
    if lowered == "latest":
        return {"ledgerId": 2**63 - 1, "entryId": 2**63 - 1, "partitionIndex": -1}
    if lowered == "earliest":
        return {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
    parts = lowered.split(":")
    if len(parts) not in (2, 3) or not all(re.fullmatch(r"-?\d+", p) for p in parts):
        raise argparse.ArgumentTypeError(
            f"invalid message id '{text}': use latest, earliest or ledger:entry")
    return {"ledgerId": int(parts[0]), "entryId": int(parts[1]),
            "partitionIndex": int(parts[2]) if len(parts) == 3 else -1}


def _topic_path(topic: str) -> str:
    """`/admin/v2/<domain>/<tenant>/<namespace>/<url-encoded local name>`."""
    from .._names import TopicName

    name = TopicName.parse(topic)
    local = urllib.parse.quote(name.local_name, safe="")
    return f"/admin/v2/{name.domain}/{name.namespace_name}/{local}"


def _namespace_path(namespace: str) -> str:
    from .._names import NamespaceName

    return f"/admin/v2/namespaces/{NamespaceName.parse(namespace)}"


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


# -- HTTP -----------------------------------------------------------------------------------


def admin_request(admin_url: str, method: str, path: str, body: Any = None,
                  query: dict[str, str] | None = None, *, token: str | None = None,
                  trust_certs_file: str | None = None) -> Any:
    """One admin API call.

    Args:
        admin_url: the API's base URL.
        method: GET, PUT, POST or DELETE.
        path: the path, already encoded.
        body: a JSON-able body, or None for none.
        query: query parameters.
        token: sent as `Authorization: Bearer <token>`.
        trust_certs_file: the CAs that verify an https admin URL (default: the system's).

    Returns:
        The decoded JSON answer; None for an empty one (204).

    Raises:
        AdminHttpError: an error status (with Pulsar's `reason`), or status 0 when the API
            cannot be reached, the URL is malformed or the answer is not JSON.
    """
    raw = admin_request_raw(admin_url, method, path, body, query, token=token,
                            trust_certs_file=trust_certs_file)[1]
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise AdminHttpError(0, f"{admin_url} is not the admin API: it answered "
                                f"{admin_url.rstrip('/') + path} with something other than "
                                "JSON") from None


def admin_request_raw(admin_url: str, method: str, path: str, body: Any = None,
                      query: dict[str, str] | None = None, *, token: str | None = None,
                      trust_certs_file: str | None = None) -> tuple[Message, bytes]:
    """One admin API call answered with bytes (a message's payload): `(headers, body)`.
    Arguments and errors as `admin_request`'s (no JSON decoding)."""
    scheme = admin_url.partition("://")[0] if "://" in admin_url else ""
    if scheme.lower() not in ("http", "https"):
        raise AdminHttpError(0, f"invalid --admin-url {admin_url!r}: expected "
                                "http://HOST:PORT or https://HOST:PORT")
    url = admin_url.rstrip("/") + path
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
    except ValueError as error:  # e.g. "Invalid IPv6 URL"
        raise AdminHttpError(0, f"invalid --admin-url {admin_url!r}: {error}") from None
    try:
        context = (ssl.create_default_context(cafile=trust_certs_file) if trust_certs_file
                   else None)
    except OSError as error:  # missing, unreadable, or no certificate in it (ssl.SSLError)
        raise AdminHttpError(0, f"cannot use --tls-trust-certs-file {trust_certs_file}: "
                                f"{error.strerror or error}") from None
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S,
                                    context=context) as answer:
            return answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        raise AdminHttpError(error.code, _error_reason(error)) from None
    except urllib.error.URLError as error:
        raise AdminHttpError(0, f"cannot reach the admin API at {admin_url}: "
                                f"{error.reason}") from None
    except (OSError, ValueError) as error:
        raise AdminHttpError(0, f"cannot reach the admin API at {admin_url}: {error}") from None


def _error_reason(error: urllib.error.HTTPError) -> str:
    raw = error.read()
    try:
        decoded = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip() or str(error.reason)
    if isinstance(decoded, dict) and "reason" in decoded:
        return str(decoded["reason"])
    return str(decoded)


def _print(value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            print(item if isinstance(item, str) else json.dumps(item))
    elif isinstance(value, dict):
        print(json.dumps(value, indent=2, sort_keys=True))
    else:
        print(json.dumps(value))


def _call(method: str, path: Callable[[argparse.Namespace], str],
          body: Callable[[argparse.Namespace], Any] | None = None,
          query: Callable[[argparse.Namespace], dict[str, str]] | None = None,
          ) -> Handler:
    """A handler making one admin call and printing its answer."""

    def handle(args: argparse.Namespace) -> int:
        # AdminHttpError and invalid names go up to the CLI's boundary (`cli.main`), which
        # prints them as one line and exits 1 (2 for a name).
        answer = admin_request(args.admin_url, method, path(args),
                               body(args) if body is not None else None,
                               query(args) if query is not None else None,
                               **_http_security(args))
        if answer is not None:
            _print(answer)
        return 0

    return handle


def _auth_token(args: argparse.Namespace) -> str | None:
    """The token of --auth-token or --auth-token-file (None: neither)."""
    token: str | None = getattr(args, "auth_token", None)
    token_file: str | None = getattr(args, "auth_token_file", None)
    if token_file:
        try:
            with open(token_file) as file:
                token = file.read().strip()
        except OSError as error:
            raise SystemExit(f"magnetar: cannot read --auth-token-file {token_file}: "
                             f"{error.strerror or error}") from None
    return token or None


def _http_security(args: argparse.Namespace) -> dict[str, Any]:
    return {"token": _auth_token(args),
            "trust_certs_file": getattr(args, "tls_trust_certs_file", None)}


def _security_options(parser: argparse.ArgumentParser, suppress: bool = False) -> None:
    default: Any = argparse.SUPPRESS if suppress else None
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument("--auth-token", default=default, metavar="TOKEN",
                        help="authenticate with this token")
    tokens.add_argument("--auth-token-file", default=default, metavar="FILE",
                        help="authenticate with the token in this file")
    parser.add_argument("--tls-trust-certs-file", default=default, metavar="FILE",
                        help="CA certificates (PEM) that verify the broker's TLS certificate")


def _force(args: argparse.Namespace) -> dict[str, str]:
    return {"force": "true"} if args.force else {}


# -- pulsar-admin style groups --------------------------------------------------------------


def _group(sub: SubParsers, name: str, help_text: str, description: str) -> SubParsers:
    group = sub.add_parser(name, help=help_text, description=description)
    group.add_argument("--admin-url", default=DEFAULT_ADMIN_URL,
                       help=f"the admin API's URL (default {DEFAULT_ADMIN_URL})")
    _security_options(group)
    commands = group.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
    return commands


def _command(commands: SubParsers, name: str, help_text: str, handler: Handler,
             ) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help_text, description=help_text[:1].upper()
                                 + help_text[1:] + ".")
    # Also accepted after the command; unset here, the group's value (or default) stands.
    parser.add_argument("--admin-url", default=argparse.SUPPRESS,
                        help=f"the admin API's URL (default {DEFAULT_ADMIN_URL})")
    _security_options(parser, suppress=True)
    parser.set_defaults(handler=handler)
    return parser


def _policy_commands(commands: SubParsers, name: str, endpoint: str,
                     body: Callable[[argparse.Namespace], Any]) -> argparse.ArgumentParser:
    """get-/remove-/set-<name> for one namespace policy endpoint; returns set's parser."""

    def path(args: argparse.Namespace) -> str:
        return f"{_namespace_path(args.namespace)}/{endpoint}"

    words = name.replace("-", " ")
    _command(commands, f"get-{name}", f"show a namespace's {words}",
             _call("GET", path)).add_argument("namespace")
    _command(commands, f"remove-{name}", f"remove a namespace's {words} (the broker's "
             "default applies)", _call("DELETE", path)).add_argument("namespace")
    setter = _command(commands, f"set-{name}", f"set a namespace's {words}",
                      _call("POST", path, body))
    setter.add_argument("namespace")
    return setter
