"""The `Transport` interface: what the client core needs from a broker, in-process or over TCP.

Theory of operation
-------------------
The client core (`_producer.py`, `_consumer.py`) holds every client-side behaviour -- sequence
ids, batching, compression, chunking, pending queues and timeouts, receiver queues and permits,
ack grouping, negative acks, chunk reassembly -- and talks to a broker only through this small
interface. Two transports implement it: `EmbeddedTransport` calls `broker.BrokerService` in the
same process, `TcpTransport` speaks the binary protocol through `codec.Connection`. Both run on
the client's loop thread, and every method is called there.

Ids: the core chooses producer and consumer ids (unique per client) and passes them to every
call. Deliveries and the broker's own closes come back through the `ConsumerEvents` and
`ProducerEvents` objects given at creation, which must not block.

Sends: `send` starts the publish (publishes of one producer reach the broker in call order) and
returns a `SendReceipt` resolved with the entry's `(ledger_id, entry_id)` -- `(-1, -1)` for a
duplicate the broker dropped -- or failed with a `PulsarException`. A receipt is a future
without the loop hand-off: its one callback runs the moment it is resolved, so a transport
completes a whole run of receipts in one turn of the loop instead of scheduling a callback each.
Sends go out at the end of the loop's turn (one write or one publish for all of them), or, for
a burst between `begin_burst` and `end_burst` (the synchronous API's queued sends), at its end:
one loop iteration per message fewer when the burst is a single send.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from magnetar.codec import MessageId, pb

__all__ = ["ConsumerEvents", "Incoming", "KeySharedPolicy", "ProducerEvents", "ProducerOpened",
           "ProducerRequest", "SendReceipt", "SubscribeRequest", "Transport"]


class SendReceipt:
    """The outcome of one send (see the module comment): resolved once, with one callback,
    called at once on resolution (or soon, on the loop, when it was resolved already)."""

    __slots__ = ("_callback", "_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = False
        self._value: tuple[int, int] = (-1, -1)
        self._error: BaseException | None = None
        self._callback: Callable[[SendReceipt], None] | None = None

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> tuple[int, int]:
        """The entry's (ledger id, entry id). Raises: the failure, if it failed."""
        if self._error is not None:
            raise self._error
        return self._value

    def set_result(self, value: tuple[int, int]) -> None:
        if not self._done:
            self._done, self._value = True, value
            self._run_callback()

    def set_exception(self, error: BaseException) -> None:
        if not self._done:
            self._done, self._error = True, error
            self._run_callback()

    def add_done_callback(self, callback: Callable[[SendReceipt], None]) -> None:
        """Set the callback (one only)."""
        assert self._callback is None
        if self._done:
            asyncio.get_running_loop().call_soon(callback, self)
        else:
            self._callback = callback

    def _run_callback(self) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback(self)


@dataclass(frozen=True)
class ProducerRequest:
    topic: str  # a complete topic name (a partition's, for partitioned topics)
    producer_name: str = ""  # "" lets the broker choose
    access_mode: str = "Shared"
    properties: dict[str, str] = field(default_factory=dict)
    initial_subscription_name: str = ""


@dataclass(frozen=True)
class ProducerOpened:
    producer_name: str
    last_sequence_id: int  # -1 when the broker knows none


@dataclass(frozen=True)
class SubscribeRequest:
    topic: str
    subscription: str
    sub_type: str  # Exclusive | Shared | Failover | Key_Shared
    consumer_name: str = ""
    initial_position: str = "latest"
    durable: bool = True
    start_message_id: MessageId | None = None
    properties: dict[str, str] = field(default_factory=dict)
    epoch: int = 0
    key_shared: KeySharedPolicy | None = None  # Key_Shared only


@dataclass(frozen=True)
class KeySharedPolicy:
    """A Key_Shared consumer's mode, its hash ranges (Sticky) and whether out-of-order
    delivery is allowed; hash ranges are inclusive slots of 0..65535."""

    mode: str = "AUTO_SPLIT"  # or "STICKY"
    ranges: tuple[tuple[int, int], ...] = ()
    allow_out_of_order_delivery: bool = False


class Incoming(NamedTuple):
    """One delivered entry (possibly a batch or a chunk), as the transport received it (a
    tuple: one is made per entry)."""

    ledger_id: int
    entry_id: int
    partition: int
    redelivery_count: int
    ack_set: list[int] | None
    epoch: int | None  # None: the broker stamps no epochs (older brokers)
    metadata: pb.MessageMetadata
    payload: bytes


class ConsumerEvents(Protocol):
    def on_message(self, incoming: Incoming) -> None:
        """A delivery; must not block."""

    def on_closed(self, reason: str) -> None:
        """The broker dropped the consumer (seek, topic unloaded, ...): resubscribe."""


class ProducerEvents(Protocol):
    def on_closed(self, reason: str) -> None:
        """The broker dropped the producer: re-create it."""


class Transport(Protocol):
    """What the client core calls (see the module comment). Errors are `PulsarException`s.
    `immediate_close`: the client is shutting down at once (producers close without
    flushing; what they still hold fails)."""

    immediate_close: bool

    @property
    def max_message_size(self) -> int: ...

    def begin_burst(self) -> None:
        """Sends from now on wait for `end_burst` (not the end of the loop's turn)."""

    def end_burst(self) -> None:
        """Send what the burst queued, now."""

    async def partitioned_metadata(self, topic: str) -> int: ...

    async def topics_of_namespace(self, namespace: str, mode: str) -> list[str]: ...

    async def create_producer(self, producer_id: int, request: ProducerRequest,
                              events: ProducerEvents) -> ProducerOpened: ...

    def send(self, producer_id: int, sequence_id: int, highest_sequence_id: int,
             num_messages: int, metadata: pb.MessageMetadata, payload: bytes,
             ) -> SendReceipt: ...

    async def close_producer(self, producer_id: int) -> None: ...

    async def subscribe(self, consumer_id: int, request: SubscribeRequest,
                        events: ConsumerEvents) -> None: ...

    def flow(self, consumer_id: int, permits: int) -> None: ...

    async def ack(self, consumer_id: int, acks: list[tuple[int, int, list[int] | None]],
                  cumulative: bool, wait: bool = False) -> None:
        """Acknowledge; with `wait`, return once the broker confirmed it stored the acks
        (over TCP an ack receipt), else as soon as they are sent."""

    async def redeliver(self, consumer_id: int, ids: list[tuple[int, int]] | None,
                        epoch: int) -> None: ...

    async def seek(self, consumer_id: int, target: MessageId | int) -> None: ...

    async def last_message_id(self, consumer_id: int) -> tuple[MessageId, MessageId | None]:
        """The topic's last message id and the subscription's mark-delete position."""

    async def unsubscribe(self, consumer_id: int) -> None: ...

    async def close_consumer(self, consumer_id: int) -> None: ...

    async def close(self) -> None: ...
