"""Consumers as the dispatcher sees them, and what a transport must provide to receive.

A transport (the TCP server, or the in-process embedded client) implements `ConsumerSink`
for each consumer it subscribes: the broker pushes `Delivery` batches through it, tells it
about active-consumer changes (Failover), and asks it to close the consumer when the
broker must drop it (seek, unsubscribe by another, topic deletion). The broker never blocks
on a sink: `deliver` must queue and return.

A `Consumer` holds the dispatch state Pulsar keeps per consumer: message permits (from
FLOW), the unacked-message count and the block flag of the max-unacked limit, the pending
acks of Shared and Key_Shared subscriptions, and the statistics.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._rates import RateMeter

__all__ = ["Consumer", "ConsumerSink", "Delivery", "SubscribeSpec"]

_CONSUMER_SEQUENCE = itertools.count(1)


@dataclass(slots=True)
class Delivery:
    """One message (a whole entry; possibly a batch) sent to a consumer. Read-only by
    convention: not a frozen dataclass, whose `__init__` (a `object.__setattr__` per field)
    cost five times as much, once per delivered entry."""

    ledger_id: int
    entry_id: int
    partition: int
    entry: bytes  # the stored entry: [magic, crc,] metadata size, metadata, payload
    redelivery_count: int
    ack_set: list[int] | None
    epoch: int
    batch_size: int


class ConsumerSink(Protocol):
    """What a transport provides per consumer."""

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        """Queue messages for the consumer; must not block."""

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None: ...

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        """The broker dropped the consumer; tell the client (it will reconnect)."""


@dataclass(frozen=True)
class SubscribeSpec:
    """What a client asks for when it subscribes (CommandSubscribe, as plain values)."""

    subscription: str
    sub_type: str  # "Exclusive" | "Shared" | "Failover" | "Key_Shared"
    consumer_name: str = ""
    initial_position: str = "latest"  # or "earliest"
    durable: bool = True
    priority_level: int = 0
    start_message_id: tuple[int, int, int] | None = None  # (ledger, entry, batch index)
    key_shared_mode: str = "AUTO_SPLIT"  # or "STICKY"
    key_shared_ranges: tuple[tuple[int, int], ...] = ()
    allow_out_of_order_delivery: bool = False
    has_key_shared_meta: bool = False
    subscription_properties: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    replicate_subscription_state: bool = False
    read_compacted: bool = False
    start_message_rollback_duration_s: int = 0
    consumer_epoch: int = 0
    address: str = ""
    client_version: str = ""


class Consumer:
    """A connected consumer of one subscription."""

    def __init__(self, spec: SubscribeSpec, sink: ConsumerSink, *, partition: int = -1):
        self.consumer_serial = next(_CONSUMER_SEQUENCE)
        self.spec = spec
        self.sink = sink
        self.consumer_name = spec.consumer_name or f"consumer-{self.consumer_serial}"
        self.priority_level = spec.priority_level
        self.key_shared_ranges: tuple[tuple[int, int], ...] | None = (
            spec.key_shared_ranges if spec.has_key_shared_meta else None)
        self.partition = partition
        self.permits = 0
        self.unacked_messages = 0
        self.blocked_on_unacked = False
        self.write_paused = False  # its connection's socket buffer is full: no permits usable
        self.epoch = spec.consumer_epoch
        self.closed = False
        self.pending_acks: Any = None  # a PendingAcksMap for Shared and Key_Shared
        self.avg_messages_per_entry = 1.0
        self._first_dispatch = True
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.message_ack_counter = 0
        self.rate_out = RateMeter(time.monotonic())  # msgRateOut, msgThroughputOut
        self.last_acked_timestamp = 0
        self.last_consumed_timestamp = 0
        self.last_consumed_flow_timestamp = 0
        self.connected_since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def __repr__(self) -> str:
        return f"Consumer({self.consumer_name}#{self.consumer_serial})"

    @property
    def has_average(self) -> bool:
        """Whether `avg_messages_per_entry` comes from a dispatch (else it is the initial 1)."""
        return not self._first_dispatch

    def add_permits(self, permits: int) -> None:
        assert permits >= 0
        self.permits += permits
        self.last_consumed_flow_timestamp = int(time.time() * 1000)

    def record_sent(self, deliveries: list[Delivery], messages: int) -> None:
        assert messages >= 0
        self.permits -= messages
        self.msg_out_counter += messages
        self.bytes_out_counter += sum(len(d.entry) for d in deliveries)
        self.last_consumed_timestamp = int(time.time() * 1000)
        if deliveries:
            per_entry = messages / len(deliveries)
            if self._first_dispatch:  # the first dispatch sets it, later ones move it
                self._first_dispatch = False
                self.avg_messages_per_entry = max(1.0, per_entry)
            else:
                self.avg_messages_per_entry = (0.9 * self.avg_messages_per_entry
                                               + 0.1 * per_entry)

    def available_permits(self, max_unacked: int) -> int:
        """Permits usable now: none when blocked on unacked messages."""
        if self.closed or self.blocked_on_unacked or self.write_paused:
            return 0
        if max_unacked > 0:
            room = max_unacked - self.unacked_messages
            if room <= 0:
                return 0
            return max(0, min(self.permits, room))
        return max(0, self.permits)
