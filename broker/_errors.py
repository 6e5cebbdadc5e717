"""The broker error hierarchy.

Every error the broker raises on purpose derives from `BrokerError` and carries the wire
`ServerError` code the server answers with (`code`) and whether the client is expected to
retry (`retriable`). `for_code` maps a code back to its class. Storage errors keep their own
hierarchy (`storage.StorageError`, which has a `code` too); the service converts them at
its boundary with `from_storage_error`.
"""

from __future__ import annotations

from magnetar.storage import StorageError

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BrokerError",
    "ConfigurationError",
    "ConsumerAssignError",
    "ConsumerBusyError",
    "ConsumerNotFoundError",
    "DiskFullError",
    "IncompatibleSchemaError",
    "InvalidPolicyError",
    "InvalidSchemaError",
    "InvalidTopicNameError",
    "MalformedPolicyError",
    "MetadataError",
    "NotAllowedError",
    "PartitionCountError",
    "PersistenceError",
    "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException",
    "ProducerBusyError",
    "ProducerFencedError",
    "ServiceNotReadyError",
    "SubscriptionNotFoundError",
    "TopicNotFoundError",
    "TopicTerminatedError",
    "for_code",
    "from_storage_error",
]


class BrokerError(Exception):
    """Root of the broker errors. `code` is the wire ServerError value."""

    code: int = 0  # UnknownError
    retriable: bool = False


class ConfigurationError(BrokerError, ValueError):
    """A setting the broker cannot start with (e.g. an unreadable key file, a value out of
    its range); never sent to clients, raised before anything listens. A ValueError too, as
    the settings' parsers raise for malformed values."""


class MetadataError(BrokerError):
    code = 1
    retriable = True


class PersistenceError(BrokerError):
    code = 2
    retriable = True


class AuthenticationError(BrokerError):
    """The client's credentials were missing, malformed, wrongly signed or expired.

    The message goes to the client; `detail` (never a credential) only to the broker's log.
    """

    code = 3

    def __init__(self, message: str = "", detail: str = ""):
        super().__init__(message)
        self.detail = detail

    def logged(self) -> str:
        """The message with its detail, for the broker's log."""
        return f"{self}: {self.detail}" if self.detail else str(self)


class AuthorizationError(BrokerError):
    """An authenticated role may not do what it asked (security/_authz.py)."""

    code = 4


class ConsumerBusyError(BrokerError):
    code = 5


class SubscriptionBusyError(ConsumerBusyError):
    """The subscription is being reset; Pulsar answers "Failed to fence subscription"
    (its SubscriptionBusyException goes out as ConsumerBusy; the admin API answers 412)."""


class ServiceNotReadyError(BrokerError):
    code = 6
    retriable = True


class ProducerBlockedQuotaExceededError(BrokerError):
    """producer_request_hold: the client retries until the backlog falls."""

    code = 7
    retriable = True


class ProducerBlockedQuotaExceededException(BrokerError):
    """producer_exception: not retried; pending sends fail."""

    code = 8


class DiskFullError(ProducerBlockedQuotaExceededException):
    """The broker's disk is full: publishing is refused (as for an exceeded quota with the
    producer_exception policy) until there is room again. The producer is closed; the
    official client fails its pending sends with ProducerBlockedQuotaExceededException and
    reconnects with backoff."""


class TopicNotFoundError(BrokerError):
    code = 11


class SubscriptionNotFoundError(BrokerError):
    code = 12
    retriable = True


class ConsumerNotFoundError(BrokerError):
    code = 13
    retriable = True


class TopicTerminatedError(BrokerError):
    code = 15


class ProducerBusyError(BrokerError):
    code = 16


class InvalidTopicNameError(BrokerError):
    code = 17


class IncompatibleSchemaError(BrokerError):
    code = 18


class InvalidSchemaError(IncompatibleSchemaError):
    """A schema definition that does not parse (bad Avro JSON, a truncated KEY_VALUE): the
    wire has no code of its own for it and answers IncompatibleSchema, as Pulsar does."""


class ConsumerAssignError(BrokerError):
    code = 19


class NotAllowedError(BrokerError):
    code = 22


class InvalidPolicyError(NotAllowedError):
    """A namespace or topic policy value out of its range or in conflict with another policy
    (retention below the backlog quota); nothing was stored. The admin API answers 412."""


class MalformedPolicyError(InvalidPolicyError):
    """A policy value that is not of the JSON shape the policy takes (a string for a number,
    a list for an object); nothing was stored. The admin API answers 400."""


class PartitionCountError(InvalidPolicyError):
    """A partition count below 1 or above `max_num_partitions_per_partitioned_topic`;
    nothing was created or stored. The admin API answers 406."""


class ProducerFencedError(BrokerError):
    """A newer exclusive producer took the topic over (its topic epoch is higher)."""

    code = 25


_BY_CODE: dict[int, type[BrokerError]] = {
    cls.code: cls for cls in (
        BrokerError, MetadataError, PersistenceError, AuthenticationError, AuthorizationError,
        ConsumerBusyError,
        ServiceNotReadyError,
        ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException,
        TopicNotFoundError, SubscriptionNotFoundError, ConsumerNotFoundError,
        TopicTerminatedError, ProducerBusyError, InvalidTopicNameError,
        IncompatibleSchemaError, ConsumerAssignError, NotAllowedError, ProducerFencedError)
}


def for_code(code: int) -> type[BrokerError]:
    """The error class for a wire ServerError code (BrokerError for unknown codes)."""
    return _BY_CODE.get(code, BrokerError)


def from_storage_error(error: StorageError) -> BrokerError:
    """The broker error to answer a client with when storage failed."""
    converted = for_code(error.code)(str(error))
    converted.__cause__ = error
    return converted
