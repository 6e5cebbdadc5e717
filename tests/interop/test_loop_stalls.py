"""No single frame freezes the broker (issue 10, item 4): after each attack frame, a PING --
on the attacking connection and on another one -- is answered within `PONG_WAIT_MAX_S`.

The attacks, as raw frames against a broker subprocess: a cumulative ACK with a huge ack set
(on an id that does not exist, and on a real batch entry); a batch-index ACK and a
GET_LAST_MESSAGE_ID on entries stored before SENDs were checked, claiming 2**30 and -2**31
messages (written into the data directory before the broker starts); a pathological regular
expression in GET_TOPICS_OF_NAMESPACE and in WATCH_TOPIC_LIST. Also: SENDs with impossible
batch counts are refused with NotAllowedError, and Java regex syntax RE2 lacks is refused with
InvalidTopicName "Invalid topics pattern: ...".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from magnetar.broker import BrokerConfig, BrokerService
from magnetar.broker.dispatch._entry import SINGLE_MESSAGE_BYTES_MIN
from magnetar.broker.topics._topic import PersistentTopic
from magnetar.codec import (
    ChecksumMismatch,
    ConnectionClosed,
    Frame,
    SingleMessage,
    build_batch,
    build_message,
    encode_entry,
    pb,
)
from magnetar.storage import Storage

from . import BrokerProcess, RawClient

pytestmark = pytest.mark.interop

T = pb.BaseCommand
PONG_WAIT_MAX_S = 0.1  # the bound: no frame makes a PING wait longer
ANSWER_TIMEOUT_S = 5.0  # for replies that are not timed
ACK_SET_WORDS = 128 * 1024  # 2-byte varints: a 256 KB frame (25 s of work before the fix)
PUBLISH_TIME_MS = 1_700_000_000_000
NS = "public/default"
LEGACY_HUGE = "persistent://public/default/legacy-claims-2-30"
LEGACY_NEGATIVE = "persistent://public/default/legacy-claims-minus-2-31"
BATCHED = "persistent://public/default/a-real-batch"
BATCH_SIZE = 3
# The name a backtracking matcher needs seconds for (x4 per two more characters).
BACKTRACK_TOPIC = "persistent://public/default/" + "a" * 26 + "!"
BACKTRACK_PATTERN = "persistent://public/default/(a+)+"


@dataclass
class Target:
    broker: BrokerProcess
    legacy_huge: tuple[int, int]  # (ledger, entry) of the entry claiming 2**30 messages
    legacy_negative: tuple[int, int]
    batch: tuple[int, int]  # a real batch of BATCH_SIZE messages


def _entry(count: int) -> bytes:
    # 600 bytes can hold 100 messages: the broker reads the entry as a batch of 100.
    metadata, payload = build_message(SingleMessage(b"legacy" * 100, sequence_id=0),
                                      producer_name="legacy", publish_time=PUBLISH_TIME_MS)
    metadata.num_messages_in_batch = count
    return encode_entry(metadata, payload)


async def _populate(data_dir: Path) -> tuple[tuple[int, int], ...]:
    """Write what a broker before the fix could have stored, as the broker itself stores it."""
    storage = Storage.open(data_dir)
    service = BrokerService(storage, BrokerConfig())
    await service.start(maintenance=False)
    try:
        positions = []
        for name, data in ((LEGACY_HUGE, _entry(2 ** 30)), (LEGACY_NEGATIVE, _entry(-2 ** 31))):
            topic = await service.create_topic(name)
            assert isinstance(topic, PersistentTopic)
            positions.append(tuple(await topic.managed_ledger.add_entry(data)))
        topic = await service.create_topic(BATCHED)
        assert isinstance(topic, PersistentTopic)
        metadata, payload = build_batch(
            [SingleMessage(f"m{i}".encode(), sequence_id=i) for i in range(BATCH_SIZE)],
            producer_name="batcher", publish_time=PUBLISH_TIME_MS)
        positions.append(tuple(await topic.managed_ledger.add_entry(
            encode_entry(metadata, payload))))
        await service.create_topic(BACKTRACK_TOPIC)
    finally:
        await service.close()
        storage.close()
    return tuple(positions)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    base = tmp_path_factory.mktemp("loop-stalls")
    huge, negative, batch = asyncio.run(_populate(base / "data"))
    process = BrokerProcess(base / "data", base / "broker.log")
    process.start()
    yield Target(process, huge, negative, batch)
    process.cleanup()


class _Client(RawClient):
    """A raw client that keeps the frames that arrive while it waits for a PONG."""

    def __init__(self, port: int, *, watchers: bool = False):
        super().__init__(port, timeout_s=ANSWER_TIMEOUT_S)
        self.held: deque[Frame] = deque()
        self.send(pb.CommandConnect(client_version="stall-test", protocol_version=20,
                                    feature_flags=pb.FeatureFlags(
                                        supports_topic_watchers=watchers)))
        self.expect(T.CONNECTED)

    def next_event(self) -> Frame | ChecksumMismatch | ConnectionClosed:
        return self.held.popleft() if self.held else super().next_event()

    def pong_wait_s(self) -> float:
        """Send a PING and return how long its PONG took."""
        began = time.monotonic()
        self.send(pb.CommandPing())
        held: list[Frame] = []
        while True:
            event = super().next_event()
            assert isinstance(event, Frame), event
            if event.type == T.PONG:
                self.held.extend(held)
                return time.monotonic() - began
            held.append(event)


def _client(target: Target, *, watchers: bool = False) -> _Client:
    return _Client(target.broker.port, watchers=watchers)


def _assert_not_frozen(attacker: _Client, bystander: _Client, reply_type: int) -> Frame:
    """Until the attacker has its reply of `reply_type` (the work the attack started is done),
    PING on the attacking connection and on another one: every PONG comes within the bound.
    Returns the reply."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        waits = {"attacker": attacker.pong_wait_s(), "bystander": bystander.pong_wait_s()}
        assert max(waits.values()) < PONG_WAIT_MAX_S, waits
        replies = [frame for frame in attacker.held if frame.type in (reply_type, T.ERROR)]
        if replies:
            assert replies[0].type == reply_type, replies[0].command
            attacker.held.remove(replies[0])
            return replies[0]
        assert time.monotonic() < deadline, "no reply to the attack in time"


def _subscribe(client: _Client, topic: str, consumer_id: int,
               sub_type: int = pb.CommandSubscribe.Exclusive) -> None:
    client.request(pb.CommandSubscribe(
        topic=topic, subscription=f"sub-{consumer_id}", consumer_id=consumer_id,
        request_id=consumer_id, subType=sub_type,  # type: ignore[arg-type]
        initialPosition=pb.CommandSubscribe.Earliest), T.SUCCESS)


def _huge_ack(consumer_id: int, position: tuple[int, int], ack_type: int,
              request_id: int) -> pb.CommandAck:
    ack_set = [64 + index % 1000 for index in range(ACK_SET_WORDS)]
    message_id = pb.MessageIdData(ledgerId=position[0], entryId=position[1], ack_set=ack_set)
    return pb.CommandAck(consumer_id=consumer_id, ack_type=ack_type,  # type: ignore[arg-type]
                         message_id=[message_id], request_id=request_id)


@pytest.mark.parametrize("on_real_batch", [False, True], ids=["unknown-id", "batch-entry"])
def test_a_huge_cumulative_ack_set_does_not_freeze_the_broker(target: Target,
                                                              on_real_batch: bool) -> None:
    attacker, bystander = _client(target), _client(target)
    try:
        topic = BATCHED if on_real_batch else "persistent://public/default/acked-anywhere"
        consumer_id = 11 if on_real_batch else 12
        _subscribe(attacker, topic, consumer_id)
        position = target.batch if on_real_batch else (123_456_789, 0)
        attacker.send(_huge_ack(consumer_id, position, pb.CommandAck.Cumulative, 99))
        reply = _assert_not_frozen(attacker, bystander, T.ACK_RESPONSE).body
        assert reply.HasField("error"), reply  # refused: the id or the ack set is invalid
        if on_real_batch:
            assert reply.error == pb.NotAllowedError
            assert f"a batch of {BATCH_SIZE} messages" in reply.message
    finally:
        attacker.close()
        bystander.close()


def test_a_batch_index_ack_on_an_entry_claiming_2_30_messages(target: Target) -> None:
    attacker, bystander = _client(target), _client(target)
    try:
        _subscribe(attacker, LEGACY_HUGE, 21, pb.CommandSubscribe.Shared)
        ledger_id, entry_id = target.legacy_huge
        message_id = pb.MessageIdData(ledgerId=ledger_id, entryId=entry_id, ack_set=[-2])
        attacker.send(pb.CommandAck(consumer_id=21, ack_type=pb.CommandAck.Individual,
                                    message_id=[message_id], request_id=5))
        reply = _assert_not_frozen(attacker, bystander, T.ACK_RESPONSE).body
        assert not reply.HasField("error"), reply
        # Reading the entry still works: it is delivered, counted as the messages it can hold.
        attacker.send(pb.CommandFlow(consumer_id=21, messagePermits=1000))
        message = _assert_not_frozen(attacker, bystander, T.MESSAGE).body
        assert (message.message_id.ledgerId, message.message_id.entryId) == target.legacy_huge
    finally:
        attacker.close()
        bystander.close()


def test_a_negative_stored_count_does_not_fail_get_last_message_id(target: Target) -> None:
    attacker, bystander = _client(target), _client(target)
    try:
        _subscribe(attacker, LEGACY_NEGATIVE, 31)
        attacker.send(pb.CommandGetLastMessageId(consumer_id=31, request_id=7))
        reply = _assert_not_frozen(attacker, bystander, T.GET_LAST_MESSAGE_ID_RESPONSE).body
        last = reply.last_message_id
        assert (last.ledgerId, last.entryId, last.batch_index) == (*target.legacy_negative, 0)
        attacker.send(pb.CommandFlow(consumer_id=31, messagePermits=10))
        message = _assert_not_frozen(attacker, bystander, T.MESSAGE).body
        assert (message.message_id.ledgerId,
                message.message_id.entryId) == target.legacy_negative
    finally:
        attacker.close()
        bystander.close()


def test_a_backtracking_pattern_in_get_topics_does_not_freeze_the_broker(target: Target,
                                                                         ) -> None:
    attacker, bystander = _client(target), _client(target)
    try:
        attacker.send(pb.CommandGetTopicsOfNamespace(request_id=41, namespace=NS,
                                                     topics_pattern=BACKTRACK_PATTERN))
        reply = _assert_not_frozen(attacker, bystander, T.GET_TOPICS_OF_NAMESPACE_RESPONSE).body
        assert reply.filtered
        assert BACKTRACK_TOPIC not in reply.topics
        for request_id, java_only in enumerate([r"persistent://public/default/(a)\1",
                                                "persistent://public/default/(?!x).*"], 42):
            error = attacker.request(pb.CommandGetTopicsOfNamespace(
                request_id=request_id, namespace=NS, topics_pattern=java_only), T.ERROR)
            assert (error.request_id, error.error) == (request_id, pb.InvalidTopicName)
            assert error.message.startswith("Invalid topics pattern: "), error.message
    finally:
        attacker.close()
        bystander.close()


def test_a_backtracking_pattern_in_watch_topic_list_does_not_freeze_the_broker(
        target: Target) -> None:
    attacker, bystander = _client(target, watchers=True), _client(target)
    try:
        attacker.send(pb.CommandWatchTopicList(request_id=51, watcher_id=1, namespace=NS,
                                               topics_pattern=BACKTRACK_PATTERN))
        success = _assert_not_frozen(attacker, bystander, T.WATCH_TOPIC_LIST_SUCCESS).body
        assert BACKTRACK_TOPIC not in success.topic
        error = attacker.request(pb.CommandWatchTopicList(
            request_id=52, watcher_id=2, namespace=NS,
            topics_pattern=r"persistent://public/default/(?<=a)b"), T.ERROR)
        assert error.error == pb.InvalidTopicName
        assert error.message.startswith("Invalid topics pattern: "), error.message
    finally:
        attacker.close()
        bystander.close()


@pytest.mark.parametrize("count", [0, -2 ** 31, 2 ** 30, 2 ** 31 - 1, None])
def test_a_send_claiming_an_impossible_batch_count_is_refused(target: Target,
                                                              count: int | None) -> None:
    client = _client(target)
    try:
        client.request(pb.CommandProducer(topic="persistent://public/default/claims",
                                          producer_id=1, request_id=1), T.PRODUCER_SUCCESS)
        metadata, payload = build_batch([SingleMessage(b"x", sequence_id=0),
                                         SingleMessage(b"y", sequence_id=1)],
                                        producer_name="claims", publish_time=PUBLISH_TIME_MS)
        # None: one message more than the payload could hold at the minimum size each.
        metadata.num_messages_in_batch = (len(payload) // SINGLE_MESSAGE_BYTES_MIN + 1
                                          if count is None else count)
        client.send(pb.CommandSend(producer_id=1, sequence_id=0, num_messages=2),
                    metadata, payload)
        refused = client.expect(T.SEND_ERROR).body
        assert refused.error == pb.NotAllowedError
        assert "num_messages_in_batch" in refused.message
        metadata.num_messages_in_batch = 2  # the honest count still goes through
        client.send(pb.CommandSend(producer_id=1, sequence_id=1, num_messages=2),
                    metadata, payload)
        client.expect(T.SEND_RECEIPT)
    finally:
        client.close()
