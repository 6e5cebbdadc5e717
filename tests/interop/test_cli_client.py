"""`magnetar produce` and `magnetar consume` in subprocesses against a real broker: their exit
status is the command's (0 done, 1 fewer messages than asked), never the official client's
abort at exit ("terminate called without an active exception", status 134), which a Python
logger handed to the client caused on most runs; Ctrl-C ends `consume` at once (exit 130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from . import REPO_ROOT, BrokerProcess, interruptible_child

pytestmark = pytest.mark.interop

CLI_DEADLINE_S = 60  # one `magnetar produce|consume` run, generous


def _magnetar(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "magnetar.broker.cli", *argv], capture_output=True,
                          text=True, check=False, timeout=CLI_DEADLINE_S, cwd=REPO_ROOT)


def test_produce_and_consume_exit_with_their_own_status(broker: BrokerProcess) -> None:
    topic = f"cli-exit-{uuid.uuid4().hex[:8]}"
    url = ["--url", broker.url, "--timeout-s", "1"]
    quiet = _magnetar("consume", topic, "-s", "sub", *url)  # creates the subscription
    assert (quiet.returncode, quiet.stderr) == (1, "no message within 1.0 s; 0 received\n")
    produced = _magnetar("produce", topic, "-m", "one", "-m", "two", *url)
    assert (produced.returncode, produced.stderr) == (0, "")
    assert produced.stdout == "2 messages successfully produced\n"
    consumed = _magnetar("consume", topic, "-s", "sub", "-n", "2", *url)
    assert (consumed.returncode, consumed.stderr) == (0, "")
    assert consumed.stdout.endswith("2 messages successfully consumed\n")


INTERRUPT_DEADLINE_S = 10.0  # generous: consume notices Ctrl-C within RECEIVE_SLICE_S


def test_ctrl_c_ends_consume_at_once_without_a_traceback(broker: BrokerProcess) -> None:
    topic = f"cli-interrupt-{uuid.uuid4().hex[:8]}"
    consume = subprocess.Popen(
        [sys.executable, "-m", "magnetar.broker.cli", "consume", topic, "-s", "sub", "-n", "0",
         "-p", "Earliest", "--timeout-s", "120", "--url", broker.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"), preexec_fn=interruptible_child)
    try:
        produced = _magnetar("produce", topic, "-m", "hello", "--url", broker.url)
        assert produced.returncode == 0, produced.stderr
        assert consume.stdout is not None
        assert consume.stdout.readline().startswith("----- message ")  # in its receive loop
        consume.send_signal(signal.SIGINT)
        began = time.monotonic()
        _, err = consume.communicate(timeout=INTERRUPT_DEADLINE_S)
        assert time.monotonic() - began < INTERRUPT_DEADLINE_S
    finally:
        if consume.poll() is None:
            consume.kill()
            consume.communicate(timeout=INTERRUPT_DEADLINE_S)
    assert "Traceback" not in err
    assert consume.returncode == 130
