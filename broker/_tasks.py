"""Background asyncio tasks that never fail silently.

Every task the broker starts and does not await itself goes through `spawn`: the task is
kept in the owner's set (so it is not garbage-collected while it runs, and the owner can
cancel it on close), and when it ends with an exception other than cancellation the
exception is logged with its traceback, naming what the task was for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["log_task_failure", "spawn"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def log_task_failure(task: asyncio.Future[Any], what: str) -> None:
    """Log the exception a finished task ended with (nothing when it succeeded or was
    cancelled)."""
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.error("background task failed: %s", what, exc_info=error)


def spawn(work: Coroutine[Any, Any, T], tasks: set[asyncio.Task[Any]],
          what: str) -> asyncio.Task[T]:
    """Start `work` as a task held in `tasks` until it ends; an unexpected exception is
    logged (see the module comment)."""
    task = asyncio.ensure_future(work)

    def done(finished: asyncio.Task[T]) -> None:
        tasks.discard(finished)
        log_task_failure(finished, what)

    tasks.add(task)
    task.add_done_callback(done)
    return task
