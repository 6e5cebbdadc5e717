"""The client's enums, with the official `pulsar` client's member names.

`CompressionType` values are the wire values, so `int(CompressionType.ZSTD)` is what travels in
`MessageMetadata.compression`. The other enums carry the official names; their values are ours.
"""

from __future__ import annotations

import enum

__all__ = [
    "BatchingType",
    "CompressionType",
    "ConsumerType",
    "InitialPosition",
    "KeySharedMode",
    "PartitionsRoutingMode",
    "ProducerAccessMode",
    "RegexSubscriptionMode",
    "Result",
]


class CompressionType(enum.IntEnum):
    NONE = 0
    LZ4 = 1
    ZLib = 2
    ZSTD = 3
    SNAPPY = 4


class ConsumerType(enum.Enum):
    Exclusive = "Exclusive"
    Shared = "Shared"
    Failover = "Failover"
    KeyShared = "Key_Shared"  # the value is the broker's (and the wire's) spelling


class InitialPosition(enum.Enum):
    Latest = "latest"
    Earliest = "earliest"


class BatchingType(enum.Enum):
    Default = "Default"
    KeyBased = "KeyBased"


class PartitionsRoutingMode(enum.Enum):
    RoundRobinDistribution = "RoundRobinDistribution"
    UseSinglePartition = "UseSinglePartition"
    CustomPartition = "CustomPartition"


class ProducerAccessMode(enum.Enum):
    Shared = "Shared"
    Exclusive = "Exclusive"
    WaitForExclusive = "WaitForExclusive"
    ExclusiveWithFencing = "ExclusiveWithFencing"


class RegexSubscriptionMode(enum.Enum):
    PersistentOnly = "PERSISTENT"  # values: the GET_TOPICS_OF_NAMESPACE modes
    NonPersistentOnly = "NON_PERSISTENT"
    AllTopics = "ALL"


class KeySharedMode(enum.Enum):
    AutoSplit = "AUTO_SPLIT"
    Sticky = "STICKY"


class Result(enum.IntEnum):
    """An operation's outcome as the official client reports it (`send_async` callbacks):
    the official names and the C++ client's values; every failure but `Ok` is also the name of
    an exception class (`magnetar.Timeout`, ...) where the client raises it."""

    Ok = 0
    UnknownError = 1
    InvalidConfiguration = 2
    Timeout = 3
    LookupError = 4
    ConnectError = 5
    ReadError = 6
    AuthenticationError = 7
    AuthorizationError = 8
    ErrorGettingAuthenticationData = 9
    BrokerMetadataError = 10
    BrokerPersistenceError = 11
    ChecksumError = 12
    ConsumerBusy = 13
    NotConnected = 14
    AlreadyClosed = 15
    InvalidMessage = 16
    ConsumerNotInitialized = 17
    ProducerNotInitialized = 18
    ProducerBusy = 19
    TooManyLookupRequestException = 20
    InvalidTopicName = 21
    InvalidUrl = 22
    ServiceUnitNotReady = 23
    OperationNotSupported = 24
    ProducerBlockedQuotaExceededError = 25
    ProducerBlockedQuotaExceededException = 26
    ProducerQueueIsFull = 27
    MessageTooBig = 28
    TopicNotFound = 29
    SubscriptionNotFound = 30
    ConsumerNotFound = 31
    UnsupportedVersionError = 32
    TopicTerminated = 33
    CryptoError = 34
    IncompatibleSchema = 35
    ConsumerAssignError = 36
    CumulativeAcknowledgementNotAllowedError = 37
    TransactionCoordinatorNotFoundError = 38
    InvalidTxnStatusError = 39
    NotAllowedError = 40
    TransactionConflict = 41
    TransactionNotFound = 42
    ProducerFenced = 43
    MemoryBufferIsFull = 44
    Interrupted = 45

    @classmethod
    def of(cls, error: BaseException | None) -> Result:
        """The result for an exception (`Ok` for None): the member named as its class, else
        `UnknownError`."""
        if error is None:
            return cls.Ok
        return cls.__members__.get(type(error).__name__, cls.UnknownError)
