"""Message deduplication state of one persistent topic (reference §5).

Theory of operation
-------------------

Each producer numbers its messages; a batch carries its lowest (`sequence_id`) and highest
(`highest_sequence_id`) sequence id. The official C++/Python client states no highest id, in
neither CommandSend nor MessageMetadata: `highest_sequence_id_of` (the one derivation every
path uses: the live check, what is recorded as persisted, and the replay after a crash) then
takes it from the batch itself (see there). Per producer *name* the broker keeps two numbers:

* `pushed`: the highest sequence id accepted for writing, set *before* the write;
* `persisted`: the highest sequence id written, set when the write is durable.

`check` decides a publish with the batch's *lowest* id against those (the stored values are
highest ids; the client splits batches around possible duplicates so this drops nothing new):

| pushed known and seq <= pushed | persisted known and seq <= persisted | result                  |
|--------------------------------|--------------------------------------|-------------------------|
| no                             | -                                    | NOT_DUP, pushed = high  |
| yes                            | yes                                  | DUP                     |
| yes                            | no                                   | UNKNOWN (still in flight)|

NOT_DUP: write it, then `record_persisted`. DUP: write nothing; answer a receipt with ledger and
entry -1. UNKNOWN: answer PersistenceError ("Cannot determine whether the message is a duplicate
at this time"); the client reconnects and resends. Of a chunked message only the last chunk is
checked and recorded; the other chunks always pass. After a failed write, once the pending writes
have drained, `reset_pushed_to_persisted` forgets what was accepted but never written.

Snapshots and recovery: the state is made durable as a *snapshot*, `{producer: persisted}`, that
the service stores as the properties of the `pulsar.dedup` cursor when it mark-deletes that cursor
at the snapshot's position. At most `producers_max` producers are kept, the first in name order.
A snapshot is due after `entries_interval` (1000) recorded entries, or when
`snapshot_interval_ms` (120 s) passed since the last one and entries were recorded since (the
periodic check; "entries recorded since the last snapshot" stands for upstream's "the last entry
is beyond the dedup cursor's mark-delete position"). Only one snapshot runs at a time:
`begin_snapshot` ... `end_snapshot`. Recovery is `restore(snapshot)` followed by
`replay_entry` for every entry after the cursor's mark-delete position, in entry order; when
that replayed `entries_interval` entries or more, `should_snapshot` asks for a snapshot at the
last one.

Inactive producers: a disconnect stamps the producer inactive (a connect clears the stamp);
`purge_inactive` drops the state of producers inactive longer than the timeout (360 min).
Producers recovered from a snapshot or replay are stamped inactive at recovery time unless
connected, so a producer that never comes back is purged too.

Not here: the replicator-prefix (`pulsar.repl`) handling, which takes the original producer name
and sequence ids from the metadata of replicated messages. Magnetar has no geo-replication, so
the service passes the producer's own name and ids; marker messages are skipped by the service.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Final

from magnetar.codec import (
    UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT,
    CompressionType,
    RemoteProtocolError,
    batch_last_sequence_id,
    decompress,
    entry_payload,
    pb,
)

from .._config import BrokerConfig
from .._errors import MetadataError
from ..dispatch._entry import messages_in_entry

__all__ = [
    "DEDUP_CURSOR_NAME",
    "DEDUP_UNKNOWN_MESSAGE",
    "DedupResult",
    "DeduplicationState",
    "decode_dedup_snapshot",
    "encode_dedup_snapshot",
    "highest_sequence_id_of",
]

DEDUP_CURSOR_NAME: Final = "pulsar.dedup"
DEDUP_UNKNOWN_MESSAGE: Final = "Cannot determine whether the message is a duplicate at this time"
_SNAPSHOT_VERSION: Final = 1


def highest_sequence_id_of(sequence_id: int, stated_highest: int,
                           metadata: pb.MessageMetadata, entry: bytes) -> int:
    """The highest sequence id an entry carries; never below `sequence_id`.

    In order: the id the SEND stated (`stated_highest`, when not below `sequence_id`); the
    metadata's `highest_sequence_id`; for a batch of n > 1 messages (n: `_entry.messages_in`,
    the claim bounded by what the entry can hold), the sequence id of its
    last single-message metadata (what the C++ client writes; the payload is decompressed
    when needed), else `sequence_id + n - 1` when that message has none or the payload
    cannot be read; otherwise `sequence_id`. Reading the batch is cheap in the usual case of
    consecutive ids: `batch_last_sequence_id` confirms `sequence_id + n - 1` from the
    payload's tail and walks the batch only when that fails.

    Args:
        sequence_id: the entry's (lowest) sequence id.
        stated_highest: CommandSend's `highest_sequence_id`; below `sequence_id` (e.g. -1)
            when the SEND had none, or for a stored entry.
        metadata: the entry's metadata.
        entry: the entry's bytes as sent or stored (`codec.entry_payload` finds the payload,
            only when it is read).
    """
    if stated_highest >= sequence_id:
        return stated_highest
    if metadata.HasField("highest_sequence_id") and \
            metadata.highest_sequence_id >= sequence_id:
        return int(metadata.highest_sequence_id)
    count = messages_in_entry(metadata, entry)
    if count <= 1:
        return sequence_id
    consecutive = sequence_id + count - 1
    try:
        payload = entry_payload(entry)
        if int(metadata.compression) != CompressionType.NONE:
            payload = decompress(metadata.compression, payload, metadata.uncompressed_size,
                                 uncompressed_size_bytes_max=UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT)
        last = batch_last_sequence_id(payload, count, expected=consecutive)
    except RemoteProtocolError:  # the broker does not validate payloads; dedup must not fail
        return consecutive
    return consecutive if last is None else max(last, sequence_id)


class DedupResult(enum.Enum):
    """The publish decision of `DeduplicationState.check`."""

    NOT_DUP = "not_dup"  # write it
    DUP = "dup"  # already written: receipt with ledger/entry -1, write nothing
    UNKNOWN = "unknown"  # maybe in flight: PersistenceError, the client resends later


class DeduplicationState:
    """Per-producer sequence-id state of one topic, with its snapshot bookkeeping.

    Args:
        entries_interval: recorded entries after which a snapshot is due
            (`brokerDeduplicationEntriesInterval`), > 0.
        snapshot_interval_ms: time after which the periodic check takes a snapshot
            (`brokerDeduplicationSnapshotIntervalSeconds` in ms); <= 0 turns it off. A public
            attribute: topic and namespace policies may change it.
        producers_max: the most producers a snapshot keeps
            (`brokerDeduplicationMaxNumberOfProducers`), > 0.
    """

    def __init__(self, *, entries_interval: int = 1000, snapshot_interval_ms: int = 120_000,
                 producers_max: int = 10_000) -> None:
        assert entries_interval > 0
        assert producers_max > 0
        self._entries_interval = entries_interval
        self.snapshot_interval_ms = snapshot_interval_ms
        self._producers_max = producers_max
        self._pushed: dict[str, int] = {}
        self._persisted: dict[str, int] = {}
        self._inactive_since: dict[str, float] = {}
        self._connected: dict[str, int] = {}  # producer name -> live producers with that name
        self._entries_since_snapshot = 0
        self._entries_in_flight = 0  # counted entries the running snapshot covers
        self._snapshot_running = False
        # Like upstream, no snapshot has been taken yet, so the first periodic check takes one.
        self._last_snapshot_ms: float = 0

    @classmethod
    def from_config(cls, config: BrokerConfig) -> DeduplicationState:
        """A state object with the broker's dedup settings."""
        return cls(entries_interval=config.broker_deduplication_entries_interval,
                   snapshot_interval_ms=config.broker_deduplication_snapshot_interval_s * 1000,
                   producers_max=config.broker_deduplication_max_number_of_producers)

    # -- publishing ---------------------------------------------------------------------------

    def check(self, producer_name: str, sequence_id: int, highest_sequence_id: int,
              is_chunk_not_last: bool = False) -> DedupResult:
        """Decide one publish (the table in the module comment); NOT_DUP also marks it pushed.

        Args:
            producer_name: the producer's name.
            sequence_id: the send's (lowest) sequence id.
            highest_sequence_id: the entry's highest sequence id (`highest_sequence_id_of`;
                `sequence_id` or less counts as `sequence_id`).
            is_chunk_not_last: a chunk other than the last of a chunked message; always passes
                and changes nothing.

        Returns:
            NOT_DUP, DUP or UNKNOWN.
        """
        if is_chunk_not_last:
            return DedupResult.NOT_DUP
        pushed = self._pushed.get(producer_name)
        if pushed is not None and sequence_id <= pushed:
            persisted = self._persisted.get(producer_name)
            if persisted is not None and sequence_id <= persisted:
                return DedupResult.DUP
            return DedupResult.UNKNOWN
        self._pushed[producer_name] = max(highest_sequence_id, sequence_id)
        return DedupResult.NOT_DUP

    def record_persisted(self, producer_name: str, sequence_id: int, highest_sequence_id: int,
                         is_chunk_not_last: bool = False) -> None:
        """Record that an entry passed by `check` is durable. Every call counts toward the
        entries interval; a chunk other than the last leaves `persisted` alone.

        Args:
            producer_name: the producer's name.
            sequence_id: the send's (lowest) sequence id.
            highest_sequence_id: the entry's highest sequence id, as given to `check`.
            is_chunk_not_last: as in `check`.
        """
        if not is_chunk_not_last:
            self._persisted[producer_name] = max(highest_sequence_id, sequence_id)
        self._entries_since_snapshot += 1

    def reset_pushed_to_persisted(self) -> None:
        """After a failed write, once pending writes drained: pushed becomes persisted, so the
        ids accepted but never written are accepted again on resend."""
        self._pushed = dict(self._persisted)

    def last_sequence_id(self, producer_name: str) -> int:
        """`CommandProducerSuccess.last_sequence_id`: the producer's pushed id, or -1."""
        return self._pushed.get(producer_name, -1)

    def highest_pushed(self, producer_name: str) -> int | None:
        """The highest id accepted for writing, or None when unknown."""
        return self._pushed.get(producer_name)

    def highest_persisted(self, producer_name: str) -> int | None:
        """The highest id written, or None when unknown."""
        return self._persisted.get(producer_name)

    def clear(self) -> None:
        """Forget everything (dedup was switched off for the topic)."""
        self._pushed.clear()
        self._persisted.clear()
        self._inactive_since.clear()
        self._entries_since_snapshot = 0

    # -- producers ----------------------------------------------------------------------------

    def producer_connected(self, producer_name: str) -> None:
        """A producer with this name connected: it is no longer inactive."""
        self._connected[producer_name] = self._connected.get(producer_name, 0) + 1
        self._inactive_since.pop(producer_name, None)

    def producer_disconnected(self, producer_name: str, now: float) -> None:
        """A producer with this name went away at `now` (ms); once no producer with the name
        is left, its state may be purged after the inactivity timeout."""
        count = self._connected.get(producer_name, 0) - 1
        if count > 0:
            self._connected[producer_name] = count
            return
        self._connected.pop(producer_name, None)
        self._inactive_since[producer_name] = now

    def _mark_recovered(self, producer_name: str, now: float) -> None:
        if producer_name not in self._connected:
            self._inactive_since[producer_name] = now

    def purge_inactive(self, now: float, inactivity_timeout_ms: float) -> list[str]:
        """Drop the state of producers inactive for longer than the timeout.

        Args:
            now: the current time (ms).
            inactivity_timeout_ms: `brokerDeduplicationProducerInactivityTimeoutMinutes` in ms.

        Returns:
            The purged producer names, sorted. When any were purged the service takes a
            snapshot at the dedup cursor's current mark-delete position.
        """
        oldest_kept = now - inactivity_timeout_ms
        purged = sorted(name for name, since in self._inactive_since.items()
                        if since < oldest_kept)
        for name in purged:
            del self._inactive_since[name]
            self._pushed.pop(name, None)
            self._persisted.pop(name, None)
        return purged

    # -- snapshots and recovery ---------------------------------------------------------------

    def snapshot(self) -> dict[str, int]:
        """`{producer: persisted}` for at most `producers_max` producers, the first in name
        order."""
        names = sorted(self._persisted)[:self._producers_max]
        result = {name: self._persisted[name] for name in names}
        assert len(result) <= self._producers_max
        return result

    @property
    def entries_since_snapshot(self) -> int:
        """Entries recorded or replayed since the last snapshot began."""
        return self._entries_since_snapshot

    @property
    def snapshot_running(self) -> bool:
        """True between `begin_snapshot` and `end_snapshot`."""
        return self._snapshot_running

    def should_snapshot(self, now: float) -> bool:
        """Whether a snapshot at the last written entry is due: none is running, and either
        `entries_interval` entries were recorded since the last one, or entries were recorded
        and `snapshot_interval_ms` (if > 0) passed since the last successful one."""
        if self._snapshot_running or self._entries_since_snapshot == 0:
            return False
        if self._entries_since_snapshot >= self._entries_interval:
            return True
        return (self.snapshot_interval_ms > 0
                and now - self._last_snapshot_ms >= self.snapshot_interval_ms)

    def begin_snapshot(self, at_last_entry: bool = True) -> dict[str, int]:
        """Start a snapshot; the caller stores the result with the dedup cursor's mark-delete
        and then calls `end_snapshot`.

        Args:
            at_last_entry: True when the snapshot's position is the last written entry, so the
                recorded entries count as covered; False for a snapshot at the cursor's current
                mark-delete position (after a purge), which covers no new entries.

        Returns:
            The snapshot mapping (see `snapshot`).
        """
        assert not self._snapshot_running
        self._snapshot_running = True
        if at_last_entry:
            self._entries_in_flight = self._entries_since_snapshot
            self._entries_since_snapshot = 0
        return self.snapshot()

    def end_snapshot(self, now: float, succeeded: bool) -> None:
        """Finish the running snapshot. On failure the entries it covered count again, so
        the next check retries."""
        assert self._snapshot_running
        self._snapshot_running = False
        if succeeded:
            self._last_snapshot_ms = now
        else:
            self._entries_since_snapshot += self._entries_in_flight
        self._entries_in_flight = 0

    def restore(self, snapshot: Mapping[str, int], now: float) -> None:
        """Load a snapshot into both maps (the first step of recovery).

        Args:
            snapshot: `{producer: persisted}` as stored with the dedup cursor.
            now: the recovery time (ms); restored producers that are not connected are
                stamped inactive then.
        """
        for name, sequence_id in snapshot.items():
            self._pushed[name] = sequence_id
            self._persisted[name] = sequence_id
            self._mark_recovered(name, now)

    def replay_entry(self, producer_name: str, sequence_id: int, highest_sequence_id: int,
                     now: float) -> None:
        """Apply one entry read after the dedup cursor's mark-delete position (recovery, in
        entry order): both maps become `max(highest, sequence_id)`, overwriting.

        Args:
            producer_name: the entry's `producer_name` metadata.
            sequence_id: the entry's `sequence_id`.
            highest_sequence_id: the entry's highest sequence id (`highest_sequence_id_of`).
            now: the recovery time (ms), for the inactivity stamp.
        """
        value = max(highest_sequence_id, sequence_id)
        self._pushed[producer_name] = value
        self._persisted[producer_name] = value
        self._mark_recovered(producer_name, now)
        self._entries_since_snapshot += 1


def encode_dedup_snapshot(snapshot: Mapping[str, int]) -> bytes:
    """The stored form of a snapshot: UTF-8 JSON `{"version": 1, "producers": {...}}` with
    sorted keys (deterministic bytes for equal snapshots)."""
    document = {"version": _SNAPSHOT_VERSION, "producers": dict(snapshot)}
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_dedup_snapshot(data: bytes) -> dict[str, int]:
    """Read a snapshot written by `encode_dedup_snapshot`.

    Raises:
        MetadataError: the bytes are not a snapshot of a known version.
    """
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MetadataError(f"unreadable dedup snapshot: {error}") from error
    if not isinstance(document, dict) or document.get("version") != _SNAPSHOT_VERSION:
        raise MetadataError("dedup snapshot of an unknown version")
    producers = document.get("producers")
    if not isinstance(producers, dict):
        raise MetadataError("dedup snapshot without a producer map")
    result: dict[str, int] = {}
    for name, value in producers.items():
        # bool is an int subclass in Python; a snapshot never holds one.
        if not isinstance(value, int) or isinstance(value, bool):
            raise MetadataError(f"dedup snapshot: bad sequence id for producer {name!r}")
        result[name] = value
    return result
