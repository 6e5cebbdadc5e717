"""A loaded topic's idle managed ledger and cursor hold shared empty state, not containers of
their own (the memory per loaded topic, issue 14), and go back to it once a change is undone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.broker.ledger._position import EMPTY_MAP
from tests.broker.test_cursor import topic, unacked_bits
from tests.broker.test_managed_ledger import Env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    environment = Env(tmp_path)
    yield environment
    environment.storage.close()


async def test_an_opened_ledger_holds_no_lock_table_properties_or_write(env: Env) -> None:
    ml = await env.open()
    assert ml._lock is None
    assert ml._non_durable is None
    assert ml.properties is EMPTY_MAP
    assert ml._record_written is None  # the open's record is durable: nothing to keep
    reader = ml.new_non_durable_cursor()
    assert ml.non_durable_cursors == [reader]
    ml.release_non_durable_cursor(reader)
    assert ml._non_durable is None
    ml.set_property("k", "v")
    assert ml.properties == {"k": "v"}
    ml.set_property("k", None)
    assert ml.properties is EMPTY_MAP


async def test_a_cursor_returns_to_the_shared_empty_state(env: Env) -> None:
    _, cursor, e = await topic(env, 4)
    assert cursor.batch_deleted is EMPTY_MAP
    assert cursor.properties is EMPTY_MAP
    assert cursor.cursor_properties is EMPTY_MAP
    assert cursor.individually_deleted._firsts == ()
    await cursor.delete_batch_index(e[0], unacked_bits(4, {1}), 4)
    await cursor.delete([e[2]])
    assert dict(cursor.batch_deleted) == {e[0]: 0b1101}
    assert list(cursor.individually_deleted) == [(e[2], e[2])]
    await cursor.mark_delete(e[2])
    assert cursor.batch_deleted is EMPTY_MAP
    assert cursor.individually_deleted._firsts == ()
    assert not cursor.individually_deleted
    assert cursor.redelivery.increment(e[3])
    assert cursor.redelivery.discard([e[3]])
    assert cursor.redelivery._counts is EMPTY_MAP
    await cursor.set_cursor_property("a", "1")
    await cursor.remove_cursor_property("a")
    assert cursor.cursor_properties == {}
