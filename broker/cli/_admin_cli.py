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

Layout: this module holds the pulsar-admin groups; `_client_cli` produce and consume,
`_admin_cli_schemas` the schema commands, and `_admin_http` what they share (the request,
the security options, values with units, the group and command builders).

Nothing here imports the pulsar client or opens a connection until a subcommand runs,
so `magnetar --help` stays fast.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._admin_cli_schemas import add_namespace_schema_commands, add_schema_commands
from ._admin_http import (
    MB,
    AdminHttpError,
    _age_s,
    _call,
    _command,
    _count,
    _force,
    _group,
    _http_security,
    _message_id,
    _namespace_path,
    _policy_commands,
    _quote,
    _topic_path,
    admin_request,
    parse_duration_s,
    parse_size_bytes,
)
from ._client_cli import add_client_commands
from ._compaction_cli import add_compaction_commands
from ._topics_cli import add_topic_policy_commands

# AdminHttpError and the parsers are `_admin_http`'s, listed here too: the commands' module.
__all__ = ["AdminHttpError", "add_commands", "admin_request", "parse_duration_s",
           "parse_size_bytes"]

if TYPE_CHECKING:
    from ._admin_http import SubParsers


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
    add_topic_policy_commands(commands)
    add_compaction_commands(commands)


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
    add_client_commands(sub)
    _add_topics(sub)
    _add_namespaces(sub)
    _add_tenants(sub)
    _add_clusters(sub)
    add_schema_commands(sub)
