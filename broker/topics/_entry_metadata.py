"""Broker entry metadata: the 0x0e02 block a broker puts in front of each stored entry.

Theory of operation
-------------------
Pulsar's `brokerEntryMetadataInterceptors` setting names interceptors that add a
`BrokerEntryMetadata{broker_timestamp 1, index 2}` to every entry before it is stored:
`AppendBrokerTimestampMetadataInterceptor` (the broker's clock at publish, in ms) and
`AppendIndexMetadataInterceptor` (a topic-wide message counter). Magnetar's
`broker_entry_metadata_interceptors` takes the same class names, or the short names
`timestamp` and `index` (`interceptors_of`); an empty list stores entries as the producer sent
them.

The index counts messages, not entries: it starts at -1 for a topic that never had one, and
each entry adds its number of messages (`_entry.messages_in`), so an entry's
index is the index of its *last* message. It continues across ledgers, and across restarts:
`EntryMetadataAppender.open` reads the block of the topic's newest stored entry (an entry
without one, e.g. written before the setting was turned on, leaves the count at -1, as
upstream's recovery does).

The prefixed entry is stored and dispatched as it is: after a CommandMessage it forms exactly
the frame layout that carries the block, so clients that declared
`supports_broker_entry_metadata` get it verbatim, and the connection strips it for the others
(`codec.strip_broker_entry_metadata`). Everything in the broker that reads stored entries goes
through `codec.parse_entry`, which skips the block; an entry's time for seek by time, TTL and
the message-age backlog quota is the block's broker timestamp when present (`_entry.EntryInfo
.timestamp`), as upstream's `getEntryTimestamp`.

Assigning the index happens synchronously just before the append, in the managed ledger's call
order, so indexes rise with positions. An append that fails after its index was taken leaves a
gap in the sequence (the entry is not stored; later entries keep counting).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from magnetar.codec import parse_entry, pb, prefix_broker_entry_metadata

from .._config import INTERCEPTOR_INDEX, INTERCEPTOR_TIMESTAMP, interceptors_of
from ..dispatch._entry import messages_in_entry
from ..ledger._managed_ledger import ManagedLedger
from ..ledger._position import Position

__all__ = ["INTERCEPTOR_INDEX", "INTERCEPTOR_TIMESTAMP", "EntryMetadataAppender",
           "interceptors_of"]

INDEX_NONE: Final = -1  # the index before a topic's first message


class EntryMetadataAppender:
    """Builds the 0x0e02 block of each entry of one topic (see the module comment).

    Args:
        interceptors: which fields to write (`interceptors_of`); not empty.
        last_index: the index of the topic's last stored message (`INDEX_NONE`: none yet).
        clock_ms: the broker's clock in milliseconds.
    """

    def __init__(self, interceptors: frozenset[str], last_index: int,
                 clock_ms: Callable[[], int]):
        assert interceptors
        assert interceptors <= {INTERCEPTOR_TIMESTAMP, INTERCEPTOR_INDEX}
        assert last_index >= INDEX_NONE
        self.timestamp = INTERCEPTOR_TIMESTAMP in interceptors
        self.index = INTERCEPTOR_INDEX in interceptors
        self.last_index = last_index
        self._clock_ms = clock_ms

    @classmethod
    def open(cls, interceptors: frozenset[str], ml: ManagedLedger,
             clock_ms: Callable[[], int]) -> EntryMetadataAppender:
        """The appender of a topic, its index recovered from the newest stored entry."""
        return cls(interceptors, _last_index(ml), clock_ms)

    def prefix(self, entry: bytes, metadata: pb.MessageMetadata) -> bytes:
        """`entry` behind its block; takes the entry's messages from the index."""
        block = pb.BrokerEntryMetadata()
        if self.timestamp:
            block.broker_timestamp = self._clock_ms()
        if self.index:
            self.last_index += messages_in_entry(metadata, entry)
            block.index = self.last_index
        return prefix_broker_entry_metadata(block, entry)


def _last_index(ml: ManagedLedger) -> int:
    """The index in the block of the newest stored entry, `INDEX_NONE` when there is none."""
    for ledger in reversed(ml.ledgers()):
        if ledger.entries > 0:
            newest = Position(ledger.ledger_id, ledger.entries - 1)
            try:
                block = parse_entry(ml.read_entry(newest), verify_checksum=False)
            except Exception:
                return INDEX_NONE  # an entry we cannot parse: start counting afresh
            found = block.broker_entry_metadata
            if found is None or not found.HasField("index"):
                return INDEX_NONE
            return max(INDEX_NONE, int(found.index))
    return INDEX_NONE
