"""The client's loop thread: a blocking call still waiting when the loop ends fails instead of
hanging (the crash harness's retry thread once waited forever in `reconsume_later` after the
client was shut down under it)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from magnetar import AlreadyClosed
from magnetar._loop import LoopThread

DEADLINE_S = 10.0


def test_a_call_still_waiting_when_the_loop_stops_fails_with_already_closed() -> None:
    loop = LoopThread("test-loop")
    started = threading.Event()
    outcome: list[BaseException] = []

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    def caller() -> None:
        try:
            loop.run(forever())
        except BaseException as exc:  # the test looks at what it was
            outcome.append(exc)

    thread = threading.Thread(target=caller, daemon=True)
    thread.start()
    assert started.wait(DEADLINE_S)
    loop.stop()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the caller still waits for a loop that has ended"
    assert len(outcome) == 1
    assert isinstance(outcome[0], AlreadyClosed)


def test_a_call_after_the_loop_stopped_is_refused() -> None:
    loop = LoopThread("test-loop")
    loop.stop()

    async def nothing() -> None:
        return None

    with pytest.raises(AlreadyClosed):
        loop.run(nothing())
