"""Storage completions reach the loop through one inbox per loop: callbacks posted from a
storage thread before the loop has run the earlier ones share one wake-up, run in order,
and one that raises is reported without stopping the others."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from magnetar.broker.ledger._completions import (
    call_soon,
    close_storage_ledger,
    delete_storage_ledger,
)
from magnetar.storage import LedgerNotFoundError, Storage
from tests.storage.helpers import small_config

DEADLINE_S = 10.0


async def wait_for(predicate: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0)


async def test_callbacks_posted_together_share_one_wake_up_and_keep_their_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    wake_ups: list[object] = []
    original = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
        wake_ups.append(callback)
        return original(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    seen: list[int] = []
    poster = threading.Thread(target=lambda: [call_soon(loop, seen.append, i)
                                              for i in range(100)])
    poster.start()
    poster.join()  # all posted before the loop gets a turn
    await wait_for(lambda: len(seen) == 100)
    assert seen == list(range(100))
    assert len(wake_ups) == 1
    call_soon(loop, seen.append, 100)  # the inbox is empty again: a new wake-up
    await wait_for(lambda: len(seen) == 101)
    assert len(wake_ups) == 2


async def test_a_raising_callback_is_reported_and_the_rest_still_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    seen: list[str] = []

    def boom() -> None:
        raise ValueError("boom")

    def post() -> None:
        call_soon(loop, seen.append, "before")
        call_soon(loop, boom)
        call_soon(loop, seen.append, "after")

    poster = threading.Thread(target=post)
    poster.start()
    poster.join()
    try:
        await wait_for(lambda: len(seen) == 2)
    finally:
        loop.set_exception_handler(None)
    assert seen == ["before", "after"]
    assert [type(c["exception"]) for c in reported] == [ValueError]


async def test_ledgers_closed_or_deleted_in_one_turn_go_to_the_storage_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage.open(tmp_path, small_config())
    try:
        ids = [storage.create_ledger({"ml": "t"}).result(DEADLINE_S) for _ in range(6)]
        storage.add_entry(ids[0], b"x").result(DEADLINE_S)
        calls: list[tuple[str, list[int]]] = []
        for name in ("close_ledgers", "delete_ledgers"):
            original = getattr(storage, name)

            def spy(ledger_ids: list[int], name: str = name, original: Any = original) -> Any:
                calls.append((name, list(ledger_ids)))
                return original(ledger_ids)

            monkeypatch.setattr(storage, name, spy)
        assert await asyncio.gather(*(close_storage_ledger(storage, i) for i in ids[:4]),
                                    close_storage_ledger(storage, 999),
                                    return_exceptions=True) == [0, -1, -1, -1, ANY_NOT_FOUND]
        await asyncio.gather(*(delete_storage_ledger(storage, i) for i in [*ids[3:], 999]))
        assert calls == [("close_ledgers", [*ids[:4], 999]),
                         ("delete_ledgers", [*ids[3:], 999])]
        assert [info.state for info in storage.list_ledgers()] == ["closed"] * 3
    finally:
        storage.close()
    with Storage.open(tmp_path, small_config()) as reopened:  # closed and deleted for good
        assert [(i.ledger_id, i.state, i.entries) for i in reopened.list_ledgers()] == [
            (ids[0], "closed", 1), (ids[1], "closed", 0), (ids[2], "closed", 0)]


class _NotFound:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, LedgerNotFoundError)


ANY_NOT_FOUND = _NotFound()
