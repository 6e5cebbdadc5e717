"""`magnetar topics` commands for topic-level policies and message inspection, with
`pulsar-admin topics`' names: `set-|get-|remove-` `retention`, `message-ttl`,
`deduplication`, `max-producers`, `max-consumers`, `delayed-delivery`,
`compaction-threshold`, `set-|remove-backlog-quota` and `get-backlog-quotas` (a getter's
`--applied` shows the value in force: the topic's, else the namespace's, else the broker's);
and `peek-messages`, `examine-message`, `get-message-by-id`, `last-message-id`.

The policy commands are single admin API calls, as `_admin_cli`'s are. The inspection
commands fetch entries as the admin API answers them (payload body, metadata in `X-Pulsar-*`
headers) and print each message as `pulsar-admin` does: a batch entry is split into its
messages (`Batch Message ID: ledger:entry:index`), then the message's times, key and
properties and a hex dump of its body. `peek-messages -n N` walks the subscription's
positions 1, 2, ... until it has N messages or the backlog ends.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from email.message import Message
from typing import TYPE_CHECKING, Any

from ._admin_http import (
    AdminHttpError,
    _call,
    _command,
    _http_security,
    _quote,
    _topic_path,
    admin_request,
    admin_request_raw,
    parse_duration_s,
    parse_size_bytes,
)

if TYPE_CHECKING:
    from ._admin_http import SubParsers

__all__ = ["add_topic_policy_commands"]

HEX_BYTES_PER_LINE = 16
PEEK_COUNT_MAX = 10_000  # peek-messages -n: at most this many messages (an HTTP call each)


def _getter(endpoint: str) -> Callable[[argparse.Namespace], int]:
    """Print a topic's policy (`null` when unset, as pulsar-admin prints it)."""

    def handle(args: argparse.Namespace) -> int:
        query = {"applied": "true"} if args.applied else None
        answer = admin_request(args.admin_url, "GET", f"{_topic_path(args.topic)}/{endpoint}",
                               query=query, **_http_security(args))
        print(json.dumps(answer, indent=2, sort_keys=True) if isinstance(answer, dict)
              else json.dumps(answer))
        return 0

    return handle


def _policy(commands: SubParsers, name: str, endpoint: str,
            body: Callable[[argparse.Namespace], Any] | None = None,
            query: Callable[[argparse.Namespace], dict[str, str]] | None = None,
            ) -> argparse.ArgumentParser:
    """get-/remove-/set-<name> for one topic policy endpoint; returns set's parser."""

    def path(args: argparse.Namespace) -> str:
        return f"{_topic_path(args.topic)}/{endpoint}"

    words = name.replace("-", " ")
    getter = _command(commands, f"get-{name}", f"show a topic's {words}", _getter(endpoint))
    getter.add_argument("topic")
    getter.add_argument("-ap", "--applied", action="store_true",
                        help="the value in force (the topic's, else the namespace's, else "
                             "the broker's)")
    _command(commands, f"remove-{name}", f"remove a topic's {words} (the namespace's "
             "applies)", _call("DELETE", path)).add_argument("topic")
    setter = _command(commands, f"set-{name}", f"set a topic's {words}",
                      _call("POST", path, body, query))
    setter.add_argument("topic")
    return setter


def _on_off(parser: argparse.ArgumentParser) -> None:
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("-e", "--enable", dest="enable", action="store_true")
    choice.add_argument("-d", "--disable", dest="enable", action="store_false")


def _add_policies(commands: SubParsers) -> None:
    retention = _policy(commands, "retention", "retention", lambda a: {
        "retentionTimeInMinutes": a.time if a.time < 0 else a.time // 60,
        "retentionSizeInMB": a.size if a.size < 0 else a.size // (1 << 20)})
    retention.add_argument("-t", "--time", type=parse_duration_s, required=True,
                           help="how long acknowledged messages are kept (e.g. 10m, 3h; "
                                "-1 forever, 0 none)")
    retention.add_argument("-s", "--size", type=parse_size_bytes, required=True,
                           help="how much acknowledged data is kept (e.g. 10M; -1 "
                                "unlimited, 0 none)")
    ttl = _policy(commands, "message-ttl", "messageTTL",
                  query=lambda a: {"messageTTL": str(a.ttl)})
    ttl.add_argument("-t", "--ttl", type=parse_duration_s, required=True,
                     help="expire unacknowledged messages older than this (e.g. 1h; 0 never)")
    _on_off(_policy(commands, "deduplication", "deduplicationEnabled", lambda a: a.enable))
    for name, endpoint, flag in (("max-producers", "maxProducers", "--max-producers"),
                                 ("max-consumers", "maxConsumers", "--max-consumers")):
        limit = _policy(commands, name, endpoint, lambda a: a.max)
        limit.add_argument("-m", flag, dest="max", type=int, required=True,
                           help="the limit (0: no limit)")
    delayed = _policy(commands, "delayed-delivery", "delayedDelivery", lambda a: {
        "active": a.enable, "tickTime": a.time * 1000,
        "maxDeliveryDelayInMillis": a.max_delay * 1000})
    _on_off(delayed)
    delayed.add_argument("-t", "--time", type=parse_duration_s, default=1,
                         help="the tick time of the delayed-delivery tracker (default 1s)")
    delayed.add_argument("-md", "--maxDelay", dest="max_delay", type=parse_duration_s,
                         default=0, help="the longest delay allowed (default 0: no limit)")
    threshold = _policy(commands, "compaction-threshold", "compactionThreshold",
                        lambda a: a.threshold)
    threshold.add_argument("-t", "--threshold", type=parse_size_bytes, required=True,
                           help="compact when the backlog exceeds this (e.g. 100M; 0 never)")
    _add_backlog_quota(commands)


def _add_backlog_quota(commands: SubParsers) -> None:
    def path(args: argparse.Namespace) -> str:
        return f"{_topic_path(args.topic)}/backlogQuota"

    getter = _command(commands, "get-backlog-quotas", "show a topic's backlog quotas",
                      _getter("backlogQuotaMap"))
    getter.add_argument("topic")
    getter.add_argument("-ap", "--applied", action="store_true",
                        help="the quotas in force (the topic's, else the namespace's, else "
                             "the broker's)")
    remove = _command(commands, "remove-backlog-quota", "remove a topic's backlog quota",
                      _call("DELETE", path, query=lambda a: {"backlogQuotaType": a.type}))
    setter = _command(commands, "set-backlog-quota", "set a topic's backlog quota",
                      _call("POST", path, lambda a: {"limitSize": a.limit,
                                                     "limitTime": a.limitTime,
                                                     "policy": a.policy},
                            lambda a: {"backlogQuotaType": a.type}))
    for parser in (remove, setter):
        parser.add_argument("topic")
        parser.add_argument("-t", "--type", default="destination_storage",
                            choices=["destination_storage", "message_age"])
    setter.add_argument("-l", "--limit", type=parse_size_bytes, default=-1,
                        help="the backlog size limit (e.g. 10M; destination_storage)")
    setter.add_argument("-lt", "--limitTime", type=parse_duration_s, default=-1,
                        help="the age limit of the oldest unacknowledged message (e.g. 1h)")
    setter.add_argument("-p", "--policy", required=True,
                        choices=["producer_request_hold", "producer_exception",
                                 "consumer_backlog_eviction"],
                        help="what happens when the quota is exceeded")


# -- message inspection ---------------------------------------------------------------------


def _hex_dump(data: bytes) -> list[str]:
    lines = []
    for offset in range(0, len(data), HEX_BYTES_PER_LINE):
        chunk = data[offset:offset + HEX_BYTES_PER_LINE]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<{HEX_BYTES_PER_LINE * 3 - 1}}  |{text}|")
    return lines


def messages_of(headers: Message, body: bytes) -> list[list[str]]:
    """The lines to print for each message of one entry as the admin API answered it."""
    message_id = headers.get("X-Pulsar-Message-ID", "?")
    common = [f"{label}: {headers[name]}" for label, name in (
        ("Publish time", "X-Pulsar-publish-time"), ("Producer", "X-Pulsar-producer-name"))
        if name in headers]
    batch = headers.get("X-Pulsar-num-batch-message")
    if batch is None:
        props = {k.removeprefix("X-Pulsar-PROPERTY-"): v for k, v in headers.items()
                 if k.startswith("X-Pulsar-PROPERTY-")}
        key = headers.get("X-Pulsar-partition-key")
        return [_message_lines(f"Message ID: {message_id}", common,
                               headers.get("X-Pulsar-event-time"), key, props, body)]
    from magnetar.codec import RemoteProtocolError, decode_batch_payload  # only when used

    try:
        messages = decode_batch_payload(body, int(batch))
    except (RemoteProtocolError, ValueError) as error:
        raise AdminHttpError(0, f"the batch at {message_id} cannot be split: {error}") from None
    return [_message_lines(f"Batch Message ID: {message_id}:{m.batch_index}", common,
                           str(m.event_time) if m.event_time else None, m.partition_key,
                           dict(m.properties), m.payload or b"") for m in messages]


def _message_lines(title: str, common: list[str], event_time: str | None, key: str | None,
                   properties: dict[str, str], body: bytes) -> list[str]:
    lines = [title, *common]
    if event_time:
        lines.append(f"Event time: {event_time}")
    if key is not None:
        lines.append(f"Key: {key}")
    if properties:
        lines.append("Properties:")
        lines += [f"  {k}: {v}" for k, v in sorted(properties.items())]
    lines.append(f"Payload ({len(body)} bytes):")
    return lines + _hex_dump(body)


def _print_messages(messages: list[list[str]]) -> None:
    for index, lines in enumerate(messages):
        if index:
            print("-" * 60)
        print("\n".join(lines))


def _fetch(args: argparse.Namespace, path: str, query: dict[str, str] | None = None,
           ) -> list[list[str]]:
    headers, body = admin_request_raw(args.admin_url, "GET", path, query=query,
                                      **_http_security(args))
    return messages_of(headers, body)


def _peek(args: argparse.Namespace) -> int:
    base = f"{_topic_path(args.topic)}/subscription/{_quote(args.subscription)}/position"
    found: list[list[str]] = []
    position = 1
    while len(found) < args.count:
        try:
            found += _fetch(args, f"{base}/{position}")
        except AdminHttpError as error:
            if error.status != 404 or not found:
                raise
            break  # the backlog ends
        position += 1
    _print_messages(found[:args.count])
    return 0


def _examine(args: argparse.Namespace) -> int:
    _print_messages(_fetch(args, f"{_topic_path(args.topic)}/examinemessage",
                           {"initialPosition": args.initialPosition,
                            "messagePosition": str(args.messagePosition)}))
    return 0


def _by_id(args: argparse.Namespace) -> int:
    if args.ledger < 0 or args.entry < 0:
        raise AdminHttpError(0, "invalid message id: ledger and entry ids are 0 or more")
    _print_messages(_fetch(args, f"{_topic_path(args.topic)}/ledger/{args.ledger}/entry/"
                                 f"{args.entry}"))
    return 0


def _count(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= PEEK_COUNT_MAX:
        raise argparse.ArgumentTypeError(f"invalid count '{text}': use 1 to {PEEK_COUNT_MAX}")
    return value


def _add_inspection(commands: SubParsers) -> None:
    peek = _command(commands, "peek-messages", "show a subscription's next messages without "
                    "consuming them", _peek)
    peek.add_argument("-s", "--subscription", required=True, help="the subscription")
    peek.add_argument("-n", "--count", type=_count, default=1,
                      help="how many messages (default 1)")
    examine = _command(commands, "examine-message", "show the n-th message from the earliest "
                       "or the latest", _examine)
    examine.add_argument("-i", "--initialPosition", choices=["earliest", "latest"],
                         default="latest", help="count from here (default latest)")
    examine.add_argument("-m", "--messagePosition", type=_count, default=1,
                         help="the position, from 1 (default 1)")
    by_id = _command(commands, "get-message-by-id", "show the message(s) of one entry",
                     _by_id)
    by_id.add_argument("-l", "--ledger", type=int, required=True, help="the ledger id")
    by_id.add_argument("-e", "--entry", type=int, required=True, help="the entry id")
    last = _command(commands, "last-message-id", "show a topic's last message id",
                    _call("GET", lambda a: f"{_topic_path(a.topic)}/lastMessageId"))
    for parser in (peek, examine, by_id, last):
        parser.add_argument("topic")


def add_topic_policy_commands(commands: SubParsers) -> None:
    """Add the topic-level policy and message inspection commands to `magnetar topics`."""
    _add_policies(commands)
    _add_inspection(commands)
