"""The server in-process (`broker.serve` on a real socket, a real storage): broker-side
keep-alive, graceful shutdown with SENDs in flight, and the small pieces around it -- the
error-code mapping, `--config` overrides and the admin hook's contract."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import BrokerConfig, BrokerError, BrokerService, TopicNotFoundError
from magnetar.broker._errors import ServiceNotReadyError
from magnetar.broker._names import advertised_url_for
from magnetar.broker.cli import build_parser
from magnetar.broker.cli._standalone import config_with_overrides, stop_http
from magnetar.broker.wire._connection_view import server_error
from magnetar.broker.wire._discovery import lookup_error
from magnetar.broker.wire._server import BrokerServer, serve
from magnetar.codec import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    Frame,
    Role,
    SingleMessage,
    base_command,
    build_message,
    pb,
)
from magnetar.storage import LedgerNotFoundError, Storage

pytestmark = pytest.mark.interop

T = pb.BaseCommand
DEADLINE_S = 10.0
KEEPALIVE_S = 0.1


class _AsyncClient:
    """A protocol client on asyncio streams, frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.conn = Connection(Role.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> _AsyncClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(reader, writer)
        client.send(pb.CommandConnect(client_version="t", protocol_version=20))
        await client.expect(T.CONNECTED)
        return client

    def send(self, body: object, metadata: pb.MessageMetadata | None = None,
             payload: bytes = b"") -> None:
        self.writer.write(self.conn.send(base_command(body), metadata, payload))  # type: ignore[arg-type]

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass

    async def event(self) -> Frame | ConnectionClosed:
        while True:
            event = self.conn.next_event()
            if event is not NEED_DATA:
                assert isinstance(event, Frame | ConnectionClosed)
                return event
            data = await asyncio.wait_for(self.reader.read(65536), DEADLINE_S)
            self.conn.receive_data(data)

    async def expect(self, command_type: int) -> Frame:
        event = await self.event()
        assert isinstance(event, Frame)
        assert event.type == command_type, event.command
        return event


@asynccontextmanager
async def _serving(tmp_path: Path, config: BrokerConfig | None = None, **options: object,
                   ) -> AsyncIterator[tuple[BrokerServer, BrokerService]]:
    """A started service on the storage in `tmp_path / "data"` and its server on a free
    loopback port (`options` go to `serve`); shut down and closed on the way out."""
    storage = Storage.open(tmp_path / "data")
    service = BrokerService(storage, config or BrokerConfig())
    await service.start(maintenance=False)
    server = await serve(service, "127.0.0.1", 0, **options)  # type: ignore[arg-type]
    try:
        yield server, service
    finally:
        await server.shutdown(grace_s=DEADLINE_S)
        await service.close()
        storage.close()


async def test_broker_pings_and_closes_a_silent_connection(tmp_path: Path) -> None:
    async with _serving(tmp_path, keepalive_interval_s=KEEPALIVE_S) as (server, _):
        client = await _AsyncClient.connect(server.port)
        await client.expect(T.PING)
        client.send(pb.CommandPong())
        await client.expect(T.PING)  # answered, so the connection lives on
        began = time.monotonic()
        assert isinstance(await client.event(), ConnectionClosed)  # silent now: closed
        assert time.monotonic() - began < DEADLINE_S
        await client.close()
        await _eventually(lambda: server.connection_count == 0)


async def _eventually(condition: Callable[[], bool]) -> bool:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < end
        await asyncio.sleep(0.01)
    return True


async def _producer_sent(server: BrokerServer, topic: str, count: int,
                         data: bytes) -> _AsyncClient:
    """A client whose producer on `topic` has sent `count` messages of `data` (sequence ids
    from 0) in one go, receipts not read yet."""
    client = await _AsyncClient.connect(server.port)
    client.send(pb.CommandProducer(topic=topic, producer_id=0, request_id=0))
    await client.expect(T.PRODUCER_SUCCESS)
    for sequence_id in range(count):
        metadata, payload = build_message(SingleMessage(data, sequence_id=sequence_id),
                                          producer_name="p", publish_time=1)
        client.send(pb.CommandSend(producer_id=0, sequence_id=sequence_id), metadata, payload)
    return client


async def test_shutdown_receipts_every_send_it_persisted(tmp_path: Path) -> None:
    topic = "persistent://public/default/in-flight"

    async with _serving(tmp_path, keepalive_interval_s=0) as (server, service):
        client = await _producer_sent(server, topic, 300, b"x" * 100)
        receipts = [(await client.expect(T.SEND_RECEIPT)).body.sequence_id]
        shutting = asyncio.ensure_future(server.shutdown(grace_s=DEADLINE_S))
        while isinstance(event := await client.event(), Frame):
            assert event.type == T.SEND_RECEIPT, event.command
            receipts.append(event.body.sequence_id)
        await shutting
        await client.close()
        assert receipts == list(range(len(receipts)))
        stored = service.topics[topic].managed_ledger.number_of_entries  # type: ignore[union-attr]
        assert stored == len(receipts), "every persisted SEND was receipted before the close"


async def test_sends_of_producers_on_their_own_topics_go_one_run_per_producer_per_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three SENDs each of two producers on two topics, alternating in one write: each
    producer's SENDs of the read are published as one run (two runs, not six: a client
    sending round its producers put a SEND or two of each in a read, each its own run)."""
    from magnetar.broker import PersistentTopic

    runs: list[int] = []
    publish_grouped = PersistentTopic.publish_grouped

    def counted(topic: PersistentTopic, producer: Any, sends: Any, *rest: Any) -> bool:
        runs.append(len(sends))
        return publish_grouped(topic, producer, sends, *rest)

    monkeypatch.setattr(PersistentTopic, "publish_grouped", counted)
    async with _serving(tmp_path, BrokerConfig(), keepalive_interval_s=0) as (server, _):
        client = await _AsyncClient.connect(server.port)
        for producer_id in (0, 1):
            client.send(pb.CommandProducer(topic=f"persistent://public/default/own-{producer_id}",
                                           producer_id=producer_id, request_id=producer_id,
                                           producer_name=f"p{producer_id}"))
            await client.expect(T.PRODUCER_SUCCESS)
        data = b""
        for sequence_id in range(3):
            for producer_id in (0, 1):
                metadata, payload = build_message(
                    SingleMessage(b"%d-%d" % (producer_id, sequence_id), sequence_id=sequence_id),
                    producer_name=f"p{producer_id}", publish_time=1)
                data += client.conn.send(base_command(pb.CommandSend(
                    producer_id=producer_id, sequence_id=sequence_id)), metadata, payload)
        client.writer.write(data)
        receipts = [(await client.expect(T.SEND_RECEIPT)).body for _ in range(6)]
        await client.close()
    assert sorted((r.producer_id, r.sequence_id, r.message_id.entryId) for r in receipts) == [
        (p, s, s) for p in (0, 1) for s in range(3)]
    assert runs == [3, 3]


async def test_sends_of_many_producers_in_one_read_keep_each_ones_order(
        tmp_path: Path) -> None:
    """Interleaved SENDs of three producers on two topics, written at once (one group for the
    storage): each producer's receipts in its order, a topic's entries in arrival order; dedup
    then drops a repeated sequence id."""
    topics = ["persistent://public/default/grouped-a", "persistent://public/default/grouped-b"]
    producers = [(0, topics[0]), (1, topics[1]), (2, topics[0])]
    async with _serving(tmp_path, BrokerConfig(broker_deduplication_enabled=True),
                        keepalive_interval_s=0) as (server, service):
        client = await _AsyncClient.connect(server.port)
        for producer_id, topic in producers:
            client.send(pb.CommandProducer(topic=topic, producer_id=producer_id,
                                           request_id=producer_id, producer_name=f"p{producer_id}"))
            await client.expect(T.PRODUCER_SUCCESS)
        sent = [(producer_id, sequence_id) for sequence_id in range(20)
                for producer_id, _ in producers]

        def sends(which: list[tuple[int, int]]) -> bytes:
            data = b""
            for producer_id, sequence_id in which:
                metadata, payload = build_message(
                    SingleMessage(b"%d-%d" % (producer_id, sequence_id), sequence_id=sequence_id),
                    producer_name=f"p{producer_id}", publish_time=1)
                data += client.conn.send(base_command(pb.CommandSend(
                    producer_id=producer_id, sequence_id=sequence_id)), metadata, payload)
            return data

        client.writer.write(sends(sent))
        receipts: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
        for _ in sent:
            receipt = (await client.expect(T.SEND_RECEIPT)).body
            receipts[receipt.producer_id].append((receipt.sequence_id,
                                                  receipt.message_id.entryId))
        client.writer.write(sends([(1, 5), (0, 20)]))  # a duplicate, then a new one
        duplicate = (await client.expect(T.SEND_RECEIPT)).body
        assert (duplicate.producer_id, duplicate.sequence_id) == (1, 5)
        assert (await client.expect(T.SEND_RECEIPT)).body.message_id.entryId == 40
        await client.close()
        for producer_id, _ in producers:
            assert [seq for seq, _ in receipts[producer_id]] == list(range(20))
        ml_a = service.topics[topics[0]].managed_ledger  # type: ignore[union-attr]
        ml_b = service.topics[topics[1]].managed_ledger  # type: ignore[union-attr]
        assert ml_b.number_of_entries == 20  # not the duplicate
        stored = await ml_a.read_entries_async(ml_a.first_position(), 40, 1 << 20)
        expected = [b"%d-%d" % (producer_id, sequence_id) for producer_id, sequence_id in sent
                    if producer_id != 1]
        assert [data.endswith(text) for (_, data), text in zip(stored, expected, strict=True)] \
            == [True] * 40
        assert [entry for _, entry in receipts[0]] == list(range(0, 40, 2))  # arrival order
        assert [entry for _, entry in receipts[2]] == list(range(1, 40, 2))


def test_the_server_serves_on_uvloop(tmp_path: Path) -> None:
    """The server on uvloop's transports (MAGNETAR_EVENT_LOOP=uvloop): handshake, a burst of
    SENDs past pending_sends_max, every receipt in order."""
    import uvloop

    async def scenario() -> list[int]:
        async with asyncio.timeout(DEADLINE_S), \
                _serving(tmp_path, keepalive_interval_s=0, pending_sends_max=4) as (server, _):
            client = await _producer_sent(server, "persistent://public/default/uv", 50, b"u")
            receipts = [(await client.expect(T.SEND_RECEIPT)).body.sequence_id
                        for _ in range(50)]
            await client.close()
            return receipts

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == list(range(50))


async def test_reading_pauses_at_pending_sends_max_and_resumes(tmp_path: Path) -> None:
    """A burst of SENDs far over `pending_sends_max` in one write: the server stops reading
    the socket while that many wait for receipts and reads on once half are answered; every
    SEND is receipted, in order."""
    topic = "persistent://public/default/burst"
    async with _serving(tmp_path, keepalive_interval_s=0, pending_sends_max=4) as (server, _):
        client = await _producer_sent(server, topic, 200, b"x" * 1000)
        receipts = [(await client.expect(T.SEND_RECEIPT)).body.sequence_id for _ in range(200)]
        assert receipts == list(range(200))
        [protocol] = server._connections.values()
        assert protocol.read_pauses > 0
        await client.close()


def test_server_error_codes() -> None:
    assert server_error(TopicNotFoundError("gone")) == (pb.TopicNotFound, "gone")
    assert server_error(LedgerNotFoundError("no ledger"))[0] == LedgerNotFoundError.code
    assert server_error(KeyError("bug"))[0] == pb.UnknownError
    assert server_error(BrokerError())[1] == "BrokerError"
    # Lookup replies never carry ServiceNotReady: the C++ client would drop the connection.
    assert lookup_error(ServiceNotReadyError("later"))[0] == pb.MetadataError
    assert lookup_error(TopicNotFoundError("gone"))[0] == pb.TopicNotFound


def test_advertised_url() -> None:
    assert advertised_url_for("127.0.0.1", 6650) == "pulsar://127.0.0.1:6650"
    assert advertised_url_for("::1", 6650) == "pulsar://[::1]:6650"
    assert not advertised_url_for("0.0.0.0", 6650).startswith("pulsar://0.0.0.0")


def test_config_overrides() -> None:
    config = config_with_overrides(["broker_deduplication_enabled=true",
                                    "default-num-partitions=4", "cluster_name=c1",
                                    "subscription_types_enabled=Shared,Failover"])
    assert config.broker_deduplication_enabled is True
    assert config.default_num_partitions == 4
    assert config.cluster_name == "c1"
    assert config.subscription_types_enabled == ("Shared", "Failover")
    for bad in ("no_such_setting=1", "default_num_partitions=many",
                "broker_deduplication_enabled=maybe", "missing-equals"):
        with pytest.raises(ValueError, match=r"setting|number|true or false"):
            config_with_overrides([bad])


def test_standalone_command_line() -> None:
    args = build_parser().parse_args(["standalone", "--data-dir", "d", "--port", "0",
                                      "--config", "a=b", "--config", "c=d"])
    # A flag not given is None: the setting comes from --config-file, MAGNETAR_<key> or its
    # default (tests/test_config_file.py).
    assert (args.data_dir, args.host, args.port, args.http_port) == ("d", None, 0, None)
    assert args.config == ["a=b", "c=d"]


async def test_stop_http_closes_and_waits() -> None:
    calls: list[str] = []

    class Handle:
        async def close(self) -> None:
            calls.append("close")

        def wait_closed(self) -> None:
            calls.append("wait_closed")

    await stop_http(Handle())
    await stop_http(None)
    assert calls == ["close", "wait_closed"]
