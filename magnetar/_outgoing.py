"""What a producer sends and where its outcome goes: `OutMessage` (one message as the
application gave it; `plain_message` for bare bytes; `Queued`, what a send on its way to the
loop holds: bare bytes stand for their `plain_message` until a path needs the tuple, the hot
path), `ResultSink` (an `asyncio.Future` or any object with its three methods), `PartsSink` (a
sink that takes a stored message's id as its parts) and `stored` / `stored_one` (resolving the
sinks of one stored entry). The producer core (`_producer.py`) and `send_async` (`_sender.py`)
share them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, NamedTuple, Protocol

from magnetar.codec import MessageId, SingleMessage

from ._message_id import trusted_id

__all__ = ["NO_PROPERTIES", "OutMessage", "PartsSink", "Queued", "ResultSink", "out_of",
           "plain_message", "stored", "stored_one"]

NO_PROPERTIES: Final[Mapping[str, str]] = MappingProxyType({})
_new_tuple = tuple.__new__
assert SingleMessage._fields == (  # the order `OutMessage.single` builds it in
    "payload", "properties", "partition_key", "partition_key_b64_encoded", "ordering_key",
    "event_time", "sequence_id", "null_partition_key", "batch_index", "compacted_out")


class OutMessage(NamedTuple):
    """One message to send, as the application gave it (a tuple: one is made per send)."""

    payload: bytes | None
    properties: Mapping[str, str] = NO_PROPERTIES
    partition_key: str | None = None
    ordering_key: bytes | None = None
    event_time: int = 0
    sequence_id: int | None = None
    deliver_at_ms: int | None = None

    def single(self, sequence_id: int) -> SingleMessage:
        """The message as it goes into a batch (SingleMessage's fields, in order)."""
        return _new_tuple(SingleMessage, (
            self.payload, self.properties, self.partition_key, False, self.ordering_key,
            self.event_time, sequence_id, False, -1, False))


assert OutMessage._fields == ("payload", "properties", "partition_key", "ordering_key",
                              "event_time", "sequence_id", "deliver_at_ms")


def plain_message(payload: bytes) -> OutMessage:
    """A message of bare bytes and no options (nothing to check)."""
    return _new_tuple(OutMessage, (payload, NO_PROPERTIES, None, None, 0, None, None))


# A send on its way to the loop: its message, or for bare bytes and no options the bytes
# alone (the hot path of `send` and `send_async`: no tuple per message, which the garbage
# collector would count until the receipt).
Queued = OutMessage | bytes


def out_of(queued: Queued) -> OutMessage:
    """The message a queued send stands for."""
    return plain_message(queued) if isinstance(queued, bytes) else queued


class PartsSink:
    """A result sink that takes a stored message's id as its parts (ledger id, entry id,
    partition, batch index, batch size) -- the send callbacks' sink, which builds the id the
    application gets from them without the codec id in between."""

    __slots__ = ()

    def set_parts(self, ledger_id: int, entry_id: int, partition: int, batch_index: int,
                  batch_size: int) -> None:
        raise NotImplementedError

    def set_parts_of_entry(self, sinks: list[ResultSink], ledger_id: int, entry_id: int,
                           partition: int, batch_size: int) -> None:
        """Resolve the sinks of one stored entry, this one first (sink i gets batch index i;
        -1 when `batch_size` is 0): a subclass may do it in one loop."""
        stored(sinks, ledger_id, entry_id, partition, batch_size)


def stored(sinks: list[ResultSink], ledger_id: int, entry_id: int, partition: int,
           batch_size: int) -> None:
    """Resolve the sinks of one stored entry not resolved yet: sink i gets batch index i
    (-1 when `batch_size` is 0, a message alone in its entry)."""
    for index, sink in enumerate(sinks):
        stored_one(sink, ledger_id, entry_id, partition, index if batch_size else -1,
                   batch_size)


def stored_one(sink: ResultSink, ledger_id: int, entry_id: int, partition: int,
               batch_index: int, batch_size: int) -> None:
    """Resolve one message's sink with its id, unless it is resolved already."""
    if sink.done():
        return
    if isinstance(sink, PartsSink):
        sink.set_parts(ledger_id, entry_id, partition, batch_index, batch_size)
    else:
        sink.set_result(trusted_id(ledger_id, entry_id, partition, batch_index, batch_size))


class ResultSink(Protocol):
    """Where one message's outcome goes: an `asyncio.Future`, or any object with the same three
    methods (`send_async` passes one that calls back without a future's scheduling)."""

    def done(self) -> bool: ...

    def set_result(self, result: MessageId, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...
