"""The asyncio API (`magnetar.asyncio`) on both transports."""

from __future__ import annotations

import asyncio

import pytest

import magnetar
from magnetar import MessageId
from magnetar import asyncio as maio


def test_asyncio_api(service_url: str, topic: str) -> None:
    async def main() -> list[bytes]:
        async with maio.Client(service_url) as client:
            consumer = await client.subscribe(topic, "sub")
            producer = await client.create_producer(topic)  # batching by default here
            ids = await asyncio.gather(*(producer.send(f"m{i}".encode()) for i in range(5)))
            assert [m.batch_index() for m in ids] == [0, 1, 2, 3, 4]
            got = []
            async for message in consumer:
                await consumer.acknowledge(message)
                got.append(message.data())
                if len(got) == 5:
                    break
            reader = await client.create_reader(topic, MessageId.earliest)
            assert await reader.has_message_available()
            return got

    assert asyncio.run(main()) == [f"m{i}".encode() for i in range(5)]


def test_asyncio_errors_surface_on_await(service_url: str, topic: str) -> None:
    async def main() -> None:
        async with maio.Client(service_url) as client:
            producer = await client.create_producer(topic)
            await producer.close()
            with pytest.raises(magnetar.AlreadyClosed):
                await producer.send(b"x")
            consumer = await client.subscribe(topic, "sub")
            with pytest.raises(magnetar.Timeout):
                await consumer.receive(100)
        with pytest.raises(magnetar.AlreadyClosed):
            await client.create_producer(topic)

    asyncio.run(main())


def test_asyncio_seek_refuses_what_is_neither_an_id_nor_a_time(service_url: str,
                                                               topic: str) -> None:
    """The asyncio Reader's seek took any value and seeked somewhere (a string, silently):
    the facades now share one check of a seek's target (`_facade.seek_target`)."""
    async def main() -> None:
        async with maio.Client(service_url) as client:
            reader = await client.create_reader(topic, MessageId.earliest)
            consumer = await client.subscribe(topic, "sub")
            for seekable in (reader, consumer):
                for bad in ("nope", 1.5, True):
                    with pytest.raises(magnetar.InvalidConfiguration, match="seek needs"):
                        await seekable.seek(bad)  # type: ignore[arg-type]

    asyncio.run(main())
