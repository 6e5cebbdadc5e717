"""A do-nothing Pulsar broker: the official client's own ceiling, with no broker work behind it.

It answers just what a producer needs -- CONNECT, PARTITIONED_METADATA, LOOKUP, PRODUCER,
SEND, CLOSE_PRODUCER, PING -- and receipts every SEND at once, stores nothing and syncs
nothing. What the official client reaches against it is the most any broker could give that
client on this machine: `client_ceiling.py` runs the issue-14 publish workloads against it.

Decoding uses Magnetar's sans-IO codec (`Connection`, whose plain-SEND path skips the protobuf
runtime) and the receipts its `send_receipt_frame`; one socket read's receipts go out in one
write. Run alone: `python benchmarks/null_broker.py --port 6651` (Ctrl-C stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import sys

# Runnable from a checkout without installing: the repository root holds the packages.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from magnetar.codec import Connection, Frame, Role, base_command, pb
from magnetar.codec._receipts import send_receipt_frame
from magnetar.codec._sends import Send

__all__ = ["NullBrokerProtocol", "serve"]

HOST = "127.0.0.1"
LEDGER_ID = 1  # every receipt names ledger 1; entry ids count up per connection
MAX_MESSAGE_BYTES = 5 * 1024 * 1024
PROTOCOL_VERSION_MAX = 21


class NullBrokerProtocol(asyncio.Protocol):
    """One client connection: decode what arrives, answer at once, keep nothing."""

    def __init__(self, url: str):
        self.url = url
        self.connection = Connection(Role.BROKER)
        self.transport: asyncio.Transport | None = None
        self.entry_ids = itertools.count()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.connection.receive_data(data)
        replies: list[bytes] = []
        for event in self.connection.next_events():
            if isinstance(event, Send):
                replies.append(self._receipt(event.producer_id, event.sequence_id,
                                             event.highest_sequence_id))
            elif isinstance(event, Frame):
                reply = self._answer(event.command)
                if reply is not None:
                    replies.append(self.connection.send(reply))
            # ConnectionClosed or ChecksumMismatch: nothing to answer
        if replies:
            self.transport.write(b"".join(replies))

    def _receipt(self, producer_id: int, sequence_id: int, highest: int | None) -> bytes:
        return send_receipt_frame(producer_id, sequence_id, LEDGER_ID, next(self.entry_ids),
                                  sequence_id if highest is None else highest)

    def _answer(self, command: pb.BaseCommand) -> pb.BaseCommand | None:
        kind = command.type
        if kind == pb.BaseCommand.CONNECT:
            return base_command(pb.CommandConnected(
                server_version="null-broker",
                protocol_version=min(command.connect.protocol_version, PROTOCOL_VERSION_MAX),
                max_message_size=MAX_MESSAGE_BYTES))
        if kind == pb.BaseCommand.PARTITIONED_METADATA:
            return base_command(pb.CommandPartitionedTopicMetadataResponse(
                partitions=0, request_id=command.partitionMetadata.request_id,
                response=pb.CommandPartitionedTopicMetadataResponse.Success))
        if kind == pb.BaseCommand.LOOKUP:
            return base_command(pb.CommandLookupTopicResponse(
                brokerServiceUrl=self.url, response=pb.CommandLookupTopicResponse.Connect,
                request_id=command.lookupTopic.request_id, authoritative=True))
        if kind == pb.BaseCommand.PRODUCER:
            return base_command(pb.CommandProducerSuccess(
                request_id=command.producer.request_id,
                producer_name=command.producer.producer_name or "null-producer",
                last_sequence_id=-1))
        if kind == pb.BaseCommand.SEND:  # a SEND the plain path did not take (a batch, ...)
            send = command.send
            highest = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
            assert self.transport is not None
            self.transport.write(self._receipt(send.producer_id, send.sequence_id, highest))
            return None
        if kind == pb.BaseCommand.CLOSE_PRODUCER:
            return base_command(pb.CommandSuccess(request_id=command.close_producer.request_id))
        if kind == pb.BaseCommand.PING:
            return base_command(pb.CommandPong())
        return None  # PONG and anything else: no answer


async def serve(port: int) -> None:
    """Serve on `HOST:port` until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    url = f"pulsar://{HOST}:{port}"
    server = await loop.create_server(lambda: NullBrokerProtocol(url), HOST, port)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--port", type=int, required=True, help="the loopback port to serve")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
