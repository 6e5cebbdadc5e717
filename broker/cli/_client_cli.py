"""`magnetar produce` and `magnetar consume`: `pulsar-client`'s commands, driving the official
`pulsar` client against `--url` (the broker's binary protocol). The client is imported only
when one of them runs. See `_admin_cli` for the theory of operation.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import TYPE_CHECKING, Any

from ._admin_http import _auth_token, _security_options

__all__ = ["add_client_commands"]

DEFAULT_URL = "pulsar://127.0.0.1:6650"
RECEIVE_SLICE_S = 0.2  # consume notices Ctrl-C within this long

if TYPE_CHECKING:
    from ._admin_http import SubParsers


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


def add_client_commands(sub: SubParsers) -> None:
    """Register produce and consume on `magnetar`'s parser."""
    _add_produce(sub)
    _add_consume(sub)
