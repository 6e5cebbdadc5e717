"""The codec's one error hierarchy.

`ProtocolError` is the root and is never raised itself. Its two subclasses say whose fault it was,
as in h11:

* `RemoteProtocolError`: bytes that came from outside (a peer, a stored entry, a serialized id)
  are malformed, truncated, oversized, or break a protocol rule. Every decoder in this package
  raises this and nothing else on bad input.
* `LocalProtocolError`: our own side asked for something the protocol forbids, for instance sending
  a command before the handshake or a frame larger than the agreed maximum.

Every error carries `reason`, a sentence for logs and for the `message` field of Pulsar's error
replies. Programmer errors (wrong argument types, broken invariants) surface as `TypeError`,
`ValueError` or `AssertionError` and are never converted.
"""

from __future__ import annotations

__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError"]


class ProtocolError(Exception):
    """Root of the codec's errors. Catch this; raise one of the two subclasses.

    Attributes:
        reason: what was wrong, as one sentence.
    """

    reason: str

    def __init__(self, reason: str) -> None:
        if type(self) is ProtocolError:
            raise TypeError("raise LocalProtocolError or RemoteProtocolError, not ProtocolError")
        super().__init__(reason)
        self.reason = reason


class LocalProtocolError(ProtocolError):
    """Our side tried to do something the protocol forbids; nothing was sent."""


class RemoteProtocolError(ProtocolError):
    """Input from outside (a peer, a stored entry, a serialized id) is malformed."""
