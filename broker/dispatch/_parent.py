"""What a subscription needs from its topic, as Protocols, so that dispatch/ never imports
topics/ (the wings import downwards only).

`PersistentTopic` (topics/_topic.py) is a `SubscriptionParent` and `NonPersistentTopic`
(topics/_nonpersistent_topic.py) a `NonPersistentParent`; mypy checks both where the topics
create their subscriptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._config import BrokerConfig
    from .._names import TopicName
    from .._namespaces import EffectivePolicies
    from ..ledger._compacted import CompactedLedger
    from ..ledger._managed_ledger import ManagedLedger
    from ._subscription import Subscription

__all__ = ["NonPersistentParent", "ServiceState", "SubscriptionParent"]


class ServiceState(Protocol):
    """The broker service as a subscription sees it: its clock and whether it is stopping."""

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def stopping(self) -> bool: ...


class SubscriptionParent(Protocol):
    """The persistent topic a `Subscription` belongs to."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def name(self) -> TopicName: ...

    @property
    def policies(self) -> EffectivePolicies: ...

    @property
    def service(self) -> ServiceState: ...

    @property
    def managed_ledger(self) -> ManagedLedger: ...

    @property
    def fenced(self) -> bool: ...

    @property
    def compacted_view(self) -> CompactedLedger | None:
        """The topic's compacted view in force (None before any compaction)."""

    def messages_out(self, messages: int, size: int) -> None:
        """Count `messages` messages of `size` bytes dispatched."""

    def acks_changed(self) -> None:
        """A subscription's acknowledged position moved."""

    def read_failed(self, error: BaseException, subscription: Subscription) -> None:
        """The subscription's entries cannot be read, for good."""


class NonPersistentParent(Protocol):
    """The non-persistent topic a `NonPersistentSubscription` belongs to."""

    msg_out_counter: int
    bytes_out_counter: int

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def name(self) -> TopicName: ...
