"""The client-ceiling benchmark (`benchmarks/client_ceiling.py`): its do-nothing broker
answers what the official client needs to publish, in every mode the workloads use, and its
verdicts follow from the figures (the sync row's model included). No timing thresholds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pulsar  # type: ignore[import-untyped]
import pytest

from .._scripts import load_script

pytestmark = pytest.mark.interop

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def _ceiling() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # its sibling modules (bench_e2e, e2e_peers)
    return load_script(BENCHMARKS / "client_ceiling.py", "client_ceiling")


def test_the_null_broker_receipts_sync_async_and_batched_sends(tmp_path: Path) -> None:
    ceiling = _ceiling()
    server = ceiling.NullBrokerProcess(str(tmp_path))
    server.start()
    try:
        client = pulsar.Client(server.url, operation_timeout_seconds=10,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            plain = client.create_producer("persistent://public/default/null-plain",
                                           batching_enabled=False)
            ids = [plain.send(os.urandom(1024)) for _ in range(5)]
            assert [i.entry_id() for i in ids] == list(range(5))
            batched = client.create_producer("persistent://public/default/null-batched",
                                             batching_enabled=True,
                                             batching_max_messages=50)
            results: list[Any] = []
            for _ in range(200):
                batched.send_async(b"x" * 100, lambda result, _id: results.append(result))
            batched.flush()
            assert results == [pulsar.Result.Ok] * 200
            plain.close()
            batched.close()
        finally:
            client.close()
    finally:
        server.stop()
    assert server.process is not None
    assert server.process.returncode is not None


def _document(null_sync_per_s: float) -> dict[str, Any]:
    def workload(per_s: float, p99_ms: float = 0.0) -> dict[str, Any]:
        return {"per_s": per_s, "stalled": False, "p50_ms": 0.0, "p99_ms": p99_ms,
                "client_cpu_us_per_message": 10.0, "server_cpu_us_per_message": 2.0,
                "client_cores": 0.5}

    servers = {name: {"batched publish": workload(rate), "unbatched publish": workload(rate),
                      "sync publish": workload(1000.0), "publish latency": workload(0, 5.0)}
               for name, rate in (("magnetar", 30_000.0), ("pulsar-lite", 20_000.0),
                                  ("null", 60_000.0))}
    servers["null"]["sync publish"] = workload(null_sync_per_s)
    servers["null"]["publish latency"] = workload(0, 1.0)
    return {"fsync_append_per_s": 5000.0, "fsync_append_p99_ms": 0.5,
            "fsync_overwrite_per_s": 10_000.0, "servers": servers}


def test_the_verdicts_follow_from_the_figures() -> None:
    ceiling = _ceiling()
    rows = {row["target"]: row for row in ceiling.targets(_document(null_sync_per_s=40_000.0))}
    batched = rows["batched publish, x pulsar-lite"]
    assert batched["values"]["null"] == 3.0
    assert batched["reachable_with_this_client"]
    assert rows["unbatched publish, msg/s"]["reachable_with_this_client"]
    latency = rows["latency p99 at 5,000/s, ms"]
    assert latency["goal"] == 3.5
    assert latency["reachable_with_this_client"]
    # One message in flight: the null round trip (25 us) plus one preallocated fdatasync
    # (100 us) is 8,000/s, 1.6x the 5,000/s growing-file rate.
    sync = rows["sync publish, x raw fsync"]
    assert sync["values"]["null"] == pytest.approx(1.6)
    assert sync["values"]["magnetar"] == pytest.approx(0.2)
    assert sync["reachable_with_this_client"]
    # A slower client round trip (250 us): 1 / (250 + 100 us) = 2,857/s, 0.57x: not reachable.
    slow = {row["target"]: row for row in ceiling.targets(_document(null_sync_per_s=4000.0))}
    assert slow["sync publish, x raw fsync"]["values"]["null"] == pytest.approx(0.5714, 1e-3)
    assert not slow["sync publish, x raw fsync"]["reachable_with_this_client"]
    document = _document(null_sync_per_s=4000.0)
    document["targets"] = ceiling.targets(document)
    text = ceiling.render(document)
    sync_line = next(line for line in text.splitlines() if line.startswith("sync publish"))
    assert sync_line.endswith("NO")
    assert "0.57" in sync_line


def test_a_bad_option_is_one_line() -> None:
    run = subprocess.run([sys.executable, str(BENCHMARKS / "client_ceiling.py"),
                          "--seconds", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--seconds must be positive, not 0.0" in run.stderr
    assert "Traceback" not in run.stderr
