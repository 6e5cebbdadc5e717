"""The broker crash harness (`magnetar crashtest broker`): short runs of both modes through
the API and the command line, the checks' own sensitivity (a doctored record of
acknowledgements must be caught), and a long run behind the slow marker."""

from __future__ import annotations

import io
import random
import re
import subprocess
import sys
from pathlib import Path

import pulsar
import pytest

import magnetar
from magnetar.broker.testing._crash_book import (
    AckBook,
    MessageKey,
    message_key_of,
    message_payload,
)
from magnetar.broker.testing._crash_brokers import InProcessBroker
from magnetar.broker.testing._crash_check import verify_after_restart
from magnetar.broker.testing._crash_retry import RETRIES_MAX
from magnetar.broker.testing.crashtest import BrokerCrashTestOptions, run_broker_crashtest
from magnetar.storage.testing.simfs import SimFileSystem

SUMMARY = re.compile(
    r"^crashtest broker: (\d+) iterations, (\d+) acknowledged messages verified \((\d+) "
    r"retried, (\d+) dead-lettered\), (\d+) violations$")
RECEIPTS = re.compile(r"^crashtest broker: acks with a receipt verified: (\d+); ")
RETRY_STATES = re.compile(
    r"^crashtest broker: subscription retry, acknowledged publishes: (\d+) acknowledged, "
    r"(\d+) acknowledged after a retry, (\d+) on the topic, (\d+) in the retry topic, (\d+) "
    r"dead-lettered; found in two generations \(allowed\): (\d+)$")
CLI_DEADLINE_S = 240
RECEIVE_MS = 10_000


def run(tmp_path: Path, iterations: int, mode: str, seed: int,
        crash_after_s_max: float = 0.5) -> tuple[list[str], int, int]:
    out = io.StringIO()
    summary = run_broker_crashtest(BrokerCrashTestOptions(
        data_dir=str(tmp_path), iterations=iterations, seed=seed, mode=mode,
        progress=False, crash_after_s_max=crash_after_s_max, out=out))
    lines = out.getvalue().splitlines()
    assert summary.violation_messages == [], "\n".join(lines)
    assert summary.violations == 0
    return lines, summary.kill_iterations, summary.powerloss_iterations


def test_short_run_of_both_modes_finds_no_violation(tmp_path: Path) -> None:
    lines, kills, powerlosses = run(tmp_path, 4, "both", seed=1515, crash_after_s_max=0.3)
    assert (kills, powerlosses) == (2, 2)
    assert lines[0] == "crashtest broker: seed 1515"
    summary = SUMMARY.match(lines[-1])
    assert summary is not None, lines
    assert summary.group(1) == "4"
    assert summary.group(5) == "0"
    assert int(summary.group(2)) > 0  # the workload published and the checks read it back
    assert int(summary.group(3)) > 0  # our client's consumer retried some of it
    states = RETRY_STATES.match(lines[-3])
    assert states is not None, lines
    assert int(states.group(1)) > 0
    receipts = RECEIPTS.match(lines[-4])
    assert receipts is not None, lines
    assert int(receipts.group(1)) > 0
    assert lines[-2].startswith("crashtest broker: powerloss crashes by cause: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "LOCK", "broker-kill", "broker-kill.log", "broker-powerloss"]


def test_cli_runs_the_broker_variant_and_the_storage_one_stays_the_default(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.broker.cli", "crashtest", "broker", "--data-dir",
         str(tmp_path), "--iterations", "1", "--mode", "powerloss", "--seed", "7",
         "--no-progress"], capture_output=True, text=True, timeout=CLI_DEADLINE_S, check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0] == "crashtest broker: seed 7"
    assert SUMMARY.match(lines[-1]) is not None
    assert lines[-1].endswith(" 0 violations")
    assert "Traceback" not in done.stderr
    storage = subprocess.run(
        [sys.executable, "-m", "magnetar.broker.cli", "crashtest", "--iterations", "1"],
        capture_output=True, text=True, timeout=CLI_DEADLINE_S, check=False)
    assert storage.returncode == 2
    assert storage.stderr == ("magnetar crashtest: the following arguments are required: "
                              "--data-dir (see magnetar crashtest --help)\n")


def test_the_checks_catch_a_lost_publish_and_a_lost_dedup_state(tmp_path: Path) -> None:
    """A record claiming more than the broker stored must be reported: the checks can fail."""
    broker = InProcessBroker(str(tmp_path / "data"), SimFileSystem(3))
    topic = "persistent://public/default/doctored"
    seed = 11
    book = AckBook()
    try:
        client = pulsar.Client(broker.url)
        try:
            producer = client.create_producer(topic, producer_name="single")
            for sequence_id in (1, 2, 3):
                producer.send(message_payload(seed, ("single", sequence_id)),
                              sequence_id=sequence_id)
        finally:
            client.close()
        for sequence_id in (1, 2, 3, 4):  # 4 never reached the broker
            book.sending(("single", sequence_id))
            book.published(("single", sequence_id), True)
        result = verify_after_restart(broker.url, topic, seed, book, random.Random(1),
                                      drain_deadline_s=1.0)
    finally:
        broker.stop()
    lines = [line for _, line in result.violations]
    assert "producer single: last_sequence_id 3 after the restart, below its last " \
           "acknowledged 4" in lines
    assert "acknowledged publishes missing from the topic: 1 (single:4)" in lines
    # The subscriptions never existed before: created now, they miss all four.
    assert any(line.startswith("subscription shared: acknowledged publishes") for line in lines)
    assert result.acknowledged_verified == 3
    assert result.resends_dropped == 3  # the sampled acknowledged resends: all duplicates


def test_the_retry_check_catches_a_lost_retry_and_a_stray_copy(tmp_path: Path) -> None:
    """Our client's real retry flow on the `retry` subscription, with a record doctored to
    claim a reconsume that stored no copy, and a copy nobody asked for: both reported, and
    the genuine retries, ack and dead-lettering counted in their states."""
    broker = InProcessBroker(str(tmp_path / "data"), SimFileSystem(5))
    topic = "persistent://public/default/retried"
    seed = 13
    book = AckBook()
    keys = [("single", n) for n in range(1, 6)]
    try:
        ours = magnetar.Client(broker.url)
        official = pulsar.Client(broker.url)
        try:
            consumer = ours.subscribe(
                topic, "retry", consumer_type=magnetar.ConsumerType.Shared, retry_enable=True,
                dead_letter_policy=magnetar.ConsumerDeadLetterPolicy(
                    max_redeliver_count=RETRIES_MAX, initial_subscription_name="dlq"))
            producer = official.create_producer(topic, producer_name="single")
            for key in keys:
                producer.send(message_payload(seed, key), sequence_id=key[1])
                book.sending(key)
                book.published(key, True)
            originals = {}
            for _ in keys:
                message = consumer.receive(RECEIVE_MS)
                key = message_key_of(message.data())
                assert key is not None
                originals[key] = message
                book.origin(key, str(message.codec_id))
            retry_once, acked, doctored, stray, dead = keys
            _reconsume(consumer, book, retry_once, originals[retry_once], 0)
            assert consumer.receive(RECEIVE_MS).properties()["RECONSUMETIMES"] == "1"
            book.retry_acted(acked, 0, "ack")
            consumer.acknowledge(originals[acked])
            book.retry_acted(doctored, 0, "reconsumed")  # the record lies: no copy stored
            consumer.acknowledge(originals[doctored])
            message = originals[dead]
            for generation in range(RETRIES_MAX + 1):  # the last one is dead-lettered
                _reconsume(consumer, book, dead, message, generation)
                if generation < RETRIES_MAX:
                    message = consumer.receive(RECEIVE_MS)
                    assert message_key_of(message.data()) == dead
            consumer.close()  # sends the pending acks; the stray copy must not reach it
            official.create_producer(f"{topic}-retry-RETRY").send(
                message_payload(seed, stray), properties={
                    "RECONSUMETIMES": "1", "REAL_TOPIC": "persistent://public/default/x",
                    "ORIGIN_MESSAGE_ID": str(originals[stray].codec_id)})
        finally:
            ours.close()
            official.close()
        result = verify_after_restart(broker.url, topic, seed, book, random.Random(1),
                                      drain_deadline_s=1.0)
    finally:
        broker.stop()
    lines = [line for _, line in result.violations]
    assert "retry topic: copies the consumer never asked for: 1 (single:4)" in lines
    assert "retry topic: copies with a wrong REAL_TOPIC: 1 (single:4)" in lines
    assert "subscription retry: messages reconsumed (the copy's publish acknowledged before " \
           "the ack) found neither as RECONSUMETIMES 1 nor later: 1 (single:3)" in lines
    assert not [line for line in lines if "dead-letter" in line or "ORIGIN" in line], lines
    assert result.retry_states == {"acknowledged": 1, "acknowledged after a retry": 0,
                                   "on the topic": 1, "in the retry topic": 1,
                                   "dead-lettered": 1}
    assert (result.retried_verified, result.dead_lettered_verified) == (2, 1)
    assert result.retry_duplicates == 1  # single:4: the original and the stray copy


def _reconsume(consumer: magnetar.Consumer, book: AckBook, key: MessageKey,
               message: magnetar.Message, generation: int) -> None:
    book.retry_acted(key, generation, "reconsume")
    consumer.reconsume_later(message, 0)
    book.retry_acted(key, generation, "reconsumed")


@pytest.mark.slow
def test_long_run_of_both_modes_finds_no_violation(tmp_path: Path) -> None:
    lines, kills, powerlosses = run(tmp_path, 40, "both", seed=2024, crash_after_s_max=2.0)
    assert (kills, powerlosses) == (20, 20)
    assert lines[-1].endswith(" 0 violations")
