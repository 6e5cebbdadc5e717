"""One process owns a data directory: a second process gets a `DataDirLockedError` naming
the directory and the owner's PID; the lock goes with the owner (close or kill -9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.storage import DataDirLockedError, Storage
from tests.storage.helpers import WAIT_SECONDS_MAX, small_config

REPO = Path(__file__).resolve().parents[2]

# The owner: opens the directory, acknowledges some entries, reports, and waits for a line
# on stdin before closing.
OWNER = """
import sys
from magnetar.storage import Storage, StorageConfig
config = StorageConfig(lmdb_map_bytes=256 << 20, journal_prealloc_bytes=64 << 10)
store = Storage.open(sys.argv[1], config)
ledger = store.create_ledger().result(30)
for i in range(int(sys.argv[2])):
    store.add_entry(ledger, b"owner-%d" % i).result(30)
print(f"ready {ledger}", flush=True)
sys.stdin.readline()
store.close()
print("closed", flush=True)
"""

# The contender: tries to open the directory and reports what happened as JSON.
CONTENDER = """
import json, sys
from magnetar.storage import DataDirLockedError, Storage, StorageConfig
try:
    Storage.open(sys.argv[1], StorageConfig(lmdb_map_bytes=256 << 20)).close()
    print(json.dumps({"opened": True}))
except DataDirLockedError as exc:
    print(json.dumps({"opened": False, "message": str(exc), "owner_pid": exc.owner_pid,
                      "data_dir": exc.data_dir}))
"""


def python(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A child process that owns `tmp_path` and has acknowledged 5 entries."""
    with python(OWNER, str(tmp_path), "5") as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("ready "), f"owner failed to start: {line!r}"
            yield process, int(line.split()[1])
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(WAIT_SECONDS_MAX)


def release(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write("\n")
    process.stdin.flush()
    assert process.stdout.readline() == "closed\n"
    assert process.wait(WAIT_SECONDS_MAX) == 0


def test_second_process_is_refused_with_the_owner_named(
        tmp_path: Path, owner: tuple[subprocess.Popen[str], int]) -> None:
    process, ledger = owner
    with pytest.raises(DataDirLockedError) as caught:
        Storage.open(tmp_path, small_config())
    error = caught.value
    assert error.owner_pid == process.pid
    assert error.data_dir == str(tmp_path)
    assert str(tmp_path) in str(error)
    assert f"process {process.pid}" in str(error)
    assert (tmp_path / "LOCK").read_text().strip() == str(process.pid)

    release(process)
    with Storage.open(tmp_path, small_config()) as store:
        assert store.read_entries(ledger, 0, 4) == [b"owner-%d" % i for i in range(5)]


def test_lock_is_released_when_the_owner_is_killed(
        tmp_path: Path, owner: tuple[subprocess.Popen[str], int]) -> None:
    process, ledger = owner
    process.kill()  # kill -9: no close, no checkpoint
    process.wait(WAIT_SECONDS_MAX)
    with Storage.open(tmp_path, small_config()) as store:
        assert store.last_add_confirmed(ledger) == 4
        assert store.read_entries(ledger, 0, 4) == [b"owner-%d" % i for i in range(5)]
        assert store.check().ok


def test_other_process_is_refused_while_we_own_it(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, small_config())
    try:
        contender = python(CONTENDER, str(tmp_path))
        out, _ = contender.communicate(timeout=WAIT_SECONDS_MAX)
        report = json.loads(out)
        assert report["opened"] is False
        assert report["owner_pid"] == os.getpid()
        assert report["data_dir"] == str(tmp_path)
        assert f"{tmp_path} is locked by process {os.getpid()}" in report["message"]
    finally:
        store.close()
    contender = python(CONTENDER, str(tmp_path))
    out, _ = contender.communicate(timeout=WAIT_SECONDS_MAX)
    assert json.loads(out) == {"opened": True}


def test_refused_open_leaves_the_owner_undisturbed(tmp_path: Path) -> None:
    store = Storage.open(tmp_path, small_config())
    ledger = store.create_ledger().result(10)
    contender = python(CONTENDER, str(tmp_path))
    out, _ = contender.communicate(timeout=WAIT_SECONDS_MAX)
    assert json.loads(out)["opened"] is False
    assert store.add_entry(ledger, b"still mine").result(10) == 0
    assert (tmp_path / "LOCK").read_text().strip() == str(os.getpid())
    store.close()
