"""The client-side subcommands of `magnetar`: `produce`, `consume`, `topics`, `namespaces`,
`tenants` and `clusters` (and `schemas`, from `_admin_cli_schemas`).

Theory of operation
-------------------
`produce` and `consume` are `pulsar-client`'s: they drive the official `pulsar` client
against `--url` (the broker's binary protocol). `topics`, `namespaces`, `tenants` and
`clusters` are `pulsar-admin`'s, with its subcommand names: each one is a single request to
the admin HTTP API at `--admin-url`, made with `urllib`, whose JSON answer is printed
(objects indented, lists one item a line). An error answer raises `AdminHttpError`, which
`cli.main` prints as `magnetar <command>: HTTP <status>: <reason>` on stderr, exiting 1;
an invalid topic or namespace name is refused the same way before any request (exit 2).

Topic arguments take any form `TopicName.parse` does (`my-topic`,
`tenant/ns/my-topic`, `persistent://tenant/ns/my-topic`); the local name travels
URL-encoded in the path, as the admin API expects. Times take an optional unit suffix
(s, m, h, d, w; seconds without one) and sizes one of k, M, G, T (bytes without one),
as `pulsar-admin` does; -1 means unlimited where the policy allows it.

Security: `--auth-token TOKEN` or `--auth-token-file FILE` authenticates (the client's
`AuthenticationToken`; `Authorization: Bearer` for the admin API), and
`--tls-trust-certs-file FILE` names the CAs that verify a `pulsar+ssl://` broker or an
`https://` admin URL.

Nothing here imports the pulsar client or opens a connection until a subcommand runs,
so `magnetar --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__all__ = ["AdminHttpError", "add_commands", "admin_request", "parse_duration_s",
           "parse_size_bytes"]

DEFAULT_URL = "pulsar://127.0.0.1:6650"
DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
HTTP_TIMEOUT_S = 30.0
RECEIVE_SLICE_S = 0.2  # consume notices Ctrl-C within this long
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
            raw = answer.read()
    except urllib.error.HTTPError as error:
        raise AdminHttpError(error.code, _error_reason(error)) from None
    except urllib.error.URLError as error:
        raise AdminHttpError(0, f"cannot reach the admin API at {admin_url}: "
                                f"{error.reason}") from None
    except (OSError, ValueError) as error:
        raise AdminHttpError(0, f"cannot reach the admin API at {admin_url}: {error}") from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise AdminHttpError(0, f"{admin_url} is not the admin API: it answered {url} with "
                                f"something other than JSON") from None


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


# -- produce and consume --------------------------------------------------------------------


def _pulsar() -> Any:
    return importlib.import_module("pulsar")


def _client(pulsar: Any, args: argparse.Namespace) -> Any:
    import logging
    import os

    timeout_s = max(1, int(args.timeout_s))
    # Without -v the client's own log goes nowhere: the command prints one line when it
    # fails. A Python logger is passed only with -v: with one, the client's threads can
    # abort the process at exit ("terminate called without an active exception", exit 134;
    # pulsar-client-python issue 256), which happened on most runs at WARNING level.
    logger: Any = pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull)
    if getattr(args, "verbose", False):
        logger = logging.getLogger("pulsar")
    options: dict[str, Any] = {}
    token = _auth_token(args)
    if token:
        options["authentication"] = pulsar.AuthenticationToken(token)
    if args.tls_trust_certs_file:
        try:  # the client would only say "AuthenticationError" when it connects
            with open(args.tls_trust_certs_file, "rb"):
                pass
        except OSError as error:
            print(f"magnetar: cannot read --tls-trust-certs-file {args.tls_trust_certs_file}: "
                  f"{error.strerror or error}", file=sys.stderr)
            return None
        options["tls_trust_certs_file_path"] = args.tls_trust_certs_file
    try:
        return pulsar.Client(args.url, operation_timeout_seconds=timeout_s,
                             connection_timeout_ms=timeout_s * 1000, logger=logger, **options)
    except (ValueError, pulsar.PulsarException) as error:
        print(f"magnetar: invalid --url {args.url}: {error}", file=sys.stderr)
        return None


def _properties(pairs: list[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"magnetar: invalid property '{pair}': use key=value")
        found[key] = value
    return found


def _check_topic(topic: str) -> None:
    """Validate a topic name before connecting.

    Raises:
        InvalidTopicNameError: with upstream's message (the CLI prints it on one line).
    """
    from .._names import TopicName

    TopicName.parse(topic)


def _cmd_produce(args: argparse.Namespace) -> int:
    _check_topic(args.topic)
    pulsar = _pulsar()
    properties = _properties(args.property)
    messages = [m for text in args.messages for m in
                (text.split(args.separator) if args.separator else [text])]
    if not messages:
        print("magnetar: nothing to produce: give messages with -m", file=sys.stderr)
        return 1
    client = _client(pulsar, args)
    if client is None:
        return 1
    try:
        producer = client.create_producer(args.topic, batching_enabled=not args.no_batching)
        sent = 0
        for _ in range(args.num_produce):
            for message in messages:
                producer.send(message.encode(), properties=properties or None,
                              partition_key=args.key)
                sent += 1
        producer.flush()
        print(f"{sent} messages successfully produced")
        return 0
    except pulsar.PulsarException as error:
        print(f"produce failed: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _cmd_consume(args: argparse.Namespace) -> int:
    _check_topic(args.topic)
    pulsar = _pulsar()
    client = _client(pulsar, args)
    if client is None:
        return 1
    try:
        consumer = client.subscribe(
            args.topic, args.subscription_name,
            consumer_type=getattr(pulsar.ConsumerType, args.subscription_type),
            initial_position=getattr(pulsar.InitialPosition, args.subscription_position))
        try:
            received, quiet = _receive(pulsar, consumer, args)
        finally:
            consumer.close()  # the client must not be torn down with a consumer open
    except pulsar.PulsarException as error:
        print(f"consume failed: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if quiet:
        print(f"no message within {args.timeout_s} s; {received} received", file=sys.stderr)
        return 0 if args.num_messages <= 0 else 1  # unlimited: the quiet end
    print(f"{received} messages successfully consumed")
    return 0


def _receive(pulsar: Any, consumer: Any, args: argparse.Namespace) -> tuple[int, bool]:
    """Print and acknowledge up to -n messages: (how many, whether it stopped on a
    timeout)."""
    received = 0
    while args.num_messages <= 0 or received < args.num_messages:
        message = _receive_one(pulsar, consumer, args.timeout_s)
        if message is None:
            return received, True
        _show(message)
        consumer.acknowledge(message)
        received += 1
    return received, False


def _receive_one(pulsar: Any, consumer: Any, timeout_s: float) -> Any | None:
    """The next message, or None after `timeout_s` without one. The wait is cut into
    slices of RECEIVE_SLICE_S: the client's receive does not return for Ctrl-C, and Python
    raises KeyboardInterrupt only between two calls."""
    deadline = time.monotonic() + timeout_s
    while True:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return None
        try:
            return consumer.receive(timeout_millis=max(1, int(min(left_s, RECEIVE_SLICE_S)
                                                              * 1000)))
        except pulsar.Timeout:
            continue


def _show(message: Any) -> None:
    data: bytes = message.data()
    try:
        body = data.decode()
    except UnicodeDecodeError:
        body = data.hex()
    print(f"----- message {message.message_id()} -----")
    print(f"key: {message.partition_key() or ''}  properties: {message.properties()}")
    print(body)


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL,
                        help=f"the broker's service URL (default {DEFAULT_URL})")
    parser.add_argument("--timeout-s", type=float, default=30.0,
                        help="give up connecting, sending or waiting for a message after "
                             "this many seconds (default 30)")
    _security_options(parser)


def _add_produce(sub: SubParsers) -> None:
    produce = sub.add_parser(
        "produce", help="send messages to a topic with the Pulsar client",
        description="Send messages to a topic through the broker's binary protocol, with "
        "the official Pulsar client (pulsar-client produce).")
    produce.add_argument("topic", help="the topic (my-topic, tenant/ns/my-topic or a full name)")
    produce.add_argument("-m", "--messages", action="append", default=[],
                         help="a message to send (repeatable)")
    produce.add_argument("-s", "--separator", default=None,
                         help="split each -m value on this separator")
    produce.add_argument("-n", "--num-produce", type=int, default=1,
                         help="send the messages this many times (default 1)")
    produce.add_argument("-k", "--key", default=None, help="the messages' partition key")
    produce.add_argument("-p", "--property", action="append", default=[],
                         help="a message property key=value (repeatable)")
    produce.add_argument("--no-batching", action="store_true", help="send unbatched")
    _client_options(produce)
    produce.set_defaults(handler=_cmd_produce)


def _add_consume(sub: SubParsers) -> None:
    consume = sub.add_parser(
        "consume", help="receive messages from a topic with the Pulsar client",
        description="Receive, print and acknowledge messages of a topic through the "
        "broker's binary protocol, with the official Pulsar client (pulsar-client "
        "consume). Exits 1 when fewer than -n messages arrive, none for --timeout-s; with "
        "-n 0 it consumes until the topic is quiet that long.")
    consume.add_argument("topic", help="the topic (my-topic, tenant/ns/my-topic or a full name)")
    consume.add_argument("-s", "--subscription-name", required=True, help="the subscription")
    consume.add_argument("-t", "--subscription-type", default="Exclusive",
                         choices=["Exclusive", "Shared", "Failover", "KeyShared"],
                         help="the subscription type (default Exclusive)")
    consume.add_argument("-p", "--subscription-position", default="Latest",
                         choices=["Latest", "Earliest"],
                         help="where a new subscription starts (default Latest)")
    consume.add_argument("-n", "--num-messages", type=int, default=1,
                         help="messages to receive, 0 for no limit (default 1)")
    _client_options(consume)
    consume.set_defaults(handler=_cmd_consume)


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


def _add_tenants(sub: SubParsers) -> None:
    commands = _group(sub, "tenants", "manage tenants through the admin API",
                      "Tenants (pulsar-admin tenants) through the admin HTTP API.")
    tenant = "/admin/v2/tenants/{}"
    _command(commands, "list", "list the tenants", _call("GET", lambda a: "/admin/v2/tenants"))
    get = _command(commands, "get", "show a tenant's configuration",
                   _call("GET", lambda a: tenant.format(_quote(a.tenant))))
    get.add_argument("tenant")
    create = _command(commands, "create", "create a tenant",
                      _call("PUT", lambda a: tenant.format(_quote(a.tenant)), _tenant_info))
    update = _command(commands, "update", "replace a tenant's admin roles and clusters",
                      _call("POST", lambda a: tenant.format(_quote(a.tenant)), _tenant_info))
    for parser in (create, update):
        parser.add_argument("tenant")
        parser.add_argument("-r", "--admin-roles", default="",
                            help="comma-separated admin roles")
        parser.add_argument("-c", "--allowed-clusters", default="",
                            help="comma-separated clusters (default: the broker's cluster)")
    delete = _command(commands, "delete", "delete a tenant without namespaces",
                      _call("DELETE", lambda a: tenant.format(_quote(a.tenant))))
    delete.add_argument("tenant")


def _add_clusters(sub: SubParsers) -> None:
    commands = _group(sub, "clusters", "show the broker's cluster through the admin API",
                      "The cluster (pulsar-admin clusters) through the admin HTTP API: "
                      "Magnetar serves one, named by the broker's cluster_name.")
    _command(commands, "list", "list the clusters", _call("GET", lambda a: "/admin/v2/clusters"))
    get = _command(commands, "get", "show a cluster's data (its service URLs)",
                   _call("GET", lambda a: f"/admin/v2/clusters/{_quote(a.cluster)}"))
    get.add_argument("cluster")


def _tenant_info(args: argparse.Namespace) -> dict[str, Any]:
    clusters = [c for c in args.allowed_clusters.split(",") if c]
    if not clusters:
        clusters = admin_request(args.admin_url, "GET", "/admin/v2/clusters",
                                 **_http_security(args))
    return {"adminRoles": [r for r in args.admin_roles.split(",") if r],
            "allowedClusters": clusters}


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


def _add_namespaces(sub: SubParsers) -> None:
    commands = _group(sub, "namespaces", "manage namespaces and their policies",
                      "Namespaces and their policies (pulsar-admin namespaces) through the "
                      "admin HTTP API.")
    list_ = _command(commands, "list", "list a tenant's namespaces",
                     _call("GET", lambda a: f"/admin/v2/namespaces/{_quote(a.tenant)}"))
    list_.add_argument("tenant")
    for name, method, text in (("create", "PUT", "create a namespace"),
                               ("delete", "DELETE", "delete an empty namespace"),
                               ("policies", "GET", "show a namespace's policies")):
        _command(commands, name, text,
                 _call(method, lambda a: _namespace_path(a.namespace))).add_argument("namespace")
    topics = _command(commands, "topics", "list a namespace's topics (every domain)",
                      _call("GET", lambda a: _namespace_path(a.namespace) + "/topics",
                            query=lambda a: {"mode": "ALL"}))
    topics.add_argument("namespace")

    retention = _policy_commands(commands, "retention", "retention", _retention_body)
    retention.add_argument("-t", "--time", type=parse_duration_s, required=True,
                           help="how long acknowledged messages are kept (e.g. 10m, 3h, 2d; "
                                "-1 forever, 0 none)")
    retention.add_argument("-s", "--size", type=parse_size_bytes, required=True,
                           help="how much acknowledged data is kept (e.g. 10M, 16G; -1 "
                                "unlimited, 0 none)")
    ttl = _policy_commands(commands, "message-ttl", "messageTTL",
                           lambda a: a.ttl)
    ttl.add_argument("-ttl", "--messageTTL", "--ttl", dest="ttl", type=parse_duration_s,
                     required=True, help="expire unacknowledged messages older than this "
                                         "(e.g. 3600, 1h; 0 never)")
    dedup = _policy_commands(commands, "deduplication", "deduplication", lambda a: a.enable)
    on_off = dedup.add_mutually_exclusive_group(required=True)
    on_off.add_argument("-e", "--enable", dest="enable", action="store_true")
    on_off.add_argument("-d", "--disable", dest="enable", action="store_false")
    _add_delayed(commands)
    for name, endpoint in (("max-unacked-messages-per-consumer",
                            "maxUnackedMessagesPerConsumer"),
                           ("max-unacked-messages-per-subscription",
                            "maxUnackedMessagesPerSubscription")):
        limit = _policy_commands(commands, name, endpoint, lambda a: a.max_num)
        limit.add_argument("-m", "--max-num", type=int, required=True,
                           help="the limit (0: no limit)")
    _add_backlog_quota(commands)
    from ._admin_cli_schemas import add_namespace_schema_commands  # it imports this module

    add_namespace_schema_commands(commands)


def _retention_body(args: argparse.Namespace) -> dict[str, int]:
    minutes = args.time if args.time < 0 else args.time // 60
    size_mb = args.size if args.size < 0 else args.size // MB
    return {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb}


def _add_delayed(commands: SubParsers) -> None:
    delayed = _policy_commands(commands, "delayed-delivery", "delayedDelivery",
                               lambda a: {"active": a.enable, "tickTime": a.time * 1000,
                                          "maxDeliveryDelayInMillis": a.max_delay * 1000})
    on_off = delayed.add_mutually_exclusive_group(required=True)
    on_off.add_argument("-e", "--enable", dest="enable", action="store_true")
    on_off.add_argument("-d", "--disable", dest="enable", action="store_false")
    delayed.add_argument("-t", "--time", type=parse_duration_s, default=1,
                         help="the tick time of the delayed-delivery tracker (default 1s)")
    delayed.add_argument("-md", "--maxDelay", dest="max_delay", type=parse_duration_s,
                         default=0, help="the longest delay allowed (default 0: no limit)")


def _add_backlog_quota(commands: SubParsers) -> None:
    def path(args: argparse.Namespace) -> str:
        return f"{_namespace_path(args.namespace)}/backlogQuota"

    _command(commands, "get-backlog-quotas", "show a namespace's backlog quotas",
             _call("GET", lambda a: _namespace_path(a.namespace) + "/backlogQuotaMap")
             ).add_argument("namespace")
    remove = _command(commands, "remove-backlog-quota", "remove a namespace's backlog quota",
                      _call("DELETE", path, query=lambda a: {"backlogQuotaType": a.type}))
    setter = _command(commands, "set-backlog-quota", "set a namespace's backlog quota",
                      _call("POST", path, lambda a: {"limitSize": a.limit,
                                                     "limitTime": a.limitTime,
                                                     "policy": a.policy},
                            lambda a: {"backlogQuotaType": a.type}))
    for parser in (remove, setter):
        parser.add_argument("namespace")
        parser.add_argument("-t", "--type", default="destination_storage",
                            choices=["destination_storage", "message_age"])
    setter.add_argument("-l", "--limit", type=parse_size_bytes, default=-1,
                        help="the backlog size limit (e.g. 10M; destination_storage)")
    setter.add_argument("-lt", "--limitTime", type=parse_duration_s, default=-1,
                        help="the age limit of the oldest unacknowledged message "
                             "(e.g. 1h; message_age)")
    setter.add_argument("-p", "--policy", required=True,
                        choices=["producer_request_hold", "producer_exception",
                                 "consumer_backlog_eviction"],
                        help="what happens when the quota is exceeded")


def _add_topics(sub: SubParsers) -> None:
    commands = _group(sub, "topics", "manage topics and subscriptions",
                      "Topics and subscriptions (pulsar-admin topics) through the admin HTTP "
                      "API. Topics are my-topic, tenant/ns/my-topic or full names.")
    for name, kind, text in (("list", "", "list a namespace's persistent topics"),
                             ("list-partitioned-topics", "/partitioned",
                              "list a namespace's partitioned topics")):
        _command(commands, name, text, _call("GET", _namespace_topics(kind))
                 ).add_argument("namespace")

    def topic(args: argparse.Namespace, suffix: str = "") -> str:
        return _topic_path(args.topic) + suffix

    def at(suffix: str) -> Callable[[argparse.Namespace], str]:
        return lambda args: topic(args, suffix)

    simple: list[tuple[str, str, str, str]] = [
        ("create", "PUT", "", "create a non-partitioned topic"),
        ("get-partitioned-topic-metadata", "GET", "/partitions",
         "show a topic's partition count"),
        ("stats", "GET", "/stats", "show a topic's (or partition's) stats"),
        ("stats-internal", "GET", "/internalStats",
         "show a topic's managed ledger and cursors"),
        ("subscriptions", "GET", "/subscriptions", "list a topic's subscriptions"),
        ("terminate", "POST", "/terminate",
         "terminate a topic (no more messages); prints its last message id"),
        ("partitioned-terminate", "POST", "/terminate/partitions",
         "terminate every partition of a partitioned topic"),
        ("unload", "PUT", "/unload", "unload a topic (its clients reconnect)"),
    ]
    for name, method, suffix, text in simple:
        _command(commands, name, text, _call(method, at(suffix))).add_argument("topic")
    for name, suffix, text in (("delete", "", "delete a topic"),
                               ("delete-partitioned-topic", "/partitions",
                                "delete a partitioned topic and its partitions")):
        parser = _command(commands, name, text,
                          _call("DELETE", at(suffix), query=_force))
        parser.add_argument("topic")
        parser.add_argument("-f", "--force", action="store_true",
                            help="even with producers or consumers connected")
    for name, method, text in (("create-partitioned-topic", "PUT",
                                "create a partitioned topic"),
                               ("update-partitioned-topic", "POST",
                                "add partitions to a partitioned topic")):
        parser = _command(commands, name, text, _call(method, lambda a: topic(a, "/partitions"),
                                                      lambda a: a.partitions))
        parser.add_argument("topic")
        parser.add_argument("-p", "--partitions", type=int, required=True,
                            help="the number of partitions")
    stats = _command(commands, "partitioned-stats", "show a partitioned topic's stats summed "
                     "over its partitions", _call("GET", lambda a: topic(a, "/partitioned-stats"),
                                                  query=lambda a: {"perPartition": str(
                                                      a.per_partition).lower()}))
    stats.add_argument("topic")
    stats.add_argument("--per-partition", action="store_true",
                       help="also show each partition's stats")
    _add_subscription_commands(commands, topic)


def _namespace_topics(suffix: str) -> Callable[[argparse.Namespace], str]:
    def path(args: argparse.Namespace) -> str:
        from .._names import NamespaceName

        return f"/admin/v2/persistent/{NamespaceName.parse(args.namespace)}{suffix}"

    return path


def _add_subscription_commands(commands: SubParsers,
                               topic: Callable[[argparse.Namespace, str], str]) -> None:
    def sub(args: argparse.Namespace, suffix: str = "") -> str:
        return topic(args, f"/subscription/{_quote(args.subscription)}{suffix}")

    create = _command(commands, "create-subscription", "create a subscription",
                      _call("PUT", sub, lambda a: _message_id(a.messageId)))
    create.add_argument("-m", "--messageId", default="latest",
                        help="where it starts: latest (default), earliest or ledger:entry")
    unsubscribe = _command(commands, "unsubscribe", "delete a subscription",
                           _call("DELETE", sub, query=_force))
    unsubscribe.add_argument("-f", "--force", action="store_true",
                             help="even with consumers connected (they are disconnected)")
    skip = _command(commands, "skip", "skip entries of a subscription's backlog",
                    _call("POST", lambda a: sub(a, f"/skip/{a.count}")))
    skip.add_argument("-n", "--count", type=_count, required=True, help="entries to skip")
    clear = _command(commands, "clear-backlog", "skip a subscription's whole backlog",
                     _call("POST", lambda a: sub(a, "/skip_all")))
    expire = _command(commands, "expire-messages", "expire a subscription's messages older "
                      "than a time", _call("POST", lambda a: sub(a, f"/expireMessages/{a.time}")))
    expire.add_argument("-t", "--expireTime", dest="time", type=_age_s,
                        required=True, help="expire messages older than this (e.g. 10m)")
    reset = _command(commands, "reset-cursor", "move a subscription to a time or a message",
                     _reset_cursor)
    reset_to = reset.add_mutually_exclusive_group(required=True)
    reset_to.add_argument("-t", "--time", type=parse_duration_s,
                          help="restart at messages published this long ago (e.g. 10m)")
    reset_to.add_argument("--timestamp", type=int,
                          help="restart at messages published at or after this time (ms)")
    reset_to.add_argument("-m", "--messageId", help="restart at this message (ledger:entry)")
    for parser in (create, unsubscribe, skip, clear, expire, reset):
        parser.add_argument("topic")
        parser.add_argument("-s", "--subscription", required=True, help="the subscription")
    expire_all = _command(commands, "expire-messages-all-subscriptions",
                          "expire every subscription's messages older than a time",
                          _call("POST", lambda a: topic(a, f"/all_subscription/expireMessages/"
                                                           f"{a.time}")))
    expire_all.add_argument("topic")
    expire_all.add_argument("-t", "--expireTime", dest="time", type=_age_s,
                            required=True, help="expire messages older than this (e.g. 10m)")


def _reset_cursor(args: argparse.Namespace) -> int:
    base = f"{_topic_path(args.topic)}/subscription/{_quote(args.subscription)}/resetcursor"
    if args.messageId is not None:
        return _call("POST", lambda a: base, lambda a: _message_id(a.messageId))(args)
    stamp = args.timestamp
    if stamp is None:
        stamp = int(time.time() * 1000) - args.time * 1000
    return _call("POST", lambda a: f"{base}/{max(0, stamp)}")(args)


def add_commands(sub: SubParsers) -> None:
    """Register produce, consume, topics, namespaces, tenants, clusters and schemas on
    `magnetar`'s parser.

    Args:
        sub: the top-level subparsers of `magnetar`.
    """
    _add_produce(sub)
    _add_consume(sub)
    _add_topics(sub)
    _add_namespaces(sub)
    _add_tenants(sub)
    _add_clusters(sub)
    from ._admin_cli_schemas import add_schema_commands  # it imports this module

    add_schema_commands(sub)
