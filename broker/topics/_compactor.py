"""The two phases of topic compaction, as pure functions over stored entries (they run in a
worker thread; `_compaction.py` drives them from the event loop).

Theory of operation
-------------------
The input is a list of `Segment`s, read in order: the previous compacted ledger (its entries
carry their original positions) and then the topic's entries after the previous horizon up
to the new one. A message's identity is `(position, batch_index)` (-1 when not batched).

Phase one (`latest_per_key`) keeps, per key, the identity of the latest message: a message
whose value is null (`null_value`) or empty deletes its key; a message without a key (or
with `null_partition_key`) is not kept (Pulsar's `topicCompactionRetainNullKey=false`), nor
are chunked messages or markers. Messages already flagged `compacted_out` are skipped.

Phase two (`retained_entries`) reads the same segments again and keeps an entry when one of
its messages is the latest of its key: a non-batched entry unchanged; a batch unchanged when
it keeps all its messages, else rewritten as Pulsar's RawBatchConverter does, with the same
size and batch indexes but the dropped messages flagged `compacted_out` and emptied (the
client skips them), re-compressed with the batch's codec and re-checksummed.

An entry that cannot be parsed is skipped with a warning (it cannot be delivered either).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from magnetar.codec import (
    CompressionType,
    ProtocolError,
    SingleMessage,
    compress,
    encode_batch_payload,
    encode_entry,
    parse_entry,
    prefix_broker_entry_metadata,
    unpack_messages,
)
from magnetar.storage import LedgerStorage

from ..ledger._compacted import decode_compacted_entry, encode_compacted_entry
from ..ledger._position import Position

__all__ = ["COMPACTION_KEYS_MAX", "CompactionError", "MessageId", "Segment",
           "latest_per_key", "retained_entries"]

log = logging.getLogger(__name__)

COMPACTION_KEYS_MAX = 10_000_000  # distinct live keys one compaction may hold in memory
SEGMENT_READ_ENTRIES_MAX = 256  # entries per storage read

MessageId = tuple[Position, int]  # (entry position, batch index or -1)


class CompactionError(Exception):
    """A compaction cannot complete (the message names why)."""


@dataclass(frozen=True)
class Segment:
    """Entries `first`..`last` of storage ledger `ledger_id`; `compacted`: a compacted
    ledger (entries carry their original positions)."""

    ledger_id: int
    first: int
    last: int
    compacted: bool = False

    def chunks(self) -> list[Segment]:
        """This segment in pieces of at most `SEGMENT_READ_ENTRIES_MAX` entries."""
        return [Segment(self.ledger_id, start,
                        min(self.last, start + SEGMENT_READ_ENTRIES_MAX - 1), self.compacted)
                for start in range(self.first, self.last + 1, SEGMENT_READ_ENTRIES_MAX)]


def _entries(storage: LedgerStorage, segments: list[Segment]) -> list[tuple[Position, bytes]]:
    found: list[tuple[Position, bytes]] = []
    for segment in segments:
        for chunk in segment.chunks():
            datas = storage.read_entries(chunk.ledger_id, chunk.first, chunk.last)
            for offset, data in enumerate(datas):
                if chunk.compacted:
                    found.append(decode_compacted_entry(data))
                else:
                    found.append((Position(chunk.ledger_id, chunk.first + offset), data))
    return found


def _iter_entries(storage: LedgerStorage, segments: list[Segment]
                  ) -> list[list[tuple[Position, bytes]]]:
    """The segments' entries, one list per storage read (bounded memory per step)."""
    return [_entries(storage, [chunk]) for segment in segments for chunk in segment.chunks()]


def _key_of(message: SingleMessage) -> str | None:
    if message.null_partition_key or message.partition_key is None:
        return None
    return message.partition_key


def _messages(position: Position, entry: bytes) -> list[tuple[int, str | None, bool]]:
    """(batch index, key, deletes the key) of each live message of an entry."""
    try:
        parsed = parse_entry(entry, verify_checksum=False)
        metadata = parsed.metadata
        if metadata.HasField("marker_type") or metadata.num_chunks_from_msg > 1:
            return []
        batched = metadata.HasField("num_messages_in_batch")
        messages = unpack_messages(metadata, parsed.payload)
    except ProtocolError as exc:
        log.warning("compaction skips entry %s: %s", position, exc)
        return []
    found = []
    for message in messages:
        if message.compacted_out:
            continue
        deletes = message.payload is None or len(message.payload) == 0
        found.append((message.batch_index if batched else -1, _key_of(message), deletes))
    return found


def latest_per_key(storage: LedgerStorage, segments: list[Segment],
                   keys_max: int = COMPACTION_KEYS_MAX) -> dict[str, MessageId]:
    """Phase one: the latest message id of each live key.

    Raises:
        CompactionError: more than `keys_max` live keys.
        StorageError: a read failed.
    """
    latest: dict[str, MessageId] = {}
    for entries in _iter_entries(storage, segments):
        for position, entry in entries:
            for index, key, deletes in _messages(position, entry):
                if key is None:
                    continue
                if deletes:
                    latest.pop(key, None)
                    continue
                latest[key] = (position, index)
                if len(latest) > keys_max:
                    raise CompactionError(f"more than {keys_max} keys to keep")
    return latest


def retained_entries(storage: LedgerStorage, chunk: Segment,
                     latest: dict[str, MessageId]) -> list[bytes]:
    """Phase two for one chunk: the compacted ledger's entries it contributes, in order."""
    out: list[bytes] = []
    for position, entry in _entries(storage, [chunk]):
        messages = _messages(position, entry)
        kept = {index for index, key, _ in messages
                if key is not None and latest.get(key) == (position, index)}
        if not kept:
            continue
        kept_entry = entry if -1 in kept else _without_dropped(entry, kept)
        out.append(encode_compacted_entry(position, kept_entry))
    return out


def _without_dropped(entry: bytes, kept: set[int]) -> bytes:
    """The batch entry with every message not in `kept` flagged `compacted_out` and emptied
    (unchanged when nothing needs flagging)."""
    parsed = parse_entry(entry, verify_checksum=False)
    metadata = parsed.metadata
    messages = unpack_messages(metadata, parsed.payload)
    if all(m.compacted_out or m.batch_index in kept for m in messages):
        return entry
    rewritten = [m if m.batch_index in kept or m.compacted_out
                 else m._replace(payload=b"", compacted_out=True) for m in messages]
    payload = encode_batch_payload(rewritten)
    codec = CompressionType(int(metadata.compression))
    if codec is not CompressionType.NONE:
        metadata.uncompressed_size = len(payload)
        payload = compress(codec, payload)
    rebuilt = encode_entry(metadata, payload, checksum=parsed.checksum is not None)
    if parsed.broker_entry_metadata is not None:
        rebuilt = prefix_broker_entry_metadata(parsed.broker_entry_metadata, rebuilt)
    return rebuilt
