"""Storage completions seen from the event loop, for the managed ledger.

A `LedgerStorage` completes its work on its own threads; these helpers carry the outcome to
the loop (`on_loop`, `after_earlier_callbacks`) without ever blocking it, and delete storage
ledgers with or without waiting. A loop already closed when a completion fires is ignored: the
owner is gone and nothing waits for the answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from magnetar.storage import Completion, LedgerNotFoundError, LedgerStorage, StorageError

__all__ = ["after_earlier_callbacks", "call_soon", "delete_in_background",
           "delete_storage_ledger", "on_loop"]

log = logging.getLogger(__name__)


async def delete_storage_ledger(storage: LedgerStorage, ledger_id: int) -> None:
    try:
        await storage.delete_ledger(ledger_id)
    except LedgerNotFoundError:
        pass


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
    """Run `callback` on `loop` from a storage thread (ignored once the loop is closed)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass
