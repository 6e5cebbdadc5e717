"""`AsyncSender`: the synchronous `send_async` without a round trip to the loop per message.

Theory of operation
-------------------
A blocking call into the client's loop costs a thread switch each way; `send_async` is the
call applications make in a tight loop, so it does not wait for the loop at all. The caller's
thread takes a slot of `slots` (`_Slots`: waiting for one with `block_if_queue_full`, else
raising `ProducerQueueIsFull` at once), appends the message with its callback to a deque as
a `_Receipt`, and schedules a drain on the loop unless one is scheduled already -- one thread
switch per burst, not per message. The drain hands the queued messages to the producer core
in order, right in that callback, each with its `_Receipt` as the core's result sink (it
calls back directly, without a future per message); a one-partition batching producer takes
the whole queue in one call (`ProducerCore.offer_batched_run`), and a stored batch's receipts
are resolved in one loop (`_Receipt.set_parts_of_entry`). Only a message that must wait for
room in the core's own queue starts a drain task, which waits and goes on from there. A
message the core refuses (too big, producer closed) reports its error through the callback.
Slots come back when callbacks ran, in bulk: a stored entry's at once
after its callbacks (so a producer waiting for room refills before the loop dispatches that
entry to consumers), a failure's once per loop iteration, a synchronous send's at once (its
caller waits). The synchronous
`send` queues the same way with a `SendWaiter` for a callback, so sends and send_asyncs
keep their order.

No lock is shared with the loop but the slots': the deque's append and popleft are atomic,
and at most one drain runs at a time (`_draining`, touched only on the loop). The flag
`_scheduled` may let two drains be scheduled; the second finds the deque empty or a drain
task running and returns, and the running one loops until the deque is empty, so every
message is drained exactly once, in order. `idle` (awaited by `flush` and `close`) returns
once the deque is empty and no drain task runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from magnetar.codec import MessageId

from ._enums import Result
from ._errors import AlreadyClosed, ProducerQueueIsFull, PulsarException
from ._loop import LoopThread
from ._message_id import MessageId as ClientMessageId
from ._message_id import trusted_id
from ._producer import PartsSink, Queued, ResultSink, now_ms, out_of, stored_one
from ._routing import ProducerSet

__all__ = ["AsyncSender", "SendCallback", "SendWaiter"]

log = logging.getLogger(__name__)

# The official shape: `callback(result, message_id)`; the id is None unless `Result.Ok`.
SendCallback = Callable[[Result, ClientMessageId | None], None]
_OK = Result.Ok


def _as_pulsar(error: BaseException) -> PulsarException:
    return error if isinstance(error, PulsarException) else PulsarException(
        f"{type(error).__name__}: {error}")


class SendWaiter:
    """What the synchronous `send` waits on instead of a callback: the outcome with the
    exception itself, handed over through a lock (no task or future per send)."""

    __slots__ = ("_error", "_lock", "_message_id")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._error: PulsarException | None = None
        self._message_id: MessageId | None = None

    def finish(self, error: PulsarException | None, message_id: MessageId | None) -> None:
        self._error, self._message_id = error, message_id
        self._lock.release()

    def wait(self) -> MessageId:
        """The message's id once stored (caller's thread).

        Raises:
            PulsarException: the send failed (what the core failed it with)."""
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        assert self._message_id is not None
        return self._message_id


class _Slots:
    """A counting limit the caller's threads take from one at a time and the loop gives back
    in bulk (a semaphore whose release of n is one lock round, not n).

    Blocking (`block`): each take draws a ticket (`tickets`, an `itertools.count`: atomic)
    and ticket t holds a slot once `t < given + limit` -- read without the lock, so a take
    with room costs no lock; one without room waits on the condition, counted in `_waiting`,
    and checks again under the lock. `give` (the loop, the only writer of `given`) adds to
    `given` before it reads `_waiting`, so a take that counted itself in after that read
    finds the room when it checks again. Not blocking: a take with no room must leave no
    trace, so takes and gives count `_used` under the lock."""

    def __init__(self, limit: int, block: bool):
        self.limit = limit
        self.block = block
        self.tickets = itertools.count()  # blocking: the takes so far
        self.given = 0  # blocking: the slots given back so far (written by the loop only)
        self._waiting = 0  # blocking: takes waiting for room (under the lock)
        self._used = 0  # not blocking: the slots held (under the lock)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)

    def take(self) -> bool:
        """One slot (waiting for it when blocking); False when none is free and blocking
        is off."""
        if not self.block:
            with self._lock:
                if self._used >= self.limit:
                    return False
                self._used += 1
                return True
        ticket = next(self.tickets)
        if ticket >= self.given + self.limit:
            self.wait_for(ticket)
        return True

    def wait_for(self, ticket: int) -> None:
        """Blocking: wait until `ticket` holds a slot."""
        with self._lock:
            self._waiting += 1
            try:
                while ticket >= self.given + self.limit:
                    self._room.wait()
            finally:
                self._waiting -= 1

    def give(self, count: int) -> None:
        """`count` slots back (the loop)."""
        if not self.block:
            with self._lock:
                self._used -= count
                assert self._used >= 0
            return
        self.given += count
        if self._waiting:
            with self._lock:
                self._room.notify_all()


class _Receipt(PartsSink):
    """One `send_async` message on its way: queued for the loop with its message, then the
    core's result sink for it (see `ResultSink`)."""

    __slots__ = ("_callback", "_finished", "_sender", "message")

    def __init__(self, sender: AsyncSender, callback: SendCallback | SendWaiter | None,
                 message: Queued):
        self._sender = sender
        self._callback = callback
        self._finished = False
        self.message = message

    def done(self) -> bool:
        return self._finished

    def set_result(self, result: MessageId, /) -> None:
        self._finished = True
        self._sender._finished(self._callback, None, result)

    def set_exception(self, exception: BaseException, /) -> None:
        self._finished = True
        self._sender._finished(self._callback, _as_pulsar(exception), None)

    def set_parts(self, ledger_id: int, entry_id: int, partition: int, batch_index: int,
                  batch_size: int) -> None:
        """Stored (the callback's id is built from the parts)."""
        callback = self._callback
        if isinstance(callback, SendWaiter):  # its caller waits: its slot comes back at once
            self._finished = True
            self._sender._slots.give(1)
            callback.finish(None, trusted_id(ledger_id, entry_id, partition, batch_index,
                                             batch_size))
            return
        self.set_parts_of_entry([self], ledger_id, entry_id, partition, batch_size, batch_index)

    def set_parts_of_entry(self, sinks: list[ResultSink], ledger_id: int, entry_id: int,
                           partition: int, batch_size: int, first_index: int = 0) -> None:
        """`set_parts` of every sink of one stored entry (sink i gets batch index
        `first_index + i`) in one loop: the hot path, a batch's `send_async` callbacks. A sink
        of another kind, or a synchronous `send`'s, is resolved as `stored_one` does."""
        of_parts = ClientMessageId.of_parts
        owner: AsyncSender | None = None  # the sender of the sinks (one for a whole entry)
        done = 0  # its slots to give back once the entry's callbacks ran
        for index, sink in enumerate(sinks, first_index):
            batch_index = index if batch_size else -1
            if type(sink) is not _Receipt or isinstance(sink._callback, SendWaiter):
                stored_one(sink, ledger_id, entry_id, partition, batch_index, batch_size)
                continue
            if sink._finished:
                continue
            sink._finished = True
            sender, callback = sink._sender, sink._callback
            if sender is owner:
                done += 1
            elif owner is None:
                owner, done = sender, 1
            else:  # another sender's (not expected): back at the end of this loop turn
                if not sender._slots_done:
                    asyncio.get_running_loop().call_soon(sender._give_slots)
                sender._slots_done += 1
            if callback is None:
                continue
            try:
                callback(_OK, of_parts(ledger_id, entry_id, partition, batch_index, batch_size))
            except Exception:  # the application's callback must not break the client
                log.exception("a send_async callback on %s failed", sender._core.topic)
        if owner is not None:  # at once: a producer waiting for room refills before the loop
            owner._slots.give(done)  # goes on (to dispatch this entry to consumers, say)


_new_receipt = object.__new__


class AsyncSender:
    """The non-blocking `send_async` of one producer (see the module comment)."""

    def __init__(self, thread: LoopThread, core: ProducerSet, slots: int, block: bool):
        self._thread = thread
        self._core = core
        self._slots = _Slots(slots, block)
        self._slots_done = 0  # loop only: slots to give back at the end of this loop turn
        self._queue: deque[_Receipt] = deque()  # made on the caller's thread
        self._scheduled = False
        self._draining = False  # loop only
        self._idle: asyncio.Event | None = None  # loop only, made on first use
        self._task: asyncio.Task[None] | None = None

    def send_async(self, message: Queued, callback: SendCallback | SendWaiter | None) -> None:
        """Queue `message` (caller's thread; bare bytes: a message of them and no options).

        Raises:
            ProducerQueueIsFull: `slots` messages are pending and blocking is off.
            AlreadyClosed: the loop is gone (a closed client, or a forked child).
        """
        if not self._thread.alive:
            raise AlreadyClosed("the client's event loop is not running (closed, or forked)")
        slots = self._slots
        if slots.block:  # `_Slots.take`'s lock-free case, inline (the hot path)
            ticket = next(slots.tickets)
            if ticket >= slots.given + slots.limit:
                slots.wait_for(ticket)
        elif not slots.take():
            raise ProducerQueueIsFull(
                f"producer {self._core.producer_name!r} on {self._core.topic} has "
                f"{slots.limit} of {slots.limit} pending messages")
        receipt = _new_receipt(_Receipt)  # `_Receipt(self, callback, message)`, inline
        receipt._sender, receipt._callback, receipt._finished = self, callback, False
        receipt.message = message
        self._queue.append(receipt)
        if not self._scheduled:
            self._scheduled = True
            self._thread.call(self._start_drain)

    def _start_drain(self) -> None:
        """Hand the queued messages to the core right here while it has room; only a message
        that must wait for room starts a drain task (which goes on from it). The sends leave
        when this burst ends (`Transport.end_burst`), not a loop turn later."""
        if self._draining:
            return
        transport = self._core.transport
        transport.begin_burst()
        try:
            self._drain_now()
        finally:
            transport.end_burst()

    def _drain_now(self) -> None:
        queue, core = self._queue, self._core
        batching = core.only_batching_core()  # the usual batched producer: one call each
        burst_ms = now_ms()
        while True:
            self._scheduled = False
            if not queue:
                return
            if batching is not None:  # the usual: every message queued, in one call
                batching.offer_batched_run(queue, burst_ms, self._refused)
                if not queue:
                    continue
            receipt = queue.popleft()
            message = out_of(receipt.message)
            try:
                if batching is None or message.deliver_at_ms is not None:
                    waiting = core.offer(message, receipt)
                elif batching.offer_batched(message, receipt, burst_ms):
                    continue
                else:
                    waiting = batching.send_to(message, receipt)
            except Exception as exc:  # refused (a custom router's failure included)
                self._finished(receipt._callback, _as_pulsar(exc), None)
                continue
            if waiting is not None:
                self._draining = True  # before the task runs: no second drain starts
                if self._idle is not None:
                    self._idle.clear()
                self._task = asyncio.ensure_future(self._drain(waiting, receipt._callback))
                return

    def _refused(self, receipt: _Receipt, error: Exception) -> None:
        self._finished(receipt._callback, _as_pulsar(error), None)

    async def _drain(self, waiting: Coroutine[Any, Any, None] | None,
                     callback: SendCallback | SendWaiter | None) -> None:
        """Wait for room for one message (`waiting`), then go on as `_start_drain` does."""
        try:
            while True:
                if waiting is not None:
                    try:
                        await waiting
                    except Exception as exc:
                        self._finished(callback, _as_pulsar(exc), None)
                self._scheduled = False
                if not self._queue:
                    return
                receipt = self._queue.popleft()
                callback = receipt._callback
                try:
                    waiting = self._core.offer(out_of(receipt.message), receipt)
                except Exception as exc:
                    self._finished(callback, _as_pulsar(exc), None)
                    waiting = None
        finally:
            self._draining = False
            if self._idle is not None:
                self._idle.set()

    def _finished(self, callback: SendCallback | SendWaiter | None, error: PulsarException | None,
                  message_id: MessageId | None) -> None:
        if not self._slots_done:
            asyncio.get_running_loop().call_soon(self._give_slots)
        self._slots_done += 1
        if callback is None:
            return
        if isinstance(callback, SendWaiter):
            callback.finish(error, message_id)
            return
        if error is not None:
            log.debug("send_async on %s failed: %s", self._core.topic, error)
        try:
            callback(Result.of(error),
                     None if message_id is None else ClientMessageId.wrap(message_id))
        except Exception:  # the application's callback must not break the client
            log.exception("a send_async callback on %s failed", self._core.topic)

    def _give_slots(self) -> None:
        count, self._slots_done = self._slots_done, 0
        self._slots.give(count)

    async def idle(self) -> None:
        """Until every message queued before the call was handed to the core (loop)."""
        while True:
            self._start_drain()  # nothing while a drain task runs
            if not self._draining:
                return  # the queue is empty: `_start_drain` returns only so, or draining
            if self._idle is None:
                self._idle = asyncio.Event()
            self._idle.clear()
            await self._idle.wait()
