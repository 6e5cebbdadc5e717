"""A minimal loopback "broker" for the interop tests: just enough of Pulsar's side of the
protocol for the official `pulsar-client` to create producers and publish, built on the codec's
`Connection`. It records every SEND it receives and acknowledges it with a receipt.

This is a test helper, not the real server (that is the broker package's job). It listens on
127.0.0.1 with a port chosen by the OS, serves each connection on its own thread, and stops when
the context manager exits. Nothing sleeps: tests wait on `received` with a deadline.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from magnetar.codec import (
    MAX_MESSAGE_SIZE_DEFAULT,
    ChecksumMismatch,
    Connection,
    ConnectionClosed,
    Frame,
    ProtocolError,
    Role,
    base_command,
    pb,
)

LEDGER_ID = 7
RECV_BYTES = 65536


@dataclass
class Received:
    """One SEND as the broker saw it."""

    topic: str
    producer_name: str
    frame: Frame
    entry_id: int


@dataclass
class LoopbackBroker:
    """State shared by the connection threads."""

    url: str
    max_message_size: int
    partitions: dict[str, int]
    received: queue.Queue[Received] = field(default_factory=queue.Queue)
    corrupt: queue.Queue[ChecksumMismatch] = field(default_factory=queue.Queue)
    errors: queue.Queue[BaseException] = field(default_factory=queue.Queue)
    _entry_ids: Iterator[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_entry_id(self) -> int:
        with self._lock:
            return next(self._entry_ids)

    def wait_for(self, count: int, timeout_s: float = 20.0) -> list[Received]:
        """The next `count` SENDs, in arrival order (fails the test after the deadline)."""
        out = []
        for _ in range(count):
            try:
                out.append(self.received.get(timeout=timeout_s))
            except queue.Empty:
                problems = list(self.errors.queue)
                raise AssertionError(
                    f"{len(out)} of {count} SENDs arrived; errors: {problems}"
                ) from None
        return out


class _Session:
    """One client connection: decode, answer, record."""

    def __init__(self, broker: LoopbackBroker, sock: socket.socket) -> None:
        self.broker = broker
        self.sock = sock
        self.conn = Connection(Role.BROKER)
        self.producers: dict[int, tuple[str, str]] = {}  # producer_id -> (topic, name)

    def run(self) -> None:
        try:
            while True:
                data = self.sock.recv(RECV_BYTES)
                self.conn.receive_data(data)
                for event in self.conn.events():
                    if isinstance(event, ConnectionClosed):
                        return
                    self._handle(event)
        except (ProtocolError, AssertionError) as exc:
            self.broker.errors.put(exc)
        except OSError:
            return  # the test tore the listener down
        finally:
            self.sock.close()

    def _reply(self, body: object, **kwargs: object) -> None:
        self.sock.sendall(self.conn.send(base_command(body), **kwargs))  # type: ignore[arg-type]

    def _handle(self, event: Frame | ChecksumMismatch) -> None:
        if isinstance(event, ChecksumMismatch):
            self.broker.corrupt.put(event)
            send = event.command.send
            self._reply(
                pb.CommandSendError(
                    producer_id=send.producer_id,
                    sequence_id=send.sequence_id,
                    error=pb.ChecksumError,
                    message="checksum mismatch",
                )
            )
            return
        command = event.command
        kind = command.type
        T = pb.BaseCommand
        if kind == T.CONNECT:
            version = min(command.connect.protocol_version, 20)
            self._reply(
                pb.CommandConnected(
                    server_version="magnetar-loopback",
                    protocol_version=version,
                    max_message_size=self.broker.max_message_size,
                )
            )
        elif kind == T.PARTITIONED_METADATA:
            request = command.partitionMetadata
            self._reply(
                pb.CommandPartitionedTopicMetadataResponse(
                    request_id=request.request_id,
                    partitions=self.broker.partitions.get(request.topic, 0),
                    response=pb.CommandPartitionedTopicMetadataResponse.Success,
                )
            )
        elif kind == T.LOOKUP:
            self._reply(
                pb.CommandLookupTopicResponse(
                    request_id=command.lookupTopic.request_id,
                    brokerServiceUrl=self.broker.url,
                    response=pb.CommandLookupTopicResponse.Connect,
                    authoritative=True,
                )
            )
        elif kind == T.PRODUCER:
            request = command.producer
            name = request.producer_name or f"loopback-{request.producer_id}"
            self.producers[request.producer_id] = (request.topic, name)
            self._reply(
                pb.CommandProducerSuccess(
                    request_id=request.request_id, producer_name=name, last_sequence_id=-1
                )
            )
        elif kind == T.SEND:
            self._on_send(event)
        elif kind == T.CLOSE_PRODUCER:
            self._reply(pb.CommandSuccess(request_id=command.close_producer.request_id))
        elif kind == T.PING:
            self._reply(pb.CommandPong())
        elif kind == T.PONG:
            pass
        else:
            raise AssertionError(
                f"loopback broker got an unexpected {pb.BaseCommand.Type.Name(kind)}"
            )

    def _on_send(self, frame: Frame) -> None:
        send = frame.command.send
        topic, name = self.producers[send.producer_id]
        entry_id = self.broker.next_entry_id()
        self.broker.received.put(Received(topic, name, frame, entry_id))
        self._reply(
            pb.CommandSendReceipt(
                producer_id=send.producer_id,
                sequence_id=send.sequence_id,
                message_id=pb.MessageIdData(ledgerId=LEDGER_ID, entryId=entry_id),
                highest_sequence_id=send.highest_sequence_id,
            )
        )


@contextmanager
def loopback_broker(
    *, max_message_size: int = MAX_MESSAGE_SIZE_DEFAULT, partitions: dict[str, int] | None = None
) -> Iterator[LoopbackBroker]:
    """Run a loopback broker for the duration of the `with` block."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    broker = LoopbackBroker(f"pulsar://127.0.0.1:{port}", max_message_size, partitions or {})
    stop = threading.Event()
    sockets: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sockets.append(sock)
            threading.Thread(target=_Session(broker, sock).run, daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield broker
    finally:
        stop.set()
        listener.close()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        acceptor.join(timeout=5)
    if not broker.errors.empty():
        raise AssertionError(f"loopback broker failed: {list(broker.errors.queue)}")
