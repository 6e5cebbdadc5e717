"""`AsyncSender`: the synchronous `send_async` without a round trip to the loop per message.

Theory of operation
-------------------
A blocking call into the client's loop costs a thread switch each way; `send_async` is the
call applications make in a tight loop, so it does not wait for the loop at all. The caller's
thread takes a slot from a semaphore of `slots` (waiting for one with `block_if_queue_full`,
else raising `ProducerQueueIsFull` at once), appends the message to a deque, and schedules a
drain on the loop unless one is scheduled already. The drain task hands the queued messages to
the producer core in order; a message the core refuses (too big, producer closed) reports its
error through the callback. A slot is freed when the message's callback runs.

No lock is shared with the loop: the deque's append and popleft are atomic, and at most one
drain runs at a time (`_draining`, touched only on the loop). The flag `_scheduled` may let two
drains be scheduled; the second finds the first running and returns, and the running one
loops until the deque is empty, so every message is drained exactly once, in order.
`idle` (awaited by `flush` and `close`) returns once the deque is empty and no drain runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable

from magnetar.codec import MessageId

from ._enums import Result
from ._errors import ProducerQueueIsFull, PulsarException
from ._loop import LoopThread
from ._message_id import MessageId as ClientMessageId
from ._producer import OutMessage
from ._routing import ProducerSet

__all__ = ["AsyncSender", "SendCallback"]

log = logging.getLogger(__name__)

# The official shape: `callback(result, message_id)`; the id is None unless `Result.Ok`.
SendCallback = Callable[[Result, ClientMessageId | None], None]


class AsyncSender:
    """The non-blocking `send_async` of one producer (see the module comment)."""

    def __init__(self, thread: LoopThread, core: ProducerSet, slots: int, block: bool):
        self._thread = thread
        self._core = core
        self._slots = threading.BoundedSemaphore(slots)
        self._slots_max = slots
        self._block = block
        self._queue: deque[tuple[OutMessage, SendCallback | None]] = deque()
        self._scheduled = False
        self._draining = False  # loop only
        self._idle: asyncio.Event | None = None  # loop only, made on first use
        self._task: asyncio.Task[None] | None = None

    def send_async(self, message: OutMessage, callback: SendCallback | None) -> None:
        """Queue `message` (caller's thread).

        Raises:
            ProducerQueueIsFull: `slots` messages are pending and blocking is off.
        """
        if not self._slots.acquire(blocking=self._block):
            raise ProducerQueueIsFull(
                f"producer {self._core.producer_name!r} on {self._core.topic} has "
                f"{self._slots_max} of {self._slots_max} pending messages")
        self._queue.append((message, callback))
        if not self._scheduled:
            self._scheduled = True
            self._thread.call(self._start_drain)

    def _start_drain(self) -> None:
        if not self._draining:
            self._draining = True  # before the task runs: a second call starts no second one
            if self._idle is not None:
                self._idle.clear()
            self._task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            while True:
                self._scheduled = False
                if not self._queue:
                    return
                message, callback = self._queue.popleft()
                try:
                    future = await self._core.send(message)
                except PulsarException as exc:
                    self._finished(callback, exc, None)
                    continue
                future.add_done_callback(functools.partial(self._settled, callback))
        finally:
            self._draining = False
            if self._idle is not None:
                self._idle.set()

    def _settled(self, callback: SendCallback | None, done: asyncio.Future[MessageId]) -> None:
        if done.cancelled():
            self._finished(callback, PulsarException("the send was cancelled"), None)
            return
        error = done.exception()
        if error is not None:
            self._finished(callback, error if isinstance(error, PulsarException)
                           else PulsarException(str(error)), None)
        else:
            self._finished(callback, None, done.result())

    def _finished(self, callback: SendCallback | None, error: PulsarException | None,
                  message_id: MessageId | None) -> None:
        self._slots.release()
        if callback is None:
            return
        if error is not None:
            log.debug("send_async on %s failed: %s", self._core.topic, error)
        try:
            callback(Result.of(error),
                     None if message_id is None else ClientMessageId.wrap(message_id))
        except Exception:  # the application's callback must not break the client
            log.exception("a send_async callback on %s failed", self._core.topic)

    async def idle(self) -> None:
        """Until every message queued before the call was handed to the core (loop)."""
        if self._idle is None:
            self._idle = asyncio.Event()
        while self._draining or self._queue:
            if not self._draining:
                self._start_drain()
            await self._idle.wait()

