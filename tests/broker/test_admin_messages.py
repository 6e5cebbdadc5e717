"""Message inspection over the admin REST API: peek at a subscription position, examine
from the earliest or latest, get by id and the last message id — the payload as the body and
the metadata in Pulsar's `X-Pulsar-*` headers, batches whole (the admin client splits them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from magnetar.broker.ledger._position import Position
from magnetar.codec import CompressionType, SingleMessage, build_message, decode_batch_payload
from magnetar.codec import encode_entry as encode

from .helpers import (
    AdminClient,
    admin_env,
    now_ms,
    persistent_producer,
    publish,
    publish_batch,
)
from .test_admin import PT, expect

TOPIC = "persistent://public/default/insp"
TP = f"{PT}/insp"


async def raw_get(client: AdminClient, path: str, query: dict[str, str] | None = None,
                  ) -> tuple[int, Any, bytes]:
    async with client.session.get(client.base_url + path, params=query) as answer:
        return answer.status, answer.headers, await answer.read()


async def test_peek_skips_acknowledged_entries_and_shows_metadata(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, TOPIC)
        subscription = await topic.create_subscription("sub", "earliest")
        positions = [await publish(topic, producer, b"body-%d" % i, partition_key=f"k{i}",
                                   properties={"color": f"c{i}"}) for i in range(4)]
        status, headers, body = await raw_get(client, f"{TP}/subscription/sub/position/1")
        assert status == 200
        assert body == b"body-0"
        assert headers["Content-Type"] == "application/octet-stream"
        ledger, entry = positions[0]
        assert headers["X-Pulsar-Message-ID"] == f"{ledger}:{entry}"
        assert headers["X-Pulsar-PROPERTY-color"] == "c0"
        assert headers["X-Pulsar-partition-key"] == "k0"
        assert headers["X-Pulsar-producer-name"] == "p1"
        assert headers["X-Pulsar-sequence-id"] == "0"
        assert headers["X-Pulsar-Is-Encrypted"] == "false"
        assert headers["X-Pulsar-publish-time"].endswith("Z")
        assert "X-Pulsar-num-batch-message" not in headers
        # Acknowledge the first and the third: position n counts what is left.
        cursor = subscription.cursor
        await cursor.delete([Position(*positions[0]), Position(*positions[2])])
        assert (await raw_get(client, f"{TP}/subscription/sub/position/1"))[2] == b"body-1"
        assert (await raw_get(client, f"{TP}/subscription/sub/position/2"))[2] == b"body-3"
        assert "Message not found" in await expect(
            client, "GET", f"{TP}/subscription/sub/position/3", 404)
        assert subscription.backlog() == 2  # peeking moved nothing


async def test_a_batch_answers_whole_with_its_size_headers(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, TOPIC)
        await topic.create_subscription("sub", "earliest")
        await publish_batch(topic, producer, [b"a", b"bb", b"ccc"])
        status, headers, body = await raw_get(client, f"{TP}/subscription/sub/position/1")
        assert status == 200
        assert headers["X-Pulsar-num-batch-message"] == "3"
        # Upstream's figure: the entry's bytes less its serialized metadata.
        assert int(headers["X-Pulsar-batch-size"]) == len(body) + 10
        messages = decode_batch_payload(body, 3)
        assert [m.payload for m in messages] == [b"a", b"bb", b"ccc"]
        assert (await expect(client, "GET", f"{TP}/lastMessageId", 200))["batchIndex"] == 2


async def test_examine_get_by_id_and_last_message_id(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, TOPIC)
        empty = await expect(client, "GET", f"{TP}/lastMessageId", 200)
        assert empty["entryId"] == -1
        assert empty["partitionIndex"] == -1
        await expect(client, "GET", f"{TP}/examinemessage", 404)
        positions = [await publish(topic, producer, b"m%d" % i) for i in range(3)]

        async def examine(initial: str, n: int) -> bytes:
            status, _, body = await raw_get(client, f"{TP}/examinemessage", {
                "initialPosition": initial, "messagePosition": str(n)})
            assert status == 200
            return body

        assert await examine("earliest", 1) == b"m0"
        assert await examine("earliest", 2) == b"m1"
        assert await examine("latest", 1) == b"m2"
        assert await examine("latest", 3) == b"m0"
        assert await examine("latest", 99) == b"m0"  # clamped to the first
        assert await examine("earliest", 99) == b"m2"  # ... and to the last
        await expect(client, "GET", f"{TP}/examinemessage", 400,
                     query={"initialPosition": "middle"})
        ledger, entry = positions[1]
        status, headers, body = await raw_get(client, f"{TP}/ledger/{ledger}/entry/{entry}")
        assert (status, body) == (200, b"m1")
        assert headers["X-Pulsar-Message-ID"] == f"{ledger}:{entry}"
        await expect(client, "GET", f"{TP}/ledger/{ledger}/entry/{entry + 5}", 404)
        assert await expect(client, "GET", f"{TP}/lastMessageId", 200) == {
            "ledgerId": positions[2][0], "entryId": positions[2][1], "partitionIndex": -1}


async def test_a_compressed_entry_answers_decompressed(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        topic, producer = await persistent_producer(env.service, TOPIC)
        body = b"squeeze me " * 50
        metadata, payload = build_message(SingleMessage(body, sequence_id=0),
                                          producer_name="p1", publish_time=now_ms(),
                                          compression=CompressionType.ZLIB)
        result = await topic.publish(producer, encode(metadata, payload), 0, 0, metadata)
        status, headers, answer = await raw_get(
            client, f"{TP}/ledger/{result.ledger_id}/entry/{result.entry_id}")
        assert status == 200
        assert answer == body
        assert headers["X-Pulsar-compression"] == "ZLIB"
        assert headers["X-Pulsar-uncompressed-size"] == str(len(body))


async def test_inspection_errors(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        await persistent_producer(env.service, TOPIC)
        assert "Subscription nope not found" in await expect(
            client, "GET", f"{TP}/subscription/nope/position/1", 404)
        await expect(client, "GET", f"{PT}/missing/lastMessageId", 404)
        await expect(client, "PUT", f"{PT}/parts/partitions", 204, 2)
        assert "partitioned topic is not allowed" in await expect(
            client, "GET", f"{PT}/parts/examinemessage", 405)
        assert "non-persistent topic is not allowed" in await expect(
            client, "GET", "/admin/v2/non-persistent/public/default/np/lastMessageId", 405)
        await expect(client, "GET", f"{TP}/subscription/s/position/x", 404)  # not a number
