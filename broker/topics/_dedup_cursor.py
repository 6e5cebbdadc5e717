"""The durable side of a persistent topic's deduplication state (`_dedup`): its cursor.

The `pulsar.dedup` cursor's properties hold the last snapshot (`{producer: highest sequence
id persisted}`) and its mark-delete position is the entry the snapshot covers. Recovery
(`recover_dedup`) restores the snapshot and replays every entry after it, reading each one's
producer name and highest sequence id from its metadata, so a restart or a crash loses no
sequence id; `write_dedup_snapshot` moves the cursor and its properties forward.
"""

from __future__ import annotations

from collections.abc import Callable

from .._config import BrokerConfig
from ..ledger._cursor import ManagedCursor
from ..ledger._managed_ledger import ManagedLedger
from ..ledger._position import Position
from ._dedup import DEDUP_CURSOR_NAME, DeduplicationState, highest_sequence_id_of
from ._producer import _metadata_of

__all__ = ["recover_dedup", "write_dedup_snapshot"]

REPLAY_BATCH_ENTRIES = 1000  # entries read at once while replaying
REPLAY_BATCH_BYTES_MAX = 32 * 1024 * 1024


async def recover_dedup(ml: ManagedLedger, config: BrokerConfig, now_ms: float,
                        ) -> tuple[DeduplicationState, ManagedCursor, Position, int]:
    """(the state, its cursor, the last entry replayed into it, how many entries were
    replayed). The cursor is opened (created at the earliest entry when missing)."""
    state = DeduplicationState.from_config(config)
    cursor = await ml.open_cursor(DEDUP_CURSOR_NAME, "earliest")
    state.restore({k: int(v) for k, v in cursor.properties.items()}, now_ms)
    position = ml.next_valid_position(cursor.mark_delete_position)
    last = ml.last_confirmed_position
    replayed = 0
    while position <= last:
        batch = await ml.read_entries_async(position, REPLAY_BATCH_ENTRIES,
                                            REPLAY_BATCH_BYTES_MAX)
        if not batch:
            break
        for entry_position, data in batch:
            metadata = _metadata_of(data)
            highest = highest_sequence_id_of(metadata.sequence_id, -1, metadata, data)
            state.replay_entry(metadata.producer_name, metadata.sequence_id, highest, now_ms)
            replayed += 1
            position = ml.next_valid_position(Position(*entry_position))
    return state, cursor, last, replayed


async def write_dedup_snapshot(state: DeduplicationState, cursor: ManagedCursor,
                               recorded: Position, now_ms: Callable[[], float]) -> None:
    """Store a snapshot of `state` in `cursor`, its mark-delete moved to `recorded`: the last
    entry whose sequence ids are in the state, so every entry up to it is covered and recovery
    replays only what follows (the last confirmed entry may be ahead of it while its publish
    has not yet recorded itself). A failed write leaves the previous snapshot in force."""
    snapshot = state.begin_snapshot()
    ok = False
    try:
        if recorded > cursor.mark_delete_position:
            await cursor.mark_delete(recorded, properties=dict(snapshot))
        ok = True
    finally:
        state.end_snapshot(now_ms(), ok)
