"""Names and resources with limits, over real sockets: over-long names refused up front with
Pulsar's errors and nothing created (raw frames in-process, and the official client against a
broker process); connections beyond the total and per-address limits refused with ERROR
NotAllowed and a close; bytes of incomplete frames bounded over all connections; a closed
connection's partial frame released; and a client's repeated mistake logged once per
connection at WARNING, never as an ERROR."""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pulsar
import pytest

from magnetar.broker import BrokerConfig, BrokerService
from magnetar.broker._names import SUBSCRIPTION_NAME_BYTES_MAX, TopicName
from magnetar.broker.http._metrics import render_metrics
from magnetar.broker.wire._connection_handler import ConnectionHandler
from magnetar.broker.wire._server import DESCRIPTORS_RESERVED, BrokerServer, _connections_max, serve
from magnetar.codec import (
    ConnectionClosed,
    Frame,
    SingleMessage,
    base_command,
    build_message,
    decode_frame,
    pb,
)
from magnetar.storage import Storage

from . import BrokerProcess
from .test_server import _AsyncClient

pytestmark = pytest.mark.interop

T = pb.BaseCommand
DEADLINE_S = 10.0
LONG_LOCAL = "x" * 600
LONG_TOPIC = f"persistent://public/default/{LONG_LOCAL}"
LONG_SUB = "s" * 600
MIB = 1024 * 1024
OPERATION_TIMEOUT_S = 3  # the official client's, for the names it keeps retrying


@asynccontextmanager
async def _serving(tmp_path: Path, **config: object,
                   ) -> AsyncIterator[tuple[BrokerServer, BrokerService]]:
    """A started service with `config` on the storage in `tmp_path / "data"` and its server on
    a free loopback port; shut down and closed on the way out."""
    storage = Storage.open(tmp_path / "data")
    service = BrokerService(storage, BrokerConfig(**config))  # type: ignore[arg-type]
    await service.start(maintenance=False)
    server = await serve(service, "127.0.0.1", 0)
    try:
        yield server, service
    finally:
        await server.shutdown(grace_s=DEADLINE_S)
        await service.close()
        storage.close()


async def _eventually(condition: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def _closed(client: _AsyncClient) -> bool:
    """Whether the broker closes the connection (frames before the close are skipped)."""
    while True:
        try:
            event = await client.event()
        except ConnectionError:
            return True
        if isinstance(event, ConnectionClosed):
            return True


# -- names ---------------------------------------------------------------------------------


async def test_over_long_names_are_refused_up_front_and_create_nothing(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (server, service):
        client = await _AsyncClient.connect(server.port)
        client.send(pb.CommandLookupTopic(topic=LONG_TOPIC, request_id=1))
        lookup = (await client.expect(T.LOOKUP_RESPONSE)).command.lookupTopicResponse
        assert lookup.response == pb.CommandLookupTopicResponse.Failed
        assert lookup.error == pb.InvalidTopicName
        client.send(pb.CommandPartitionedTopicMetadata(topic=LONG_TOPIC, request_id=2))
        meta = (await client.expect(T.PARTITIONED_METADATA_RESPONSE)).command
        assert meta.partitionMetadataResponse.error == pb.InvalidTopicName
        client.send(pb.CommandProducer(topic=LONG_TOPIC, producer_id=1, request_id=3))
        error = (await client.expect(T.ERROR)).command.error
        assert (error.request_id, error.error) == (3, pb.InvalidTopicName)
        assert "too long" in error.message
        client.send(pb.CommandSubscribe(topic=LONG_TOPIC, subscription="s", consumer_id=1,
                                        request_id=4, subType=pb.CommandSubscribe.Shared))
        error = (await client.expect(T.ERROR)).command.error
        assert (error.request_id, error.error) == (4, pb.InvalidTopicName)
        topic = "persistent://public/default/fine"
        client.send(pb.CommandSubscribe(topic=topic, subscription=LONG_SUB, consumer_id=2,
                                        request_id=5, subType=pb.CommandSubscribe.Shared))
        error = (await client.expect(T.ERROR)).command.error
        # Upstream answers a subscription name it refuses (NamingException) with ProducerBusy.
        assert (error.request_id, error.error) == (5, pb.ProducerBusy)
        assert "too long" in error.message
        client.send(pb.CommandProducer(topic=topic, producer_id=2, request_id=6,
                                       producer_name="p" * 600))
        error = (await client.expect(T.ERROR)).command.error
        assert (error.request_id, error.error) == (6, pb.ProducerBusy)
        assert service.topics == {}  # nothing was created, not even the short-named topic
        assert service.list_topics("public/default", "ALL") == []
        # the longest subscription name works, and the connection is still in sync
        client.send(pb.CommandSubscribe(topic=topic, subscription="s" * SUBSCRIPTION_NAME_BYTES_MAX,
                                        consumer_id=3, request_id=7,
                                        subType=pb.CommandSubscribe.Shared))
        assert (await client.expect(T.SUCCESS)).command.success.request_id == 7
        assert await service.unload_topic(topic)
        await client.close()


@pytest.fixture(scope="module")
def names_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("names-broker")
    process = BrokerProcess(base / "data", base / "broker.log")
    process.start()
    yield process
    process.cleanup()


def test_the_official_client_is_refused_over_long_names(names_broker: BrokerProcess) -> None:
    # The C++ client retries InvalidTopicName until its operation timeout (wire reference
    # §12), then raises Timeout; each retry is refused at once, with nothing logged as ERROR.
    client = pulsar.Client(names_broker.url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        with pytest.raises((pulsar.InvalidTopicName, pulsar.Timeout)):
            client.create_producer(LONG_TOPIC)
        with pytest.raises((pulsar.InvalidTopicName, pulsar.Timeout)):
            client.subscribe(LONG_TOPIC, "sub")
        topic = "persistent://public/default/official-long-sub"
        began = time.monotonic()
        # Upstream's ProducerBusy for a refused subscription name: the C++ client makes it
        # InvalidConfiguration ("SubscriptionName cannot be empty", the usual cause), no retry.
        with pytest.raises(pulsar.InvalidConfiguration):
            client.subscribe(topic, LONG_SUB)
        assert time.monotonic() - began < OPERATION_TIMEOUT_S, "the client retried"
        consumer = client.subscribe(topic, "sub")  # the topic works, no zombie left
        client.create_producer(topic).send(b"after")
        assert consumer.receive(5000).data() == b"after"
    finally:
        client.close()
    log = names_broker.log_path.read_text()
    assert "ERROR" not in log, names_broker.log_tail()
    assert "Traceback" not in log, names_broker.log_tail()
    assert LONG_LOCAL not in log  # refusals quote the name, never echo it whole


# -- connection limits ---------------------------------------------------------------------


async def test_connections_beyond_the_limits_are_refused_with_not_allowed(tmp_path: Path) -> None:
    async def refused(server: BrokerServer, reason: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        answer = await asyncio.wait_for(reader.read(), DEADLINE_S)  # all of it, then EOF
        size = int.from_bytes(answer[:4], "big")
        assert len(answer) == 4 + size, "one frame, then the close"
        frame = decode_frame(answer[4:])
        assert isinstance(frame, Frame)
        assert frame.type == T.ERROR, frame.command
        error = frame.command.error
        assert (error.request_id, error.error) == (2**64 - 1, pb.NotAllowedError)
        assert reason in error.message
        writer.close()

    async with _serving(tmp_path, max_connections_per_ip=2) as (server, service):
        first = [await _AsyncClient.connect(server.port) for _ in range(2)]
        await refused(server, "maximum number of connections on address 127.0.0.1")
        assert server.connection_count == 2
        text = render_metrics(service)
        assert 'pulsar_active_connections{cluster="standalone"} 2' in text
        assert 'pulsar_connection_create_fail_count{cluster="standalone"} 1' in text
        await first[0].close()
        await _eventually(lambda: server.connection_count == 1)
        again = await _AsyncClient.connect(server.port)  # a freed slot is usable again
        assert server.refused_connections == 1
        for client in (first[1], again):
            await client.close()

    async with _serving(tmp_path, broker_max_connections=1) as (server, service):
        held = await _AsyncClient.connect(server.port)
        await refused(server, "Reached the maximum number of connections")
        held.send(pb.CommandPing())
        await held.expect(T.PONG)  # the admitted one is untouched
        await held.close()


# -- incomplete frames ---------------------------------------------------------------------


def _partial_frame(claimed_bytes: int, sent_bytes: int) -> bytes:
    """The first `sent_bytes` of a frame that claims `claimed_bytes` after its length."""
    return claimed_bytes.to_bytes(4, "big") + b"\0" * (sent_bytes - 4)


async def test_incomplete_frames_are_bounded_over_all_connections(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="magnetar.broker")
    async with _serving(tmp_path, max_incomplete_frames_bytes=4 * MIB) as (server, service):
        clients = [await _AsyncClient.connect(server.port) for _ in range(4)]
        first, second, third, fourth = clients
        first.writer.write(_partial_frame(4 * MIB, 3 * MIB))  # under the 4 MiB limit
        await _eventually(lambda: server.incomplete_frames_bytes >= 3 * MIB)
        second.writer.write(_partial_frame(4 * MIB, 2 * MIB))  # pushes the sum over
        assert await _closed(second)
        await _eventually(lambda: server.incomplete_frames_bytes < 4 * MIB)
        third.writer.write(_partial_frame(4 * MIB, 2 * MIB))  # again: closed, logged at DEBUG
        assert await _closed(third)
        first.writer.write(b"\0" * (MIB + 4))  # the first one may finish its frame: a bad one
        assert await _closed(first)  # (all zeros is no valid command) and so it is closed
        await _eventually(lambda: server.incomplete_frames_bytes == 0)
        fourth.send(pb.CommandPing())
        await fourth.expect(T.PONG)  # untouched throughout
        text = render_metrics(service)
        assert ('magnetar_connections_closed_for_incomplete_frames_count{cluster="standalone"} 2'
                in text)
        assert 'magnetar_incomplete_frames_bytes{cluster="standalone"} 0' in text
        for client in clients:
            await client.close()

    over = [r for r in caplog.records if "max_incomplete_frames_bytes" in r.getMessage()]
    assert [r.levelno for r in over] == [logging.WARNING, logging.DEBUG]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_closed_connection_releases_its_partial_frame(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (server, _):
        client = await _AsyncClient.connect(server.port)
        client.writer.write(_partial_frame(5 * MIB, 4 * MIB))
        (handler,) = server._connections
        buffer_holder = handler.conn
        watched: weakref.ref[ConnectionHandler] = weakref.ref(handler)
        del handler
        await _eventually(lambda: buffer_holder.buffered_bytes >= 4 * MIB)
        await client.close()
        await _eventually(lambda: server.connection_count == 0)
        assert buffer_holder.buffered_bytes == 0  # the bytes are dropped, not just uncounted
        assert server.incomplete_frames_bytes == 0
        gc.collect()
        await _eventually(lambda: watched() is None)  # and nothing holds the handler


# -- logging -------------------------------------------------------------------------------


async def test_a_repeated_client_mistake_is_one_warning_per_connection(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    topic = "persistent://public/default/mistakes"
    metadata, payload = build_message(SingleMessage(b"x", sequence_id=0), producer_name="p",
                                      publish_time=1)

    async def mistakes(client: _AsyncClient) -> None:
        for request_id in range(10, 13):  # a C++ client cannot take the reply: not sent
            client.send(pb.CommandGetOrCreateSchema(
                request_id=request_id, topic=topic,
                schema=pb.Schema(name="s", type=pb.Schema.String, schema_data=b"")))
        client.send(pb.CommandProducer(topic=topic, producer_id=1, request_id=1))
        await client.expect(T.PRODUCER_SUCCESS)
        for sequence_id in range(3):  # corrupt SENDs
            frame = bytearray(client.conn.send(base_command(pb.CommandSend(
                producer_id=1, sequence_id=sequence_id)), metadata, payload))
            frame[-1] ^= 0xFF
            client.writer.write(bytes(frame))
            assert (await client.expect(T.SEND_ERROR)).command.send_error.error \
                == pb.ChecksumError
        client.send(pb.CommandPing())
        await client.expect(T.PONG)

    caplog.set_level(logging.DEBUG, logger="magnetar.broker")
    async with _serving(tmp_path) as (server, service):
        for _ in range(2):
            client = await _AsyncClient.connect(server.port)
            await mistakes(client)
            await client.close()
        # a request whose answer cannot be sent does nothing either
        assert service.schemas.get(TopicName.parse(topic)) is None

    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("not sending CommandGetOrCreateSchemaResponse" in m for m in warnings) == 2
    assert sum("failed its checksum" in m for m in warnings) == 2


def test_the_connection_limit_leaves_descriptors_for_the_storage(
        caplog: pytest.LogCaptureFixture) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = 1000
    if hard != resource.RLIM_INFINITY and hard < lowered:
        lowered = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        with caplog.at_level(logging.WARNING, logger="magnetar.broker"):
            assert _connections_max(2048) == lowered - DESCRIPTORS_RESERVED
            assert _connections_max(0) == lowered - DESCRIPTORS_RESERVED
        assert _connections_max(lowered - DESCRIPTORS_RESERVED) == lowered - DESCRIPTORS_RESERVED
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len([r for r in caplog.records if "lowered to" in r.getMessage()]) == 2
