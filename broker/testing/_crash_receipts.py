"""The broker crash harness's consumer with ack receipts.

The official Python client cannot ask for ack receipts (its `acknowledge` returns once the
ack is queued, and the C++ client groups acks before sending them), so its acks prove
nothing about durability. This consumer speaks the protocol itself through `magnetar.codec`:
it subscribes (Shared) on its own thread and socket, acknowledges whole entries with a
`request_id`, and records an ack as acknowledged only when the broker's ACK_RESPONSE for
that request arrives without an error. The broker sends that response once the cursor change
is durable (`ManagedCursor`: an ack that returned survives a crash), which the harness then
checks.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time

from google.protobuf.message import Message

from magnetar.codec import (
    NEED_DATA,
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    ProtocolError,
    Role,
    base_command,
    pb,
    unpack_messages,
)

from ._crash_book import AckBook, MessageKey, message_key_of

__all__ = ["ReceiptConsumer"]

RECEIVE_BYTES_MAX = 65536
SOCKET_TIMEOUT_S = 0.1  # how often the thread looks at its stop flag while idle
PERMITS = 500  # messages granted at a time
SUBSCRIBE_DEADLINE_S = 15.0
ACK_SKIP_CHANCE = 0.1  # entries left unacknowledged on purpose
CONSUMER_ID = 1


class ReceiptConsumer:
    """One Shared consumer of `subscription` on `topic` at 127.0.0.1:`port` (see the module
    comment). `start()` returns once it is subscribed; `stop()` ends the thread."""

    def __init__(self, port: int, topic: str, subscription: str, book: AckBook,
                 rng: random.Random):
        self.port = port
        self.topic = topic
        self.subscription = subscription
        self.book = book
        self.rng = rng
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._conn = Connection(Role.CLIENT)
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="crashtest-receipts",
                                        daemon=True)
        self._next_request = 10
        # ack request id -> the entry's (ledger, entry) and its messages
        self._pending: dict[int, tuple[tuple[int, int], list[MessageKey]]] = {}
        self._received = 0
        self.failure: str | None = None  # why it could not subscribe (None: it did)

    def start(self) -> None:
        """Raises RuntimeError: it could not subscribe (the thread has ended)."""
        self._thread.start()
        deadline = time.monotonic() + SUBSCRIBE_DEADLINE_S
        while not self._subscribed.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the receipt consumer could not subscribe: "
                                   f"{self.failure or 'no answer'}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _send(self, body: Message) -> None:
        assert self._sock is not None
        self._sock.sendall(self._conn.send(base_command(body)))

    def _run(self) -> None:
        try:
            self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=5.0)
            self._sock.settimeout(SOCKET_TIMEOUT_S)
            self._send(pb.CommandConnect(client_version="magnetar-crashtest",
                                         protocol_version=20, auth_method_name="none"))
            while not self._stop.is_set():
                if not self._pump():
                    return
        except OSError as error:  # the broker went away (the crash): the thread ends
            if not self._subscribed.is_set():
                self.failure = f"{type(error).__name__}: {error}"
        except ProtocolError as error:  # the broker broke the protocol
            self.book.error(f"the receipt consumer's connection failed: {error}")
            self.failure = str(error)
        finally:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()

    def _pump(self) -> bool:
        """Handle what arrived; False once the connection is over."""
        assert self._sock is not None
        event = self._conn.next_event()
        if event is NEED_DATA:
            try:
                data = self._sock.recv(RECEIVE_BYTES_MAX)
            except TimeoutError:
                return True
            self._conn.receive_data(data)
            return bool(data)
        if isinstance(event, ConnectionClosed):
            return False
        if isinstance(event, ChecksumMismatch):
            self.book.error(f"the receipt consumer got a MESSAGE with a bad checksum "
                            f"(expected {event.expected:#x}, got {event.actual:#x})")
            return True
        assert isinstance(event, Frame)
        self._on_frame(event)
        return True

    def _on_frame(self, frame: Frame) -> None:
        kind = frame.type
        if kind == pb.BaseCommand.PING:
            self._send(pb.CommandPong())
        elif kind == pb.BaseCommand.CONNECTED:
            self._send(pb.CommandSubscribe(
                topic=self.topic, subscription=self.subscription,
                subType=pb.CommandSubscribe.Shared, consumer_id=CONSUMER_ID, request_id=1,
                consumer_name="crashtest-receipts",
                initialPosition=pb.CommandSubscribe.Earliest))
        elif kind == pb.BaseCommand.SUCCESS and frame.command.success.request_id == 1:
            self._send(pb.CommandFlow(consumer_id=CONSUMER_ID, messagePermits=PERMITS))
            self._subscribed.set()
        elif kind == pb.BaseCommand.ERROR:
            self.failure = f"{frame.command.error.message}"
            self._stop.set()
        elif kind == pb.BaseCommand.MESSAGE:
            self._on_message(frame)
        elif kind == pb.BaseCommand.ACK_RESPONSE:
            self._on_ack_response(frame.command.ackResponse)

    def _on_message(self, frame: Frame) -> None:
        assert frame.metadata is not None
        keys = []
        for single in unpack_messages(frame.metadata, frame.payload):
            key = message_key_of(single.payload or b"")
            if key is None:
                self.book.error(f"the receipt consumer got a message the workload never "
                                f"sent: {(single.payload or b'')[:40]!r}")
                return
            keys.append(key)
        self._received += len(keys)
        if self._received >= PERMITS // 2:
            self._send(pb.CommandFlow(consumer_id=CONSUMER_ID, messagePermits=self._received))
            self._received = 0
        if self.rng.random() < ACK_SKIP_CHANCE:
            return
        request_id = self._next_request
        self._next_request += 1
        message_id = frame.command.message.message_id
        self._pending[request_id] = ((message_id.ledgerId, message_id.entryId), keys)
        for key in keys:
            self.book.acked(self.subscription, key)  # sent; it counts once its receipt came
        self._send(pb.CommandAck(
            consumer_id=CONSUMER_ID, ack_type=pb.CommandAck.Individual, request_id=request_id,
            message_id=[pb.MessageIdData(ledgerId=message_id.ledgerId,
                                         entryId=message_id.entryId)]))

    def _on_ack_response(self, response: pb.CommandAckResponse) -> None:
        pending = self._pending.pop(response.request_id, None)
        if pending is None:
            self.book.error(f"an ACK_RESPONSE for request {response.request_id}, which was "
                            f"never sent or already answered")
        elif not response.HasField("error"):
            self.book.receipted(*pending)
