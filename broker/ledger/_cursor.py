"""`ManagedCursor`: a subscription's position in a managed ledger, and its acknowledgements.

Theory of operation
-------------------
State (broker semantics §4.2):

* `mark_delete_position` (MD): everything at or below it is acknowledged;
* `individually_deleted`: a `RangeSet` of acknowledged entries above MD ("ack holes" between);
* `batch_deleted`: `{position: bitmask}` for partially acknowledged batch entries, a set bit
  meaning "index still unacknowledged" (Java `BitSet` semantics, §4.4);
* `properties` (`str -> int`, written with mark-deletes, used by dedup) and
  `cursor_properties` (`str -> str`, subscription properties);

While empty, these three maps are the one shared read-only `EMPTY_MAP` (a cursor per loaded topic
holds no dict for nothing): a change makes the cursor its own dict (`_own_bitsets`, or a new
map for the properties, which change seldom), and clearing the bitsets gives `EMPTY_MAP` back.
* `read_position`: the next entry to dispatch, always > MD. It is not persisted; after a
  restart it is the entry after MD, so every unacknowledged entry is delivered again.

Acks (§4.3, §4.4). Ack sets come from clients: the subscription checks one against its
entry's batch size before it gets here, and an ack set's position is validated before its words
are converted (linearly). An individual delete adds the entry to the ranges; when the lowest range
then starts right after MD, MD moves to that range's end. A cumulative mark-delete sets MD and
then extends it through a range that starts right after it. A cumulative ack carrying an ack set
for entry E sets MD to the entry before E and keeps E's bitset. Bitsets combine with AND, so an
acknowledged index never becomes unacknowledged again; a bitset with no bit left turns into a
whole-entry delete. Whenever MD moves, ranges and bitsets at or below it are dropped and the
read position is pushed past MD.

Persistence (§4.5; durable cursors only). The record — MD, the lowest
`max_unacked_ranges_to_persist` ranges, the lowest `max_batch_deleted_index_to_persist` bitsets,
both property maps and the subscription's redelivery counts (`_redelivery.py`), as compact
JSON — goes under `b"cursor/" + ml + b"\\x00" + name` through
`storage.metadata.apply_journaled`, which rides the journal's group commit. At most one write is
in flight per cursor: changes made meanwhile are merged into the next write, which starts when
the current one is durable. Every mutating call bumps the state version and returns only once a
write that includes its version is durable, so an ack that returned survives a `kill -9`. Ranges
beyond the persisted limit live in memory only: after a crash those entries are redelivered.
Redelivery-count changes are the exception: nobody waits for them (`count_redelivery`
starts a background write, and the writes chain while changes keep coming).

Recovery: an MD in a ledger that no longer exists moves to `(next existing ledger, -1)`, an MD
beyond the last entry is clamped to it, ranges and bitsets at or below MD are dropped, and the
read position is the next valid position after MD.

Non-durable cursors (readers) never persist and never hold back trimming; the managed ledger
moves them past the ledgers it deletes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from magnetar.storage import Completion, StorageError

from ._loader import Run, collect, runs_of
from ._ml_records import cursor_key
from ._position import (
    EMPTY_MAP,
    LATEST,
    InvalidPositionError,
    ManagedLedgerClosedError,
    Position,
    ack_set_to_int,
    int_to_ack_set,
    keys_between,
)
from ._range_set import RangeSet
from ._redelivery import RedeliveryCounts

if TYPE_CHECKING:
    from ._managed_ledger import ManagedLedger

__all__ = ["ManagedCursor"]

log = logging.getLogger(__name__)

RECORD_VERSION = 1
READ_BYTES_DEFAULT_MAX = 5 * 1024 * 1024  # Pulsar's dispatcherMaxReadSizeBytes


class ManagedCursor:
    """A cursor on a `ManagedLedger`. Create it with `ManagedLedger.open_cursor` or
    `ManagedLedger.new_non_durable_cursor`."""

    __slots__ = ("_background_write", "_durable_version", "_flight", "_read_position", "_version",
                 "batch_deleted", "cursor_properties", "deleted", "durable",
                 "individually_deleted", "mark_delete_position", "ml", "name",
                 "persisted_mark_delete_position", "properties", "read_epoch", "redelivery")

    def __init__(self, ml: ManagedLedger, name: str, durable: bool, mark_delete: Position):
        """Internal: use the managed ledger's cursor methods."""
        self.ml = ml
        self.name = name
        self.durable = durable
        self.mark_delete_position = mark_delete
        self.persisted_mark_delete_position = mark_delete
        self.read_epoch = 0  # bumped by every change of the read position
        self._read_position = ml.next_valid_position(mark_delete)
        self.individually_deleted = RangeSet(ml)
        self.batch_deleted: Mapping[Position, int] = EMPTY_MAP  # `_own_bitsets` to change it
        self.properties: Mapping[str, int] = EMPTY_MAP
        self.cursor_properties: Mapping[str, str] = EMPTY_MAP
        self.redelivery = RedeliveryCounts(ml.config.max_redelivery_counts_to_persist)
        self.deleted = False
        self._background_write = False  # a change nobody waits for is not yet durable
        self._version = 0
        self._durable_version = 0
        self._flight: asyncio.Future[None] | None = None

    # -- creation and recovery -----------------------------------------------------------

    @classmethod
    def create(cls, ml: ManagedLedger, name: str, initial_position: Literal["latest", "earliest"],
               durable: bool, properties: dict[str, int] | None = None) -> ManagedCursor:
        """A new cursor (§4.6): Latest → MD = the last entry (backlog 0); Earliest → MD = the
        position before the first entry."""
        assert initial_position in ("latest", "earliest"), initial_position
        if initial_position == "latest":
            mark_delete = ml.last_confirmed_position
        else:
            mark_delete = ml.previous_position(ml.first_entry_at_or_after(ml.first_position()))
        cursor = cls(ml, name, durable, mark_delete)
        cursor.properties = dict(properties) if properties else EMPTY_MAP
        cursor._version = 1  # the new record itself must be written
        return cursor

    @classmethod
    def create_non_durable(cls, ml: ManagedLedger, name: str, start: Position | None,
                           initial_position: Literal["latest", "earliest"]) -> ManagedCursor:
        """A reader's cursor (§4.6): a real start id steps back one entry so that reading
        starts AT it; EARLIEST starts at the first entry; None, LATEST or an id beyond the
        last entry follow `initial_position`."""
        beyond = start is None or start.ledger_id == LATEST.ledger_id
        if start is not None and start > ml.last_confirmed_position:
            beyond = True
        if beyond:
            return cls.create(ml, name, initial_position, durable=False)
        assert start is not None
        if start.ledger_id < 0:
            mark_delete = ml.previous_position(ml.first_entry_at_or_after(ml.first_position()))
        elif start.entry_id >= 0:
            mark_delete = Position(start.ledger_id, start.entry_id - 1)
        else:
            mark_delete = start
        return cls(ml, name, False, mark_delete)

    @classmethod
    def recover(cls, ml: ManagedLedger, name: str, raw: bytes) -> ManagedCursor:
        """Rebuild a durable cursor from its record (see the module comment)."""
        record: dict[str, Any] = json.loads(raw)
        assert record.get("v") == RECORD_VERSION, f"unknown cursor record version {record!r:.80}"
        stored = Position(*record["md"])
        mark_delete = _recovered_mark_delete(ml, stored)
        cursor = cls(ml, name, True, mark_delete)
        for first_l, first_e, last_l, last_e in record["ranges"]:
            first = ml.first_entry_at_or_after(Position(first_l, first_e))
            last = Position(last_l, last_e)
            if first <= last and last > mark_delete:
                cursor.individually_deleted.add_range(max(first, ml.next_position(mark_delete)),
                                                      last)
        for ledger_id, entry_id, words in record["batch"]:
            position = Position(ledger_id, entry_id)
            if position > mark_delete and ml.is_valid_position(position):
                cursor._own_bitsets()[position] = ack_set_to_int(words)
        if record["props"]:
            cursor.properties = {k: int(v) for k, v in record["props"].items()}
        if record["cprops"]:
            cursor.cursor_properties = {k: str(v) for k, v in record["cprops"].items()}
        cursor._advance_mark_delete()
        cursor.redelivery.restore(
            record.get("redel"),
            lambda p: ml.is_valid_position(p) and not cursor.is_acked(p))
        cursor.read_position = ml.next_valid_position(cursor.mark_delete_position)
        if cursor.mark_delete_position != stored:
            cursor._version = 1  # written by the next flush (the ML's close at the latest)
            log.info("cursor %s/%s: mark-delete %s recovered as %s", ml.name, name, stored,
                     cursor.mark_delete_position)
        return cursor

    # -- queries -------------------------------------------------------------------------

    def __repr__(self) -> str:
        kind = "durable" if self.durable else "non-durable"
        return (f"<ManagedCursor {self.ml.name}/{self.name} {kind} md={self.mark_delete_position}"
                f" read={self.read_position} deleted={self.individually_deleted!r}>")

    def is_acked(self, position: Position) -> bool:
        """Whether the whole entry at `position` is acknowledged."""
        return position <= self.mark_delete_position or position in self.individually_deleted

    def get_ack_set(self, position: Position) -> list[int] | None:
        """The entry's bitset as `long[]` words for `CommandMessage.ack_set` (set bit = still
        unacked), or None when it is not partially acknowledged."""
        mask = self.batch_deleted.get(position)
        return None if mask is None else int_to_ack_set(mask)

    def backlog(self) -> int:
        """Unacknowledged entries: entries in (MD, last] minus individually deleted (§4.8)."""
        md = self.mark_delete_position
        after_md = Position(md.ledger_id, md.entry_id + 1)
        total = self.ml.entries_between(after_md, self.ml.last_confirmed_position)
        backlog = total - self.individually_deleted.entry_count
        assert backlog >= 0, (total, self.individually_deleted)
        return backlog

    def entries_to_read(self) -> int:
        """Entries from the read position to the end, minus deleted ones (Pulsar's
        `getNumberOfEntries`)."""
        total = self.ml.entries_between(self.read_position, self.ml.last_confirmed_position)
        return total - self.individually_deleted.count_from(self.read_position)

    def has_more_entries(self) -> bool:
        """Whether `read_entries` would return something now."""
        return self._skip_deleted(self.read_position) <= self.ml.last_confirmed_position

    def estimated_backlog_size_bytes(self) -> int:
        """The backlog's bytes, estimated from ledger sizes (backlog quotas)."""
        return self.ml.estimated_size_after(self.mark_delete_position)

    def _skip_deleted(self, position: Position) -> Position:
        position = self.ml.first_entry_at_or_after(position)
        covering = self.individually_deleted.range_containing(position)
        if covering is not None:
            position = self.ml.next_position(covering[1])
        return position

    # -- reading -------------------------------------------------------------------------

    @property
    def read_position(self) -> Position:
        """The next entry to dispatch; every change bumps `read_epoch`."""
        return self._read_position

    @read_position.setter
    def read_position(self, position: Position) -> None:
        self._read_position = position
        self.read_epoch += 1

    def plan_read(self, max_entries: int) -> list[Run]:
        """The runs (`_loader.py`) of the next `max_entries` unacknowledged entries from the
        read position, around individually deleted ones. Memory only."""
        ml = self.ml
        runs: list[Run] = []
        wanted = max_entries
        at = self.read_position
        while wanted > 0:
            at = self._skip_deleted(at)
            if at > ml.last_confirmed_position:
                break
            limit = wanted
            hole = self.individually_deleted.next_range_from(at)
            if hole is not None:
                limit = min(limit, ml.entries_between(at, ml.previous_position(hole[0])))
            planned = ml.plan_runs(at, limit)
            runs.extend(planned)
            wanted -= sum(last - first + 1 for _, first, last in planned)
            at = ml.next_position(Position(planned[-1][0], planned[-1][2]))
        return runs

    def advance_past(self, position: Position) -> None:
        """Entries up to `position` were read: continue after it."""
        self.read_position = self.ml.next_position(position)
        assert self.read_position > self.mark_delete_position

    def read_entries(self, max_entries: int,
                     max_bytes: int = READ_BYTES_DEFAULT_MAX) -> list[tuple[Position, bytes]]:
        """Read from the read position, skipping individually deleted entries, and move the
        read position past what was returned. May read the disk: for threads and tests
        (a subscription plans, reads the cache and loads off the loop instead).

        Returns at most `max_entries` entries within `max_bytes` (but at least one when any
        is available).
        """
        found = collect(self.ml.storage.read_entries, self.plan_read(max_entries), max_bytes)
        if found:
            self.advance_past(found[-1][0])
        return found

    def rewind(self) -> None:
        """Read again from the entry after MD."""
        self.read_position = self.ml.next_valid_position(self.mark_delete_position)

    def seek(self, position: Position, force: bool = False) -> None:
        """Set the read position (the dispatcher's); at or below MD means the entry after
        MD unless `force`."""
        if not force and position <= self.mark_delete_position:
            position = self.ml.next_valid_position(self.mark_delete_position)
        self.read_position = position

    # -- acknowledgements ----------------------------------------------------------------

    async def delete(self, positions: Iterable[Position]) -> None:
        """Individually acknowledge entries (§4.3); acknowledged ones are no-ops. Those above
        MD go in as runs of consecutive entries of one ledger (`runs_of`), each checked by its
        ends and added as one range: an ack of a stretch (a consumer draining a backlog) costs
        one range insertion, not one per entry.

        Raises:
            InvalidPositionError: a position is not a confirmed entry; nothing changed.
            ManagedLedgerClosedError: the cursor was deleted.
            StorageError: the record could not be made durable (the change stays in memory).
        """
        self._check_usable()
        runs = [(Position(ledger_id, first), Position(ledger_id, last)) for ledger_id, first, last
                in runs_of(sorted(p for p in positions if p > self.mark_delete_position))]
        for low, high in runs:  # a run holds entries only when both its ends are entries
            self._check_entry(low)
            self._check_entry(high)
        before = self.individually_deleted.entry_count
        for low, high in runs:
            for position in keys_between(self.batch_deleted, low, high):
                del self._own_bitsets()[position]
            self.redelivery.discard_between(low, high)
            self.individually_deleted.add_range(low, high)
        if not self.batch_deleted:
            self.batch_deleted = EMPTY_MAP  # (the runs took the last bitsets)
        if self.individually_deleted.entry_count != before:
            self._advance_mark_delete()
            self._after_change()
        await self.flush()

    def _own_bitsets(self) -> dict[Position, int]:
        """`batch_deleted`, as the cursor's own dict (made when it is the shared `EMPTY_MAP`)."""
        bitsets = self.batch_deleted
        if not isinstance(bitsets, dict):
            bitsets = self.batch_deleted = {}
        return bitsets

    def _delete_entry(self, position: Position) -> bool:
        if position in self.batch_deleted:
            del self._own_bitsets()[position]
        self.redelivery.discard((position,))
        return self.individually_deleted.add(position)

    async def delete_batch_index(self, position: Position, ack_set_words: list[int],
                                 batch_size: int) -> None:
        """Acknowledge indexes of a batch entry (§4.4): the stored bitset becomes the AND of
        the stored one and `ack_set_words` (set bit = still unacked); no bit left → the whole
        entry is deleted. Ignored when batch-index acks are disabled.

        Raises:
            InvalidPositionError, ManagedLedgerClosedError, StorageError: as `delete`.
        """
        self._check_usable()
        assert batch_size >= 1
        if not self.ml.config.batch_index_ack_enabled or self.is_acked(position):
            await self.flush()
            return
        self._check_entry(position)
        every = (1 << batch_size) - 1
        current = self.batch_deleted.get(position, every)
        combined = current & ack_set_to_int(ack_set_words) & every
        if combined == 0:
            self._delete_entry(position)
            self._advance_mark_delete()
            self._after_change()
        elif combined != current or position not in self.batch_deleted:
            self._own_bitsets()[position] = combined
            self._after_change()
        await self.flush()

    async def mark_delete(self, position: Position, properties: dict[str, int] | None = None,
                          ack_set: list[int] | None = None, batch_size: int | None = None,
                          ) -> None:
        """Cumulatively acknowledge up to `position` (§4.3). With an `ack_set` for entry E
        (some indexes still unacked), MD moves to the entry before E and E's bitset is kept
        (ANDed with any stored one, so it never regresses). Mark-deleting MD again is fine.

        Args:
            position: the last acknowledged entry (E with an ack set).
            properties: replace the cursor's `properties` (None keeps them).
            ack_set: E's bitset as `long[]` words, or None for a whole-entry ack.
            batch_size: E's batch size, when known: bits of `ack_set` beyond it are dropped
                (none left means a whole-entry ack).

        Raises:
            InvalidPositionError: the position is below MD ("already mark-deleted"), or beyond
                the last entry (other than `(next ledger, -1)`); nothing changed.
            ManagedLedgerClosedError, StorageError: as `delete`.
        """
        self._check_usable()
        target, batch = self._mark_delete_target(position, ack_set, batch_size)
        if batch is not None and self.ml.config.batch_index_ack_enabled:
            entry, mask = batch
            if not self.is_acked(entry):
                combined = self.batch_deleted.get(entry, mask) & mask
                if combined:
                    self._own_bitsets()[entry] = combined
                else:  # individual index acks covered the rest: the entry is done
                    self._delete_entry(entry)
        self._move_mark_delete(target)
        if properties is not None:
            self.properties = dict(properties)
        self._after_change()
        await self.flush()

    def _mark_delete_target(self, position: Position, ack_set: list[int] | None,
                            batch_size: int | None,
                            ) -> tuple[Position, tuple[Position, int] | None]:
        ml = self.ml
        mask = 0
        if ack_set:
            self._check_entry(position)  # before any work in proportion to the ack set
            mask = ack_set_to_int(ack_set)
            if batch_size is not None:
                mask &= (1 << batch_size) - 1
        batch: tuple[Position, int] | None = None
        target = position
        if mask:
            target = ml.previous_position(position)
            batch = (position, mask)
        if target < self.mark_delete_position:
            raise InvalidPositionError(
                f"cursor {self.name}: mark-deleting {target}, below the mark-delete position "
                f"{self.mark_delete_position}")
        last = ml.last_confirmed_position
        moving_to_next_ledger = target.entry_id == -1 and ml.has_ledger(target.ledger_id)
        if target > last and not moving_to_next_ledger:
            raise InvalidPositionError(
                f"cursor {self.name}: mark-delete {target} is beyond the last entry {last}")
        return target, batch

    def _move_mark_delete(self, target: Position) -> None:
        """Set MD to `target` (>= MD) and extend it through the ranges that follow."""
        assert target >= self.mark_delete_position
        self.mark_delete_position = target
        self.individually_deleted.remove_up_to(target)
        self._advance_mark_delete()

    def _advance_mark_delete(self) -> None:
        """Extend MD through a range that starts right after it; drop what MD covers."""
        ml = self.ml
        while True:
            first = self.individually_deleted.first_range
            if first is None or first[0] > ml.next_position(self.mark_delete_position):
                break
            self.mark_delete_position = max(self.mark_delete_position, first[1])
            self.individually_deleted.remove_up_to(self.mark_delete_position)
        md = self.mark_delete_position
        if self.batch_deleted:
            self.batch_deleted = {p: mask for p, mask in self.batch_deleted.items()
                                  if p > md} or EMPTY_MAP
        self.redelivery.discard_up_to(md)
        if self.read_position <= md:
            self.read_position = ml.next_valid_position(md)

    async def clear_backlog(self) -> None:
        """Acknowledge everything: MD = the last entry."""
        self._check_usable()
        target = max(self.ml.last_confirmed_position, self.mark_delete_position)
        self._move_mark_delete(target)
        self.batch_deleted = EMPTY_MAP
        self._after_change()
        await self.flush()

    async def skip_entries(self, count: int, include_deleted: bool = False) -> None:
        """Move MD over `count` entries (§4.8). Individually deleted entries are not counted
        unless `include_deleted` (Pulsar's `IndividualDeletedEntries.Exclude`/`Include`)."""
        self._check_usable()
        assert count >= 0
        ml = self.ml
        at = self.mark_delete_position
        remaining = count
        while remaining > 0 and at < ml.last_confirmed_position:
            step_end = ml.position_after_n(at, remaining)
            counted = ml.entries_between(ml.next_position(at), step_end)
            if not include_deleted:
                ranges = self.individually_deleted
                counted -= (ranges.count_from(ml.next_position(at))
                            - ranges.count_from(ml.next_position(step_end)))
            remaining -= counted
            at = step_end
        if at > self.mark_delete_position:
            self._move_mark_delete(at)
            self._after_change()
        await self.flush()

    async def expire_until(self, position: Position) -> None:
        """TTL expiry (§7.2): jump MD to `position` (capped at the last entry), acked or not.
        A position at or below MD changes nothing."""
        self._check_usable()
        target = min(position, self.ml.last_confirmed_position)
        if target > self.mark_delete_position:
            self._move_mark_delete(target)
            self._after_change()
        await self.flush()

    async def reset(self, position: Position, ack_set: list[int] | None = None) -> None:
        """Reset the cursor (§4.7): reading restarts AT `position` (an invalid position moves
        to the next entry; at or past the end means the end; before the first entry means the
        first entry), MD = the entry before it, ranges and bitsets are cleared, then
        `ack_set` (indexes already acknowledged) is installed for that entry."""
        self._check_usable()
        ml = self.ml
        start = ml.first_entry_at_or_after(position)
        start = min(start, ml.write_position())
        self.individually_deleted.clear()
        self.batch_deleted = EMPTY_MAP
        self.mark_delete_position = ml.previous_position(start)
        self.read_position = start
        mask = 0 if ack_set is None else ack_set_to_int(ack_set)
        if mask and ml.config.batch_index_ack_enabled and ml.is_valid_position(start):
            self._own_bitsets()[start] = mask
        assert self.read_position > self.mark_delete_position
        self._after_change()
        await self.flush()

    async def reset_by_time(self, timestamp_ms: int,
                            entry_timestamp: Callable[[bytes], int]) -> None:
        """Reset to the first entry whose timestamp is >= `timestamp_ms` (§4.7)."""
        await self.reset(await self.ml.find_position_by_time(timestamp_ms, entry_timestamp))

    # -- properties ----------------------------------------------------------------------

    async def set_cursor_property(self, key: str, value: str) -> None:
        self._check_usable()
        self.cursor_properties = {**self.cursor_properties, key: value}
        self._after_change()
        await self.flush()

    async def remove_cursor_property(self, key: str) -> None:
        self._check_usable()
        if key in self.cursor_properties:
            self.cursor_properties = {k: v for k, v in self.cursor_properties.items()
                                      if k != key}
            self._after_change()
        await self.flush()

    async def set_cursor_properties(self, properties: dict[str, str]) -> None:
        self._check_usable()
        self.cursor_properties = dict(properties)
        self._after_change()
        await self.flush()

    # -- trimming (called by the managed ledger) -----------------------------------------

    def move_past_trimmed(self, kept_from: Position) -> None:
        """Ledgers below `kept_from` = `(first kept ledger, -1)` are about to be deleted:
        move a non-durable cursor that still points into them."""
        assert not self.durable
        if self.mark_delete_position < kept_from:
            self._move_mark_delete(kept_from)
            if self.read_position < kept_from:
                self.read_position = self.ml.next_valid_position(kept_from)

    # -- persistence ---------------------------------------------------------------------

    @property
    def key(self) -> bytes:
        return cursor_key(self.ml.name, self.name)

    def _check_usable(self) -> None:
        if self.deleted:
            raise ManagedLedgerClosedError(f"cursor {self.ml.name}/{self.name} was deleted")

    def _check_entry(self, position: Position) -> None:
        if not self.ml.is_valid_position(position):
            raise InvalidPositionError(
                f"cursor {self.name}: {position} is not an entry of {self.ml.name} (last "
                f"{self.ml.last_confirmed_position})")

    def _after_change(self) -> None:
        assert self.read_position > self.mark_delete_position
        self._version += 1

    def record(self) -> bytes:
        """The persisted form of the cursor's state."""
        config = self.ml.config
        bitsets = sorted(self.batch_deleted.items())[:config.max_batch_deleted_index_to_persist]
        data = {
            "v": RECORD_VERSION,
            "md": list(self.mark_delete_position),
            "ranges": self.individually_deleted.to_list(config.max_unacked_ranges_to_persist),
            "batch": [[p.ledger_id, p.entry_id, int_to_ack_set(mask)] for p, mask in bitsets],
            "props": self.properties or {},
            "cprops": self.cursor_properties or {},
            "redel": self.redelivery.to_record(self.is_acked),
        }
        return json.dumps(data, separators=(",", ":")).encode()

    async def flush(self) -> None:
        """Return once every change so far is durable (no-op for non-durable cursors).

        Raises:
            StorageError: the write failed; the state stays in memory and the next change
                (or flush) writes it again.
        """
        if not self.durable or self.deleted:
            return
        target = self._version
        while self._durable_version < target:
            if self._flight is None:
                self._start_write()
            flight = self._flight
            assert flight is not None
            await asyncio.shield(flight)

    # -- redelivery counts (written in the background) -------------------------------------

    @property
    def writes_pending(self) -> bool:
        """Whether a change is not yet durable (a background write under way, or due)."""
        return self.durable and not self.deleted and self._durable_version < self._version

    def count_redelivery(self, position: Position) -> None:
        """One more redelivery of `position`, persisted in the background."""
        if self.redelivery.increment(position):
            self._persist_soon()

    def clear_redelivery_counts(self) -> None:
        if self.redelivery.clear():
            self._persist_soon()

    def _persist_soon(self) -> None:
        if not self.durable or self.deleted or self.ml.closed:
            return
        self._version += 1
        self._background_write = True
        if self._flight is None:
            self._start_write()

    def _write_more(self) -> None:
        """After a write: chain the next one while background changes are not durable."""
        if self._durable_version >= self._version:
            self._background_write = False
        elif self._background_write and self._flight is None and not self.deleted \
                and not self.ml.closed:
            self._start_write()

    def _start_write(self) -> None:
        loop = asyncio.get_running_loop()
        version = self._version
        md = self.mark_delete_position
        try:
            completion = self.ml.storage.metadata.apply_journaled([(self.key, self.record())])
        except StorageError as error:  # failed or closed storage: nothing applied, and a
            completion = Completion.failed(error)  # background write has nobody to raise to
        flight: asyncio.Future[None] = loop.create_future()
        self._flight = flight

        def bounce(finished: Completion[int]) -> None:
            try:
                loop.call_soon_threadsafe(self._write_done, flight, version, md, finished)
            except RuntimeError:  # the loop is gone (shutdown); nobody waits any more
                pass

        completion.add_done_callback(bounce)

    def _write_done(self, flight: asyncio.Future[None], version: int, md: Position,
                    finished: Completion[int]) -> None:
        assert self._flight is flight
        self._flight = None
        error = finished.exception()
        if error is not None:
            log.warning("cursor %s/%s: persisting failed: %s", self.ml.name, self.name, error)
            flight.set_exception(error)
            flight.exception()  # retrieved: a background write has nobody awaiting it
            return
        self._durable_version = max(self._durable_version, version)
        previous, self.persisted_mark_delete_position = self.persisted_mark_delete_position, md
        flight.set_result(None)
        self._write_more()
        if md != previous:
            self.ml.on_cursor_persisted(self, previous, md)

    async def delete_record(self) -> None:
        """Internal (`ManagedLedger.delete_cursor`): wait for a write in flight, then delete
        the record durably. The cursor is unusable afterwards."""
        if self._flight is not None:
            try:
                await asyncio.shield(self._flight)
            except Exception as error:  # the delete below supersedes it
                log.debug("cursor %s: last write failed before delete: %s", self.name, error)
        self.deleted = True
        if self.durable:
            await self.ml.storage.metadata.apply_journaled([(self.key, None)])


def _recovered_mark_delete(ml: ManagedLedger, stored: Position) -> Position:
    """§4.5: into a deleted ledger → (next existing ledger, -1); beyond the end → the last
    entry."""
    mark_delete = stored
    if not ml.has_ledger(stored.ledger_id):
        following = ml.first_entry_at_or_after(Position(stored.ledger_id + 1, -1))
        mark_delete = Position(following.ledger_id, -1)
    last = ml.last_confirmed_position
    if mark_delete > last:
        mark_delete = last
    return mark_delete
