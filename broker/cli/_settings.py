"""Every setting of `magnetar standalone`, in one table: its key in a config file, where it
lands (a field of `BrokerConfig`, `StandaloneOptions`, `TlsOptions` or `StorageConfig`), its
unit and meaning. Defaults are the fields' own defaults and the broker's ranges and choices are
`_config.SETTING_RANGES` / `SETTING_CHOICES`; the table adds ranges only for the fields of the
other three, which have none elsewhere. `--print-config`, the config file and environment
reader (`_config_file.py`) and their validation all read this table.

Keys are Pulsar's (`ServiceConfiguration`, standalone.conf, the BookKeeper keys standalone.conf
carries) where Pulsar has the setting, and our own camelCase names otherwise (`pulsar=False`).
A key in a unit other than the field's has a `scale`: the field's value is the key's value
times it (Pulsar's `managedLedgerMaxSizePerLedgerMbytes` sets a byte count).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any, Final

from magnetar.storage import StorageConfig

from .._config import SETTING_CHOICES, SETTING_RANGES, BrokerConfig, parse_value
from .._errors import ConfigurationError
from .._listeners import is_service_url
from ..security._tls import TlsOptions
from ._standalone import StandaloneOptions

__all__ = ["SETTINGS", "Setting", "by_name"]

BROKER: Final = "broker"
STANDALONE: Final = "standalone"
TLS: Final = "tls"
STORAGE: Final = "storage"
_TARGETS: Final[dict[str, type]] = {BROKER: BrokerConfig, STANDALONE: StandaloneOptions,
                                    TLS: TlsOptions, STORAGE: StorageConfig}
MiB: Final = 1024 * 1024
PORT_MAX: Final = 65535


@dataclass(frozen=True)
class Setting:
    """One setting. `low`/`high` (field units) only for non-broker fields; a broker field's
    range is `SETTING_RANGES[field]`."""

    key: str
    target: str
    field: str
    unit: str
    meaning: str
    scale: Fraction = Fraction(1)
    low: float | None = None
    high: float | None = None
    pulsar: bool = True
    scheme: str | None = None  # a URL setting: SCHEME://HOST:PORT

    @property
    def kind(self) -> Any:
        """The field's type (`X | None` as X)."""
        kind = _hints(self.target)[self.field]
        args = [each for each in typing.get_args(kind) if each is not type(None)]
        return args[0] if type(None) in typing.get_args(kind) else kind

    @property
    def default(self) -> Any:
        """The field's default (field units)."""
        found = {each.name: each for each in dataclasses.fields(_TARGETS[self.target])}
        each = found[self.field]
        if each.default_factory is not dataclasses.MISSING:
            return each.default_factory()
        return None if each.default is dataclasses.MISSING else each.default

    @property
    def bounds(self) -> tuple[float, float | None] | None:
        """(lowest, highest or None) in field units, None: any value of its type."""
        if self.target == BROKER:
            return SETTING_RANGES.get(self.field)
        return None if self.low is None else (self.low, self.high)

    @property
    def choices(self) -> tuple[str, ...] | None:
        return SETTING_CHOICES.get(self.field) if self.target == BROKER else None

    def key_bounds(self) -> tuple[float, float | None] | None:
        """`bounds` in the key's unit (rounded inwards to whole numbers for integer keys)."""
        bounds = self.bounds
        if bounds is None:
            return None
        low, high = bounds
        if self.scale == 1:
            return bounds
        whole = self._key_kind() is int
        low_key = Fraction(low) / self.scale
        high_key = None if high is None else Fraction(high) / self.scale
        return (math.ceil(low_key) if whole else float(low_key),
                None if high_key is None else math.floor(high_key) if whole
                else float(high_key))

    def allowed(self, field_units: bool = False) -> str:
        """What a value may be, in words ("at least 1", "one of a, b"), in the key's unit
        (the field's with `field_units`)."""
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        bounds = self.bounds if field_units else self.key_bounds()
        kind = self.kind if field_units else self._key_kind()
        if bounds is None:
            return {bool: "true or false", int: "a whole number", float: "a number"}.get(
                kind, "any text" if kind is str else "a comma-separated list")
        low, high = bounds
        return f"at least {low:g}" if high is None else f"from {low:g} to {high:g}"

    def parse(self, text: str, name: str) -> Any:
        """The field's value for `text`, in the key's unit when `name` is the key and in the
        field's when it is the field's name (as `--config` takes them).

        Raises:
            ConfigurationError: not a value of its type, out of its range or not one of its
                choices; the message names `name` and what is allowed.
        """
        field_units = name == self.field or self.scale == 1
        value = parse_value(self.kind if field_units else self._key_kind(), text, name)
        choices = self.choices
        if choices and value not in choices:
            raise ConfigurationError(f"{name} must be {self.allowed()}, not {value!r}")
        bounds = self.bounds if field_units else self.key_bounds()
        if bounds is not None:
            low, high = bounds
            if value < low or (high is not None and value > high):
                raise ConfigurationError(f"{name} must be {self.allowed(field_units)}, "
                                         f"not {value}")
        if self.scheme is not None and not is_service_url(value, self.scheme):
            raise ConfigurationError(f"{name} must be {self.scheme}://HOST:PORT, not {value!r}")
        if field_units:
            return value
        scaled = Fraction(value) * self.scale
        return int(scaled) if self.kind is int else float(scaled)

    def show(self, value: Any) -> str:
        """A field's value as the key's text (what a config file would say)."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        if self.scale != 1:
            shown = Fraction(value) / self.scale
            return str(shown.numerator) if shown.denominator == 1 else f"{float(shown):g}"
        return str(value)

    def _key_kind(self) -> Any:
        kind = self.kind
        if self.scale == 1 or kind is not int:
            return kind
        return int if self.scale.denominator == 1 else float


@cache
def _hints(target: str) -> dict[str, Any]:
    return typing.get_type_hints(_TARGETS[target])


def _b(key: str, field: str, unit: str, meaning: str, scale: Fraction | int = 1,
       pulsar: bool = True) -> Setting:
    return Setting(key, BROKER, field, unit, meaning, Fraction(scale), pulsar=pulsar)


def _o(target: str, key: str, field: str, unit: str, meaning: str,
       low: float | None = None, high: float | None = None, scale: Fraction | int = 1,
       pulsar: bool = True, scheme: str | None = None) -> Setting:
    return Setting(key, target, field, unit, meaning, Fraction(scale), low, high, pulsar,
                   scheme)


_SERVER: Final = (
    _o(STANDALONE, "dataDir", "data_dir", "path", "the data directory (created when "
       "missing); --data-dir", pulsar=False),
    _o(STANDALONE, "bindAddress", "host", "host", "address the binary protocol and the admin "
       "API listen on; --host"),
    _o(STANDALONE, "brokerServicePort", "port", "port", "binary protocol port (0: any free "
       "port); --port", 0, PORT_MAX),
    _o(STANDALONE, "webServicePort", "http_port", "port", "admin HTTP port, also answering "
       "HTTP lookups; --http-port", 0, PORT_MAX),
    _o(STANDALONE, "brokerServicePortTls", "tls_port", "port", "TLS port, pulsar+ssl:// (empty: "
       "none; needs the TLS files); --tls-port", 0, PORT_MAX),
    _o(STANDALONE, "webServicePortTls", "https_port", "port", "admin HTTPS port (empty: "
       "none; needs the TLS files); --https-port", 0, PORT_MAX),
    _o(STANDALONE, "advertisedAddress", "advertised_address", "host", "host the lookups "
       "answer with, on the bound ports (empty: the bind address)"),
    _o(STANDALONE, "advertisedUrl", "advertised_url", "url", "the pulsar:// URL lookups "
       "answer with (empty: from advertisedAddress); --advertised-url", pulsar=False,
       scheme="pulsar"),
    _o(STANDALONE, "advertisedUrlTls", "advertised_url_tls", "url", "the pulsar+ssl:// URL "
       "lookups answer with; --advertised-url-tls", pulsar=False, scheme="pulsar+ssl"),
    _b("advertisedListeners", "advertised_listeners", "list", "named routes NAME:URL,...; "
       "lookups answer the listener a client names; --advertised-listeners"),
    _b("internalListenerName", "internal_listener_name", "name", "the listener answered to "
       "clients naming none (empty: the first); --internal-listener-name"),
    _o(STANDALONE, "keepAliveIntervalSeconds", "keepalive_interval_s", "s", "broker PING "
       "cadence; a connection silent a whole interval after a PING is closed (0: off); "
       "--keepalive-interval-s", 0),
    _o(STANDALONE, "maxPendingPublishRequestsPerConnection", "pending_sends_max",
       "messages", "SENDs awaiting receipts per connection before reading it pauses; "
       "--max-pending-sends", 1),
    _o(STANDALONE, "brokerShutdownTimeoutMs", "shutdown_grace_s", "ms", "at SIGTERM/SIGINT, "
       "how long received commands may take to finish; --shutdown-grace-s", 0,
       scale=Fraction(1, 1000)),
    _b("brokerMaxConnections", "broker_max_connections", "connections", "open connections "
       "at most (0: no limit)"),
    _b("maxConnectionsPerIp", "max_connections_per_ip", "connections", "open connections "
       "from one address at most (0: no limit)"),
    _b("maxIncompleteFramesBytes", "max_incomplete_frames_bytes", "bytes", "bytes of "
       "incomplete frames held over all connections; the one pushing past it is closed",
       pulsar=False),
    _b("clusterName", "cluster_name", "name", "the cluster this broker is"),
    _b("initialNamespaces", "initial_namespaces", "list", "namespaces created at start",
       pulsar=False),
)

_SECURITY: Final = (
    _o(TLS, "tlsCertificateFilePath", "cert_file", "path", "server certificate (PEM, chain "
       "after it); --tls-cert-file"),
    _o(TLS, "tlsKeyFilePath", "key_file", "path", "its private key (PEM); --tls-key-file"),
    _o(TLS, "tlsTrustCertsFilePath", "trust_certs_file", "path", "CAs (PEM) client "
       "certificates must chain to; --tls-trust-certs-file"),
    _o(TLS, "tlsRequireTrustedClientCertOnConnect", "require_trusted_client_cert", "",
       "refuse TLS clients without a trusted certificate; --tls-require-trusted-client-cert"),
    _b("authenticationEnabled", "authentication_enabled", "", "require authentication by "
       "one of authenticationProviders"),
    _b("authenticationProviders", "authentication_providers", "list", "authentication "
       "methods accepted, by name: token, basic, tls (Pulsar lists provider classes)"),
    _b("basicAuthConf", "basic_auth_conf", "key", "htpasswd-style users for basic: path, "
       "file:, data: or base64 text (bcrypt, $apr1$, $1$ or DES crypt hashes)"),
    _b("anonymousUserRole", "anonymous_user_role", "role", "role of a client without "
       "credentials when authentication is on (empty: such clients are refused)"),
    _b("authorizationEnabled", "authorization_enabled", "", "check every operation against "
       "superuser roles, tenant admins and granted permissions"),
    _b("httpAuthFailuresPerConnectionMax", "http_auth_failures_per_connection_max", "failures",
       "failed authentications one admin HTTP connection may make before 429 and close",
       pulsar=False),
    _b("tokenSecretKey", "token_secret_key", "key", "HS token key: path, file:///path or "
       "data:;base64,...; --auth-token-secret-key"),
    _b("tokenPublicKey", "token_public_key", "key", "RS/ES token public key, same forms; "
       "--auth-token-public-key"),
    _b("tokenAuthClaim", "token_auth_claim", "claim", "the token claim holding the role"),
    _b("tokenAllowedClockSkewSeconds", "token_allowed_clock_skew_s", "s", "clock skew "
       "tolerated on exp/nbf"),
    _b("superUserRoles", "superuser_roles", "list", "roles allowed every operation when "
       "authorizationEnabled"),
    _b("authenticationRefreshCheckSeconds", "auth_refresh_check_interval_s", "s", "how often "
       "expiring credentials are checked"),
    _b("authenticateMetricsEndpoint", "authenticate_metrics_endpoint", "", "/metrics needs "
       "authentication"),
)

_TOPICS: Final = (
    _b("allowAutoTopicCreation", "allow_auto_topic_creation", "", "create topics on first "
       "use"),
    _b("allowAutoTopicCreationType", "allow_auto_topic_creation_type", "", "what is created "
       "on first use"),
    _b("defaultNumPartitions", "default_num_partitions", "partitions", "partitions of an "
       "auto-created partitioned topic"),
    _b("maxNumPartitionsPerPartitionedTopic", "max_num_partitions_per_partitioned_topic",
       "partitions", "partitions per topic at most (0: no limit)"),
    _b("allowAutoSubscriptionCreation", "allow_auto_subscription_creation", "", "create "
       "subscriptions on first use"),
    _b("subscriptionTypesEnabled", "subscription_types_enabled", "list", "subscription "
       "types consumers may use"),
    _b("subscriptionPatternMaxLength", "subscription_pattern_max_length", "characters",
       "longest regex-consumer pattern"),
    _b("maxProducersPerTopic", "max_producers_per_topic", "producers", "per topic at most "
       "(0: no limit)"),
    _b("maxConsumersPerTopic", "max_consumers_per_topic", "consumers", "per topic at most "
       "(0: no limit)"),
    _b("maxConsumersPerSubscription", "max_consumers_per_subscription", "consumers",
       "per subscription at most (0: no limit)"),
    _b("maxMessageSize", "max_message_size_bytes", "bytes", "largest message (or batch) a "
       "producer may send"),
    _b("brokerEntryMetadataInterceptors", "broker_entry_metadata_interceptors", "list",
       "broker entry metadata stored with each entry: timestamp, index"),
    _b("schemaCompatibilityStrategy", "schema_compatibility_strategy", "", "default schema "
       "compatibility of namespaces"),
    _b("isAllowAutoUpdateSchemaEnabled", "is_allow_auto_update_schema_enabled", "",
       "producers may register new schema versions"),
    _b("isSchemaValidationEnforced", "is_schema_validation_enforced", "", "refuse producers "
       "without a schema on topics with one"),
)

_DISPATCH: Final = (
    _b("maxUnackedMessagesPerConsumer", "max_unacked_messages_per_consumer", "messages",
       "unacked messages before a Shared consumer is blocked (0: no limit)"),
    _b("maxUnackedMessagesPerSubscription", "max_unacked_messages_per_subscription",
       "messages", "unacked messages before a subscription is blocked (0: no limit)"),
    _b("dispatcherMaxReadBatchSize", "dispatcher_max_read_batch_size", "entries", "entries "
       "per storage read"),
    _b("dispatcherMaxReadSizeBytes", "dispatcher_max_read_size_bytes", "bytes", "bytes per "
       "storage read"),
    _b("preciseDispatcherFlowControl", "precise_dispatcher_flow_control", "",
       "an Exclusive/Failover read covers the permits at the consumer's average messages per "
       "entry, not one entry per permit"),
    _b("dispatcherMaxRoundRobinBatchSize", "dispatcher_max_round_robin_batch_size",
       "entries", "entries to one Shared consumer before the next"),
    _b("activeConsumerFailoverDelayTimeMillis", "active_consumer_failover_delay_ms", "ms",
       "delay before a Failover subscription's new active consumer gets messages"),
    _b("subscriptionRedeliveryTrackerEnabled", "subscription_redelivery_tracker_enabled", "",
       "count redeliveries per message"),
    _b("acknowledgmentAtBatchIndexLevelEnabled",
       "acknowledgment_at_batch_index_level_enabled", "", "acknowledge single messages of a "
       "batch"),
    _b("subscriptionKeySharedUseConsistentHashing", "key_shared_use_consistent_hashing", "",
       "Key_Shared assigns keys by consistent hashing"),
    _b("subscriptionKeySharedConsistentHashingReplicaPoints",
       "key_shared_consistent_hashing_replica_points", "points", "ring points per Key_Shared "
       "consumer"),
    _b("keySharedLookAheadMsgInReplayThresholdPerConsumer",
       "key_shared_look_ahead_msg_in_replay_threshold_per_consumer", "messages", "Key_Shared "
       "replay look-ahead per consumer (0: no limit)"),
    _b("keySharedLookAheadMsgInReplayThresholdPerSubscription",
       "key_shared_look_ahead_msg_in_replay_threshold_per_subscription", "messages",
       "Key_Shared replay look-ahead per subscription (0: no limit)"),
    _b("keySharedUnblockingIntervalMs", "key_shared_unblocking_interval_ms", "ms", "delay "
       "before replaying unblocked Key_Shared hashes"),
    _b("delayedDeliveryEnabled", "delayed_delivery_enabled", "", "honour deliverAt / "
       "deliverAfter"),
    _b("delayedDeliveryTickTimeMillis", "delayed_delivery_tick_time_ms", "ms", "delayed "
       "delivery timer granularity"),
    _b("isDelayedDeliveryDeliverAtTimeStrict", "delayed_delivery_deliver_at_time_strict", "",
       "never deliver before the deliverAt time, not even by a tick"),
    _b("delayedDeliveryMaxDelayInMillis", "delayed_delivery_max_delay_ms", "ms", "longest "
       "delay a producer may ask (0: no limit)"),
    _b("delayedDeliveryTrackedInMemoryMax", "delayed_delivery_tracked_in_memory_max",
       "messages", "delayed messages tracked in memory per subscription", pulsar=False),
)

_LEDGERS: Final = (
    _b("managedLedgerReadLoadsInFlightMax", "managed_ledger_read_loads_in_flight_max", "loads",
       "cold reads (disk) in flight at once in the read worker", pulsar=False),
    _b("managedLedgerReadLoadedBytesMax", "managed_ledger_read_loaded_bytes_max", "bytes",
       "bytes of entries the read worker holds loaded at once", pulsar=False),
    _b("managedLedgerReadAheadBytesMax", "managed_ledger_read_ahead_bytes_max", "bytes",
       "bytes of entries loaded ahead of consumers' permits, over all subscriptions (0: "
       "none)", pulsar=False),
    _b("managedLedgerMaxEntriesPerLedger", "managed_ledger_max_entries_per_ledger",
       "entries", "entries before a topic's ledger rolls over"),
    _b("managedLedgerMaxSizePerLedgerMbytes", "managed_ledger_max_size_per_ledger_bytes",
       "MiB", "size before a topic's ledger rolls over", scale=MiB),
    _b("managedLedgerMaxLedgerRolloverTimeMinutes", "managed_ledger_max_ledger_rollover_time_s",
       "minutes", "age at which a topic's ledger rolls over", scale=60),
    _b("managedLedgerMinLedgerRolloverTimeMinutes", "managed_ledger_min_ledger_rollover_time_s",
       "minutes", "age before which a ledger does not roll over", scale=60),
    _b("managedLedgerMaxUnackedRangesToPersist", "managed_ledger_max_unacked_ranges_to_persist",
       "ranges", "acknowledgment holes persisted per cursor"),
    _b("managedLedgerMaxRedeliveryCountsToPersist",
       "managed_ledger_max_redelivery_counts_to_persist", "messages", "redelivery counts "
       "persisted per cursor", pulsar=False),
    _b("statsUpdateFrequencyInSecs", "stats_update_frequency_s", "s", "interval of the "
       "msgRateIn/Out and throughput rates in stats and metrics"),
    _b("brokerDeduplicationEnabled", "broker_deduplication_enabled", "", "deduplicate "
       "producers' sequence ids by default"),
    _b("brokerDeduplicationEntriesInterval", "broker_deduplication_entries_interval",
       "entries", "entries between deduplication snapshots"),
    _b("brokerDeduplicationSnapshotIntervalSeconds", "broker_deduplication_snapshot_interval_s",
       "s", "time between deduplication snapshots"),
    _b("brokerDeduplicationMaxNumberOfProducers",
       "broker_deduplication_max_number_of_producers", "producers", "producers remembered "
       "per topic for deduplication"),
    _b("brokerDeduplicationProducerInactivityTimeoutMinutes",
       "broker_deduplication_producer_inactivity_timeout_s", "minutes", "a gone producer's "
       "deduplication state is dropped after", scale=60),
    _b("defaultRetentionTimeInMinutes", "default_retention_time_minutes", "minutes",
       "retention of acknowledged data (0: none, -1: forever)"),
    _b("defaultRetentionSizeInMB", "default_retention_size_mb", "MB", "retention of "
       "acknowledged data by size (0: none, -1: no limit)"),
    _b("retentionCheckIntervalInSeconds", "retention_check_interval_s", "s", "how often "
       "consumed ledgers are trimmed"),
    _b("ttlDurationDefaultInSeconds", "ttl_duration_default_s", "s", "message TTL of "
       "namespaces setting none (0: none)"),
    _b("messageExpiryCheckIntervalInMinutes", "message_expiry_check_interval_s", "minutes",
       "how often TTLs are applied", scale=60),
    _b("backlogQuotaCheckIntervalInSeconds", "backlog_quota_check_interval_s", "s", "how "
       "often backlog quotas are checked"),
    _b("brokerServiceCompactionThresholdInBytes", "broker_service_compaction_threshold_bytes",
       "bytes", "a topic is compacted once this much is not compacted yet (the "
       "compactionThreshold policy's default; 0: never)"),
    _b("brokerServiceCompactionMonitorIntervalInSeconds",
       "broker_service_compaction_monitor_interval_s", "s", "how often compaction thresholds "
       "are checked"),
    _b("backlogQuotaDefaultLimitBytes", "backlog_quota_default_limit_bytes", "bytes",
       "default backlog quota by size (-1: none)"),
    _b("backlogQuotaDefaultLimitSecond", "backlog_quota_default_limit_s", "s", "default "
       "backlog quota by age (-1: none)"),
    _b("backlogQuotaDefaultRetentionPolicy", "backlog_quota_default_retention_policy", "",
       "what a full backlog quota does"),
    _b("storageFullCheckIntervalSeconds", "storage_full_check_interval_s", "s", "after a "
       "disk-full error, how often the disk is checked for room", pulsar=False),
)

_STORAGE: Final = (
    _o(STORAGE, "journalSyncData", "journal_sync", "", "acknowledge after fdatasync "
       "(false: after the write, syncing every journalSyncIntervalMs; a power loss may lose "
       "that much)"),
    _o(STORAGE, "journalSyncIntervalMs", "journal_sync_interval_ms", "ms", "sync cadence "
       "with journalSyncData=false", 1, pulsar=False),
    _o(STORAGE, "journalCallerSyncsWhenIdle", "journal_caller_syncs_when_idle", "", "a "
       "blocking caller syncs its own add when the journal is idle", pulsar=False),
    _o(STORAGE, "journalMaxSizeMB", "journal_segment_bytes_max", "MiB", "journal segment "
       "size before a new one starts", 1, scale=MiB),
    _o(STORAGE, "journalBatchBytesMax", "journal_batch_bytes_max", "bytes", "bytes written "
       "per journal batch", 1, pulsar=False),
    _o(STORAGE, "journalQueueRequestsMax", "journal_queue_requests_max", "requests", "adds "
       "queued for the journal before callers wait", 1, pulsar=False),
    _o(STORAGE, "journalSegmentsKeptMax", "journal_segments_kept_max", "segments", "old "
       "journal segments kept after a checkpoint", 0, pulsar=False),
    _o(STORAGE, "entrySizeBytesMax", "entry_size_bytes_max", "bytes", "largest stored entry "
       "(holds maxMessageSize plus frame padding and entry metadata)", 1, pulsar=False),
    _o(STORAGE, "dbStorage_writeCacheMaxSizeMb", "write_cache_bytes_max", "MiB", "write "
       "cache of entries not yet checkpointed (at least 2 entries of entrySizeBytesMax)", 1,
       scale=MiB),
    _o(STORAGE, "writeCacheWaitMsMax", "write_cache_wait_ms_max", "ms", "how long an add "
       "waits for room in a full write cache", 0, pulsar=False),
    _o(STORAGE, "flushInterval", "checkpoint_interval_ms", "ms", "checkpoint cadence "
       "(write cache to entry logs)", 1),
    _o(STORAGE, "entryLogSizeLimit", "entry_log_bytes_max", "bytes", "entry log size "
       "before a new one starts", MiB, 2**32 - 1),
    _o(STORAGE, "openEntryLogsMax", "open_entry_logs_max", "files", "entry logs kept open "
       "for reads", 1, pulsar=False),
    _o(STORAGE, "readBatchBytesMax", "read_batch_bytes_max", "bytes", "bytes per storage "
       "read batch", 1, pulsar=False),
    _o(STORAGE, "gcWaitTime", "gc_interval_ms", "ms", "entry log garbage collection "
       "cadence", 1),
    _o(STORAGE, "tombstonesPurgedPerCheckpointMax", "tombstones_purged_per_checkpoint_max",
       "ledgers", "deleted ledgers' records a checkpoint removes once its mark is past "
       "their deletes", 1, pulsar=False),
    _o(STORAGE, "entryLogCompactionLiveRatioMin", "compaction_live_ratio_min", "ratio",
       "entry logs less live than this are compacted", 0, 1, pulsar=False),
    _o(STORAGE, "lmdbMapBytes", "lmdb_map_bytes", "bytes", "LMDB index map size (its "
       "largest size)", MiB, pulsar=False),
    _o(STANDALONE, "skipCorruptJournalSegments", "skip_corrupt_journal_segments", "",
       "start despite a corrupt journal record, LOSING the rest of its segment; "
       "--skip-corrupt-journal-segments", pulsar=False),
)

# (section title, its settings), in --print-config's order.
SECTIONS: Final = (("Server", _SERVER), ("Security", _SECURITY), ("Topics", _TOPICS),
                   ("Dispatch", _DISPATCH), ("Ledgers, deduplication, retention", _LEDGERS),
                   ("Storage", _STORAGE))
SETTINGS: Final[tuple[Setting, ...]] = tuple(each for _, group in SECTIONS for each in group)
_BY_KEY: Final = {each.key: each for each in SETTINGS}
_BY_FIELD: Final = {(each.target, each.field): each for each in SETTINGS}


def by_name(name: str) -> Setting | None:
    """The setting a key names, or (as `--config` always took them) a BrokerConfig field or
    another target's field name."""
    found = _BY_KEY.get(name)
    if found is not None:
        return found
    for target in (BROKER, STANDALONE, STORAGE, TLS):
        found = _BY_FIELD.get((target, name))
        if found is not None:
            return found
    return None


def names() -> list[str]:
    """Every key and field name `by_name` knows (for "did you mean")."""
    return [*_BY_KEY, *(each.field for each in SETTINGS)]
