"""Producers and what both topic kinds do with them.

`ProducerSpec` is what CommandProducer asks for; a `Producer` is one connected producer of a
topic, with its counters and the connection's close callback; `PublishResult` answers a
publish. `_ProducerHost` is the producer half of `PersistentTopic` and `NonPersistentTopic`:
admission under the access modes (`_access_modes.ExclusiveAccess`: Shared, Exclusive,
ExclusiveWithFencing, WaitForExclusive), registration, removal with promotion of a waiting
producer, and broker-side disconnects (CLOSE_PRODUCER; the client reconnects).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from magnetar.codec import parse_entry, pb

from .._names import TopicName
from .._rates import RateMeter
from ..dispatch._entry import messages_in_entry
from ._access_modes import ExclusiveAccess, Waiter

if TYPE_CHECKING:
    from ._nonpersistent_topic import NonPersistentTopic
    from ._topic import PersistentTopic

__all__ = ["Producer", "ProducerSpec", "PublishResult"]

log = logging.getLogger(__name__)

_PRODUCER_NAMES = itertools.count(0)


def generated_producer_name(cluster_name: str) -> str:
    """A name for a producer that asked for none, unique in this process."""
    return f"{cluster_name}-0-{next(_PRODUCER_NAMES)}"



@dataclass(frozen=True)
class ProducerSpec:
    """What CommandProducer asks for, as plain values."""

    producer_name: str = ""
    access_mode: str = "Shared"  # Shared | Exclusive | ExclusiveWithFencing | WaitForExclusive
    epoch: int = 0
    topic_epoch: int | None = None  # what the client got from an earlier exclusive access
    metadata: dict[str, str] = field(default_factory=dict)
    initial_subscription_name: str = ""
    address: str = ""
    client_version: str = ""


class Producer:
    """A connected producer."""

    def __init__(self, topic: PersistentTopic | NonPersistentTopic, spec: ProducerSpec,
                 name: str, user_provided_name: bool):
        self.topic = topic
        self.spec = spec
        self.name = name
        self.user_provided_name = user_provided_name
        self.msg_in_counter = 0
        self.bytes_in_counter = 0
        self.rate_in = RateMeter(time.monotonic())  # msgRateIn, msgThroughputIn
        self.closed = False
        self.connected_since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.topic_epoch: int | None = None  # granted with exclusive access
        self.waiter: Waiter | None = None  # set while a WaitForExclusive producer waits
        self.closer: Callable[[str], None] | None = None  # the connection's CLOSE_PRODUCER
        self.closed_on_full_disk = False  # SENDs still on their way are refused quietly

    def disconnect(self, reason: str) -> None:
        """The broker drops this producer (already removed from its topic): its connection
        tells the client, which reconnects."""
        if self.closer is not None:
            self.closer(reason)


class PublishResult(NamedTuple):
    """Where a publish put its entry; (-1, -1) for a duplicate. A tuple: built once per
    SEND, and a frozen dataclass costs three times as much to build."""

    ledger_id: int
    entry_id: int

    @property
    def duplicate(self) -> bool:
        return self.ledger_id == -1 and self.entry_id == -1


def _count_in(topic: PersistentTopic | NonPersistentTopic, producer: Producer, entry: bytes,
              metadata: pb.MessageMetadata) -> int:
    """Count a published entry in the topic's and the producer's counters; returns its
    number of messages."""
    messages = (messages_in_entry(metadata, entry)  # 1 unless a batch (the call saved)
                if metadata.HasField("num_messages_in_batch") else 1)
    producer.msg_in_counter += messages
    producer.bytes_in_counter += len(entry)
    topic.msg_in_counter += messages
    topic.bytes_in_counter += len(entry)
    return messages


def _metadata_of(entry: bytes) -> pb.MessageMetadata:
    return parse_entry(entry, verify_checksum=False).metadata


class _ProducerHost:
    """What both topic kinds do with producers: admission under the access modes
    (`ExclusiveAccess`), registration, removal with promotion of a waiting producer, and
    broker-side disconnects. Subclasses set `name`, `producers`, `access` and `fenced`."""

    __slots__ = ()

    name: TopicName
    producers: dict[str, Producer]
    access: ExclusiveAccess
    fenced: bool

    def _admit(self, producer: Producer) -> Producer:
        """Apply the access mode (see `ExclusiveAccess.admit`, whose errors pass through);
        a producer that must wait is returned unregistered with its `waiter` set."""
        spec = producer.spec
        granted = self.access.admit(producer.name, spec.access_mode, spec.topic_epoch,
                                    len(self.producers), self._evict_producers, producer)
        if isinstance(granted, Waiter):
            producer.waiter = granted
            log.info("producer %s waits for exclusive access to %s (%d waiting)",
                     producer.name, self.name, len(self.access.waiters))
            return producer
        producer.topic_epoch = granted
        self._register(producer)
        return producer

    async def epoch_durable(self) -> None:
        """Wait until the topic epoch an exclusive producer was just granted is stored
        durably (nothing to wait for where epochs are not stored)."""

    def _name_taken(self, name: str) -> bool:
        return name in self.producers or any(w.name == name for w in self.access.waiters)

    def _register(self, producer: Producer) -> None:
        assert producer.name not in self.producers
        self.producers[producer.name] = producer

    def _unregistered(self, producer: Producer) -> None:
        """Hook: `producer` just left `producers`."""

    def _evict_producers(self) -> None:
        self.disconnect_producers("fenced by an ExclusiveWithFencing producer")

    def disconnect_producers(self, reason: str) -> None:
        """Remove every producer, waiting ones included, and tell its connection
        (CLOSE_PRODUCER; the client reconnects)."""
        # Waiters first: removing a holder while they wait would promote one.
        for producer in [w.producer for w in self.access.waiters] + \
                list(self.producers.values()):
            self.remove_producer(producer)
            producer.disconnect(reason)

    def remove_producer(self, producer: Producer) -> None:
        """A producer leaves (or stops waiting). Idempotent. When it held exclusive access,
        the first waiting producer is promoted and registered (not while closing)."""
        producer.closed = True
        if producer.waiter is not None:
            self.access.removed(producer.name, producer.waiter, len(self.producers))
            return
        if self.producers.get(producer.name) is not producer:
            return
        del self.producers[producer.name]
        self._unregistered(producer)
        if self.fenced:
            return  # closing: nobody is promoted (the waiters reconnect to the reloaded topic)
        promoted = self.access.removed(producer.name, None, len(self.producers))
        if promoted is not None:
            waiting: Producer = promoted.producer
            waiting.waiter = None
            waiting.topic_epoch = promoted.admitted.result()
            self._register(waiting)
