"""Arrow columns of the row schema built in bulk from whole entries (see `_entries.py`).

Theory of operation
-------------------
Reading a message at a time costs a few microseconds of Python per row; the batch reader's
budget is about one. So `Columns` takes whole entries and does per row only what cannot be
done per entry or by pyarrow:

* A batch's payload is walked once (`_bodies`). Producers that set no key, properties or event
  time write each `SingleMessageMetadata` as `payload_size` plus, optionally, `sequence_id`;
  the walk recognises exactly that shape and takes only the body slice. Any other shape (or
  odd encoding) sends the whole entry through `codec.decode_batch_payload`, the general
  decoder, and fills the key, properties and event time columns from its messages.
* Everything that is the same for the whole entry -- topic, partition, ledger, entry,
  publish time, producer name -- is appended as a repeated run, and the batch indexes as a
  `range`: list operations in C.
* At `take`, columns that were never set (no key, no properties, no event time in the whole
  record batch) become null or empty arrays of the right length without a per-row value, and
  `messageId` (`ledger:entry:batch`) is joined by pyarrow compute from each entry's prefix and
  the batch indexes' decimal strings (gathered from a table built once).

Rows are kept by batch index in `[low, high)` of each entry, which is how a range's first and
last entries are cut to `(start, end]`.
"""

from __future__ import annotations

import base64
import struct
from typing import TYPE_CHECKING, Any

from magnetar.codec import CompressionType, RemoteProtocolError, decode_batch_payload, decompress

if TYPE_CHECKING:
    import pyarrow

    from magnetar.codec import pb

__all__ = ["Columns", "arrow_schema"]

_U32 = struct.Struct(">I").unpack_from
_NO_KEY = object()


def arrow_schema() -> pyarrow.Schema:
    """The row schema (`_read.SCHEMA`) as Arrow types."""
    import pyarrow as pa

    return pa.schema([
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
        ("partition", pa.int32()), ("messageId", pa.string()),
        ("publishTime", pa.timestamp("us", tz="UTC")),
        ("eventTime", pa.timestamp("us", tz="UTC")),
        ("properties", pa.map_(pa.string(), pa.string())), ("producerName", pa.string())])


def _uniform_bodies(buf: bytes, count: int) -> pyarrow.Array | None:
    """The bodies of a batch payload whose messages all have the same body size and the same
    metadata shape -- `payload_size` then optionally a `sequence_id` of one width -- as one
    binary array, checked and cut with numpy; None when the payload is not like that."""
    import numpy as np
    import pyarrow as pa

    if count <= 0 or len(buf) < 6 or len(buf) % count:
        return None
    meta = _U32(buf, 0)[0]
    stride = len(buf) // count
    if buf[4] != 0x18 or not 2 <= meta <= 8:
        return None
    first = buf[5]
    width = 1 if first < 0x80 else 2
    if width == 2 and (meta < 3 or buf[6] >= 0x80):
        return None
    size = first if width == 1 else (first & 0x7F) | (buf[6] << 7)
    if 4 + meta + size != stride:
        return None
    rows = np.frombuffer(buf, dtype=np.uint8).reshape(count, stride)
    head = 4 + 1 + width  # the size prefix and the payload_size field: the same in every row
    if not (rows[:, :head] == rows[0, :head]).all():
        return None
    if meta > 1 + width:  # then one sequence_id varint up to the end of the metadata
        sequence = rows[:, head:4 + meta]
        if not ((sequence[:, 0] == 0x40).all() and (sequence[:, 1:-1] >= 0x80).all()
                and (sequence[:, -1] < 0x80).all() and sequence.shape[1] >= 2):
            return None
    data = np.ascontiguousarray(rows[:, 4 + meta:]).reshape(-1)
    offsets = np.arange(0, (count + 1) * size, size, dtype=np.int32)[:count + 1]
    return pa.Array.from_buffers(pa.binary(), count,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _bodies(buf: bytes, count: int) -> list[bytes] | None:
    """The bodies of a batch payload whose every message's metadata is exactly
    `payload_size` (a 1-2 byte varint) then optionally `sequence_id` (a 1-4 byte varint);
    None when any message has another shape (the caller then decodes it in full).

    Raises:
        RemoteProtocolError: a size runs past the payload, or bytes are left over.
    """
    bodies: list[bytes] = []
    append = bodies.append
    end = len(buf)
    pos = 0
    unpack = _U32
    for _ in range(count):
        if end - pos < 6:
            return None
        start = pos + 4
        meta_end = start + unpack(buf, pos)[0]
        if buf[start] != 0x18:
            return None
        size = buf[start + 1]
        if size < 0x80:
            cursor = start + 2
        else:
            second = buf[start + 2]
            if second >= 0x80:
                return None
            size = (size & 0x7F) | (second << 7)
            cursor = start + 3
        if cursor != meta_end:  # then it must be one sequence_id varint ending at meta_end
            width = meta_end - cursor - 1
            if buf[cursor] != 0x40 or buf[meta_end - 1] >= 0x80 or not (
                    width == 1 or (width == 2 and buf[cursor + 1] >= 0x80)
                    or (width == 3 and buf[cursor + 1] >= 0x80 and buf[cursor + 2] >= 0x80)
                    or (width == 4 and buf[cursor + 1] >= 0x80 and buf[cursor + 2] >= 0x80
                        and buf[cursor + 3] >= 0x80)):
                return None
        stop = meta_end + size
        if stop > end:
            raise RemoteProtocolError("a batch message's body runs past the payload")
        append(buf[meta_end:stop])
        pos = stop
    if pos != end:
        raise RemoteProtocolError(f"{end - pos} bytes after the last of {count} messages")
    return bodies


def _binary(values: list[bytes]) -> pyarrow.Array:
    """A binary array of `values` from one joined buffer (faster than element by element)."""
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(values) + 1, dtype=np.int32)  # one entry's bodies: < 2 GiB
    np.cumsum(np.fromiter(map(len, values), dtype=np.int32, count=len(values)),
              out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(values), [
        None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


_DECIMALS_MAX = 1 << 16  # batch indexes whose decimal strings are kept (one table per process)
_decimals: list[pyarrow.Array] = []


def _decimal(indexes: Any) -> pyarrow.Array:
    """Batch indexes (a numpy int64 array) as decimal strings: gathered from a table built once
    when all are in `[0, _DECIMALS_MAX)` (about 2.5 times faster than formatting them), else
    formatted by pyarrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(indexes) and (indexes.min() < 0 or indexes.max() >= _DECIMALS_MAX):
        return pc.cast(pa.array(indexes), pa.string())
    if not _decimals:
        _decimals.append(pa.array([str(i) for i in range(_DECIMALS_MAX)], pa.string()))
    return _decimals[0].take(pa.array(indexes))


def _key_bytes(key: str | None, b64: bool) -> bytes | None:
    if key is None:
        return None
    return base64.b64decode(key) if b64 else key.encode()


class Columns:
    """The rows of one topic-partition range, entry by entry, taken as Arrow record batches."""

    def __init__(self, topic: str, partition: int):
        self.topic = topic
        self.partition = partition
        self.schema = arrow_schema()
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self.value_chunks: list[pyarrow.Array] = []
        self.values: list[bytes | None] = []  # not yet in `value_chunks`
        # one item per entry: ledger, entry, first row, rows, publish time, producer, and the
        # batch indexes (None: `low`, `low + 1`, ...)
        self.segments: list[tuple[int, int, int, int, int, str, list[int] | None]] = []
        self.lows: list[int] = []
        self.keys: list[bytes | None] | None = None  # None: no row has had a key yet
        self.event_ms: list[int | None] | None = None
        self.properties: list[list[tuple[str, str]]] | None = None

    def __len__(self) -> int:
        return self.rows

    def add(self, ledger: int, entry: int, metadata: pb.MessageMetadata, payload: bytes,
            low: int, high: int) -> int:
        """Append the messages of one entry whose batch index is in `[low, high)` (a
        non-batched entry is index 0 here); the number of rows added.

        Raises:
            RemoteProtocolError: the payload cannot be decompressed or decoded (nothing of the
                entry was appended).
        """
        if int(metadata.compression) != CompressionType.NONE:
            payload = decompress(metadata.compression, payload, metadata.uncompressed_size)
        if not metadata.HasField("num_messages_in_batch"):
            if low <= 0 < high:
                return self._general(ledger, entry, metadata, payload, 0, 1, batched=False)
            return 0
        count = metadata.num_messages_in_batch
        high = min(high, count)
        if low >= high:
            return 0
        chunk = _uniform_bodies(payload, count)
        if chunk is not None:
            if self.values:
                self._flush_values()
            self.value_chunks.append(chunk if high - low == count else
                                     chunk.slice(low, high - low))
        else:
            bodies = _bodies(payload, count)
            if bodies is None:
                return self._general(ledger, entry, metadata, payload, low, high, batched=True)
            if self.values:
                self._flush_values()
            self.value_chunks.append(_binary(bodies[low:high] if high - low < count else bodies))
        self._segment(ledger, entry, metadata, low, high - low, None)
        return high - low

    def _flush_values(self) -> None:
        import pyarrow as pa

        self.value_chunks.append(pa.array(self.values, pa.binary()))
        self.values = []

    def _segment(self, ledger: int, entry: int, metadata: pb.MessageMetadata, low: int,
                 n: int, indexes: list[int] | None) -> None:
        """Record `n` rows of one entry, and nulls where a sparse column has started."""
        self.segments.append((ledger, entry, self.rows, n, metadata.publish_time,
                              metadata.producer_name, indexes))
        self.lows.append(low)
        self.rows += n
        if self.keys is not None and len(self.keys) < self.rows:
            self.keys.extend([None] * (self.rows - len(self.keys)))
        if self.event_ms is not None and len(self.event_ms) < self.rows:
            self.event_ms.extend([None] * (self.rows - len(self.event_ms)))
        if self.properties is not None and len(self.properties) < self.rows:
            self.properties.extend([[]] * (self.rows - len(self.properties)))

    def _general(self, ledger: int, entry: int, metadata: pb.MessageMetadata, payload: bytes,
                 low: int, high: int, batched: bool) -> int:
        if batched:
            singles = decode_batch_payload(payload, metadata.num_messages_in_batch)[low:high]
            singles = [s for s in singles if not s.compacted_out]
            rows = [(s.batch_index, s.payload, _key_bytes(s.partition_key,
                                                          s.partition_key_b64_encoded),
                     s.event_time, list(s.properties.items())) for s in singles]
        else:
            key = _key_bytes(metadata.partition_key, metadata.partition_key_b64_encoded) \
                if metadata.HasField("partition_key") else None
            rows = [(-1, None if metadata.null_value else bytes(payload), key,
                     metadata.event_time, [(p.key, p.value) for p in metadata.properties])]
        size = self.rows
        if self.keys is None and any(r[2] is not None for r in rows):
            self.keys = [None] * size
        if self.event_ms is None and any(r[3] for r in rows):
            self.event_ms = [None] * size
        if self.properties is None and any(r[4] for r in rows):
            self.properties = [[] for _ in range(size)]
        self.values.extend(r[1] for r in rows)
        if self.keys is not None:
            self.keys.extend(r[2] for r in rows)
        if self.event_ms is not None:
            self.event_ms.extend(r[3] or None for r in rows)
        if self.properties is not None:
            self.properties.extend(r[4] for r in rows)
        self._segment(ledger, entry, metadata, low, len(rows), [r[0] for r in rows])
        return len(rows)

    def take(self) -> pyarrow.RecordBatch:
        """The rows added since the last `take`, as one record batch of the row schema."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = self.rows
        if self.values or not self.value_chunks:
            self._flush_values()
        values = self.value_chunks[0] if len(self.value_chunks) == 1 else \
            pa.concat_arrays(self.value_chunks)
        ledgers, entries, firsts, counts, publish_ms, producers, indexes = \
            zip(*self.segments, strict=True) if self.segments else ((),) * 7
        counts_np = np.asarray(counts, dtype=np.int64)
        segment_of_row = pa.array(np.repeat(np.arange(len(counts_np)), counts_np))
        # batch index of each row: its row number minus its entry's first row, plus `low`
        batch = np.arange(n, dtype=np.int64) - np.repeat(
            np.asarray(firsts, dtype=np.int64) - np.asarray(self.lows, dtype=np.int64),
            counts_np)
        for first, listed in zip(firsts, indexes, strict=True):
            if listed is not None:
                batch[first:first + len(listed)] = listed
        prefixes = pa.array([f"{ledger}:{entry}:" for ledger, entry in
                             zip(ledgers, entries, strict=True)], pa.string())
        message_ids = pc.binary_join_element_wise(
            prefixes.take(segment_of_row), _decimal(batch), "")
        us = pa.timestamp("us", tz="UTC")
        publish = pa.array(np.asarray(publish_ms, dtype=np.int64) * 1000).cast(us) \
            .take(segment_of_row)
        if self.event_ms is None:
            event: Any = pa.nulls(n, us)
        else:
            event = pc.multiply(pa.array(self.event_ms, pa.int64()), 1000).cast(us)
        keys = pa.nulls(n, pa.binary()) if self.keys is None else \
            pa.array(self.keys, pa.binary())
        map_type = self.schema.field("properties").type
        if self.properties is None:
            properties: Any = pa.MapArray.from_arrays(
                pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()),
                pa.array([], pa.string()), type=map_type)
        else:
            properties = pa.array(self.properties, map_type)
        columns = [
            keys, values, pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.array(np.full(n, self.partition, dtype=np.int32)), message_ids, publish, event,
            properties, pa.array(producers, pa.string()).take(segment_of_row)]
        self._reset()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
