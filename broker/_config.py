"""Broker configuration: Pulsar's `ServiceConfiguration` defaults for what Magnetar
implements (broker reference §10), each limit named with its unit."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from ._errors import ConfigurationError

__all__ = ["INTERCEPTOR_INDEX", "INTERCEPTOR_TIMESTAMP", "REMOVED_SETTINGS", "SETTING_CHOICES",
           "SETTING_RANGES", "BrokerConfig", "check_settings", "interceptors_of", "parse_value"]

# Pulsar's SchemaCompatibilityStrategy names a broker default may take (not UNDEFINED).
SCHEMA_STRATEGIES = ("ALWAYS_INCOMPATIBLE", "ALWAYS_COMPATIBLE", "BACKWARD", "FORWARD", "FULL",
                     "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")

# The numbers a user may set (`--config NAME=VALUE`): name -> (lowest, highest or None for no
# upper bound). -1 means "unlimited" where Pulsar allows it; 0 "none"/"disabled"/"unlimited"
# as the field's comment says. Settings not listed take any value of their type.
SETTING_RANGES: Final[dict[str, tuple[float, float | None]]] = {
    "default_num_partitions": (1, None),
    "max_num_partitions_per_partitioned_topic": (0, None),
    "broker_max_connections": (0, None),
    "max_connections_per_ip": (0, None),
    "max_incomplete_frames_bytes": (1, None),
    "max_producers_per_topic": (0, None),
    "max_consumers_per_topic": (0, None),
    "max_consumers_per_subscription": (0, None),
    "max_message_size_bytes": (1, None),
    "subscription_pattern_max_length": (1, None),
    "max_unacked_messages_per_consumer": (0, None),
    "max_unacked_messages_per_subscription": (0, None),
    "dispatcher_max_read_batch_size": (1, None),
    "dispatcher_max_read_size_bytes": (1, None),
    "dispatcher_max_round_robin_batch_size": (1, None),
    "active_consumer_failover_delay_ms": (0, None),
    "key_shared_consistent_hashing_replica_points": (1, None),
    "key_shared_look_ahead_msg_in_replay_threshold_per_consumer": (0, None),
    "key_shared_look_ahead_msg_in_replay_threshold_per_subscription": (0, None),
    "key_shared_unblocking_interval_ms": (0, None),
    "managed_ledger_max_entries_per_ledger": (1, None),
    "managed_ledger_max_size_per_ledger_bytes": (1, None),
    "managed_ledger_max_ledger_rollover_time_s": (0, None),
    "managed_ledger_min_ledger_rollover_time_s": (0, None),
    "managed_ledger_max_unacked_ranges_to_persist": (0, None),
    "managed_ledger_max_redelivery_counts_to_persist": (0, None),
    "managed_ledger_read_loads_in_flight_max": (1, None),
    "managed_ledger_read_loaded_bytes_max": (1, None),
    "managed_ledger_read_ahead_bytes_max": (0, None),
    "broker_deduplication_entries_interval": (1, None),
    "broker_deduplication_snapshot_interval_s": (0, None),
    "broker_deduplication_max_number_of_producers": (1, None),
    "broker_deduplication_producer_inactivity_timeout_s": (0, None),
    "delayed_delivery_tick_time_ms": (0, None),
    "delayed_delivery_max_delay_ms": (0, None),
    "delayed_delivery_tracked_in_memory_max": (0, None),
    "default_retention_time_minutes": (-1, None),
    "default_retention_size_mb": (-1, None),
    "retention_check_interval_s": (0, None),
    "ttl_duration_default_s": (0, None),
    "message_expiry_check_interval_s": (0, None),
    "backlog_quota_check_interval_s": (0, None),
    "broker_service_compaction_threshold_bytes": (0, None),
    "broker_service_compaction_monitor_interval_s": (1, None),
    "backlog_quota_default_limit_bytes": (-1, None),
    "backlog_quota_default_limit_s": (-1, None),
    "token_allowed_clock_skew_s": (0, None),
    "auth_refresh_check_interval_s": (0, None),
    "http_auth_failures_per_connection_max": (1, None),
    "storage_full_check_interval_s": (0, None),
    "stats_update_frequency_s": (1, None),
}
# Settings an earlier build accepted but nothing read: `--config NAME=...` names them as gone
# (name -> why), instead of guessing at a similar name.
REMOVED_SETTINGS: Final[dict[str, str]] = {
    "dispatcher_retry_backoff_initial_ms": "nothing read it (dispatch retries are not delayed)",
    "dispatcher_retry_backoff_max_ms": "nothing read it (dispatch retries are not delayed)",
}
# The settings that take one of a few names.
SETTING_CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "allow_auto_topic_creation_type": ("non-partitioned", "partitioned"),
    "backlog_quota_default_retention_policy": ("producer_request_hold", "producer_exception",
                                               "consumer_backlog_eviction"),
    "schema_compatibility_strategy": SCHEMA_STRATEGIES,
}


@dataclass(frozen=True)
class BrokerConfig:
    cluster_name: str = "standalone"

    # Topics and subscriptions.
    allow_auto_topic_creation: bool = True
    allow_auto_topic_creation_type: str = "non-partitioned"  # or "partitioned"
    default_num_partitions: int = 1
    allow_auto_subscription_creation: bool = True
    subscription_types_enabled: tuple[str, ...] = ("Exclusive", "Shared", "Failover",
                                                   "Key_Shared")
    max_producers_per_topic: int = 0  # 0 = unlimited
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    max_message_size_bytes: int = 5 * 1024 * 1024
    # Pulsar's maxNumPartitionsPerPartitionedTopic (0 = no limit, upstream's default). Every
    # partition is a managed ledger of this one process, created on the spot; more than this
    # buy no parallelism on one event loop, and 10^9 of them would never finish creating.
    max_num_partitions_per_partitioned_topic: int = 1024
    subscription_pattern_max_length: int = 50  # regex consumers' patterns, domain removed

    # Dispatch.
    max_unacked_messages_per_consumer: int = 50_000
    max_unacked_messages_per_subscription: int = 200_000
    dispatcher_max_read_batch_size: int = 100
    dispatcher_max_read_size_bytes: int = 5 * 1024 * 1024
    dispatcher_max_round_robin_batch_size: int = 20
    # Exclusive/Failover reads cover the permits at the consumer's average messages per entry
    # (Pulsar's preciseDispatcherFlowControl, off upstream; on here: see `entries_for_permits`)
    precise_dispatcher_flow_control: bool = True
    active_consumer_failover_delay_ms: int = 1000
    subscription_redelivery_tracker_enabled: bool = True
    acknowledgment_at_batch_index_level_enabled: bool = True

    # Key_Shared.
    key_shared_use_consistent_hashing: bool = True
    key_shared_consistent_hashing_replica_points: int = 100
    key_shared_look_ahead_msg_in_replay_threshold_per_consumer: int = 2000
    key_shared_look_ahead_msg_in_replay_threshold_per_subscription: int = 20_000
    key_shared_unblocking_interval_ms: int = 10

    # Managed ledgers and cursors.
    managed_ledger_max_entries_per_ledger: int = 50_000
    managed_ledger_max_size_per_ledger_bytes: int = 2048 * 1024 * 1024
    managed_ledger_max_ledger_rollover_time_s: int = 240 * 60
    managed_ledger_min_ledger_rollover_time_s: int = 10 * 60
    managed_ledger_max_unacked_ranges_to_persist: int = 10_000
    # Redelivery counts written with each cursor (the lowest positions; the rest are
    # memory-only and a crash loses them).
    managed_ledger_max_redelivery_counts_to_persist: int = 10_000
    # Reads that need the disk run in worker threads, never on the event loop: at most this
    # many at once, and a read starts only while the bytes the running ones may return stay
    # within the second limit (one may always run).
    managed_ledger_read_loads_in_flight_max: int = 4
    managed_ledger_read_loaded_bytes_max: int = 64 * 1024 * 1024
    # What subscriptions' read-aheads (dispatch/_reads.py) may hold loaded, over the broker.
    managed_ledger_read_ahead_bytes_max: int = 64 * 1024 * 1024

    # Deduplication.
    broker_deduplication_enabled: bool = False
    broker_deduplication_entries_interval: int = 1000
    broker_deduplication_snapshot_interval_s: int = 120
    broker_deduplication_max_number_of_producers: int = 10_000
    broker_deduplication_producer_inactivity_timeout_s: int = 360 * 60

    # Delayed delivery.
    delayed_delivery_enabled: bool = True
    delayed_delivery_tick_time_ms: int = 1000
    delayed_delivery_deliver_at_time_strict: bool = False
    delayed_delivery_max_delay_ms: int = 0  # 0 = no limit
    delayed_delivery_tracked_in_memory_max: int = 100_000

    # Retention, TTL, backlog quotas.
    default_retention_time_minutes: int = 0
    default_retention_size_mb: int = 0
    retention_check_interval_s: int = 120
    ttl_duration_default_s: int = 0
    message_expiry_check_interval_s: int = 300
    backlog_quota_check_interval_s: int = 60
    broker_service_compaction_threshold_bytes: int = 0  # compactionThreshold's default
    broker_service_compaction_monitor_interval_s: int = 60  # how often thresholds are checked
    backlog_quota_default_limit_bytes: int = -1
    backlog_quota_default_limit_s: int = -1
    backlog_quota_default_retention_policy: str = "producer_request_hold"

    # A full disk: how often the broker checks whether there is room again (writes resume
    # by themselves once a check succeeds).
    storage_full_check_interval_s: float = 5.0

    # Schemas: Pulsar's schemaCompatibilityStrategy (the default of namespaces that set
    # none or UNDEFINED), isAllowAutoUpdateSchemaEnabled, isSchemaValidationEnforced.
    schema_compatibility_strategy: str = "FULL"
    is_allow_auto_update_schema_enabled: bool = True
    is_schema_validation_enforced: bool = False
    # Authentication (security/_auth.py) and authorization (security/_authz.py).
    authentication_enabled: bool = False
    # Pulsar's authenticationProviders, by method name: "token", "basic", "tls".
    authentication_providers: tuple[str, ...] = ("token",)
    basic_auth_conf: str = ""  # Pulsar's basicAuthConf: a path, file:, data: or base64 text
    anonymous_user_role: str = ""  # Pulsar's anonymousUserRole ("": none; refused instead)
    authorization_enabled: bool = False  # Pulsar's authorizationEnabled
    # Failed authentications one admin HTTP connection may make before it is answered 429 and
    # closed (a binary-protocol connection is closed at its first failure, as in Pulsar).
    http_auth_failures_per_connection_max: int = 5
    token_secret_key: str = ""  # path, file:///path or data:;base64,... (HS tokens)
    token_public_key: str = ""  # same forms, DER or PEM (RS/ES tokens)
    token_auth_claim: str = "sub"  # the claim holding the role
    token_allowed_clock_skew_s: float = 0.0
    superuser_roles: tuple[str, ...] = ()
    auth_refresh_check_interval_s: float = 60.0  # Pulsar's authenticationRefreshCheckSeconds
    authenticate_metrics_endpoint: bool = False  # Pulsar's broker default
    # Pulsar's statsUpdateFrequencyInSecs: how often the msgRate*/msgThroughput* figures of
    # the stats and /metrics (and the per-interval histograms) are recomputed.
    stats_update_frequency_s: int = 60
    # Broker entry metadata (Pulsar's brokerEntryMetadataInterceptors): "timestamp" and/or
    # "index", or upstream's class names; empty = entries stored as the producer sent them.
    broker_entry_metadata_interceptors: tuple[str, ...] = ()

    # Connections (the binary protocol server, wire/_server.py). Pulsar's brokerMaxConnections
    # and maxConnectionsPerIp default to 0 (off); a single-process broker sets both: every
    # connection costs a file descriptor (shared with the storage's files) and a task on the
    # one event loop, so the total stays well inside a typical descriptor limit and one
    # address (a runaway client pool) cannot take every slot. 0 = no limit.
    broker_max_connections: int = 2048
    max_connections_per_ip: int = 512
    # Bytes held for frames not yet complete, summed over all connections (each may hold up
    # to one frame of max_message_size_bytes plus its command); a connection whose bytes push
    # the sum over this is closed. The default takes 25 maximal frames arriving at once.
    max_incomplete_frames_bytes: int = 128 * 1024 * 1024

    # Named advertised listeners (Pulsar's advertisedListeners and internalListenerName;
    # broker/_listeners.py): NAME:pulsar://HOST:PORT and NAME:pulsar+ssl://HOST:PORT items.
    # LOOKUP answers the listener a client names; the internal one (default: the first
    # named) is the broker's own URL, answered when the client names none.
    advertised_listeners: tuple[str, ...] = ()
    internal_listener_name: str = ""

    # Namespaces created at start.
    initial_namespaces: tuple[str, ...] = field(default=("public/default",))

    def __post_init__(self) -> None:
        """Raises ConfigurationError (a ValueError) naming the setting, its value and what it
        may be: a number out of its range, an unknown choice, broker entry metadata
        interceptor or malformed advertised listeners. Nothing is left behind: the config is
        not built."""
        from ._listeners import listeners_of

        check_settings(self)
        partitions_max = self.max_num_partitions_per_partitioned_topic
        if 0 < partitions_max < self.default_num_partitions:
            raise ConfigurationError(f"max_num_partitions_per_partitioned_topic must be 0 (no "
                                     f"limit) or at least default_num_partitions "
                                     f"({self.default_num_partitions}), not {partitions_max}")
        try:
            interceptors_of(self.broker_entry_metadata_interceptors)
            listeners_of(self)
        except ValueError as error:
            raise ConfigurationError(str(error)) from None


def check_settings(config: BrokerConfig) -> None:
    """Check each number against `SETTING_RANGES` and each choice against `SETTING_CHOICES`.

    Raises:
        ConfigurationError: the first setting out of range, e.g. "max_message_size_bytes
            must be at least 1, not -5".
    """
    for name, (low, high) in SETTING_RANGES.items():
        value = getattr(config, name)
        if value < low or (high is not None and value > high):
            allowed = f"at least {low}" if high is None else f"from {low} to {high}"
            raise ConfigurationError(f"{name} must be {allowed}, not {value}")
    for name, choices in SETTING_CHOICES.items():
        value = getattr(config, name)
        if value not in choices:
            raise ConfigurationError(f"{name} must be one of {', '.join(choices)}, "
                                     f"not {value!r}")


# Broker entry metadata interceptors (topics/_entry_metadata.py), by short name or upstream's
# class name.
INTERCEPTOR_TIMESTAMP: Final = "timestamp"
INTERCEPTOR_INDEX: Final = "index"
_UPSTREAM_PACKAGE: Final = "org.apache.pulsar.common.intercept."
_NAMES: Final = {
    INTERCEPTOR_TIMESTAMP: INTERCEPTOR_TIMESTAMP,
    "AppendBrokerTimestampMetadataInterceptor": INTERCEPTOR_TIMESTAMP,
    INTERCEPTOR_INDEX: INTERCEPTOR_INDEX,
    "AppendIndexMetadataInterceptor": INTERCEPTOR_INDEX,
}


def interceptors_of(names: Iterable[str]) -> frozenset[str]:
    """The interceptors a setting names, as `INTERCEPTOR_TIMESTAMP` / `INTERCEPTOR_INDEX`.

    Raises:
        ValueError: a name is neither a short name nor one of upstream's two class names.
    """
    found = set()
    for name in names:
        short = _NAMES.get(name.removeprefix(_UPSTREAM_PACKAGE))
        if short is None:
            raise ValueError(f"unknown broker entry metadata interceptor {name!r} (expected "
                             f"{', '.join(sorted(_NAMES))})")
        found.add(short)
    return frozenset(found)


def parse_value(kind: Any, text: str, name: str) -> Any:
    """`text` as a value of the type `kind` of the setting `name`: integers, finite floats,
    booleans (true/false/1/0/yes/no), comma-separated tuples of strings, strings; `X | None`
    parses as X.

    Raises:
        ConfigurationError: the text is not a value of that type (the message names `name`).
    """
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(each for each in typing.get_args(kind) if each is not type(None))
    if kind is bool:
        lowered = text.lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigurationError(f"{name} takes true or false, not {text!r}")
        return lowered in ("true", "1", "yes")
    if kind is int or kind is float:
        try:
            number = kind(text)
        except ValueError:
            raise ConfigurationError(f"{name} takes a number, not {text!r}") from None
        if not math.isfinite(number):
            raise ConfigurationError(f"{name} takes a finite number, not {text!r}")
        return number
    if typing.get_origin(kind) is tuple:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if kind is str:
        return text
    raise ConfigurationError(f"{name} cannot be set from text")
