"""One client connection: Pulsar binary-protocol commands in, `BrokerService` calls, replies out.

Theory of operation
-------------------
A `ConnectionHandler` sits between one TCP connection (owned by `_server.py`) and the shared
`BrokerService`. It holds a sans-IO `codec.Connection` in the broker role: the server feeds it
the bytes it reads (`data_received`), and the handler writes whole frames through the `write`
callable it was given. It never reads a socket itself and never blocks.

Dispatch. Each decoded frame goes to the method named for its type. Cheap commands (PING,
FLOW, LOOKUP, ...) are answered at once; commands that wait on the service (PRODUCER,
SUBSCRIBE, SEND, ACK, SEEK, ...) run as tasks that the handler tracks, so a shutdown can wait
for them. Replies echo request ids verbatim and are never keyed by them: the client uses two
request-id counters, so the same id may be in flight twice (wire reference §5.6). Producers
and consumers are keyed by the client's ids, which are unique per connection only.

Ordering. The client relies on three orders, which the handler keeps although the service
completes work asynchronously:

* receipts: every SEND starts its publish at once (the managed ledger assigns positions in
  call order), and receipts leave in the order the SENDs arrived, per producer: each producer
  keeps a queue of pending sends, and a completed publish flushes the queue's completed head;
* consumer commands: ACK, REDELIVER, SEEK, UNSUBSCRIBE and CLOSE_CONSUMER of one consumer run
  one after the other under the consumer's lock, so a redelivery never overtakes an ack the
  client sent before it;
* creation: a CLOSE_PRODUCER/CLOSE_CONSUMER that arrives while the creation is still running
  waits for it, then undoes it.

Failure forms follow wire reference §12 exactly: ERROR for PRODUCER, SUBSCRIBE, SEEK,
UNSUBSCRIBE, GET_LAST_MESSAGE_ID and GET_TOPICS_OF_NAMESPACE; the failure inside the response
for PARTITIONED_METADATA, LOOKUP, GET_SCHEMA, CONSUMER_STATS and ACK receipts; SEND_ERROR for
a publish. ServiceNotReady and TooManyRequests are never put in a lookup reply (the C++ client
would drop the whole connection); MetadataError, which it retries, stands in. One exception,
as in Pulsar: a LOOKUP naming a listener the broker does not have (`_listeners.py`) fails
with ServiceNotReady "the broker do not have NAME listener", a text the C++ client knows.
Bad bytes (any codec `ProtocolError`) and SENDs for unknown producers close this connection
only.

Claims are checked before work in proportion to them (nothing a client sends may stall the
event loop that every connection shares): a SEND whose num_messages_in_batch its payload cannot
hold (`_entry.batch_count_error`) gets SEND_ERROR NotAllowedError; ack sets are checked against
their entry's batch (`Subscription`); topic patterns (GET_TOPICS_OF_NAMESPACE, watchers) run on
RE2, and one RE2 refuses is ERROR InvalidTopicName "Invalid topics pattern: ...".

Producers. A WaitForExclusive producer that has to wait gets PRODUCER_SUCCESS with
producer_ready=false at once, and a second one (same request id, ready, with its topic epoch)
from a callback on its waiter when the topic promotes it — or ERROR ProducerFenced when an
ExclusiveWithFencing producer clears the queue. No task waits meanwhile, so a shutdown does
not wait for waiting producers. The broker's own closes of producers (fencing, termination,
unload, forced delete, backlog quota) arrive through `Producer.closer` and become
CLOSE_PRODUCER with request id 2**64-1; later SENDs of that producer id are dropped quietly.

The broker-to-client commands the C++ client cannot handle (REACHED_END_OF_TOPIC, transaction
replies, ...) are refused by the codec's `peer_accepted_types`; transactions are answered with
ERROR NotAllowed "Transactions are not enabled.", as Pulsar does with its coordinator off.
WATCH_TOPIC_LIST is served by `_topic_watchers.TopicListWatchers` for the Java client and for
clients that declared feature_flags.supports_topic_watchers in CONNECT (their connection then
accepts the WATCH_TOPIC_* replies); other clients get ERROR NotAllowed.

Broker entry metadata: a stored entry may carry the 0x0e02 block (`_entry_metadata.py`); it
goes out verbatim to clients that declared supports_broker_entry_metadata and is stripped for
the others.

Names are checked before anything is created (`_names.py`): an over-long topic is
InvalidTopicName, an over-long subscription, initial subscription or producer name ProducerBusy
(upstream's answer to a refused name).

Logging. A client's mistake is logged once per connection at WARNING (a reply its declared
command set cannot take, a SEND with a bad checksum), repeats at DEBUG; a refused request is
INFO. An unexpected exception in a request (a bug a client may repeat at will) is an ERROR
with its traceback once per connection and exception type, then DEBUG.

Keep-alive: every `keepalive_interval_s` the handler sends PING; a connection that sent no
frame at all during a whole interval after a PING is closed (Pulsar's rule).

Schemas live in `_schemas.SchemaRegistry` (versions per topic, compatibility policies): it
admits each producer's schema (or its lack of one) and each consumer's.

Authentication, when the server has an `AuthenticationService`, is `_auth.py`'s: CONNECT is
checked there (a refusal is ERROR with request id -1, then close), and the connection's
`AuthSession` sends AUTH_CHALLENGE when the credentials expire and takes the AUTH_RESPONSE.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf.message import Message

from codec import (
    CPP_CLIENT_ACCEPTED_TYPES,
    FRAME_PADDING_BYTES,
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    LocalProtocolError,
    MessageId,
    ProtocolError,
    Role,
    State,
    base_command,
    pb,
    strip_broker_entry_metadata,
)
from storage import StorageError

from .._errors import (
    AuthenticationError,
    BrokerError,
    ConsumerNotFoundError,
    DiskFullError,
    NotAllowedError,
    from_storage_error,
)
from .._listeners import ListenerNotFoundError, listeners_of
from .._names import (
    TopicName,
    check_producer_name,
    check_subscription_name,
    matches_topics_pattern,
    topics_hash,
)
from .._tasks import log_task_failure
from ..dispatch._consumer import Consumer, Delivery, SubscribeSpec
from ..dispatch._entry import EntryInfo, batch_count_error
from ..dispatch._nonpersistent import NonPersistentSubscription
from ..dispatch._subscription import Subscription
from ..ledger._position import Position
from ..schemas._schemas import SchemaRegistry, StoredSchema, encode_schema_version
from ..security._auth import AuthenticationService, AuthSession
from ..topics._service import BrokerService, Topic
from ..topics._topic import PersistentTopic, Producer, ProducerSpec, PublishResult
from ._topic_watchers import WATCHER_REPLY_TYPES, TopicListWatchers

__all__ = [
    "KEEPALIVE_INTERVAL_S_DEFAULT",
    "PENDING_SENDS_MAX_DEFAULT",
    "PROTOCOL_VERSION_MAX",
    "SERVER_VERSION",
    "ConnectionHandler",
    "ServerContext",
    "WireConsumerSink",
    "server_error",
]

log = logging.getLogger(__name__)

T = pb.BaseCommand

PROTOCOL_VERSION_MAX: Final = 20  # what the 4.x C++ client declares; v12+ is what it needs
SERVER_VERSION: Final = "Magnetar-0.1.0"
UINT64_MASK: Final = (1 << 64) - 1
INT64_MAX: Final = (1 << 63) - 1
REQUEST_ID_NONE: Final = UINT64_MASK  # broker-initiated CLOSE_PRODUCER / CLOSE_CONSUMER
PENDING_SENDS_MAX_DEFAULT: Final = 1000  # per connection (Pulsar's maxPendingPublishRequests)
CLOSED_PRODUCER_IDS_MAX: Final = 1024  # closed ids remembered, to drop their late SENDs quietly
KEEPALIVE_INTERVAL_S_DEFAULT: Final = 30.0
WRITE_BUFFER_BYTES_MAX: Final = 1024 * 1024  # unsent bytes before deliveries pause
SCHEMA_TYPE_NONE: Final = 0  # Schema.Type "None": what bytes producers may send; no schema

# Codes a lookup-type reply must not carry: the C++ client closes the connection on them.
_LOOKUP_UNSAFE_CODES: Final = frozenset({pb.ServiceNotReady, pb.TooManyRequests})
_TRANSACTION_TYPES: Final = frozenset(
    {
        T.NEW_TXN, T.ADD_PARTITION_TO_TXN, T.ADD_SUBSCRIPTION_TO_TXN, T.END_TXN,
        T.END_TXN_ON_PARTITION, T.END_TXN_ON_SUBSCRIPTION, T.TC_CLIENT_CONNECT_REQUEST,
    }
)  # fmt: skip
_SUB_TYPES: Final = {
    pb.CommandSubscribe.Exclusive: "Exclusive",
    pb.CommandSubscribe.Shared: "Shared",
    pb.CommandSubscribe.Failover: "Failover",
    pb.CommandSubscribe.Key_Shared: "Key_Shared",
}
_ACCESS_MODES: Final = {
    pb.Shared: "Shared",
    pb.Exclusive: "Exclusive",
    pb.WaitForExclusive: "WaitForExclusive",
    pb.ExclusiveWithFencing: "ExclusiveWithFencing",
}
_LIST_MODES: Final = {
    pb.CommandGetTopicsOfNamespace.PERSISTENT: "PERSISTENT",
    pb.CommandGetTopicsOfNamespace.NON_PERSISTENT: "NON_PERSISTENT",
    pb.CommandGetTopicsOfNamespace.ALL: "ALL",
}

assert REQUEST_ID_NONE == 2**64 - 1
assert pb.Schema.Type.Value("None") == SCHEMA_TYPE_NONE
assert set(_SUB_TYPES.values()) == {"Exclusive", "Shared", "Failover", "Key_Shared"}


class _CloseConnection(Exception):
    """The client broke a rule that Pulsar answers by closing the connection."""


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


def _lookup_error(exc: BaseException) -> tuple[int, str]:
    """`server_error` for replies of the lookup family (see the module comment)."""
    code, message = server_error(exc)
    return (pb.MetadataError if code in _LOOKUP_UNSAFE_CODES else code), message


def _signed(value: int) -> int:
    """A uint64 from the wire as the signed long Pulsar means (2**64-1 is -1)."""
    return value - (1 << 64) if value > INT64_MAX else value


def _id_data(ledger_id: int, entry_id: int, partition: int | None = None) -> pb.MessageIdData:
    data = pb.MessageIdData(ledgerId=ledger_id & UINT64_MASK, entryId=entry_id & UINT64_MASK)
    if partition is not None:
        data.partition = partition
    return data


def _carries_schema(request: pb.CommandProducer | pb.CommandSubscribe) -> bool:
    """Whether a PRODUCER/SUBSCRIBE brings a schema; type None is bytes, i.e. no schema."""
    return request.HasField("schema") and request.schema.type != SCHEMA_TYPE_NONE


def _key_values(items: Any) -> dict[str, str]:
    return {item.key: item.value for item in items}


# -- shared server state -------------------------------------------------------------------


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


@dataclass
class _PendingSend:
    sequence_id: int
    highest_sequence_id: int
    done: bool = False
    result: PublishResult | None = None
    error: tuple[int, str] | None = None
    dropped: bool = False  # answered by closing the producer instead (a full disk)


@dataclass
class _ProducerState:
    producer_id: int
    ready: asyncio.Future[None]
    topic: Topic | None = None
    producer: Producer | None = None
    schema_version: bytes | None = None
    pending: deque[_PendingSend] = field(default_factory=deque)
    drained: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _ConsumerState:
    consumer_id: int
    ready: asyncio.Future[None]
    sink: WireConsumerSink
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    topic: Topic | None = None
    consumer: Consumer | None = None
    subscription: Subscription | NonPersistentSubscription | None = None
    detached: bool = False

    @property
    def live(self) -> bool:
        return self.consumer is not None and not self.detached


class WireConsumerSink:
    """The `ConsumerSink` of one consumer on one connection: deliveries become MESSAGE
    frames carrying the stored entry verbatim; the broker's close becomes CLOSE_CONSUMER.

    After the consumer is gone (`live` False) every call is ignored: a dispatcher may still
    hold the consumer for a moment.
    """

    def __init__(self, handler: ConnectionHandler, consumer_id: int, send_epoch: bool):
        self.handler = handler
        self.consumer_id = consumer_id
        self.send_epoch = send_epoch  # only clients that use epochs get one back
        self.live = True

    def deliver(self, consumer: Consumer, deliveries: list[Delivery]) -> None:
        if self.live:
            self.handler.write_messages(self.consumer_id, deliveries, self.send_epoch)

    def active_consumer_changed(self, consumer: Consumer, is_active: bool) -> None:
        if self.live:
            self.handler.send(pb.CommandActiveConsumerChange(consumer_id=self.consumer_id,
                                                             is_active=is_active))

    def close_consumer(self, consumer: Consumer, reason: str) -> None:
        if self.live:
            self.handler.broker_closed_consumer(self, reason)


def _subscription_of(topic: Topic, spec: SubscribeSpec,
                     ) -> Subscription | NonPersistentSubscription | None:
    if isinstance(topic, PersistentTopic):
        table = topic.subscriptions if spec.durable else topic.readers
        return table.get(spec.subscription)
    return topic.subscriptions.get(spec.subscription)


# -- the handler ---------------------------------------------------------------------------


class ConnectionHandler:
    """The broker side of one client connection (see the module comment).

    Args:
        context: the server's shared state.
        write: writes bytes to the socket; must not block.
        close_transport: closes the socket (the server's reader then ends).
        peer: the client's address, for stats and logs (Pulsar's form: "/host:port").
        write_buffer_bytes: bytes written but not yet sent on the socket (None: unknown).
        drain: waits until the socket's write buffer is below its low-water mark.
    """

    def __init__(self, context: ServerContext, write: Callable[[bytes], None],
                 close_transport: Callable[[], None], peer: str, *,
                 write_buffer_bytes: Callable[[], int] | None = None,
                 drain: Callable[[], Awaitable[None]] | None = None):
        self.ctx = context
        self._write_buffer_bytes = write_buffer_bytes
        self._drain = drain
        self._writes_paused = False
        self._resume_task: asyncio.Future[None] | None = None
        self.service = context.service
        self._write = write
        self._close_transport = close_transport
        self.peer = peer
        frame_max = self.service.config.max_message_size_bytes + FRAME_PADDING_BYTES
        self.conn = Connection(Role.BROKER, frame_size_bytes_max=frame_max)
        self.closed = False
        self.client_version = ""
        self.protocol_version = 0
        self.auth: AuthSession | None = None  # with authentication: who the client is
        self.wants_entry_metadata = False  # the client declared supports_broker_entry_metadata
        self._producers: dict[int, _ProducerState] = {}
        self._consumers: dict[int, _ConsumerState] = {}
        self._closed_producers: OrderedDict[int, None] = OrderedDict()
        self._logged_once: set[str] = set()  # what `_warn_once`/`_log_failure` logged once
        self._tasks: set[asyncio.Task[None]] = set()
        self.pending_sends = 0
        self._send_room = asyncio.Event()
        self._send_room.set()
        self._received_since_ping = True
        self._ping_outstanding = False
        self._keepalive: asyncio.TimerHandle | None = None
        self.watchers = TopicListWatchers(self.service, self.send, peer)
        self._dispatch_table: dict[int, Callable[[Frame], None]] = self._build_dispatch()

    def _build_dispatch(self) -> dict[int, Callable[[Frame], None]]:
        table: dict[int, Callable[[Frame], None]] = {
            T.CONNECT: self._on_connect, T.PING: self._on_ping, T.PONG: self._on_pong,
            T.PARTITIONED_METADATA: self._on_partitioned_metadata, T.LOOKUP: self._on_lookup,
            T.PRODUCER: self._on_producer, T.SEND: self._on_send,
            T.CLOSE_PRODUCER: self._on_close_producer, T.SUBSCRIBE: self._on_subscribe,
            T.FLOW: self._on_flow, T.ACK: self._on_ack,
            T.REDELIVER_UNACKNOWLEDGED_MESSAGES: self._on_redeliver,
            T.CLOSE_CONSUMER: self._on_close_consumer, T.UNSUBSCRIBE: self._on_unsubscribe,
            T.SEEK: self._on_seek, T.GET_LAST_MESSAGE_ID: self._on_get_last_message_id,
            T.GET_TOPICS_OF_NAMESPACE: self._on_get_topics, T.CONSUMER_STATS: self._on_stats,
            T.GET_SCHEMA: self._on_get_schema,
            T.GET_OR_CREATE_SCHEMA: self._on_get_or_create_schema,
            T.AUTH_RESPONSE: self._on_auth_response,
            T.WATCH_TOPIC_LIST: self._on_watch_topic_list,
            T.WATCH_TOPIC_LIST_CLOSE: self._on_watch_topic_list_close,
        }  # fmt: skip
        for kind in _TRANSACTION_TYPES:
            table[kind] = self._on_transaction
        return table

    # -- input -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Process bytes from the client (`b""`: the client closed its side).

        A protocol violation closes this connection (logged); nothing is raised.
        """
        if self.closed:
            return
        try:
            self.conn.receive_data(data)
            for event in self.conn.events():
                if isinstance(event, ConnectionClosed):
                    self.close()
                    return
                self._received_since_ping = True
                self._dispatch(event)
                if self.closed:
                    return
        except ProtocolError as exc:
            log.warning("closing the connection of %s: %s", self.peer, exc.reason)
            self.close()
        except _CloseConnection as exc:
            log.warning("closing the connection of %s: %s", self.peer, exc)
            self.close()

    def _dispatch(self, event: Frame | ChecksumMismatch) -> None:
        if isinstance(event, ChecksumMismatch):
            self._on_corrupt_send(event)
            return
        handler = self._dispatch_table.get(event.type)
        if handler is None:
            raise _CloseConnection(f"unexpected {T.Type.Name(event.type)}")
        handler(event)

    # -- output ----------------------------------------------------------------------------

    def send(self, body: Message) -> bool:
        """Send one command; returns False when it could not be sent (closed connection, or
        a command this client cannot handle -- logged)."""
        if self.closed:
            return False
        try:
            data = self.conn.send(base_command(body))
        except LocalProtocolError as exc:  # e.g. a C++ client asked GET_OR_CREATE_SCHEMA
            self._warn_once(f"not sending {type(body).__name__}",
                            "not sending %s to %s: %s", type(body).__name__, self.peer,
                            exc.reason)
            return False
        self._write(data)
        return True

    def write_messages(self, consumer_id: int, deliveries: list[Delivery],
                       send_epoch: bool) -> None:
        """MESSAGE frames for deliveries, the stored entries appended verbatim (their broker
        entry metadata stripped for a client that did not declare it can read it)."""
        if self.closed or not deliveries:
            return
        out = bytearray()
        for delivery in deliveries:
            message = pb.CommandMessage(
                consumer_id=consumer_id,
                message_id=_id_data(delivery.ledger_id, delivery.entry_id, delivery.partition),
                redelivery_count=delivery.redelivery_count,
            )
            if delivery.ack_set:
                message.ack_set.extend(delivery.ack_set)
            if send_epoch:
                message.consumer_epoch = delivery.epoch
            entry = delivery.entry if self.wants_entry_metadata else \
                strip_broker_entry_metadata(delivery.entry)
            out += self.conn.send(base_command(message), entry=entry)
        self._write(bytes(out))
        self._check_write_room()

    def _check_write_room(self) -> None:
        """Back-pressure on deliveries: when more than `WRITE_BUFFER_BYTES_MAX` bytes wait in
        the socket's buffer (the client does not read), every consumer of this connection gets
        no usable permits until the buffer drains; then their dispatchers are kicked."""
        if self._write_buffer_bytes is None or self._drain is None:
            return
        if self._write_buffer_bytes() <= WRITE_BUFFER_BYTES_MAX:
            return
        for state in self._consumers.values():
            if state.consumer is not None:
                state.consumer.write_paused = True
        if not self._writes_paused:
            self._writes_paused = True
            # not a command task: shutdown must not wait for a client that never reads
            self._resume_task = asyncio.ensure_future(self._resume_writes())
            self._resume_task.add_done_callback(
                lambda task: log_task_failure(task, f"resuming writes to {self.peer}"))

    async def _resume_writes(self) -> None:
        assert self._drain is not None
        try:
            await self._drain()
        except (ConnectionError, OSError):
            return  # the connection is gone; its consumers are closed with it
        self._writes_paused = False
        for state in list(self._consumers.values()):
            if state.consumer is not None:
                state.consumer.write_paused = False
                dispatcher = getattr(state.subscription, "dispatcher", None)
                if dispatcher is not None:
                    dispatcher.kick()

    def _error(self, request_id: int, exc: BaseException) -> None:
        code, message = server_error(exc)
        self._log_failure(exc)
        self.send(pb.CommandError(request_id=request_id, error=code, message=message))  # type: ignore[arg-type]

    def _error_code(self, request_id: int, code: int, message: str) -> None:
        self.send(pb.CommandError(request_id=request_id, error=code, message=message))  # type: ignore[arg-type]

    def _log_failure(self, exc: BaseException) -> None:
        """Log a failed request: a refusal at INFO; an unexpected exception (a bug a client
        may be able to repeat at will) at ERROR with its traceback once per connection and
        exception type, then at DEBUG."""
        if isinstance(exc, BrokerError | StorageError):
            log.info("request from %s failed: %s: %s", self.peer, type(exc).__name__, exc)
            return
        key = f"unexpected {type(exc).__name__}"
        if key in self._logged_once:
            log.debug("request from %s failed unexpectedly: %r", self.peer, exc)
            return
        self._logged_once.add(key)
        log.error("request from %s failed unexpectedly (further %s of this connection are "
                  "logged at DEBUG)", self.peer, type(exc).__name__, exc_info=exc)

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        """A client's mistake: WARNING the first time on this connection, DEBUG after."""
        if key in self._logged_once:
            log.debug(message, *args)
            return
        self._logged_once.add(key)
        log.warning(message + " (repeats on this connection are logged at DEBUG)", *args)

    def _success(self, request_id: int) -> None:
        self.send(pb.CommandSuccess(request_id=request_id))

    # -- tasks and lifetime ----------------------------------------------------------------

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a command task of %s failed", self.peer, exc_info=exc)

    async def wait_idle(self) -> None:
        """Until every command task (publishes and their receipts included) has finished."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def wait_send_room(self) -> None:
        """Until fewer than `pending_sends_max` SENDs wait for their receipts."""
        while self.pending_sends >= self.ctx.pending_sends_max and not self.closed:
            self._send_room.clear()
            await self._send_room.wait()

    def start_keepalive(self) -> None:
        """Start the PING timer (see the module comment)."""
        interval = self.ctx.keepalive_interval_s
        if interval > 0 and not self.closed:
            loop = asyncio.get_running_loop()
            self._keepalive = loop.call_later(interval, self._keepalive_tick)

    def _keepalive_tick(self) -> None:
        self._keepalive = None
        if self.closed:
            return
        if self._ping_outstanding and not self._received_since_ping:
            log.warning("closing the connection of %s: no frame for a keep-alive interval",
                        self.peer)
            self.close()
            return
        if self.conn.state is not State.CONNECTED:
            log.warning("closing the connection of %s: no handshake", self.peer)
            self.close()
            return
        self._received_since_ping = False
        self._ping_outstanding = True
        self.send(pb.CommandPing())
        self.start_keepalive()

    def close(self) -> None:
        """Close the connection: producers and consumers leave their topics. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.auth is not None:
            self.auth.stop()
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self._release_all()
        self.conn.discard_received()  # a partial frame's bytes do not outlive the connection
        self._send_room.set()
        self._close_transport()

    def connection_lost(self) -> None:
        """The socket is gone (the server's reader ended)."""
        self.close()

    def _release_all(self) -> None:
        for state in list(self._producers.values()):
            self._release_producer(state)
        self._producers.clear()
        for consumer_state in list(self._consumers.values()):
            self._detach(consumer_state)
        self._consumers.clear()
        self.watchers.close_all()

    # -- handshake, keep-alive, discovery --------------------------------------------------

    def _on_connect(self, frame: Frame) -> None:
        connect = frame.command.connect
        self.client_version = connect.client_version
        self.protocol_version = min(connect.protocol_version, PROTOCOL_VERSION_MAX)
        self.wants_entry_metadata = connect.feature_flags.supports_broker_entry_metadata
        accepted = CPP_CLIENT_ACCEPTED_TYPES
        java = connect.client_version.startswith("Pulsar-Java")
        if java:
            # The Java client, unlike the C++ one, handles GET_OR_CREATE_SCHEMA_RESPONSE.
            accepted |= {T.GET_OR_CREATE_SCHEMA_RESPONSE}
        if java or connect.feature_flags.supports_topic_watchers:
            # The Java client watches topic lists (it learns the broker can from CONNECTED's
            # flag and does not declare its own); the C++ client never does.
            accepted |= WATCHER_REPLY_TYPES
        self.conn.peer_accepted_types = accepted
        if self.ctx.auth is not None and not self._authenticate(connect):
            return
        self.send(pb.CommandConnected(
            server_version=SERVER_VERSION, protocol_version=self.protocol_version,
            max_message_size=self.service.config.max_message_size_bytes,
            feature_flags=pb.FeatureFlags(supports_topic_watchers=True)))

    def _on_ping(self, frame: Frame) -> None:
        self.send(pb.CommandPong())

    def _on_pong(self, frame: Frame) -> None:
        self._ping_outstanding = False

    def _authenticate(self, connect: pb.CommandConnect) -> bool:
        """Authenticate a CONNECT (`_auth.py`); a refusal is ERROR with request id -1, then
        the connection closes (wire reference 5.1). Returns whether the client may go on."""
        assert self.ctx.auth is not None
        try:
            self.auth = self.ctx.auth.start_session(connect, self.send, self.close, self.peer,
                                                    SERVER_VERSION)
        except AuthenticationError as exc:
            log.info("refusing the connection of %s: %s", self.peer, exc)
            self._error_code(REQUEST_ID_NONE, exc.code, str(exc))
            self.close()
            return False
        return True

    def _on_auth_response(self, frame: Frame) -> None:
        if self.auth is None:
            log.debug("ignoring AUTH_RESPONSE from %s: no authentication configured", self.peer)
            return
        self.auth.on_response(frame.command.authResponse)

    def _on_partitioned_metadata(self, frame: Frame) -> None:
        self._spawn(self._partitioned_metadata(frame.command.partitionMetadata))

    async def _partitioned_metadata(self, request: pb.CommandPartitionedTopicMetadata) -> None:
        reply = pb.CommandPartitionedTopicMetadataResponse(request_id=request.request_id)
        try:
            reply.partitions = await self.service.partitioned_metadata(request.topic)
            reply.response = pb.CommandPartitionedTopicMetadataResponse.Success
        except Exception as exc:
            self._log_failure(exc)
            code, message = _lookup_error(exc)
            reply.response = pb.CommandPartitionedTopicMetadataResponse.Failed
            reply.error = code  # type: ignore[assignment]
            reply.message = message
        self.send(reply)

    def _on_lookup(self, frame: Frame) -> None:
        request = frame.command.lookupTopic
        reply = pb.CommandLookupTopicResponse(request_id=request.request_id)
        try:
            TopicName.parse(request.topic)
        except Exception as exc:
            code, message = _lookup_error(exc)
            reply.response = pb.CommandLookupTopicResponse.Failed
            reply.error = code  # type: ignore[assignment]
            reply.message = message
        else:
            try:
                url, url_tls = listeners_of(self.service.config).lookup(
                    request.advertised_listener_name, self.ctx.advertised_url,
                    self.ctx.advertised_url_tls or None)
            except ListenerNotFoundError as exc:  # ServiceNotReady, as Pulsar answers it
                reply.response = pb.CommandLookupTopicResponse.Failed
                reply.error = pb.ServiceNotReady
                reply.message = str(exc)
            else:
                reply.response = pb.CommandLookupTopicResponse.Connect
                reply.brokerServiceUrl = url
                if url_tls:
                    reply.brokerServiceUrlTls = url_tls
                reply.authoritative = True
                reply.proxy_through_service_url = False
        self.send(reply)

    def _on_get_topics(self, frame: Frame) -> None:
        request = frame.command.getTopicsOfNamespace
        try:
            topics = self.service.list_topics(request.namespace, _LIST_MODES[request.mode])
        except Exception as exc:
            self._error(request.request_id, exc)
            return
        reply = pb.CommandGetTopicsOfNamespaceResponse(request_id=request.request_id)
        pattern = request.topics_pattern if request.HasField("topics_pattern") else ""
        if pattern and len(pattern) <= self.service.config.subscription_pattern_max_length:
            try:
                topics = [t for t in topics if matches_topics_pattern(pattern, t)]
                reply.filtered = True
            except (re.error, ValueError) as exc:  # upstream's answer (RE2J), no fallback
                self._error_code(request.request_id, pb.InvalidTopicName,
                                 f"Invalid topics pattern: {exc}")
                return
            except BrokerError as exc:
                log.info("not filtering topics by %r: %s", pattern, exc)
        digest = topics_hash(topics)
        reply.topics_hash = digest
        if request.HasField("topics_hash") and request.topics_hash == digest:
            reply.changed = False
        else:
            reply.changed = True
            reply.topics.extend(topics)
        self.send(reply)

    def _on_watch_topic_list(self, frame: Frame) -> None:
        request = frame.command.watchTopicList
        peer_types = self.conn.peer_accepted_types
        if peer_types is not None and not peer_types >= WATCHER_REPLY_TYPES:
            self._error_code(request.request_id, pb.NotAllowedError, "Topic list watchers "
                             "need a Java client or supports_topic_watchers in CONNECT's "
                             "feature flags")
            return
        try:
            reply = self.watchers.watch(request)
        except Exception as exc:
            self._error(request.request_id, exc)
            return
        self.send(reply)

    def _on_watch_topic_list_close(self, frame: Frame) -> None:
        request = frame.command.watchTopicListClose
        self.watchers.close_watcher(request.watcher_id)
        self._success(request.request_id)

    def _on_transaction(self, frame: Frame) -> None:
        body: Any = frame.body
        self._error_code(body.request_id, pb.NotAllowedError, "Transactions are not enabled.")

    # -- producers -------------------------------------------------------------------------

    def _on_producer(self, frame: Frame) -> None:
        self._spawn(self._create_producer(frame.command.producer))

    def _producer_spec(self, request: pb.CommandProducer) -> ProducerSpec:
        return ProducerSpec(
            producer_name=request.producer_name if request.HasField("producer_name") else "",
            access_mode=_ACCESS_MODES.get(request.producer_access_mode, "Shared"),
            epoch=request.epoch,
            topic_epoch=request.topic_epoch if request.HasField("topic_epoch") else None,
            metadata=_key_values(request.metadata),
            initial_subscription_name=request.initial_subscription_name,
            address=self.peer,
            client_version=self.client_version,
        )

    async def _create_producer(self, request: pb.CommandProducer) -> None:
        producer_id, request_id = request.producer_id, request.request_id
        existing = self._producers.get(producer_id)
        if existing is not None:
            if existing.ready.done() and existing.producer is not None:
                self._producer_success(request_id, existing)
            else:
                self._error_code(request_id, pb.ServiceNotReady,
                                 "Producer is already present on the connection")
            return
        if not self.ctx.accepting:
            self._error_code(request_id, pb.ServiceNotReady, "The broker is shutting down")
            return
        state = _ProducerState(producer_id, asyncio.get_running_loop().create_future())
        self._producers[producer_id] = state
        try:
            await self._open_producer(state, request)
        except Exception as exc:
            if self._producers.get(producer_id) is state:
                del self._producers[producer_id]
            self._error(request_id, exc)
            return
        finally:
            state.ready.set_result(None)
        if self.closed or self._producers.get(producer_id) is not state:
            self._release_producer(state)  # the connection or a CLOSE_PRODUCER beat us
            return
        self._producer_success(request_id, state)
        waiter = state.producer.waiter if state.producer is not None else None
        if waiter is not None:  # WaitForExclusive: a second reply once it is promoted
            waiter.admitted.add_done_callback(
                lambda granted: self._exclusive_granted(request_id, state, granted))

    def _exclusive_granted(self, request_id: int, state: _ProducerState,
                           granted: asyncio.Future[int]) -> None:
        """A waiting producer was promoted (ready now) or fenced out (ERROR); nothing when
        it left first (its wait was cancelled)."""
        if granted.cancelled() or self.closed or self._producers.get(state.producer_id) \
                is not state:
            return
        error = granted.exception()
        if error is None:
            self._producer_success(request_id, state)
            return
        del self._producers[state.producer_id]
        self._remember_closed_producer(state.producer_id)
        self._error(request_id, error)

    async def _open_producer(self, state: _ProducerState, request: pb.CommandProducer) -> None:
        name = TopicName.parse(request.topic)
        check_producer_name(request.producer_name)  # before anything is created
        check_subscription_name(request.initial_subscription_name)
        topic, producer = await self.service.create_producer(name, self._producer_spec(request))
        try:
            if _carries_schema(request):
                version = self.ctx.schemas.add(name, StoredSchema.from_proto(request.schema))
                state.schema_version = encode_schema_version(version)
            else:
                self.ctx.schemas.admit_schemaless_producer(name)
        except BaseException:
            topic.remove_producer(producer)
            raise
        producer.closer = lambda reason: self._broker_closed_producer(state, reason)
        state.topic, state.producer = topic, producer

    def _producer_success(self, request_id: int, state: _ProducerState) -> None:
        assert state.topic is not None
        assert state.producer is not None
        producer = state.producer
        reply = pb.CommandProducerSuccess(
            request_id=request_id, producer_name=producer.name,
            last_sequence_id=state.topic.last_sequence_id(producer),
            producer_ready=producer.waiter is None)
        if producer.topic_epoch is not None:
            reply.topic_epoch = producer.topic_epoch
        if state.schema_version is not None:
            reply.schema_version = state.schema_version
        self.send(reply)

    def _release_producer(self, state: _ProducerState) -> None:
        if state.topic is not None and state.producer is not None:
            state.topic.remove_producer(state.producer)

    def _broker_closed_producer(self, state: _ProducerState, reason: str) -> None:
        """The service dropped the producer (e.g. backlog quota): the client reconnects."""
        if self._producers.get(state.producer_id) is state:
            del self._producers[state.producer_id]
            self._remember_closed_producer(state.producer_id)
        log.info("closing producer %s of %s: %s", state.producer_id, self.peer, reason)
        self.send(pb.CommandCloseProducer(producer_id=state.producer_id,
                                          request_id=REQUEST_ID_NONE))

    def _remember_closed_producer(self, producer_id: int) -> None:
        self._closed_producers[producer_id] = None
        while len(self._closed_producers) > CLOSED_PRODUCER_IDS_MAX:
            self._closed_producers.popitem(last=False)

    def _on_close_producer(self, frame: Frame) -> None:
        self._spawn(self._close_producer(frame.command.close_producer))

    async def _close_producer(self, request: pb.CommandCloseProducer) -> None:
        state = self._producers.pop(request.producer_id, None)
        if state is not None:
            self._remember_closed_producer(request.producer_id)
            await asyncio.wait([state.ready])
            if state.pending:  # receipts of earlier SENDs go first (wire reference §6.5)
                state.drained.clear()
                await state.drained.wait()
            self._release_producer(state)
        self._success(request.request_id)

    # -- publishing ------------------------------------------------------------------------

    def _on_send(self, frame: Frame) -> None:
        send = frame.command.send
        state = self._producers.get(send.producer_id)
        if state is None or state.producer is None:
            if send.producer_id in self._closed_producers:
                return  # a SEND that crossed our CLOSE_PRODUCER: dropped, as Pulsar does
            raise _CloseConnection(f"SEND for producer {send.producer_id}, which is not ready")
        highest = send.highest_sequence_id
        if not send.HasField("highest_sequence_id") or highest < send.sequence_id:
            highest = -1  # none stated: the topic's dedup derives it from the entry
        pending = _PendingSend(send.sequence_id, highest)
        state.pending.append(pending)
        self.pending_sends += 1
        if send.txnid_least_bits or send.txnid_most_bits:
            self._finish_send(state, pending, error=(pb.NotAllowedError,
                                                      "Transactions are not enabled."))
            return
        assert frame.metadata is not None  # the codec gives every SEND its metadata
        problem = batch_count_error(frame.metadata, len(frame.payload))
        if problem is not None:
            # NotAllowed fails this message only (Java), where other codes make clients
            # reconnect and send the same batch again.
            log.debug("refusing a SEND from %s: %s", self.peer, problem)
            self._finish_send(state, pending, error=(pb.NotAllowedError, problem))
            return
        self._spawn(self._publish(state, pending, frame))

    async def _publish(self, state: _ProducerState, pending: _PendingSend, frame: Frame) -> None:
        # No await before topic.publish: publishes must start in the order SENDs arrived.
        assert state.topic is not None
        assert state.producer is not None
        try:
            result = await state.topic.publish(state.producer, frame.entry, pending.sequence_id,
                                               pending.highest_sequence_id, frame.metadata)
        except DiskFullError as exc:
            # The topic closed the producer (CLOSE_PRODUCER): no receipt, the client fails
            # the send itself once its reconnection is refused (see _topic.py).
            log.debug("SEND of %s dropped: %s", self.peer, exc)
            pending.dropped = True
            self._finish_send(state, pending, error=server_error(exc))
        except Exception as exc:
            self._log_failure(exc)
            self._finish_send(state, pending, error=server_error(exc))
        else:
            self._finish_send(state, pending, result=result)

    def _on_corrupt_send(self, event: ChecksumMismatch) -> None:
        send = event.command.send
        state = self._producers.get(send.producer_id)
        self._warn_once("checksum", "SEND from %s failed its checksum (%#010x != %#010x)",
                        self.peer, event.expected, event.actual)
        if state is None or state.producer is None:
            if send.producer_id in self._closed_producers:
                return
            raise _CloseConnection(f"SEND for producer {send.producer_id}, which is not ready")
        pending = _PendingSend(send.sequence_id, send.sequence_id)
        state.pending.append(pending)
        self.pending_sends += 1
        self._finish_send(state, pending, error=(pb.ChecksumError, "Checksum failed on the broker"))

    def _finish_send(self, state: _ProducerState, pending: _PendingSend, *,
                     result: PublishResult | None = None,
                     error: tuple[int, str] | None = None) -> None:
        assert (result is None) != (error is None)
        pending.done, pending.result, pending.error = True, result, error
        out = bytearray()
        while state.pending and state.pending[0].done:
            head = state.pending.popleft()
            self.pending_sends -= 1
            out += self._receipt_bytes(state.producer_id, head)
        assert self.pending_sends >= 0
        if out and not self.closed:
            self._write(bytes(out))
        if not state.pending:
            state.drained.set()
        if self.pending_sends < self.ctx.pending_sends_max // 2 + 1:
            self._send_room.set()

    def _receipt_bytes(self, producer_id: int, pending: _PendingSend) -> bytes:
        body: Message
        if pending.dropped:
            return b""
        if pending.result is not None:
            body = pb.CommandSendReceipt(
                producer_id=producer_id, sequence_id=pending.sequence_id,
                message_id=_id_data(pending.result.ledger_id, pending.result.entry_id),
                highest_sequence_id=max(pending.highest_sequence_id, pending.sequence_id))
        else:
            assert pending.error is not None
            code, message = pending.error
            body = pb.CommandSendError(producer_id=producer_id, sequence_id=pending.sequence_id,
                                       error=code, message=message)  # type: ignore[arg-type]
        if self.closed:
            return b""
        return self.conn.send(base_command(body))

    # -- consumers: subscribe and close ----------------------------------------------------

    def _on_subscribe(self, frame: Frame) -> None:
        self._spawn(self._subscribe(frame.command.subscribe))

    def _subscribe_spec(self, request: pb.CommandSubscribe) -> SubscribeSpec:
        start = None
        if request.HasField("start_message_id"):
            start_id = MessageId.from_proto(request.start_message_id)
            start = (start_id.ledger_id, start_id.entry_id, start_id.batch_index)
        meta = request.keySharedMeta
        return SubscribeSpec(
            subscription=request.subscription,
            sub_type=_SUB_TYPES[request.subType],
            consumer_name=request.consumer_name,
            initial_position=("earliest" if request.initialPosition
                              == pb.CommandSubscribe.Earliest else "latest"),
            durable=request.durable,
            priority_level=request.priority_level,
            start_message_id=start,
            key_shared_mode="STICKY" if meta.keySharedMode == pb.STICKY else "AUTO_SPLIT",
            key_shared_ranges=tuple((r.start, r.end) for r in meta.hashRanges),
            allow_out_of_order_delivery=meta.allowOutOfOrderDelivery,
            has_key_shared_meta=request.HasField("keySharedMeta"),
            subscription_properties=_key_values(request.subscription_properties),
            metadata=_key_values(request.metadata),
            replicate_subscription_state=request.replicate_subscription_state,
            read_compacted=request.read_compacted,
            start_message_rollback_duration_s=request.start_message_rollback_duration_sec,
            consumer_epoch=request.consumer_epoch,
            address=self.peer,
            client_version=self.client_version,
        )

    async def _subscribe(self, request: pb.CommandSubscribe) -> None:
        consumer_id, request_id = request.consumer_id, request.request_id
        existing = self._consumers.get(consumer_id)
        if existing is not None:
            if existing.ready.done() and existing.live:
                self._success(request_id)
            else:
                self._error_code(request_id, pb.ServiceNotReady,
                                 "Consumer is already present on the connection")
            return
        if not self.ctx.accepting:
            self._error_code(request_id, pb.ServiceNotReady, "The broker is shutting down")
            return
        sink = WireConsumerSink(self, consumer_id, request.HasField("consumer_epoch"))
        state = _ConsumerState(consumer_id, asyncio.get_running_loop().create_future(), sink)
        self._consumers[consumer_id] = state
        try:
            await self._open_consumer(state, request)
        except Exception as exc:
            if self._consumers.get(consumer_id) is state:
                del self._consumers[consumer_id]
            sink.live = False
            self._error(request_id, exc)
            return
        finally:
            state.ready.set_result(None)
        if self.closed or self._consumers.get(consumer_id) is not state:
            self._detach(state)  # the connection or a CLOSE_CONSUMER beat us
            return
        self._success(request_id)

    async def _open_consumer(self, state: _ConsumerState, request: pb.CommandSubscribe) -> None:
        spec = self._subscribe_spec(request)
        name = TopicName.parse(request.topic)
        check_subscription_name(spec.subscription)  # before anything is created
        if _carries_schema(request):
            self.ctx.schemas.admit_consumer(name, StoredSchema.from_proto(request.schema))
        topic, consumer = await self.service.subscribe(name, spec, state.sink)
        state.topic, state.consumer = topic, consumer
        state.subscription = _subscription_of(topic, spec)
        assert state.subscription is not None, "subscribed, yet no subscription"

    def _detach(self, state: _ConsumerState) -> None:
        """The consumer leaves its subscription (its unacked messages go back). Idempotent."""
        state.sink.live = False
        if state.detached or state.consumer is None:
            return  # done already, or still subscribing: `_subscribe` detaches it when done
        state.detached = True
        assert state.topic is not None
        state.topic.consumer_closed(state.subscription, state.consumer)  # type: ignore[arg-type]

    def broker_closed_consumer(self, sink: WireConsumerSink, reason: str) -> None:
        """The service removed a consumer (seek, unsubscribe by another, topic deleted):
        forget it here and tell the client, which resubscribes (wire reference §10.4)."""
        state = self._consumers.get(sink.consumer_id)
        if state is not None and state.sink is sink:
            del self._consumers[sink.consumer_id]
            state.detached = True
        sink.live = False
        log.info("closing consumer %s of %s: %s", sink.consumer_id, self.peer, reason)
        self.send(pb.CommandCloseConsumer(consumer_id=sink.consumer_id,
                                          request_id=REQUEST_ID_NONE))

    def _on_close_consumer(self, frame: Frame) -> None:
        self._spawn(self._close_consumer(frame.command.close_consumer))

    async def _close_consumer(self, request: pb.CommandCloseConsumer) -> None:
        state = self._consumers.pop(request.consumer_id, None)
        if state is not None:
            await asyncio.wait([state.ready])
            async with state.lock:
                self._detach(state)
        self._success(request.request_id)

    def _live_consumer(self, consumer_id: int) -> _ConsumerState | None:
        state = self._consumers.get(consumer_id)
        return state if state is not None and state.ready.done() and state.live else None

    # -- consumers: flow, acks, redelivery -------------------------------------------------

    def _on_flow(self, frame: Frame) -> None:
        flow = frame.command.flow
        state = self._live_consumer(flow.consumer_id)
        if state is None:
            log.debug("FLOW for unknown consumer %s of %s", flow.consumer_id, self.peer)
            return
        assert state.subscription is not None
        assert state.consumer is not None
        state.subscription.flow(state.consumer, flow.messagePermits)

    def _on_ack(self, frame: Frame) -> None:
        self._spawn(self._ack(frame.command.ack))

    async def _ack(self, request: pb.CommandAck) -> None:
        state = self._live_consumer(request.consumer_id)
        error: tuple[int, str] | None = None
        if state is None:
            error = (pb.ConsumerNotFound, f"Consumer {request.consumer_id} not found")
        elif request.txnid_least_bits or request.txnid_most_bits:
            error = (pb.NotAllowedError, "Transactions are not enabled.")
        else:
            acks = [(_signed(m.ledgerId), _signed(m.entryId), list(m.ack_set) or None)
                    for m in request.message_id]
            async with state.lock:
                try:
                    await self._apply_ack(state, request.ack_type, acks)
                except Exception as exc:
                    self._log_failure(exc)
                    error = server_error(exc)
        if request.HasField("request_id"):
            self._ack_response(request, error)

    @staticmethod
    async def _apply_ack(state: _ConsumerState, ack_type: int,
                         acks: list[tuple[int, int, list[int] | None]]) -> None:
        subscription = state.subscription
        if state.detached or not isinstance(subscription, Subscription):
            return  # gone meanwhile, or non-persistent: acks are no-ops there
        await subscription.acknowledge(state.consumer, ack_type, acks)

    def _ack_response(self, request: pb.CommandAck, error: tuple[int, str] | None) -> None:
        reply = pb.CommandAckResponse(consumer_id=request.consumer_id,
                                      request_id=request.request_id,
                                      txnid_least_bits=request.txnid_least_bits,
                                      txnid_most_bits=request.txnid_most_bits)
        if error is not None:
            reply.error = error[0]  # type: ignore[assignment]
            reply.message = error[1]
        self.send(reply)

    def _on_redeliver(self, frame: Frame) -> None:
        self._spawn(self._redeliver(frame.command.redeliverUnacknowledgedMessages))

    async def _redeliver(self, request: pb.CommandRedeliverUnacknowledgedMessages) -> None:
        state = self._live_consumer(request.consumer_id)
        if state is None:
            return
        async with state.lock:
            consumer, subscription = state.consumer, state.subscription
            if state.detached or consumer is None or not isinstance(subscription, Subscription):
                return
            if request.HasField("consumer_epoch") and request.consumer_epoch > consumer.epoch:
                consumer.epoch = request.consumer_epoch
            positions = [(_signed(m.ledgerId), _signed(m.entryId)) for m in request.message_ids]
            subscription.redeliver(consumer, positions or None)

    # -- consumers: unsubscribe, seek, last message id, stats ------------------------------

    def _on_unsubscribe(self, frame: Frame) -> None:
        self._spawn(self._unsubscribe(frame.command.unsubscribe))

    async def _unsubscribe(self, request: pb.CommandUnsubscribe) -> None:
        state = self._live_consumer(request.consumer_id)
        if state is None:
            self._error_code(request.request_id, pb.MetadataError, "Consumer not found")
            return
        async with state.lock:
            try:
                await self._delete_subscription(state, request.force)
            except Exception as exc:
                self._error(request.request_id, exc)
                return
        if self._consumers.get(request.consumer_id) is state:
            del self._consumers[request.consumer_id]
        self._success(request.request_id)

    async def _delete_subscription(self, state: _ConsumerState, force: bool) -> None:
        topic, subscription = state.topic, state.subscription
        assert topic is not None
        assert subscription is not None
        if state.detached:
            raise ConsumerNotFoundError("Consumer not found")
        if isinstance(subscription, Subscription) and subscription.durable:
            assert isinstance(topic, PersistentTopic)
            await topic.unsubscribe(subscription.name, state.consumer, force)
            state.sink.live = False
            state.detached = True  # the topic removed it with the subscription
        else:
            self._detach(state)  # readers and non-persistent subscriptions vanish when empty

    def _on_seek(self, frame: Frame) -> None:
        self._spawn(self._seek(frame.command.seek))

    async def _seek(self, request: pb.CommandSeek) -> None:
        state = self._live_consumer(request.consumer_id)
        if state is None:
            self._error_code(request.request_id, pb.MetadataError, "Consumer not found")
            return
        async with state.lock:
            try:
                await self._reset_subscription(state, request)
            except Exception as exc:
                self._error(request.request_id, exc)
                return
        self._success(request.request_id)

    @staticmethod
    async def _reset_subscription(state: _ConsumerState, request: pb.CommandSeek) -> None:
        subscription = state.subscription
        if not isinstance(subscription, Subscription):
            raise NotAllowedError("Seek is not supported on non-persistent topics")
        if state.detached:
            raise ConsumerNotFoundError("Consumer not found")
        # The subscription closes its consumers through their sinks (CLOSE_CONSUMER) first.
        if request.HasField("message_id"):
            target = MessageId.from_proto(request.message_id)
            await subscription.reset_cursor(Position(target.ledger_id, target.entry_id))
        elif request.HasField("message_publish_time"):
            await subscription.reset_cursor_by_time(request.message_publish_time)
        else:
            raise NotAllowedError("Seek needs a message id or a publish time")

    def _on_get_last_message_id(self, frame: Frame) -> None:
        request = frame.command.getLastMessageId
        state = self._live_consumer(request.consumer_id)
        if state is None:
            self._error_code(request.request_id, pb.MetadataError, "Consumer not found")
            return
        try:
            reply = self._last_message_id(state, request.request_id)
        except Exception as exc:
            self._error(request.request_id, exc)
            return
        self.send(reply)

    @staticmethod
    def _last_message_id(state: _ConsumerState, request_id: int,
                         ) -> pb.CommandGetLastMessageIdResponse:
        topic = state.topic
        if not isinstance(topic, PersistentTopic):
            raise NotAllowedError("GetLastMessageId is not supported on non-persistent topics")
        ml = topic.managed_ledger
        last = ml.last_confirmed_position
        partition = topic.name.partition_index
        last_id = _id_data(-1, -1, partition)
        last_id.batch_index = -1
        if last.entry_id >= 0:
            last_id = _id_data(last.ledger_id, last.entry_id, partition)
            last_id.batch_index = -1
            # The last entry's ledger may be trimmed already (nothing retains it): the position
            # still stands, without the batch index only its entry could tell.
            if ml.is_valid_position(last):
                entry = EntryInfo(last, ml.read_entry(last))
                # A stored count is a client's claim: clamped, so a bad one cannot fail it.
                if entry.metadata.HasField("num_messages_in_batch"):
                    last_id.batch_index = entry.batch_size - 1
        reply = pb.CommandGetLastMessageIdResponse(last_message_id=last_id, request_id=request_id)
        # Every subscription of a persistent topic answers its mark-delete position, readers'
        # non-durable ones included: the C++ client's has_message_available() for a reader at
        # `latest` compares it with the last id (and says False when it is missing).
        subscription = state.subscription
        if isinstance(subscription, Subscription):
            mark = subscription.cursor.mark_delete_position
            if mark.ledger_id >= 0:
                reply.consumer_mark_delete_position.CopyFrom(
                    _id_data(mark.ledger_id, mark.entry_id))
        return reply

    def _on_stats(self, frame: Frame) -> None:
        request = frame.command.consumerStats
        reply = pb.CommandConsumerStatsResponse(request_id=request.request_id)
        state = self._live_consumer(request.consumer_id)
        if state is None or state.consumer is None:
            reply.error_code = pb.ConsumerNotFound
            reply.error_message = f"Consumer {request.consumer_id} not found"
            self.send(reply)
            return
        consumer = state.consumer
        reply.msgRateOut = reply.msgThroughputOut = reply.msgRateRedeliver = 0.0
        reply.msgRateExpired = reply.messageAckRate = 0.0
        reply.consumerName = consumer.consumer_name
        reply.availablePermits = max(0, consumer.permits)
        reply.unackedMessages = consumer.unacked_messages
        reply.blockedConsumerOnUnackedMsgs = consumer.blocked_on_unacked
        reply.address = self.peer
        reply.connectedSince = consumer.connected_since
        reply.type = consumer.spec.sub_type
        subscription = state.subscription
        reply.msgBacklog = subscription.backlog() if isinstance(subscription, Subscription) else 0
        self.send(reply)

    # -- schemas ---------------------------------------------------------------------------

    def _on_get_schema(self, frame: Frame) -> None:
        request = frame.command.getSchema
        reply = pb.CommandGetSchemaResponse(request_id=request.request_id)
        try:
            version = None
            if request.HasField("schema_version") and request.schema_version:
                version = int.from_bytes(request.schema_version, "big")
            found = self.ctx.schemas.get(TopicName.parse(request.topic), version)
            if found is None:
                reply.error_code = pb.TopicNotFound
                reply.error_message = f"No schema found for topic {request.topic}"
            else:
                reply.schema.CopyFrom(found.schema.to_proto())
                reply.schema_version = encode_schema_version(found.version)
        except Exception as exc:
            self._log_failure(exc)
            code, message = server_error(exc)
            reply.error_code = code  # type: ignore[assignment]
            reply.error_message = message
        self.send(reply)

    def _on_get_or_create_schema(self, frame: Frame) -> None:
        request = frame.command.getOrCreateSchema
        reply = pb.CommandGetOrCreateSchemaResponse(request_id=request.request_id)
        accepted = self.conn.peer_accepted_types
        if accepted is not None and T.GET_OR_CREATE_SCHEMA_RESPONSE not in accepted:
            self.send(reply)  # refused by the codec and logged once: no answer, no schema added
            return
        try:
            version = self.ctx.schemas.add(TopicName.parse(request.topic),
                                           StoredSchema.from_proto(request.schema))
            reply.schema_version = encode_schema_version(version)
        except Exception as exc:
            self._log_failure(exc)
            code, message = server_error(exc)
            reply.error_code = code  # type: ignore[assignment]
            reply.error_message = message
        self.send(reply)

