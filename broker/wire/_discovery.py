"""Lookup and discovery on one connection: LOOKUP, PARTITIONED_METADATA,
GET_TOPICS_OF_NAMESPACE, GET_SCHEMA, GET_OR_CREATE_SCHEMA and the topic-list watch commands.

Theory of operation
-------------------
`DiscoveryCommands` answers the questions a client asks before and beside its work, through
its `ConnectionView` (`_connection_view.py`). They create nothing on a topic; only
PARTITIONED_METADATA waits on the service (as a task the connection tracks), the others are
answered at once.

Lookups. LOOKUP answers the server's advertised URLs (`_listeners.py` picks them for a named
listener), authoritative, so the client stays on this broker. A failure of the lookup family
(PARTITIONED_METADATA, LOOKUP) goes inside the response, and ServiceNotReady and
TooManyRequests are never put there (the C++ client would drop the whole connection):
MetadataError, which it retries, stands in (`lookup_error`). One exception, as in Pulsar: a
LOOKUP naming a listener the broker does not have fails with ServiceNotReady "the broker do not
have NAME listener", a text the C++ client knows.

Topic lists. Topic patterns (GET_TOPICS_OF_NAMESPACE, watchers) run on RE2, so no pattern can
stall the event loop that every connection shares; one RE2 refuses is ERROR InvalidTopicName
"Invalid topics pattern: ...". WATCH_TOPIC_LIST is served by `_topic_watchers.TopicListWatchers`
for the Java client and for clients that declared feature_flags.supports_topic_watchers in
CONNECT (their connection then accepts the WATCH_TOPIC_* replies); other clients get ERROR
NotAllowed.

Schemas live in `_schemas.SchemaRegistry` (versions per topic, compatibility policies).
GET_OR_CREATE_SCHEMA from a client that cannot take its reply (the C++ client) adds nothing.
"""

from __future__ import annotations

import logging
import re
from typing import Final

from magnetar.codec import Frame, pb

from .._errors import BrokerError
from .._listeners import ListenerNotFoundError, listeners_of
from .._names import TopicName, matches_topics_pattern, topics_hash
from ..schemas._schemas import StoredSchema, encode_schema_version
from ..security._authz import (
    GET_PARTITIONS_REFUSED,
    GET_SCHEMA_REFUSED,
    GET_TOPICS_REFUSED,
    LOOKUP_REFUSED,
)
from ._connection_view import ConnectionView, authorize, server_error
from ._topic_watchers import WATCHER_REPLY_TYPES, TopicListWatchers

__all__ = ["DiscoveryCommands", "lookup_error"]

log = logging.getLogger(__name__)

T = pb.BaseCommand

# Codes a lookup-type reply must not carry: the C++ client closes the connection on them.
_LOOKUP_UNSAFE_CODES: Final = frozenset({pb.ServiceNotReady, pb.TooManyRequests})
_LIST_MODES: Final = {
    pb.CommandGetTopicsOfNamespace.PERSISTENT: "PERSISTENT",
    pb.CommandGetTopicsOfNamespace.NON_PERSISTENT: "NON_PERSISTENT",
    pb.CommandGetTopicsOfNamespace.ALL: "ALL",
}


def lookup_error(exc: BaseException) -> tuple[int, str]:
    """`server_error` for replies of the lookup family (see the module comment)."""
    code, message = server_error(exc)
    return (pb.MetadataError if code in _LOOKUP_UNSAFE_CODES else code), message


class DiscoveryCommands:
    """Lookup, topic lists, schemas and topic-list watchers of one connection (see the
    module comment).

    Args:
        view: the connection.
    """

    def __init__(self, view: ConnectionView):
        self.view = view
        self.watchers = TopicListWatchers(view.service, view.send, view.peer)

    def close(self) -> None:
        """The connection closed: its topic-list watchers stop."""
        self.watchers.close_all()

    # -- lookup ----------------------------------------------------------------------------

    def on_partitioned_metadata(self, frame: Frame) -> None:
        self.view.spawn(self._partitioned_metadata(frame.command.partitionMetadata))

    async def _partitioned_metadata(self, request: pb.CommandPartitionedTopicMetadata) -> None:
        reply = pb.CommandPartitionedTopicMetadataResponse(request_id=request.request_id)
        try:
            name = TopicName.parse(request.topic)
            authorize(self.view, "look up the partitions of", str(name),
                      lambda authz, role: authz.can_lookup(name, role), GET_PARTITIONS_REFUSED)
            reply.partitions = await self.view.service.partitioned_metadata(request.topic)
            reply.response = pb.CommandPartitionedTopicMetadataResponse.Success
        except Exception as exc:
            self.view.log_failure(exc)
            code, message = lookup_error(exc)
            reply.response = pb.CommandPartitionedTopicMetadataResponse.Failed
            reply.error = code  # type: ignore[assignment]
            reply.message = message
        self.view.send(reply)

    def on_lookup(self, frame: Frame) -> None:
        request = frame.command.lookupTopic
        reply = pb.CommandLookupTopicResponse(request_id=request.request_id)
        try:
            name = TopicName.parse(request.topic)
            authorize(self.view, "look up", str(name),
                      lambda authz, role: authz.can_lookup(name, role), LOOKUP_REFUSED)
        except Exception as exc:
            code, message = lookup_error(exc)
            reply.response = pb.CommandLookupTopicResponse.Failed
            reply.error = code  # type: ignore[assignment]
            reply.message = message
        else:
            ctx = self.view.ctx
            try:
                url, url_tls = listeners_of(self.view.service.config).lookup(
                    request.advertised_listener_name, ctx.advertised_url,
                    ctx.advertised_url_tls or None)
            except ListenerNotFoundError as exc:  # ServiceNotReady, as Pulsar answers it
                reply.response = pb.CommandLookupTopicResponse.Failed
                reply.error = pb.ServiceNotReady
                reply.message = str(exc)
            else:
                reply.response = pb.CommandLookupTopicResponse.Connect
                reply.brokerServiceUrl = url
                if url_tls:
                    reply.brokerServiceUrlTls = url_tls
                reply.authoritative = True
                reply.proxy_through_service_url = False
        self.view.send(reply)

    # -- topic lists -----------------------------------------------------------------------

    def on_get_topics(self, frame: Frame) -> None:
        view = self.view
        request = frame.command.getTopicsOfNamespace
        try:
            namespace = request.namespace
            authorize(view, "list the topics of", f"namespace {namespace[:200]}",
                      lambda authz, role: authz.can_list_topics(namespace, role),
                      GET_TOPICS_REFUSED)
            topics = view.service.list_topics(request.namespace, _LIST_MODES[request.mode])
        except Exception as exc:
            view.error(request.request_id, exc)
            return
        reply = pb.CommandGetTopicsOfNamespaceResponse(request_id=request.request_id)
        pattern = request.topics_pattern if request.HasField("topics_pattern") else ""
        if pattern and len(pattern) <= view.service.config.subscription_pattern_max_length:
            try:
                topics = [t for t in topics if matches_topics_pattern(pattern, t)]
                reply.filtered = True
            except (re.error, ValueError) as exc:  # upstream's answer (RE2J), no fallback
                view.error_code(request.request_id, pb.InvalidTopicName,
                                f"Invalid topics pattern: {exc}")
                return
            except BrokerError as exc:
                log.info("not filtering topics by %r: %s", pattern, exc)
        digest = topics_hash(topics)
        reply.topics_hash = digest
        if request.HasField("topics_hash") and request.topics_hash == digest:
            reply.changed = False
        else:
            reply.changed = True
            reply.topics.extend(topics)
        view.send(reply)

    def on_watch_topic_list(self, frame: Frame) -> None:
        request = frame.command.watchTopicList
        peer_types = self.view.peer_accepted_types
        if peer_types is not None and not peer_types >= WATCHER_REPLY_TYPES:
            self.view.error_code(request.request_id, pb.NotAllowedError, "Topic list watchers "
                                 "need a Java client or supports_topic_watchers in CONNECT's "
                                 "feature flags")
            return
        try:
            namespace = request.namespace
            authorize(self.view, "watch the topics of", f"namespace {namespace[:200]}",
                      lambda authz, role: authz.can_list_topics(namespace, role),
                      GET_TOPICS_REFUSED)
            reply = self.watchers.watch(request)
        except Exception as exc:
            self.view.error(request.request_id, exc)
            return
        self.view.send(reply)

    def on_watch_topic_list_close(self, frame: Frame) -> None:
        request = frame.command.watchTopicListClose
        self.watchers.close_watcher(request.watcher_id)
        self.view.success(request.request_id)

    # -- schemas ---------------------------------------------------------------------------

    def on_get_schema(self, frame: Frame) -> None:
        request = frame.command.getSchema
        reply = pb.CommandGetSchemaResponse(request_id=request.request_id)
        try:
            version = None
            if request.HasField("schema_version") and request.schema_version:
                version = int.from_bytes(request.schema_version, "big")
            name = TopicName.parse(request.topic)
            authorize(self.view, "read the schema of", str(name),
                      lambda authz, role: authz.can_lookup(name, role), GET_SCHEMA_REFUSED)
            found = self.view.ctx.schemas.get(name, version)
            if found is None:
                reply.error_code = pb.TopicNotFound
                reply.error_message = f"No schema found for topic {request.topic}"
            else:
                reply.schema.CopyFrom(found.schema.to_proto())
                reply.schema_version = encode_schema_version(found.version)
        except Exception as exc:
            self.view.log_failure(exc)
            code, message = server_error(exc)
            reply.error_code = code  # type: ignore[assignment]
            reply.error_message = message
        self.view.send(reply)

    def on_get_or_create_schema(self, frame: Frame) -> None:
        request = frame.command.getOrCreateSchema
        reply = pb.CommandGetOrCreateSchemaResponse(request_id=request.request_id)
        accepted = self.view.peer_accepted_types
        if accepted is not None and T.GET_OR_CREATE_SCHEMA_RESPONSE not in accepted:
            self.view.send(reply)  # refused by the codec and logged once: no answer, no schema
            return
        try:
            version = self.view.ctx.schemas.add(TopicName.parse(request.topic),
                                                StoredSchema.from_proto(request.schema))
            reply.schema_version = encode_schema_version(version)
        except Exception as exc:
            self.view.log_failure(exc)
            code, message = server_error(exc)
            reply.error_code = code  # type: ignore[assignment]
            reply.error_message = message
        self.view.send(reply)
