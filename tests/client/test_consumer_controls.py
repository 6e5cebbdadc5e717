"""The shared client suite, part 3: pausing a message listener, a zero-size receiver queue,
partitions added while producers and consumers run, and the embedded GetLastMessageId's read
off the loop. Each test runs against both transports unless it is about the embedded one.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import magnetar
from magnetar import ConsumerType, InitialPosition
from magnetar._core import ClientCore, ClientSettings
from magnetar._embedded import EmbeddedTransport
from magnetar._options import consumer_options, producer_options
from magnetar._producer import OutMessage
from magnetar.broker import BrokerConfig, BrokerService
from magnetar.pytest_plugin import StandaloneBroker
from magnetar.storage import Storage
from magnetar.storage.testing.simfs import SimFileSystem
from tests.interop import wait_for
from tests.storage.helpers import small_config

from .conftest import TRANSPORTS
from .test_produce_consume import QUIET_MS, RECEIVE_MS, drain

UPDATE_S = 0.2  # the partition-count look-up interval of these tests' clients
WAIT_S = 15.0  # generous deadlines: the machine may be loaded


# -- pause_message_listener / resume_message_listener --------------------------------------


def test_pause_and_resume_message_listener(client: magnetar.Client, topic: str) -> None:
    """Paused from inside the listener and from another thread: no call starts while paused,
    and the messages that waited come in order on resume."""
    got: list[bytes] = []
    called = threading.Condition()

    def listener(consumer: magnetar.Consumer, message: magnetar.Message) -> None:
        consumer.acknowledge(message)
        if message.data() == b"m0":
            consumer.pause_message_listener()  # the call in progress finishes
        with called:
            got.append(message.data())
            called.notify_all()

    def wait_got(count: int, timeout_s: float) -> bool:
        with called:
            return called.wait_for(lambda: len(got) >= count, timeout_s)

    consumer = client.subscribe(topic, "sub", message_listener=listener)
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(f"m{i}".encode())
    assert wait_got(1, RECEIVE_MS / 1000)
    assert not wait_got(2, QUIET_MS / 1000), "a listener call started while paused"
    consumer.resume_message_listener()
    assert wait_got(3, RECEIVE_MS / 1000)
    assert got == [b"m0", b"m1", b"m2"]

    consumer.pause_message_listener()  # from this thread, while the listener is idle
    producer.send(b"m3")
    assert not wait_got(4, QUIET_MS / 1000), "a listener call started while paused"
    consumer.resume_message_listener()
    consumer.resume_message_listener()  # resuming a running listener changes nothing
    assert wait_got(4, RECEIVE_MS / 1000)
    assert got == [b"m0", b"m1", b"m2", b"m3"]

    plain = client.subscribe(topic, "plain")
    with pytest.raises(magnetar.InvalidConfiguration, match="no message listener"):
        plain.pause_message_listener()


# -- receiver_queue_size=0 -----------------------------------------------------------------


def test_zero_receiver_queue_takes_nothing_ahead(client: magnetar.Client, topic: str) -> None:
    """A zero-queue Shared consumer holds no message it was not asked for: another consumer
    of the subscription gets them all; its own receive asks for one (official
    `test_consumer_queue_size_is_zero`), also after a receive that timed out."""
    zero = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared,
                            receiver_queue_size=0)
    producer = client.create_producer(topic)
    for i in range(4):
        producer.send(f"m{i}".encode())
    other = client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
    assert sorted(m.data() for m in drain(other, 4)) == [b"m0", b"m1", b"m2", b"m3"]
    other.close()
    with pytest.raises(magnetar.Timeout):
        zero.receive(QUIET_MS)
    producer.send(b"m4")
    producer.send(b"m5")
    assert [m.data() for m in drain(zero, 2)] == [b"m4", b"m5"]


def test_zero_receiver_queue_receives_a_batch_and_needs_one_topic(
        client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", receiver_queue_size=0)
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_publish_delay_ms=60_000)
    for i in range(3):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    assert [m.data() for m in drain(consumer, 3)] == [b"b0", b"b1", b"b2"]
    with pytest.raises(magnetar.InvalidConfiguration, match="receiver_queue_size=0"):
        client.subscribe([topic, f"{topic}-other"], "sub2", receiver_queue_size=0)


# -- partitions added while running ------------------------------------------------------


class _Grower:
    """A client of one transport (looking partition counts up every `UPDATE_S`) and the
    admin's create and update of a partitioned topic: the embedded broker's service, or the
    standalone broker's admin REST API."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest):
        self.broker: StandaloneBroker | None = None
        if kind == "embedded":
            self.client = magnetar.Client(str(tmp_path / "data"),
                                          partitions_update_interval_seconds=UPDATE_S)
        else:
            self.broker = request.getfixturevalue("magnetar_standalone_session")
            self.client = magnetar.Client(self.broker.service_url,
                                          partitions_update_interval_seconds=UPDATE_S)

    def partitions(self, topic: str, count: int, create: bool) -> None:
        if self.broker is None:
            service = self.client._core.transport.service  # type: ignore[attr-defined]
            work = service.create_partitioned_topic if create else \
                service.update_partitioned_topic
            self.client._thread.run(work(topic, count))
            return
        path = topic.replace("persistent://", "persistent/")
        http = urllib.request.Request(f"{self.broker.admin_url}/admin/v2/{path}/partitions",
                                      data=str(count).encode(), method="PUT" if create else
                                      "POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(http, timeout=WAIT_S) as answer:
            assert answer.status in (200, 204)


@pytest.fixture(params=TRANSPORTS)
def grower(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Grower]:
    made = _Grower(request.param, tmp_path, request)
    yield made
    made.client.close()


def test_partitions_added_by_the_admin_are_picked_up(grower: _Grower, topic: str) -> None:
    grower.partitions(topic, 2, create=True)
    client = grower.client
    consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic)
    assert {producer.send(b"before").partition() for _ in range(2)} <= {0, 1}
    grower.partitions(topic, 4, create=False)
    wait_for(lambda: len(producer._core.cores) == 4, WAIT_S, "the producer's new partitions")
    wait_for(lambda: len(consumer._group.children) == 4, WAIT_S,
             "the consumer's new partitions")
    sent = {producer.send(f"after-{i}".encode()).partition() for i in range(4)}
    assert sent == {0, 1, 2, 3}  # round robin now covers the new partitions
    received = drain(consumer, 6)
    assert {m.topic_name() for m in received if m.data().startswith(b"after")} == \
        {f"{topic}-partition-{i}" for i in range(4)}


def test_partition_update_interval_is_checked() -> None:
    with pytest.raises(magnetar.InvalidConfiguration, match="partitions_update_interval"):
        magnetar.Client("pulsar://127.0.0.1:6650", partitions_update_interval_seconds=-1)


# -- the embedded GetLastMessageId reads off the loop ----------------------------------------


class _PingWhileHeld(threading.Thread):
    """Once a read is held: ping the loop and record whether it answered within `WAIT_S`,
    then release the read -- answered or not, so a frozen loop fails the test, not hangs it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fs: SimFileSystem):
        super().__init__(daemon=True)
        self.loop, self.fs = loop, fs
        self.answered = False

    def run(self) -> None:
        try:
            deadline = time.monotonic() + WAIT_S
            while not self.fs.held("read") and time.monotonic() < deadline:
                time.sleep(0.002)  # polling another component's state, with a deadline
            ran = threading.Event()
            self.loop.call_soon_threadsafe(ran.set)
            self.answered = self.fs.held("read") > 0 and ran.wait(WAIT_S)
        finally:
            self.fs.release("read")


async def test_embedded_last_message_id_reads_the_disk_off_the_loop(tmp_path: Path) -> None:
    """The last entry is only in the entry logs and their reads are held: the loop keeps
    answering while GetLastMessageId waits for its read, which then gives the batch index.
    (Before the fix the read ran on the loop thread, which stopped until it was released.)"""
    fs = SimFileSystem(seed=12)
    storage = await asyncio.to_thread(Storage.open, tmp_path, small_config(), fs=fs)
    service = BrokerService(storage, BrokerConfig(max_message_size_bytes=128 * 1024))
    await service.start(maintenance=False)
    core = ClientCore(EmbeddedTransport(str(tmp_path), storage, service), ClientSettings())
    topic = "persistent://public/default/last-id"
    try:
        group = await core.subscribe(consumer_options(topic, "sub"))
        producer = await core.create_producer(producer_options(
            topic, batching_enabled=True, batching_max_publish_delay_ms=60_000))
        sends = [await producer.send(OutMessage(b"m%d" % i)) for i in range(3)]
        await producer.flush()
        last_sent = (await asyncio.gather(*sends))[-1]
        await asyncio.to_thread(storage.checkpoint)  # the entry now needs the disk
        fs.hold("read", "entrylogs")
        pinger = _PingWhileHeld(asyncio.get_running_loop(), fs)
        pinger.start()
        child = group.only_child("get last message id")
        last, _ = await core.transport.last_message_id(child.consumer_id)
        await asyncio.to_thread(pinger.join, WAIT_S * 2)
        assert pinger.answered, "the loop froze while the last entry's read was held"
        assert (last.ledger_id, last.entry_id, last.batch_index) == \
            (last_sent.ledger_id, last_sent.entry_id, 2)
    finally:
        fs.release("read")
        await core.close()
