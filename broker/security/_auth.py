"""Authentication: who a connection or an admin request is, and keeping that true over time.

Theory of operation
-------------------
`AuthenticationService` holds the enabled providers by method name (Pulsar's
authenticationProviders): "token" (`_token.TokenAuthenticationProvider`, Pulsar's
AuthenticationProviderToken), "basic" and "tls" (`_basic.py`), the anonymous role (Pulsar's
anonymousUserRole: the role of a client that sends no credentials or names a method that is
not enabled) and the superuser roles (for `_authz.py`). It is built from the broker
configuration by `AuthenticationService.from_config`, which returns None when authentication
is off; keys and password files are read once, at start-up, so a bad one stops the broker
before it listens. Who a principal is and the provider interface live in `_principal.py`.

Binary protocol (wire reference 5.1). The connection handler calls `start_session` with the
CONNECT command: the method named there must be enabled and its credentials valid, or an
`AuthenticationError` comes back and the handler answers ERROR (request id -1, code
AuthenticationError, Pulsar's text "Failed to authenticate" followed by the reason) and
closes: one attempt per connection, as a second CONNECT is a protocol error.
On success the `AuthSession` it returns knows the role and when the credentials expire, and
runs Pulsar's refresh check every `auth_refresh_check_interval_s`:

* credentials still valid: nothing;
* expired, the client did not declare `supports_auth_refresh`: close the connection;
* expired, no challenge outstanding: send AUTH_CHALLENGE (method "token", data
  "PulsarAuthRefresh", the bytes Pulsar sends) and wait for AUTH_RESPONSE;
* expired, and the challenge of the previous check is still unanswered: close.

An AUTH_RESPONSE goes to `AuthSession.on_response`: fresh valid credentials for the same role
replace the old ones (producers and consumers are untouched); anything else -- a bad or
expired token, another role, another method -- is answered ERROR as a refused CONNECT is, and
closes the connection.

HTTP: `authenticate_http` takes the `Authorization` header (`Bearer <token>`, the form
Pulsar's admin client sends, or `Basic <base64>`), else the verified client certificate, else
the anonymous role, and returns the principal or raises `AuthenticationError`.

Key sources (`read_key_source`) are what Pulsar's `tokenSecretKey`/`tokenPublicKey` take: a
path, `file:///path`, or `data:;base64,<base64>`. A secret key is the raw bytes of the file
(what `tokens create-secret-key` writes); a public or private key is DER (what
`tokens create-key-pair` writes) or PEM.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Callable
from typing import Final

from magnetar.codec import pb

from .._config import BrokerConfig
from .._errors import AuthenticationError, ConfigurationError
from ._basic import (
    AUTH_METHOD_BASIC,
    AUTH_METHOD_TLS,
    BasicAuthenticationProvider,
    TlsAuthenticationProvider,
    read_basic_auth_conf,
)
from ._principal import AUTH_METHOD_TOKEN, AuthenticationProvider, Principal, read_key_source

__all__ = [
    "ANONYMOUS_METHOD",
    "AUTH_METHOD_TOKEN",
    "AUTH_REFUSED",
    "PROVIDER_NAMES",
    "REFRESH_AUTH_DATA",
    "AuthSession",
    "AuthenticationProvider",
    "AuthenticationService",
    "Principal",
    "read_key_source",
]

log = logging.getLogger(__name__)

REFRESH_AUTH_DATA: Final = b"PulsarAuthRefresh"  # Pulsar's AuthData.REFRESH_AUTH_DATA
ANONYMOUS_METHOD: Final = "anonymous"  # Principal.method of the anonymous role
AUTH_REFUSED: Final = "Failed to authenticate"  # Pulsar's text of the ERROR refusing credentials
# What authentication_providers may name.
PROVIDER_NAMES: Final = (AUTH_METHOD_TOKEN, AUTH_METHOD_BASIC, AUTH_METHOD_TLS)


# -- the service ------------------------------------------------------------------------------


class AuthenticationService:
    """The enabled providers, the anonymous role and the superuser roles (see the module
    comment).

    Args:
        providers: one per method name.
        superuser_roles: recorded for the authorization service and the log.
        refresh_check_interval_s: how often a connection's credentials are checked.
        anonymous_role: the role of a client that sends no credentials (or names a method
            that is not enabled), as Pulsar's anonymousUserRole; None: such a client is
            refused.
    """

    def __init__(self, providers: list[AuthenticationProvider],
                 superuser_roles: tuple[str, ...] = (),
                 refresh_check_interval_s: float = 60.0, anonymous_role: str | None = None):
        assert providers, "authentication needs at least one provider"
        self.providers = {provider.method_name: provider for provider in providers}
        self.superuser_roles = frozenset(superuser_roles)
        self.refresh_check_interval_s = refresh_check_interval_s
        self.anonymous_role = anonymous_role or None

    @classmethod
    def from_config(cls, config: BrokerConfig) -> AuthenticationService | None:
        """The service the configuration asks for; None when authentication is disabled.

        Raises:
            ConfigurationError: an unknown provider, or a provider without its key or file.
        """
        if not config.authentication_enabled:
            return None
        unknown = set(config.authentication_providers) - set(PROVIDER_NAMES)
        if unknown or not config.authentication_providers:
            raise ConfigurationError(f"authentication_providers must name some of "
                                     f"{', '.join(PROVIDER_NAMES)}, not "
                                     f"{', '.join(sorted(unknown)) or 'none'}")
        providers: list[AuthenticationProvider] = []
        for name in config.authentication_providers:
            if name == AUTH_METHOD_TOKEN:  # jwt and cryptography load only for it
                from ._token import token_provider
                providers.append(token_provider(config))
            elif name == AUTH_METHOD_BASIC:
                providers.append(BasicAuthenticationProvider(
                    read_basic_auth_conf(config.basic_auth_conf)))
            else:
                providers.append(TlsAuthenticationProvider())
        log.info("authentication enabled: %s%s%s",
                 ", ".join(config.authentication_providers),
                 f"; anonymous role {config.anonymous_user_role!r}"
                 if config.anonymous_user_role else "",
                 f"; superusers: {', '.join(config.superuser_roles)}"
                 if config.superuser_roles else "")
        return cls(providers, config.superuser_roles, config.auth_refresh_check_interval_s,
                   config.anonymous_user_role)

    def authenticate(self, method: str, auth_data: bytes,
                     tls_common_name: str | None = None) -> Principal:
        """Authenticate credentials of a method; a client without credentials, or naming a
        method that is not enabled, gets the anonymous role when there is one.

        Raises:
            AuthenticationError: the method is not enabled (and there is no anonymous role),
                or the credentials are bad.
        """
        provider = self.providers.get(method)
        if provider is None:
            if self.anonymous_role is not None:
                return Principal(self.anonymous_role, ANONYMOUS_METHOD)
            enabled = ", ".join(sorted(self.providers))
            if method in ("", "none"):
                raise AuthenticationError(f"authentication is required (method: {enabled})")
            raise AuthenticationError(f"authentication method {method!r} is not enabled "
                                      f"(enabled: {enabled})")
        principal = provider.authenticate(auth_data, tls_common_name)
        if principal.role in self.superuser_roles:
            log.debug("superuser %r authenticated", principal.role)
        return principal

    def costly(self, method: str, auth_data: bytes) -> bool:
        """Whether `authenticate` would compute a password hash (use
        `authenticate_off_loop`)."""
        provider = self.providers.get(method)
        return provider is not None and provider.costly(auth_data)

    async def authenticate_off_loop(self, method: str, auth_data: bytes,
                                    tls_common_name: str | None = None) -> Principal:
        """As `authenticate`, with a password hash computed off the event loop's thread.

        Raises:
            AuthenticationError: as `authenticate`; or too many password checks are pending.
        """
        provider = self.providers.get(method)
        if provider is None:
            return self.authenticate(method, auth_data, tls_common_name)
        return await provider.authenticate_off_loop(auth_data, tls_common_name)

    async def authenticate_http(self, authorization: str | None,
                                tls_common_name: str | None = None,
                                method: str | None = None) -> Principal:
        """Authenticate an admin HTTP request: `Authorization: Bearer <token>` (method
        "token"), `Authorization: Basic <base64 user:password>` ("basic"), or, without the
        header, the verified client certificate ("tls") or the anonymous role. `method` is
        the `X-Pulsar-Auth-Method-Name` header, when the client sent one. A password hash is
        computed off the event loop's thread.

        Without the method header, credentials no provider accepts get the anonymous role
        when there is one, as Pulsar's HTTP authentication does.

        Raises:
            AuthenticationError: nothing usable was sent, or the credentials are bad (and
                there is no anonymous role, or the method was named).
        """
        try:
            credentials = self._http_credentials(authorization, tls_common_name, method)
            if isinstance(credentials, Principal):
                return credentials
            return await self.authenticate_off_loop(*credentials, tls_common_name)
        except AuthenticationError as exc:
            # Pulsar's HTTP authentication: without a method header, credentials no provider
            # accepts leave the request anonymous when there is an anonymous role (the binary
            # protocol, and a request naming its method, are refused instead).
            if method is not None or self.anonymous_role is None:
                raise
            log.info("admin request with credentials no provider accepts (%s): anonymous role",
                     exc.logged())
            return Principal(self.anonymous_role, ANONYMOUS_METHOD)

    def _http_credentials(self, authorization: str | None, tls_common_name: str | None,
                          method: str | None) -> Principal | tuple[str, bytes]:
        """The anonymous principal, or the (method, auth data) to check.

        Raises:
            AuthenticationError: nothing usable, or not the form of the method.
        """
        scheme, _, value = (authorization or "").strip().partition(" ")
        scheme = scheme.lower()
        if method is None:
            if scheme == "bearer":
                method = AUTH_METHOD_TOKEN
            elif scheme == "basic":
                method = AUTH_METHOD_BASIC
            elif not authorization and tls_common_name and AUTH_METHOD_TLS in self.providers:
                method = AUTH_METHOD_TLS
            elif not authorization and self.anonymous_role is not None:
                return Principal(self.anonymous_role, ANONYMOUS_METHOD)
            elif not authorization:
                raise AuthenticationError("authentication required: send 'Authorization: "
                                          "Bearer <token>' or 'Authorization: Basic ...'")
            else:
                raise AuthenticationError("the Authorization header must use the Bearer or "
                                          "the Basic scheme")
        if method not in self.providers:
            raise AuthenticationError(f"authentication method {method[:40]!r} is not enabled "
                                      f"(enabled: {', '.join(sorted(self.providers))})")
        data = value.strip().encode("ascii", "replace")
        if method == AUTH_METHOD_BASIC:
            try:
                data = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise AuthenticationError("basic: the Authorization value is not base64") \
                    from None
        return method, data

    def start_session(self, connect: pb.CommandConnect, send: Callable[[pb.CommandAuthChallenge],
                      bool], close: Callable[[], None], peer: str,
                      server_version: str, tls_common_name: str | None = None,
                      refuse: Callable[[str], None] | None = None,
                      principal: Principal | None = None) -> AuthSession:
        """Authenticate a CONNECT (unless `principal` is what `authenticate_off_loop` made of
        it) and start the connection's refresh checks (`refuse` sends the ERROR that refuses
        refreshed credentials, before the close).

        Raises:
            AuthenticationError: the connection must be refused (nothing was started).
        """
        if principal is None:  # the deprecated enum auth_method names no token
            principal = self.authenticate(connect.auth_method_name, connect.auth_data,
                                          tls_common_name)
        supports_refresh = (connect.HasField("feature_flags")
                            and connect.feature_flags.supports_auth_refresh)
        session = AuthSession(self, principal, supports_refresh=supports_refresh, send=send,
                              close=close, peer=peer, server_version=server_version,
                              protocol_version=connect.protocol_version, refuse=refuse)
        log.info("connection from %s authenticated as %r (%s)", peer, principal.role,
                 principal.method)
        session.start()
        return session


class AuthSession:
    """The authentication of one connection and its refresh checks (see the module comment).

    Args:
        send: sends AUTH_CHALLENGE; returns False when it could not.
        close: closes the connection.
        refuse: sends ERROR with the given text (refreshed credentials refused).
    """

    def __init__(self, service: AuthenticationService, principal: Principal, *,
                 supports_refresh: bool, send: Callable[[pb.CommandAuthChallenge], bool],
                 close: Callable[[], None], peer: str, server_version: str,
                 protocol_version: int, refuse: Callable[[str], None] | None = None):
        self.service = service
        self.principal = principal
        self.supports_refresh = supports_refresh
        self.challenge_outstanding = False
        self.refreshes = 0
        self._send = send
        self._close = close
        self._refuse = refuse
        self._peer = peer
        self._server_version = server_version
        self._protocol_version = protocol_version
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False

    def start(self) -> None:
        """Schedule the next refresh check (none when the interval is <= 0)."""
        interval = self.service.refresh_check_interval_s
        if interval > 0 and not self._stopped:
            self._timer = asyncio.get_running_loop().call_later(interval, self._check)

    def stop(self) -> None:
        """No more checks (the connection closed). Idempotent."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self._stopped:
            return
        if self.principal.expired() and self._expire():
            return  # closed
        self.start()

    def _expire(self) -> bool:
        """Act on expired credentials; True when the connection was closed."""
        role = self.principal.role
        if not self.supports_refresh:
            return self._fail(f"the credentials of {role!r} expired and the client cannot "
                              "refresh them")
        if self.challenge_outstanding:
            return self._fail(f"{role!r} did not answer the refresh challenge in time")
        challenge = pb.CommandAuthChallenge(
            server_version=self._server_version, protocol_version=self._protocol_version,
            challenge=pb.AuthData(auth_method_name=self.principal.method,
                                  auth_data=REFRESH_AUTH_DATA))
        if not self._send(challenge):
            return self._fail("the refresh challenge could not be sent")
        self.challenge_outstanding = True
        log.debug("credentials of %r on %s expired: challenge sent", role, self._peer)
        return False

    def _method(self, data: pb.AuthData) -> str:
        return data.auth_method_name or self.principal.method

    def costly(self, response: pb.CommandAuthResponse) -> bool:
        """Whether checking this AUTH_RESPONSE means computing a password hash (use
        `on_response_off_loop`)."""
        data = response.response
        return self.service.costly(self._method(data), data.auth_data)

    def on_response(self, response: pb.CommandAuthResponse) -> None:
        """An AUTH_RESPONSE: accept fresh credentials of the same role or close."""
        if self._stopped:
            return
        data = response.response
        try:
            fresh = self.service.authenticate(self._method(data), data.auth_data)
        except AuthenticationError as exc:
            self._refused(exc)
            return
        self._refreshed(fresh)

    async def on_response_off_loop(self, response: pb.CommandAuthResponse) -> None:
        """As `on_response`, with a password hash computed off the event loop's thread
        (nothing is done when the connection closed meanwhile)."""
        if self._stopped:
            return
        data = response.response
        try:
            fresh = await self.service.authenticate_off_loop(self._method(data), data.auth_data)
        except AuthenticationError as exc:
            if not self._stopped:
                self._refused(exc)
            return
        if not self._stopped:
            self._refreshed(fresh)

    def _refused(self, exc: AuthenticationError) -> None:
        self._fail(f"refreshed credentials refused: {exc.logged()}", f"{AUTH_REFUSED}: {exc}")

    def _refreshed(self, fresh: Principal) -> None:
        if fresh.role != self.principal.role:
            self._fail(f"refreshed credentials are for role {fresh.role!r}, not "
                       f"{self.principal.role!r}",
                       f"{AUTH_REFUSED}: the refreshed credentials are for another role")
            return
        self.principal = fresh
        self.challenge_outstanding = False
        self.refreshes += 1
        log.info("credentials of %r on %s refreshed", fresh.role, self._peer)

    def _fail(self, why: str, refusal: str | None = None) -> bool:
        """Log `why`, send `refusal` (ERROR) when given, and close."""
        log.warning("closing the connection of %s: %s", self._peer, why)
        self.stop()
        if refusal is not None and self._refuse is not None:
            self._refuse(refusal)
        self._close()
        return True
