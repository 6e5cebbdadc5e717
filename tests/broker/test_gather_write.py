"""`gathering_writer`: frames given as separate buffers reach the peer whole and in order over
a real loopback connection -- when the socket takes them at once, when it takes a part and
the transport buffers the rest, with more buffers than one `writev` takes, and when a write
comes while the transport still holds bytes."""

from __future__ import annotations

import asyncio
import os
import socket

from magnetar.broker.wire._gather_write import IOV_MAX, gathering_writer

SMALL_BUFFER_BYTES = 4096


async def _pair() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.StreamWriter,
                          asyncio.Server]:
    """A loopback connection: the client's reader and writer (kept: a writer collected
    closes its transport), the accepted side's writer, whose send buffer is small so that
    big writes are cut, and the server."""
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

    async def on_connect(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER_BYTES)
        accepted.set_result(writer)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, client = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    return reader, client, await accepted, server


async def _exchange(batches: list[list[bytes]]) -> bytes:
    reader, client, writer, server = await _pair()
    write_parts = gathering_writer(writer.transport)
    for parts in batches:
        write_parts(parts)
    expected = sum(len(part) for parts in batches for part in parts)
    received = await asyncio.wait_for(reader.readexactly(expected), 30)
    writer.close()
    client.close()
    server.close()
    await server.wait_closed()
    return received


async def test_big_buffers_arrive_whole_and_in_order_when_the_socket_takes_a_part() -> None:
    batches = [[b"head%d" % i, os.urandom(200_000)] for i in range(3)]
    received = await _exchange(batches)
    assert received == b"".join(part for parts in batches for part in parts)


async def test_more_buffers_than_one_writev_takes() -> None:
    parts = [b"%06d" % i for i in range(IOV_MAX * 2 + 7)]
    assert await _exchange([parts]) == b"".join(parts)


async def test_a_write_while_the_transport_holds_bytes_comes_after_them() -> None:
    first = [os.urandom(1_000_000)]  # more than the socket takes: the transport keeps a rest
    later = [[b"a" * 10, b"b" * 20], [b"", b"c" * 5_000]]
    received = await _exchange([first, *later])
    assert received == b"".join(first) + b"a" * 10 + b"b" * 20 + b"c" * 5_000
