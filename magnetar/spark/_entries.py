"""Whole entries of one topic-partition, as the broker stores them: the batch reader's input.

`EntryStream` subscribes a non-durable, Exclusive consumer through the client's transport (the
same subscription a `Reader` makes) but keeps each delivered entry whole -- metadata and raw
payload, a batch not split into messages -- so `_columns.py` can turn a batch of a thousand
messages into Arrow columns at once instead of building a thousand `Message` objects. It works
with any broker the client speaks to (ours over `pulsar://`, a data directory through the
driver's host, Apache Pulsar); the broker dispatches only confirmed entries, so nothing past
the last confirmed entry is ever seen.

Flow control: the broker counts permits in messages. The stream grants `PERMITS_FIRST` to
start, then keeps at most `permits_max` outstanding, sized from the bytes per message seen so
far so that what the broker may push ahead stays near `QUEUED_BYTES_MAX`.

Threads: deliveries arrive on the client's loop thread (`on_message`, which must not block) and
go through a thread-safe queue to the task's thread, which calls `next_entry`.
"""

from __future__ import annotations

import queue
import secrets
from typing import TYPE_CHECKING

from magnetar._transport import Incoming, SubscribeRequest

if TYPE_CHECKING:
    import magnetar
    from magnetar.codec import MessageId

__all__ = ["EntryStream", "StreamClosed"]

PERMITS_FIRST = 1000  # messages granted before any size is known (the client's default)
PERMITS_MAX = 50_000  # outstanding messages at most, however small they are
QUEUED_BYTES_MAX = 16 * 1024 * 1024  # what the broker may push ahead of the task, about


class StreamClosed(Exception):
    """The broker closed the subscription (topic deleted or unloaded)."""


class EntryStream:
    """A non-durable subscription on `topic` from entry `first` (inclusive) delivering whole
    entries; close it with `close`."""

    def __init__(self, client: magnetar.Client, topic: str, first: MessageId):
        core = client._core
        self._client = client
        self._transport = core.transport
        self.consumer_id = next(core._ids)
        self._queue: queue.SimpleQueue[Incoming | str] = queue.SimpleQueue()
        self._granted = 0  # permits granted and not yet used by a delivered message
        self._messages = 0
        self._bytes = 0
        request = SubscribeRequest(
            topic=topic, subscription=f"spark-read-{secrets.token_hex(5)}",
            sub_type="Exclusive", durable=False, start_message_id=first,
            initial_position="earliest" if first.ledger_id < 0 else "latest")
        client._run(self._open(request))

    async def _open(self, request: SubscribeRequest) -> None:
        await self._transport.subscribe(self.consumer_id, request, self)
        self._granted = PERMITS_FIRST
        self._transport.flow(self.consumer_id, PERMITS_FIRST)

    # ConsumerEvents, on the loop thread
    def on_message(self, incoming: Incoming) -> None:
        self._queue.put(incoming)

    def on_closed(self, reason: str) -> None:
        self._queue.put(reason)

    def permits_max(self) -> int:
        if not self._messages:
            return PERMITS_FIRST
        per_message = max(1, self._bytes // self._messages)
        return max(PERMITS_FIRST // 10, min(PERMITS_MAX, QUEUED_BYTES_MAX // per_message))

    def next_entry(self, timeout_s: float) -> Incoming | None:
        """The next entry, or None after `timeout_s` without one.

        Raises:
            StreamClosed: the broker closed the subscription.
        """
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if isinstance(item, str):
            raise StreamClosed(item)
        count = item.metadata.num_messages_in_batch or 1
        self._messages += count
        self._bytes += len(item.payload)
        self._granted -= count
        wanted = self.permits_max()
        if self._granted <= wanted // 2:
            more, self._granted = wanted - self._granted, wanted
            transport, consumer_id = self._transport, self.consumer_id
            self._client._thread.call(lambda: transport.flow(consumer_id, more))
        return item

    def last_stored(self) -> tuple[int, int]:
        """(ledger, entry) of the last message the broker has stored on the topic."""
        last = self._client._run(self._transport.last_message_id(self.consumer_id))[0]
        return last.ledger_id, last.entry_id

    def close(self) -> None:
        import magnetar

        try:
            self._client._run(self._transport.close_consumer(self.consumer_id))
        except magnetar.PulsarException:
            pass  # the broker already dropped it (the topic went away)
