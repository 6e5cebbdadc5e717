"""`ConsumerGroup`: what the application calls a consumer -- one receiver queue over one or
many per-topic consumers (a topic, a partitioned topic, a list of topics, a pattern).

Theory of operation
-------------------
The group resolves its topics when it starts: each name's partitioned metadata says whether it
stands for partitions (`<topic>-partition-<n>`), and a pattern lists its namespace's topics
and keeps the full matches (again every `pattern_auto_discovery_period_s`, subscribing to new
matches). Each concrete topic gets a `TopicConsumer` (`_consumer.py`); with several, each one's
receiver queue is `min(receiver_queue_size, RECEIVER_QUEUE_ACROSS_PARTITIONS_MAX / n)`.

The group's queue holds messages in arrival order. `receive` takes the head, or waits with a
waiter future that either a message or the timeout timer resolves -- never both, so no
message is lost to a timeout. Messages that arrive while receives wait are queued and handed
to them at the end of that turn of the loop (`_serve`): what arrived in one turn -- a dispatch
round's entries -- goes to a synchronous receive in one hand-over, not one per entry (a
consumer without a receiver queue is served at once, as it asks for one message at a time).
Taking a message tells its consumer (`taken`: permits, ack timeout). Acks and negative acks
find their consumer through the message (`Message.owner`), or for a bare `MessageId` through
its partition; a bare id on a multi-topic group is refused with `OperationNotSupported`, as
in the official client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

from magnetar.codec import MessageId

from ._consumer import ConsumerConfig, TopicConsumer
from ._errors import (
    AlreadyClosed,
    CumulativeAcknowledgementNotAllowedError,
    InvalidConfiguration,
    OperationNotSupported,
    Timeout,
)
from ._handoff import Handoff
from ._message import Message, batch_indexes
from ._message_id import MessageId as ClientMessageId
from ._message_id import codec_id
from ._retry import RetryLetters
from ._transport import Transport

__all__ = ["RECEIVER_QUEUE_ACROSS_PARTITIONS_MAX", "ConsumerGroup", "complete_topic_name"]

log = logging.getLogger(__name__)

RECEIVER_QUEUE_ACROSS_PARTITIONS_MAX: Final = 50_000
_PARTITION_SUFFIX: Final = re.compile(r"-partition-(\d+)$")


def complete_topic_name(topic: str) -> str:
    """`t` -> `persistent://public/default/t`; `tenant/ns/t` -> `persistent://tenant/ns/t`.

    Raises:
        InvalidConfiguration: not a topic name.
    """
    if not isinstance(topic, str) or not topic.strip():
        raise InvalidConfiguration(f"topic must be a non-empty string, not {topic!r}")
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    if len(parts) == 3:
        return f"persistent://{topic}"
    raise InvalidConfiguration(f"{topic!r} is not a topic name (topic, tenant/namespace/topic, "
                               f"or persistent://tenant/namespace/topic)")


def _partition_of(topic: str) -> int:
    match = _PARTITION_SUFFIX.search(topic)
    return int(match.group(1)) if match else -1


class ConsumerGroup:
    """One application-facing consumer (see the module comment)."""

    def __init__(self, transport: Transport, ids: Iterator[int], config: ConsumerConfig,
                 topics: list[str] | None = None, pattern: re.Pattern[str] | None = None,
                 regex_mode: str = "PERSISTENT", pattern_auto_discovery_period_s: float = 60,
                 partitions_update_interval_s: float = 60):
        self.transport = transport
        self._ids = ids
        self.config = config
        self.names = [complete_topic_name(t) for t in topics or []]
        self.retry: RetryLetters | None = None
        if config.retry_enable:
            if not self.names:
                raise InvalidConfiguration("retry_enable needs topic names, not a pattern")
            self.retry = RetryLetters(transport, self.names[0], config.subscription,
                                      config.dead_letter_policy, self.new_id)
            self.config = config = dataclasses.replace(
                config, dead_letter_policy=self.retry.dead_letter_policy())
            self.names.append(self.retry.retry_topic)
        self.pattern = pattern
        self.regex_mode = regex_mode
        self.discovery_period_s = pattern_auto_discovery_period_s
        self.children: dict[str, TopicConsumer] = {}
        self.closed = False
        self.on_closed: Callable[[], None] | None = None  # the client's: forget this consumer
        self._queue: deque[Message] = deque()
        # Asynchronous receives (futures) and synchronous ones (`Handoff`s), oldest first.
        self._waiters: deque[asyncio.Future[Message] | Handoff] = deque()
        self._serving = False  # `_serve` is scheduled: the queue's messages go to the waiters
        self._discovery: asyncio.TimerHandle | None = None
        self._partitioned = False  # one partitioned topic: bare ids route by partition
        self.partitions_update_interval_s = partitions_update_interval_s
        self._partition_counts: dict[str, int] = {}  # partitioned names: partitions seen
        self._partitions_timer: asyncio.TimerHandle | None = None
        self._updating: asyncio.Task[None] | None = None

    def new_id(self) -> int:
        """A producer or consumer id, unique in the client."""
        return next(self._ids)

    @property
    def topic(self) -> str:
        if self.pattern is not None:
            return self.pattern.pattern
        return self.names[0] if len(self.names) == 1 else ",".join(self.names)

    # -- start and discovery ---------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the topics and subscribe to every one (nothing stays subscribed on error)."""
        concrete: list[str] = []
        for name in self.names:
            partitions = await self.transport.partitioned_metadata(name)
            if partitions > 0:
                concrete += [f"{name}-partition-{i}" for i in range(partitions)]
                self._partitioned = len(self.names) == 1
                self._partition_counts[name] = partitions
            else:
                concrete.append(name)
        if self.pattern is not None:
            concrete += await self._matching_topics()
        if self.config.receiver_queue_size == 0 and \
                (len(concrete) != 1 or self.pattern is not None):
            raise InvalidConfiguration(
                f"receiver_queue_size=0 needs one non-partitioned topic, and {self.topic} "
                f"{'is a pattern' if self.pattern is not None else f'has {len(concrete)}'}")
        try:
            await self._add(concrete, len(concrete))
        except BaseException:
            await self.close()
            raise
        if self.pattern is not None:
            self._arm_discovery()
        self._arm_partitions_update()

    async def _add(self, topics: list[str], count: int) -> None:
        queue = self.config.receiver_queue_size
        if count > 1:
            queue = min(queue, RECEIVER_QUEUE_ACROSS_PARTITIONS_MAX // count)
        added = [TopicConsumer(self, self.transport, next(self._ids), topic, _partition_of(topic),
                               self.config, queue) for topic in topics]
        for child in added:
            self.children[child.topic] = child
        results = await asyncio.gather(*(child.subscribe() for child in added),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for child, result in zip(added, results, strict=True):
            if isinstance(result, BaseException):  # not subscribed: a later look tries again
                del self.children[child.topic]
                child.closed = True
        if errors:
            raise errors[0]

    async def _matching_topics(self) -> list[str]:
        assert self.pattern is not None
        text = self.pattern.pattern
        bare = text.split("://", 1)[-1]
        namespace = "/".join(bare.split("/")[:2])
        found = await self.transport.topics_of_namespace(namespace, self.regex_mode)
        keep = []
        for topic in found:
            candidate = topic if "://" in text else topic.split("://", 1)[-1]
            if self.pattern.fullmatch(candidate) and topic not in self.children:
                keep.append(topic)
        return keep

    def _arm_discovery(self) -> None:
        if not self.closed:
            self._discovery = asyncio.get_running_loop().call_later(
                self.discovery_period_s, lambda: asyncio.ensure_future(self._discover()))

    async def _discover(self) -> None:
        try:
            new = await self._matching_topics()
            if new:
                await self._add(new, len(self.children) + len(new))
        except Exception as exc:  # try again next period
            log.warning("topic discovery for %s failed: %s", self.topic, exc)
        self._arm_discovery()

    def _arm_partitions_update(self) -> None:
        if self._partition_counts and self.partitions_update_interval_s > 0 and \
                not self.closed:
            self._partitions_timer = asyncio.get_running_loop().call_later(
                self.partitions_update_interval_s, self._start_partitions_update)

    def _start_partitions_update(self) -> None:
        self._updating = asyncio.ensure_future(self._update_partitions())

    async def _update_partitions(self) -> None:
        """Subscribe to the partitions added to the partitioned topics since the last look
        (a failure is logged, and tried again next period)."""
        try:
            for name, known in list(self._partition_counts.items()):
                count = await self.transport.partitioned_metadata(name)
                if count > known and not self.closed:
                    log.info("%s grew from %d to %d partitions", name, known, count)
                    new = [f"{name}-partition-{i}" for i in range(known, count)]
                    new = [topic for topic in new if topic not in self.children]
                    await self._add(new, len(self.children) + len(new))
                    self._partition_counts[name] = count
        except Exception as exc:
            log.warning("partition update of %s failed: %s", self.topic, exc)
        self._arm_partitions_update()

    # -- the queue -------------------------------------------------------------------------

    def enqueue(self, messages: list[Message]) -> None:
        """Messages of one consumer, in order: queued, for the waiting receives at the end of
        this turn of the loop (`_serve`; at once without a receiver queue)."""
        self._queue.extend(messages)
        if self._waiters and not self._serving:
            if self.config.receiver_queue_size == 0:
                self._serve()
                return
            self._serving = True
            asyncio.get_running_loop().call_soon(self._serve)

    def _serve(self) -> None:
        """Queued messages to the waiting receives, oldest first: a synchronous receive takes a
        run of them (up to its `most`), an asynchronous one a message."""
        self._serving = False
        queue, waiters = self._queue, self._waiters
        while queue:
            while waiters and waiters[0].done():
                waiters.popleft()
            if not waiters:
                return
            waiter = waiters.popleft()
            if isinstance(waiter, Handoff):
                waiter.give(self._take_some(waiter.most))
                continue
            message = queue.popleft()
            message.owner.taken([message])
            waiter.set_result(message)

    def waiting(self) -> bool:
        """Whether a receive waits and nothing is queued for it."""
        return not self._queue and any(not waiter.done() for waiter in self._waiters)

    def drop_queued(self, child: TopicConsumer) -> int:
        """Drop `child`'s queued messages; returns how many."""
        kept = deque(m for m in self._queue if m.owner is not child)
        dropped = len(self._queue) - len(kept)
        self._queue = kept
        return dropped

    def queued_for(self, child: TopicConsumer) -> bool:
        return any(m.owner is child for m in self._queue)

    async def receive(self, timeout_ms: int | None = None) -> Message:
        """The next message, waiting up to `timeout_ms` (None: forever).

        Raises:
            Timeout: nothing arrived in time. AlreadyClosed: the consumer is closed.
        """
        self._check_open()
        if self._queue and not self._serving:
            message = self._queue.popleft()
            message.owner.taken([message])
            return message
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Message] = loop.create_future()
        self._waiters.append(waiter)
        if self.config.receiver_queue_size == 0:
            for child in self.children.values():
                child.ask_one()
        timer = None
        if timeout_ms is not None:
            timer = loop.call_later(max(0, timeout_ms) / 1000, self._time_out, waiter, timeout_ms)
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._queue.appendleft(waiter.result())  # taken, then cancelled: put back
            elif not waiter.done():
                waiter.cancel()
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def receive_some(self, timeout_ms: int | None,
                           most: int) -> list[tuple[Message, int]]:
        """The next message (waiting as `receive` does) and up to `most - 1` more already
        queued, each with its consumer's generation when it arrived (for a caller's read-ahead,
        see `Received.generation`; each counts as taken now)."""
        self._check_open()
        out: list[Message] = []
        if not self._queue or self._serving:
            out.append(await self.receive(timeout_ms))
        out += self._take_some(most - len(out))
        return [(message, message.received.generation) for message in out]

    def hand_over(self, waiter: Handoff, timeout_ms: int | None) -> None:
        """A synchronous receive (`Handoff`, see there): up to `waiter.most` queued messages
        now, or the first that arrive within `timeout_ms` (None: no limit)."""
        if waiter.done():
            return  # failed already (the loop thread's end)
        if self.closed:
            waiter.set_exception(AlreadyClosed(f"consumer {self.config.subscription!r} on "
                                               f"{self.topic} is closed"))
            return
        if self._queue and not self._serving:
            waiter.give(self._take_some(waiter.most))
            return
        self._waiters.append(waiter)
        if self.config.receiver_queue_size == 0:
            for child in self.children.values():
                child.ask_one()
        if timeout_ms is not None:
            waiter.timer = asyncio.get_running_loop().call_later(
                max(0, timeout_ms) / 1000, self._time_out, waiter, timeout_ms)

    def abandon(self, waiter: Handoff) -> None:
        """The caller stopped waiting (interrupted): what it was given is queued again, first."""
        waiter.abandoned = True
        if not waiter.done():
            waiter.set_exception(AlreadyClosed("the receive was interrupted"))
            return
        self._queue.extendleft(reversed(waiter.taken_back()))

    def _take_some(self, most: int) -> list[Message]:
        """Up to `most` queued messages, taken now."""
        queue = self._queue
        if len(self.children) == 1:  # one consumer (one topic): its messages in one call
            out = [queue.popleft() for _ in range(min(most, len(queue)))]
            if out:
                out[0]._entry.owner.taken(out)
            return out
        out = []
        run: list[Message] = []  # consecutive messages of one consumer: told in one call
        owner: TopicConsumer | None = None
        for _ in range(min(most, len(queue))):
            message = queue.popleft()
            current = message._entry.owner  # `Message.owner`, inline (once per message)
            if current is not owner:
                if owner is not None:
                    owner.taken(run)
                owner, run = current, []
            run.append(message)
            out.append(message)
        if owner is not None:
            owner.taken(run)
        return out

    async def batch_receive(self, max_messages: int, max_bytes: int,
                            timeout_ms: int) -> list[Message]:
        """Messages until `max_messages` (<= 0: no limit) or `max_bytes` (<= 0: no limit) is
        reached, or `timeout_ms` passed (then what arrived, possibly nothing)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, timeout_ms) / 1000
        batch: list[Message] = []
        size = 0
        while (max_messages <= 0 or len(batch) < max_messages) and \
                (max_bytes <= 0 or size < max_bytes):
            remaining_ms = int((deadline - loop.time()) * 1000)
            if remaining_ms <= 0 and not self._queue:
                break
            try:
                message = await self.receive(max(0, remaining_ms))
            except Timeout:
                break
            batch.append(message)
            size += len(message.data())
        return batch

    def _time_out(self, waiter: asyncio.Future[Message] | Handoff, timeout_ms: int) -> None:
        if not waiter.done():
            waiter.set_exception(Timeout(f"no message on {self.topic} within {timeout_ms} ms"))

    def _check_open(self) -> None:
        if self.closed:
            raise AlreadyClosed(f"consumer {self.config.subscription!r} on {self.topic} "
                                f"is closed")

    # -- acks ------------------------------------------------------------------------------

    def _owner(self, target: Message | MessageId | ClientMessageId,
               ) -> tuple[TopicConsumer, MessageId, tuple[MessageId, ...]]:
        self._check_open()
        target = codec_id(target)
        if isinstance(target, Message):
            owner = target.owner
            if not isinstance(owner, TopicConsumer) or owner.group is not self:
                raise OperationNotSupported(f"message {target.codec_id} was not received "
                                            f"by this consumer on {self.topic}")
            return owner, target.codec_id, target.chunk_ids
        if not isinstance(target, MessageId):
            raise InvalidConfiguration(f"expected a Message or a MessageId, not {target!r}")
        if len(self.children) == 1:
            return next(iter(self.children.values())), target, ()
        if self._partitioned and target.partition >= 0:
            for child in self.children.values():
                if child.partition == target.partition:
                    return child, target, ()
        raise OperationNotSupported(f"cannot tell which topic of {self.topic} message id "
                                    f"{target} belongs to: acknowledge the Message instead")

    def acknowledge(self, target: Message | MessageId | ClientMessageId) -> None:
        if type(target) is Message and not self.closed:  # the hot path: a received message
            owner = target.owner
            if type(owner) is TopicConsumer and owner.group is self:
                owner.acknowledge_message(target)
                return
        owner, message_id, chunks = self._owner(target)
        owner.acknowledge(message_id, chunks)

    def acknowledge_run(self, messages: list[Message]) -> None:
        """Acknowledge received messages that share one delivered entry (`Message.received`),
        as one call (the synchronous API's queued acks, see `_client.Consumer._apply_acks`)."""
        first = messages[0]
        owner = first.owner
        if len(messages) > 1 and not self.closed and type(owner) is TopicConsumer and \
                owner.group is self:
            owner.acknowledge_entry(first.received, batch_indexes(messages))
            return
        for message in messages:
            self.acknowledge(message)

    def acknowledge_cumulative(self, target: Message | MessageId | ClientMessageId) -> None:
        if self.config.redelivers_by_id:
            raise CumulativeAcknowledgementNotAllowedError(
                f"cumulative acks are not allowed on {self.config.sub_type} subscription "
                f"{self.config.subscription!r} of {self.topic}")
        owner, message_id, _ = self._owner(target)
        owner.acknowledge_cumulative(message_id)

    def negative_acknowledge(self, target: Message | MessageId | ClientMessageId) -> None:
        owner, message_id, chunks = self._owner(target)
        for chunk in chunks[:-1]:
            owner.negative_acknowledge(chunk)
        owner.negative_acknowledge(message_id)

    async def redeliver_unacknowledged_messages(self) -> None:
        self._check_open()
        await asyncio.gather(*(c.redeliver_all() for c in self.children.values()))

    # -- seek, last id, close --------------------------------------------------------------

    async def seek(self, target: MessageId | ClientMessageId | int, timeout_s: float) -> None:
        self._check_open()
        target = codec_id(target)
        self._queue.clear()
        await asyncio.gather(*(c.seek(target, timeout_s) for c in self.children.values()))

    def only_child(self, what: str) -> TopicConsumer:
        if len(self.children) != 1:
            raise OperationNotSupported(f"{what} needs a single-topic consumer, and "
                                        f"{self.topic} has {len(self.children)} topics")
        return next(iter(self.children.values()))

    async def has_message_available(self) -> bool:
        self._check_open()
        if self._queue:
            return True
        answers = await asyncio.gather(*(_has_more(c) for c in self.children.values()))
        return any(answers)

    async def reconsume_later(self, message: Message, delay_ms: int,
                              properties: dict[str, str]) -> None:
        """Copy `message` to the retry topic (or, past the maximum, the dead-letter topic),
        then acknowledge it and send that ack (see `_retry.py`).

        Raises:
            OperationNotSupported: the consumer was not subscribed with retry_enable.
            PulsarException: the copy failed; the original stays unacknowledged.
        """
        owner, message_id, chunks = self._owner(message)
        if self.retry is None:
            raise OperationNotSupported(f"reconsume_later needs retry_enable=True when "
                                        f"subscribing to {self.topic}")
        await self.retry.publish(message, delay_ms, properties)
        owner.acknowledge(message_id, chunks)
        await owner.flush_acks(wait=True)

    async def unsubscribe(self) -> None:
        self._check_open()
        await asyncio.gather(*(c.unsubscribe() for c in self.children.values()))
        await self.close()

    async def close(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
        if self._partitions_timer is not None:
            self._partitions_timer.cancel()
        if self._updating is not None and self._updating is not asyncio.current_task():
            self._updating.cancel()
        already = self.closed
        self.closed = True
        try:
            if not already:
                for child in list(self.children.values()):
                    await child.close()
                if self.retry is not None:
                    await self.retry.close()
        finally:
            forget, self.on_closed = self.on_closed, None
            if forget is not None:
                forget()
        error = AlreadyClosed(f"consumer on {self.topic} was closed")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)
        self._queue.clear()


async def _has_more(child: TopicConsumer) -> bool:
    """Whether the broker holds a message after what `child` last handed out (readers)."""
    last, mark = await child.transport.last_message_id(child.consumer_id)
    if last.entry_id < 0:
        return False
    if child.group.queued_for(child):
        return True

    def key(m: MessageId) -> tuple[int, int, int]:
        return (m.ledger_id, m.entry_id, m.batch_index)

    reference = child.last_dequeued
    if reference is not None:
        return key(last) > key(reference)
    start = child.start_id
    if start is None or start.ledger_id == (1 << 63) - 1:  # latest (or a time seek)
        return mark is None or (last.ledger_id, last.entry_id) > (mark.ledger_id, mark.entry_id)
    if start.ledger_id < 0:  # earliest
        return True
    if child.config.start_inclusive:
        return key(last) >= key(start)
    return key(last) > key(start)


