"""What the producer core (`_producer.py`) works with: its settings (`ProducerConfig`), an
entry in flight (`Op`), a queued send that is its own result sink (`Offered`) and the clock
(`now_ms`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from magnetar.codec import pb

from ._enums import BatchingType, CompressionType
from ._errors import InvalidConfiguration
from ._outgoing import Queued, ResultSink

__all__ = ["Offered", "Op", "ProducerConfig", "now_ms"]


@dataclass(frozen=True)
class ProducerConfig:
    """The producer settings the core uses (defaults as the official Python client's)."""

    producer_name: str = ""
    initial_sequence_id: int | None = None
    send_timeout_ms: int = 30_000
    compression_type: CompressionType = CompressionType.NONE
    max_pending_messages: int = 1000
    block_if_queue_full: bool = False
    batching_enabled: bool = False
    batching_max_messages: int = 1000
    batching_max_allowed_size_in_bytes: int = 128 * 1024
    batching_max_publish_delay_ms: int = 10
    batching_type: BatchingType = BatchingType.Default
    chunking_enabled: bool = False
    access_mode: str = "Shared"
    properties: Mapping[str, str] = field(default_factory=dict)
    initial_subscription_name: str = ""  # created with the topic (dead-letter producers)

    def __post_init__(self) -> None:
        if self.batching_enabled and self.chunking_enabled:
            raise InvalidConfiguration("batching and chunking cannot both be enabled")
        if self.max_pending_messages < 1:
            raise InvalidConfiguration("max_pending_messages must be at least 1")
        if self.send_timeout_ms < 0:
            raise InvalidConfiguration("send_timeout_millis must not be negative")
        if self.batching_enabled and self.batching_max_messages < 1:
            raise InvalidConfiguration("batching_max_messages must be at least 1")


@dataclass(eq=False, slots=True)
class Op:
    """One entry in flight (a message, a batch, or one chunk)."""

    sequence_id: int
    highest_sequence_id: int
    slots: int
    results: list[ResultSink]  # one per message; empty for non-last chunks
    created_s: float
    batch_size: int = 0  # > 0 for batches: message i gets batch index i
    done: bool = False
    metadata: pb.MessageMetadata | None = None  # kept for a resend after a reconnection
    payload: bytes = b""
    num_messages: int = 1
    in_flight: bool = False  # handed to the transport and not answered yet
    waiters: list[asyncio.Future[None]] = field(default_factory=list)  # flush calls


class Offered(ResultSink, Protocol):
    """A queued message that is its own result sink (`send_async`'s, `offer_batched_run`)."""

    @property
    def message(self) -> Queued: ...


def now_ms() -> int:
    """The wall clock in ms (publish times, batch delays)."""
    return int(time.time() * 1000)
