"""What the data source asks the broker: endpoints, topic-partitions, last ids, ledgers.

Everything here works over the Pulsar binary protocol with any broker, except `ledgers` and
`enable_deduplication`, which need the admin REST API (`Endpoints.admin_url`); without it they
answer None / False and the callers fall back (one range per topic-partition; at-least-once).
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from ._host import Endpoints, HostAddress, ask_host
from ._options import EARLIEST, MagnetarSparkError, Options, Position

if TYPE_CHECKING:
    import magnetar

__all__ = ["connect", "enable_deduplication", "last_position", "ledgers", "partition_index",
           "resolve", "topic_partitions"]

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 30.0
_PARTITION = re.compile(r"-partition-(\d+)$")


def resolve(options: Options, host: HostAddress | None) -> Endpoints:
    """The endpoints for the `service` option: URLs as given; a data directory through the
    driver's broker host (see `_host.py`).

    Raises:
        MagnetarSparkError: a data directory without `magnetar.spark.register`, or a driver
            that cannot serve it.
    """
    from urllib.parse import unquote, urlsplit

    service = options.service
    scheme = urlsplit(service).scheme
    if scheme in ("pulsar", "pulsar+ssl"):
        return Endpoints(service, options.admin_url)
    if scheme in ("http", "https"):
        return Endpoints(service, options.admin_url or service)
    if "://" in service and scheme != "file":
        raise MagnetarSparkError(f"option service: unsupported URL {service!r}; use a data "
                                 f"directory, file:///dir, pulsar://host:port or http://host:port")
    path = unquote(urlsplit(service).path) if scheme == "file" else service
    if host is None:
        raise MagnetarSparkError(
            f"option service: the data directory {path!r} needs magnetar.spark.register(spark) "
            f"in the driver (it serves the directory to the workers); or give a pulsar:// URL")
    try:
        return ask_host(host, path)
    except ConnectionError as exc:
        raise MagnetarSparkError(f"option service: {exc}") from None


def connect(endpoints: Endpoints) -> magnetar.Client:
    import magnetar

    return magnetar.Client(endpoints.service_url, operation_timeout_seconds=60)


def partition_index(topic_partition: str) -> int:
    match = _PARTITION.search(topic_partition)
    return int(match.group(1)) if match else -1


def _namespace_topics(client: magnetar.Client, namespace: str) -> list[str]:
    return list(client._run(client._core.transport.topics_of_namespace(namespace,
                                                                       "PERSISTENT")))


def topic_partitions(client: magnetar.Client, topics: tuple[str, ...],
                     pattern: str | None) -> list[str]:
    """The topic-partitions to read, sorted: each topic's partitions (or itself), or every
    persistent topic of the pattern's namespace that matches it.

    Raises:
        MagnetarSparkError: a named topic does not exist (option topic/topics), or the pattern
            matches nothing (option topicsPattern).
    """
    found: set[str] = set()
    if pattern is not None:
        namespace = "/".join(pattern.split("://", 1)[1].split("/")[:2])
        regex = re.compile(pattern)
        found = {t for t in _namespace_topics(client, namespace) if regex.fullmatch(t)
                 or regex.fullmatch(_PARTITION.sub("", t))}
        if not found:
            raise MagnetarSparkError(f"option topicsPattern: no topic matches {pattern!r}")
        return sorted(found)
    for topic in topics:
        parts = client.get_topic_partitions(topic)
        if parts == [topic]:
            namespace = "/".join(topic.split("://", 1)[1].split("/")[:2])
            if topic not in _namespace_topics(client, namespace):
                raise MagnetarSparkError(f"option topic(s): topic {topic!r} does not exist")
        found.update(parts)
    return sorted(found)


def last_position(client: magnetar.Client, topic_partition: str) -> Position:
    """The id of the last message stored on one topic-partition (EARLIEST when empty)."""
    import magnetar

    reader = client.create_reader(topic_partition, magnetar.MessageId.latest,
                                  receiver_queue_size=1)
    try:
        child = reader._group.only_child("last message id")
        last = client._run(child.transport.last_message_id(child.consumer_id))[0]
    finally:
        reader.close()
    if last.ledger_id < 0 or last.entry_id < 0:
        return EARLIEST
    return Position(last.ledger_id, last.entry_id, last.batch_index)


def _admin(endpoints: Endpoints, method: str, path: str, body: Any = None) -> Any:
    assert endpoints.admin_url is not None
    url = endpoints.admin_url.rstrip("/") + path
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=ADMIN_TIMEOUT_S) as response:
        text = response.read()
    return json.loads(text) if text.strip() else None


def _topic_path(topic: str) -> str:
    from urllib.parse import quote

    domain, rest = topic.split("://", 1)
    return f"/admin/v2/{domain}/" + "/".join(quote(p, safe="") for p in rest.split("/"))


def ledgers(endpoints: Endpoints, topic_partition: str) -> list[tuple[int, int]] | None:
    """`(ledger id, entries)` of each ledger of a topic-partition, oldest first; None when
    the admin API is unknown or does not answer (not our broker)."""
    if endpoints.admin_url is None:
        return None
    try:
        stats = _admin(endpoints, "GET", _topic_path(topic_partition) + "/internalStats")
        return [(int(info["ledgerId"]), int(info["entries"])) for info in stats["ledgers"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.info("no ledger listing for %s (%s): one range per topic-partition",
                 topic_partition, exc)
        return None


def enable_deduplication(endpoints: Endpoints, topic: str) -> bool:
    """Turn deduplication on for `topic` (a topic or partitioned topic) through the admin API;
    False (with a warning) when that is not possible: writes are then at-least-once."""
    if endpoints.admin_url is None:
        log.warning("no admin URL for %s (option adminUrl): deduplication not enabled; a "
                    "retried task may publish twice", endpoints.service_url)
        return False
    path = _topic_path(topic)
    try:
        try:
            _admin(endpoints, "POST", path + "/deduplicationEnabled", True)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            _admin(endpoints, "PUT", path)  # create it (non-partitioned), then the policy
            _admin(endpoints, "POST", path + "/deduplicationEnabled", True)
        return True
    except (OSError, ValueError) as exc:
        log.warning("enabling deduplication on %s failed: %s; a retried task may publish "
                    "twice", topic, exc)
        return False
