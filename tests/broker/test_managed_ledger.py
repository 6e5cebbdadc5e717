"""ManagedLedger on a real Storage: rollover (entries, size, age with the minimum), ordering of
concurrent adds, restart and crash recovery of the ledger list, position arithmetic across
ledgers, reads, trimming and retention (§7.1), searches by predicate and time, close/delete."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from magnetar.broker.ledger._managed_ledger import ManagedLedger, ManagedLedgerConfig, ml_key
from magnetar.broker.ledger._position import (
    InvalidPositionError,
    ManagedLedgerClosedError,
    ManagedLedgerTerminatedError,
    Position,
)
from magnetar.storage import Storage

P = Position

# Retention -1/-1 keeps every ledger, so rollover tests see the whole list.
KEEP_ALL = ManagedLedgerConfig(min_ledger_rollover_time_s=0, retention_time_minutes=-1,
                               retention_size_mb=-1)
MiB = 1024 * 1024


class FakeClock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    @property
    def ms(self) -> int:
        return int(self.now * 1000)


class Env:
    """A storage directory that a test can restart (clean close) or crash (abandon)."""

    def __init__(self, path: Path):
        self.path = path
        self.storage = Storage.open(path)
        self.clock = FakeClock()

    def restart(self) -> Storage:
        self.storage.close()
        self.storage = Storage.open(self.path)
        return self.storage

    def crash(self) -> Storage:
        self.storage.abandon()
        self.storage = Storage.open(self.path)
        return self.storage

    async def open(self, name: str = "topic", config: ManagedLedgerConfig = KEEP_ALL
                   ) -> ManagedLedger:
        return await ManagedLedger.open(self.storage, name, config, clock=self.clock)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    environment = Env(tmp_path)
    yield environment
    environment.storage.close()


async def add_many(ml: ManagedLedger, count: int, prefix: bytes = b"m") -> list[Position]:
    return [await ml.add_entry(prefix + b"%d" % i) for i in range(count)]


def entry_counts(ml: ManagedLedger) -> list[int]:
    return [ledger.entries for ledger in ml.ledgers()]


# -- rollover ------------------------------------------------------------------------------


async def test_rollover_by_entry_count(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=3))
    positions = await add_many(ml, 7)
    ids = [ledger.ledger_id for ledger in ml.ledgers()]
    assert entry_counts(ml) == [3, 3, 1]
    assert ids == sorted(ids)
    assert positions == [P(ids[0], 0), P(ids[0], 1), P(ids[0], 2), P(ids[1], 0),
                         P(ids[1], 1), P(ids[1], 2), P(ids[2], 0)]
    assert ml.last_confirmed_position == positions[-1]
    closed = ml.ledgers()[:-1]
    assert all(ledger.timestamp_ms == env.clock.ms for ledger in closed)
    assert ml.ledgers()[-1].timestamp_ms == 0
    assert [env.storage.ledger_info(i).state for i in ids] == ["closed", "closed", "open"]
    assert all(env.storage.ledger_info(i).metadata == {"ml": "topic"} for i in ids)


async def test_full_ledger_is_closed_right_after_the_add_that_filled_it(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=2))
    await add_many(ml, 2)
    assert entry_counts(ml) == [2, 0]  # closed at once: trimmable without a next add


async def test_rollover_by_size(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_size_per_ledger_bytes=100))
    for _ in range(5):
        await ml.add_entry(b"x" * 40)
    assert entry_counts(ml) == [3, 2]  # 120 bytes >= 100 after the third
    assert [ledger.size_bytes for ledger in ml.ledgers()] == [120, 80]
    assert ml.total_size_bytes == 200
    assert ml.number_of_entries == 5


async def test_rollover_by_age(env: Env) -> None:
    config = replace(KEEP_ALL, max_ledger_rollover_time_s=60, min_ledger_rollover_time_s=10)
    ml = await env.open(config=config)
    assert not await ml.rollover_if_full()  # empty ledgers never roll over
    env.clock.advance(100)
    assert not await ml.rollover_if_full()
    await ml.add_entry(b"a")  # the ledger is old enough: rolled over right after
    assert entry_counts(ml) == [1, 0]
    await ml.add_entry(b"b")
    env.clock.advance(59)
    assert not await ml.rollover_if_full()
    env.clock.advance(1)
    assert await ml.rollover_if_full()
    assert entry_counts(ml) == [1, 1, 0]


async def test_minimum_rollover_time_holds_back_a_full_ledger(env: Env) -> None:
    config = replace(KEEP_ALL, max_entries_per_ledger=1, min_ledger_rollover_time_s=10)
    ml = await env.open(config=config)
    await add_many(ml, 3)
    assert entry_counts(ml) == [3]  # full, but younger than the minimum
    env.clock.advance(10)
    assert not await ml.rollover_if_full()  # Pulsar wants age > minimum
    env.clock.advance(0.001)
    await ml.add_entry(b"next")  # rolls over first; the new ledger is young again
    assert entry_counts(ml) == [3, 1]


async def test_concurrent_adds_get_positions_in_call_order(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=7))
    payloads = [b"entry-%03d" % i for i in range(100)]
    positions = await asyncio.gather(*(ml.add_entry(p) for p in payloads))
    assert positions == sorted(positions)
    assert len(set(positions)) == 100
    assert entry_counts(ml)[:-1] == [7] * 14
    read = ml.read_entries(ml.first_position(), 1000, 10 * MiB)
    assert [data for _, data in read] == payloads
    assert [position for position, _ in read] == positions


async def test_hooks_see_every_new_last_position_in_order(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=2))
    seen: list[Position] = []
    ml.on_entries_added += (seen.append,)
    positions = await asyncio.gather(*(ml.add_entry(b"%d" % i) for i in range(5)))
    assert seen == list(positions)


# -- open, restart, crash ------------------------------------------------------------------


async def test_new_ml_has_one_empty_ledger(env: Env) -> None:
    ml = await env.open()
    [only] = ml.ledgers()
    assert only.entries == 0
    assert ml.last_confirmed_position == P(only.ledger_id, -1)
    assert ml.first_position() == P(only.ledger_id, -1)
    assert ml.read_entries(ml.first_position(), 10, MiB) == []
    record = json.loads(env.storage.metadata.get(ml_key("topic")) or b"")
    assert record["ledgers"] == [{"ledger_id": only.ledger_id, "entries": 0, "size": 0,
                                  "timestamp_ms": 0}]


async def test_restart_closes_the_last_ledger_and_writes_to_a_new_one(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=3))
    before = await add_many(ml, 5)
    old_current = ml.current_ledger_id
    env.restart()  # the ML is not closed: like a broker that stopped abruptly
    again = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=3))
    assert env.storage.ledger_info(old_current).state == "closed"
    assert entry_counts(again) == [3, 2, 0]
    assert again.ledgers()[1].size_bytes == len(b"m3") + len(b"m4")  # read back
    assert again.current_ledger_id > old_current
    assert again.last_confirmed_position == before[-1]
    position = await again.add_entry(b"after")
    assert position == P(again.ledgers()[-1].ledger_id, 0)
    datas = [data for _, data in again.read_entries(again.first_position(), 10, MiB)]
    assert datas == [b"m0", b"m1", b"m2", b"m3", b"m4", b"after"]


async def test_crash_keeps_every_acknowledged_add(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=4))
    positions = await add_many(ml, 10)
    env.crash()
    again = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=4))
    read = again.read_entries(again.first_position(), 100, MiB)
    assert [p for p, _ in read] == positions
    assert again.total_size_bytes == sum(len(b"m%d" % i) for i in range(10))


async def test_zero_entry_ledgers_are_dropped_on_open(env: Env) -> None:
    ml = await env.open()
    empty = ml.current_ledger_id
    env.restart()
    again = await env.open()
    assert empty not in [ledger.ledger_id for ledger in again.ledgers()]
    assert empty not in [info.ledger_id for info in env.storage.list_ledgers()]
    assert entry_counts(again) == [0]


async def test_orphan_ledgers_of_the_ml_are_deleted_on_open(env: Env) -> None:
    ml = await env.open()
    await ml.add_entry(b"kept")
    # What a rollover that crashed between creating a ledger and recording it leaves.
    orphan = await env.storage.create_ledger({"ml": "topic"})
    other = await env.storage.create_ledger({"ml": "another-topic"})
    env.restart()
    again = await env.open()
    live = [info.ledger_id for info in env.storage.list_ledgers()]
    assert orphan not in live
    assert other in live
    assert [d for _, d in again.read_entries(again.first_position(), 5, MiB)] == [b"kept"]


async def test_clean_close_records_the_current_ledger(env: Env) -> None:
    ml = await env.open()
    await add_many(ml, 3)
    await ml.close()
    assert ml.closed
    with pytest.raises(ManagedLedgerClosedError):
        await ml.add_entry(b"late")
    record = json.loads(env.storage.metadata.get(ml_key("topic")) or b"")
    [ledger] = record["ledgers"]
    assert ledger["entries"] == 3
    assert ledger["size"] == 6
    assert ledger["timestamp_ms"] == env.clock.ms
    again = await env.open()
    assert entry_counts(again) == [3, 0]


async def test_close_drops_an_empty_current_ledger(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=2))
    await add_many(ml, 2)
    empty = ml.current_ledger_id
    await ml.close()
    record = json.loads(env.storage.metadata.get(ml_key("topic")) or b"")
    assert [item["entries"] for item in record["ledgers"]] == [2]
    assert empty not in [info.ledger_id for info in env.storage.list_ledgers()]


async def test_properties_survive_a_restart(env: Env) -> None:
    ml = await env.open()
    ml.set_property("schema", "v1")
    ml.set_property("gone", "x")
    ml.set_property("gone", None)
    env.restart()
    again = await env.open()
    assert again.properties == {"schema": "v1"}


async def test_delete_removes_record_cursors_and_ledgers(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=2))
    await add_many(ml, 5)
    await ml.open_cursor("sub")
    ids = [ledger.ledger_id for ledger in ml.ledgers()]
    await ml.delete()
    assert env.storage.metadata.get(ml_key("topic")) is None
    assert env.storage.metadata.scan(b"cursor/topic\x00") == []
    live = {info.ledger_id for info in env.storage.list_ledgers()}
    assert live.isdisjoint(ids)
    env.restart()
    fresh = await env.open()
    assert fresh.number_of_entries == 0
    assert fresh.cursors == {}


# -- positions and reads -------------------------------------------------------------------


async def three_ledgers(env: Env) -> tuple[ManagedLedger, list[int]]:
    """Ledgers with 3, 3 and 2 entries; the last one is current."""
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=3))
    await add_many(ml, 8)
    return ml, [ledger.ledger_id for ledger in ml.ledgers()]


async def test_position_arithmetic_across_ledgers(env: Env) -> None:
    ml, (a, b, c) = await three_ledgers(env)
    assert ml.first_position() == P(a, -1)
    assert ml.next_position(P(a, -1)) == P(a, 0)
    assert ml.next_position(P(a, 2)) == P(b, 0)
    assert ml.next_position(P(a, 7)) == P(b, 0)  # not an entry: the next one
    assert ml.next_position(P(c, 1)) == P(c, 2)  # the write position
    assert ml.next_valid_position(P(c, 5)) == P(c, 2)  # capped at the write position
    assert ml.next_position(P(c, 5)) == P(c, 6)
    assert ml.previous_position(P(b, 0)) == P(a, 2)
    assert ml.previous_position(P(b, 2)) == P(b, 1)
    assert ml.previous_position(P(a, 0)) == P(a, -1)
    assert ml.write_position() == P(c, 2)
    assert ml.entries_between(P(a, 1), P(c, 0)) == 6
    assert ml.entries_between(P(a, -1), P(c, 99)) == 8
    assert ml.entries_between(P(b, 0), P(a, 2)) == 0
    assert ml.position_after_n(P(a, -1), 1) == P(a, 0)
    assert ml.position_after_n(P(a, 1), 4) == P(b, 2)
    assert ml.position_after_n(P(a, 1), 100) == P(c, 1)
    assert ml.first_entry_at_or_after(P(a - 1, 5)) == P(a, 0)
    assert ml.first_entry_at_or_after(P(b, 3)) == P(c, 0)
    assert ml.is_valid_position(P(b, 2))
    assert not ml.is_valid_position(P(b, 3))
    assert not ml.is_valid_position(P(c, 2))


async def test_read_entries_crosses_ledgers_and_honours_limits(env: Env) -> None:
    ml, (a, b, c) = await three_ledgers(env)
    read = ml.read_entries(P(a, 1), 4, MiB)
    assert [p for p, _ in read] == [P(a, 1), P(a, 2), P(b, 0), P(b, 1)]
    assert [d for _, d in read] == [b"m1", b"m2", b"m3", b"m4"]
    assert len(ml.read_entries(P(a, 0), 100, 5)) == 2  # 2 + 2 bytes fit, a third not
    assert len(ml.read_entries(P(a, 0), 100, 1)) == 1  # at least one entry
    assert [p for p, _ in ml.read_entries(P(b, 7), 10, MiB)] == [P(c, 0), P(c, 1)]
    assert ml.read_entries(P(c, 2), 10, MiB) == []
    assert ml.read_entry(P(b, 1)) == b"m4"
    with pytest.raises(InvalidPositionError):
        ml.read_entry(P(c, 2))


def _stamped(timestamp_ms: int) -> bytes:
    return struct.pack(">q", timestamp_ms) + b"payload"


def _stamp(data: bytes) -> int:
    value: int = struct.unpack_from(">q", data)[0]
    return value


async def test_find_newest_matching_and_position_by_time(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=3))
    positions = [await ml.add_entry(_stamped(1000 * (i + 1))) for i in range(10)]
    assert await ml.find_newest_matching(lambda d: _stamp(d) <= 4000) == positions[3]
    assert await ml.find_newest_matching(lambda d: _stamp(d) < 0) is None
    assert await ml.find_newest_matching(lambda d: True) == positions[-1]
    assert await ml.find_newest_matching(lambda d: _stamp(d) <= 4000,
                                         start=positions[5]) is None
    # Seek by time: the first entry whose timestamp is >= T.
    assert await ml.find_position_by_time(4500, _stamp) == positions[4]
    assert await ml.find_position_by_time(4000, _stamp) == positions[3]
    assert await ml.find_position_by_time(1, _stamp) == positions[0]
    assert await ml.find_position_by_time(99_999, _stamp) == ml.write_position()


# -- trimming and retention ----------------------------------------------------------------


async def test_without_cursors_every_closed_ledger_is_trimmed_by_default(env: Env) -> None:
    ml = await env.open(config=ManagedLedgerConfig(max_entries_per_ledger=2,
                                                   min_ledger_rollover_time_s=0))
    await add_many(ml, 5)  # each rollover trims what came before
    [current] = ml.ledgers()
    assert current.entries == 1
    assert ml.first_position() == P(current.ledger_id, -1)
    assert [info.ledger_id for info in env.storage.list_ledgers()] == [current.ledger_id]
    env.restart()
    again = await env.open()
    assert entry_counts(again) == [1, 0]


async def test_current_ledger_is_never_trimmed(env: Env) -> None:
    ml = await env.open(config=ManagedLedgerConfig(min_ledger_rollover_time_s=0))
    await add_many(ml, 3)
    assert ml.trim_consumed_ledgers(env.clock.ms + 10**9) == []
    assert entry_counts(ml) == [3]


async def test_slowest_durable_cursor_holds_ledgers_back(env: Env) -> None:
    config = ManagedLedgerConfig(max_entries_per_ledger=3, min_ledger_rollover_time_s=0)
    ml = await env.open(config=config)
    slow = await ml.open_cursor("slow", "earliest")
    fast = await ml.open_cursor("fast", "earliest")
    positions = await add_many(ml, 8)
    a, b, _ = [ledger.ledger_id for ledger in ml.ledgers()]
    await fast.mark_delete(positions[-1])
    assert entry_counts(ml) == [3, 3, 2]  # slow still at (a, -1)
    await slow.mark_delete(positions[1])  # inside a: nothing yet
    assert entry_counts(ml) == [3, 3, 2]
    await slow.mark_delete(positions[2])  # the last entry of a: a goes
    assert ml.ledgers()[0].ledger_id == b
    assert a not in [info.ledger_id for info in env.storage.list_ledgers()]
    await slow.mark_delete(positions[4])  # inside b
    assert ml.trim_consumed_ledgers() == []
    assert ml.ledgers()[0].ledger_id == b


async def test_retention_time_keeps_consumed_ledgers_until_expired(env: Env) -> None:
    config = ManagedLedgerConfig(max_entries_per_ledger=2, min_ledger_rollover_time_s=0,
                                 retention_time_minutes=1, retention_size_mb=-1)
    ml = await env.open(config=config)
    cursor = await ml.open_cursor("sub", "earliest")
    first_close = env.clock.ms
    positions = await add_many(ml, 2)  # ledger a closed at first_close
    env.clock.advance(30)
    positions += await add_many(ml, 2)  # ledger b closed 30 s later
    await cursor.mark_delete(positions[-1])
    assert entry_counts(ml) == [2, 2, 0]
    assert ml.trim_consumed_ledgers(first_close + 60_000) == []  # not strictly older
    [a, b, _] = [ledger.ledger_id for ledger in ml.ledgers()]
    assert ml.trim_consumed_ledgers(first_close + 60_001) == [a]
    assert ml.trim_consumed_ledgers(first_close + 90_001) == [b]


async def test_retention_size_keeps_the_newest_consumed_ledgers(env: Env) -> None:
    config = ManagedLedgerConfig(max_entries_per_ledger=1, min_ledger_rollover_time_s=0,
                                 retention_time_minutes=-1,
                                 retention_size_mb=250 / MiB)  # 250 bytes
    ml = await env.open(config=config)
    cursor = await ml.open_cursor("sub", "earliest")
    positions = [await ml.add_entry(b"x" * 100) for _ in range(4)]
    ids = [ledger.ledger_id for ledger in ml.ledgers()]
    await cursor.mark_delete(positions[-1])
    # 400 bytes in 4 closed ledgers: deleting the first leaves 300 (>= 250: delete);
    # deleting the second would leave 200 (< 250): the walk stops there.
    assert ids[0] not in [info.ledger_id for info in env.storage.list_ledgers()]
    assert [ledger.ledger_id for ledger in ml.ledgers()] == ids[1:]
    assert entry_counts(ml) == [1, 1, 1, 0]
    assert ml.total_size_bytes == 300


async def test_infinite_retention_keeps_everything(env: Env) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=1))
    cursor = await ml.open_cursor("sub", "earliest")
    positions = await add_many(ml, 3)
    await cursor.mark_delete(positions[-1])
    assert ml.trim_consumed_ledgers(env.clock.ms + 10**12) == []
    assert entry_counts(ml) == [1, 1, 1, 0]


async def test_non_durable_cursors_do_not_hold_back_and_are_moved(env: Env) -> None:
    ml = await env.open(config=ManagedLedgerConfig(max_entries_per_ledger=3,
                                                   min_ledger_rollover_time_s=0))
    durable = await ml.open_cursor("sub", "earliest")
    reader = ml.new_non_durable_cursor(None, "earliest")
    positions = await add_many(ml, 7)
    await reader.delete([positions[1]])
    await durable.mark_delete(positions[4])
    [b, c] = [ledger.ledger_id for ledger in ml.ledgers()]
    assert reader.mark_delete_position == P(b, -1)
    assert len(reader.individually_deleted) == 0
    assert reader.backlog() == 4  # b's 3 entries and c's one
    assert [p for p, _ in reader.read_entries(10)] == positions[3:]
    assert c == ml.current_ledger_id


async def test_trim_writes_metadata_before_deleting_ledgers(env: Env,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ml = await env.open(config=replace(KEEP_ALL, max_entries_per_ledger=2))
    await add_many(ml, 4)
    doomed = ml.ledgers()[0].ledger_id
    recorded_at_delete: list[list[int]] = []
    real_delete = env.storage.delete_ledger

    def spy(ledger_id: int) -> Any:
        record = json.loads(env.storage.metadata.get(ml_key("topic")) or b"")
        recorded_at_delete.append([item["ledger_id"] for item in record["ledgers"]])
        return real_delete(ledger_id)

    monkeypatch.setattr(env.storage, "delete_ledger", spy)
    second = ml.ledgers()[1].ledger_id
    ml.config = replace(ml.config, retention_size_mb=0)
    assert ml.trim_consumed_ledgers() == [doomed, second]
    assert len(recorded_at_delete) == 2
    assert all(doomed not in ids and second not in ids for ids in recorded_at_delete)


# -- termination ---------------------------------------------------------------------------


async def test_terminate_waits_for_adds_under_way_and_refuses_later_ones(env: Env) -> None:
    ml = await env.open()
    earlier = [asyncio.ensure_future(ml.add_entry(b"m%d" % i)) for i in range(5)]
    # Tasks start in creation order, so the adds reach the submit lock first.
    terminating = asyncio.ensure_future(ml.terminate())
    later = asyncio.ensure_future(ml.add_entry(b"late"))
    positions = [await add for add in earlier]
    last = await terminating
    assert last == positions[-1] == ml.last_confirmed_position
    with pytest.raises(ManagedLedgerTerminatedError):
        await later
    assert await ml.terminate() == last  # idempotent
    await ml.close()
    reopened = await ManagedLedger.open(env.crash(), "topic", KEEP_ALL, clock=env.clock)
    assert reopened.terminated_position == last
    with pytest.raises(ManagedLedgerTerminatedError):
        await reopened.add_entry(b"after a crash")
    assert json.loads(env.storage.metadata.get(ml_key("topic")) or b"{}")[
        "terminated"] == list(last)
