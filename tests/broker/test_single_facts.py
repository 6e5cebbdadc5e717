"""Facts defined once (issue 11, section 4): how many messages an entry holds, the frame
padding, the fit of the broker's largest message in storage's largest entry, and user settings
refused with one line naming the setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from magnetar import codec
from magnetar.broker import BrokerConfig, BrokerService, ProducerSpec
from magnetar.broker._config import REMOVED_SETTINGS
from magnetar.broker._errors import ConfigurationError
from magnetar.broker.cli._standalone import StandaloneOptions, config_with_overrides
from magnetar.broker.dispatch._entry import SINGLE_MESSAGE_BYTES_MIN, EntryInfo, messages_in
from magnetar.broker.ledger._position import Position
from magnetar.broker.topics._dedup import highest_sequence_id_of
from magnetar.broker.topics._topic import PersistentTopic
from magnetar.codec import SingleMessage, build_batch, encode_entry, pb
from magnetar.storage import Storage, StorageConfig

from .helpers import broker_env

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_DEADLINE_S = 60


def _claiming(count: int | None, bodies: int = 3) -> tuple[pb.MessageMetadata, bytes]:
    """A batch of `bodies` small messages whose metadata claims `count` (None: not a batch)."""
    metadata, payload = build_batch([SingleMessage(b"x", sequence_id=i) for i in range(bodies)],
                                    producer_name="p1", publish_time=1)
    if count is None:
        metadata.ClearField("num_messages_in_batch")
    else:
        metadata.num_messages_in_batch = count
    return metadata, encode_entry(metadata, payload)


@pytest.mark.parametrize("claimed", [None, 0, 3, 10_000])
async def test_every_counter_agrees_on_the_messages_of_an_entry(claimed: int | None,
                                                          tmp_path: Path) -> None:
    """Publish counters, the index interceptor, dedup and the dispatchers' `batch_size` all
    read one entry as holding the same number of messages, even for a claim the wire would
    refuse (0, or more than the payload can hold) reaching the topic another way."""
    metadata, entry = _claiming(claimed)
    payload_bytes = len(codec.entry_payload(entry))
    expected = messages_in(metadata, payload_bytes)
    assert 1 <= expected <= max(1, payload_bytes // SINGLE_MESSAGE_BYTES_MIN)

    async with broker_env(tmp_path, broker_deduplication_enabled=True,
                          broker_entry_metadata_interceptors=("index",)) as env:
        topic, producer = await env.service.create_producer(
            "persistent://public/default/facts", ProducerSpec("p1"))
        assert isinstance(topic, PersistentTopic)
        result = await topic.publish(producer, entry, 0, -1, metadata)
        stored = topic.managed_ledger.read_entry(Position(result.ledger_id,
                                                          result.entry_id))
        assert EntryInfo(Position(result.ledger_id, result.entry_id),
                         stored).batch_size == expected
        assert producer.msg_in_counter == topic.msg_in_counter == expected
        block = codec.parse_entry(stored, verify_checksum=False).broker_entry_metadata
        assert block is not None
        assert block.index == expected - 1
        assert highest_sequence_id_of(0, -1, metadata, entry) == expected - 1


def test_the_frame_padding_is_defined_once() -> None:
    from magnetar.broker.wire import _connection_handler

    assert codec.FRAME_SIZE_BYTES_MAX_DEFAULT == (codec.MAX_MESSAGE_SIZE_DEFAULT
                                                  + codec.FRAME_PADDING_BYTES)
    assert _connection_handler.FRAME_PADDING_BYTES is codec.FRAME_PADDING_BYTES
    for module in ("broker/topics/_topic.py", "broker/wire/_connection_handler.py",
                   "storage/_config.py"):
        text = (REPO_ROOT / module).read_text()
        assert "10 * 1024" not in text, module
        assert "10 * KiB" not in text, module
    assert (REPO_ROOT / "codec/_framer.py").read_text().count("10 * 1024") == 1


def test_the_default_largest_message_fits_the_default_largest_entry() -> None:
    needed = (BrokerConfig().max_message_size_bytes + codec.FRAME_PADDING_BYTES
              + codec.BROKER_ENTRY_METADATA_BYTES_MAX)
    assert needed <= StorageConfig().entry_size_bytes_max


def test_a_largest_message_storage_cannot_hold_is_refused_naming_both(tmp_path: Path) -> None:
    storage = Storage.open(tmp_path)
    try:
        with pytest.raises(ConfigurationError) as caught:
            BrokerService(storage, BrokerConfig(max_message_size_bytes=6 * 1024 * 1024))
        message = str(caught.value)
        assert "max_message_size_bytes" in message
        assert "entry_size_bytes_max" in message
        assert "\n" not in message
        limit = storage.config.entry_size_bytes_max - codec.FRAME_PADDING_BYTES - \
            codec.BROKER_ENTRY_METADATA_BYTES_MAX
        BrokerService(storage, BrokerConfig(max_message_size_bytes=limit))  # fits exactly
    finally:
        storage.close()


def test_a_broker_entry_metadata_block_fits_its_maximum() -> None:
    block = pb.BrokerEntryMetadata(broker_timestamp=2 ** 64 - 1, index=2 ** 64 - 1)
    prefixed = codec.prefix_broker_entry_metadata(block, b"")
    assert len(prefixed) <= codec.BROKER_ENTRY_METADATA_BYTES_MAX


def test_dedup_of_a_stored_absurd_claim_is_bounded_by_what_the_entry_holds() -> None:
    metadata, entry = _claiming(1_000_000)
    holds = messages_in(metadata, len(codec.entry_payload(entry)))
    assert holds < 1_000_000
    assert highest_sequence_id_of(5, -1, metadata, entry) <= 5 + holds - 1


# -- settings -------------------------------------------------------------------------------


def _magnetar(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "magnetar.broker.cli", *argv], capture_output=True,
                          text=True, check=False, timeout=CLI_DEADLINE_S, cwd=REPO_ROOT)


@pytest.mark.parametrize(("setting", "line"), [
    ("default_num_partitions=0", "default_num_partitions must be at least 1, not 0"),
    ("max_message_size_bytes=6291456",
     "max_message_size_bytes (6291456) plus 10268 bytes of frame padding and broker entry "
     "metadata exceeds the storage's entry_size_bytes_max (5308416): max_message_size_bytes "
     "may be at most 5298148"),
    ("dispatcher_retry_backoff_initial_ms=5",
     "dispatcher_retry_backoff_initial_ms is no longer a setting: "
     + REMOVED_SETTINGS.get("dispatcher_retry_backoff_initial_ms", "")),
])
def test_a_bad_setting_is_one_line_naming_it(setting: str, line: str, tmp_path: Path) -> None:
    done = _magnetar("standalone", "--data-dir", str(tmp_path / "data"), "--port", "0",
                     "--http-port", "0", "--config", setting)
    assert "Traceback" not in done.stderr
    assert (done.returncode, done.stderr) == (2, f"magnetar standalone: {line}\n")
    assert not (tmp_path / "data").exists()


def test_settings_nothing_reads_are_gone() -> None:
    fields = set(BrokerConfig.__dataclass_fields__)
    for name in ("dispatcher_retry_backoff_initial_ms", "dispatcher_retry_backoff_max_ms"):
        assert name in REMOVED_SETTINGS
        assert name not in fields
        with pytest.raises(ConfigurationError, match=f"^{name} is no longer a setting"):
            config_with_overrides([f"{name}=1"])


@pytest.mark.parametrize(("options", "words"), [
    ({"pending_sends_max": 0}, "pending_sends_max must be at least 1, not 0"),
    ({"shutdown_grace_s": -1.0}, "shutdown_grace_s must be 0 or more, not -1.0"),
])
def test_standalone_options_are_validated_with_errors(options: dict[str, object],
                                                      words: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{words}$"):
        StandaloneOptions(data_dir="unused", **options)  # type: ignore[arg-type]


def test_payload_length_is_found_without_the_payload() -> None:
    _, entry = _claiming(3)
    prefixed = codec.prefix_broker_entry_metadata(pb.BrokerEntryMetadata(index=5), entry)
    for each in (entry, prefixed):
        assert codec.entry_payload_bytes(each) == len(codec.entry_payload(each))
