"""`magnetar produce` and `magnetar consume` in subprocesses against a real broker: their exit
status is the command's (0 done, 1 fewer messages than asked), never the official client's
abort at exit ("terminate called without an active exception", status 134), which a Python
logger handed to the client caused on most runs."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from . import REPO_ROOT, BrokerProcess

pytestmark = pytest.mark.interop

CLI_DEADLINE_S = 60  # one `magnetar produce|consume` run, generous


def _magnetar(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker.cli", *argv], capture_output=True,
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
