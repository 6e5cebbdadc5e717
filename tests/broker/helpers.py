"""Shared helpers for the broker service tests: a recording sink, entry builders and an
async poller.

The broker pushes deliveries through loop callbacks, so a test publishes, then awaits a
condition with `wait_for` (bounded by a deadline) instead of sleeping a fixed time.
`broker_env` opens a real Storage and a started BrokerService in a directory (with
`restart()` and `crash()`); `settle` lets pending dispatch rounds run before asserting that
something did not happen.
Keep this module small and additive: several test files import it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from magnetar.broker import (
    BrokerConfig,
    BrokerService,
    Consumer,
    Delivery,
    PersistentTopic,
    ProducerSpec,
)
from magnetar.broker.topics._topic import Producer
from magnetar.codec import (
    SingleMessage,
    build_batch,
    build_message,
    encode_entry,
    parse_entry,
    unpack_messages,
)
from magnetar.codec._proto import pulsar_api_pb2 as pb
from magnetar.storage import Storage

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
    ack_set: list[int] | None = None  # the cursor's bitset of a partially acked batch
    batch_size: int = 1
    bodies: tuple[bytes, ...] = ()  # the batch's messages unpacked (acked indexes included)


@dataclass
class RecordingSink:
    """A `ConsumerSink` that records everything the broker pushes."""

    received: list[Received] = field(default_factory=list)
    active_changes: list[tuple[Consumer, bool]] = field(default_factory=list)
    closed: list[tuple[Consumer, str]] = field(default_factory=list)
    # Everything in arrival order: ("deliver", consumer, Received), ("active", consumer,
    # is_active), ("close", consumer, reason).
    events: list[tuple[str, Consumer, object]] = field(default_factory=list)

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            parsed = parse_entry(delivery.entry, verify_checksum=False)
            key = (parsed.metadata.partition_key
                   if parsed.metadata.HasField("partition_key") else None)
            bodies = tuple(m.payload or b"" for m in unpack_messages(parsed.metadata,
                                                                     parsed.payload))
            received = Received(consumer, delivery.ledger_id, delivery.entry_id, key,
                                bytes(parsed.payload), delivery.redelivery_count,
                                delivery.ack_set, delivery.batch_size, bodies)
            self.received.append(received)
            self.events.append(("deliver", consumer, received))

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        self.active_changes.append((consumer, is_active))
        self.events.append(("active", consumer, is_active))

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        self.closed.append((consumer, reason))
        self.events.append(("close", consumer, reason))

    def of(self, consumer: Consumer) -> list[Received]:
        """What one consumer received, in delivery order."""
        return [r for r in self.received if r.consumer is consumer]

    def bodies(self, consumer: Consumer) -> list[bytes]:
        return [r.body for r in self.of(consumer)]

    def positions(self, consumer: Consumer | None = None) -> list[tuple[int, int]]:
        """The (ledger, entry) of each delivery, to one consumer or to all."""
        return [(r.ledger_id, r.entry_id) for r in self.received
                if consumer is None or r.consumer is consumer]

    def messages(self, consumer: Consumer | None = None) -> list[bytes]:
        """Every message body delivered, batches unpacked, to one consumer or to all."""
        return [b for r in self.received if consumer is None or r.consumer is consumer
                for b in r.bodies]


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


def make_batch_entry(bodies: Sequence[bytes], *, partition_key: str | None = None,
                     sequence_id: int = 0, producer_name: str = "p1",
                     publish_time_ms: int | None = None) -> tuple[pb.MessageMetadata, bytes]:
    """A batch entry of `len(bodies)` messages with consecutive sequence ids from
    `sequence_id`: `(metadata, encoded entry)`."""
    messages = [SingleMessage(body, partition_key=partition_key, sequence_id=sequence_id + i)
                for i, body in enumerate(bodies)]
    metadata, payload = build_batch(
        messages, producer_name=producer_name,
        publish_time=publish_time_ms if publish_time_ms is not None else now_ms())
    return metadata, encode_entry(metadata, payload)


async def publish(topic: Any, producer: Producer, body: bytes, *,
                  sequence_id: int | None = None, partition_key: str | None = None,
                  properties: dict[str, str] | None = None,
                  deliver_at_ms: int | None = None) -> tuple[int, int]:
    """Publish one message (the sequence id defaults to the producer's message count);
    returns the receipt's (ledger, entry)."""
    sequence = producer.msg_in_counter if sequence_id is None else sequence_id
    metadata, entry = make_entry(body, partition_key=partition_key, sequence_id=sequence,
                                 producer_name=producer.name, deliver_at_ms=deliver_at_ms,
                                 properties=properties)
    result = await topic.publish(producer, entry, sequence, sequence, metadata)
    return result.ledger_id, result.entry_id


async def publish_batch(topic: Any, producer: Producer, bodies: Sequence[bytes], *,
                        partition_key: str | None = None) -> tuple[int, int]:
    """Publish one batch entry holding `bodies`; returns its (ledger, entry)."""
    first = producer.msg_in_counter
    metadata, entry = make_batch_entry(bodies, partition_key=partition_key,
                                       sequence_id=first, producer_name=producer.name)
    result = await topic.publish(producer, entry, first, first + len(bodies) - 1, metadata)
    return result.ledger_id, result.entry_id


async def publish_many(topic: Any, producer: Producer, count: int, *, prefix: str = "m",
                       partition_key: str | None = None) -> list[tuple[int, int]]:
    """Publish `<prefix>0` .. `<prefix><count-1>` one at a time, in order."""
    return [await publish(topic, producer, f"{prefix}{i}".encode(),
                          partition_key=partition_key) for i in range(count)]


async def persistent_producer(service: BrokerService, topic: str, name: str = "p1",
                              ) -> tuple[PersistentTopic, Producer]:
    """A producer on a persistent topic (created when allowed), typed as such."""
    loaded, producer = await service.create_producer(topic, ProducerSpec(name))
    assert isinstance(loaded, PersistentTopic)
    return loaded, producer


SETTLE_YIELDS_MIN = 20
SETTLE_YIELDS_MAX = 5000


async def settle(service: BrokerService | None = None) -> None:
    """Let the loop run what is pending, for assertions that something did *not* happen:
    at least `SETTLE_YIELDS_MIN` yields, and more while a loaded topic's dispatcher still
    has a round scheduled or a subscription's read is loading."""
    for spins in range(SETTLE_YIELDS_MAX):
        await asyncio.sleep(0)
        if spins >= SETTLE_YIELDS_MIN and not _dispatch_pending(service):
            return


def _dispatch_pending(service: BrokerService | None) -> bool:
    if service is None:
        return False
    for topic in service.topics.values():
        for subscription in getattr(topic, "all_subscriptions", list)():
            dispatcher = subscription.dispatcher
            if dispatcher is not None and dispatcher._scheduled:
                return True
            reads = getattr(subscription, "reads", None)
            if reads is not None and reads.in_flight is not None:
                return True
    return False


class BrokerEnv:
    """A storage directory with a started `BrokerService` over it."""

    def __init__(self, path: Path, config: BrokerConfig):
        self.path = path
        self.config = config
        self.storage = Storage.open(path)
        self.service = BrokerService(self.storage, config)

    async def close(self) -> None:
        if not self.service.closed:
            await self.service.close()
        self.storage.close()

    async def restart(self) -> BrokerService:
        """A clean shutdown, then storage and a new service reopened on the directory."""
        await self.close()
        return await self._reopen()

    async def crash(self) -> BrokerService:
        """`kill -9`: storage stops without writing anything more, then both reopen."""
        self.service.closed = True
        for topic in self.service.topics.values():
            for subscription in getattr(topic, "all_subscriptions", list)():
                subscription.close()  # no more dispatch rounds against dead storage
        self.storage.abandon()
        return await self._reopen()

    async def _reopen(self) -> BrokerService:
        self.storage = Storage.open(self.path)
        self.service = BrokerService(self.storage, self.config)
        await self.service.start(maintenance=False)
        return self.service


@asynccontextmanager
async def broker_env(path: Path, config: BrokerConfig | None = None,
                     **overrides: Any) -> AsyncIterator[BrokerEnv]:
    """Storage and a started BrokerService (maintenance off) in `path`, closed on exit.
    Without `config`, a `BrokerConfig(**overrides)` whose failover delay defaults to 0."""
    if config is None:
        overrides.setdefault("active_consumer_failover_delay_ms", 0)
        config = BrokerConfig(**overrides)
    env = BrokerEnv(path, config)
    await env.service.start(maintenance=False)
    try:
        yield env
    finally:
        await env.close()


# -- the admin HTTP API --------------------------------------------------------------------


@dataclass
class HttpAnswer:
    """One admin API answer: the status, the body decoded (JSON, else text; None when
    empty) and the content type."""

    status: int
    body: Any
    content_type: str


class AdminClient:
    """Real HTTP requests to a running admin server, from the test's own loop."""

    def __init__(self, session: Any, base_url: str):
        self.session = session
        self.base_url = base_url

    async def call(self, method: str, path: str, body: Any = None, *,
                   query: dict[str, str] | None = None, raw: str | None = None) -> HttpAnswer:
        """`body` is sent as JSON (nothing when None); `raw` is sent as is."""
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        async with self.session.request(method, self.base_url + path, data=data,
                                        params=query,
                                        headers={"Content-Type": "application/json"},
                                        ) as answer:
            text = await answer.text()
            try:
                decoded: Any = json.loads(text) if text.strip() else None
            except ValueError:
                decoded = text
            return HttpAnswer(answer.status, decoded, answer.content_type)


@asynccontextmanager
async def admin_env(path: Path, config: BrokerConfig | None = None, **overrides: Any,
                    ) -> AsyncIterator[tuple[BrokerEnv, Any, AdminClient]]:
    """`broker_env` plus the admin API on a free loopback port and a client for it:
    `(env, server, client)`."""
    import aiohttp

    from magnetar.broker.http._admin import start_admin

    async with broker_env(path, config, **overrides) as env:
        server = await start_admin(env.service, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                yield env, server, AdminClient(session, server.url)
        finally:
            await server.close()
