"""A small thread-safe completion, awaitable from asyncio.

`concurrent.futures.Future` allocates a condition variable per future; an add path that
completes hundreds of thousands of futures a second cannot afford that. A `Completion`
allocates a lock only when somebody blocks on it, runs callbacks in the
thread that completes it, and bridges to asyncio through `call_soon_threadsafe` when
awaited.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["Completion", "set_results"]

T = TypeVar("T")

_PENDING = object()
_STATE_LOCK = threading.Lock()  # one lock for all completions: they are short-lived


class Completion(Generic[T]):
    """The outcome of an operation that finishes in another thread."""

    __slots__ = ("_callback", "_error", "_event", "_more", "_value", "before_blocking",
                 "wake_work")

    def __init__(self) -> None:
        self._value: Any = _PENDING
        self._error: BaseException | None = None
        # The first callback, then the others (most completions have exactly one: no list).
        self._callback: Callable[[Completion[T]], None] | None = None
        self._more: list[Callable[[Completion[T]], None]] | None = None
        # Held until the completion finishes; a blocked `result` waits to acquire it. A raw
        # lock, not a `threading.Event`: waking a synchronous caller is on the path of every
        # add made one at a time.
        self._event: threading.Lock | None = None
        # Called once by a thread about to block in `result` (the journal uses it to write
        # and sync a lone add in the waiting thread itself; see `Journal.try_lead`).
        self.before_blocking: Callable[[], object] | None = None
        # Called once on the first use other than `result` while pending (a callback, an
        # await, `done`): the journal sets it when it left its writer asleep for a lone add
        # whose caller would most likely write it itself (`Journal.submit`).
        self.wake_work: Callable[[], object] | None = None

    @classmethod
    def resolved(cls, value: T) -> Completion[T]:
        done: Completion[T] = cls()
        done._value = value
        return done

    @classmethod
    def failed(cls, error: BaseException) -> Completion[T]:
        done: Completion[T] = cls()
        done._error = error
        done._value = None
        return done

    def done(self) -> bool:
        """Whether finished; a first poll while pending calls `wake_work` (a poller waits
        for the work to be done by others, so the journal must not leave it queued)."""
        if self._value is not _PENDING:
            return True
        if self.wake_work is not None:
            self._wake_work()
        return False

    def _wake_work(self) -> None:
        wake, self.wake_work = self.wake_work, None
        if wake is not None:
            wake()

    def set_result(self, value: T) -> None:
        self._finish(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(None, error)

    def _finish(self, value: Any, error: BaseException | None) -> None:
        with _STATE_LOCK:
            assert self._value is _PENDING, "a completion finishes once"
            self._error = error
            self._value = value
        self._release_waiters()

    def _release_waiters(self) -> None:
        """Release a blocked `result` and run the callbacks, in order. Only after the value
        is set under the state lock: from then on nobody adds a callback or an event
        (`add_done_callback` and `result` check under the same lock), so both are read
        without it."""
        event = self._event
        if event is not None:
            event.release()
        callback = self._callback
        if callback is not None:
            more = self._more
            self._callback = self._more = None
            callback(self)
            if more is not None:
                for callback in more:
                    callback(self)

    def add_done_callback(self, callback: Callable[[Completion[T]], None]) -> None:
        """Call `callback(self)` once done: at once if already done, else in the thread
        that completes it. Callbacks must be quick and must not raise."""
        with _STATE_LOCK:
            pending = self._value is _PENDING
            if pending:
                if self._callback is None:
                    self._callback = callback
                elif self._more is None:
                    self._more = [callback]
                else:
                    self._more.append(callback)
        if not pending:
            callback(self)
        elif self.wake_work is not None:
            self._wake_work()

    def result(self, timeout: float | None = None) -> T:
        """Block until done and return the value.

        Raises:
            TimeoutError: not done within `timeout` seconds (the operation goes on).
            The operation's own error, when it failed.
        """
        hook = self.before_blocking
        if hook is not None and self._value is _PENDING:
            self.before_blocking = None
            hook()
        if self._value is _PENDING:
            if self.wake_work is not None:  # (a hook that could not lead woke the writer)
                self._wake_work()
            with _STATE_LOCK:
                if self._value is _PENDING and self._event is None:
                    self._event = threading.Lock()
                    self._event.acquire()
                event = self._event
            if event is not None:
                if not event.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
                    raise TimeoutError("operation still pending")
                event.release()  # for the next waiter, if any
        if self._error is not None:
            raise self._error
        value: T = self._value
        return value

    def exception(self) -> BaseException | None:
        assert self._value is not _PENDING, "a completion's exception once done"
        return self._error

    def __await__(self) -> Generator[Any, None, T]:
        if not self.done():
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def wake(_: Completion[T]) -> None:
                try:
                    loop.call_soon_threadsafe(_set_if_pending, waiter)
                except RuntimeError:  # the loop is closed: nobody waits any more, and the
                    pass              # completing thread (journal, checkpoint) must go on

            self.add_done_callback(wake)
            yield from waiter.__await__()
        return self.result()


def set_results(completions: Sequence[Completion[T] | None], values: Sequence[T]) -> None:
    """`set_result(value)` for each completion (None: skipped), in order, as ONE step: the
    state lock is taken once for all of them (a journal group commit finishes hundreds at a
    time), then each one's blocked waiter is released and its callbacks run, in order
    (`_release_waiters`). A callback may thus see later completions of the list already
    done."""
    with _STATE_LOCK:
        for completion, value in zip(completions, values, strict=True):
            if completion is not None:
                assert completion._value is _PENDING, "a completion finishes once"
                completion._value = value
    for completion in completions:
        if completion is not None:
            completion._release_waiters()


def _set_if_pending(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
