"""`Handoff`: how a synchronous `receive` waits for messages without a task or a future.

Theory of operation
-------------------
A blocking `receive` whose read-ahead is empty makes one `Handoff` and asks the loop (one
thread switch, `LoopThread.call_for`) to fill it: `ConsumerGroup.hand_over` gives it up to
`most` queued messages at once, or keeps it among the group's waiters until messages arrive
(`ConsumerGroup.enqueue` gives it a run of them), its timeout passes, or the consumer closes.
The caller's thread waits on a lock the loop releases once -- no coroutine, task, concurrent
future or condition per receive, which at one message in flight cost more than the message.

Resolved once: `give` (messages; the caller skips those gone stale, `Received.generation`) or
`set_exception` (Timeout, AlreadyClosed); both on the loop, except that the loop thread fails
what is still registered once it has ended (`LoopThread._fail_waiting`). A caller interrupted
while waiting (`KeyboardInterrupt`) `abandon`s it on the loop: messages it was given go back
to the head of the queue.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._message import Message

__all__ = ["Handoff"]


class Handoff:
    """One synchronous receive's wait (see the module comment)."""

    __slots__ = ("_done", "_error", "_items", "_lock", "abandoned", "most", "timer")

    def __init__(self, most: int):
        self.most = max(1, most)  # messages it takes at most
        self.timer: asyncio.TimerHandle | None = None  # its timeout, on the loop
        self.abandoned = False
        self._done = False
        self._items: list[Message] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._lock.acquire()

    def done(self) -> bool:
        return self._done

    def give(self, items: list[Message]) -> None:
        """Messages for the caller (loop; at least one)."""
        assert items
        assert not self._done
        self._done, self._items = True, items
        self._resolved()

    def set_exception(self, exception: BaseException, /) -> None:
        if not self._done:
            self._done, self._error = True, exception
            self._resolved()

    def _resolved(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._lock.release()

    def wait(self) -> list[Message]:
        """What it was given (the caller's thread).

        Raises:
            What it was failed with (Timeout, AlreadyClosed)."""
        self._lock.acquire()
        if self._error is not None:
            raise self._error
        return self._items

    def taken_back(self) -> list[Message]:
        """An abandoned hand-off's messages, to queue again (loop)."""
        items, self._items = self._items, []
        return items
