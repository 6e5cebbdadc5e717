"""Non-persistent topics: memory only; a message goes to the consumers that can take it now
and is otherwise dropped (broker reference §3.7). Producers are admitted as on persistent
topics (`_producer._ProducerHost`), the topic epoch kept in memory only; each subscription is
a `dispatch._nonpersistent.NonPersistentSubscription`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from magnetar.codec import pb

from .._errors import (
    NotAllowedError,
    ProducerBusyError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicTerminatedError,
)
from .._names import TopicName
from .._rates import RateMeter
from ..dispatch._consumer import Consumer, ConsumerSink, SubscribeSpec
from ._access_modes import ExclusiveAccess
from ._producer import (
    Producer,
    ProducerSpec,
    PublishResult,
    _count_in,
    _metadata_of,
    _ProducerHost,
    generated_producer_name,
)
from ._publishing import Send

if TYPE_CHECKING:
    from .._config import BrokerConfig
    from ._service import BrokerService

__all__ = ["NonPersistentTopic"]


class NonPersistentTopic(_ProducerHost):
    """A non-persistent topic: messages go to the consumers that can take them now and are
    otherwise dropped (broker reference §3.7)."""

    def __init__(self, service: BrokerService, name: TopicName):
        from ..dispatch._nonpersistent import NonPersistentSubscription

        self.service = service
        self.name = name
        self.producers: dict[str, Producer] = {}
        self.subscriptions: dict[str, NonPersistentSubscription] = {}
        self.policies = service.namespaces.effective_policies(str(name), name.namespace_name)
        self.msg_in_counter = 0
        self.bytes_in_counter = 0
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.rate_in = RateMeter(time.monotonic())
        self.rate_out = RateMeter(time.monotonic())
        self.msg_drop_counter = 0
        self.fenced = False
        self.failure: str | None = None  # why the topic's entries cannot be read (read_failed)
        self.access = ExclusiveAccess(None, lambda epoch: None)  # the epoch: memory only

    @property
    def config(self) -> BrokerConfig:
        return self.service.config

    def add_producer(self, spec: ProducerSpec) -> Producer:
        """Admit a producer (access modes as for persistent topics; the topic epoch is
        not persisted).

        Raises:
            ServiceNotReadyError: the topic is closing.
            ProducerBusyError, ProducerFencedError: as `ExclusiveAccess.admit`, or the name
                is taken.
        """
        if self.fenced:
            raise ServiceNotReadyError(f"Topic {self.name} is temporarily unavailable")
        self.service.stats_interval.touch(self)
        name = spec.producer_name or generated_producer_name(self.config.cluster_name)
        if self._name_taken(name):
            raise ProducerBusyError(
                f"Producer with name '{name}' is already connected to topic '{self.name}'")
        return self._admit(Producer(self, spec, name, bool(spec.producer_name)))

    def last_sequence_id(self, producer: Producer) -> int:
        return -1

    async def publish(self, producer: Producer, entry: bytes, sequence_id: int,
                      highest_sequence_id: int, metadata: pb.MessageMetadata | None = None,
                      ) -> PublishResult:
        """Offer one entry to the subscriptions (dropped where it does not fit).

        Raises:
            TopicTerminatedError: the producer is closed or still waits for exclusive access.
        """
        if self.producers.get(producer.name) is not producer:
            raise TopicTerminatedError(f"Producer {producer.name} is not accepting messages")
        metadata = metadata if metadata is not None else _metadata_of(entry)
        messages = _count_in(self, producer, entry, metadata)
        for subscription in self.subscriptions.values():
            if not subscription.offer(entry, metadata, messages):
                self.msg_drop_counter += messages
        return PublishResult(0, 0)

    async def publish_many(self, producer: Producer, sends: list[Send],
                           ) -> list[PublishResult | BaseException]:
        """`publish` for each of a run of one producer's SENDs; each one's result or error."""
        outcomes: list[PublishResult | BaseException] = []
        for entry, sequence_id, highest_sequence_id, metadata in sends:
            try:
                outcomes.append(await self.publish(producer, entry, sequence_id,
                                                   highest_sequence_id, metadata))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    async def subscribe(self, spec: SubscribeSpec, sink: ConsumerSink) -> Consumer:
        from ..dispatch._nonpersistent import NonPersistentSubscription

        self.service.stats_interval.touch(self)
        subscription = self.subscriptions.get(spec.subscription)
        if subscription is None:
            subscription = NonPersistentSubscription(self, spec.subscription)
            self.subscriptions[spec.subscription] = subscription
        consumer = Consumer(spec, sink, partition=self.name.partition_index)
        subscription.add_consumer(consumer)
        return consumer

    def consumer_closed(self, subscription: Any, consumer: Consumer) -> None:
        subscription.remove_consumer(consumer)
        if not subscription.consumers:
            self.subscriptions.pop(subscription.name, None)

    def consumer_count(self) -> int:
        return sum(len(s.consumers) for s in self.subscriptions.values())

    async def unsubscribe(self, name: str, consumer: Consumer | None = None,
                          force: bool = False) -> None:
        subscription = self.subscriptions.pop(name, None)
        if subscription is None:
            raise SubscriptionNotFoundError(f"Subscription {name} not found")

    async def close(self) -> None:
        self.fenced = True
        self.subscriptions.clear()

    async def delete(self, force: bool = False) -> None:
        """Drop the topic; with clients connected only when forced (they are closed)."""
        if (self.producers or self.consumer_count()) and not force:
            raise NotAllowedError(f"Topic {self.name} has active producers or consumers")
        self.fenced = True
        self.disconnect_producers("topic deleted")
        for subscription in list(self.subscriptions.values()):
            for consumer in list(subscription.consumers):
                subscription.remove_consumer(consumer)
                consumer.sink.close_consumer(consumer, "topic deleted")
        await self.close()
