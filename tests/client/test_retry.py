"""Retry topics (`reconsume_later`): the suite part runs on both transports; the restart and
kill -9 parts embed the broker (in this process, and in a child killed with SIGKILL)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

import magnetar
from magnetar import ConsumerType

from .test_embedded import SUBPROCESS_DEADLINE_S, _python
from .test_produce_consume import QUIET_MS, RECEIVE_MS

SHARED = ConsumerType.Shared
TICK_MS = 1000  # the broker's delayed_delivery_tick_time_ms


def test_reconsume_later_counts_then_dead_letters(client: magnetar.Client, topic: str) -> None:
    policy = magnetar.ConsumerDeadLetterPolicy(max_redeliver_count=2,
                                               initial_subscription_name="dlq-sub")
    consumer = client.subscribe(topic, "sub", consumer_type=SHARED, retry_enable=True,
                                dead_letter_policy=policy)
    sent = client.create_producer(topic).send(b"job", properties={"a": "1"},
                                              partition_key="k")
    message = consumer.receive(RECEIVE_MS)
    for times in (1, 2):
        consumer.reconsume_later(message, 0, properties={"try": str(times)})
        message = consumer.receive(RECEIVE_MS)
        assert message.topic_name() == f"{topic}-sub-RETRY"
        assert message.data() == b"job"
        assert message.partition_key() == "k"
        assert message.properties() == {"a": "1", "try": str(times), "REAL_TOPIC": topic,
                                        "ORIGIN_MESSAGE_ID": str(sent.codec),
                                        "RECONSUMETIMES": str(times), "DELAY_TIME": "0"}
    consumer.reconsume_later(message, 0)  # the third time is past the maximum
    with pytest.raises(magnetar.Timeout):
        consumer.receive(QUIET_MS)
    dead = client.subscribe(f"{topic}-sub-DLQ", "dlq-sub").receive(RECEIVE_MS)
    assert dead.properties()["RECONSUMETIMES"] == "3"
    assert dead.properties()["REAL_TOPIC"] == topic
    consumer.close()
    again = client.subscribe(topic, "sub", consumer_type=SHARED, retry_enable=True)
    with pytest.raises(magnetar.Timeout):
        again.receive(QUIET_MS)  # source and retry topic both drained


def test_reconsume_later_waits_the_delay(client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", consumer_type=SHARED, retry_enable=True)
    client.create_producer(topic).send(b"later")
    message = consumer.receive(RECEIVE_MS)
    due_ms = time.time() * 1000 + 2500
    consumer.reconsume_later(message, 2500)
    again = consumer.receive(RECEIVE_MS)
    assert again.data() == b"later"
    assert again.properties()["DELAY_TIME"] == "2500"
    assert time.time() * 1000 >= due_ms - TICK_MS


def test_reconsume_later_needs_retry_enable(client: magnetar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub")
    client.create_producer(topic).send(b"x")
    message = consumer.receive(RECEIVE_MS)
    with pytest.raises(magnetar.OperationNotSupported, match="retry_enable"):
        consumer.reconsume_later(message, 0)


def test_a_waiting_retry_survives_a_restart(tmp_path: Path) -> None:
    data, topic = str(tmp_path / "data"), "persistent://public/default/retry-restart"
    with magnetar.Client(data) as client:
        consumer = client.subscribe(topic, "sub", consumer_type=SHARED, retry_enable=True)
        client.create_producer(topic).send(b"waiting")
        consumer.reconsume_later(consumer.receive(RECEIVE_MS), 1500)
    with magnetar.Client(data) as client:
        consumer = client.subscribe(topic, "sub", consumer_type=SHARED, retry_enable=True)
        message = consumer.receive(RECEIVE_MS)
        assert (message.data(), message.properties()["RECONSUMETIMES"]) == (b"waiting", "1")
        consumer.acknowledge(message)
        with pytest.raises(magnetar.Timeout):
            consumer.receive(QUIET_MS)


@pytest.mark.parametrize("dead", [False, True], ids=["retry", "dead-letter"])
def test_retry_and_dead_letters_survive_kill_9(tmp_path: Path, dead: bool) -> None:
    """A child process reconsumes (once, or past a maximum of 1 into the dead-letter topic)
    and kills itself with SIGKILL right after: everything it was told is stored is there."""
    data, topic = str(tmp_path / "data"), "persistent://public/default/retry-kill"
    times = 2 if dead else 1
    child = _python(f"""
        import os, signal, magnetar
        client = magnetar.Client({data!r})
        policy = magnetar.ConsumerDeadLetterPolicy(1, initial_subscription_name="dlq-sub")
        consumer = client.subscribe({topic!r}, "sub", retry_enable=True,
                                    consumer_type=magnetar.ConsumerType.Shared,
                                    dead_letter_policy=policy)
        client.create_producer({topic!r}).send(b"precious")
        for _ in range({times}):
            consumer.reconsume_later(consumer.receive(5000), 0)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    _, err = child.communicate(timeout=SUBPROCESS_DEADLINE_S)
    assert child.returncode == -signal.SIGKILL, err
    with magnetar.Client(data) as client:
        if dead:
            consumer = client.subscribe(f"{topic}-sub-DLQ", "dlq-sub")
        else:
            consumer = client.subscribe(topic, "sub", consumer_type=SHARED, retry_enable=True)
        message = consumer.receive(RECEIVE_MS)
        assert (message.data(), message.properties()["RECONSUMETIMES"]) == \
            (b"precious", str(times))
        consumer.acknowledge(message)
        with pytest.raises(magnetar.Timeout):
            consumer.receive(QUIET_MS)  # the original's ack was stored before the kill
