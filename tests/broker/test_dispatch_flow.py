"""How an Exclusive consumer's receiver queue is refilled (issue 14, batched consume): a round
reads about as many entries as the permits cover at the consumer's average messages per
entry (precise flow control), and the next entries of a backlog on disk are loaded ahead,
before the next permits come; a load ahead that goes stale (a rewind) is dropped."""

from __future__ import annotations

from pathlib import Path

from magnetar.broker import BrokerConfig, BrokerService, Consumer, PersistentTopic, SubscribeSpec
from magnetar.broker.dispatch._consumer import Delivery
from magnetar.broker.dispatch._subscription import Subscription
from magnetar.storage.testing.memory import InMemoryLedgerStorage
from tests.broker.helpers import (
    RecordingSink,
    broker_env,
    persistent_producer,
    publish,
    publish_batch,
    settle,
    wait_for,
)

TOPIC = "persistent://public/default/flow"


async def _six_batches_of_ten(service: BrokerService) -> tuple[Subscription, Consumer,
                                                                 RecordingSink]:
    """A backlog of six 10-message batch entries and an Exclusive consumer from the earliest,
    with no permits yet."""
    topic, producer = await persistent_producer(service, TOPIC)
    for batch in range(6):
        await publish_batch(topic, producer, [b"b%d-%d" % (batch, i) for i in range(10)])
    sink = RecordingSink()
    _, consumer = await service.subscribe(
        TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"), sink)
    return topic.subscriptions["sub"], consumer, sink


async def test_permits_buy_about_their_worth_of_batches_not_a_batch_each(
        tmp_path: Path) -> None:
    """Before: a round read min(permits, dispatcherMaxReadBatchSize) entries, so 20 permits
    bought all five remaining batches of 10 (permits -30)."""
    async with broker_env(tmp_path) as env:
        service = env.service
        subscription, consumer, sink = await _six_batches_of_ten(service)
        subscription.flow(consumer, 1)  # one entry: the consumer's average becomes 10
        await wait_for(lambda: len(sink.received) == 1)
        await settle(service)
        assert consumer.permits == -9
        subscription.flow(consumer, 29)  # 20 permits: two batches
        await wait_for(lambda: len(sink.received) == 3)
        await settle(service)
        assert len(sink.received) == 3
        assert consumer.permits == 0
        subscription.flow(consumer, 5)  # a part of a batch still buys the whole batch
        await wait_for(lambda: len(sink.received) == 4)
        await settle(service)
        assert len(sink.received) == 4
        assert consumer.permits == -5
        assert sink.messages(consumer) == [b"b%d-%d" % (batch, i)
                                           for batch in range(4) for i in range(10)]


async def test_without_precise_flow_control_each_permit_buys_an_entry(tmp_path: Path) -> None:
    async with broker_env(tmp_path, precise_dispatcher_flow_control=False) as env:
        subscription, consumer, sink = await _six_batches_of_ten(env.service)
        subscription.flow(consumer, 1)
        await wait_for(lambda: len(sink.received) == 1)
        subscription.flow(consumer, 29)  # 20 permits: Pulsar's default reads 20 entries
        await wait_for(lambda: len(sink.received) == 6)
        assert consumer.permits == -30


async def _cold_backlog(store: InMemoryLedgerStorage, count: int,
                        sink: RecordingSink | None = None, **config: int,
                        ) -> tuple[BrokerService, PersistentTopic, RecordingSink,
                                   Subscription, Consumer]:
    """`count` messages on a topic whose reads all need the loader, and an Exclusive
    consumer from the earliest (on `sink`, a new RecordingSink by default) with no permits
    yet: (service, topic, sink, its subscription, the consumer)."""
    service = BrokerService(store, BrokerConfig(active_consumer_failover_delay_ms=0, **config))
    await service.start(maintenance=False)
    topic, producer = await persistent_producer(service, TOPIC)
    for i in range(count):
        await publish(topic, producer, b"m%d" % i)
    store.cold_reads(True)  # every read needs the loader
    sink = sink or RecordingSink()
    await service.subscribe(
        TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"), sink)
    subscription = topic.subscriptions["sub"]
    return service, topic, sink, subscription, subscription.consumers[0]


async def test_the_next_entries_of_a_backlog_on_disk_load_before_the_next_permits() -> None:
    """Before: the load of m1 started only when the next FLOW came."""
    store = InMemoryLedgerStorage()
    service, _, sink, subscription, consumer = await _cold_backlog(store, 9)
    subscription.flow(consumer, 1)
    await wait_for(lambda: len(sink.received) == 1)
    # m1 loads with no permits asked; what it holds counts against the broker's budget
    await wait_for(lambda: subscription.reads.in_flight is None
                   and 0 < service.loader.read_ahead_bytes <= 100)
    assert consumer.permits == 0
    assert len(sink.received) == 1
    subscription.flow(consumer, 8)
    await wait_for(lambda: len(sink.received) == 9)
    assert sink.bodies(consumer) == [b"m%d" % i for i in range(9)]
    await service.close()
    assert service.loader.read_ahead_bytes == 0
    store.close()


class _CallSink(RecordingSink):
    """Also records how many deliveries each `deliver` call brought."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        self.calls.append(len(deliveries))
        super().deliver(consumer, deliveries)


async def test_a_consumers_first_round_reads_one_entry() -> None:
    """Its average messages per entry is unknown until then: the first message does not wait
    for a whole read's worth of entries to load (before: one call with all five)."""
    store = InMemoryLedgerStorage()
    sink = _CallSink()
    service, _, _, subscription, consumer = await _cold_backlog(store, 5, sink)
    subscription.flow(consumer, 100)
    await wait_for(lambda: len(sink.received) == 5)
    assert sink.calls[0] == 1
    assert sink.bodies(consumer) == [b"m%d" % i for i in range(5)]
    await service.close()
    store.close()


async def test_no_read_ahead_beyond_the_brokers_budget() -> None:
    store = InMemoryLedgerStorage()
    service, _, sink, subscription, consumer = await _cold_backlog(
        store, 3, managed_ledger_read_ahead_bytes_max=0)
    subscription.flow(consumer, 1)
    await wait_for(lambda: len(sink.received) == 1)
    store.hold_reads()
    await settle(service)
    assert store.reads_held == 0  # nothing loads before the next permits
    subscription.flow(consumer, 2)
    await wait_for(lambda: store.reads_held == 1)
    store.release_reads()
    await wait_for(lambda: len(sink.received) == 3)
    assert service.loader.read_ahead_bytes == 0
    await service.close()
    store.close()


async def test_a_load_ahead_is_dropped_when_the_consumer_rewinds() -> None:
    store = InMemoryLedgerStorage()
    service, _, sink, subscription, consumer = await _cold_backlog(store, 6)
    subscription.flow(consumer, 3)
    await wait_for(lambda: len(sink.received) == 3)
    await settle(service)  # m3..m5 loaded ahead
    subscription.redeliver(consumer, None)  # unacknowledged: m0..m2 come again first
    subscription.flow(consumer, 6)
    await wait_for(lambda: len(sink.received) == 9)
    assert sink.bodies(consumer) == [b"m%d" % i for i in (0, 1, 2, 0, 1, 2, 3, 4, 5)]
    await service.close()
    store.close()


async def test_every_entry_before_a_damaged_one_is_delivered_whatever_the_reads_cover() -> None:
    """A load of several entries that fails is read again one entry at a time (before: the
    read ahead of m2..m8 failed whole, so only m0 and m1 came)."""
    store = InMemoryLedgerStorage()
    service, topic, sink, subscription, consumer = await _cold_backlog(store, 9)
    ledger_id = topic.managed_ledger.first_position().ledger_id
    store.corrupt_entry(ledger_id, topic.managed_ledger.first_position().entry_id + 6)  # m5
    subscription.flow(consumer, 100)
    await wait_for(lambda: len(sink.closed) == 1)  # the damaged entry's read fails the topic
    assert sink.bodies(consumer) == [b"m%d" % i for i in range(5)]
    await service.close()
    store.close()
