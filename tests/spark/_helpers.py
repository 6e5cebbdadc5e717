"""Publishing and admin calls the Spark tests share."""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

import magnetar


def publish(client: magnetar.Client, topic: str, count: int, *, first: int = 0,
            batching: bool = True, keys: int = 7) -> list[bytes]:
    """Publish `count` messages `v<i>` (key `k<i % keys>`, property i); their values."""
    producer = client.create_producer(topic, batching_enabled=batching,
                                      block_if_queue_full=True)
    values = []
    for i in range(first, first + count):
        value = f"v{i}".encode()
        producer.send_async(value, None, partition_key=f"k{i % keys}",
                            properties={"i": str(i)}, event_timestamp=1_700_000_000_000 + i)
        values.append(value)
    producer.flush()
    producer.close()
    return values


def admin(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text.strip() else None


def topic_path(topic: str) -> str:
    return "/admin/v2/" + topic.replace("://", "/")


def read_all(client: magnetar.Client, topic: str) -> list[magnetar.Message]:
    """Every message stored on `topic` (all partitions), read with our client."""
    out = []
    for part in client.get_topic_partitions(topic):
        reader = client.create_reader(part, magnetar.MessageId.earliest)
        try:
            while reader.has_message_available():
                out.append(reader.read_next(10_000))
        finally:
            reader.close()
    return out


def retention_pass(data_dir: str) -> None:
    """One pass of the retention check of the broker the driver serves on `data_dir` (it
    runs 1 s after the broker starts, then every retentionCheckIntervalInSeconds)."""
    from magnetar.spark import _host

    broker = _host._brokers[os.path.realpath(data_dir)][0]
    service = broker._state["transport"].service
    broker._thread.run(service.run_maintenance(force=True))
