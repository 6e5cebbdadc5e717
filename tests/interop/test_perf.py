"""`magnetar perf produce|consume` in subprocesses against a real broker with small counts:
the JSON carries the figures, the counts match, a consume run receives and acknowledges what
a produce run sent (backlog and live), the rate limit holds its schedule, Ctrl-C prints the
summary so far, and an unreachable broker is one line, exit 1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from . import REPO_ROOT, BrokerProcess, free_port, interruptible_child

pytestmark = pytest.mark.interop

RUN_DEADLINE_S = 90  # one perf run with small counts, generous for a loaded machine
LIVE_LINE = re.compile(
    r"^\[ +\d+\.\d s\] (produce|consume) +[\d,]+\.\d msg/s +\d+\.\d{3} MB/s \| latency ms "
    r"p50 [\d.]+ p99 [\d.]+ p99\.9 [\d.]+ max [\d.]+ \| (sent|received) [\d,]+")
SUMMARY_FIELDS = {"command", "options", "messages", "bytes", "failed", "unconfirmed",
                  "seconds", "msg_per_s", "mb_per_s", "latency_ms", "latency_measured",
                  "latency_relative_error", "intervals", "interrupted", "url"}
LATENCY_FIELDS = {"count", "mean", "min", "p50", "p95", "p99", "p99.9", "p99.99", "max"}


def _command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "magnetar.broker.cli", "perf", *argv]


def _perf(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(*argv), capture_output=True, text=True, check=False,
                          timeout=RUN_DEADLINE_S, cwd=REPO_ROOT)


def _popen(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(_command(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                            preexec_fn=interruptible_child)


def _document(path: Path, command: str, messages: int) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert set(document) >= SUMMARY_FIELDS
    assert document["command"] == command
    assert document["messages"] == messages
    assert document["latency_ms"]["count"] == messages
    assert set(document["latency_ms"]) == LATENCY_FIELDS
    latency = document["latency_ms"]
    assert 0 <= latency["min"] <= latency["p50"] <= latency["p99"] <= latency["max"]
    assert document["interrupted"] is False
    assert sum(interval["messages"] for interval in document["intervals"]) == messages
    return document


def test_consume_receives_the_backlog_produce_sent(broker: BrokerProcess,
                                                  tmp_path: Path) -> None:
    topic = f"perf-backlog-{uuid.uuid4().hex[:8]}"
    url = ["-u", broker.url]
    produced = _perf("produce", topic, *url, "-t", "2", "-n", "2", "-m", "400", "-r", "0",
                     "-s", "100", "--json", str(tmp_path / "p.json"))
    assert (produced.returncode, produced.stderr) == (0, ""), produced.stderr
    document = _document(tmp_path / "p.json", "produce", 400)
    assert (document["bytes"], document["failed"], document["unconfirmed"]) == (40_000, 0, 0)
    assert document["options"]["topics"] == [f"{topic}-0", f"{topic}-1"]
    assert document["url"] == broker.url
    assert "400 messages receipted" in produced.stdout

    consumed = _perf("consume", topic, *url, "-t", "2", "-n", "2", "-st", "Shared", "-sp",
                     "Earliest", "-m", "400", "-d", "60", "--json", str(tmp_path / "c.json"))
    assert (consumed.returncode, consumed.stderr) == (0, ""), consumed.stderr
    document = _document(tmp_path / "c.json", "consume", 400)
    assert document["bytes"] == 40_000
    assert "400 messages received" in consumed.stdout

    # every one was acknowledged: the subscription has nothing left
    again = _perf("consume", topic, *url, "-t", "2", "-n", "2", "-st", "Shared", "-m", "1",
                  "-d", "0.5")
    assert again.returncode == 1
    assert again.stderr == "magnetar perf consume: 0 of 1 messages within 0.5 s\n"


def test_a_live_consumer_gets_what_a_rate_limited_producer_sends(
        broker: BrokerProcess, tmp_path: Path) -> None:
    topic = f"perf-live-{uuid.uuid4().hex[:8]}"
    consume = _popen("consume", topic, "-u", broker.url, "-m", "300", "-d", "60",
                     "--report-interval-s", "0.1", "--json", str(tmp_path / "c.json"))
    try:
        assert consume.stdout is not None
        assert consume.stdout.readline().startswith("perf consume: subscribed 1 consumer")
        produced = _perf("produce", topic, "-u", broker.url, "-m", "300", "-r", "1000",
                         "--disable-batching", "--report-interval-s", "0.1",
                         "--json", str(tmp_path / "p.json"))
        out, err = consume.communicate(timeout=RUN_DEADLINE_S)
    finally:
        if consume.poll() is None:
            consume.kill()
            consume.communicate(timeout=RUN_DEADLINE_S)
    assert (produced.returncode, produced.stderr) == (0, ""), produced.stderr
    assert (consume.returncode, err) == (0, ""), err
    produce_doc = _document(tmp_path / "p.json", "produce", 300)
    _document(tmp_path / "c.json", "consume", 300)
    # the schedule sends message i at i ms: the last receipt cannot come before 299 ms
    assert produce_doc["seconds"] >= 0.299
    assert produce_doc["latency_measured"].endswith("intended send time (rate-limited)")
    for output in (produced.stdout, out):
        live = [line for line in output.splitlines() if line.startswith("[")]
        assert live, output
        assert all(LIVE_LINE.match(line) for line in live), live


def test_ctrl_c_prints_the_summary_so_far(broker: BrokerProcess, tmp_path: Path) -> None:
    topic = f"perf-interrupt-{uuid.uuid4().hex[:8]}"
    produce = _popen("produce", topic, "-u", broker.url, "-r", "200",
                     "--report-interval-s", "0.2", "--json", str(tmp_path / "p.json"))
    try:
        assert produce.stdout is not None
        first = produce.stdout.readline()
        assert LIVE_LINE.match(first), first
        produce.send_signal(signal.SIGINT)
        out, err = produce.communicate(timeout=RUN_DEADLINE_S)
    finally:
        if produce.poll() is None:
            produce.kill()
            produce.communicate(timeout=RUN_DEADLINE_S)
    assert (produce.returncode, err) == (0, ""), err
    summary = re.search(r"perf produce: ([\d,]+) messages receipted .*; 0 failed; interrupted",
                        out)
    assert summary is not None, out
    document = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert document["interrupted"] is True
    assert document["messages"] == int(summary.group(1).replace(",", "")) > 0


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_an_unreachable_broker_is_one_line_and_status_1(command: str) -> None:
    url = f"pulsar://127.0.0.1:{free_port()}"
    run = _perf(command, "perf-nobody", "-u", url, "--timeout-s", "1")
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"magnetar perf {command}: failed against {url}: ")
