"""Publishing to a persistent topic: `Publisher`, the part of `PersistentTopic` that checks,
deduplicates and appends SENDs (see `_topic.py`'s theory of operation, steps 1-4).

A run of one producer's SENDs (`publish_many`, what one socket read delivered) is admitted one
by one -- checks and dedup in order, so dedup sees each as pushed before the next -- then the
admitted entries go to the managed ledger as one group (`ManagedLedger.add_entries`: one hold
of its submit lock, one hand-off from the storage to the loop), and each outcome is recorded in
order. `publish` is a run of one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from magnetar.codec import FRAME_PADDING_BYTES, pb

from .._errors import (
    BrokerError,
    DiskFullError,
    NotAllowedError,
    PersistenceError,
    TopicTerminatedError,
    from_storage_error,
)
from .._names import TopicName
from .._namespaces import EffectivePolicies
from ..ledger._add_group import AddGroup, AddOutcomes
from ..ledger._managed_ledger import ManagedLedger
from ..ledger._position import Position
from ._dedup import (
    DEDUP_UNKNOWN_MESSAGE,
    DeduplicationState,
    DedupResult,
    highest_sequence_id_of,
)
from ._entry_metadata import EntryMetadataAppender
from ._producer import Producer, PublishResult, _count_in, _metadata_of

if TYPE_CHECKING:
    from ._service import BrokerService

__all__ = ["Publisher", "Send"]

log = logging.getLogger(__name__)

_K = TypeVar("_K")  # what `publish_grouped`'s caller passes on to its `answer`
new_tuple = tuple.__new__  # a PublishResult from a Position without the NamedTuple's __new__

# One SEND for `publish_many`: entry, sequence id, stated highest sequence id, metadata.
Send = tuple[bytes, int, int, "pb.MessageMetadata | None"]
# An admitted SEND: its index, the bytes to store, highest sequence id, last chunk, metadata.
_Admitted = tuple[int, bytes, int, bool, pb.MessageMetadata]


class Publisher:
    """Publishing for `PersistentTopic`, which sets these attributes and provides
    `remove_producer`, `_spawn` and `_take_dedup_snapshot` (this is its last base, so theirs
    win over the stubs here)."""

    __slots__ = ("_dedup_recorded", "_publishes_queued", "bytes_in_counter", "msg_in_counter")

    service: BrokerService
    name: TopicName
    producers: dict[str, Producer]
    fenced: bool
    dedup: DeduplicationState | None
    entry_metadata: EntryMetadataAppender | None
    managed_ledger: ManagedLedger
    policies: EffectivePolicies
    _dedup_recorded: Position
    _publishes_queued: int  # `publish_many_soon` tasks not finished
    msg_in_counter: int
    bytes_in_counter: int

    def remove_producer(self, producer: Producer) -> None:
        raise NotImplementedError

    def _spawn(self, work: Any) -> None:
        raise NotImplementedError

    async def _take_dedup_snapshot(self) -> None:
        raise NotImplementedError

    async def publish(self, producer: Producer, entry: bytes, sequence_id: int,
                      highest_sequence_id: int, metadata: pb.MessageMetadata | None = None,
                      ) -> PublishResult:
        """Append one entry (a message or a batch) for a producer.

        Args:
            producer: the publishing producer.
            entry: the entry bytes as sent.
            sequence_id: the SEND's (lowest) sequence id.
            highest_sequence_id: the SEND's stated highest id; below `sequence_id` when it
                stated none, and then dedup derives it from the entry
                (`highest_sequence_id_of`).
            metadata: the entry's metadata when the caller has it parsed already.

        Raises:
            NotAllowedError: too large, or delayed beyond the maximum; nothing written.
            PersistenceError: dedup cannot tell yet, or storage failed; nothing written
                (on a storage failure the entry may or may not be durable).
            DiskFullError: the disk is full; nothing acknowledged, the producer is closed.
            TopicTerminatedError: the topic is terminated, closing, or the producer is
                closed (or still waiting for exclusive access).
        """
        outcome = (await self.publish_many(
            producer, [(entry, sequence_id, highest_sequence_id, metadata)]))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def publish_many(self, producer: Producer, sends: list[Send],
                           ) -> list[PublishResult | BaseException]:
        """`publish` for a run of one producer's SENDs (entry, sequence id, highest sequence
        id, metadata), in order, with one managed-ledger add for those admitted; returns
        each one's result or what `publish` would have raised for it."""
        outcomes, admitted = self._admit_many(producer, sends)
        if admitted:
            try:
                positions: AddOutcomes = await self.managed_ledger.add_entries(
                    [a[1] for a in admitted])
            except Exception as exc:
                positions = [exc] * len(admitted)
            self._finish_many(producer, sends, outcomes, admitted, positions)
        assert all(outcome is not None for outcome in outcomes)
        return outcomes  # type: ignore[return-value]

    def publish_many_soon(self, producer: Producer, sends: list[Send],
                          ) -> asyncio.Task[list[PublishResult | BaseException]]:
        """`publish_many` as a task started now: `publish_grouped` declines until it has
        finished (publishes keep their order)."""
        self._publishes_queued += 1
        task = asyncio.ensure_future(self.publish_many(producer, sends))
        task.add_done_callback(self._queued_publish_done)
        return task

    def _queued_publish_done(self, _: object) -> None:
        self._publishes_queued -= 1

    def publish_grouped(self, producer: Producer, sends: list[Send], group: AddGroup,
                        answer: Callable[[_K, list[PublishResult | BaseException]], None],
                        key: _K) -> bool:
        """`publish_many` with the admitted entries added through `group` (one storage write
        for a socket read's SENDs of many topics): admits the SENDs now and calls
        `answer(key, outcomes)` once the outcomes are known (at once when none was
        admitted). False (nothing done) while a `publish_many_soon` has not finished: then
        use that. The hot path with many producers (a SEND per topic per read): the loop
        of `_finish_many` is inlined here, and an add's common outcome
        (no dedup, a position) is recorded without `_added`."""
        if self._publishes_queued:
            return False
        outcomes, admitted = self._admit_many(producer, sends)
        if not admitted:
            answer(key, outcomes)  # type: ignore[arg-type]
            return True

        def added(positions: AddOutcomes) -> None:
            if self.dedup is not None:
                self._finish_many(producer, sends, outcomes, admitted, positions)
                answer(key, outcomes)  # type: ignore[arg-type]
                return
            messages = size = 0
            for (index, _, highest, last_chunk, metadata), position in zip(
                    admitted, positions, strict=True):
                entry = sends[index][0]
                if type(position) is not Position or \
                        metadata.HasField("num_messages_in_batch"):
                    outcomes[index] = self._added(producer, position, entry, sends[index][1],
                                                  highest, last_chunk, metadata)
                    continue
                messages += 1  # `_count_in` of a single message, summed
                size += len(entry)
                outcomes[index] = new_tuple(PublishResult, position)
            producer.msg_in_counter += messages
            producer.bytes_in_counter += size
            self.msg_in_counter += messages
            self.bytes_in_counter += size
            answer(key, outcomes)  # type: ignore[arg-type]

        group.add(self.managed_ledger, [admitted[0][1]] if len(admitted) == 1 else
                  [a[1] for a in admitted], added)
        return True

    def _admit_many(self, producer: Producer, sends: list[Send],
                    ) -> tuple[list[PublishResult | BaseException | None], list[_Admitted]]:
        """Checks and dedup of each SEND in order: the outcomes known already (refusals,
        duplicates; None for the rest) and the admitted SENDs."""
        outcomes: list[PublishResult | BaseException | None] = [None] * len(sends)
        admitted: list[_Admitted] = []
        # When `_admits_all_at_once`, what holds for the whole run is checked once, and an
        # entry of an allowed size is admitted as `_admit_send` would.
        at_once = self._admits_all_at_once(producer)
        limit = self.service.config.max_message_size_bytes + FRAME_PADDING_BYTES
        for index, (entry, sequence_id, highest, metadata) in enumerate(sends):
            if at_once and metadata is not None and len(entry) <= limit:
                admitted.append((index, entry, highest, not metadata.HasField("chunk_id") or
                                 metadata.chunk_id == metadata.num_chunks_from_msg - 1,
                                 metadata))
                continue
            try:
                verdict = self._admit_send(producer, entry, sequence_id, highest, metadata)
            except Exception as exc:
                outcomes[index] = exc
                continue
            if verdict is None:
                outcomes[index] = PublishResult(-1, -1)  # a duplicate: nothing written
            else:
                admitted.append((index, *verdict))
        return outcomes, admitted

    def _admits_all_at_once(self, producer: Producer) -> bool:
        """Whether `_admit_many` may check its run's common conditions once: the producer
        may publish (`_admit_send`'s first checks pass), and neither dedup, a delay limit
        nor entry metadata looks at each entry."""
        return (self.dedup is None and self.entry_metadata is None
                and self.policies.delayed_delivery_max_delay_ms <= 0
                and not producer.closed_on_full_disk and not self.fenced
                and not producer.closed and self.producers.get(producer.name) is producer)

    def _finish_many(self, producer: Producer, sends: list[Send],
                     outcomes: list[PublishResult | BaseException | None],
                     admitted: list[_Admitted], positions: AddOutcomes) -> None:
        """The admitted SENDs' adds finished: record each (`_added`) into `outcomes`."""
        for (index, _, highest, last_chunk, metadata), position in zip(
                admitted, positions, strict=True):
            entry, sequence_id = sends[index][:2]
            outcomes[index] = self._added(producer, position, entry, sequence_id,
                                          highest, last_chunk, metadata)

    def _admit_send(self, producer: Producer, entry: bytes, sequence_id: int,
               highest_sequence_id: int, metadata: pb.MessageMetadata | None,
               ) -> tuple[bytes, int, bool, pb.MessageMetadata] | None:
        """Publish's checks and dedup: the bytes to store, the highest sequence id, whether
        it is a message's last chunk and the metadata; None for a duplicate. Raises as
        `publish`."""
        if producer.closed_on_full_disk:
            raise DiskFullError(f"Cannot publish to {self.name}: the broker's disk is full")
        if self.fenced or producer.closed or self.producers.get(producer.name) is not producer:
            raise TopicTerminatedError(f"Topic {self.name} is not accepting messages")
        metadata = metadata if metadata is not None else _metadata_of(entry)
        if self.policies.delayed_delivery_max_delay_ms > 0 or \
                len(entry) > self.service.config.max_message_size_bytes + FRAME_PADDING_BYTES:
            self._check_message(entry, metadata)  # only when it may refuse
        dedup = self.dedup
        last_chunk = not metadata.HasField("chunk_id") or \
            metadata.chunk_id == metadata.num_chunks_from_msg - 1
        if dedup is not None:
            highest_sequence_id = highest_sequence_id_of(sequence_id, highest_sequence_id,
                                                         metadata, entry)
            verdict = dedup.check(producer.name, sequence_id, highest_sequence_id,
                                  is_chunk_not_last=not last_chunk)
            if verdict is DedupResult.DUP:
                return None
            if verdict is DedupResult.UNKNOWN:
                raise PersistenceError(DEDUP_UNKNOWN_MESSAGE)
        stored = entry if self.entry_metadata is None else \
            self.entry_metadata.prefix(entry, metadata)
        return stored, highest_sequence_id, last_chunk, metadata

    def _added(self, producer: Producer, position: Position | BaseException, entry: bytes,
               sequence_id: int, highest_sequence_id: int, last_chunk: bool,
               metadata: pb.MessageMetadata) -> PublishResult | BaseException:
        """An admitted entry's add finished (`position`, or its error): dedup records it;
        the publish's result, or the error `publish` raises."""
        dedup = self.dedup
        if isinstance(position, BaseException):
            if isinstance(position, BrokerError):
                return position
            if dedup is not None:
                dedup.reset_pushed_to_persisted()
            from magnetar.storage import StorageError, StorageFullError

            if isinstance(position, StorageFullError):
                return self._refuse_for_full_disk(producer, position)
            if isinstance(position, StorageError):
                return from_storage_error(position)
            return PersistenceError(f"write to {self.name} failed: {position}")
        if dedup is not None and last_chunk:
            dedup.record_persisted(producer.name, sequence_id, highest_sequence_id)
            self._dedup_recorded = max(self._dedup_recorded, position)
            # Every `entries_interval` entries; the time-based snapshot is maintenance's.
            # Not once the topic is closing: `close` cancelled the background tasks and
            # takes the last snapshot itself (a task spawned now would outlive the topic).
            if not dedup.snapshot_running and not self.fenced and \
                    dedup.entries_since_snapshot >= \
                    self.service.config.broker_deduplication_entries_interval:
                self._spawn(self._take_dedup_snapshot())
        _count_in(self, producer, entry, metadata)  # type: ignore[arg-type]  # a PersistentTopic
        return PublishResult(position.ledger_id, position.entry_id)

    def _refuse_for_full_disk(self, producer: Producer, error: Exception) -> DiskFullError:
        """A publish failed on a full disk: close the producer (CLOSE_PRODUCER) instead of
        answering SEND_ERROR, which the official client treats as a broken connection and
        answers by resending forever. It reconnects, is refused with DiskFullError while the
        disk is full, and fails its pending sends with that error."""
        if not producer.closed:
            log.warning("closing producer %s of %s: the disk is full (%s)", producer.name,
                        self.name, error)
            producer.closed_on_full_disk = True
            self.remove_producer(producer)
            producer.disconnect("the broker's disk is full")
        return DiskFullError(f"Cannot publish to {self.name}: the broker's disk is full")

    def _check_message(self, entry: bytes, metadata: pb.MessageMetadata) -> None:
        limit = self.service.config.max_message_size_bytes + FRAME_PADDING_BYTES
        if len(entry) > limit:
            raise NotAllowedError(f"Message of {len(entry)} bytes exceeds the maximum "
                                  f"{self.service.config.max_message_size_bytes} on {self.name}")
        max_delay = self.policies.delayed_delivery_max_delay_ms
        if max_delay > 0 and metadata.HasField("deliver_at_time") and \
                metadata.deliver_at_time - metadata.publish_time > max_delay:
            raise NotAllowedError(
                f"Exceeds max allowed delivery delay of {max_delay} milliseconds")

