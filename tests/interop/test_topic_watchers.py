"""Topic-list watchers (WATCH_TOPIC_LIST, PIP-145) on an in-process server over a real socket:
the initial list, updates on create and delete, the hash GET_TOPICS_OF_NAMESPACE also gives,
close, bad patterns, the per-connection limit, and that a client which did not declare
supports_topic_watchers (the C++ client) never receives a WATCH_TOPIC_* frame."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from magnetar.broker.wire._topic_watchers import WATCHERS_PER_CONNECTION_MAX
from magnetar.codec import Frame, pb

from .test_server import DEADLINE_S, _AsyncClient, _serving

pytestmark = pytest.mark.interop

T = pb.BaseCommand
NS = "public/default"
PATTERN = "persistent://public/default/watched-.*"


async def _connect(port: int, *, watchers: bool, client_version: str = "",
                   ) -> tuple[_AsyncClient, pb.CommandConnected]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = _AsyncClient(reader, writer)
    flags = pb.FeatureFlags(supports_topic_watchers=watchers)
    version = client_version or ("watcher-test" if watchers else "Pulsar-CPP-v3.5.0")
    client.send(pb.CommandConnect(client_version=version, protocol_version=20,
                                  feature_flags=flags))
    connected = (await client.expect(T.CONNECTED)).body
    return client, connected


async def _watch(client: _AsyncClient, request_id: int, watcher_id: int,
                 pattern: str = PATTERN) -> Frame:
    client.send(pb.CommandWatchTopicList(request_id=request_id, watcher_id=watcher_id,
                                         namespace=NS, topics_pattern=pattern))
    return await client.event()  # type: ignore[return-value]


async def _nothing_pending(client: _AsyncClient) -> None:
    """The next frame is the PONG of a PING sent now: nothing else was queued before it."""
    client.send(pb.CommandPing())
    await client.expect(T.PONG)


async def _listed_hash(client: _AsyncClient, pattern: str) -> tuple[list[str], str]:
    client.send(pb.CommandGetTopicsOfNamespace(request_id=99, namespace=NS,
                                               topics_pattern=pattern))
    reply = (await client.expect(T.GET_TOPICS_OF_NAMESPACE_RESPONSE)).body
    return list(reply.topics), reply.topics_hash


async def test_watcher_lists_then_follows_creates_and_deletes(tmp_path: Path) -> None:
    existing = "persistent://public/default/watched-a"
    other = "persistent://public/default/unwatched"
    created = "persistent://public/default/watched-b"

    async with _serving(tmp_path, keepalive_interval_s=0) as (server, service):
        await service.create_topic(existing)
        await service.create_topic(other)
        client, connected = await _connect(server.port, watchers=True)
        assert connected.feature_flags.supports_topic_watchers
        success = (await _watch(client, 1, 7))
        assert success.type == T.WATCH_TOPIC_LIST_SUCCESS, success.command
        assert (success.body.request_id, success.body.watcher_id) == (1, 7)
        assert list(success.body.topic) == [existing]
        assert ([existing], success.body.topics_hash) == await _listed_hash(client, PATTERN)

        await service.create_topic(created)
        update = (await client.expect(T.WATCH_TOPIC_UPDATE)).body
        assert (update.watcher_id, list(update.new_topics), list(update.deleted_topics)) == (
            7, [created], [])
        assert ([existing, created], update.topics_hash) == await _listed_hash(client, PATTERN)

        await service.create_partitioned_topic("persistent://public/default/watched-p", 2)
        added = [(await client.expect(T.WATCH_TOPIC_UPDATE)).body.new_topics[0]
                 for _ in range(2)]
        assert added == [f"persistent://public/default/watched-p-partition-{i}" for i in (0, 1)]

        await service.delete_topic(existing)
        update = (await client.expect(T.WATCH_TOPIC_UPDATE)).body
        assert (list(update.new_topics), list(update.deleted_topics)) == ([], [existing])
        listed, digest = await _listed_hash(client, PATTERN)
        assert existing not in listed
        assert update.topics_hash == digest

        again = await _watch(client, 2, 7)  # the same id: the same watcher, its list now
        assert sorted(again.body.topic) == listed
        client.send(pb.CommandWatchTopicListClose(request_id=3, watcher_id=7))
        assert (await client.expect(T.SUCCESS)).body.request_id == 3
        await service.create_topic("persistent://public/default/watched-c")
        await _nothing_pending(client)  # closed: no update
        await client.close()


async def test_java_client_watches_without_declaring_and_a_hash_match_sends_no_list(
        tmp_path: Path) -> None:
    async with _serving(tmp_path, keepalive_interval_s=0) as (server, service):
        await service.create_topic("persistent://public/default/watched-x")
        # The Java client learns of watchers from CONNECTED and declares nothing itself.
        client, _ = await _connect(server.port, watchers=False,
                                   client_version="Pulsar-Java-v3.3.0")
        _, digest = await _listed_hash(client, PATTERN)
        client.send(pb.CommandWatchTopicList(request_id=1, watcher_id=1, namespace=NS,
                                             topics_pattern=PATTERN, topics_hash=digest))
        reply = (await client.expect(T.WATCH_TOPIC_LIST_SUCCESS)).body
        assert (list(reply.topic), reply.topics_hash) == ([], digest)
        await client.close()


async def test_bad_patterns_and_the_watcher_limit_are_errors(tmp_path: Path) -> None:
    async with _serving(tmp_path, keepalive_interval_s=0) as (server, service):
        client, _ = await _connect(server.port, watchers=True)
        bad = await _watch(client, 1, 1, "persistent://public/default/(unclosed")
        assert (bad.type, bad.body.error) == (T.ERROR, pb.InvalidTopicName), bad.command
        assert bad.body.message.startswith("Invalid topics pattern: ")
        long = await _watch(client, 2, 2, "persistent://public/default/" + "a" * 40)
        assert long.type == T.ERROR
        assert "Pattern longer than maximum" in long.body.message
        for watcher_id in range(WATCHERS_PER_CONNECTION_MAX):
            ok = await _watch(client, 10 + watcher_id, 100 + watcher_id)
            assert ok.type == T.WATCH_TOPIC_LIST_SUCCESS, ok.command
        over = await _watch(client, 5, 5)
        assert (over.type, over.body.error) == (T.ERROR, pb.NotAllowedError), over.command
        await client.close()
        end = time.monotonic() + DEADLINE_S  # the connection's end removes its watchers
        while service._topic_listeners:
            assert time.monotonic() < end, "watchers outlived their connection"
            await asyncio.sleep(0.01)


async def test_a_cpp_style_client_never_gets_watcher_frames(tmp_path: Path) -> None:
    async with _serving(tmp_path, keepalive_interval_s=0) as (server, service):
        client, _ = await _connect(server.port, watchers=False)
        refused = await _watch(client, 1, 1)
        assert (refused.type, refused.body.error) == (T.ERROR, pb.NotAllowedError)
        await service.create_topic("persistent://public/default/watched-cpp")
        await _nothing_pending(client)
        client.send(pb.CommandWatchTopicListClose(request_id=2, watcher_id=1))
        await client.expect(T.SUCCESS)
        await client.close()

