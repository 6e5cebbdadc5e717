"""Magnetar codec: the Pulsar wire protocol (sans-IO), compression, batching, chunking,
message ids and hashes. No sockets, no threads, no asyncio in this package.

| module             | what                                                               |
|--------------------|--------------------------------------------------------------------|
| `_proto/`          | our `.proto` of Pulsar's commands and metadata; `pb` is its module |
| `_errors.py`       | `ProtocolError` and its Local/Remote split                         |
| `_frames.py`       | the events: `Frame`, `ChecksumMismatch`, `ConnectionClosed`        |
| `_framer.py`       | one frame's byte layout, CRC32C, stored entries                    |
| `_connection.py`   | `Connection`: the sans-IO state machine                            |
| `_receipts.py`     | SEND_RECEIPT frames built without the protobuf runtime             |
| `_sends.py`        | plain SENDs decoded without the protobuf runtime                   |
| `_message_frames.py` | MESSAGE frames built without the protobuf runtime                |
| `_compression.py`  | NONE, LZ4, ZLIB, ZSTD, SNAPPY as Pulsar's clients write them       |
| `_batch_payload.py` | `SingleMessage` and the batch payload's bytes (hand-written codec) |
| `_batching.py`     | batch entries and the default and key-based batch containers       |
| `_plain_batch.py`  | batches of bare bodies, handed out before they are decoded         |
| `_chunking.py`     | splitting large messages and reassembling them                     |
| `_message_id.py`   | `MessageId`: ordering, strings, Pulsar's serialized form           |
| `_hashing.py`      | Murmur3, JavaStringHash, BoostHash, Key_Shared slots               |
"""

from ._batch_payload import (
    SingleMessage,
    batch_last_sequence_id,
    decode_batch_payload,
    encode_batch_payload,
    encode_single_metadata,
)
from ._batching import (
    BATCH_DELAY_MS_MAX_DEFAULT,
    BATCH_MESSAGES_MAX_DEFAULT,
    BATCH_SIZE_BYTES_MAX_DEFAULT,
    Batch,
    BatchContainer,
    KeyBasedBatchContainer,
    batch_key,
    build_batch,
    build_message,
    unpack_messages,
)
from ._chunking import (
    CHUNKED_MESSAGE_SIZE_BYTES_MAX_DEFAULT,
    INCOMPLETE_CHUNK_EXPIRY_MS_DEFAULT,
    PENDING_CHUNKED_MESSAGES_MAX_DEFAULT,
    ChunkAssembler,
    ChunkedMessage,
    ChunkResult,
    chunk_payload_size_bytes,
    chunk_uuid,
    split_into_chunks,
)
from ._compression import (
    UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT,
    CompressionType,
    compress,
    decompress,
)
from ._connection import (
    BROKER_TO_CLIENT_TYPES,
    CLIENT_TO_BROKER_TYPES,
    CPP_CLIENT_ACCEPTED_TYPES,
    Connection,
    Event,
    Role,
    State,
)
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._framer import (
    BROKER_ENTRY_METADATA_BYTES_MAX,
    FRAME_PADDING_BYTES,
    FRAME_SIZE_BYTES_MAX_DEFAULT,
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C,
    MAX_MESSAGE_SIZE_DEFAULT,
    PAYLOAD_COMMAND_TYPES,
    Entry,
    base_command,
    crc32c,
    decode_frame,
    encode_entry,
    encode_frame,
    entry_payload,
    entry_payload_bytes,
    holds_one_message,
    parse_entry,
    parse_entry_metadata,
    prefix_broker_entry_metadata,
    split_broker_entry_metadata,
    strip_broker_entry_metadata,
)
from ._frames import NEED_DATA, ChecksumMismatch, ConnectionClosed, Frame, NeedData
from ._hashing import (
    KEY_HASH_RANGE_SIZE,
    NONE_KEY,
    boost_hash,
    consistent_hashing_slot,
    hash_range_slot,
    java_string_hash,
    java_string_hash_utf8,
    key_hash_slot,
    murmur3_32,
    murmur3_32_raw,
    sticky_key,
)
from ._message_frames import MessageFrameHeads, message_frame, message_frame_head
from ._message_id import EARLIEST, LATEST, MessageId
from ._plain_batch import plain_batch_message, plain_batch_starts
from ._proto import pulsar_api_pb2 as pb
from ._receipts import send_receipt_frame, send_receipt_frames
from ._sends import PLAIN_METADATA_FIELDS, Send, decode_plain_send, decode_plain_send_in

__all__ = [
    "BATCH_DELAY_MS_MAX_DEFAULT",
    "BATCH_MESSAGES_MAX_DEFAULT",
    "BATCH_SIZE_BYTES_MAX_DEFAULT",
    "BROKER_ENTRY_METADATA_BYTES_MAX",
    "BROKER_TO_CLIENT_TYPES",
    "CHUNKED_MESSAGE_SIZE_BYTES_MAX_DEFAULT",
    "CLIENT_TO_BROKER_TYPES",
    "CPP_CLIENT_ACCEPTED_TYPES",
    "EARLIEST",
    "FRAME_PADDING_BYTES",
    "FRAME_SIZE_BYTES_MAX_DEFAULT",
    "INCOMPLETE_CHUNK_EXPIRY_MS_DEFAULT",
    "KEY_HASH_RANGE_SIZE",
    "LATEST",
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "MAX_MESSAGE_SIZE_DEFAULT",
    "NEED_DATA",
    "NONE_KEY",
    "PAYLOAD_COMMAND_TYPES",
    "PENDING_CHUNKED_MESSAGES_MAX_DEFAULT",
    "PLAIN_METADATA_FIELDS",
    "UNCOMPRESSED_SIZE_BYTES_MAX_DEFAULT",
    "Batch",
    "BatchContainer",
    "ChecksumMismatch",
    "ChunkAssembler",
    "ChunkResult",
    "ChunkedMessage",
    "CompressionType",
    "Connection",
    "ConnectionClosed",
    "Entry",
    "Event",
    "Frame",
    "KeyBasedBatchContainer",
    "LocalProtocolError",
    "MessageFrameHeads",
    "MessageId",
    "NeedData",
    "ProtocolError",
    "RemoteProtocolError",
    "Role",
    "Send",
    "SingleMessage",
    "State",
    "base_command",
    "batch_key",
    "batch_last_sequence_id",
    "boost_hash",
    "build_batch",
    "build_message",
    "chunk_payload_size_bytes",
    "chunk_uuid",
    "compress",
    "consistent_hashing_slot",
    "crc32c",
    "decode_batch_payload",
    "decode_frame",
    "decode_plain_send",
    "decode_plain_send_in",
    "decompress",
    "encode_batch_payload",
    "encode_entry",
    "encode_frame",
    "encode_single_metadata",
    "entry_payload",
    "entry_payload_bytes",
    "hash_range_slot",
    "holds_one_message",
    "java_string_hash",
    "java_string_hash_utf8",
    "key_hash_slot",
    "message_frame",
    "message_frame_head",
    "murmur3_32",
    "murmur3_32_raw",
    "parse_entry",
    "parse_entry_metadata",
    "pb",
    "plain_batch_message",
    "plain_batch_starts",
    "prefix_broker_entry_metadata",
    "send_receipt_frame",
    "send_receipt_frames",
    "split_broker_entry_metadata",
    "split_into_chunks",
    "sticky_key",
    "strip_broker_entry_metadata",
    "unpack_messages",
]
