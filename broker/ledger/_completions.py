"""Storage completions seen from the event loop, for the managed ledger.

A `LedgerStorage` completes its work on its own threads; these helpers carry the outcome to
the loop (`on_loop`, `after_earlier_callbacks`) without ever blocking it, and delete storage
ledgers with or without waiting. A loop already closed when a completion fires is ignored: the
owner is gone and nothing waits for the answer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from magnetar.storage import Completion, LedgerNotFoundError, LedgerStorage, StorageError

__all__ = ["add_when_cache_has_space", "after_earlier_callbacks", "call_soon",
           "close_storage_ledger", "delete_in_background", "delete_storage_ledger",
           "in_order_on_loop", "on_loop"]

log = logging.getLogger(__name__)


def delete_in_background(storage: LedgerStorage, ledger_id: int) -> None:
    """Delete a storage ledger without waiting; a failure leaves an orphan that the next
    open of the ML removes."""
    try:
        completion = storage.delete_ledger(ledger_id)
    except StorageError as error:
        log.warning("could not delete ledger %d: %s", ledger_id, error)
        return

    def report(finished: Completion[int]) -> None:
        error = finished.exception()
        if error is not None:
            log.warning("deleting ledger %d failed: %s", ledger_id, error)

    completion.add_done_callback(report)


async def after_earlier_callbacks(completion: Completion[int]) -> int:
    """Await a storage completion through the event loop even when it is already done, so
    that the add confirmations the storage bounced onto the loop before it (`_submit`) have
    run first: a close must see the entry count of every add it waited for. (Awaiting a
    `Completion` that is already done does not yield to the loop.)"""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    completion.add_done_callback(lambda _: call_soon(loop, _wake, waiter))
    await waiter
    return completion.result()


async def close_storage_ledger(storage: LedgerStorage, ledger_id: int) -> int:
    """`storage.close_ledger` awaited as `after_earlier_callbacks` does; the closes asked for
    in one turn of the loop go to the storage together (`close_ledgers`: one journal
    submission, one hand-back to the loop), so a broker closing thousands of topics does
    not pay a journal submission and a wake-up of the loop for each.

    Raises:
        StorageError: as `close_ledger` (LedgerNotFoundError for this ledger alone).
    """
    return await _batched(storage, ledger_id, False)


async def delete_storage_ledger(storage: LedgerStorage, ledger_id: int) -> None:
    """`storage.delete_ledger` awaited, batched as `close_storage_ledger`; a ledger that is
    already gone is fine."""
    try:
        await _batched(storage, ledger_id, True)
    except LedgerNotFoundError:
        pass


async def _batched(storage: LedgerStorage, ledger_id: int, delete: bool) -> int:
    loop = asyncio.get_running_loop()
    key = (loop, storage, delete)
    batch = _ENDING.get(key)
    if batch is None:
        batch = _ENDING[key] = []
        loop.call_soon(_end_batch, key)
    waiter: asyncio.Future[int] = loop.create_future()
    batch.append((ledger_id, waiter))
    return await waiter


# The closes (delete False) and deletes asked for in this turn of each loop, per storage;
# `_end_batch` (one call_soon away) takes them. Bounded by the managed ledgers that close or
# trim in one turn.
_BatchKey = tuple[asyncio.AbstractEventLoop, LedgerStorage, bool]
_ENDING: dict[_BatchKey, list[tuple[int, asyncio.Future[int]]]] = {}


def _end_batch(key: _BatchKey) -> None:
    loop, storage, delete = key
    batch = _ENDING.pop(key)
    ids = [ledger_id for ledger_id, _ in batch]
    try:
        completions = storage.delete_ledgers(ids) if delete else storage.close_ledgers(ids)
    except StorageError as error:
        for _, waiter in batch:
            if not waiter.done():
                waiter.set_exception(error)
        return

    def confirm(index: int) -> None:
        waiter, completion = batch[index][1], completions[index]
        if waiter.done():  # its caller was cancelled
            return
        error = completion.exception()
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(completion.result())

    in_order_on_loop(loop, completions, confirm)


async def add_when_cache_has_space(storage: LedgerStorage, ledger_id: int,
                                   entries: Sequence[bytes], name: str) -> Completion[int]:
    """Back-pressure without blocking the loop: await the storage's `cache_space` and try
    the add (a run of entries) again, for at most the storage's `write_cache_wait_ms_max`
    (as a blocking add would wait). `name`: the managed ledger's, for the error.

    Raises:
        StorageError: the cache stayed full that long; nothing was written.
        The storage's refusals (`try_add_entries`): nothing was written.
    """
    wait_ms = storage.config.write_cache_wait_ms_max
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000.0
    while True:
        space = on_loop(loop, storage.cache_space())
        try:
            await asyncio.wait_for(space, max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise StorageError(f"write cache full for {wait_ms} ms; the add of ml "
                               f"{name} was refused") from None
        completion = storage.try_add_entries(ledger_id, entries)
        if completion is not None:
            return completion


def in_order_on_loop(loop: asyncio.AbstractEventLoop, completions: list[Completion[int]],
                     confirm: Callable[[int], None]) -> None:
    """Call `confirm(i)` on `loop` for each of `completions` in order, once each is done: one
    hand-off to the loop when the last completes (the storage completes a ledger's adds in
    order); one that is not done by then is waited for all the same."""

    def run(start: int) -> None:
        for index in range(start, len(completions)):
            if not completions[index].done():
                resume = index  # the loop ends here
                completions[index].add_done_callback(
                    lambda _: call_soon(loop, run, resume))  # noqa: B023
                return
            confirm(index)

    completions[-1].add_done_callback(lambda _: call_soon(loop, run, 0))


def on_loop(loop: asyncio.AbstractEventLoop, completion: Completion[Any]) -> asyncio.Future[None]:
    """A loop future finished (with None) once a storage completion is, whatever its
    outcome."""
    waiter: asyncio.Future[None] = loop.create_future()
    completion.add_done_callback(lambda _: call_soon(loop, _wake, waiter))
    return waiter


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., None],
              *args: object) -> None:
    """Run `callback` on `loop` from a storage thread (ignored once the loop is closed).
    Callbacks posted while the loop has not yet run the earlier ones share one wake-up of
    the loop (`_Inbox`): a journal sync that completes the adds of many managed ledgers
    hands them to the loop with one `call_soon_threadsafe`, not one each."""
    inbox = _INBOXES.get(loop)
    if inbox is None:
        with _INBOXES_LOCK:
            inbox = _INBOXES.setdefault(loop, _Inbox(loop))
    inbox.post(callback, args)


class _Inbox:
    """The callbacks posted to one loop from other threads, run in order in one callback.
    Bounded by what storage completes between two turns of the loop (each poster's own
    limits: adds in flight, loads in flight)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = weakref.ref(loop)  # weak: the inbox must not keep its loop alive
        self._lock = threading.Lock()
        self._items: list[tuple[Callable[..., None], tuple[object, ...]]] = []

    def post(self, callback: Callable[..., None], args: tuple[object, ...]) -> None:
        with self._lock:
            self._items.append((callback, args))
            if len(self._items) > 1:
                return  # a wake-up is on its way and runs this one too
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._run, loop)
        except RuntimeError:  # the loop is closed: nobody waits for the answer
            with self._lock:
                self._items.clear()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            items, self._items = self._items, []
        for callback, args in items:
            try:
                callback(*args)
            except Exception as exc:  # as the loop would report a callback's error
                loop.call_exception_handler({
                    "message": f"exception in storage completion callback {callback!r}",
                    "exception": exc})


_INBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox] = \
    weakref.WeakKeyDictionary()
_INBOXES_LOCK = threading.Lock()
