"""The admin REST API's message inspection (Pulsar's v2 paths): peek the n-th unacknowledged
entry of a subscription (`…/subscription/{sub}/position/{n}`), examine the n-th entry from
the earliest or latest (`…/examinemessage?initialPosition=earliest|latest&messagePosition=n`),
fetch an entry by id (`…/ledger/{ledgerId}/entry/{entryId}`) and the last message id
(`…/lastMessageId`).

An entry answers as upstream's: 200 with the entry's payload as the body (decompressed unless
encrypted; a batch's payload whole, which the admin client splits into its messages) and its
metadata in `X-Pulsar-*` headers — `X-Pulsar-Message-ID` (`ledger:entry`), one
`X-Pulsar-PROPERTY-<key>` per property, times as ISO-8601, `X-Pulsar-num-batch-message` and
`X-Pulsar-batch-size` for a batch, and the other metadata fields (`HEADERS`). The last
message id is a MessageIdImpl JSON, with `batchIndex` (the batch's last index) when the
last entry is a batch.

Errors as upstream's: 405 for a partitioned topic's base name or a non-persistent topic, 404
for a missing topic, subscription or message. Stored entries are read off the event loop
(`read_stored_entry`, the one place that reads them).
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from magnetar.codec import RemoteProtocolError, decompress, parse_entry, pb
from magnetar.storage import StorageError

from .._names import TopicName
from ..dispatch._subscription import Subscription
from ..ledger._cursor import ManagedCursor
from ..ledger._position import Position
from ..topics._topic import PersistentTopic
from ._rest import (
    SUBSCRIPTION_PATH,
    TOPIC_PATH,
    RestError,
    _int_path,
    _partitions,
    _persistent,
    _service,
    _sub_not_found,
    _topic_name,
)

__all__ = ["add_message_routes", "read_stored_entry"]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # what a header name may hold


async def read_stored_entry(topic: PersistentTopic, position: Position) -> bytes:
    """The stored bytes of one entry of `topic`, read in a worker thread (a read may touch
    the disk).

    Raises:
        RestError: 404 when `position` is not an entry of the topic (any more).
    """
    ml = topic.managed_ledger
    if not ml.is_valid_position(position):
        raise _message_not_found()
    try:
        return await asyncio.to_thread(ml.storage.read_entry, position.ledger_id,
                                       position.entry_id)
    except StorageError as error:  # trimmed or deleted meanwhile
        raise RestError(404, f"Message not found: {error}") from error


def _message_not_found() -> RestError:
    return RestError(404, "Message not found")


# -- the answer -----------------------------------------------------------------------------


def _time(ms: int) -> str:
    """Upstream's DateFormatter: ISO-8601 with milliseconds (UTC here)."""
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _bool(value: bool) -> str:
    return "true" if value else "false"


# (MessageMetadata field, header, how its value is written), in upstream's order; a field
# is written when set.
HEADERS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("publish_time", "X-Pulsar-publish-time", _time),
    ("event_time", "X-Pulsar-event-time", _time),
    ("deliver_at_time", "X-Pulsar-deliver-at-time", _time),
    ("null_value", "X-Pulsar-null-value", _bool),
    ("producer_name", "X-Pulsar-producer-name", str),
    ("sequence_id", "X-Pulsar-sequence-id", str),
    ("replicated_from", "X-Pulsar-replicated-from", str),
    ("partition_key", "X-Pulsar-partition-key", str),
    ("compression", "X-Pulsar-compression", pb.CompressionType.Name),
    ("uncompressed_size", "X-Pulsar-uncompressed-size", str),
    ("encryption_algo", "X-Pulsar-encryption-algo", str),
    ("encryption_param", "X-Pulsar-Base64-encryption-param", _b64),
    ("schema_version", "X-Pulsar-Base64-schema-version", _b64),
    ("partition_key_b64_encoded", "X-Pulsar-partition-key-b64-encoded", _bool),
    ("ordering_key", "X-Pulsar-Base64-ordering-key", _b64),
    ("marker_type", "X-Pulsar-marker-type", str),
    ("txnid_least_bits", "X-Pulsar-txnid-least-bits", str),
    ("txnid_most_bits", "X-Pulsar-txnid-most-bits", str),
    ("highest_sequence_id", "X-Pulsar-highest-sequence-id", str),
    ("uuid", "X-Pulsar-uuid", str),
    ("num_chunks_from_msg", "X-Pulsar-num-chunks-from-msg", str),
    ("total_chunk_msg_size", "X-Pulsar-total-chunk-msg-size", str),
    ("chunk_id", "X-Pulsar-chunk-id", str),
    ("null_partition_key", "X-Pulsar-null-partition-key", _bool),
]


def _value(text: str) -> str:
    """A header value: line breaks would end the header, so they become spaces."""
    return text.replace("\r", " ").replace("\n", " ")


def entry_response(position: Position, stored: bytes) -> web.Response:
    """Upstream's answer for one stored entry: its payload and its metadata as headers.

    Raises:
        RestError: 500 when the stored entry does not parse or decompress (corrupt).
    """
    try:
        entry = parse_entry(stored, verify_checksum=False)
    except RemoteProtocolError as error:
        raise RestError(500, f"The entry at {position} cannot be read: {error}") from error
    metadata = entry.metadata
    headers: list[tuple[str, str]] = [
        ("X-Pulsar-Message-ID", f"{position.ledger_id}:{position.entry_id}")]
    headers += [(f"X-Pulsar-PROPERTY-{p.key}", _value(p.value)) for p in metadata.properties
                if _TOKEN.fullmatch(p.key)]
    broker = entry.broker_entry_metadata
    if broker is not None and broker.HasField("broker_timestamp"):
        headers.append(("X-Pulsar-Broker-Entry-METADATA-timestamp",
                        _time(broker.broker_timestamp)))
    if broker is not None and broker.HasField("index"):
        headers.append(("X-Pulsar-Broker-Entry-METADATA-index", str(broker.index)))
    if metadata.HasField("num_messages_in_batch"):
        headers.append(("X-Pulsar-num-batch-message", str(metadata.num_messages_in_batch)))
        headers.append(("X-Pulsar-batch-size", str(len(stored) - metadata.ByteSize())))
    if metadata.HasField("num_chunks_from_msg"):
        headers.append(("X-Pulsar-PROPERTY-TOTAL-CHUNKS", str(metadata.num_chunks_from_msg)))
        headers.append(("X-Pulsar-PROPERTY-CHUNK-ID", str(metadata.chunk_id)))
    encrypted = len(metadata.encryption_keys) > 0
    headers.append(("X-Pulsar-Is-Encrypted", _bool(encrypted)))
    for field, header, write in HEADERS:
        if metadata.HasField(field):
            headers.append((header, _value(write(getattr(metadata, field)))))
    headers += [("X-Pulsar-replicated-to", _value(c)) for c in metadata.replicate_to]
    headers += [("X-Pulsar-Base64-encryption-keys", _b64(k.SerializeToString()))
                for k in metadata.encryption_keys]
    body = bytes(entry.payload)
    if metadata.compression != pb.NONE and not encrypted:
        try:
            body = decompress(metadata.compression, body, metadata.uncompressed_size)
        except RemoteProtocolError as error:
            raise RestError(500, f"The entry at {position} does not decompress: {error}",
                            ) from error
    response = web.Response(body=body, content_type="application/octet-stream")
    for name, value in headers:
        response.headers.add(name, value)
    return response


# -- the endpoints --------------------------------------------------------------------------


async def _inspected(request: web.Request, what: str) -> tuple[TopicName, PersistentTopic]:
    """The path's topic, which must be one persistent, non-partitioned topic or partition
    (405 otherwise, with upstream's reason naming `what`)."""
    service = _service(request)
    name = _topic_name(request)
    if _partitions(service, name) > 0:
        raise RestError(405, f"{what} on a partitioned topic is not allowed")
    if not name.is_persistent:
        raise RestError(405, f"{what} on a non-persistent topic is not allowed")
    return name, await _persistent(service, name)


def nth_unacked(cursor: ManagedCursor, n: int) -> Position | None:
    """The n-th (from 1) entry after the cursor's mark-delete position that is not
    individually acknowledged, or None when the backlog is shorter."""
    if n < 1 or n > cursor.backlog():
        return None
    ml = cursor.ml
    deleted = cursor.individually_deleted
    at = ml.next_position(cursor.mark_delete_position)
    remaining = n
    while True:
        covering = deleted.range_containing(at)
        if covering is not None:
            at = ml.next_position(covering[1])
            continue
        hole = deleted.next_range_from(at)
        run = remaining if hole is None else ml.entries_between(
            at, ml.previous_position(hole[0]))
        if remaining <= run:
            return at if remaining == 1 else ml.position_after_n(at, remaining - 1)
        remaining -= run
        assert hole is not None
        at = ml.next_position(hole[1])


async def peek_nth(request: web.Request) -> web.Response:
    name, topic = await _inspected(request, "Peek messages")
    subscription_name = request.match_info["subscription"]
    subscription: Subscription | None = topic.subscriptions.get(subscription_name)
    if subscription is None:
        raise _sub_not_found(name, subscription_name)
    position = nth_unacked(subscription.cursor, _int_path(request, "position"))
    if position is None:
        raise _message_not_found()
    return entry_response(position, await read_stored_entry(topic, position))


async def examine_message(request: web.Request) -> web.Response:
    _, topic = await _inspected(request, "Examine messages")
    initial = request.query.get("initialPosition", "latest")
    if initial not in ("earliest", "latest"):
        raise RestError(400, "initialPosition must be earliest or latest")
    try:
        n = max(1, int(request.query.get("messagePosition", "1")))
    except ValueError as error:
        raise RestError(400, "messagePosition must be an integer") from error
    ml = topic.managed_ledger
    total = ml.number_of_entries
    if total == 0:
        raise RestError(404, "Could not examine messages: the topic has no messages")
    skip = n if initial == "earliest" else total - n + 1
    position = ml.position_after_n(ml.first_position(), max(1, skip))
    return entry_response(position, await read_stored_entry(topic, position))


async def get_message_by_id(request: web.Request) -> web.Response:
    _, topic = await _inspected(request, "Get message by ID")
    position = Position(_int_path(request, "ledger"), _int_path(request, "entry"))
    return entry_response(position, await read_stored_entry(topic, position))


async def last_message_id(request: web.Request) -> web.Response:
    name, topic = await _inspected(request, "GetLastMessageId")
    last = topic.managed_ledger.last_confirmed_position
    answer: dict[str, int] = {"ledgerId": last.ledger_id, "entryId": last.entry_id,
                              "partitionIndex": name.partition_index}
    if last.entry_id >= 0:
        try:
            entry = parse_entry(await read_stored_entry(topic, last), verify_checksum=False)
        except RemoteProtocolError as error:
            raise RestError(500, f"The entry at {last} cannot be read: {error}") from error
        if entry.metadata.HasField("num_messages_in_batch"):
            answer["batchIndex"] = entry.metadata.num_messages_in_batch - 1
    return web.json_response(answer)


def add_message_routes(router: web.UrlDispatcher) -> None:
    """Register the message inspection endpoints."""
    r = router
    r.add_get(SUBSCRIPTION_PATH + "/position/{position:[0-9]+}", peek_nth)
    r.add_get(TOPIC_PATH + "/examinemessage", examine_message)
    r.add_get(TOPIC_PATH + "/ledger/{ledger:[0-9]+}/entry/{entry:[0-9]+}", get_message_by_id)
    r.add_get(TOPIC_PATH + "/lastMessageId", last_message_id)
