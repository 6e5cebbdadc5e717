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

from magnetar.broker.testing._crash_book import AckBook, message_payload
from magnetar.broker.testing._crash_brokers import InProcessBroker
from magnetar.broker.testing._crash_check import verify_after_restart
from magnetar.broker.testing.crashtest import BrokerCrashTestOptions, run_broker_crashtest
from magnetar.storage.testing.simfs import SimFileSystem

SUMMARY = re.compile(
    r"^crashtest broker: (\d+) iterations, (\d+) acknowledged messages verified, (\d+) "
    r"violations$")
RECEIPTS = re.compile(r"^crashtest broker: acks with a receipt verified: (\d+); ")
CLI_DEADLINE_S = 240


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
    assert summary.group(3) == "0"
    assert int(summary.group(2)) > 0  # the workload published and the checks read it back
    receipts = RECEIPTS.match(lines[-3])
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


@pytest.mark.slow
def test_long_run_of_both_modes_finds_no_violation(tmp_path: Path) -> None:
    lines, kills, powerlosses = run(tmp_path, 40, "both", seed=2024, crash_after_s_max=2.0)
    assert (kills, powerlosses) == (20, 20)
    assert lines[-1].endswith(" 0 violations")
