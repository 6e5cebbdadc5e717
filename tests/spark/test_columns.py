"""The batch reader's bulk decoder (`magnetar.spark._columns`): entries built with the codec,
decoded into Arrow columns, compared with what each message holds. Each shape takes its own
path: same-size batches (numpy), simple batches (the walk), anything else (the codec's
general decoder), non-batched entries, and cuts of an entry to a range."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from magnetar.codec import CompressionType, SingleMessage, build_batch, build_message
from magnetar.spark._columns import Columns, _bodies, _uniform_bodies

TOPIC = "persistent://public/default/t-partition-3"


def _batch(messages: list[SingleMessage], **kwargs: Any) -> tuple[Any, bytes]:
    return build_batch(messages, producer_name="p", publish_time=1_700_000_000_000, **kwargs)


def _rows(columns: Columns) -> list[dict[str, Any]]:
    batch = columns.take()
    assert batch.schema == columns.schema
    return batch.to_pylist()


def test_same_size_batch_is_cut_and_numbered() -> None:
    messages = [SingleMessage(payload=bytes([i]) * 100, sequence_id=200 + i) for i in range(50)]
    metadata, payload = _batch(messages)
    assert _uniform_bodies(payload, 50) is not None  # the numpy path
    columns = Columns(TOPIC, 3)
    assert columns.add(7, 9, metadata, payload, 10, 20) == 10
    rows = _rows(columns)
    assert [r["value"] for r in rows] == [bytes([i]) * 100 for i in range(10, 20)]
    assert [r["messageId"] for r in rows] == [f"7:9:{i}" for i in range(10, 20)]
    first = rows[0]
    assert (first["key"], first["eventTime"], first["properties"]) == (None, None, [])
    assert (first["topic"], first["partition"], first["producerName"]) == (TOPIC, 3, "p")
    assert round(first["publishTime"].timestamp() * 1000) == 1_700_000_000_000


def test_varied_sizes_walk_and_general_messages_line_up() -> None:
    simple = [SingleMessage(payload=b"x" * (i * 37 % 300), sequence_id=i) for i in range(40)]
    _, simple_payload = _batch(simple)
    assert _uniform_bodies(simple_payload, 40) is None
    assert _bodies(simple_payload, 40) == [m.payload for m in simple]
    rich = [SingleMessage(payload=b"r%d" % i, partition_key=f"k{i}", properties={"i": str(i)},
                          event_time=1000 + i) for i in range(3)]
    rich.append(SingleMessage(payload=None, partition_key=base64.b64encode(b"\x00\xff").decode(),
                              partition_key_b64_encoded=True))
    columns = Columns(TOPIC, 3)
    columns.add(1, 0, *_batch(simple), 0, 1 << 31)
    columns.add(1, 1, *_batch(rich), 0, 1 << 31)
    single, body = build_message(SingleMessage(payload=b"alone", partition_key="solo"),
                                 producer_name="q", publish_time=5)
    columns.add(1, 2, single, body, 0, 1)
    rows = _rows(columns)
    assert len(rows) == 40 + 4 + 1
    assert [r["value"] for r in rows[:40]] == [m.payload for m in simple]
    assert all(r["key"] is None and r["eventTime"] is None for r in rows[:40])
    assert [r["key"] for r in rows[40:]] == [b"k0", b"k1", b"k2", b"\x00\xff", b"solo"]
    assert rows[43]["value"] is None
    assert [r["properties"] for r in rows[40:43]] == [[("i", str(i))] for i in range(3)]
    assert round(rows[41]["eventTime"].timestamp() * 1000) == 1001
    assert [r["messageId"] for r in rows[39:]] == ["1:0:39", "1:1:0", "1:1:1", "1:1:2", "1:1:3",
                                                    "1:2:-1"]
    assert rows[-1]["producerName"] == "q"


def test_a_sequence_field_followed_by_another_field_is_not_taken_for_simple() -> None:
    """`sequence_id` then `event_time` has the byte length of a longer sequence id: the fast
    paths must not read it as one (the event time would be lost)."""
    messages = [SingleMessage(payload=b"v" * 10, sequence_id=5, event_time=7) for _ in range(4)]
    metadata, payload = _batch(messages)
    assert _uniform_bodies(payload, 4) is None
    assert _bodies(payload, 4) is None
    columns = Columns(TOPIC, 3)
    columns.add(2, 2, metadata, payload, 0, 4)
    assert [round(r["eventTime"].timestamp() * 1000) for r in _rows(columns)] == [7] * 4


@pytest.mark.parametrize("compression", [CompressionType.LZ4, CompressionType.ZLIB])
def test_compressed_batch(compression: CompressionType) -> None:
    messages = [SingleMessage(payload=b"c" * 64, sequence_id=i) for i in range(30)]
    metadata, payload = _batch(messages, compression=compression)
    columns = Columns(TOPIC, 3)
    assert columns.add(3, 4, metadata, payload, 25, 1 << 31) == 5
    assert [r["messageId"] for r in _rows(columns)] == [f"3:4:{i}" for i in range(25, 30)]
