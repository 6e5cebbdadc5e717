"""`ClientCore`: one client's transport and everything it opened, on the client's loop.

The service URL picks the transport: `pulsar://` and `pulsar+ssl://` speak TCP
(`TcpTransport`), as do `http://` and `https://` after looking topics up over HTTP;
`file:///abs/path` or a plain path runs the broker in this process on that
data directory (`EmbeddedTransport`). `close` closes the producers (flushing them), the
consumers, then the transport -- for the embedded one, the broker and its storage.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from ._auth import AuthenticationToken
from ._errors import AlreadyClosed, InvalidUrl
from ._group import ConsumerGroup
from ._options import ConsumerOptions, ProducerOptions
from ._routing import ProducerSet
from ._tcp import TcpTransport
from ._tcp_connection import TlsSettings, parse_address
from ._transport import Transport

if TYPE_CHECKING:
    from magnetar.broker import BrokerConfig

__all__ = ["ClientCore", "ClientSettings", "Target", "parse_service_url"]


@dataclass(frozen=True)
class Target:
    """Where a client goes: a broker URL, or a data directory to run the broker on."""

    url: str | None = None
    data_dir: str | None = None


def parse_service_url(service_url: str) -> Target:
    """Decide the transport from the service URL.

    Raises:
        InvalidUrl: an empty or unsupported URL (the message lists the accepted forms).
    """
    if not isinstance(service_url, str) or not service_url.strip():
        raise InvalidUrl(f"service URL must be a non-empty string, not {service_url!r}")
    parts = urlsplit(service_url)
    if parts.scheme in ("pulsar", "pulsar+ssl"):
        parse_address(service_url)
        return Target(url=service_url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise InvalidUrl(f"file URL {service_url!r} must be file:///absolute/path")
        return Target(data_dir=unquote(parts.path))
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise InvalidUrl(f"no host in service URL {service_url!r}")
        return Target(url=service_url)
    if "://" in service_url:
        raise InvalidUrl(f"unsupported service URL {service_url!r}: use pulsar://host:port, "
                         f"pulsar+ssl://host:port, file:///data/dir, or a directory path")
    return Target(data_dir=os.path.abspath(service_url))


@dataclass(frozen=True)
class ClientSettings:
    operation_timeout_s: float = 30.0
    connection_timeout_s: float = 10.0
    tls: TlsSettings = field(default_factory=TlsSettings)
    broker_config: BrokerConfig | None = None
    authentication: AuthenticationToken | None = None  # TCP only
    partitions_update_interval_s: float = 60.0  # 0: partition counts are not looked up again


class ClientCore:
    """The state of one client on its loop (see the module comment)."""

    def __init__(self, transport: Transport, settings: ClientSettings):
        self.transport = transport
        self.settings = settings
        self._ids = itertools.count(1)
        # Open ones only: each one's close removes it (a client that opens and closes one
        # producer per request must not grow).
        self.producers: set[ProducerSet] = set()
        self.consumers: set[ConsumerGroup] = set()
        self.closed = False

    @classmethod
    async def open(cls, target: Target, settings: ClientSettings) -> ClientCore:
        transport: Transport
        if target.url is not None:
            transport = await TcpTransport.open(target.url, settings.tls,
                                                settings.operation_timeout_s,
                                                settings.connection_timeout_s,
                                                settings.authentication)
        else:
            from ._embedded import EmbeddedTransport  # loads the broker only when needed

            assert target.data_dir is not None
            transport = await EmbeddedTransport.open(target.data_dir, settings.broker_config)
        return cls(transport, settings)

    def _check_open(self) -> None:
        if self.closed:
            raise AlreadyClosed("the client is closed")

    async def create_producer(self, options: ProducerOptions) -> ProducerSet:
        self._check_open()
        producer = ProducerSet(self.transport, self._ids, options.topic, options.config,
                               options.routing, options.router,
                               self.settings.partitions_update_interval_s)
        await producer.start()
        self.producers.add(producer)
        producer.on_closed = functools.partial(self.producers.discard, producer)
        return producer

    async def subscribe(self, options: ConsumerOptions) -> ConsumerGroup:
        self._check_open()
        group = ConsumerGroup(self.transport, self._ids, options.config, options.topics,
                              options.pattern, options.regex_mode, options.discovery_period_s,
                              self.settings.partitions_update_interval_s)
        await group.start()
        self.consumers.add(group)
        group.on_closed = functools.partial(self.consumers.discard, group)
        return group

    async def partitions(self, topic: str) -> list[str]:
        self._check_open()
        count = await self.transport.partitioned_metadata(topic)
        return [topic] if count == 0 else [f"{topic}-partition-{i}" for i in range(count)]

    async def close(self, immediate: bool = False) -> None:
        """Close producers (flushed, unless `immediate`: then what they hold fails),
        consumers and the transport. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.transport.immediate_close = immediate
        try:
            await asyncio.gather(*(p.close() for p in list(self.producers)),
                                 return_exceptions=True)
            await asyncio.gather(*(c.close() for c in list(self.consumers)),
                                 return_exceptions=True)
        finally:
            await self.transport.close()
