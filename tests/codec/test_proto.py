"""The schema: our .proto is Pulsar's catalogue, the generated module is fresh, and proto2
presence rules hold on the wire (wire reference sections 2.6, 3 and 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar import codec
from magnetar.codec import pb
from magnetar.codec._proto import generate


def test_generated_module_is_not_stale(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path)
    for path in fresh:
        committed = generate.HERE / path.name
        assert committed.read_text() == path.read_text(), f"{path.name} is stale: run make proto"


def test_every_command_lives_in_the_field_numbered_like_its_type() -> None:
    fields = pb.BaseCommand.DESCRIPTOR.fields_by_number
    types = pb.BaseCommand.Type.values()
    assert len(types) == 58  # 2..40 and 50..68
    for value in types:
        assert value in fields, pb.BaseCommand.Type.Name(value)
        assert fields[value].message_type is not None


# (message, field, number, label) for the fields the broker and clients depend on, straight from
# the catalogue tables of the wire reference section 4.
CATALOGUE = [
    ("MessageIdData", "ledgerId", 1, "required"),
    ("MessageIdData", "entryId", 2, "required"),
    ("MessageIdData", "partition", 3, "optional"),
    ("MessageIdData", "batch_index", 4, "optional"),
    ("MessageIdData", "ack_set", 5, "repeated"),
    ("MessageIdData", "batch_size", 6, "optional"),
    ("MessageIdData", "first_chunk_message_id", 7, "optional"),
    ("MessageMetadata", "producer_name", 1, "required"),
    ("MessageMetadata", "sequence_id", 2, "required"),
    ("MessageMetadata", "publish_time", 3, "required"),
    ("MessageMetadata", "compression", 8, "optional"),
    ("MessageMetadata", "uncompressed_size", 9, "optional"),
    ("MessageMetadata", "num_messages_in_batch", 11, "optional"),
    ("MessageMetadata", "ordering_key", 18, "optional"),
    ("MessageMetadata", "null_value", 25, "optional"),
    ("MessageMetadata", "uuid", 26, "optional"),
    ("MessageMetadata", "chunk_id", 29, "optional"),
    ("MessageMetadata", "entry_hash_max", 34, "optional"),
    ("SingleMessageMetadata", "payload_size", 3, "required"),
    ("SingleMessageMetadata", "null_partition_key", 10, "optional"),
    ("CommandConnected", "server_version", 1, "required"),
    ("CommandConnected", "max_message_size", 3, "optional"),
    ("CommandSend", "is_chunk", 7, "optional"),
    ("CommandSendReceipt", "message_id", 3, "optional"),
    ("CommandMessage", "message_id", 2, "required"),
    ("CommandProducerSuccess", "producer_name", 2, "required"),
    ("CommandProducerSuccess", "last_sequence_id", 3, "optional"),
    ("CommandLookupTopicResponse", "response", 3, "optional"),
    ("CommandLookupTopicResponse", "request_id", 4, "required"),
    ("CommandPartitionedTopicMetadataResponse", "response", 3, "optional"),
    ("CommandError", "message", 3, "required"),
    ("CommandSubscribe", "keySharedMeta", 17, "optional"),
    ("CommandConsumerStats", "consumer_id", 4, "required"),
    ("KeySharedMeta", "hashRanges", 3, "repeated"),
    ("Schema", "schema_data", 3, "required"),
]


@pytest.mark.parametrize(("message", "name", "number", "label"), CATALOGUE)
def test_field_numbers_and_labels_match_the_catalogue(
    message: str, name: str, number: int, label: str
) -> None:
    field = getattr(pb, message).DESCRIPTOR.fields_by_name[name]
    assert field.number == number
    kind = "repeated" if field.is_repeated else "required" if field.is_required else "optional"
    assert kind == label


def test_enum_values_match_the_catalogue() -> None:
    assert dict(pb.CompressionType.items()) == {
        "NONE": 0,
        "LZ4": 1,
        "ZLIB": 2,
        "ZSTD": 3,
        "SNAPPY": 4,
    }
    assert pb.ServerError.Value("ChecksumError") == 9
    assert pb.ServerError.Value("ProducerFenced") == 25
    assert pb.Schema.Type.Value("None") == 0
    assert pb.Schema.Type.Value("External") == 22
    assert pb.CommandLookupTopicResponse.Connect == 1
    assert pb.CommandAck.ValidationError.Value("ChecksumMismatch") == 2
    assert pb.BaseCommand.TOPIC_MIGRATED == 68


def test_defaults_are_pulsars() -> None:
    assert pb.MessageIdData(ledgerId=1, entryId=2).partition == -1
    assert pb.MessageIdData(ledgerId=1, entryId=2).batch_index == -1
    assert pb.CommandProducerSuccess().last_sequence_id == -1
    assert pb.CommandProducerSuccess().producer_ready is True
    assert pb.CommandSubscribe().durable is True
    assert pb.MessageMetadata().num_messages_in_batch == 1


def test_required_zero_fields_are_written_and_presence_is_kept() -> None:
    # sequence_id = 0 is still written (`10 00`): proto2 required fields always are.
    send = pb.CommandSend(producer_id=0, sequence_id=0)
    assert send.SerializeToString() == bytes.fromhex("08001000")
    redirect = pb.CommandLookupTopicResponse.Redirect
    reply = pb.CommandLookupTopicResponse(request_id=0, response=redirect)
    assert reply.SerializeToString() == bytes.fromhex("18002000")
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
    assert not metadata.HasField("num_messages_in_batch")
    metadata.num_messages_in_batch = 1
    assert pb.MessageMetadata.FromString(metadata.SerializeToString()).HasField(
        "num_messages_in_batch"
    )


def test_negative_int32_takes_ten_varint_bytes() -> None:
    data = pb.MessageIdData(ledgerId=3, entryId=0, partition=-1).SerializeToString()
    assert data == bytes.fromhex("0803100018ffffffffffffffffff01")


def test_the_public_module_is_the_generated_one() -> None:
    assert codec.pb is pb
    assert pb.DESCRIPTOR.package == "magnetar.pulsar_api"
