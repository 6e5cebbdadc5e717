"""Topic-list watchers (PIP-145): a client learns of matching topics as they come and go.

Theory of operation
-------------------
A pattern consumer of the Java client, instead of re-polling GET_TOPICS_OF_NAMESPACE, sends
WATCH_TOPIC_LIST{request_id, watcher_id, namespace, topics_pattern, topics_hash}. The broker
answers WATCH_TOPIC_LIST_SUCCESS with the persistent topics of the namespace whose *base* name
(partition suffix removed) the pattern matches -- partitions are listed one by one, as Pulsar
lists them -- and the hash of that list (`topics_hash`, the same hash GET_TOPICS_OF_NAMESPACE
carries). When the client's `topics_hash` already equals it, the list is left empty. From then
on every creation or deletion of a matching persistent topic sends WATCH_TOPIC_UPDATE
{watcher_id, new_topics, deleted_topics, topics_hash}, the hash being that of the watcher's list
after the change. WATCH_TOPIC_LIST_CLOSE removes a watcher (SUCCESS even when it is unknown);
the connection's end removes them all.

`TopicListWatchers` holds the watchers of one connection. Each watcher is one listener on the
`BrokerService` (`add_topic_listener`), called synchronously when a topic is created or deleted;
it sends through the connection's `send`, which refuses (and logs) what the peer cannot handle,
so only connections that accept WATCH_TOPIC_* replies (`WATCHER_REPLY_TYPES`, decided at
CONNECT) register watchers at all.

Limits and errors (CommandError, in upstream's form): a pattern longer than
the broker's `subscription_pattern_max_length` (Pulsar's subscriptionPatternMaxLength, 50)
once its domain scheme is removed, or more than
`WATCHERS_PER_CONNECTION_MAX` watchers on one connection -> NotAllowedError "Unable to create
topic list watcher: ..."; a pattern that is not a regular expression RE2 accepts (matching is
linear-time RE2, `_names.matches_topics_pattern`, so Java's backreferences and lookaround are
refused too) -> InvalidTopicName "Invalid topics pattern: <the regex error>"; a bad namespace ->
InvalidTopicName. A refused request registers nothing.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from google.protobuf.message import Message

from magnetar.codec import pb

from .._errors import InvalidTopicNameError, NotAllowedError
from .._names import (
    NamespaceName,
    _java_string_order,
    matches_topics_pattern,
    strip_domain_scheme,
    topics_hash,
)
from ..topics._service import BrokerService

__all__ = [
    "WATCHERS_PER_CONNECTION_MAX",
    "WATCHER_REPLY_TYPES",
    "TopicListWatchers",
]

log = logging.getLogger(__name__)

T = pb.BaseCommand

WATCHERS_PER_CONNECTION_MAX: Final = 64
ALL_TOPICS_PATTERN: Final = ".*"  # a request without a pattern watches every topic
WATCHER_REPLY_TYPES: Final = frozenset({T.WATCH_TOPIC_LIST_SUCCESS, T.WATCH_TOPIC_UPDATE})
_ERROR_PREFIX: Final = "Unable to create topic list watcher: "


class _OrderedTopics:
    """A watcher's topics, kept in the order `topics_hash` sorts them, so that the hash after
    each creation or deletion is one pass over the names, not a sort of them (a watcher of a
    namespace where topics keep coming sorted all of them for each one)."""

    def __init__(self, names: Iterable[str] = ()):
        self._members = set(names)
        self._ordered = sorted(self._members, key=_java_string_order)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._ordered)

    def add(self, name: str) -> None:
        if name not in self._members:
            self._members.add(name)
            bisect.insort(self._ordered, name, key=_java_string_order)

    def discard(self, name: str) -> None:
        if name in self._members:
            self._members.discard(name)
            at = bisect.bisect_left(self._ordered, _java_string_order(name),
                                    key=_java_string_order)
            assert self._ordered[at] == name
            del self._ordered[at]

    def hash(self) -> str:
        return topics_hash(self._ordered, presorted=True)


@dataclass
class _Watcher:
    watcher_id: int
    namespace: str
    pattern: str
    topics: _OrderedTopics = field(default_factory=_OrderedTopics)
    listener: Callable[[str, bool], None] | None = None


class TopicListWatchers:
    """The topic-list watchers of one connection (see the module comment).

    Args:
        service: the broker whose topics are watched.
        send: sends one command to the client; False when it could not be sent.
        peer: the client's address, for logs.
    """

    def __init__(self, service: BrokerService, send: Callable[[Message], bool], peer: str):
        self.service = service
        self._send = send
        self.peer = peer
        self._watchers: dict[int, _Watcher] = {}

    def __len__(self) -> int:
        return len(self._watchers)

    def watch(self, request: pb.CommandWatchTopicList) -> pb.CommandWatchTopicListSuccess:
        """Register a watcher (or find the one with that id) and build its SUCCESS reply.

        Raises:
            NotAllowedError: the pattern is too long, or the connection has
                `WATCHERS_PER_CONNECTION_MAX` watchers. Nothing is registered.
            InvalidTopicNameError: the namespace is not a valid name or the pattern not a valid
                regular expression. Nothing is registered.
        """
        watcher = self._watchers.get(request.watcher_id)
        if watcher is None:
            watcher = self._new_watcher(request)
        digest = watcher.topics.hash()
        reply = pb.CommandWatchTopicListSuccess(request_id=request.request_id,
                                                watcher_id=watcher.watcher_id, topics_hash=digest)
        if not (request.HasField("topics_hash") and request.topics_hash == digest):
            reply.topic.extend(sorted(watcher.topics))
        return reply

    def _new_watcher(self, request: pb.CommandWatchTopicList) -> _Watcher:
        namespace = str(NamespaceName.parse(request.namespace))
        pattern = request.topics_pattern if request.HasField("topics_pattern") else ""
        pattern = pattern or ALL_TOPICS_PATTERN
        length_max = self.service.config.subscription_pattern_max_length
        if len(strip_domain_scheme(pattern)) > length_max:
            raise NotAllowedError(f"{_ERROR_PREFIX}Pattern longer than maximum: {length_max}")
        if len(self._watchers) >= WATCHERS_PER_CONNECTION_MAX:
            raise NotAllowedError(f"{_ERROR_PREFIX}more than {WATCHERS_PER_CONNECTION_MAX} "
                                  "watchers on one connection")
        try:
            matches_topics_pattern(pattern, f"persistent://{namespace}/probe")
        except (re.error, ValueError) as exc:
            raise InvalidTopicNameError(f"Invalid topics pattern: {exc}") from None
        topics = self.service.list_topics(namespace, "PERSISTENT")
        watcher = _Watcher(request.watcher_id, namespace, pattern,
                           _OrderedTopics(t for t in topics if matches_topics_pattern(pattern, t)))

        def listener(name: str, created: bool) -> None:
            self._on_topic_event(watcher, name, created)

        self.service.add_topic_listener(listener)
        watcher.listener = listener
        self._watchers[watcher.watcher_id] = watcher
        assert len(self._watchers) <= WATCHERS_PER_CONNECTION_MAX
        return watcher

    def close_watcher(self, watcher_id: int) -> bool:
        """Remove a watcher; False when there was none with that id."""
        watcher = self._watchers.pop(watcher_id, None)
        if watcher is None:
            return False
        if watcher.listener is not None:
            self.service.remove_topic_listener(watcher.listener)
        return True

    def close_all(self) -> None:
        """Remove every watcher (the connection ends)."""
        for watcher_id in list(self._watchers):
            self.close_watcher(watcher_id)

    def _on_topic_event(self, watcher: _Watcher, name: str, created: bool) -> None:
        if not name.startswith(f"persistent://{watcher.namespace}/"):
            return
        if not matches_topics_pattern(watcher.pattern, name):
            return
        if created == (name in watcher.topics):
            return  # nothing changed for this watcher
        if created:
            watcher.topics.add(name)
        else:
            watcher.topics.discard(name)
        update = pb.CommandWatchTopicUpdate(watcher_id=watcher.watcher_id,
                                            topics_hash=watcher.topics.hash())
        (update.new_topics if created else update.deleted_topics).append(name)
        if not self._send(update):
            log.info("topic-list update for watcher %d of %s not sent", watcher.watcher_id,
                     self.peer)

