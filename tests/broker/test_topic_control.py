"""Topic termination, unload and forced delete through `BrokerService` and the admin API:
what producers and consumers are told, what survives a restart, and the REST answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.broker import PersistentTopic, ProducerSpec, SubscribeSpec, TopicTerminatedError
from magnetar.broker._errors import ServiceNotReadyError

from .helpers import (
    RecordingSink,
    admin_env,
    broker_env,
    persistent_producer,
    publish,
    publish_many,
    settle,
    wait_for,
)
from .test_admin import PT, expect

TOPIC = "persistent://public/default/control"


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash"])
async def test_terminate_refuses_publishes_and_producers_and_survives_restart(
        tmp_path: Path, crash: bool) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        closed: list[str] = []
        producer.closer = closed.append
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            TOPIC, SubscribeSpec("sub", "Exclusive", "c1", initial_position="earliest"),
            sink)
        positions = await publish_many(topic, producer, 3)

        last = await service.terminate_topic(TOPIC)
        assert last == positions[-1]
        assert closed == ["topic terminated"]
        assert topic.producers == {}
        assert await service.terminate_topic(TOPIC) == last  # idempotent
        with pytest.raises(TopicTerminatedError):
            await service.create_producer(TOPIC, ProducerSpec("again"))
        with pytest.raises(TopicTerminatedError):
            await publish(topic, producer, b"late")
        with pytest.raises(TopicTerminatedError):
            await topic.managed_ledger.add_entry(b"late")
        topic.subscriptions["sub"].flow(consumer, 100)
        await wait_for(lambda: len(sink.received) == 3)
        await settle(service)
        assert sink.bodies(consumer) == [b"m0", b"m1", b"m2"]

        service = await (env.crash() if crash else env.restart())
        reloaded = await service.get_topic(TOPIC)
        assert isinstance(reloaded, PersistentTopic)
        assert reloaded.terminated
        assert reloaded.managed_ledger.terminated_position == last
        with pytest.raises(TopicTerminatedError):
            await service.create_producer(TOPIC, ProducerSpec("after-restart"))
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            TOPIC, SubscribeSpec("late-sub", "Exclusive", "c2",
                                 initial_position="earliest"), sink)
        reloaded.subscriptions["late-sub"].flow(consumer, 100)
        await wait_for(lambda: len(sink.received) == 3)
        await settle(service)
        assert sink.bodies(consumer) == [b"m0", b"m1", b"m2"]


async def test_terminating_an_empty_topic_answers_entry_minus_one(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        topic = await env.service.get_topic(TOPIC)
        assert isinstance(topic, PersistentTopic)
        ledger_id, entry_id = await env.service.terminate_topic(TOPIC)
        assert (ledger_id, entry_id) == (topic.managed_ledger.current_ledger_id, -1)


async def test_unload_closes_clients_and_the_topic_reloads(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        closed: list[str] = []
        producer.closer = closed.append
        sink = RecordingSink()
        _, consumer = await service.subscribe(
            TOPIC, SubscribeSpec("sub", "Shared", "c1", initial_position="earliest"), sink)
        await publish_many(topic, producer, 2)

        assert await service.unload_topic(TOPIC)
        assert not await service.unload_topic(TOPIC)  # not loaded any more
        assert closed == ["topic unloaded"]
        assert [(c, reason) for c, reason in sink.closed] == [(consumer, "topic unloaded")]
        assert topic.managed_ledger.closed
        with pytest.raises(ServiceNotReadyError):
            topic.add_producer(ProducerSpec("stale"))

        again, producer = await persistent_producer(service, TOPIC)
        assert again is not topic
        await publish(again, producer, b"m2")
        assert again.subscriptions["sub"].backlog() == 3


async def test_forced_delete_closes_producers_and_consumers(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        service = env.service
        topic, producer = await persistent_producer(service, TOPIC)
        closed: list[str] = []
        producer.closer = closed.append
        sink = RecordingSink()
        await service.subscribe(TOPIC, SubscribeSpec("sub", "Shared", "c1"), sink)
        await service.delete_topic(TOPIC, force=True)
        assert closed == ["topic deleted"]
        assert [reason for _, reason in sink.closed] == ["topic deleted"]
        assert not service.topic_exists(TOPIC)
        fresh, _ = await persistent_producer(service, TOPIC)  # auto-created again
        assert fresh is not topic
        assert fresh.managed_ledger.number_of_entries == 0


async def test_admin_terminate_and_unload(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        service = env.service
        topic, producer = await persistent_producer(service, "plain")
        ledger_id, entry_id = await publish(topic, producer, b"only")
        assert await expect(client, "POST", f"{PT}/plain/terminate", 200) == {
            "ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": -1}
        internal = await expect(client, "GET", f"{PT}/plain/internalStats", 200)
        assert internal["state"] == "Terminated"
        await expect(client, "POST", f"{PT}/missing/terminate", 404)

        await service.create_partitioned_topic("persistent://public/default/parts", 2)
        reason = await expect(client, "POST", f"{PT}/parts/terminate", 405)
        assert "partitioned" in reason
        answer = await expect(client, "POST", f"{PT}/parts/terminate/partitions", 200)
        assert set(answer) == {"0", "1"}
        assert all(a["entryId"] == -1 for a in answer.values())
        await expect(client, "POST", f"{PT}/plain/terminate/partitions", 404)

        await expect(client, "PUT", f"{PT}/plain/unload", 204)
        assert "persistent://public/default/plain" not in service.topics
        await expect(client, "PUT", f"{PT}/parts/unload", 204)
        await expect(client, "PUT", f"{PT}/missing/unload", 404)
        internal = await expect(client, "GET", f"{PT}/plain/internalStats", 200)
        assert internal["state"] == "Terminated"  # reloaded, still terminated
