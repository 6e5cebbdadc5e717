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
