"""`AuthenticationToken`: Pulsar's token authentication, as the official client takes it.

Over the binary protocol the token goes in CONNECT (`auth_method_name "token"`), and again in
AUTH_RESPONSE whenever the broker sends AUTH_CHALLENGE (a token about to expire is refreshed
this way: a callable supplier is asked anew each time). HTTP lookups send it as
`Authorization: Bearer <token>`. An embedded client has no authentication: the argument is
accepted and unused there, so one configuration serves both transports.
"""

from __future__ import annotations

from collections.abc import Callable

from ._errors import InvalidConfiguration

__all__ = ["AuthenticationToken"]

METHOD = "token"


class AuthenticationToken:
    """A JWT given as a string, or as a callable returning the current one.

    Raises:
        InvalidConfiguration: neither a non-empty string nor a callable.
    """

    def __init__(self, token: str | Callable[[], str]):
        if not callable(token) and not (isinstance(token, str) and token):
            raise InvalidConfiguration("AuthenticationToken needs a token string or a "
                                       "callable returning one")
        self._token = token

    @property
    def method(self) -> str:
        return METHOD

    def token(self) -> str:
        """The token to present now (a supplier is called each time)."""
        value = self._token() if callable(self._token) else self._token
        if not isinstance(value, str) or not value:
            raise InvalidConfiguration("the token supplier returned no token")
        return value
