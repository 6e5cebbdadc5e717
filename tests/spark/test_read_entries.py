"""The batch reader's range read (`_read.read_arrow`) without Spark, on a broker of its own:
a chunked message in the middle of a range hands the rest of the range to the client's
reader (which reassembles chunks), and no row is lost or repeated at the hand-over."""

from __future__ import annotations

from pathlib import Path

import magnetar
from magnetar._standalone import StandaloneBroker
from magnetar.broker import BrokerConfig
from magnetar.spark._broker import last_position
from magnetar.spark._host import Endpoints
from magnetar.spark._options import EARLIEST
from magnetar.spark._read import RangePartition, read_arrow

TOPIC = "persistent://public/default/chunks"


def test_a_chunked_message_mid_range(tmp_path: Path) -> None:
    config = BrokerConfig(max_message_size_bytes=64 * 1024)
    big = bytes(range(256)) * 800  # 200 KiB: four chunks
    with StandaloneBroker(tmp_path, config) as broker, \
            magnetar.Client(broker.service_url) as client:
        batched = client.create_producer(TOPIC, batching_enabled=True)
        for i in range(5):
            batched.send_async(b"a%d" % i, None)
        batched.flush()
        chunked = client.create_producer(TOPIC, batching_enabled=False, chunking_enabled=True)
        chunked.send(big)
        for i in range(5):
            batched.send_async(b"b%d" % i, None)
        batched.flush()
        end = last_position(client, TOPIC)
        part = RangePartition(TOPIC, EARLIEST, end, Endpoints(broker.service_url, None), True,
                              10_000)
        values = [v for batch in read_arrow(part) for v in batch.column("value").to_pylist()]
    assert values == [b"a%d" % i for i in range(5)] + [big] + [b"b%d" % i for i in range(5)]
