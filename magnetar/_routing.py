"""`ProducerSet`: the application's producer -- one `ProducerCore` per partition, and routing.

Theory of operation
-------------------
At start the topic's partitioned metadata decides: 0 partitions means one producer on the
topic itself; N means one producer per `<topic>-partition-<i>`, all created before `start`
returns (a failure closes those already created). Each message then goes to one partition:

* a message with a partition key: `boost_hash(key) mod N`, whatever the mode (the official
  Python client's hashing, so keyed messages land where its producers put them);
* `CustomPartition`: the application's `message_router(message, N)`;
* `UseSinglePartition`: one partition chosen at random when the producer starts;
* `RoundRobinDistribution`: without batching the next partition per message, starting at a
  random one; with batching it stays on a partition until a batch's worth of messages
  (`batching_max_messages`) went there or `batching_max_publish_delay_ms` passed, so batches
  stay full (the C++ client's rule).

`last_sequence_id` is the highest over the partitions; the producer name is the first
partition's.

A partitioned topic's partition count is looked up again every `partitions_update_interval_s`
(as the official clients do); producers for the partitions added meanwhile are created and
join the routing (a failure is logged and tried again next period).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from magnetar.codec import MessageId, boost_hash

from ._enums import PartitionsRoutingMode
from ._errors import InvalidConfiguration
from ._message import Message
from ._producer import OutMessage, ProducerConfig, ProducerCore, ResultSink
from ._transport import Transport

__all__ = ["MessageRouter", "ProducerSet"]

MessageRouter = Callable[[Message, int], int]

log = logging.getLogger(__name__)


class ProducerSet:
    """The producer of one topic, partitioned or not (see the module comment)."""

    def __init__(self, transport: Transport, ids: Iterator[int], topic: str,
                 config: ProducerConfig,
                 routing: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
                 router: MessageRouter | None = None,
                 partitions_update_interval_s: float = 60):
        self.transport = transport
        self._ids = ids
        self.topic = topic
        self.config = config
        self.routing = PartitionsRoutingMode.CustomPartition if router is not None else routing
        self.router = router
        if self.routing is PartitionsRoutingMode.CustomPartition and router is None:
            raise InvalidConfiguration("CustomPartition routing needs a message_router")
        self.cores: list[ProducerCore] = []
        self.partitions_update_interval_s = partitions_update_interval_s
        self._partitioned = False
        self._closing = False
        self.on_closed: Callable[[], None] | None = None  # the client's: forget this producer
        self._update_timer: asyncio.TimerHandle | None = None
        self._updating: asyncio.Task[None] | None = None
        self._next = 0
        self._sent_here = 0
        self._switched_s = time.monotonic()

    async def start(self) -> None:
        partitions = await self.transport.partitioned_metadata(self.topic)
        if partitions == 0:
            self.cores = [ProducerCore(self.transport, next(self._ids), self.topic, -1,
                                       self.config)]
        else:
            self.cores = self._partition_cores(0, partitions)
            self._partitioned = True
        await _start_all(self.cores)
        self._next = random.randrange(len(self.cores))
        self._arm_update()

    def _partition_cores(self, first: int, end: int) -> list[ProducerCore]:
        return [ProducerCore(self.transport, next(self._ids), f"{self.topic}-partition-{i}", i,
                             self.config) for i in range(first, end)]

    def _arm_update(self) -> None:
        if self._partitioned and self.partitions_update_interval_s > 0 and not self._closing:
            self._update_timer = asyncio.get_running_loop().call_later(
                self.partitions_update_interval_s, self._start_update)

    def _start_update(self) -> None:
        self._updating = asyncio.ensure_future(self._update_partitions())

    async def _update_partitions(self) -> None:
        """Create producers for the partitions added since the last look."""
        try:
            count = await self.transport.partitioned_metadata(self.topic)
            known = len(self.cores)
            if count > known and not self._closing:
                added = self._partition_cores(known, count)
                await _start_all(added)
                if self._closing:
                    await asyncio.gather(*(core.close() for core in added))
                else:
                    self.cores += added
        except Exception as exc:
            log.warning("partition update of %s failed: %s", self.topic, exc)
        self._arm_update()

    @property
    def producer_name(self) -> str:
        return self.cores[0].producer_name if self.cores else self.config.producer_name

    @property
    def last_sequence_id(self) -> int:
        return max((core.last_sequence_id for core in self.cores), default=-1)

    @property
    def closed(self) -> bool:
        return all(core.closed for core in self.cores)

    def _choose(self, message: OutMessage) -> ProducerCore:
        count = len(self.cores)
        if count == 1:
            return self.cores[0]
        if message.partition_key is not None and self.routing is not \
                PartitionsRoutingMode.CustomPartition:
            return self.cores[(boost_hash(message.partition_key) & 0x7FFFFFFF) % count]
        if self.routing is PartitionsRoutingMode.CustomPartition:
            assert self.router is not None
            index = self.router(_routed(message), count)
            if not isinstance(index, int) or not 0 <= index < count:
                raise InvalidConfiguration(f"message_router returned {index!r}, not a "
                                           f"partition of {self.topic} (0..{count - 1})")
            return self.cores[index]
        if self.routing is PartitionsRoutingMode.UseSinglePartition:
            return self.cores[self._next]
        if not self.config.batching_enabled:
            core = self.cores[self._next]
            self._next = (self._next + 1) % count
            return core
        now = time.monotonic()
        if self._sent_here >= self.config.batching_max_messages or \
                now - self._switched_s >= self.config.batching_max_publish_delay_ms / 1000:
            self._next = (self._next + 1) % count
            self._sent_here = 0
            self._switched_s = now
        self._sent_here += 1
        return self.cores[self._next]

    def only_batching_core(self) -> ProducerCore | None:
        """The core of a one-partition producer that batches (`send_async`'s fast path:
        no routing, `ProducerCore.offer_batched`), else None."""
        cores = self.cores
        return cores[0] if len(cores) == 1 and cores[0].batches else None

    async def send(self, message: OutMessage) -> asyncio.Future[MessageId]:
        return await self._choose(message).send(message)

    def offer(self, message: OutMessage, sink: ResultSink,
              ) -> Coroutine[Any, Any, None] | None:
        """Queue `message` on its partition now if there is room (None); else the coroutine
        that waits for room and queues it (see `ProducerCore.offer`)."""
        core = self._choose(message)
        return None if core.offer(message, sink) else core.send_to(message, sink)

    async def flush(self) -> None:
        await asyncio.gather(*(core.flush() for core in self.cores))

    async def close(self) -> None:
        self._closing = True
        if self._update_timer is not None:
            self._update_timer.cancel()
        if self._updating is not None:
            self._updating.cancel()
        try:
            await asyncio.gather(*(core.close() for core in self.cores))
        finally:
            forget, self.on_closed = self.on_closed, None
            if forget is not None:
                forget()


async def _start_all(cores: list[ProducerCore]) -> None:
    """Start every core; on a failure close those started and raise the first error."""
    results = await asyncio.gather(*(core.start() for core in cores), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(core.close() for core, r in zip(cores, results, strict=True)
                               if not isinstance(r, BaseException)), return_exceptions=True)
        raise errors[0]


def _routed(message: OutMessage) -> Message:
    """The view of an outgoing message a custom router gets."""
    return Message(payload=message.payload, message_id=MessageId(-1, -1), topic="",
                   properties=message.properties, partition_key=message.partition_key,
                   ordering_key=message.ordering_key, publish_time=0,
                   event_time=message.event_time, redelivery_count=0, producer_name="")
