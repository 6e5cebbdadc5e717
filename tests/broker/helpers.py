"""Shared helpers for the broker service tests: a recording sink, entry builders and an
async poller.

The broker pushes deliveries through loop callbacks, so a test publishes, then awaits a
condition with `wait_for` (bounded by a deadline) instead of sleeping a fixed time. Keep this
module small and additive: several test files import it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker import Consumer, Delivery
from codec import SingleMessage, build_message, encode_entry, parse_entry
from codec._proto import pulsar_api_pb2 as pb

WAIT_TIMEOUT_S = 5.0


@dataclass
class Received:
    """One delivery as a test looks at it."""

    consumer: Consumer
    ledger_id: int
    entry_id: int
    key: str | None
    body: bytes
    redelivery_count: int


@dataclass
class RecordingSink:
    """A `ConsumerSink` that records everything the broker pushes."""

    received: list[Received] = field(default_factory=list)
    active_changes: list[tuple[Consumer, bool]] = field(default_factory=list)
    closed: list[tuple[Consumer, str]] = field(default_factory=list)

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            parsed = parse_entry(delivery.entry, verify_checksum=False)
            key = (parsed.metadata.partition_key
                   if parsed.metadata.HasField("partition_key") else None)
            self.received.append(Received(consumer, delivery.ledger_id, delivery.entry_id, key,
                                          bytes(parsed.payload), delivery.redelivery_count))

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        self.active_changes.append((consumer, is_active))

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        self.closed.append((consumer, reason))

    def of(self, consumer: Consumer) -> list[Received]:
        """What one consumer received, in delivery order."""
        return [r for r in self.received if r.consumer is consumer]

    def bodies(self, consumer: Consumer) -> list[bytes]:
        return [r.body for r in self.of(consumer)]


def make_entry(body: bytes, *, partition_key: str | None = None,
               ordering_key: bytes | None = None, sequence_id: int = 0,
               producer_name: str = "p1", deliver_at_ms: int | None = None,
               publish_time_ms: int | None = None,
               properties: dict[str, str] | None = None,
               ) -> tuple[pb.MessageMetadata, bytes]:
    """A non-batched entry: `(metadata, encoded entry)` ready for `topic.publish`."""
    metadata, payload = build_message(
        SingleMessage(body, properties=properties or {}, partition_key=partition_key,
                      ordering_key=ordering_key, sequence_id=sequence_id),
        producer_name=producer_name,
        publish_time=publish_time_ms if publish_time_ms is not None else now_ms())
    if deliver_at_ms is not None:
        metadata.deliver_at_time = deliver_at_ms
    return metadata, encode_entry(metadata, payload)


def now_ms() -> int:
    return int(time.time() * 1000)


async def wait_for(predicate: Callable[[], bool], timeout_s: float = WAIT_TIMEOUT_S) -> None:
    """Poll `predicate` on the loop until it holds.

    Raises:
        AssertionError: it did not hold within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    spins = 0
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        spins += 1
        await asyncio.sleep(0 if spins % 10 else 0.002)
