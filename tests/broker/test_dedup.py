"""Deduplication state: upstream's MessageDuplicationTest and ClientDeduplicationTest examples
(reference §5, §11 items 35-37), snapshots, recovery and inactive-producer purging."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.broker._config import BrokerConfig
from magnetar.broker._errors import MetadataError
from magnetar.broker.topics._dedup import (
    DeduplicationState,
    DedupResult,
    decode_dedup_snapshot,
    encode_dedup_snapshot,
)

NOT_DUP = DedupResult.NOT_DUP
DUP = DedupResult.DUP
UNKNOWN = DedupResult.UNKNOWN
NO_HIGHEST = -1  # the PublishContext default when the send carries no highest sequence id


def test_decision_table_of_message_duplication_test() -> None:
    state = DeduplicationState(entries_interval=10, producers_max=10)
    assert state.check("producer1", 0, NO_HIGHEST) is NOT_DUP
    assert state.highest_pushed("producer1") == 0
    assert state.check("producer2", 1, NO_HIGHEST) is NOT_DUP
    assert state.highest_pushed("producer2") == 1
    assert state.check("producer1", 1, NO_HIGHEST) is NOT_DUP
    assert state.highest_pushed("producer1") == 1
    assert state.check("producer1", 5, NO_HIGHEST) is NOT_DUP
    assert state.highest_pushed("producer1") == 5
    # Nothing persisted yet: an old id may still be in flight.
    assert state.check("producer1", 0, NO_HIGHEST) is UNKNOWN
    assert state.highest_pushed("producer1") == 5

    state.record_persisted("producer1", 0, NO_HIGHEST)
    assert state.highest_persisted("producer1") == 0
    assert state.check("producer1", 0, NO_HIGHEST) is DUP
    assert state.highest_pushed("producer1") == 5


def test_lowest_id_is_checked_highest_is_stored() -> None:
    state = DeduplicationState()
    state.check("p", 0, NO_HIGHEST)
    state.record_persisted("p", 0, NO_HIGHEST)
    assert state.check("p", 1, 5) is NOT_DUP  # batch 1..5
    assert state.highest_pushed("p") == 5
    assert state.check("p", 4, 8) is UNKNOWN  # 4 <= pushed 5, > persisted 0
    assert state.highest_pushed("p") == 5
    state.record_persisted("p", 1, 5)
    assert state.highest_persisted("p") == 5
    assert state.check("p", 4, 8) is DUP


def test_client_deduplication_discontinuous_sequence_ids() -> None:
    # Batch {2,3,5} is accepted; then 2 (dup), 4 (dup: 4 <= 5) and 6 (new).
    state = DeduplicationState()
    written: list[tuple[int, int]] = []
    for sequence_id, highest in [(2, 5), (2, 2), (4, 4), (6, 6)]:
        if state.check("producer", sequence_id, highest) is NOT_DUP:
            state.record_persisted("producer", sequence_id, highest)
            written.append((sequence_id, highest))
    assert written == [(2, 5), (6, 6)]  # 3 + 1 = the 4 messages the consumer sees
    assert state.last_sequence_id("producer") == 6

    # After a restart: an empty snapshot, then replay of every entry.
    recovered = DeduplicationState()
    recovered.restore({}, now=0)
    for sequence_id, highest in written:
        recovered.replay_entry("producer", sequence_id, highest, now=0)
    assert recovered.last_sequence_id("producer") == 6
    assert recovered.check("producer", 6, 6) is DUP
    assert recovered.check("producer", 7, 7) is NOT_DUP


def test_last_sequence_id_after_reconnect() -> None:
    state = DeduplicationState()
    assert state.last_sequence_id("p") == -1
    for sequence_id in range(10):
        assert state.check("p", sequence_id, 0) is NOT_DUP
        state.record_persisted("p", sequence_id, 0)
    state.producer_disconnected("p", now=0)
    state.producer_connected("p")
    assert state.last_sequence_id("p") == 9
    assert state.last_sequence_id("other") == -1


def test_write_failure_resets_pushed_to_persisted() -> None:
    # MessageDuplicationTest.testIsDuplicateWithFailure, on the state alone.
    state = DeduplicationState()

    def publish_and_persist(producer: str, sequence_id: int) -> None:
        assert state.check(producer, sequence_id, NO_HIGHEST) is NOT_DUP
        state.record_persisted(producer, sequence_id, NO_HIGHEST)
        assert state.highest_pushed(producer) == sequence_id
        assert state.highest_persisted(producer) == sequence_id

    publish_and_persist("producer1", 0)
    publish_and_persist("producer2", 1)
    publish_and_persist("producer1", 1)
    publish_and_persist("producer1", 5)
    assert state.check("producer1", 0, NO_HIGHEST) is DUP
    assert state.highest_pushed("producer1") == 5

    assert state.check("producer1", 6, NO_HIGHEST) is NOT_DUP  # in flight
    assert (state.highest_pushed("producer1"), state.highest_persisted("producer1")) == (6, 5)
    assert state.check("producer1", 6, NO_HIGHEST) is UNKNOWN  # resent before it completed
    state.record_persisted("producer1", 6, NO_HIGHEST)  # it completes

    assert state.check("producer1", 7, NO_HIGHEST) is NOT_DUP
    state.reset_pushed_to_persisted()  # the write of 7 failed
    assert state.highest_pushed("producer1") == 6
    assert state.highest_persisted("producer1") == 6
    assert state.highest_pushed("producer2") == 1
    assert state.highest_persisted("producer2") == 1

    assert state.check("producer1", 6, NO_HIGHEST) is DUP
    assert state.highest_pushed("producer1") == 6
    publish_and_persist("producer1", 8)


def test_reset_forgets_producers_that_never_persisted() -> None:
    state = DeduplicationState()
    assert state.check("new", 3, 3) is NOT_DUP
    state.reset_pushed_to_persisted()
    assert state.last_sequence_id("new") == -1
    assert state.check("new", 3, 3) is NOT_DUP


def test_only_the_last_chunk_is_checked_and_recorded() -> None:
    state = DeduplicationState()
    for _ in range(2):
        assert state.check("p", 7, 7, is_chunk_not_last=True) is NOT_DUP
        assert state.highest_pushed("p") is None
    assert state.check("p", 7, 7) is NOT_DUP  # the last chunk
    state.record_persisted("p", 7, 7, is_chunk_not_last=True)
    assert state.highest_persisted("p") is None
    state.record_persisted("p", 7, 7)
    assert state.highest_persisted("p") == 7
    assert state.entries_since_snapshot == 2  # every chunk entry counts
    # A resent chunked message: the first chunks pass, the last is the duplicate.
    assert state.check("p", 7, 7, is_chunk_not_last=True) is NOT_DUP
    assert state.check("p", 7, 7) is DUP


def test_clear_forgets_everything() -> None:
    state = DeduplicationState()
    state.check("p", 1, 1)
    state.record_persisted("p", 1, 1)
    state.producer_disconnected("p", now=0)
    state.clear()
    assert state.last_sequence_id("p") == -1
    assert state.snapshot() == {}
    assert state.entries_since_snapshot == 0
    assert state.purge_inactive(now=10**9, inactivity_timeout_ms=1) == []


# -- inactive producers -----------------------------------------------------------------------

MINUTE_MS = 60_000


def test_inactive_producers_are_purged_after_the_timeout() -> None:
    state = DeduplicationState()
    for name in ("test1", "test2", "test3"):
        state.producer_connected(name)
        assert state.check(name, 1, 2) is NOT_DUP
    state.producer_disconnected("test2", now=0)
    state.producer_disconnected("test3", now=0)
    state.producer_disconnected("test1", now=50_000)
    assert state.purge_inactive(now=0, inactivity_timeout_ms=MINUTE_MS) == []
    assert state.purge_inactive(now=70_000, inactivity_timeout_ms=MINUTE_MS) == [
        "test2", "test3"]
    assert state.last_sequence_id("test1") == 2
    assert state.last_sequence_id("test2") == -1
    assert state.last_sequence_id("test3") == -1
    # test1 stays stamped and goes once its own timeout passed.
    assert state.purge_inactive(now=110_001, inactivity_timeout_ms=MINUTE_MS) == ["test1"]


def test_reconnect_clears_the_inactivity_stamp() -> None:
    state = DeduplicationState()
    state.check("p", 1, 1)
    state.producer_disconnected("p", now=0)
    state.producer_connected("p")
    assert state.purge_inactive(now=10 * MINUTE_MS, inactivity_timeout_ms=MINUTE_MS) == []
    assert state.last_sequence_id("p") == 1


def test_producer_is_inactive_only_when_the_last_one_with_its_name_left() -> None:
    state = DeduplicationState()
    state.check("p", 1, 1)
    state.producer_connected("p")
    state.producer_connected("p")  # a successor with the same name, before the old one left
    state.producer_disconnected("p", now=0)
    assert state.purge_inactive(now=10 * MINUTE_MS, inactivity_timeout_ms=MINUTE_MS) == []
    state.producer_disconnected("p", now=0)
    assert state.purge_inactive(now=10 * MINUTE_MS, inactivity_timeout_ms=MINUTE_MS) == ["p"]


def test_recovered_producers_are_stamped_inactive_unless_connected() -> None:
    state = DeduplicationState()
    state.producer_connected("live")
    state.restore({"gone": 4, "live": 9}, now=0)
    state.replay_entry("replayed", 1, 3, now=0)
    purged = state.purge_inactive(now=2 * MINUTE_MS, inactivity_timeout_ms=MINUTE_MS)
    assert purged == ["gone", "replayed"]
    assert state.last_sequence_id("live") == 9


# -- snapshots --------------------------------------------------------------------------------


def test_snapshot_is_persisted_values_capped_in_name_order() -> None:
    state = DeduplicationState(producers_max=3)
    for name, sequence_id in [("d", 4), ("b", 2), ("e", 5), ("a", 1), ("c", 3)]:
        state.check(name, sequence_id, sequence_id)
        state.record_persisted(name, sequence_id, sequence_id)
    state.check("a", 10, 10)  # pushed only: not in the snapshot
    assert state.snapshot() == {"a": 1, "b": 2, "c": 3}
    assert list(state.snapshot()) == ["a", "b", "c"]


def test_snapshot_due_after_the_entries_interval() -> None:
    state = DeduplicationState(entries_interval=1000, snapshot_interval_ms=0)
    for sequence_id in range(999):
        state.check("p", sequence_id, sequence_id)
        state.record_persisted("p", sequence_id, sequence_id)
    assert state.entries_since_snapshot == 999
    assert not state.should_snapshot(now=0)
    state.check("p", 999, 999)
    state.record_persisted("p", 999, 999)
    assert state.should_snapshot(now=0)

    assert state.begin_snapshot() == {"p": 999}
    assert state.snapshot_running
    assert state.entries_since_snapshot == 0
    state.record_persisted("p", 1000, 1000)
    assert not state.should_snapshot(now=0)  # one at a time
    state.end_snapshot(now=5, succeeded=True)
    assert not state.snapshot_running
    assert not state.should_snapshot(now=5)
    assert state.entries_since_snapshot == 1


def test_snapshot_due_after_the_time_interval_when_entries_were_written() -> None:
    state = DeduplicationState(entries_interval=1000, snapshot_interval_ms=120_000)
    # Upstream starts with no snapshot time, so the first periodic check with entries fires.
    state.record_persisted("p", 1, 1)
    assert state.should_snapshot(now=1_000_000)
    state.begin_snapshot()
    state.end_snapshot(now=1_000_000, succeeded=True)

    assert not state.should_snapshot(now=1_200_000)  # no entries since
    state.record_persisted("p", 2, 2)
    assert not state.should_snapshot(now=1_119_999)
    assert state.should_snapshot(now=1_120_000)

    state.snapshot_interval_ms = 0  # a policy switched the periodic snapshot off
    assert not state.should_snapshot(now=10**9)


def test_failed_snapshot_counts_its_entries_again() -> None:
    state = DeduplicationState(entries_interval=3, snapshot_interval_ms=0)
    for sequence_id in range(3):
        state.record_persisted("p", sequence_id, sequence_id)
    state.begin_snapshot()
    state.record_persisted("p", 3, 3)
    state.end_snapshot(now=0, succeeded=False)
    assert state.entries_since_snapshot == 4
    assert state.should_snapshot(now=0)


def test_snapshot_at_mark_delete_covers_no_new_entries() -> None:
    state = DeduplicationState(entries_interval=10, snapshot_interval_ms=0)
    state.record_persisted("p", 1, 1)
    state.begin_snapshot(at_last_entry=False)
    state.end_snapshot(now=0, succeeded=True)
    assert state.entries_since_snapshot == 1


def test_recovery_of_many_entries_asks_for_a_snapshot() -> None:
    state = DeduplicationState(entries_interval=1000, snapshot_interval_ms=0)
    state.restore({"p": 5}, now=0)
    for sequence_id in range(6, 1006):
        state.replay_entry("p", sequence_id, sequence_id, now=0)
    assert state.should_snapshot(now=0)
    assert state.last_sequence_id("p") == 1005


def test_replay_overwrites_in_entry_order() -> None:
    state = DeduplicationState()
    state.restore({"p": 50}, now=0)
    state.replay_entry("p", 3, 7, now=0)
    assert state.highest_pushed("p") == 7
    assert state.highest_persisted("p") == 7


def test_from_config() -> None:
    config = BrokerConfig(broker_deduplication_entries_interval=2,
                          broker_deduplication_snapshot_interval_s=3,
                          broker_deduplication_max_number_of_producers=1)
    state = DeduplicationState.from_config(config)
    assert state.snapshot_interval_ms == 3000
    state.record_persisted("b", 1, 1)
    state.record_persisted("a", 1, 1)
    assert state.should_snapshot(now=0)
    assert state.begin_snapshot() == {"a": 1}


# -- stored form ------------------------------------------------------------------------------


def test_snapshot_bytes_round_trip() -> None:
    snapshot = {"b": 2, "a": -1, "caf\u00e9": 2**63 - 1}
    data = encode_dedup_snapshot(snapshot)
    assert decode_dedup_snapshot(data) == snapshot
    assert data == encode_dedup_snapshot(dict(reversed(list(snapshot.items()))))
    assert decode_dedup_snapshot(encode_dedup_snapshot({})) == {}


@pytest.mark.parametrize("data", [
    b"", b"\xff", b"[]", b'{"version": 2, "producers": {}}', b'{"version": 1}',
    b'{"version": 1, "producers": []}', b'{"version": 1, "producers": {"p": "1"}}',
    b'{"version": 1, "producers": {"p": true}}', b'{"version": 1, "producers": {"p": 1.5}}',
])
def test_bad_snapshot_bytes_raise_metadata_error(data: bytes) -> None:
    with pytest.raises(MetadataError):
        decode_dedup_snapshot(data)


# -- properties -------------------------------------------------------------------------------

_PRODUCERS = st.sampled_from(["p1", "p2", "p3"])
_SENDS = st.lists(st.tuples(_PRODUCERS, st.integers(0, 30), st.integers(0, 3)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(sends=_SENDS, snapshot_at=st.integers(0, 40), producers_max=st.integers(3, 5))
def test_snapshot_plus_replay_restores_last_sequence_ids(
        sends: list[tuple[str, int, int]], snapshot_at: int, producers_max: int) -> None:
    """Publish (every accepted send is written), snapshot after some entry, then rebuild from
    that snapshot plus the entries after it: every producer's last_sequence_id matches and a
    resend of anything written is still a duplicate."""
    live = DeduplicationState(producers_max=producers_max)
    log: list[tuple[str, int, int]] = []  # the topic's entries
    snapshot: dict[str, int] = {}
    snapshot_len = 0
    for producer, sequence_id, batch in sends:
        highest = sequence_id + batch
        result = live.check(producer, sequence_id, highest)
        assert result is not UNKNOWN  # every write completed before the next send
        if result is NOT_DUP:
            live.record_persisted(producer, sequence_id, highest)
            log.append((producer, sequence_id, highest))
            if len(log) == snapshot_at:
                snapshot = decode_dedup_snapshot(encode_dedup_snapshot(live.snapshot()))
                snapshot_len = len(log)
    rebuilt = DeduplicationState(producers_max=producers_max)
    rebuilt.restore(snapshot, now=0)
    for producer, sequence_id, highest in log[snapshot_len:]:
        rebuilt.replay_entry(producer, sequence_id, highest, now=0)
    for producer in ("p1", "p2", "p3"):
        assert rebuilt.last_sequence_id(producer) == live.last_sequence_id(producer)
    for producer, sequence_id, _ in log:
        assert rebuilt.check(producer, sequence_id, sequence_id) is DUP
