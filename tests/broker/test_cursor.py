"""ManagedCursor: ack arithmetic (§4.3), batch-index ack sets (§4.4), persistence across a
clean restart and a crash (§4.5), initial positions and readers (§4.6), seek/reset (§4.7),
backlog counting (§4.8), TTL expiry, and a state machine against a plain set model."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from magnetar.broker.ledger._cursor import ManagedCursor
from magnetar.broker.ledger._managed_ledger import ManagedLedger, ManagedLedgerConfig, ml_key
from magnetar.broker.ledger._ml_records import cursor_key
from magnetar.broker.ledger._position import (
    EARLIEST,
    LATEST,
    InvalidPositionError,
    Position,
    ack_set_to_int,
    int_to_ack_set,
)
from magnetar.storage import Storage, StorageConfig
from tests.broker.test_managed_ledger import (
    KEEP_ALL,
    Env,
    _stamp,
    _stamped,
    add_many,
)

P = Position


@pytest.fixture
def env(tmp_path: Path) -> Any:
    environment = Env(tmp_path)
    yield environment
    environment.storage.close()


def unacked_bits(batch_size: int, acked: set[int]) -> list[int]:
    """An ack set: bits 0..n-1 set except the acked indexes."""
    mask = sum(1 << i for i in range(batch_size) if i not in acked)
    return int_to_ack_set(mask)


def bits_of(words: list[int] | None) -> set[int]:
    assert words is not None
    mask = ack_set_to_int(words)
    return {i for i in range(mask.bit_length()) if mask >> i & 1}


async def topic(env: Env, count: int, config: ManagedLedgerConfig = KEEP_ALL,
                cursor: str = "c1") -> tuple[ManagedLedger, ManagedCursor, list[Position]]:
    ml = await env.open(config=config)
    c = await ml.open_cursor(cursor, "earliest")
    positions = await add_many(ml, count)
    return ml, c, positions


# -- individual and cumulative acks (§4.3) -------------------------------------------------


async def test_acks_e1_e2_then_mark_delete_leave_no_holes(env: Env) -> None:
    _, cursor, e = await topic(env, 5)
    await cursor.delete([e[1], e[2]])
    assert cursor.mark_delete_position < e[0]
    assert list(cursor.individually_deleted) == [(e[1], e[2])]
    await cursor.mark_delete(e[3])
    assert cursor.mark_delete_position == e[3]
    assert len(cursor.individually_deleted) == 0
    assert cursor.backlog() == 1


async def test_acks_e1_e2_e0_collapse_into_the_mark_delete(env: Env) -> None:
    _, cursor, e = await topic(env, 5)
    await cursor.delete([e[1]])
    await cursor.delete([e[2]])
    await cursor.delete([e[0]])
    assert cursor.mark_delete_position == e[2]
    assert len(cursor.individually_deleted) == 0
    assert cursor.read_position == e[3]


async def test_an_ack_of_runs_across_ledgers_matches_acks_one_by_one(env: Env) -> None:
    config = replace(KEEP_ALL, max_entries_per_ledger=4)
    _, cursor, e = await topic(env, 12, config=config)
    await cursor.delete_batch_index(e[5], unacked_bits(3, {0}), 3)  # a partial batch inside
    cursor.count_redelivery(e[6])
    await cursor.delete([e[9], e[2], e[3], e[4], e[5], e[6], e[3], e[10]])  # unsorted, repeated
    assert list(cursor.individually_deleted) == [(e[2], e[6]), (e[9], e[10])]
    assert cursor.individually_deleted.entry_count == 7
    assert cursor.get_ack_set(e[5]) is None
    assert cursor.redelivery.get(e[6]) == 0
    await cursor.delete([e[0], e[1]])
    assert cursor.mark_delete_position == e[6]
    assert list(cursor.individually_deleted) == [(e[9], e[10])]
    assert cursor.backlog() == 3


async def test_an_ack_with_a_position_that_is_no_entry_changes_nothing(env: Env) -> None:
    _, cursor, e = await topic(env, 4)
    for bad in (P(e[0].ledger_id, 4), P(e[0].ledger_id + 9, -1), P(e[0].ledger_id + 9, 0)):
        with pytest.raises(InvalidPositionError, match="is not an entry"):
            await cursor.delete([e[1], e[2], e[3], bad])
        assert len(cursor.individually_deleted) == 0
    await cursor.delete([e[1], P(e[0].ledger_id, -1)])  # at or below MD: no-ops, not errors
    assert list(cursor.individually_deleted) == [(e[1], e[1])]


async def test_mark_delete_extends_through_following_ranges(env: Env) -> None:
    _, cursor, e = await topic(env, 8, config=replace(KEEP_ALL, max_entries_per_ledger=3))
    await cursor.delete([e[3], e[4], e[6]])  # e[3] starts the second ledger
    await cursor.mark_delete(e[2])  # the end of the first ledger touches e[3]
    assert cursor.mark_delete_position == e[4]
    assert list(cursor.individually_deleted) == [(e[6], e[6])]
    assert cursor.backlog() == 2


async def test_mark_delete_twice_is_fine_and_backwards_fails(env: Env) -> None:
    _, cursor, e = await topic(env, 4)
    await cursor.mark_delete(e[2])
    await cursor.mark_delete(e[2], properties={"seq": 7})
    assert cursor.properties == {"seq": 7}
    with pytest.raises(InvalidPositionError):
        await cursor.mark_delete(e[1])
    with pytest.raises(InvalidPositionError):
        await cursor.mark_delete(P(e[3].ledger_id, 4))  # beyond the last entry
    with pytest.raises(InvalidPositionError):
        await cursor.delete([P(e[3].ledger_id, 9)])
    assert cursor.mark_delete_position == e[2]


async def test_mark_delete_may_move_to_the_start_of_the_next_ledger(env: Env) -> None:
    ml, cursor, e = await topic(env, 2, config=replace(KEEP_ALL, max_entries_per_ledger=2))
    current = ml.current_ledger_id
    assert ml.last_confirmed_position == e[1] < P(current, -1)
    await cursor.mark_delete(P(current, -1))
    assert cursor.mark_delete_position == P(current, -1)
    assert cursor.backlog() == 0


async def test_mark_delete_skipping_messages(env: Env) -> None:
    """ManagedCursorTest.markDeleteSkippingMessage."""

    _, cursor, e = await topic(env, 4, config=replace(KEEP_ALL, max_entries_per_ledger=10))
    assert cursor.entries_to_read() == 4
    await cursor.mark_delete(e[0])
    assert cursor.has_more_entries()
    assert cursor.entries_to_read() == 3
    assert cursor.read_position == e[1]
    assert [d for _, d in cursor.read_entries(1)] == [b"m1"]
    await cursor.mark_delete(e[3])
    assert not cursor.has_more_entries()
    assert cursor.entries_to_read() == 0
    assert cursor.read_position == P(e[3].ledger_id, e[3].entry_id + 1)


async def test_counting_with_deleted_entries(env: Env) -> None:
    """ManagedCursorTest.testCountingWithDeletedEntries (e1..e8 are e[0]..e[7])."""

    _, cursor, e = await topic(env, 8)
    assert cursor.entries_to_read() == 8
    await cursor.delete([e[7]])
    assert (cursor.entries_to_read(), cursor.backlog()) == (7, 7)
    await cursor.delete([e[0]])
    assert (cursor.entries_to_read(), cursor.backlog()) == (6, 6)
    await cursor.delete([e[6], e[5], e[4]])
    assert (cursor.entries_to_read(), cursor.backlog()) == (3, 3)


async def test_rewind(env: Env) -> None:
    _, cursor, e = await topic(env, 4)
    await cursor.delete([e[0]])
    assert len(cursor.read_entries(10)) == 3
    assert cursor.entries_to_read() == 0
    assert not cursor.has_more_entries()
    assert cursor.backlog() == 3
    cursor.rewind()
    assert cursor.read_position == e[1]
    assert cursor.entries_to_read() == 3


async def test_read_entries_skips_holes_and_honours_limits(env: Env) -> None:
    _, cursor, e = await topic(env, 9, config=replace(KEEP_ALL, max_entries_per_ledger=4))
    await cursor.delete([e[1], e[2], e[5]])
    assert [p for p, _ in cursor.read_entries(2)] == [e[0], e[3]]
    assert cursor.read_position == e[4]
    assert [p for p, _ in cursor.read_entries(100, max_bytes=5)] == [e[4], e[6]]
    assert [p for p, _ in cursor.read_entries(100, max_bytes=1)] == [e[7]]
    await cursor.delete([e[8]])
    assert not cursor.has_more_entries()
    assert cursor.read_entries(10) == []


async def test_skip_entries(env: Env) -> None:
    """ManagedCursorTest.testSkipEntries, on 2-entry ledgers."""

    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=2))
    cursor = await ml.open_cursor("c1")
    await cursor.skip_entries(1)  # an empty ledger
    assert cursor.entries_to_read() == 0
    e = await add_many(ml, 2)
    await cursor.skip_entries(1)
    assert cursor.entries_to_read() == 1
    await cursor.skip_entries(1)
    assert cursor.entries_to_read() == 0
    assert cursor.mark_delete_position == e[1]
    assert cursor.read_position == ml.write_position()
    await cursor.skip_entries(1)  # past the end
    assert cursor.mark_delete_position == e[1]


async def test_skip_entries_counts_deleted_entries_only_when_asked(env: Env) -> None:
    _, cursor, e = await topic(env, 8)
    await cursor.delete([e[1], e[2]])
    await cursor.skip_entries(2)  # e0 and e3: the deleted ones are not counted
    assert cursor.mark_delete_position == e[3]
    await cursor.skip_entries(2, include_deleted=True)
    assert cursor.mark_delete_position == e[5]
    assert cursor.backlog() == 2


async def test_clear_backlog_survives_a_reopen(env: Env) -> None:
    """ManagedCursorTest.testClearBacklog."""

    ml = await env.open()
    c1 = await ml.open_cursor("c1")
    await ml.add_entry(b"dummy-entry-1")
    c2 = await ml.open_cursor("c2")
    await ml.add_entry(b"dummy-entry-2")
    c3 = await ml.open_cursor("c3")
    await ml.add_entry(b"dummy-entry-3")
    assert [c.backlog() for c in (c1, c2, c3)] == [3, 2, 1]
    await c1.clear_backlog()
    await c3.clear_backlog()
    assert [c.backlog() for c in (c1, c2, c3)] == [0, 2, 0]
    assert [c.entries_to_read() for c in (c1, c2, c3)] == [0, 2, 0]
    await ml.close()
    env.restart()
    again = await env.open()
    assert [again.cursors[n].backlog() for n in ("c1", "c2", "c3")] == [0, 2, 0]


async def test_expire_until_jumps_over_unacked_entries(env: Env) -> None:
    _, cursor, e = await topic(env, 6)
    await cursor.delete([e[2], e[5]])
    await cursor.expire_until(e[3])
    assert cursor.mark_delete_position == e[3]
    assert list(cursor.individually_deleted) == [(e[5], e[5])]
    await cursor.expire_until(e[1])  # behind MD: nothing
    assert cursor.mark_delete_position == e[3]
    assert cursor.backlog() == 1


# -- persistence (§4.5) --------------------------------------------------------------------


async def out_of_order_acks(env: Env) -> list[Position]:
    _, cursor, e = await topic(env, 20)
    await cursor.delete([e[2], e[5], e[7], e[8], e[9]])
    assert cursor.backlog() == 15
    return e


async def check_out_of_order_recovery(env: Env, e: list[Position]) -> None:
    ml = await env.open()
    cursor = ml.cursors["c1"]
    assert cursor.backlog() == 15
    read = [p for p, _ in cursor.read_entries(100)]
    assert read == [e[i] for i in (0, 1, 3, 4, 6, *range(10, 20))]


async def test_out_of_order_delete_persistence_with_close(env: Env) -> None:
    """ManagedCursorTest.testOutOfOrderDeletePersistenceWithClose."""

    e = await out_of_order_acks(env)
    env.restart()
    await check_out_of_order_recovery(env, e)


async def test_out_of_order_delete_persistence_after_crash(env: Env) -> None:
    """…AfterCrash: an ack that returned survives a kill -9."""

    e = await out_of_order_acks(env)
    env.crash()
    await check_out_of_order_recovery(env, e)


async def test_every_returned_ack_survives_a_crash(env: Env) -> None:
    _, cursor, e = await topic(env, 12, config=replace(KEEP_ALL, max_entries_per_ledger=5))
    await cursor.mark_delete(e[3], properties={"dedup": 41})
    await cursor.delete([e[6]])
    await cursor.delete_batch_index(e[8], unacked_bits(4, {1}), 4)
    await cursor.set_cursor_property("owner", "me")
    env.crash()
    again = (await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=5)))
    recovered = again.cursors["c1"]
    assert recovered.mark_delete_position == e[3]
    assert list(recovered.individually_deleted) == [(e[6], e[6])]
    assert bits_of(recovered.get_ack_set(e[8])) == {0, 2, 3}
    assert recovered.properties == {"dedup": 41}
    assert recovered.cursor_properties == {"owner": "me"}
    assert recovered.read_position == e[4]


async def test_concurrent_acks_share_journal_writes(env: Env,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _, cursor, e = await topic(env, 50)
    writes: list[object] = []
    real = env.storage.metadata.apply_journaled

    def counting(ops: Any) -> Any:
        writes.append(ops)
        return real(ops)

    monkeypatch.setattr(env.storage.metadata, "apply_journaled", counting)
    await asyncio.gather(*(cursor.delete([p]) for p in reversed(e)))
    assert len(writes) == 2  # the first ack's write, then one for the other 49
    assert cursor.backlog() == 0
    env.crash()
    again = await env.open()
    assert again.cursors["c1"].mark_delete_position == e[-1]


async def test_ranges_beyond_the_persist_limit_are_redelivered_after_a_crash(env: Env) -> None:
    config = replace(KEEP_ALL, max_unacked_ranges_to_persist=2)
    _, cursor, e = await topic(env, 10, config=config)
    await cursor.delete([e[1], e[3], e[5]])
    assert cursor.backlog() == 7
    env.crash()
    again = await env.open(config=config)
    recovered = again.cursors["c1"]
    assert list(recovered.individually_deleted) == [(e[1], e[1]), (e[3], e[3])]
    assert recovered.backlog() == 8  # e[5] comes again


async def test_mark_delete_into_a_deleted_ledger_moves_to_the_next_one(env: Env) -> None:
    config = replace(KEEP_ALL, max_entries_per_ledger=3)
    ml, cursor, e = await topic(env, 7, config=config)
    await cursor.delete([e[4]])
    await cursor.mark_delete(e[1])
    await ml.close()
    # Drop the first ledger behind the cursor's back (what an old trim could leave).
    key = ml_key("topic")
    record = json.loads(env.storage.metadata.get(key) or b"")
    first = record["ledgers"].pop(0)["ledger_id"]
    # ML records ride the journal: rewrite it the same way.
    await env.storage.metadata.apply_journaled([(key, json.dumps(record).encode())])
    await env.storage.delete_ledger(first)
    again = await env.open(config=config)
    recovered = again.cursors["c1"]
    assert recovered.mark_delete_position == P(e[3].ledger_id, -1)
    assert recovered.read_position == e[3]
    assert list(recovered.individually_deleted) == [(e[4], e[4])]
    assert recovered.backlog() == 3


async def test_mark_delete_beyond_the_end_is_clamped(env: Env) -> None:
    ml, _, e = await topic(env, 3)
    await ml.close()
    key = cursor_key("topic", "c1")
    record = json.loads(env.storage.metadata.get(key) or b"")
    record["md"] = [e[2].ledger_id, 50]
    # Cursor records ride the journal: rewrite it the same way.
    await env.storage.metadata.apply_journaled([(key, json.dumps(record).encode())])
    env.restart()
    recovered = (await env.open()).cursors["c1"]
    assert recovered.mark_delete_position == e[2]
    assert recovered.backlog() == 0


async def test_deleted_cursor_is_gone_after_restart_and_stops_holding_data(env: Env) -> None:
    config = ManagedLedgerConfig(max_entries_per_ledger=2, min_ledger_rollover_time_s=0)
    ml = await env.open(config=config)
    await ml.open_cursor("gone", "earliest")
    await add_many(ml, 4)
    assert len(ml.ledgers()) == 3
    await ml.delete_cursor("gone")
    assert len(ml.ledgers()) == 1  # nothing holds the consumed ledgers any more
    env.restart()
    again = await env.open(config=config)
    assert again.cursors == {}


# -- batch-index acks (§4.4) ---------------------------------------------------------------


async def test_batch_index_acks_combine_with_and(env: Env) -> None:
    _, cursor, e = await topic(env, 3)
    await cursor.delete_batch_index(e[1], unacked_bits(10, {0, 1}), 10)
    assert bits_of(cursor.get_ack_set(e[1])) == set(range(2, 10))
    await cursor.delete_batch_index(e[1], unacked_bits(10, {5}), 10)
    assert bits_of(cursor.get_ack_set(e[1])) == set(range(2, 10)) - {5}
    await cursor.delete_batch_index(e[1], unacked_bits(10, {0}), 10)  # again: no change
    assert bits_of(cursor.get_ack_set(e[1])) == set(range(2, 10)) - {5}
    assert not cursor.is_acked(e[1])
    assert cursor.get_ack_set(e[0]) is None
    await cursor.delete_batch_index(e[1], unacked_bits(10, {9}), 10)
    # The given set still has bits 0 and 1: acked indexes never become unacked again.
    assert bits_of(cursor.get_ack_set(e[1])) == set(range(2, 9)) - {5}
    await cursor.delete_batch_index(e[1], unacked_bits(10, {2, 3, 4, 6, 7, 8}), 10)
    assert cursor.is_acked(e[1])  # fully acked: a deleted entry, bitset dropped
    assert cursor.get_ack_set(e[1]) is None
    assert list(cursor.individually_deleted) == [(e[1], e[1])]
    await cursor.delete([e[0]])
    assert cursor.mark_delete_position == e[1]


async def test_batch_index_acks_persist_and_recover(env: Env) -> None:
    """testBatchIndexesDeletionPersistAndRecover."""

    _, cursor, e = await topic(env, 4)
    for index, entry in enumerate(e):
        await cursor.delete_batch_index(entry, unacked_bits(100, {index, 70}), 100)
    env.crash()
    recovered = (await env.open()).cursors["c1"]
    for index, entry in enumerate(e):
        assert bits_of(recovered.get_ack_set(entry)) == set(range(100)) - {index, 70}
    assert recovered.get_ack_set(e[0]) == cursor.get_ack_set(e[0])
    assert len(recovered.get_ack_set(e[0]) or []) == 2  # 100 bits: two long words


async def test_cumulative_index_acks_never_regress(env: Env) -> None:
    """Cumulative at index 3, then 4, then 2 on a 10-message batch → acked [0..4]."""

    _, cursor, e = await topic(env, 4)
    for index in (3, 4, 2):
        await cursor.mark_delete(e[2], ack_set=unacked_bits(10, set(range(index + 1))))
        assert cursor.mark_delete_position == e[1]  # the entry before E
    assert bits_of(cursor.get_ack_set(e[2])) == set(range(5, 10))
    await cursor.mark_delete(e[2])  # the whole entry at last
    assert cursor.mark_delete_position == e[2]
    assert cursor.get_ack_set(e[2]) is None


async def test_cumulative_ack_set_without_index_acks_only_moves_before_the_entry(env: Env) -> None:
    config = replace(KEEP_ALL, batch_index_ack_enabled=False)
    _, cursor, e = await topic(env, 3, config=config)
    await cursor.mark_delete(e[1], ack_set=unacked_bits(10, {0, 1}))
    assert cursor.mark_delete_position == e[0]
    assert cursor.get_ack_set(e[1]) is None
    await cursor.delete_batch_index(e[2], unacked_bits(10, {0}), 10)  # ignored
    assert cursor.get_ack_set(e[2]) is None


async def test_reset_clears_bitsets_and_installs_the_given_one(env: Env) -> None:
    _, cursor, e = await topic(env, 5)
    await cursor.delete_batch_index(e[1], unacked_bits(10, {1}), 10)
    await cursor.delete_batch_index(e[3], unacked_bits(10, {1}), 10)
    await cursor.delete([e[4]])
    await cursor.reset(e[3], ack_set=unacked_bits(10, {0, 1, 2}))
    assert cursor.get_ack_set(e[1]) is None
    assert bits_of(cursor.get_ack_set(e[3])) == set(range(3, 10))
    assert len(cursor.individually_deleted) == 0
    assert cursor.mark_delete_position == e[2]
    assert cursor.backlog() == 2


# -- seek / reset (§4.7) -------------------------------------------------------------------


async def test_seek_by_message_id_backlogs(env: Env) -> None:
    """SubscriptionSeekTest.testSeek: 10 entries; 5 / earliest / latest / out of range."""

    ml, cursor, e = await topic(env, 10)
    ledger = e[0].ledger_id
    await cursor.reset(e[5])
    assert cursor.backlog() == 5
    assert [p for p, _ in cursor.read_entries(1)] == [e[5]]  # from the sought entry on
    await cursor.reset(EARLIEST)
    assert cursor.backlog() == 10
    await cursor.reset(LATEST)
    assert cursor.backlog() == 0
    await cursor.reset(P(ledger - 1, 0))
    assert cursor.backlog() == 10
    await cursor.reset(P(ledger + 1, 0))
    assert cursor.backlog() == 0
    assert cursor.read_position == ml.write_position()


async def test_seek_by_time_backlogs(env: Env) -> None:
    """SubscriptionSeekTest.testSeekTime: seek(now) → 0, seek(now - 100 s) → 10."""

    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=4))
    cursor = await ml.open_cursor("c1", "earliest")
    now = env.clock.ms
    for i in range(10):
        await ml.add_entry(_stamped(now - 50 + i))
    await cursor.reset_by_time(now, _stamp)
    assert cursor.backlog() == 0
    await cursor.reset_by_time(now - 100_000, _stamp)
    assert cursor.backlog() == 10
    await cursor.reset_by_time(now - 45, _stamp)  # entries 5..9 are at or after it
    assert cursor.backlog() == 5


async def test_seek_moves_only_the_read_position(env: Env) -> None:
    _, cursor, e = await topic(env, 6)
    await cursor.mark_delete(e[2])
    cursor.seek(e[5])
    assert cursor.read_position == e[5]
    cursor.seek(e[1])  # at or below MD: the entry after MD
    assert cursor.read_position == e[3]
    assert cursor.backlog() == 3


# -- initial positions and readers (§4.6) --------------------------------------------------


async def test_new_durable_cursor_initial_positions(env: Env) -> None:
    ml = await env.open()
    e = await add_many(ml, 4)
    latest = await ml.open_cursor("latest", "latest")
    earliest = await ml.open_cursor("earliest", "earliest")
    assert (latest.backlog(), latest.mark_delete_position) == (0, e[3])
    assert (earliest.backlog(), earliest.mark_delete_position) == (4, P(e[0].ledger_id, -1))
    again = await ml.open_cursor("latest", "earliest")  # an existing one ignores it
    assert again is latest
    assert env.storage.metadata.get(cursor_key("topic", "earliest")) is not None


async def test_a_new_cursor_survives_a_crash_right_after_open_cursor(env: Env) -> None:
    ml = await env.open()
    e = await add_many(ml, 3)
    await ml.open_cursor("sub", "latest", properties={"k": 1})
    env.crash()
    recovered = (await env.open()).cursors["sub"]
    assert recovered.mark_delete_position == e[2]
    assert recovered.properties == {"k": 1}
    assert recovered.backlog() == 0


async def test_cursor_properties_can_be_replaced_and_removed(env: Env) -> None:
    _, cursor, _ = await topic(env, 1)
    await cursor.set_cursor_properties({"a": "1", "b": "2"})
    await cursor.remove_cursor_property("a")
    await cursor.set_cursor_property("c", "3")
    env.crash()
    recovered = (await env.open()).cursors["c1"]
    assert recovered.cursor_properties == {"b": "2", "c": "3"}


async def test_backlog_size_estimate_follows_ledger_sizes(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=4))
    cursor = await ml.open_cursor("c1", "earliest")
    e = [await ml.add_entry(b"x" * 10) for _ in range(6)]
    assert cursor.estimated_backlog_size_bytes() == 60
    await cursor.mark_delete(e[1])
    assert cursor.estimated_backlog_size_bytes() == 40
    await cursor.mark_delete(e[3])
    assert cursor.estimated_backlog_size_bytes() == 20


async def test_reader_cursors_start_at_the_given_entry(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=3))
    e = await add_many(ml, 7)
    at = ml.new_non_durable_cursor(e[4], "latest")
    assert at.mark_delete_position == P(e[4].ledger_id, e[4].entry_id - 1)
    assert [p for p, _ in at.read_entries(1)] == [e[4]]
    first_of_ledger = ml.new_non_durable_cursor(e[3], "latest")
    assert [p for p, _ in first_of_ledger.read_entries(1)] == [e[3]]
    assert ml.new_non_durable_cursor(EARLIEST, "latest").backlog() == 7
    assert ml.new_non_durable_cursor(None, "latest").backlog() == 0
    assert ml.new_non_durable_cursor(None, "earliest").backlog() == 7
    assert ml.new_non_durable_cursor(LATEST, "earliest").backlog() == 7
    beyond = P(ml.current_ledger_id + 5, 0)
    assert ml.new_non_durable_cursor(beyond, "latest").backlog() == 0
    assert env.storage.metadata.scan(b"cursor/topic\x00") == []  # nothing persisted


# -- a state machine against a plain set model ---------------------------------------------


RESTARTS_PER_RUN_MAX = 2  # a storage reopen costs ~40 ms; keep the default run fast


class CursorAgainstSetModel(RuleBasedStateMachine):
    """Random adds, individual acks, cumulative acks, batch acks and restarts on small
    ledgers, checked against the set of acknowledged positions."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="cursor-sm-")
        self.loop = asyncio.new_event_loop()
        self.config = replace(KEEP_ALL, max_entries_per_ledger=3)
        self.storage_config = StorageConfig(journal_sync=False)
        self.storage = Storage.open(self.directory, self.storage_config)
        self.ml = self.loop.run_until_complete(
            ManagedLedger.open(self.storage, "sm", self.config))
        self.cursor = self.loop.run_until_complete(self.ml.open_cursor("c", "earliest"))
        self.entries: list[Position] = []
        self.acked: set[Position] = set()
        self.restarts = 0

    def teardown(self) -> None:
        self.storage.close()
        self.loop.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    @initialize(count=st.integers(1, 8))
    def start(self, count: int) -> None:
        self.add(count)

    @rule(count=st.integers(1, 4))
    def add(self, count: int) -> None:
        for _ in range(count):
            self.entries.append(self._run(self.ml.add_entry(b"x")))

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def ack_individual(self, data: st.DataObject) -> None:
        picks = data.draw(st.lists(st.sampled_from(self.entries), min_size=1, max_size=6))
        self._run(self.cursor.delete(picks))
        self.acked.update(picks)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def ack_cumulative(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(self.entries))
        if target < self.cursor.mark_delete_position:
            with pytest.raises(InvalidPositionError):
                self._run(self.cursor.mark_delete(target))
            return
        self._run(self.cursor.mark_delete(target))
        self.acked.update(p for p in self.entries if p <= target)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def ack_batch_indexes(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(self.entries))
        indexes = data.draw(st.sets(st.integers(0, 2), min_size=1))
        self._run(self.cursor.delete_batch_index(target, unacked_bits(3, indexes), 3))
        if target in self.acked:
            return
        remaining = bits_of(self.cursor.get_ack_set(target)) if not self.cursor.is_acked(
            target) else set()
        if not remaining:
            self.acked.add(target)

    @rule(count=st.integers(0, 5))
    def skip(self, count: int) -> None:
        self._run(self.cursor.skip_entries(count))
        unacked = self._unacked()
        if count:
            self._ack_up_to(unacked[min(count, len(unacked)) - 1] if unacked else None)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(self.entries))
        self._run(self.cursor.expire_until(target))
        self._ack_up_to(target)

    @rule()
    def clear_backlog(self) -> None:
        self._run(self.cursor.clear_backlog())
        self.acked.update(self.entries)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from([*self.entries, EARLIEST, LATEST]))
        self._run(self.cursor.reset(target))
        self.acked = {p for p in self.entries if p < target}

    @rule()
    def read_everything_after_rewind(self) -> None:
        self.cursor.rewind()
        read = [p for p, _ in self.cursor.read_entries(1000)]
        assert read == self._unacked()
        assert self.cursor.entries_to_read() == 0

    def _unacked(self) -> list[Position]:
        return [p for p in self.entries if p not in self.acked]

    def _ack_up_to(self, position: Position | None) -> None:
        if position is not None:
            self.acked.update(p for p in self.entries if p <= position)

    @precondition(lambda self: self.restarts < RESTARTS_PER_RUN_MAX)
    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        self.restarts += 1
        if crash:
            self.storage.abandon()
        else:
            self._run(self.ml.close())
            self.storage.close()
        self.storage = Storage.open(self.directory, self.storage_config)
        self.ml = self._run(ManagedLedger.open(self.storage, "sm", self.config))
        self.cursor = self.ml.cursors["c"]

    @invariant()
    def matches_the_model(self) -> None:
        unacked = [p for p in self.entries if p not in self.acked]
        assert self.cursor.backlog() == len(unacked)
        if unacked:
            expected_md = self.ml.previous_position(unacked[0])
        elif self.entries:
            expected_md = self.entries[-1]
        else:
            expected_md = self.cursor.mark_delete_position
        assert self.cursor.mark_delete_position == expected_md
        for position in self.entries:
            assert self.cursor.is_acked(position) == (position in self.acked)
        self.cursor.individually_deleted.check()
        assert self.cursor.read_position > self.cursor.mark_delete_position


TestCursorAgainstSetModel = CursorAgainstSetModel.TestCase
TestCursorAgainstSetModel.settings = settings(max_examples=30, stateful_step_count=25,
                                              deadline=None)


@pytest.mark.slow
def test_cursor_against_set_model_long() -> None:
    run_state_machine_as_test(CursorAgainstSetModel,
                              settings=settings(max_examples=500, stateful_step_count=50,
                                                deadline=None))
