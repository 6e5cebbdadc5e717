"""Completion: results, timeouts, callbacks, errors, and awaiting from asyncio."""

from __future__ import annotations

import asyncio
import threading

import pytest

from magnetar.storage import Completion, StorageFailedError
from magnetar.storage._completion import set_results


def test_result_of_a_resolved_completion() -> None:
    done = Completion.resolved(7)
    assert done.done()
    assert done.result() == 7
    assert done.result(timeout=0) == 7
    assert done.exception() is None


def test_result_after_set_result() -> None:
    pending: Completion[str] = Completion()
    assert not pending.done()
    pending.set_result("value")
    assert pending.done()
    assert pending.result(0) == "value"


def test_none_is_a_valid_result() -> None:
    pending: Completion[None] = Completion()
    pending.set_result(None)
    assert pending.done()
    assert pending.result(0) is None


def test_result_times_out_while_pending_and_the_operation_goes_on() -> None:
    pending: Completion[int] = Completion()
    with pytest.raises(TimeoutError):
        pending.result(timeout=0.01)
    assert not pending.done()
    pending.set_result(3)
    assert pending.result(timeout=0.01) == 3


def test_result_blocks_until_another_thread_completes() -> None:
    pending: Completion[int] = Completion()
    waiting = threading.Event()
    got: list[int] = []

    def waiter() -> None:
        waiting.set()
        got.append(pending.result(timeout=10))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(10)
    pending.set_result(42)
    thread.join(10)
    assert not thread.is_alive()
    assert got == [42]


def test_exception_propagates_from_result() -> None:
    error = StorageFailedError("disk gone", path="/x", errno=5)
    pending: Completion[int] = Completion()
    pending.set_exception(error)
    assert pending.done()
    assert pending.exception() is error
    with pytest.raises(StorageFailedError) as caught:
        pending.result(0)
    assert caught.value is error


def test_failed_constructor() -> None:
    failed: Completion[int] = Completion.failed(ValueError("nope"))
    assert failed.done()
    with pytest.raises(ValueError, match="nope"):
        failed.result()


def test_callback_added_before_completion_runs_in_the_completing_thread() -> None:
    pending: Completion[int] = Completion()
    seen: list[tuple[int, str]] = []
    pending.add_done_callback(lambda c: seen.append((c.result(0), threading.current_thread().name)))
    pending.add_done_callback(lambda c: seen.append((c.result(0) * 10, "second")))
    assert seen == []
    thread = threading.Thread(target=pending.set_result, args=(5,), name="completer")
    thread.start()
    thread.join(10)
    assert seen == [(5, "completer"), (50, "second")]


def test_callback_added_after_completion_runs_at_once() -> None:
    done = Completion.resolved(9)
    seen: list[int] = []
    done.add_done_callback(lambda c: seen.append(c.result(0)))
    assert seen == [9]


def test_callback_sees_the_error() -> None:
    pending: Completion[int] = Completion()
    seen: list[BaseException | None] = []
    pending.add_done_callback(lambda c: seen.append(c.exception()))
    error = RuntimeError("boom")
    pending.set_exception(error)
    assert seen == [error]


def test_completes_only_once() -> None:
    pending: Completion[int] = Completion()
    pending.set_result(1)
    with pytest.raises(AssertionError):
        pending.set_result(2)
    with pytest.raises(AssertionError):
        pending.set_exception(RuntimeError())
    assert pending.result(0) == 1


async def test_await_while_another_thread_completes() -> None:
    pendings: list[Completion[int]] = [Completion() for _ in range(50)]
    started = threading.Event()

    def complete_all() -> None:
        started.wait(10)
        for number, pending in enumerate(pendings):
            pending.set_result(number)

    thread = threading.Thread(target=complete_all)
    thread.start()
    try:
        gathered = asyncio.gather(*(_await(p) for p in pendings))
        await asyncio.sleep(0)  # let every await register before completing
        started.set()
        assert await asyncio.wait_for(gathered, timeout=10) == list(range(50))
    finally:
        thread.join(10)


async def test_await_raises_the_error() -> None:
    pending: Completion[int] = Completion()
    loop = asyncio.get_running_loop()
    loop.call_soon(lambda: threading.Thread(
        target=pending.set_exception, args=(StorageFailedError("sync failed"),)).start())
    with pytest.raises(StorageFailedError, match="sync failed"):
        await asyncio.wait_for(_await(pending), timeout=10)


async def test_await_of_a_done_completion_does_not_suspend() -> None:
    assert await Completion.resolved(11) == 11


async def _await(pending: Completion[int]) -> int:
    return await pending


def test_completing_after_the_awaiting_loop_closed_does_not_raise() -> None:
    """A coroutine awaits a completion, then its loop is closed (a process shutting down
    its broker's loop while a write is in flight). The thread that completes it later (the
    journal's, the checkpointer's) must go on: before, `set_result` raised the loop's
    "Event loop is closed" into that thread and stopped it."""
    pending: Completion[int] = Completion()
    loop = asyncio.new_event_loop()

    async def waits() -> int:
        return await pending

    task = loop.create_task(waits())
    loop.run_until_complete(asyncio.sleep(0))  # the task now waits on `pending`
    loop.close()
    pending.set_result(1)  # must not raise
    assert pending.result() == 1
    assert not task.done()


def test_set_results_finishes_a_run_in_order_and_releases_its_waiters() -> None:
    """`set_results` (a journal group commit): every completion of the list gets its value,
    None entries are skipped, each one's callbacks run in list order, and a thread blocked
    on one of them wakes."""
    run: list[Completion[int] | None] = [Completion(), None, Completion(), Completion()]
    calls: list[tuple[str, int]] = []
    for name, completion in zip("abcd", run, strict=True):
        if completion is not None:
            completion.add_done_callback(lambda c, n=name: calls.append((n, c.result(0))))
    last = run[-1]
    assert last is not None
    last.add_done_callback(lambda c: calls.append(("d again", c.result(0))))
    blocked_got: list[int] = []
    started = threading.Event()

    def block() -> None:
        started.set()
        blocked_got.append(last.result(10))

    waiter = threading.Thread(target=block)
    waiter.start()
    assert started.wait(10)
    set_results(run, [1, 2, 3, 4])
    waiter.join(10)
    assert blocked_got == [4]
    assert calls == [("a", 1), ("c", 3), ("d", 4), ("d again", 4)]
    assert [c.result(0) for c in run if c is not None] == [1, 3, 4]
    with pytest.raises(AssertionError, match="finishes once"):
        set_results(run[:1], [5])
