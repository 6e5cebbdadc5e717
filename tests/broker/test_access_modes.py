"""`ExclusiveAccess` on its own (the rules of each access mode, the wait queue's bound,
promotion, epoch persistence failures) and through a topic (broker-side disconnects do not
promote waiters)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from magnetar.broker import BrokerConfig, BrokerService, PersistentTopic, ProducerSpec
from magnetar.broker._errors import ProducerBusyError, ProducerFencedError, ServiceNotReadyError
from magnetar.broker.topics._access_modes import TOPIC_EPOCH_PROPERTY, ExclusiveAccess, Waiter
from magnetar.storage import Storage
from magnetar.storage.testing.simfs import SimFileSystem
from tests.storage.helpers import small_config

from .helpers import broker_env, settle, wait_for

TOPIC = "persistent://public/default/access"


def _no_evict() -> None:
    raise AssertionError("nothing to evict")


async def test_rules_and_epochs() -> None:
    stored: list[int] = []
    access = ExclusiveAccess(None, stored.append, waiters_max=1)
    assert access.admit("s1", "Shared", None, 0, _no_evict) is None
    with pytest.raises(ProducerFencedError, match="shared producers"):
        access.admit("x", "Exclusive", None, 1, _no_evict)
    waiter = access.admit("w1", "WaitForExclusive", None, 1, _no_evict)
    assert isinstance(waiter, Waiter)
    with pytest.raises(ServiceNotReadyError, match="Too many"):
        access.admit("w2", "WaitForExclusive", None, 1, _no_evict)
    with pytest.raises(ProducerBusyError):  # a Shared one while someone waits
        access.admit("s2", "Shared", None, 1, _no_evict)
    promoted = access.removed("s1", None, 0)  # the last shared producer left
    assert promoted is waiter
    assert waiter.admitted.result() == 0
    assert (access.holder, access.epoch, stored) == ("w1", 0, [0])
    with pytest.raises(ProducerFencedError, match="exclusive producer: w1"):
        access.admit("x", "Exclusive", None, 1, _no_evict)
    assert access.removed("w1", None, 0) is None
    assert access.admit("x", "Exclusive", None, 0, _no_evict) == 1
    access.removed("x", None, 0)
    with pytest.raises(ProducerFencedError, match="epoch 0 is older"):
        access.admit("old", "Exclusive", 0, 0, _no_evict)
    assert access.admit("back", "Exclusive", 1, 0, _no_evict) == 1  # kept, not bumped
    assert stored == [0, 1]
    assert ExclusiveAccess.restored_epoch({TOPIC_EPOCH_PROPERTY: "7"}) == 7
    assert ExclusiveAccess.restored_epoch({TOPIC_EPOCH_PROPERTY: "junk"}) is None


async def test_fencing_evicts_and_fails_waiters() -> None:
    access = ExclusiveAccess(None, lambda epoch: None)
    assert access.admit("old", "Exclusive", None, 0, _no_evict) == 0
    waiter = access.admit("w", "WaitForExclusive", None, 1, _no_evict)
    assert isinstance(waiter, Waiter)
    evicted: list[str] = []

    def evict() -> None:
        evicted.append("old")
        access.removed("old", None, 0)

    assert access.admit("new", "ExclusiveWithFencing", None, 1, evict) == 1
    assert evicted == ["old"]
    with pytest.raises(ProducerFencedError, match="Fenced out"):
        waiter.admitted.result()
    assert (access.holder, list(access.waiters)) == ("new", [])


async def test_a_failed_epoch_write_fails_the_waiter_not_the_topic() -> None:
    failing = [False]

    def persist(epoch: int) -> None:
        if failing[0]:
            raise OSError("disk gone")

    access = ExclusiveAccess(None, persist)
    access.admit("a", "Exclusive", None, 0, _no_evict)
    first = access.admit("w1", "WaitForExclusive", None, 1, _no_evict)
    second = access.admit("w2", "WaitForExclusive", None, 1, _no_evict)
    assert isinstance(first, Waiter)
    assert isinstance(second, Waiter)
    failing[0] = True
    assert access.removed("a", None, 0) is None
    with pytest.raises(OSError, match="disk gone"):
        first.admitted.result()
    with pytest.raises(OSError, match="disk gone"):
        second.admitted.result()
    assert (access.holder, access.epoch) == (None, 0)  # unchanged by the failures


async def test_broker_disconnects_do_not_promote_waiters(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic = await env.service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        holder = topic.add_producer(ProducerSpec("holder", access_mode="Exclusive"))
        waiting = topic.add_producer(ProducerSpec("waiting",
                                                  access_mode="WaitForExclusive"))
        assert waiting.waiter is not None
        told: list[str] = []
        holder.closer = waiting.closer = told.append
        await env.service.terminate_topic(TOPIC)
        assert told == ["topic terminated", "topic terminated"]
        assert topic.producers == {}
        assert waiting.waiter.admitted.cancelled()
        assert topic.access.epoch == 0
        assert topic.managed_ledger.properties[TOPIC_EPOCH_PROPERTY] == "0"


async def test_an_idle_topic_drops_its_access_state_and_keeps_its_epoch(
        tmp_path: Path) -> None:
    """A topic found idle by the stats interval drops its access-mode state (memory per
    loaded topic); the next exclusive producer continues from the stored epoch."""
    async with broker_env(tmp_path) as env:
        topic = await env.service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        first = topic.add_producer(ProducerSpec("first", access_mode="Exclusive"))
        await topic.epoch_durable()
        assert first.topic_epoch == 0
        topic.remove_producer(first)
        env.service.stats_interval.close(1.0, env.service.topics)
        assert topic._access is None
        second = topic.add_producer(ProducerSpec("second", access_mode="Exclusive"))
        assert second.topic_epoch == 1
        assert topic.access.holder == "second"


async def test_a_granted_epoch_is_durable_before_the_producer_is_answered(
        tmp_path: Path) -> None:
    """The topic epoch goes into the managed ledger's record through the journal; the
    producer that caused it is answered only once that record is synced (a crash after the
    answer must not bring back an older epoch). With the journal's syncs held, the creation
    waits; released, it finishes with epoch 0, stored."""
    fs = SimFileSystem(seed=5)
    storage = Storage.open(tmp_path, small_config(), fs=fs)
    service = BrokerService(storage, BrokerConfig(max_message_size_bytes=128 * 1024))
    await service.start(maintenance=False)
    try:
        await service.get_topic(TOPIC, create=True)
        fs.hold("sync", "journal")
        creation = asyncio.ensure_future(
            service.create_producer(TOPIC, ProducerSpec("only", access_mode="Exclusive")))
        try:
            await wait_for(lambda: fs.held("sync") > 0)
            await settle()
            assert not creation.done(), "answered before the epoch's record was synced"
        finally:
            fs.release("sync")
        topic, producer = await creation
        assert producer.topic_epoch == 0
        assert isinstance(topic, PersistentTopic)
        assert topic.managed_ledger.properties[TOPIC_EPOCH_PROPERTY] == "0"
    finally:
        await service.close()
        storage.close()
