"""Magnetar codec: the Pulsar wire protocol (sans-IO), compression, batching, chunking,
message ids and hashes. No sockets, no threads, no asyncio in this package."""

__all__: list[str] = []
