"""What the command handlers of one connection share: its narrow view, the server's context,
failure replies and message-id helpers.

Theory of operation
-------------------
A connection (`_connection_handler.ConnectionHandler`) owns the socket side of the protocol:
handshake, authentication, keep-alive, frame reading and its limits, close and clean-up. The
commands a client sends about its work are served by one small class per area, each owning
the state of its area:

* `_producers.ProducerCommands`: PRODUCER, SEND, receipts, CLOSE_PRODUCER;
* `_consumers.ConsumerCommands`: SUBSCRIBE, FLOW, ACK, REDELIVER, SEEK, UNSUBSCRIBE,
  GET_LAST_MESSAGE_ID, CONSUMER_STATS, CLOSE_CONSUMER, and the MESSAGE frames of deliveries;
* `_discovery.DiscoveryCommands`: LOOKUP, PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE,
  GET_SCHEMA, GET_OR_CREATE_SCHEMA and the topic-list watch commands.

With authorization enabled (`ServerContext.authz`), PRODUCER, SUBSCRIBE, LOOKUP,
PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE and GET_SCHEMA are checked against the
connection's role before anything is done (`security/_authz.py`); a refusal is
AuthorizationError with Pulsar's text, in the reply form of the command, and an INFO line
naming the peer, the role, the action and the resource.

Each area class sees its connection only through `ConnectionView`: the service and the
server's context, the client's declared traits, sending a command or writing encoded bytes,
the standard replies (SUCCESS, ERROR), logging a failed request, and running a command as a
task the connection tracks. No area class imports the connection or another area; the
connection's dispatch table maps every command type to one method of one of them.

Failure forms follow wire reference §12 exactly: ERROR for PRODUCER, SUBSCRIBE, SEEK,
UNSUBSCRIBE, GET_LAST_MESSAGE_ID and GET_TOPICS_OF_NAMESPACE; the failure inside the response
for PARTITIONED_METADATA, LOOKUP, GET_SCHEMA, CONSUMER_STATS and ACK receipts; SEND_ERROR for
a publish. `server_error` gives the code and message of every one of them. Replies echo
request ids verbatim and are never keyed by them: the client uses two request-id counters, so
the same id may be in flight twice (wire reference §5.6). Producers and consumers are keyed by
the client's ids, which are unique per connection only.

Names are checked before anything is created (`_names.py`): an over-long topic is
InvalidTopicName, an over-long subscription, initial subscription or producer name ProducerBusy
(upstream's answer to a refused name).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from google.protobuf.message import Message

from magnetar.codec import pb
from magnetar.storage import StorageError

from .._errors import AuthorizationError, BrokerError, from_storage_error
from ..schemas._schemas import SchemaRegistry
from ..security._auth import AuthenticationService
from ..security._authz import AuthorizationService
from ..topics._service import BrokerService
from ._gather_write import Buffers

__all__ = [
    "KEEPALIVE_INTERVAL_S_DEFAULT",
    "PENDING_SENDS_MAX_DEFAULT",
    "REQUEST_ID_NONE",
    "SHUTTING_DOWN",
    "TRANSACTIONS_DISABLED",
    "CloseConnection",
    "ConnectionView",
    "ServerContext",
    "authorize",
    "carries_schema",
    "id_data",
    "key_values",
    "server_error",
    "signed",
]

log = logging.getLogger(__name__)

UINT64_MASK: Final = (1 << 64) - 1
INT64_MAX: Final = (1 << 63) - 1
REQUEST_ID_NONE: Final = UINT64_MASK  # broker-initiated CLOSE_PRODUCER / CLOSE_CONSUMER
PENDING_SENDS_MAX_DEFAULT: Final = 1000  # per connection (Pulsar's maxPendingPublishRequests)
KEEPALIVE_INTERVAL_S_DEFAULT: Final = 30.0
SCHEMA_TYPE_NONE: Final = 0  # Schema.Type "None": what bytes producers may send; no schema
# NotAllowedError's text for anything transactional, as Pulsar answers with its coordinator off
TRANSACTIONS_DISABLED: Final = "Transactions are not enabled."
SHUTTING_DOWN: Final = "The broker is shutting down"  # ServiceNotReady for a new producer/consumer

assert REQUEST_ID_NONE == 2**64 - 1
assert pb.Schema.Type.Value("None") == SCHEMA_TYPE_NONE


class CloseConnection(Exception):
    """The client broke a rule that Pulsar answers by closing the connection."""


@dataclass
class ServerContext:
    """What every connection of one server shares.

    Attributes:
        service: the broker.
        advertised_url: what LOOKUP answers; equal to the client's service URL, it keeps
            everything on one connection.
        schemas: the schema registry.
        advertised_url_tls: the `pulsar+ssl://` URL LOOKUP answers too ("": no TLS).
        auth: the authentication service (None: authentication is disabled).
        authz: the authorization service when authorization is enabled (None: every
            authenticated client may do everything).
        keepalive_interval_s: PING cadence (<= 0 disables the broker's PINGs).
        pending_sends_max: unanswered SENDs per connection before the server stops reading.
        accepting: False while shutting down: new producers and consumers are refused with
            ServiceNotReady (the client retries, elsewhere or later).
    """

    service: BrokerService
    advertised_url: str
    schemas: SchemaRegistry
    keepalive_interval_s: float = KEEPALIVE_INTERVAL_S_DEFAULT
    pending_sends_max: int = PENDING_SENDS_MAX_DEFAULT
    accepting: bool = True
    advertised_url_tls: str = ""
    auth: AuthenticationService | None = None
    authz: AuthorizationService | None = None


class ConnectionView(Protocol):
    """What a command-handler class may use of its connection (see the module comment)."""

    @property
    def ctx(self) -> ServerContext:
        """The server's shared state (limits, schemas, advertised URLs, shutting down)."""

    @property
    def service(self) -> BrokerService:
        """The broker."""

    @property
    def peer(self) -> str:
        """The client's address, for stats and logs."""

    @property
    def client_version(self) -> str:
        """What the client declared in CONNECT."""

    @property
    def role(self) -> str | None:
        """The authenticated role (None: no authentication)."""

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (nothing is sent any more)."""

    @property
    def wants_entry_metadata(self) -> bool:
        """Whether the client declared supports_broker_entry_metadata."""

    @property
    def peer_accepted_types(self) -> frozenset[int] | None:
        """The command types the client can take (None: any)."""

    def send(self, body: Message) -> bool:
        """Send one command; False when it could not be sent (closed, or refused: logged)."""

    def encode(self, body: Message, entry: bytes | None = None) -> bytes:
        """One command's frame (with a stored entry for MESSAGE), to `write` later."""

    def check_send(self, command_type: int) -> None:
        """Before writing frames built without `encode` (`message_frame`): raise the
        codec's LocalProtocolError if this command type may not be sent now."""

    @property
    def frame_size_bytes_max(self) -> int:
        """The largest frame the connection sends (totalSize)."""

    def write(self, data: bytes) -> None:
        """Write encoded frames to the socket; never blocks."""

    def write_parts(self, parts: Buffers) -> None:
        """Write encoded frames given as separate buffers, in order; never blocks."""

    def write_soon(self, data: bytes) -> None:
        """Write encoded frames at the end of this loop turn, together with the turn's other
        `write_soon` frames (one transport write); earlier than any later `send`/`write`."""

    def check_write_room(self) -> None:
        """After writing deliveries: pause them while the socket's buffer is full."""

    def success(self, request_id: int) -> None:
        """Reply SUCCESS."""

    def error(self, request_id: int, exc: BaseException) -> None:
        """Reply ERROR for a failed request (`server_error`), logged (`log_failure`)."""

    def error_code(self, request_id: int, code: int, message: str) -> None:
        """Reply ERROR with a given code and message."""

    def log_failure(self, exc: BaseException) -> None:
        """Log a failed request: a refusal at INFO, a bug at ERROR once, then DEBUG."""

    def warn_once(self, key: str, message: str, *args: object) -> None:
        """A client's mistake: WARNING the first time on this connection, DEBUG after."""

    def spawn(self, work: Awaitable[object]) -> None:
        """Run a command as a task the connection tracks (shutdown waits for it); a future
        is tracked as it is."""


def authorize(view: ConnectionView, action: str, resource: str,
              allowed: Callable[[AuthorizationService, str | None], bool],
              refused: str) -> None:
    """Check, when authorization is enabled, that the connection's role may do `action` on
    `resource`; a refusal is logged with the peer, role, action and resource.

    Args:
        allowed: asks the service (with the role).
        refused: Pulsar's text for the refusal.

    Raises:
        AuthorizationError: refused (nothing was done).
    """
    authz = view.ctx.authz
    if authz is None:
        return
    role = view.role
    try:
        if allowed(authz, role):
            return
    except AuthorizationError as exc:
        log.info("%s: role %r may not %s %s: %s", view.peer, role, action, resource[:300], exc)
        raise
    log.info("%s: role %r may not %s %s", view.peer, role, action, resource[:300])
    raise AuthorizationError(refused)


def server_error(exc: BaseException) -> tuple[int, str]:
    """The wire `ServerError` code and message that answer a failed operation.

    Args:
        exc: what the service (or storage) raised.

    Returns:
        `(code, message)`: the error's own code for broker and storage errors, UnknownError
        for anything else.
    """
    if isinstance(exc, BrokerError):
        return exc.code, str(exc) or type(exc).__name__
    if isinstance(exc, StorageError):
        return from_storage_error(exc).code, str(exc) or type(exc).__name__
    return pb.UnknownError, f"{type(exc).__name__}: {exc}"


def signed(value: int) -> int:
    """A uint64 from the wire as the signed long Pulsar means (2**64-1 is -1)."""
    return value - (1 << 64) if value > INT64_MAX else value


def id_data(ledger_id: int, entry_id: int, partition: int | None = None) -> pb.MessageIdData:
    """A wire message id; negative ids go out as their uint64 form."""
    data = pb.MessageIdData(ledgerId=ledger_id & UINT64_MASK, entryId=entry_id & UINT64_MASK)
    if partition is not None:
        data.partition = partition
    return data


def carries_schema(request: pb.CommandProducer | pb.CommandSubscribe) -> bool:
    """Whether a PRODUCER/SUBSCRIBE brings a schema; type None is bytes, i.e. no schema."""
    return request.HasField("schema") and request.schema.type != SCHEMA_TYPE_NONE


def key_values(items: Any) -> dict[str, str]:
    """A repeated KeyValue field as a dict."""
    return {item.key: item.value for item in items}
