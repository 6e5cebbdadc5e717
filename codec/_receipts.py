"""SEND_RECEIPT frames built without the protobuf runtime: the broker writes one per SEND,
and building `BaseCommand(type=SEND_RECEIPT, send_receipt=...)` then serializing it cost more
than the rest of a receipt's handling. The bytes are those the runtime produces (fields in
number order, the same varints); tests/codec/test_receipts.py checks it byte for byte over
arbitrary ids. Field numbers come from the descriptors, so they are defined once.

A producer's receipts of one loop turn go out together (`send_receipt_frames`): consecutive
receipts differ only in two varints (sequence id, entry id), so each is built from a
template of the parts that stay the same, made again when a varint's length or the ledger
changes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final

from ._proto import pulsar_api_pb2 as pb
from ._wire import (
    _VARINT_CACHE,
    _VARINT_CACHE_LIMIT,
    UINT64_MASK,
    WIRE_BYTES,
    WIRE_VARINT,
    encode_varint,
    field_key,
)

__all__ = ["MESSAGE_ID_ENTRY_KEY", "MESSAGE_ID_LEDGER_KEY", "send_receipt_frame",
           "send_receipt_frames"]

_SIZES: Final = struct.Struct(">II")
_RECEIPT_FIELDS: Final = pb.CommandSendReceipt.DESCRIPTOR.fields_by_name
_ID_FIELDS: Final = pb.MessageIdData.DESCRIPTOR.fields_by_name
_BODY_FIELD: Final = pb.BaseCommand.DESCRIPTOR.fields_by_name["send_receipt"].number
_TYPE_FIELD: Final = pb.BaseCommand.DESCRIPTOR.fields_by_name["type"].number

_COMMAND_HEAD: Final = (field_key(_TYPE_FIELD, WIRE_VARINT)
                       + encode_varint(pb.BaseCommand.SEND_RECEIPT)
                       + field_key(_BODY_FIELD, WIRE_BYTES))
_PRODUCER: Final = field_key(_RECEIPT_FIELDS["producer_id"].number, WIRE_VARINT)
_SEQUENCE: Final = field_key(_RECEIPT_FIELDS["sequence_id"].number, WIRE_VARINT)
_MESSAGE_ID: Final = field_key(_RECEIPT_FIELDS["message_id"].number, WIRE_BYTES)
_HIGHEST: Final = field_key(_RECEIPT_FIELDS["highest_sequence_id"].number, WIRE_VARINT)
MESSAGE_ID_LEDGER_KEY: Final = field_key(_ID_FIELDS["ledgerId"].number, WIRE_VARINT)
MESSAGE_ID_ENTRY_KEY: Final = field_key(_ID_FIELDS["entryId"].number, WIRE_VARINT)
_LENGTH: Final = tuple(encode_varint(length) for length in range(128))  # one byte each
_HEAD_BYTES: Final = len(_COMMAND_HEAD) + 1  # and the body's one-byte length
# Varints of 2**14 <= v < 2**28 are the low 14 bits as two continued bytes, then v >> 14's
# varint (`_VARINT_CACHE`): two table lookups. Ids of a busy producer live there.
_LOW_PAIRS: Final = tuple(bytes((v & 0x7F | 0x80, v >> 7 | 0x80)) for v in range(1 << 14))
_PAIRED_LIMIT: Final = 1 << 28
assert _VARINT_CACHE_LIMIT == len(_LOW_PAIRS) == 1 << 14


def send_receipt_frame(producer_id: int, sequence_id: int, ledger_id: int, entry_id: int,
                       highest_sequence_id: int) -> bytes:
    """The whole frame (size prefixes included) of
    `CommandSendReceipt(producer_id, sequence_id, MessageIdData(ledgerId, entryId),
    highest_sequence_id)`; negative ledger and entry ids go out as their uint64 form (a
    duplicate's (-1, -1)). The ids must fit uint64 (asserted: they are the broker's own)."""
    assert 0 <= producer_id <= UINT64_MASK
    assert 0 <= sequence_id <= UINT64_MASK
    assert 0 <= highest_sequence_id <= UINT64_MASK
    sequence = encode_varint(sequence_id)
    # Producer and ledger ids are mostly small: their varints from encode_varint's own
    # table, without the call.
    ledger = _VARINT_CACHE[ledger_id] if 0 <= ledger_id < _VARINT_CACHE_LIMIT \
        else encode_varint(ledger_id & UINT64_MASK)
    message_id = b"".join((MESSAGE_ID_LEDGER_KEY, ledger,
                           MESSAGE_ID_ENTRY_KEY, encode_varint(entry_id & UINT64_MASK)))
    producer = _VARINT_CACHE[producer_id] if producer_id < _VARINT_CACHE_LIMIT \
        else encode_varint(producer_id)
    # Every length below is under 128, so its varint is the one byte: at most 2 + 10 + 10
    # for the message id, 4 * (1 + 10) + 1 + 22 for the body.
    body = b"".join((_PRODUCER, producer, _SEQUENCE, sequence, _MESSAGE_ID,
                     _LENGTH[len(message_id)], message_id, _HIGHEST,
                     sequence if highest_sequence_id == sequence_id
                     else encode_varint(highest_sequence_id)))
    size = _HEAD_BYTES + len(body)
    return b"".join((_SIZES.pack(size + 4, size), _COMMAND_HEAD, _LENGTH[len(body)], body))


def send_receipt_frames(producer_id: int,
                        receipts: Iterable[tuple[int, int, tuple[int, int]]]) -> bytes:
    """The frames of one producer's receipts, in order, each `(sequence_id,
    highest_sequence_id, (ledger_id, entry_id))`: the bytes of `send_receipt_frame` for each,
    joined. The common receipt -- its highest sequence id its sequence id, both ids under
    2**28, the ledger the previous one's -- is a template's constant parts around the two
    varints that change, so a run of them costs two lookups each; any other goes through
    `send_receipt_frame`."""
    assert 0 <= producer_id <= UINT64_MASK
    cache, pairs, highest_key = _VARINT_CACHE, _LOW_PAIRS, _HIGHEST
    pieces: list[bytes] = []
    head = middle = b""
    # What head and middle were made for: the ledger id, the two varints' lengths.
    template_ledger, template_sequence_bytes, template_entry_bytes = -1, 0, 0
    for sequence_id, highest, (ledger_id, entry_id) in receipts:
        if highest != sequence_id or not (0 <= sequence_id < _PAIRED_LIMIT
                                          and 0 <= entry_id < _PAIRED_LIMIT and ledger_id >= 0):
            pieces.append(send_receipt_frame(producer_id, sequence_id, ledger_id, entry_id,
                                             highest))
            continue
        sequence = cache[sequence_id] if sequence_id < _VARINT_CACHE_LIMIT else \
            pairs[sequence_id & 0x3FFF] + cache[sequence_id >> 14]
        entry = cache[entry_id] if entry_id < _VARINT_CACHE_LIMIT else \
            pairs[entry_id & 0x3FFF] + cache[entry_id >> 14]
        if ledger_id != template_ledger or len(sequence) != template_sequence_bytes or \
                len(entry) != template_entry_bytes:
            template_ledger, template_sequence_bytes, template_entry_bytes = \
                ledger_id, len(sequence), len(entry)
            head, middle = _receipt_template(producer_id, ledger_id, len(sequence), len(entry))
        pieces += (head, sequence, middle, entry, highest_key, sequence)
    return b"".join(pieces)


def _receipt_template(producer_id: int, ledger_id: int, sequence_bytes: int,
                      entry_bytes: int) -> tuple[bytes, bytes]:
    """The constant parts of a receipt whose highest sequence id is its sequence id: what
    comes before the sequence id's varint, and what comes between it and the entry id's."""
    producer = encode_varint(producer_id)
    ledger = encode_varint(ledger_id)
    id_bytes = len(MESSAGE_ID_LEDGER_KEY) + len(ledger) + len(MESSAGE_ID_ENTRY_KEY) + entry_bytes
    body = (len(_PRODUCER) + len(producer) + len(_SEQUENCE) + sequence_bytes
            + len(_MESSAGE_ID) + 1 + id_bytes + len(_HIGHEST) + sequence_bytes)
    size = _HEAD_BYTES + body
    head = b"".join((_SIZES.pack(size + 4, size), _COMMAND_HEAD, _LENGTH[body], _PRODUCER,
                     producer, _SEQUENCE))
    middle = b"".join((_MESSAGE_ID, _LENGTH[id_bytes], MESSAGE_ID_LEDGER_KEY, ledger,
                       MESSAGE_ID_ENTRY_KEY))
    return head, middle
