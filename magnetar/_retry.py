"""Retry topics: `reconsume_later`, as Pulsar's Java client has it (the official Python client
does not).

Theory of operation (part A12 of the client reference)
-----------------------------------------------------
A consumer subscribed with `retry_enable=True` also subscribes, with the same subscription, to
its retry topic (`<first topic>-<subscription>-RETRY` unless the dead-letter policy names one).
`reconsume_later(message, delay)` copies the message there with its properties plus
`REAL_TOPIC` and `ORIGIN_MESSAGE_ID` (kept when already present, so a message keeps its
origin through many retries), `RECONSUMETIMES` (1, then one more each time) and `DELAY_TIME`
(the delay in ms), delivered after the delay; once `RECONSUMETIMES` would exceed the maximum
(the dead-letter policy's `max_redeliver_count`, else `MAX_RECONSUMETIMES`) the copy goes to
the dead-letter topic (`<first topic>-<subscription>-DLQ` unless named) instead. Only then is
the original acknowledged, and the call returns once the broker stored that ack (over TCP an
ack receipt): the copy is durable before the original is gone, so a crash in between leaves a
duplicate, never a loss.

Both are ordinary persistent topics, so a message waiting in the retry topic, its count, and
everything in the dead-letter topic survive restarts. The broker holds delayed messages only on
Shared and Key_Shared subscriptions: with Exclusive or Failover the copy arrives at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Final

from ._dead_letter import ORIGIN_MESSAGE_ID, REAL_TOPIC, ConsumerDeadLetterPolicy
from ._message import Message
from ._producer import OutMessage, ProducerConfig, ProducerCore
from ._transport import Transport

__all__ = ["DELAY_TIME", "MAX_RECONSUMETIMES", "RECONSUMETIMES", "RetryLetters"]

RECONSUMETIMES: Final = "RECONSUMETIMES"
DELAY_TIME: Final = "DELAY_TIME"
MAX_RECONSUMETIMES: Final = 16


class RetryLetters:
    """The retry and dead-letter producers of one consumer (see the module comment)."""

    def __init__(self, transport: Transport, first_topic: str, subscription: str,
                 policy: ConsumerDeadLetterPolicy | None, new_id: Callable[[], int]):
        self.transport = transport
        named_retry = policy.retry_letter_topic if policy is not None else ""
        named_dead = policy.dead_letter_topic if policy is not None else ""
        self.retry_topic = named_retry or f"{first_topic}-{subscription}-RETRY"
        self.dead_letter_topic = named_dead or f"{first_topic}-{subscription}-DLQ"
        self.max_reconsume_times = policy.max_redeliver_count if policy is not None \
            else MAX_RECONSUMETIMES
        self.initial_subscription = policy.initial_subscription_name if policy else ""
        self._new_id = new_id
        self._producers: dict[str, ProducerCore] = {}
        self._creating = asyncio.Lock()

    def dead_letter_policy(self) -> ConsumerDeadLetterPolicy:
        """The policy the per-topic consumers apply to negative acks (one DLQ for all)."""
        return ConsumerDeadLetterPolicy(self.max_reconsume_times, self.dead_letter_topic,
                                        self.initial_subscription or None, self.retry_topic)

    async def publish(self, message: Message, delay_ms: int,
                      extra: Mapping[str, str]) -> str:
        """Copy `message` to the retry (or dead-letter) topic; returns the topic's name.

        Raises:
            PulsarException: the copy could not be stored (the original is untouched).
        """
        properties = message.properties()
        properties.setdefault(REAL_TOPIC, message.topic_name())
        properties.setdefault(ORIGIN_MESSAGE_ID, str(message.codec_id))
        properties.update(extra)
        try:
            times = int(properties.get(RECONSUMETIMES, "0")) + 1
        except ValueError:
            times = 1  # a foreign value: start counting here
        properties[RECONSUMETIMES] = str(times)
        properties[DELAY_TIME] = str(max(0, delay_ms))
        dead = times > self.max_reconsume_times
        topic = self.dead_letter_topic if dead else self.retry_topic
        ordering = message.ordering_key()
        copy = OutMessage(
            payload=None if message.has_null_value() else message.data(),
            properties=properties, partition_key=message.partition_key() or None,
            ordering_key=ordering.encode() if ordering else None,
            event_time=message.event_timestamp(),
            deliver_at_ms=None if dead or delay_ms <= 0 else int(time.time() * 1000) + delay_ms)
        producer = await self._producer(topic, dead)
        await (await producer.send(copy))
        return topic

    async def _producer(self, topic: str, dead: bool) -> ProducerCore:
        async with self._creating:
            producer = self._producers.get(topic)
            if producer is None or producer.closed:
                producer = ProducerCore(self.transport, self._new_id(), topic, -1, ProducerConfig(
                    chunking_enabled=True,
                    initial_subscription_name=self.initial_subscription if dead else ""))
                await producer.start()
                self._producers[topic] = producer
            return producer

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self._producers.values()),
                             return_exceptions=True)
