"""Named advertised listeners: Pulsar's `advertisedListeners` and `internalListenerName`.

Theory of operation
-------------------
A listener is a name for one route to the broker: a `pulsar://` URL and, when the broker
serves TLS, a `pulsar+ssl://` URL. The setting is a list of `name:URL` items
(`internal:pulsar://10.0.0.5:6650,external:pulsar://broker.example.com:6650`); a name given
twice collects both of its URLs. `parse_listeners` checks it the way Pulsar's validator does:
every item names its listener, each listener has exactly one `pulsar://` URL and at most one
`pulsar+ssl://` URL (no other scheme), a host:port belongs to one listener only, and the
internal listener (`internal_listener_name`, by default the first one named) is one of them.
The standalone broker checks the rest at start-up (`check_tls`): a `pulsar+ssl://` URL for
every listener exactly when the TLS port runs, and no `--advertised-url` next to listeners
(Pulsar: advertisedListeners and advertisedAddress must not appear together).

Lookups. A client names the listener it wants (the C++ client's `listener_name`: LOOKUP's
`advertised_listener_name`; HTTP lookups: the `listenerName` query parameter, else the
`X-Pulsar-ListenerName` header). A blank name asks for the default: with listeners configured
the internal listener's URLs, which the standalone broker also advertises as its own; without
them the advertised URL(s). A name no listener has -- also when none are configured -- fails the
lookup with Pulsar's text, "the broker do not have NAME listener" (`ListenerNotFoundError`,
ServiceNotReady as upstream answers it; the C++ client recognises the message). Nothing else
looks at listeners: PARTITIONED_METADATA carries no listener name (its fields end at 6) and no
URL, and the binary server listens where `--host`/`--port` say whatever the URLs name.
"""

from __future__ import annotations

import functools
import types
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._errors import ServiceNotReadyError

if TYPE_CHECKING:
    from ._config import BrokerConfig

__all__ = [
    "AdvertisedListener",
    "ListenerNotFoundError",
    "Listeners",
    "check_tls",
    "is_service_url",
    "listeners_of",
    "parse_listeners",
]

PLAIN_SCHEME = "pulsar"
TLS_SCHEME = "pulsar+ssl"
PARSED_SETTINGS_MAX = 8  # distinct (advertised_listeners, internal name) settings kept parsed


class ListenerNotFoundError(ServiceNotReadyError):
    """A lookup asked for a listener the broker does not have (Pulsar's wording)."""

    def __init__(self, name: str):
        super().__init__(f"the broker do not have {name} listener")
        self.name = name


@dataclass(frozen=True)
class AdvertisedListener:
    """One named route to the broker.

    Attributes:
        name: the listener's name.
        broker_url: its `pulsar://host:port` URL.
        broker_url_tls: its `pulsar+ssl://host:port` URL (None: none configured).
    """

    name: str
    broker_url: str
    broker_url_tls: str | None = None


@dataclass(frozen=True)
class Listeners:
    """The configured listeners (empty: none) and the internal one's name ("" when none)."""

    by_name: Mapping[str, AdvertisedListener]
    internal_name: str = ""

    @property
    def internal(self) -> AdvertisedListener | None:
        """The internal listener, whose URLs are the broker's own (None: no listeners)."""
        return self.by_name.get(self.internal_name)

    def lookup(self, requested: str, default_url: str, default_url_tls: str | None,
               ) -> tuple[str, str | None]:
        """The (`pulsar://`, `pulsar+ssl://` or None) URLs a lookup asking for listener
        `requested` answers; a blank name gets the defaults.

        Raises:
            ListenerNotFoundError: no listener has that name (nothing else happens).
        """
        name = requested.strip()
        if not name:
            return default_url, default_url_tls
        listener = self.by_name.get(name)
        if listener is None:
            raise ListenerNotFoundError(name)
        return listener.broker_url, listener.broker_url_tls


def _parse_url(item: str, text: str) -> urllib.parse.SplitResult:
    try:
        url = urllib.parse.urlsplit(text)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"advertised_listeners: {item!r}: {exc}") from None
    if url.scheme not in (PLAIN_SCHEME, TLS_SCHEME) or not url.hostname or port is None \
            or url.path not in ("", "/") or url.query or url.fragment:
        raise ValueError(f"advertised_listeners: {item!r} is not NAME:pulsar://HOST:PORT or "
                         f"NAME:pulsar+ssl://HOST:PORT")
    return url


@functools.lru_cache(maxsize=PARSED_SETTINGS_MAX)
def parse_listeners(items: tuple[str, ...], internal_listener_name: str = "") -> Listeners:
    """The listeners of `advertised_listeners` items (see the module comment); no items, no
    listeners (the internal name alone is then ignored, as in Pulsar).

    Raises:
        ValueError: one line naming the item or rule that is broken.
    """
    urls: dict[str, list[urllib.parse.SplitResult]] = {}
    for item in items:
        name, sep, text = item.partition(":")
        name, text = name.strip(), text.strip()
        if not sep or not name or text.startswith("//"):
            raise ValueError(f"advertised_listeners: {item!r} does not name its listener "
                             f"(expected NAME:pulsar://HOST:PORT)")
        urls.setdefault(name, []).append(_parse_url(item, text))
    if not urls:
        return Listeners(types.MappingProxyType({}))
    internal = internal_listener_name.strip() or next(iter(urls))
    if internal not in urls:
        raise ValueError(f"internal_listener_name {internal!r} is not one of the "
                         f"advertised_listeners ({', '.join(urls)})")
    owners: dict[tuple[str, int], str] = {}
    found: dict[str, AdvertisedListener] = {}
    for name, entries in urls.items():
        by_scheme: dict[str, str] = {}
        for url in entries:
            if url.scheme in by_scheme:
                raise ValueError(f"advertised_listeners: listener {name!r} has more than one "
                                 f"{url.scheme}:// URL")
            by_scheme[url.scheme] = f"{url.scheme}://{url.netloc}"
            assert url.hostname is not None, "checked by _parse_url"
            assert url.port is not None, "checked by _parse_url"
            host_port = (url.hostname.lower(), url.port)
            owner = owners.setdefault(host_port, name)
            if owner != name:
                raise ValueError(f"advertised_listeners: {url.netloc} is given to listeners "
                                 f"{owner!r} and {name!r}; a host:port belongs to one only")
        if PLAIN_SCHEME not in by_scheme:
            raise ValueError(f"advertised_listeners: listener {name!r} has no pulsar:// URL")
        found[name] = AdvertisedListener(name, by_scheme[PLAIN_SCHEME], by_scheme.get(TLS_SCHEME))
    return Listeners(types.MappingProxyType(found), internal)


def listeners_of(config: BrokerConfig) -> Listeners:
    """The listeners of a `BrokerConfig` (parsed once per distinct setting).

    Raises:
        ValueError: as `parse_listeners`.
    """
    return parse_listeners(tuple(config.advertised_listeners), config.internal_listener_name)


def check_tls(listeners: Listeners, tls_running: bool) -> None:
    """Pulsar's start-up rule: with the TLS port running every listener names its
    `pulsar+ssl://` URL, without it none does.

    Raises:
        ValueError: one line naming the listener that breaks the rule.
    """
    for listener in listeners.by_name.values():
        if tls_running and listener.broker_url_tls is None:
            raise ValueError(f"advertised_listeners: listener {listener.name!r} has no "
                             f"pulsar+ssl:// URL, but the broker serves TLS (--tls-port)")
        if not tls_running and listener.broker_url_tls is not None:
            raise ValueError(f"advertised_listeners: listener {listener.name!r} has a "
                             f"pulsar+ssl:// URL, but the broker serves no TLS (--tls-port)")


def is_service_url(text: str, scheme: str) -> bool:
    """Whether `text` is `SCHEME://HOST:PORT` (a URL LOOKUP may answer with)."""
    try:
        parts = urllib.parse.urlsplit(text)
        return parts.scheme == scheme and bool(parts.hostname) and parts.port is not None
    except ValueError:  # a port out of range or not a number, a bad IPv6 literal
        return False
