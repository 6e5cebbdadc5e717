"""The official client's keyword arguments, checked and turned into the core's settings.

The synchronous (`_client.py`) and asyncio (`asyncio.py`) APIs share these functions, so both
accept the same arguments and refuse the same mistakes with the same `InvalidConfiguration`
(a `ValueError`) naming the argument.
"""

from __future__ import annotations

import datetime
import itertools
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from magnetar.codec import KEY_HASH_RANGE_SIZE, MessageId

from ._consumer import ConsumerConfig
from ._dead_letter import ConsumerDeadLetterPolicy
from ._enums import (
    BatchingType,
    CompressionType,
    ConsumerType,
    InitialPosition,
    KeySharedMode,
    PartitionsRoutingMode,
    ProducerAccessMode,
    RegexSubscriptionMode,
)
from ._errors import InvalidConfiguration
from ._group import complete_topic_name
from ._message_id import MessageId as ClientMessageId
from ._message_id import codec_id
from ._producer import OutMessage, ProducerConfig
from ._routing import MessageRouter
from ._transport import KeySharedPolicy

__all__ = ["ConsumerKeySharedPolicy", "ConsumerOptions", "ProducerOptions", "check_properties",
           "consumer_options", "delay_ms", "out_message", "producer_options", "reader_options"]

ACK_TIMEOUT_MS_MIN = 10_000  # the official Python client's minimum (0/None: off)


def _check(value: Any, kind: type | tuple[type, ...], name: str) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise InvalidConfiguration(f"Argument {name} is expected to be of type "
                                   f"{getattr(kind, '__name__', kind)}, not {value!r}")


def _properties(value: Mapping[str, str] | None, name: str) -> dict[str, str]:
    if value is None:
        return {}
    _check(value, Mapping, name)
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidConfiguration(f"{name} must map str to str; {key!r}: {item!r} does not")
    return dict(value)


def check_properties(value: Mapping[str, str] | None) -> dict[str, str]:
    """Message properties as a dict, checked (str to str)."""
    return _properties(value, "properties")


def delay_ms(delay: int | datetime.timedelta) -> int:
    """A delay given in ms or as a timedelta, in ms (negative counts as 0)."""
    if isinstance(delay, datetime.timedelta):
        return max(0, int(delay.total_seconds() * 1000))
    _check(delay, int, "delay")
    return max(0, delay)


class ConsumerKeySharedPolicy:
    """The official client's Key_Shared policy. Sticky mode needs `sticky_ranges`: inclusive
    `(start, end)` hash slots within 0..65535 that do not overlap.

    Raises:
        InvalidConfiguration: a range outside 0..65535, reversed, or overlapping another;
            Sticky without ranges.
    """

    def __init__(self, key_shared_mode: KeySharedMode = KeySharedMode.AutoSplit,
                 allow_out_of_order_delivery: bool = False,
                 sticky_ranges: list[tuple[int, int]] | None = None):
        _check(key_shared_mode, KeySharedMode, "key_shared_mode")
        ranges = sorted((int(a), int(b)) for a, b in sticky_ranges or [])
        for start, end in ranges:
            if not 0 <= start <= end < KEY_HASH_RANGE_SIZE:
                raise InvalidConfiguration(f"sticky range ({start}, {end}) is not within "
                                           f"0..{KEY_HASH_RANGE_SIZE - 1}")
        for (_, end), (start, _) in itertools.pairwise(ranges):
            if start <= end:
                raise InvalidConfiguration(f"sticky ranges overlap at {start}")
        if key_shared_mode is KeySharedMode.Sticky and not ranges:
            raise InvalidConfiguration("the Sticky key shared mode needs sticky_ranges")
        self.policy = KeySharedPolicy(key_shared_mode.value, tuple(ranges),
                                      bool(allow_out_of_order_delivery))

    def key_shared_mode(self) -> KeySharedMode:
        return KeySharedMode(self.policy.mode)

    def allow_out_of_order_delivery(self) -> bool:
        return self.policy.allow_out_of_order_delivery

    def sticky_ranges(self) -> list[tuple[int, int]]:
        return list(self.policy.ranges)


@dataclass(frozen=True)
class ProducerOptions:
    topic: str
    config: ProducerConfig
    routing: PartitionsRoutingMode
    router: MessageRouter | None
    pending_across_partitions: int = 50_000


def producer_options(topic: str, *, producer_name: str | None = None,
                     initial_sequence_id: int | None = None, send_timeout_millis: int = 30000,
                     compression_type: CompressionType = CompressionType.NONE,
                     max_pending_messages: int = 1000,
                     max_pending_messages_across_partitions: int = 50000,
                     block_if_queue_full: bool = False, batching_enabled: bool = False,
                     batching_max_messages: int = 1000,
                     batching_max_allowed_size_in_bytes: int = 128 * 1024,
                     batching_max_publish_delay_ms: int = 10, chunking_enabled: bool = False,
                     message_routing_mode: PartitionsRoutingMode =
                     PartitionsRoutingMode.RoundRobinDistribution,
                     lazy_start_partitioned_producers: bool = False,
                     properties: Mapping[str, str] | None = None,
                     batching_type: BatchingType = BatchingType.Default,
                     access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
                     message_router: MessageRouter | None = None,
                     schema: Any = None, encryption_key: Any = None,
                     crypto_key_reader: Any = None) -> ProducerOptions:
    """Check `create_producer`'s arguments.

    Raises:
        InvalidConfiguration: a wrong type or value, batching with chunking, or a feature
            this client does not have (schemas, encryption).
    """
    if schema is not None or encryption_key is not None or crypto_key_reader is not None:
        raise InvalidConfiguration("schemas and encryption are not supported by the magnetar "
                                   "client yet (send bytes)")
    _check(send_timeout_millis, int, "send_timeout_millis")
    _check(compression_type, CompressionType, "compression_type")
    _check(batching_type, BatchingType, "batching_type")
    _check(access_mode, ProducerAccessMode, "access_mode")
    _check(message_routing_mode, PartitionsRoutingMode, "message_routing_mode")
    for name, value in (("max_pending_messages", max_pending_messages),
                        ("batching_max_messages", batching_max_messages),
                        ("batching_max_allowed_size_in_bytes",
                         batching_max_allowed_size_in_bytes),
                        ("batching_max_publish_delay_ms", batching_max_publish_delay_ms)):
        _check(value, int, name)
    if producer_name is not None:
        _check(producer_name, str, "producer_name")
    if initial_sequence_id is not None:
        _check(initial_sequence_id, int, "initial_sequence_id")
    if message_router is not None and not callable(message_router):
        raise InvalidConfiguration("message_router must be callable(message, num_partitions)")
    config = ProducerConfig(
        producer_name=producer_name or "", initial_sequence_id=initial_sequence_id,
        send_timeout_ms=send_timeout_millis, compression_type=compression_type,
        max_pending_messages=max_pending_messages, block_if_queue_full=block_if_queue_full,
        batching_enabled=batching_enabled, batching_max_messages=batching_max_messages,
        batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
        batching_max_publish_delay_ms=batching_max_publish_delay_ms,
        batching_type=batching_type, chunking_enabled=chunking_enabled,
        access_mode=access_mode.value, properties=_properties(properties, "properties"))
    _check(max_pending_messages_across_partitions, int, "max_pending_messages_across_partitions")
    return ProducerOptions(complete_topic_name(topic), config, message_routing_mode,
                           message_router, max_pending_messages_across_partitions)


def out_message(content: bytes | None, *, properties: Mapping[str, str] | None = None,
                partition_key: str | None = None, ordering_key: str | None = None,
                sequence_id: int | None = None, replication_clusters: Any = None,
                disable_replication: bool = False, event_timestamp: int | None = None,
                deliver_at: int | None = None,
                deliver_after: datetime.timedelta | None = None) -> OutMessage:
    """Check `send`'s arguments.

    Raises:
        TypeError: content is not bytes (or None, a null value).
        InvalidConfiguration: another argument has a wrong type.
    """
    if content is not None and not isinstance(content, bytes | bytearray | memoryview):
        raise TypeError(f"message content must be bytes (or None), not "
                        f"{type(content).__name__}")
    if partition_key is not None:
        _check(partition_key, str, "partition_key")
    if ordering_key is not None:
        _check(ordering_key, str, "ordering_key")
    if sequence_id is not None:
        _check(sequence_id, int, "sequence_id")
    if event_timestamp is not None:
        _check(event_timestamp, int, "event_timestamp")
    deliver_at_ms = None
    if deliver_at is not None:
        _check(deliver_at, int, "deliver_at")
        deliver_at_ms = deliver_at
    if deliver_after is not None:
        _check(deliver_after, datetime.timedelta, "deliver_after")
        deliver_at_ms = int(time.time() * 1000 + deliver_after.total_seconds() * 1000)
    return OutMessage(
        payload=None if content is None else bytes(content),
        properties=_properties(properties, "properties"), partition_key=partition_key,
        ordering_key=ordering_key.encode() if ordering_key is not None else None,
        event_time=event_timestamp or 0, sequence_id=sequence_id, deliver_at_ms=deliver_at_ms)


@dataclass(frozen=True)
class ConsumerOptions:
    topics: list[str]
    pattern: re.Pattern[str] | None
    config: ConsumerConfig
    regex_mode: str
    discovery_period_s: float


def consumer_options(topic: str | list[str] | re.Pattern[str], subscription_name: str, *,
                     consumer_type: ConsumerType = ConsumerType.Exclusive,
                     receiver_queue_size: int = 1000,
                     max_total_receiver_queue_size_across_partitions: int = 50000,
                     consumer_name: str | None = None,
                     unacked_messages_timeout_ms: int | None = None,
                     broker_consumer_stats_cache_time_ms: int = 30000,
                     negative_ack_redelivery_delay_ms: int = 60000,
                     is_read_compacted: bool = False,
                     properties: Mapping[str, str] | None = None,
                     pattern_auto_discovery_period: int = 60,
                     initial_position: InitialPosition = InitialPosition.Latest,
                     replicate_subscription_state_enabled: bool = False,
                     max_pending_chunked_message: int = 10,
                     auto_ack_oldest_chunked_message_on_queue_full: bool = False,
                     start_message_id_inclusive: bool = False,
                     batch_index_ack_enabled: bool = False,
                     regex_subscription_mode: RegexSubscriptionMode =
                     RegexSubscriptionMode.PersistentOnly,
                     is_pattern_topic: bool = False, retry_enable: bool = False,
                     schema: Any = None,
                     message_listener: Any = None, crypto_key_reader: Any = None,
                     batch_receive_policy: Any = None, key_shared_policy: Any = None,
                     dead_letter_policy: Any = None,
                     crypto_failure_action: Any = None) -> ConsumerOptions:
    """Check `subscribe`'s arguments.

    Raises:
        InvalidConfiguration: a wrong type or value, or a feature this client does not have
            yet (named in the message).
    """
    unsupported = {"schema": schema, "message_listener": message_listener,
                   "crypto_key_reader": crypto_key_reader,
                   "batch_receive_policy": batch_receive_policy}
    for name, value in unsupported.items():
        if value is not None:
            raise InvalidConfiguration(f"{name} is not supported by the magnetar client yet")
    if dead_letter_policy is not None:
        _check(dead_letter_policy, ConsumerDeadLetterPolicy, "dead_letter_policy")
    if key_shared_policy is not None:
        _check(key_shared_policy, ConsumerKeySharedPolicy, "key_shared_policy")
    _check(subscription_name, str, "subscription_name")
    if not subscription_name:
        raise InvalidConfiguration("subscription_name must not be empty")
    _check(consumer_type, ConsumerType, "consumer_type")
    _check(initial_position, InitialPosition, "initial_position")
    _check(receiver_queue_size, int, "receiver_queue_size")
    _check(negative_ack_redelivery_delay_ms, int, "negative_ack_redelivery_delay_ms")
    if unacked_messages_timeout_ms and unacked_messages_timeout_ms < ACK_TIMEOUT_MS_MIN:
        raise InvalidConfiguration(f"unacked_messages_timeout_ms must be 0 or at least "
                                   f"{ACK_TIMEOUT_MS_MIN}, not {unacked_messages_timeout_ms}")
    topics: list[str] = []
    pattern: re.Pattern[str] | None = None
    if isinstance(topic, re.Pattern):
        pattern = topic
    elif isinstance(topic, str) and is_pattern_topic:
        pattern = re.compile(topic)
    elif isinstance(topic, str):
        topics = [topic]
    elif isinstance(topic, list) and topic and all(isinstance(t, str) for t in topic):
        topics = list(topic)
    else:
        raise InvalidConfiguration(f"topic must be a str, a non-empty list of str, or a "
                                   f"re.Pattern, not {topic!r}")
    config = ConsumerConfig(
        subscription=subscription_name, sub_type=consumer_type.value,
        consumer_name=consumer_name or "", initial_position=initial_position.value,
        receiver_queue_size=0 if receiver_queue_size == 0 else  # 0: a zero-size queue
        max(1, min(receiver_queue_size, max_total_receiver_queue_size_across_partitions)),
        negative_ack_delay_ms=max(0, negative_ack_redelivery_delay_ms),
        ack_timeout_ms=unacked_messages_timeout_ms or 0,
        batch_index_ack=batch_index_ack_enabled,
        start_inclusive=start_message_id_inclusive,
        properties=_properties(properties, "properties"),
        max_pending_chunked_message=max_pending_chunked_message,
        auto_ack_oldest_chunked_message_on_queue_full=(
            auto_ack_oldest_chunked_message_on_queue_full),
        dead_letter_policy=dead_letter_policy, retry_enable=bool(retry_enable),
        key_shared=None if key_shared_policy is None else key_shared_policy.policy)
    return ConsumerOptions([complete_topic_name(t) for t in topics], pattern, config,
                           regex_subscription_mode.value, float(pattern_auto_discovery_period))


def reader_options(topic: str, start_message_id: MessageId | ClientMessageId, *,
                   receiver_queue_size: int = 1000,
                   reader_name: str | None = None, subscription_role_prefix: str | None = None,
                   is_read_compacted: bool = False, start_message_id_inclusive: bool = False,
                   schema: Any = None, reader_listener: Any = None,
                   crypto_key_reader: Any = None,
                   crypto_failure_action: Any = None) -> ConsumerOptions:
    """Check `create_reader`'s arguments: a reader is an Exclusive non-durable consumer on a
    generated subscription, starting at `start_message_id`."""
    if schema is not None or reader_listener is not None or crypto_key_reader is not None:
        raise InvalidConfiguration("schemas, reader listeners and encryption are not "
                                   "supported by the magnetar client yet")
    _check(topic, str, "topic")
    start_message_id = codec_id(start_message_id)
    _check(start_message_id, MessageId, "start_message_id")
    _check(receiver_queue_size, int, "receiver_queue_size")
    prefix = f"{subscription_role_prefix}-" if subscription_role_prefix else ""
    config = ConsumerConfig(
        subscription=f"{prefix}reader-{secrets.token_hex(5)}", sub_type="Exclusive",
        consumer_name=reader_name or "", durable=False,
        initial_position="earliest" if start_message_id.ledger_id < 0 else "latest",
        receiver_queue_size=max(1, receiver_queue_size), start_message_id=start_message_id,
        start_inclusive=start_message_id_inclusive)
    return ConsumerOptions([complete_topic_name(topic)], None, config, "PERSISTENT", 60.0)
