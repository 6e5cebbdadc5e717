"""`CompactedReads`: how a `read_compacted` subscription reads (Pulsar's CompactedTopicImpl).

Theory of operation
-------------------
A reader or an Exclusive/Failover consumer that subscribes with `read_compacted` sees the
topic's compacted view (`ledger/_compacted.py`) up to its horizon, then the topic itself
after the horizon. The cursor's position decides, at every read:

* read position at or below the horizon: the entries come from the compacted ledger,
  starting at the first one whose original position is at or after it (the entries carry
  their original message ids, which consumers acknowledge as usual);
* the compacted ledger exhausted: the cursor is moved to the entry after the horizon and
  the topic is read from there; a later compaction whose horizon passes the read position
  sends the next read back to the compacted ledger.

A subscription that has acknowledged nothing of the topic's first ledger (its mark-delete
at or before the first position: a new subscription at the earliest position, a reader from
EARLIEST) starts at the beginning of the compacted view, which may hold keys whose ledgers
were trimmed. A rewind (redelivery, reconnect) or a reset starts over (`restart`).

A batch the compactor rewrote flags the messages it dropped `compacted_out` (Pulsar's
format, which the Java client skips); the C++ client (and so the official Python client)
ignores that flag, so each such entry is also delivered with an ack set (`live_mask`) in which
the dropped indexes count as acknowledged: every client then skips them, and the batch keeps
its indexes (acknowledgements of its messages mean what they meant in the topic).

Reads may touch the disk, so they run off the event loop (`asyncio.to_thread`), one at a
time, at most `COMPACTED_FETCH_ENTRIES_MAX` entries ahead: `read` returns what a finished
fetch brought for the position the subscription has reached, or starts a fetch and returns
nothing (the fetch kicks the dispatcher when it lands). A fetch started before a restart
or a view change is dropped when it lands. `read` is the one entry point.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from magnetar.codec import ProtocolError, parse_entry, unpack_messages
from magnetar.storage import CorruptionError, LedgerNotFoundError, NoSuchEntryError

from ..ledger._compacted import CompactedLedger
from ..ledger._position import Position

if TYPE_CHECKING:
    from ._subscription import Subscription

__all__ = ["COMPACTED_FETCH_ENTRIES_MAX", "CompactedReads", "live_mask"]

log = logging.getLogger(__name__)

COMPACTED_FETCH_ENTRIES_MAX = 100  # entries one fetch reads ahead from the compacted ledger
FETCH_RETRY_DELAY_S = 1.0  # after a read error that may pass

Fetched = list[tuple[Position, bytes, int | None]]  # (position, entry, live_mask)
_NO_MASKS: Mapping[Position, int] = MappingProxyType({})  # shared: most reads have none


def live_mask(entry: bytes) -> int | None:
    """For a batch with `compacted_out` messages: the bitmask of its other messages (bit i
    set: index i is delivered); None for any other entry."""
    try:
        parsed = parse_entry(entry, verify_checksum=False)
        if not parsed.metadata.HasField("num_messages_in_batch"):
            return None
        messages = unpack_messages(parsed.metadata, parsed.payload)
    except ProtocolError:
        return None
    if not any(message.compacted_out for message in messages):
        return None
    return sum(1 << i for i, message in enumerate(messages) if not message.compacted_out)


def _fetch_entries(view: CompactedLedger, at: Position, max_bytes: int) -> Fetched:
    """A worker thread's read: entries of the view from `at`, with their live masks."""
    return [(position, entry, live_mask(entry))
            for position, entry in view.read_from(at, COMPACTED_FETCH_ENTRIES_MAX, max_bytes)]


class CompactedReads:
    """The compacted part of one subscription's reads (see the module comment)."""

    __slots__ = ("_buffer", "_buffer_key", "_fetching", "_fresh", "_generation", "_next",
                 "enabled", "masks", "sub")

    def __init__(self, subscription: Subscription):
        self.sub = subscription
        self.enabled = False  # a consumer asked for read_compacted
        self._fresh = True  # nothing read since the start or the last restart
        self._next: Position | None = None  # the next original position to read
        self._buffer: Sequence[tuple[Position, bytes, int | None]] = ()
        self.masks: Mapping[Position, int] = _NO_MASKS  # of the entries `read` returned last
        self._buffer_key: tuple[Position, CompactedLedger] | None = None
        self._fetching: asyncio.Future[Fetched] | None = None
        self._generation = 0

    def restart(self) -> None:
        """Read from the cursor's position again (a rewind, a reset, a new consumer)."""
        self._fresh = True
        self._next = None
        self._buffer = ()
        self._buffer_key = None
        self._generation += 1

    def _view(self) -> CompactedLedger | None:
        return self.sub.topic.compacted_view if self.enabled else None

    def _start(self, view: CompactedLedger) -> Position | None:
        """Where compacted reading starts now, or None: read the topic."""
        cursor = self.sub.cursor
        if self._fresh and cursor.mark_delete_position <= cursor.ml.first_position():
            return Position(-1, -1)
        return cursor.read_position if cursor.read_position <= view.horizon else None

    def read(self, max_entries: int) -> list[tuple[Position, bytes]] | None:
        """Entries of the compacted view for the dispatcher ([] while a fetch runs), or
        None when the subscription reads the topic itself."""
        view = self._view()
        self.masks = _NO_MASKS
        if view is None:
            return None
        if self._next is None:
            self._next = self._start(view)
            self._fresh = False
            if self._next is None:
                return None
        if self._buffer_key == (self._next, view) and self._buffer:
            taken = self._buffer[:max_entries]
            self._buffer = self._buffer[len(taken):]
            last = taken[-1][0]
            self._next = Position(last.ledger_id, last.entry_id + 1)
            self._buffer_key = (self._next, view)
            self.masks = {position: mask for position, _, mask in taken if mask is not None}
            return [(position, entry) for position, entry, _ in taken]
        if self._fetching is None:
            self._fetch(view, self._next)
        return []

    def _fetch(self, view: CompactedLedger, at: Position) -> None:
        generation = self._generation
        max_bytes = self.sub.config.dispatcher_max_read_size_bytes
        self._fetching = asyncio.ensure_future(asyncio.to_thread(
            _fetch_entries, view, at, max_bytes))
        self._fetching.add_done_callback(lambda done: self._landed(done, view, at, generation))

    def _landed(self, done: asyncio.Future[Fetched],
                view: CompactedLedger, at: Position, generation: int) -> None:
        self._fetching = None
        dispatcher = self.sub.dispatcher
        if done.cancelled() or dispatcher is None or dispatcher.closed:
            return
        stale = generation != self._generation or self._view() is not view
        error = done.exception()
        if stale or isinstance(error, LedgerNotFoundError):
            dispatcher.kick()  # read again, from the view in force now
            return
        if isinstance(error, (CorruptionError, NoSuchEntryError)):
            self.sub.read_failed(error)
            return
        if error is not None:
            log.warning("compacted read on %s/%s failed, retrying in %.1f s: %s",
                        self.sub.topic_name, self.sub.name, FETCH_RETRY_DELAY_S, error)
            dispatcher.kick_later(FETCH_RETRY_DELAY_S)
            return
        found = done.result()
        if found:
            self._buffer, self._buffer_key = found, (at, view)
        else:  # the view is exhausted: read the topic after its horizon
            self._next = None
            cursor = self.sub.cursor
            cursor.seek(cursor.ml.next_valid_position(max(view.horizon,
                                                          cursor.ml.first_position())))
        dispatcher.kick()
