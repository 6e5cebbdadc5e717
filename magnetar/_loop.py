"""`LoopThread`: the private asyncio loop every client runs its core on.

Theory of operation
-------------------
A client owns one daemon thread running one event loop. All client state (producers'
pending queues, consumers' receiver queues, the transport) lives on that loop and is only
touched there, so the core needs no locks. The synchronous API submits coroutines with
`run` (and waits for them from the caller's thread); the asyncio API (`magnetar.asyncio`)
awaits the same coroutines through `wrap`, from whatever loop the application runs.

Interpreter exit: clients that are still open when the interpreter exits are closed by an
`atexit` hook (`close_at_exit`), each bounded by `EXIT_CLOSE_S`, before the daemon thread
dies; a client that cannot close in time is abandoned rather than hanging the exit.
After `os.fork` the child has no loop thread: `run` raises `AlreadyClosed` there (the
parent's client stays usable in the parent).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol, TypeVar

from ._errors import AlreadyClosed

__all__ = ["EXIT_CLOSE_S", "LoopThread", "register_for_exit"]

T = TypeVar("T")


class Failable(Protocol):
    """What a caller's thread may wait on (a concurrent future, or a lighter waiter of the
    client's own): failed with AlreadyClosed if the loop ends before resolving it."""

    def done(self) -> bool: ...

    def set_exception(self, exception: BaseException, /) -> None: ...
EXIT_CLOSE_S: Final = 10.0  # at interpreter exit, the longest one open client may take to close
_STOP_JOIN_S: Final = 10.0  # the longest `stop` waits for the loop thread to end


_forks = 0  # how many times this process was forked into (counted in the child)


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


class LoopThread:
    """One event loop on one daemon thread (see the module comment)."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._forks = _forks
        self._running = True  # until the loop thread ends
        self._ready = threading.Event()
        # Calls submitted and not finished: failed when the loop ends without finishing them.
        self._waiting: set[Failable] = set()
        self._waiting_lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self._running = False
            self.loop.close()
            self._fail_waiting()

    def _fail_waiting(self) -> None:
        """The loop has ended and will run nothing again: a call it did not finish would keep
        its caller waiting forever, so it fails with AlreadyClosed."""
        with self._waiting_lock:
            waiting, self._waiting = self._waiting, set()
        for future in waiting:
            if not future.done():
                future.set_exception(AlreadyClosed(
                    "the client was closed while this call waited for it"))

    def _forget(self, future: Failable) -> None:
        with self._waiting_lock:
            self._waiting.discard(future)

    def call_for(self, waiter: Failable, callback: Callable[[], None]) -> None:
        """Run `callback` on the loop soon, for a caller that then waits on `waiter`, which
        the callback (or what it starts) resolves; until `forget_waiter`, the waiter fails with
        AlreadyClosed if the loop ends first. One thread switch, no task or future.

        Raises:
            AlreadyClosed: the loop is gone (closed client, or a forked child).
        """
        if not self.alive:
            raise AlreadyClosed("the client's event loop is not running (closed, or forked)")
        with self._waiting_lock:  # before the callback is queued: see `_fail_waiting`
            self._waiting.add(waiter)
        try:
            self.loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop closed meanwhile
            self._forget(waiter)
            raise AlreadyClosed("the client's event loop is not running") from None

    def forget_waiter(self, waiter: Failable) -> None:
        """The caller stopped waiting on `waiter` (see `call_for`)."""
        self._forget(waiter)

    @property
    def alive(self) -> bool:
        """Whether the loop runs (in this process: a forked child has no loop thread). Cheap:
        `send_async` asks it once per message."""
        return self._running and self._forks == _forks

    def on_loop(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the loop; the future resolves with its outcome.

        Raises:
            AlreadyClosed: the loop is gone (closed client, or a forked child); `coro` is closed.
        """
        if not self.alive:
            coro.close()
            raise AlreadyClosed("the client's event loop is not running (closed, or forked)")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._waiting_lock:
            self._waiting.add(future)
        if not self._running:  # the loop ended, maybe after `_fail_waiting` took its set:
            self._fail_waiting()  # the future joined too late for it, so fail it here
        future.add_done_callback(self._forget)
        return future

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result from another thread.

        Raises:
            Whatever `coro` raises; `TimeoutError` when `timeout_s` passes first (the
            coroutine is cancelled).
        """
        if self.on_loop():
            coro.close()
            raise RuntimeError("a blocking magnetar call was made from the client's own loop "
                               "(a callback); use send_async or the asyncio API there")
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"operation did not finish in {timeout_s} s") from None

    async def wrap(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` from another event loop (the asyncio API)."""
        if self.on_loop():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def call(self, callback: Callable[[], None]) -> None:
        """Run `callback` on the loop soon (fire and forget); nothing when the loop is gone."""
        if self.alive:
            self.loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        """Stop the loop and wait for its thread (not from the loop itself)."""
        if not self.alive:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.on_loop():
            self._thread.join(_STOP_JOIN_S)


class _Closable(Protocol):
    def close_for_exit(self, timeout_s: float) -> None: ...


_OPEN: set[Any] = set()  # strong references: an open client is closed at exit
_HOOKED = False
_HOOK_LOCK = threading.Lock()


def register_for_exit(client: _Closable) -> None:
    """Close `client` at interpreter exit if it is still open then."""
    global _HOOKED
    with _HOOK_LOCK:
        _OPEN.add(client)
        if not _HOOKED:
            atexit.register(_close_at_exit)
            _HOOKED = True


def unregister_for_exit(client: _Closable) -> None:
    with _HOOK_LOCK:
        _OPEN.discard(client)


def _close_at_exit() -> None:
    for client in list(_OPEN):
        try:
            client.close_for_exit(EXIT_CLOSE_S)
        except Exception:  # at exit, one client's failure must not stop the others
            pass
