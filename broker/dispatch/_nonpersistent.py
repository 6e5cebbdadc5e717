"""Subscriptions of non-persistent topics (broker reference §3.7).

Nothing is stored: a published message is offered to each subscription at once and goes
to one consumer that has permits — round robin for Shared, the active consumer for
Exclusive and Failover, the slot's consumer for Key_Shared — or is dropped (and counted).
Message ids are always (0, 0); acknowledgements are no-ops.

Failover subscriptions tell their consumers who is active, as persistent ones do: whenever a
consumer joins or leaves and the active consumer changes, every consumer gets
ACTIVE_CONSUMER_CHANGE (is_active true for the chosen one only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnetar.codec import pb, sticky_key

from .._errors import ConsumerBusyError
from ._consumer import Consumer, Delivery
from ._dispatcher import failover_ring_choice
from ._selectors import StickyKeyConsumerSelector, new_selector

if TYPE_CHECKING:
    from ._parent import NonPersistentParent

__all__ = ["NonPersistentSubscription"]


class NonPersistentSubscription:
    def __init__(self, topic: NonPersistentParent, name: str):
        self.topic = topic
        self.name = name
        self.consumers: list[Consumer] = []
        self.sub_type = ""
        self.selector: StickyKeyConsumerSelector[Consumer] | None = None
        self._next = 0
        self.msg_drop_counter = 0
        self.active: Consumer | None = None  # Exclusive and Failover: who receives

    def add_consumer(self, consumer: Consumer) -> None:
        spec = consumer.spec
        if self.consumers:
            if spec.sub_type != self.sub_type:
                raise ConsumerBusyError("Subscription is of different type")
            if self.sub_type == "Exclusive":
                raise ConsumerBusyError("Exclusive consumer is already connected")
        else:
            self.sub_type = spec.sub_type
            self.selector = None
            if spec.sub_type == "Key_Shared":
                sticky = spec.has_key_shared_meta and spec.key_shared_mode == "STICKY"
                self.selector = new_selector(self.topic.config, sticky=sticky)
        if self.selector is not None:
            self.selector.add_consumer(consumer)
        self.consumers.append(consumer)
        self._update_active()

    def remove_consumer(self, consumer: Consumer) -> None:
        consumer.closed = True
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            if self.selector is not None:
                self.selector.remove_consumer(consumer)
            self._update_active()

    def flow(self, consumer: Consumer, permits: int) -> None:
        consumer.add_permits(permits)

    def _choose(self, metadata: pb.MessageMetadata) -> Consumer | None:
        if not self.consumers:
            return None
        if self.sub_type == "Shared":
            for step in range(len(self.consumers)):
                candidate = self.consumers[(self._next + step) % len(self.consumers)]
                if candidate.permits > 0:
                    self._next = (self._next + step + 1) % len(self.consumers)
                    return candidate
            return None
        if self.sub_type == "Key_Shared":
            assert self.selector is not None
            chosen = self.selector.select(self.selector.slot_for(sticky_key(metadata)))
        else:
            chosen = self.active
        return chosen if chosen is not None and chosen.permits > 0 else None

    def _pick_active(self) -> Consumer | None:
        """Exclusive: the only consumer; Failover: the partition-index rule or the ring."""
        if not self.consumers or self.sub_type not in ("Exclusive", "Failover"):
            return None
        if self.sub_type == "Exclusive":
            return self.consumers[0]
        ordered = sorted(self.consumers, key=lambda c: (c.priority_level, c.consumer_name))
        top = [c for c in ordered if c.priority_level == ordered[0].priority_level]
        index = self.topic.name.partition_index
        if index >= 0:
            return top[index % len(top)]
        return failover_ring_choice(top, str(self.topic.name))

    def _update_active(self) -> None:
        chosen = self._pick_active()
        if chosen is self.active:
            return
        self.active = chosen
        if self.sub_type == "Failover" and chosen is not None:
            for consumer in self.consumers:
                consumer.sink.active_consumer_changed(consumer, consumer is chosen)

    def offer(self, entry: bytes, metadata: pb.MessageMetadata, messages: int) -> bool:
        """Deliver to one consumer now, or drop; returns whether it was delivered."""
        consumer = self._choose(metadata)
        if consumer is None:
            self.msg_drop_counter += messages
            return False
        delivery = Delivery(0, 0, self.topic.name.partition_index, entry, 0, None,
                            consumer.epoch, messages)
        consumer.record_sent([delivery], messages)
        self.topic.msg_out_counter += messages
        self.topic.bytes_out_counter += len(entry)
        consumer.sink.deliver(consumer, [delivery])
        return True
