"""The client's exception hierarchy, named as the official `pulsar` client names it.

Every error a client operation raises derives from `PulsarException` and says what failed and
where (the topic, subscription or URL). Errors the broker answers with a wire `ServerError`
code -- over TCP in an ERROR or SEND_ERROR frame, in-process as a `broker.BrokerError` or
`storage.StorageError` carrying the same code -- map to one class each (`error_for_code`).
Errors found on the client side (a full pending queue, a timeout, a closed object, a message
over the size limit) raise their class directly. Configuration mistakes (`InvalidConfiguration`,
`InvalidUrl`) are `ValueError`s too, as the official client raises `ValueError` for them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AlreadyClosed",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "ChecksumError",
    "ConnectError",
    "ConsumerAssignError",
    "ConsumerBusy",
    "ConsumerNotFound",
    "CumulativeAcknowledgementNotAllowedError",
    "IncompatibleSchema",
    "InvalidConfiguration",
    "InvalidMessage",
    "InvalidTopicName",
    "InvalidTxnStatusError",
    "InvalidUrl",
    "LookupError",
    "MessageTooBig",
    "NotAllowedError",
    "NotConnected",
    "OperationNotSupported",
    "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerQueueIsFull",
    "PulsarException",
    "ServiceUnitNotReady",
    "SubscriptionNotFound",
    "Timeout",
    "TooManyLookupRequestException",
    "TopicNotFound",
    "TopicTerminated",
    "TransactionConflict",
    "TransactionCoordinatorNotFoundError",
    "TransactionNotFound",
    "UnknownError",
    "UnsupportedVersionError",
    "error_for_code",
]


class PulsarException(Exception):
    """Root of every error a magnetar client operation raises."""


class UnknownError(PulsarException):
    """The broker failed for a reason it did not classify."""


class InvalidConfiguration(PulsarException, ValueError):
    """An argument or setting the client cannot work with; nothing was created."""


class InvalidUrl(PulsarException, ValueError):
    """The service URL is not one the client understands."""


class Timeout(PulsarException):
    """An operation did not complete in time (send timeout, receive timeout, operation timeout)."""


class LookupError(PulsarException):
    """A topic lookup failed."""


class ConnectError(PulsarException):
    """The client could not reach the broker, or could not open the data directory."""


class NotConnected(PulsarException):
    """The connection the operation needs is gone."""


class AlreadyClosed(PulsarException):
    """The client, producer, consumer or reader is closed."""


class AuthenticationError(PulsarException):
    pass


class AuthorizationError(PulsarException):
    pass


class BrokerMetadataError(PulsarException):
    pass


class BrokerPersistenceError(PulsarException):
    pass


class ChecksumError(PulsarException):
    pass


class ConsumerBusy(PulsarException):
    """The subscription does not admit another consumer (e.g. a second Exclusive one)."""


class ServiceUnitNotReady(PulsarException):
    pass


class ProducerBlockedQuotaExceededError(PulsarException):
    pass


class ProducerBlockedQuotaExceededException(PulsarException):
    pass


class UnsupportedVersionError(PulsarException):
    pass


class TopicNotFound(PulsarException):
    pass


class SubscriptionNotFound(PulsarException):
    pass


class ConsumerNotFound(PulsarException):
    pass


class TooManyLookupRequestException(PulsarException):
    pass


class TopicTerminated(PulsarException):
    pass


class ProducerBusy(PulsarException):
    pass


class InvalidTopicName(PulsarException, ValueError):
    pass


class IncompatibleSchema(PulsarException):
    pass


class ConsumerAssignError(PulsarException):
    pass


class TransactionCoordinatorNotFoundError(PulsarException):
    pass


class InvalidTxnStatusError(PulsarException):
    pass


class NotAllowedError(PulsarException):
    pass


class TransactionConflict(PulsarException):
    pass


class TransactionNotFound(PulsarException):
    pass


class ProducerFenced(PulsarException):
    pass


class InvalidMessage(PulsarException):
    pass


class OperationNotSupported(PulsarException):
    pass


class ProducerQueueIsFull(PulsarException):
    """The producer's pending queue holds `max_pending_messages` and may not block."""


class MessageTooBig(PulsarException):
    """The message is larger than the broker's maximum and chunking is off."""


class CumulativeAcknowledgementNotAllowedError(PulsarException):
    """Cumulative acks are not allowed on Shared and Key_Shared subscriptions."""


# The wire's ServerError codes (PulsarApi.proto), in order; one definition of the mapping.
_BY_CODE: Final[tuple[type[PulsarException], ...]] = (
    UnknownError,                            # 0 UnknownError
    BrokerMetadataError,                     # 1 MetadataError
    BrokerPersistenceError,                  # 2 PersistenceError
    AuthenticationError,                     # 3 AuthenticationError
    AuthorizationError,                      # 4 AuthorizationError
    ConsumerBusy,                            # 5 ConsumerBusy
    ServiceUnitNotReady,                     # 6 ServiceNotReady
    ProducerBlockedQuotaExceededError,       # 7
    ProducerBlockedQuotaExceededException,   # 8
    ChecksumError,                           # 9
    UnsupportedVersionError,                 # 10
    TopicNotFound,                           # 11
    SubscriptionNotFound,                    # 12
    ConsumerNotFound,                        # 13
    TooManyLookupRequestException,           # 14 TooManyRequests
    TopicTerminated,                         # 15 TopicTerminatedError
    ProducerBusy,                            # 16
    InvalidTopicName,                        # 17
    IncompatibleSchema,                      # 18
    ConsumerAssignError,                     # 19
    TransactionCoordinatorNotFoundError,     # 20
    InvalidTxnStatusError,                   # 21
    NotAllowedError,                         # 22
    TransactionConflict,                     # 23
    TransactionNotFound,                     # 24
    ProducerFenced,                          # 25
)

# Codes after which an operation may succeed when tried again (the broker is busy or moving).
RETRIABLE_CODES: Final = frozenset({1, 2, 5, 6, 7, 12, 13, 14})


def error_for_code(code: int, message: str, where: str) -> PulsarException:
    """The exception for a wire `ServerError` code.

    Args:
        code: the ServerError value (unknown values give `UnknownError`).
        message: the broker's text.
        where: what the client was doing, e.g. "create producer on persistent://public/default/t".
    """
    kind = _BY_CODE[code] if 0 <= code < len(_BY_CODE) else UnknownError
    return kind(f"{where}: {message}")
