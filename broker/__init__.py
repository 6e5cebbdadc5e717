"""Magnetar broker: Pulsar's messaging model on top of `storage` and `codec`.

`BrokerService` is the broker as the TCP server and the embedded client both call it:
topics (persistent on managed ledgers, non-persistent in memory, partitioned),
subscriptions with the four dispatchers (Exclusive, Failover, Shared, Key_Shared with
PIP-379 draining), cursors persisted through the journal's group commit, deduplication,
delayed delivery, tag filtering, retention, TTL and backlog quotas. `serve` and
`run_standalone` put it on the Pulsar binary protocol over TCP; `start_admin` serves the
REST v2 admin API and Prometheus `/metrics`. `AuthenticationService` (JWT tokens, our own
`encode_token`/`decode_token`) and `TlsOptions` secure both.
"""

from ._config import BrokerConfig
from ._errors import (
    AuthenticationError,
    BrokerError,
    ConfigurationError,
    ConsumerAssignError,
    ConsumerBusyError,
    ConsumerNotFoundError,
    IncompatibleSchemaError,
    InvalidSchemaError,
    InvalidTopicNameError,
    MetadataError,
    NotAllowedError,
    PersistenceError,
    ProducerBlockedQuotaExceededError,
    ProducerBlockedQuotaExceededException,
    ProducerBusyError,
    ProducerFencedError,
    ServiceNotReadyError,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    TopicTerminatedError,
    for_code,
    from_storage_error,
)
from ._names import (
    NamespaceName,
    TopicName,
    matches_topics_pattern,
    strip_domain_scheme,
    topics_hash,
)
from ._namespaces import EffectivePolicies, NamespaceRegistry, SchemaPolicy
from .cli._standalone import StandaloneOptions, run_standalone, serve_standalone
from .dispatch._consumer import Consumer, ConsumerSink, Delivery, SubscribeSpec
from .dispatch._delayed import DelayedAdd, InMemoryDelayedDeliveryTracker
from .dispatch._draining import ConsumerDrainingStats, DrainingHash, DrainingHashesTracker
from .dispatch._pending_acks import PendingAck, PendingAcksMap
from .dispatch._selectors import (
    ConsistentHashingSelector,
    HashRange,
    HashRangeAutoSplitSelector,
    HashRangeExclusiveSelector,
    StickyKeyConsumerSelector,
    new_selector,
)
from .dispatch._subscription import Subscription
from .http._admin import AdminServer, RestError, admin_app, start_admin
from .http._lookup_http import LookupUrls
from .http._metrics import render_metrics
from .http._stats import internal_stats, topic_stats
from .ledger._cursor import ManagedCursor
from .ledger._managed_ledger import ManagedLedger, ManagedLedgerConfig
from .ledger._position import ManagedLedgerTerminatedError, Position
from .ledger._redelivery import RedeliveryCounts
from .schemas._schemas import SchemaEntry, SchemaRegistry, StoredSchema
from .security._auth import (
    AuthenticationProvider,
    AuthenticationService,
    AuthSession,
    Principal,
    TokenAuthenticationProvider,
)
from .security._jwt import TokenError, decode_token, encode_token
from .security._tls import TlsOptions
from .testing._simulation import SimulationConfig, SimulationReport, Violation, run_simulation
from .topics._access_modes import TOPIC_EPOCH_PROPERTY, ExclusiveAccess
from .topics._dedup import DEDUP_CURSOR_NAME, DeduplicationState, DedupResult
from .topics._entry_metadata import EntryMetadataAppender
from .topics._service import TOPIC_LISTENERS_MAX, BrokerService, Topic, TopicListener
from .topics._topic import (
    NonPersistentTopic,
    PersistentTopic,
    Producer,
    ProducerSpec,
    PublishResult,
)
from .wire._connection_handler import (
    KEEPALIVE_INTERVAL_S_DEFAULT,
    PENDING_SENDS_MAX_DEFAULT,
    ConnectionHandler,
    WireConsumerSink,
)
from .wire._server import BrokerServer, serve
from .wire._topic_watchers import WATCHERS_PER_CONNECTION_MAX, TopicListWatchers

__all__ = [
    "DEDUP_CURSOR_NAME",
    "KEEPALIVE_INTERVAL_S_DEFAULT",
    "PENDING_SENDS_MAX_DEFAULT",
    "TOPIC_EPOCH_PROPERTY",
    "TOPIC_LISTENERS_MAX",
    "WATCHERS_PER_CONNECTION_MAX",
    "AdminServer",
    "AuthSession",
    "AuthenticationError",
    "AuthenticationProvider",
    "AuthenticationService",
    "BrokerConfig",
    "BrokerError",
    "BrokerServer",
    "BrokerService",
    "ConfigurationError",
    "ConnectionHandler",
    "ConsistentHashingSelector",
    "Consumer",
    "ConsumerAssignError",
    "ConsumerBusyError",
    "ConsumerDrainingStats",
    "ConsumerNotFoundError",
    "ConsumerSink",
    "DedupResult",
    "DeduplicationState",
    "DelayedAdd",
    "Delivery",
    "DrainingHash",
    "DrainingHashesTracker",
    "EffectivePolicies",
    "EntryMetadataAppender",
    "ExclusiveAccess",
    "HashRange",
    "HashRangeAutoSplitSelector",
    "HashRangeExclusiveSelector",
    "InMemoryDelayedDeliveryTracker",
    "IncompatibleSchemaError",
    "InvalidSchemaError",
    "InvalidTopicNameError",
    "LookupUrls",
    "ManagedCursor",
    "ManagedLedger",
    "ManagedLedgerConfig",
    "ManagedLedgerTerminatedError",
    "MetadataError",
    "NamespaceName",
    "NamespaceRegistry",
    "NonPersistentTopic",
    "NotAllowedError",
    "PendingAck",
    "PendingAcksMap",
    "PersistenceError",
    "PersistentTopic",
    "Position",
    "Principal",
    "Producer",
    "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException",
    "ProducerBusyError",
    "ProducerFencedError",
    "ProducerSpec",
    "PublishResult",
    "RedeliveryCounts",
    "RestError",
    "SchemaEntry",
    "SchemaPolicy",
    "SchemaRegistry",
    "ServiceNotReadyError",
    "SimulationConfig",
    "SimulationReport",
    "StandaloneOptions",
    "StickyKeyConsumerSelector",
    "StoredSchema",
    "SubscribeSpec",
    "Subscription",
    "SubscriptionBusyError",
    "SubscriptionNotFoundError",
    "TlsOptions",
    "TokenAuthenticationProvider",
    "TokenError",
    "Topic",
    "TopicListWatchers",
    "TopicListener",
    "TopicName",
    "TopicNotFoundError",
    "TopicTerminatedError",
    "Violation",
    "WireConsumerSink",
    "admin_app",
    "decode_token",
    "encode_token",
    "for_code",
    "from_storage_error",
    "internal_stats",
    "matches_topics_pattern",
    "new_selector",
    "render_metrics",
    "run_simulation",
    "run_standalone",
    "serve",
    "serve_standalone",
    "start_admin",
    "strip_domain_scheme",
    "topic_stats",
]
