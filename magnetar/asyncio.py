"""The asyncio API: the same client core, awaited from the application's own event loop.

    async with magnetar.asyncio.Client("./data") as client:
        producer = await client.create_producer("events")
        await producer.send(b"hello")
        consumer = await client.subscribe("events", "sub")
        async for message in consumer:
            await consumer.acknowledge(message)

The core still runs on the client's private loop thread (as for the synchronous API); each
await here waits for a coroutine submitted there, so the application's loop never blocks on the
broker, the disk or a lock. As in `pulsar.asyncio`, `create_producer` batches by default.
"""

from __future__ import annotations

import asyncio
import datetime
import re
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from magnetar.codec import MessageId as CodecMessageId

from ._core import ClientCore
from ._errors import AlreadyClosed
from ._facade import on_loop, seek_target, send_and_wait, start_client
from ._group import ConsumerGroup, complete_topic_name
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

if TYPE_CHECKING:
    from magnetar.broker import BrokerConfig

__all__ = ["Client", "Consumer", "Producer", "Reader"]

T = TypeVar("T")


class Client:
    """The asyncio client; construction starts connecting (or opening the data directory),
    and the first await waits for it. Errors surface there."""

    def __init__(self, service_url: str, *, broker_config: BrokerConfig | None = None,
                 **kwargs: Any):
        self.service_url = service_url
        self._settings, self._thread, self._opening = start_client(
            service_url, broker_config, kwargs, "magnetar-asyncio-client")
        self._core: ClientCore | None = None
        register_for_exit(self)

    async def _ready(self) -> ClientCore:
        if self._core is None:
            try:
                self._core = await asyncio.wrap_future(self._opening)
            except BaseException:
                unregister_for_exit(self)
                self._thread.stop()
                raise
        if self._core.closed:
            raise AlreadyClosed(f"the client of {self.service_url} is closed")
        return self._core

    async def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            await self._ready()
        except BaseException:
            coro.close()
            raise
        return await self._thread.wrap(coro)

    async def create_producer(self, topic: str, **kwargs: Any) -> Producer:
        kwargs.setdefault("batching_enabled", True)
        options = producer_options(topic, **kwargs)
        core = await self._ready()
        return Producer(self, await self._thread.wrap(core.create_producer(options)))

    async def subscribe(self, topic: str | list[str] | re.Pattern[str], subscription_name: str,
                        **kwargs: Any) -> Consumer:
        options = consumer_options(topic, subscription_name, **kwargs)
        core = await self._ready()
        return Consumer(self, await self._thread.wrap(core.subscribe(options)))

    async def create_reader(self, topic: str, start_message_id: MessageId | CodecMessageId,
                            **kwargs: Any) -> Reader:
        options = reader_options(topic, start_message_id, **kwargs)
        core = await self._ready()
        return Reader(self, await self._thread.wrap(core.subscribe(options)))

    async def get_topic_partitions(self, topic: str) -> list[str]:
        core = await self._ready()
        return await self._thread.wrap(core.partitions(complete_topic_name(topic)))

    async def close(self) -> None:
        """Close everything this client opened; for a data directory, the broker too."""
        unregister_for_exit(self)
        core = await self._ready()
        try:
            await self._thread.wrap(core.close())
        finally:
            await asyncio.to_thread(self._thread.stop)

    def close_for_exit(self, timeout_s: float) -> None:
        if not self._thread.alive:
            return
        try:
            if self._opening.done() and self._opening.exception() is None:
                core = self._opening.result()
                if not core.closed:
                    self._thread.run(core.close(), timeout_s)
        finally:
            self._thread.stop()

    async def __aenter__(self) -> Client:
        await self._ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Producer:
    def __init__(self, client: Client, core: ProducerSet):
        self._client = client
        self._core = core

    def topic(self) -> str:
        return self._core.topic

    def producer_name(self) -> str:
        return self._core.producer_name

    def last_sequence_id(self) -> int:
        return self._core.last_sequence_id

    async def send(self, content: bytes | None, **kwargs: Any) -> MessageId:
        """Send and wait until the broker stored the message."""
        return await self._client._run(send_and_wait(self._core, out_message(content, **kwargs)))

    async def flush(self) -> None:
        await self._client._run(self._core.flush())

    async def close(self) -> None:
        await self._client._run(self._core.close())


class Consumer:
    def __init__(self, client: Client, group: ConsumerGroup):
        self._client = client
        self._group = group

    def topic(self) -> str:
        return self._group.topic

    def subscription_name(self) -> str:
        return self._group.config.subscription

    async def receive(self, timeout_millis: int | None = None) -> Message:
        return await self._client._run(self._group.receive(timeout_millis))

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        while True:
            try:
                yield await self.receive()
            except AlreadyClosed:
                return

    async def acknowledge(self, message: Message | MessageId | CodecMessageId,
                  ) -> None:
        await self._client._run(on_loop(self._group.acknowledge, message))

    async def acknowledge_cumulative(self, message: Message | MessageId | CodecMessageId,
                  ) -> None:
        await self._client._run(on_loop(self._group.acknowledge_cumulative, message))

    async def negative_acknowledge(self, message: Message | MessageId | CodecMessageId,
                  ) -> None:
        await self._client._run(on_loop(self._group.negative_acknowledge, message))

    async def redeliver_unacknowledged_messages(self) -> None:
        await self._client._run(self._group.redeliver_unacknowledged_messages())

    async def reconsume_later(self, message: Message, delay: int | datetime.timedelta,
                              properties: dict[str, str] | None = None) -> None:
        """See `magnetar.Consumer.reconsume_later`."""
        await self._client._run(self._group.reconsume_later(
            message, delay_ms(delay), check_properties(properties)))

    async def seek(self, target: MessageId | CodecMessageId | int) -> None:
        await self._client._run(self._group.seek(seek_target(target),
                                                 self._client._settings.operation_timeout_s))

    async def get_last_message_id(self) -> MessageId:
        child = self._group.only_child("get_last_message_id")
        last, _ = await self._client._run(child.transport.last_message_id(child.consumer_id))
        return MessageId.wrap(last)

    async def unsubscribe(self) -> None:
        await self._client._run(self._group.unsubscribe())

    async def close(self) -> None:
        await self._client._run(self._group.close())


class Reader:
    def __init__(self, client: Client, group: ConsumerGroup):
        self._client = client
        self._group = group

    def topic(self) -> str:
        return self._group.topic

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        return await self._client._run(self._group.receive(timeout_millis))

    async def has_message_available(self) -> bool:
        return await self._client._run(self._group.has_message_available())

    async def seek(self, target: MessageId | CodecMessageId | int) -> None:
        await self._client._run(self._group.seek(seek_target(target),
                                                 self._client._settings.operation_timeout_s))

    async def close(self) -> None:
        await self._client._run(self._group.close())


