"""What only the embedded transport has: the data directory's lock, restarts in one process,
and closing at interpreter exit. Subprocesses run `python -c` scripts; each wait is bounded."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import magnetar
from magnetar import InitialPosition, MessageId
from magnetar.broker import BrokerConfig
from tests.interop import REPO_ROOT

from .test_produce_consume import RECEIVE_MS, drain

SUBPROCESS_DEADLINE_S = 60


def _python(script: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO_ROOT,
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


def read_all(data_dir: Path, topic: str) -> list[bytes]:
    with magnetar.Client(str(data_dir)) as client:
        reader = client.create_reader(topic, MessageId.earliest)
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(RECEIVE_MS).data())
        return out


def test_import_magnetar_loads_neither_broker_nor_storage() -> None:
    probe = _python("""
        import sys, magnetar
        magnetar.Client, magnetar.MessageId, magnetar.Timeout
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('broker', 'storage')))
    """)
    out, err = probe.communicate(timeout=SUBPROCESS_DEADLINE_S)
    assert probe.returncode == 0, err
    assert out.strip() == "[]"


def test_dedup_across_an_embedded_restart(tmp_path: Path) -> None:
    data, topic = tmp_path / "data", "persistent://public/default/dedup"
    config = BrokerConfig(broker_deduplication_enabled=True)
    with magnetar.Client(str(data), broker_config=config) as client:
        producer = client.create_producer(topic, producer_name="p")
        for i in range(5):
            producer.send(f"m{i}".encode())
    with magnetar.Client(str(data), broker_config=config) as client:
        producer = client.create_producer(topic, producer_name="p")
        assert producer.last_sequence_id() == 4  # from the broker's dedup state
        producer.send(b"duplicate", sequence_id=3)  # dropped, yet acknowledged
        producer.send(b"m5")  # sequence id 5
        assert producer.last_sequence_id() == 5
        consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
        assert [m.data() for m in drain(consumer, 6)] == [f"m{i}".encode() for i in range(6)]


def test_a_batched_resend_keeps_the_new_messages_after_the_duplicates(tmp_path: Path) -> None:
    """A producer resending ids 0..9 of which the broker stored 0..5 (a retried job): the
    first new message must not share a batch with the last duplicate (the broker judges a
    batch by its lowest id and would drop 6..9 with it)."""
    data, topic = tmp_path / "data", "persistent://public/default/dedup-batched"
    config = BrokerConfig(broker_deduplication_enabled=True)
    with magnetar.Client(str(data), broker_config=config) as client:
        for count in (6, 10):
            producer = client.create_producer(topic, producer_name="p", batching_enabled=True,
                                              batching_max_publish_delay_ms=60_000)
            for i in range(count):
                producer.send_async(f"m{i}".encode(), None, sequence_id=i)
            producer.flush()
            producer.close()
        consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
        assert [m.data() for m in drain(consumer, 10)] == [f"m{i}".encode() for i in range(10)]


def test_a_second_process_is_told_who_owns_the_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner = _python(f"""
        import sys, magnetar
        client = magnetar.Client({str(data)!r})
        print("ready", flush=True)
        sys.stdin.readline()
        client.close()
    """)
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "ready"
        with pytest.raises(magnetar.ConnectError) as caught:
            magnetar.Client(str(data))
        text = str(caught.value)
        assert f"process {owner.pid}" in text
        assert "magnetar standalone" in text
    finally:
        owner.communicate("\n", timeout=SUBPROCESS_DEADLINE_S)
    assert owner.returncode == 0


def test_interpreter_exit_with_an_open_client_closes_it(tmp_path: Path) -> None:
    """No close(): the exit hook flushes the open batch, closes the broker and storage; the
    process neither hangs nor crashes, and a later client reads every message."""
    data, topic = tmp_path / "data", "persistent://public/default/at-exit"
    script = _python(f"""
        import magnetar
        client = magnetar.Client({str(data)!r})
        producer = client.create_producer({topic!r})
        producer.send(b"sent")
        batched = client.create_producer({topic!r}, batching_enabled=True,
                                         batching_max_publish_delay_ms=600000)
        batched.send_async(b"pending at exit", None)
        consumer = client.subscribe({topic!r}, "sub")
        print("done", flush=True)
    """)
    out, err = script.communicate(timeout=SUBPROCESS_DEADLINE_S)
    assert script.returncode == 0, err
    assert out.strip() == "done"
    assert "Traceback" not in err
    assert read_all(data, topic) == [b"sent", b"pending at exit"]


def test_a_forked_child_cannot_use_the_parents_client(tmp_path: Path) -> None:
    """After fork the child has no loop thread: its calls raise AlreadyClosed at once (no
    hang), its exit touches nothing of the parent's, and the parent carries on."""
    data, topic = tmp_path / "data", "persistent://public/default/fork"
    script = _python(f"""
        import os, sys, magnetar
        client = magnetar.Client({str(data)!r})
        producer = client.create_producer({topic!r})
        producer.send(b"before")
        pid = os.fork()
        if pid == 0:
            try:
                producer.send(b"child")
            except magnetar.AlreadyClosed:
                sys.exit(7)
            sys.exit(1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
        producer.send(b"after")
        client.close()
    """)
    out, err = script.communicate(timeout=SUBPROCESS_DEADLINE_S)
    assert script.returncode == 0, err
    assert out.strip() == "7"
    assert read_all(data, topic) == [b"before", b"after"]
