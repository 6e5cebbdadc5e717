"""The synchronous API: `Client`, `Producer`, `Consumer`, `Reader`, shaped like the official
`pulsar` client's.

Each object is a thin handle: every call checks its arguments here (`_options.py`), then runs
the matching coroutine of the core on the client's loop thread (`LoopThread.run`) and waits for
it -- except on the hot paths, where a round trip per message would cost more than the work:
`send_async` queues to the loop without waiting (`_sender.py`), `acknowledge(message)` is
queued the same way, and `receive` reads ahead (one round trip brings up to `READ_AHEAD_MAX`
queued messages). `send_async`'s callbacks run on the loop thread, so they must not block.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import datetime
import logging
import re
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from magnetar.codec import MessageId as CodecMessageId

from ._errors import AlreadyClosed, InvalidConfiguration, PulsarException
from ._facade import on_loop, seek_target, start_client
from ._group import ConsumerGroup
from ._handoff import Handoff
from ._loop import register_for_exit, unregister_for_exit
from ._message import Message
from ._message_id import MessageId
from ._options import (
    check_properties,
    consumer_options,
    delay_ms,
    out_message,
    producer_options,
    reader_options,
)
from ._routing import ProducerSet
from ._sender import AsyncSender, SendCallback, SendWaiter

if TYPE_CHECKING:
    from magnetar.broker import BrokerConfig

__all__ = ["Client", "Consumer", "ConsumerBatchReceivePolicy", "Producer", "Reader",
           "SendCallback"]

log = logging.getLogger(__name__)

READ_AHEAD_MAX = 1000  # messages one receive() round trip may bring to the caller's thread
ACK_DRAIN_S = 0.01  # acks queued after a receive reach the loop at most this late (no wake)

T = TypeVar("T")


class Client:
    """A client: `Client("pulsar://host:6650")` over TCP, or `Client("./data")` /
    `Client("file:///abs/data")` with the broker in this process on that data directory.
    Keyword arguments as the official client's, plus `partitions_update_interval_seconds`
    (default 60, 0: never; the C++ client's `partitionsUpdateInterval`): how often
    producers and consumers of partitioned topics look for added partitions.

    Raises:
        InvalidUrl: the service URL is not usable. ConnectError: the broker cannot be
            reached, or the data directory is locked by another process.
        InvalidConfiguration: a bad argument, or a data directory that is not one.
    """

    def __init__(self, service_url: str, *, broker_config: BrokerConfig | None = None,
                 **kwargs: Any):
        self.service_url = service_url
        self._settings, self._thread, opening = start_client(service_url, broker_config, kwargs,
                                                             "magnetar-client")
        self._listeners: concurrent.futures.ThreadPoolExecutor | None = None
        try:
            self._core = opening.result()
        except BaseException:
            self._thread.stop()
            raise
        register_for_exit(self)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._core.closed:
            coro.close()
            raise AlreadyClosed(f"the client of {self.service_url} is closed")
        return self._thread.run(coro)

    def create_producer(self, topic: str, **kwargs: Any) -> Producer:
        """A producer; arguments as the official client's `create_producer`."""
        options = producer_options(topic, **kwargs)
        core = self._run(self._core.create_producer(options))
        config = options.config
        slots = min(config.max_pending_messages * len(core.cores),
                    max(config.max_pending_messages, options.pending_across_partitions))
        return Producer(self, core, slots, config.block_if_queue_full)

    def subscribe(self, topic: str | list[str] | re.Pattern[str], subscription_name: str,
                  **kwargs: Any) -> Consumer:
        """A consumer; arguments as the official client's `subscribe`. With a
        `message_listener(consumer, message)`, messages go to it on the client's listener
        thread, one at a time, and `receive` is not to be used."""
        listener = kwargs.pop("message_listener", None)
        if listener is not None and not callable(listener):
            raise InvalidConfiguration("message_listener must be callable(consumer, message)")
        batch_policy = kwargs.pop("batch_receive_policy", None)
        if batch_policy is not None and not isinstance(batch_policy, ConsumerBatchReceivePolicy):
            raise InvalidConfiguration("batch_receive_policy must be a "
                                       "ConsumerBatchReceivePolicy")
        options = consumer_options(topic, subscription_name, **kwargs)
        consumer = Consumer(self, self._run(self._core.subscribe(options)), batch_policy)
        if listener is not None:
            consumer._listening = _Listening(consumer, listener, self._listener_pool())
            self._run(on_loop(_Listening.start, consumer._listening))
        return consumer

    def _listener_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._listeners is None:
            self._listeners = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="magnetar-listener")
        return self._listeners

    def create_reader(self, topic: str, start_message_id: MessageId | CodecMessageId,
                      **kwargs: Any) -> Reader:
        """A reader from `start_message_id` (exclusive unless start_message_id_inclusive)."""
        options = reader_options(topic, start_message_id, **kwargs)
        return Reader(self, self._run(self._core.subscribe(options)))

    def get_topic_partitions(self, topic: str) -> list[str]:
        from ._group import complete_topic_name

        return self._run(self._core.partitions(complete_topic_name(topic)))

    def close(self) -> None:
        """Close everything this client opened; for a data directory, the broker too."""
        self._close(None)

    def shutdown(self) -> None:
        """Close at once: as `close`, but nothing pending is flushed (it fails with
        AlreadyClosed), as the official client's `shutdown`."""
        self._close(None, immediate=True)

    def close_for_exit(self, timeout_s: float) -> None:
        self._close(timeout_s)

    def _close(self, timeout_s: float | None, immediate: bool = False) -> None:
        unregister_for_exit(self)
        if not self._thread.alive:
            return
        try:
            if not self._core.closed:
                self._thread.run(self._core.close(immediate), timeout_s)
        finally:
            self._thread.stop()
            if self._listeners is not None:
                self._listeners.shutdown(wait=False)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Producer:
    """A producer (see `Client.create_producer`)."""

    def __init__(self, client: Client, core: ProducerSet, slots: int, block: bool):
        self._client = client
        self._core = core
        self._sender = AsyncSender(client._thread, core, slots, block)

    def topic(self) -> str:
        return self._core.topic

    def producer_name(self) -> str:
        return self._core.producer_name

    def last_sequence_id(self) -> int:
        return self._core.last_sequence_id

    def is_connected(self) -> bool:
        return not self._core.closed and not self._client._core.closed

    def send(self, content: bytes | None, **kwargs: Any) -> MessageId:
        """Send and wait until the broker stored it; arguments as the official `send`.

        The message goes the way `send_async`'s do (in order with them), and the caller waits
        for its outcome.

        Raises:
            PulsarException: the send failed (`Timeout`, `MessageTooBig`, ...).
            RuntimeError: called from a callback on the client's own thread."""
        message = content if not kwargs and type(content) is bytes else \
            out_message(content, **kwargs)  # bare bytes: a plain message (`Queued`)
        if self._client._core.closed:
            raise AlreadyClosed(f"the client of {self._client.service_url} is closed")
        if self._client._thread.on_loop():
            raise RuntimeError("a blocking magnetar call was made from the client's own loop "
                               "(a callback); use send_async or the asyncio API there")
        waiter = SendWaiter()
        self._sender.send_async(message, waiter)
        return MessageId.wrap(waiter.wait())

    def send_async(self, content: bytes | None, callback: SendCallback | None,
                   **kwargs: Any) -> None:
        """Queue a message and return; `callback(result, message_id)` runs on the client's
        thread once the broker answered (`Result.Ok`, and the id) or the message was refused
        (the failure's `Result`, and None), as in the official client.
        Blocks only while the queue is full and `block_if_queue_full` is set.

        Raises:
            ProducerQueueIsFull: the queue is full and blocking is off.
            AlreadyClosed: the client is closed."""
        message = content if not kwargs and type(content) is bytes else \
            out_message(content, **kwargs)  # bare bytes: a plain message (`Queued`)
        if self._client._core.closed:
            raise AlreadyClosed(f"the client of {self._client.service_url} is closed")
        self._sender.send_async(message, callback)

    def flush(self) -> None:
        self._client._run(_after(self._sender.idle(), self._core.flush()))

    def close(self) -> None:
        self._client._run(_after(self._sender.idle(), self._core.close()))

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _after(first: Coroutine[Any, Any, None], then: Coroutine[Any, Any, None]) -> None:
    await first
    await then


class Consumer:
    """A consumer (see `Client.subscribe`)."""

    def __init__(self, client: Client, group: ConsumerGroup,
                 batch_policy: ConsumerBatchReceivePolicy | None = None):
        self._client = client
        self._group = group
        self._batch_policy = batch_policy or ConsumerBatchReceivePolicy()
        self._listening: _Listening | None = None
        self._local: collections.deque[Message] = collections.deque()
        self._acks: collections.deque[Message] = collections.deque()  # to hand to the loop
        self._acks_scheduled = False
        self._read_ahead = max(1, min(READ_AHEAD_MAX, group.config.receiver_queue_size // 2))

    def topic(self) -> str:
        return self._group.topic

    def subscription_name(self) -> str:
        return self._group.config.subscription

    def consumer_name(self) -> str:
        return self._group.config.consumer_name

    def is_connected(self) -> bool:
        return not self._group.closed and not self._client._core.closed

    def receive(self, timeout_millis: int | None = None) -> Message:
        """The next message; raises `Timeout` after `timeout_millis`.

        Read-ahead: one hand-off to the loop (`Handoff`) brings the next message and up to
        `READ_AHEAD_MAX - 1` more already queued; later calls take those without a hand-off.
        A message whose consumer was closed by the broker or redelivered everything since
        (its generation moved) is dropped here: the broker sends it again."""
        if self._group.closed:
            raise AlreadyClosed(f"consumer {self.subscription_name()!r} on {self.topic()} is "
                                f"closed")
        message = self._next_read_ahead()
        if message is not None:
            return message
        client = self._client
        if client._core.closed:
            raise AlreadyClosed(f"the client of {client.service_url} is closed")
        thread = client._thread
        if thread.on_loop():
            raise RuntimeError("a blocking magnetar call was made from the client's own loop "
                               "(a callback); use the asyncio API there")
        waiter = Handoff(self._read_ahead)
        thread.call_for(waiter, lambda: self._hand_over(waiter, timeout_millis))
        try:
            batch = waiter.wait()
        except BaseException as exc:
            if not isinstance(exc, PulsarException):  # interrupted: its messages go back
                thread.call(lambda: self._group.abandon(waiter))
            raise
        finally:
            thread.forget_waiter(waiter)
        if len(batch) > 1:
            self._local.extend(batch[1:])
        return batch[0]

    def _hand_over(self, waiter: Handoff, timeout_ms: int | None) -> None:
        """On the loop: the acks queued so far, then the receive (`ConsumerGroup.hand_over`).
        Acks that follow the messages handed out now are drained by the next hand-off or by
        `ACK_DRAIN_S` from now, without a thread switch each (see `acknowledge`)."""
        self._apply_acks()
        self._group.hand_over(waiter, timeout_ms)
        if not self._acks_scheduled:
            self._acks_scheduled = True
            asyncio.get_running_loop().call_later(ACK_DRAIN_S, self._drain_acks)

    def _next_read_ahead(self) -> Message | None:
        local = self._local
        while local:
            try:
                message = local.popleft()
            except IndexError:  # another thread took the last one
                return None
            entry = message._entry  # stale when its consumer's generation moved since
            if entry.owner.generation == entry.generation:
                return message
        return None

    def batch_receive(self) -> list[Message]:
        """Messages up to the batch receive policy's limits (what arrived by its timeout)."""
        policy = self._batch_policy
        taken: list[Message] = []
        while policy.max_num_message <= 0 or len(taken) < policy.max_num_message:
            message = self._next_read_ahead()
            if message is None:
                break
            taken.append(message)
        if policy.max_num_message > 0 and len(taken) >= policy.max_num_message:
            return taken
        rest = policy.max_num_message - len(taken) if policy.max_num_message > 0 else 0
        size = policy.max_num_bytes - sum(len(m.data()) for m in taken) \
            if policy.max_num_bytes > 0 else 0
        if policy.max_num_bytes > 0 and size <= 0:
            return taken
        return taken + self._run(self._group.batch_receive(
            rest, size, policy.timeout_ms))

    def acknowledge(self, message: Message | MessageId | CodecMessageId) -> None:
        """Acknowledge a message (or a message id). A Message's ack is queued for the loop
        without waiting for it (acks are grouped there anyway): it wakes the loop only when no
        drain is due already (`_hand_over` arms one); an id is resolved first."""
        group = self._group
        if isinstance(message, Message) and \
                getattr(message._entry.owner, "group", None) is group:  # `owner`, inline
            if group.closed or self._client._core.closed:
                raise AlreadyClosed(f"consumer on {group.topic} is closed")
            self._acks.append(message)
            if not self._acks_scheduled:  # one hand-off per burst (see `_drain_acks`)
                self._acks_scheduled = True
                self._client._thread.call(self._drain_acks)
            return
        self._run(on_loop(group.acknowledge, message))

    def _drain_acks(self) -> None:
        """Apply the queued acks (on the loop). The flag drops before the deque is read, so an
        ack appended after the last read schedules another drain; order is kept."""
        self._acks_scheduled = False
        self._apply_acks()

    def _apply_acks(self) -> None:
        """Apply the queued acks now (on the loop; a drain still due finds fewer or none), a
        run of messages of one delivered entry (a batch) in one call."""
        acks = self._acks
        while acks:
            run = [acks.popleft()]
            entry = run[0]._entry  # `Message.received`, inline (once per message)
            while acks and acks[0]._entry is entry:
                run.append(acks.popleft())
            try:
                self._group.acknowledge_run(run)
            except PulsarException as exc:  # closed meanwhile: the broker redelivers them
                log.debug("ack of %s on %s dropped: %s", run[0], self._group.topic, exc)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a consumer operation on the loop after the acks queued before it."""
        return self._client._run(_after_acks(self, coro))

    def acknowledge_cumulative(self, message: Message | MessageId | CodecMessageId,
                               ) -> None:
        self._run(on_loop(self._group.acknowledge_cumulative, message))

    def negative_acknowledge(self, message: Message | MessageId | CodecMessageId,
                             ) -> None:
        self._run(on_loop(self._group.negative_acknowledge, message))

    def pause_message_listener(self) -> None:
        """Stop handing messages to the message listener (a call in progress finishes, and
        none starts after this returns); messages wait in the receiver queue, which asks the
        broker for no more once full.

        Raises:
            InvalidConfiguration: the consumer has no message listener."""
        self._run(self._listener("pause_message_listener").pause())

    def resume_message_listener(self) -> None:
        """Hand messages to the message listener again (queued ones first).

        Raises:
            InvalidConfiguration: the consumer has no message listener."""
        self._run(self._listener("resume_message_listener").resume())

    def _listener(self, what: str) -> _Listening:
        if self._listening is None:
            raise InvalidConfiguration(f"{what}: consumer {self.subscription_name()!r} on "
                                       f"{self.topic()} has no message listener")
        return self._listening

    def redeliver_unacknowledged_messages(self) -> None:
        self._local.clear()
        self._run(self._group.redeliver_unacknowledged_messages())

    def reconsume_later(self, message: Message, delay: int | datetime.timedelta,
                        properties: dict[str, str] | None = None) -> None:
        """Deliver `message` again after `delay` (ms or a timedelta) through the retry topic;
        past the maximum it goes to the dead-letter topic. Needs `retry_enable=True`."""
        self._run(self._group.reconsume_later(
            message, delay_ms(delay), check_properties(properties)))

    def seek(self, target: MessageId | CodecMessageId | int) -> None:
        """Move the subscription to a message id or a publish time (ms since the epoch)."""
        target = seek_target(target)
        self._local.clear()
        self._run(self._group.seek(target, self._client._settings.operation_timeout_s))

    def get_last_message_id(self) -> MessageId:
        child = self._group.only_child("get_last_message_id")
        return MessageId.wrap(
            self._run(child.transport.last_message_id(child.consumer_id))[0])

    def unsubscribe(self) -> None:
        self._run(self._group.unsubscribe())

    def close(self) -> None:
        self._run(self._group.close())

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Reader:
    """A reader (see `Client.create_reader`)."""

    def __init__(self, client: Client, group: ConsumerGroup):
        self._client = client
        self._group = group
        # A reader receives as a consumer does: one hand-off to the loop brings the next
        # message and the ones already queued behind it (`Consumer.receive`'s read-ahead).
        self._receiver = Consumer(client, group)

    def topic(self) -> str:
        return self._group.topic

    def is_connected(self) -> bool:
        return not self._group.closed and not self._client._core.closed

    def read_next(self, timeout_millis: int | None = None) -> Message:
        return self._receiver.receive(timeout_millis)

    def has_message_available(self) -> bool:
        """True while messages read ahead wait here, else as the broker and the loop say."""
        if self._receiver._local:
            return True
        return self._client._run(self._group.has_message_available())

    def seek(self, target: MessageId | CodecMessageId | int) -> None:
        self._receiver.seek(target)

    def close(self) -> None:
        self._receiver._local.clear()
        self._client._run(self._group.close())

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ConsumerBatchReceivePolicy:
    """The official client's batch receive policy: `batch_receive` returns at
    `max_num_message` messages, `max_num_bytes` bytes, or after `timeout_ms`, whichever comes
    first (non-positive limits are off; one must be on)."""

    def __init__(self, max_num_message: int = -1, max_num_bytes: int = 10 * 1024 * 1024,
                 timeout_ms: int = 100):
        if max_num_message <= 0 and max_num_bytes <= 0 and timeout_ms <= 0:
            raise InvalidConfiguration("at least one of max_num_message, max_num_bytes and "
                                       "timeout_ms must be positive")
        self.max_num_message = max_num_message
        self.max_num_bytes = max_num_bytes
        self.timeout_ms = timeout_ms


class _Listening:
    """A consumer's message listener: the task handing it messages, which a pause cancels
    (a message it took back goes back to the head of the queue) and a resume starts again.
    Loop only."""

    def __init__(self, consumer: Consumer, listener: Callable[[Consumer, Message], None],
                 pool: concurrent.futures.Executor):
        self.consumer = consumer
        self.listener = listener
        self.pool = pool
        self.task: asyncio.Task[None] | None = None
        self.paused = False

    def start(self) -> None:
        self.task = asyncio.ensure_future(_listen(self.consumer, self.listener, self.pool))

    async def pause(self) -> None:
        self.paused = True
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.start()


async def _listen(consumer: Consumer, listener: Callable[[Consumer, Message], None],
                  pool: concurrent.futures.Executor) -> None:
    """Hand each message to `listener` on the listener thread, one at a time, until the
    consumer closes. A listener's exception is logged, and the next message follows."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            message = await consumer._group.receive()
        except AlreadyClosed:
            return
        await loop.run_in_executor(pool, _call_listener, listener, consumer, message)


def _call_listener(listener: Callable[[Consumer, Message], None], consumer: Consumer,
                   message: Message) -> None:
    try:
        listener(consumer, message)
    except Exception:
        log.exception("the message listener of %s failed on %s", consumer.topic(), message)


async def _after_acks(consumer: Consumer, coro: Coroutine[Any, Any, T]) -> T:
    consumer._apply_acks()
    return await coro


