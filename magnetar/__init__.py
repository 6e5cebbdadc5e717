"""Magnetar's client: `import magnetar`.

    client = magnetar.Client("./data")                  # the broker in this process
    client = magnetar.Client("pulsar://127.0.0.1:6650") # any Pulsar-protocol broker

The API follows the official `pulsar` Python client (`create_producer`, `subscribe`,
`create_reader`, `send`, `receive`, `acknowledge`, ...); `magnetar.asyncio` has the same on
asyncio. One client core (`_producer.py`, `_consumer.py`, `_group.py`, `_routing.py`) holds the
client-side behaviour over a small `Transport` interface (`_transport.py`) with two
implementations: in-process (`_embedded.py`, calling `broker.BrokerService` directly) and TCP
(`_tcp.py`, through `codec.Connection`).

| module         | what                                                              |
|----------------|-------------------------------------------------------------------|
| `_client.py`   | the synchronous API: Client, Producer, Consumer, Reader           |
| `asyncio.py`   | the asyncio API on the same core                                  |
| `_options.py`  | the official keyword arguments, checked                           |
| `_core.py`     | one client's transport and what it opened                         |
| `_loop.py`     | the private event-loop thread; closing at interpreter exit        |
| `_errors.py`   | the exception hierarchy (official names), wire codes mapped       |
| `_enums.py`    | ConsumerType, InitialPosition, CompressionType, ...               |

Names load on first use (PEP 562), so `import magnetar` imports neither the broker nor the
storage engine; only an embedded client does.

The rest of Magnetar installs under this name too: `magnetar.storage` (the storage engine),
`magnetar.codec` (the Pulsar wire codec) and `magnetar.broker` (the broker); in the repository
they are links to the top-level folders storage/, codec/ and broker/.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._enums import (
    BatchingType,
    CompressionType,
    ConsumerType,
    InitialPosition,
    KeySharedMode,
    PartitionsRoutingMode,
    ProducerAccessMode,
    RegexSubscriptionMode,
    Result,
)
from ._errors import *  # noqa: F403 -- the exception classes are public names
from ._errors import __all__ as _ERRORS

if TYPE_CHECKING:
    from ._auth import AuthenticationToken
    from ._client import Client, Consumer, ConsumerBatchReceivePolicy, Producer, Reader
    from ._dead_letter import ConsumerDeadLetterPolicy
    from ._message import Message
    from ._message_id import MessageId
    from ._options import ConsumerKeySharedPolicy

__all__ = [
    "AuthenticationToken",
    "BatchingType",
    "Client",
    "CompressionType",
    "Consumer",
    "ConsumerBatchReceivePolicy",
    "ConsumerDeadLetterPolicy",
    "ConsumerKeySharedPolicy",
    "ConsumerType",
    "InitialPosition",
    "KeySharedMode",
    "Message",
    "MessageId",
    "PartitionsRoutingMode",
    "Producer",
    "ProducerAccessMode",
    "Reader",
    "RegexSubscriptionMode",
    "Result",
    *[name for name in _ERRORS if name != "error_for_code"],
]

_LAZY: dict[str, str] = {
    "AuthenticationToken": "._auth",
    "Client": "._client",
    "ConsumerBatchReceivePolicy": "._client",
    "ConsumerDeadLetterPolicy": "._dead_letter",
    "ConsumerKeySharedPolicy": "._options",
    "Consumer": "._client",
    "Producer": "._client",
    "Reader": "._client",
    "Message": "._message",
    "MessageId": "._message_id",
}


def __getattr__(name: str) -> object:
    """Load a public name on first use (see the module comment)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
