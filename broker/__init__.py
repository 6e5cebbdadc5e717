"""Magnetar broker: Pulsar's messaging model on top of `storage` and `codec`.

`BrokerService` is the broker as the TCP server and the embedded client both call it:
topics (persistent on managed ledgers, non-persistent in memory, partitioned),
subscriptions with the four dispatchers (Exclusive, Failover, Shared, Key_Shared with
PIP-379 draining), cursors persisted through the journal's group commit, deduplication,
delayed delivery, tag filtering, retention, TTL and backlog quotas. `serve` and
`run_standalone` put it on the Pulsar binary protocol over TCP; `start_admin` serves the
REST v2 admin API and Prometheus `/metrics`. `AuthenticationService` (JWT tokens) and
`TlsOptions` secure both.

The package is laid out in wings (sub-packages), each importing only the ones below it
(tests/test_exports.py checks it):

    cli/        the `magnetar` command line and the standalone bootstrap
    wire/ http/ the binary protocol server; the admin REST API, HTTP lookup, metrics, stats
    topics/     the service, persistent and non-persistent topics, access modes, dedup
    schemas/    the schema registry and compatibility checks
    dispatch/   subscriptions, dispatchers, selectors, consumers
    ledger/ security/  managed ledgers and cursors; authentication and TLS
    (base)      _config, _errors, _names, _namespaces, _listeners, _tasks
    testing/    the seeded broker simulation (a harness)

`__all__` lists what a user of the package needs; everything else is imported from its wing.
The names that live in a wing load on first use, so `import broker` loads neither the HTTP
server (aiohttp), the command line nor the simulation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._config import BrokerConfig
from ._errors import (
    AuthenticationError,
    BrokerError,
    ConfigurationError,
    InvalidTopicNameError,
    NotAllowedError,
    PersistenceError,
    TopicNotFoundError,
    TopicTerminatedError,
)
from ._names import NamespaceName, TopicName

if TYPE_CHECKING:
    from .cli._standalone import StandaloneOptions, run_standalone
    from .dispatch._consumer import Consumer, ConsumerSink, Delivery, SubscribeSpec
    from .http._admin import start_admin
    from .ledger._position import Position
    from .security._auth import AuthenticationService
    from .security._authz import AuthorizationService
    from .security._tls import TlsOptions
    from .topics._service import BrokerService
    from .topics._topic import PersistentTopic, ProducerSpec
    from .wire._server import BrokerServer, serve

__all__ = [
    "AuthenticationError",
    "AuthenticationService",
    "AuthorizationService",
    "BrokerConfig",
    "BrokerError",
    "BrokerServer",
    "BrokerService",
    "ConfigurationError",
    "Consumer",
    "ConsumerSink",
    "Delivery",
    "InvalidTopicNameError",
    "NamespaceName",
    "NotAllowedError",
    "PersistenceError",
    "PersistentTopic",
    "Position",
    "ProducerSpec",
    "StandaloneOptions",
    "SubscribeSpec",
    "TlsOptions",
    "TopicName",
    "TopicNotFoundError",
    "TopicTerminatedError",
    "run_standalone",
    "serve",
    "start_admin",
]

# name -> the module it lives in, for the names loaded on first use.
_LAZY: dict[str, str] = {
    "AuthenticationService": ".security._auth",
    "AuthorizationService": ".security._authz",
    "BrokerServer": ".wire._server",
    "BrokerService": ".topics._service",
    "Consumer": ".dispatch._consumer",
    "ConsumerSink": ".dispatch._consumer",
    "Delivery": ".dispatch._consumer",
    "PersistentTopic": ".topics._topic",
    "Position": ".ledger._position",
    "ProducerSpec": ".topics._topic",
    "StandaloneOptions": ".cli._standalone",
    "SubscribeSpec": ".dispatch._consumer",
    "TlsOptions": ".security._tls",
    "run_standalone": ".cli._standalone",
    "serve": ".wire._server",
    "start_admin": ".http._admin",
}


def __getattr__(name: str) -> object:
    """Load a public name from its wing on first use (see the module comment)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
