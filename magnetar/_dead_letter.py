"""Dead-letter topics: `ConsumerDeadLetterPolicy` and the per-topic `DeadLetters` that apply it.

Theory of operation (Pulsar's, part A11 of the client reference)
--------------------------------------------------------------
A message received with a redelivery count at or above `max_redeliver_count` is remembered as
a candidate (per entry: every message of a batch). Above the maximum it is not handed to the
application at all; its entry is sent for redelivery at once. Whenever entries are about to be
redelivered (a negative ack, an ack timeout, the step just described), each candidate entry is
instead published to the dead-letter topic -- payload, keys and properties, plus `REAL_TOPIC`
and `ORIGIN_MESSAGE_ID` unless present -- and then acknowledged; an entry whose publish fails
is redelivered normally. The application therefore sees a message at most
`max_redeliver_count + 1` times (counts 0..max). The broker increments redelivery counts only
on Shared and Key_Shared subscriptions, so that is where the policy has an effect.

The dead-letter producer is created on first need (batching off, chunking on, the policy's
initial subscription created with the topic) and closed with the consumer. The default topic
is `<topic>-<subscription>-DLQ`, per concrete topic (a partition's name for partitions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from ._errors import InvalidConfiguration, PulsarException
from ._message import Message
from ._producer import OutMessage, ProducerConfig, ProducerCore
from ._transport import Transport

__all__ = ["ORIGIN_MESSAGE_ID", "REAL_TOPIC", "ConsumerDeadLetterPolicy", "DeadLetters"]

log = logging.getLogger(__name__)

REAL_TOPIC: Final = "REAL_TOPIC"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
EntryKey = tuple[int, int]


class ConsumerDeadLetterPolicy:
    """The official client's dead-letter policy.

    Raises:
        InvalidConfiguration: `max_redeliver_count` below 1, or names that are not strings.
    """

    def __init__(self, max_redeliver_count: int, dead_letter_topic: str | None = None,
                 initial_subscription_name: str | None = None,
                 retry_letter_topic: str | None = None):
        if not isinstance(max_redeliver_count, int) or max_redeliver_count < 1:
            raise InvalidConfiguration(f"max_redeliver_count must be an int of at least 1, "
                                       f"not {max_redeliver_count!r}")
        for name, value in (("dead_letter_topic", dead_letter_topic),
                            ("initial_subscription_name", initial_subscription_name),
                            ("retry_letter_topic", retry_letter_topic)):
            if value is not None and not isinstance(value, str):
                raise InvalidConfiguration(f"{name} must be a str, not {value!r}")
        self._max = max_redeliver_count
        self._topic = dead_letter_topic or ""
        self._initial = initial_subscription_name or ""
        self._retry = retry_letter_topic or ""  # Java's retryLetterTopic (reconsume_later)

    @property
    def max_redeliver_count(self) -> int:
        return self._max

    @property
    def dead_letter_topic(self) -> str:
        return self._topic

    @property
    def initial_subscription_name(self) -> str:
        return self._initial

    @property
    def retry_letter_topic(self) -> str:
        return self._retry


class DeadLetters:
    """The policy at work for one per-topic consumer (see the module comment)."""

    def __init__(self, policy: ConsumerDeadLetterPolicy, transport: Transport, topic: str,
                 subscription: str, new_id: Callable[[], int]):
        self.policy = policy
        self.transport = transport
        self.topic = policy.dead_letter_topic or f"{topic}-{subscription}-DLQ"
        self._new_id = new_id
        self._candidates: dict[EntryKey, list[Message]] = {}
        self._producer: ProducerCore | None = None
        self._creating: asyncio.Lock = asyncio.Lock()

    def screen(self, key: EntryKey, messages: list[Message], redelivery_count: int) -> bool:
        """Remember an entry's messages when they are candidates; True when they must not
        reach the application (their count is above the maximum)."""
        if redelivery_count >= self.policy.max_redeliver_count and messages:
            self._candidates[key] = messages
        return redelivery_count > self.policy.max_redeliver_count

    def forget(self, key: EntryKey) -> None:
        """The entry was acknowledged."""
        self._candidates.pop(key, None)

    async def divert(self, keys: list[EntryKey], ack: Callable[[EntryKey], None],
                     ) -> list[EntryKey]:
        """Publish the candidates among `keys` to the dead-letter topic and `ack` them.

        Returns:
            The keys to redeliver normally (not candidates, or their publish failed).
        """
        remaining = []
        for key in keys:
            messages = self._candidates.pop(key, None)
            if messages is None:
                remaining.append(key)
                continue
            try:
                producer = await self._dead_letter_producer()
                results = [await producer.send(_dead_letter_copy(m)) for m in messages]
                await asyncio.gather(*results)
            except PulsarException as exc:
                log.warning("dead-lettering %s of %s to %s failed (%s); redelivering it",
                            key, messages[0].topic_name(), self.topic, exc)
                remaining.append(key)
                continue
            ack(key)
        return remaining

    async def _dead_letter_producer(self) -> ProducerCore:
        async with self._creating:
            if self._producer is None or self._producer.closed:
                producer = ProducerCore(self.transport, self._new_id(), self.topic, -1,
                                        ProducerConfig(
                                            chunking_enabled=True,
                                            initial_subscription_name=(
                                                self.policy.initial_subscription_name)))
                await producer.start()
                self._producer = producer
            return self._producer

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()


def _dead_letter_copy(message: Message) -> OutMessage:
    properties = message.properties()
    properties.setdefault(REAL_TOPIC, message.topic_name())
    properties.setdefault(ORIGIN_MESSAGE_ID, str(message.codec_id))
    ordering = message.ordering_key()
    return OutMessage(payload=None if message.has_null_value() else message.data(),
                      properties=properties, partition_key=message.partition_key() or None,
                      ordering_key=ordering.encode() if ordering else None,
                      event_time=message.event_timestamp())
