"""The broker crash harness's workload, through the official `pulsar-client` (see
`crashtest` for the theory of operation).

On one topic, with deduplication on in the broker:

* three named producers: `single` (unbatched, explicit sequence ids), `batch` (batching,
  one key per burst, sequence ids assigned by the client: the k-th send of a producer created with
  `last_sequence_id()` L gets L+1+k) and `delayed` (unbatched, explicit sequence ids,
  `deliver_after` up to `delay_ms_max`);
* official consumers on the `shared` (Shared) and `key-shared` (Key_Shared) subscriptions,
  each on its own thread, acknowledging what they receive and negatively acknowledging some
  of it (redelivered after `NACK_DELAY_MS`); the protocol consumer with ack receipts on
  `receipt` (`_crash_receipts`); and our own client's consumer on `retry`, which retries a
  seeded subset through the retry topic and dead-letters some (`_crash_retry`).

Every send records its message in the `AckBook` before it goes out, and its send callback
records whether the broker acknowledged it. The harness thread sends (`step`, paced so no
more than `IN_FLIGHT_MAX` publishes await their receipts); `stop()` ends the consumers and
shuts the client down at once (no resend can reach a restarted broker).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import random
import threading
import time

import pulsar

from ._crash_book import (
    RETRY_SUBSCRIPTION,
    SUBSCRIPTIONS,
    AckBook,
    MessageKey,
    message_key_of,
    message_payload,
)
from ._crash_receipts import ReceiptConsumer
from ._crash_retry import RetryConsumer

__all__ = ["PRODUCERS", "Workload", "new_client"]

PRODUCERS = ("single", "batch", "delayed")
OPERATION_TIMEOUT_S = 10
SEND_TIMEOUT_MS = 5000
IN_FLIGHT_MAX = 300  # publishes awaiting their receipts before the harness waits
BATCH_BURST_MAX = 40  # messages sent at once on the batching producer
NACK_CHANCE = 0.1
NACK_DELAY_MS = 200
RECEIVE_TIMEOUT_MS = 100  # how often a consumer thread looks at its stop flag while idle
KEYS = 8  # distinct message keys (Key_Shared spreads them over its consumers)


def new_client(url: str) -> pulsar.Client:
    """An official client logging through `magnetar.crashtest.client` (a crash makes it log
    errors; the harness keeps them quiet)."""
    return pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S,
                         logger=logging.getLogger("magnetar.crashtest.client"))


def message_key_text(key: MessageKey) -> str:
    return f"k{key[1] % KEYS}"


class Workload:
    """One iteration's clients on `topic` of the broker at `url` and `port` (see the module
    comment)."""

    def __init__(self, url: str, port: int, topic: str, seed: int, book: AckBook,
                 rng: random.Random, delay_ms_max: int):
        self.topic = topic
        self.seed = seed
        self.book = book
        self.rng = rng
        self.delay_ms_max = delay_ms_max
        self._stop = threading.Event()
        self._in_flight = threading.Semaphore(IN_FLIGHT_MAX)
        self.client = new_client(url)
        self.consumers: list[tuple[str, pulsar.Consumer]] = []
        self.threads: list[threading.Thread] = []
        self.receipts = ReceiptConsumer(port, topic, "receipt", book,
                                        random.Random(rng.getrandbits(32)))
        self.retry = RetryConsumer(url, topic, seed, book, random.Random(rng.getrandbits(32)))
        self.next_sequence: dict[str, int] = {}
        self.producers: dict[str, pulsar.Producer] = {}

    def start(self) -> None:
        """Subscribe (every subscription exists before the first send) and create the
        producers. Raises pulsar's errors or RuntimeError when the broker refuses."""
        for name, kind in SUBSCRIPTIONS:
            if name in ("receipt", RETRY_SUBSCRIPTION):
                continue
            consumer = self.client.subscribe(
                self.topic, name, consumer_type=getattr(pulsar.ConsumerType, kind.replace(
                    "_", "")), initial_position=pulsar.InitialPosition.Earliest,
                negative_ack_redelivery_delay_ms=NACK_DELAY_MS, receiver_queue_size=200,
                batch_index_ack_enabled=True)
            self.consumers.append((name, consumer))
            rng = random.Random(self.rng.getrandbits(32))
            thread = threading.Thread(target=self._consume, args=(name, consumer, rng),
                                      name=f"crashtest-{name}", daemon=True)
            self.threads.append(thread)
        self.receipts.start()
        self.retry.start()
        for thread in self.threads:
            thread.start()
        for name in PRODUCERS:
            batched = name == "batch"
            producer = self.client.create_producer(
                self.topic, producer_name=name, batching_enabled=batched,
                batching_max_publish_delay_ms=5,
                send_timeout_millis=SEND_TIMEOUT_MS, block_if_queue_full=False)
            self.producers[name] = producer
            # The Python client drops an explicit sequence id of 0 (it tests it for truth):
            # explicit ids start at 1.
            first = producer.last_sequence_id() + 1
            self.next_sequence[name] = first if name == "batch" else max(first, 1)

    def step(self) -> None:
        """One seeded action: a single message, a burst on the batching producer, or a
        delayed message; waits while `IN_FLIGHT_MAX` publishes are unanswered (or the
        workload is stopped)."""
        choice = self.rng.random()
        if choice < 0.4:
            self._send("single", 1)
        elif choice < 0.8:
            self._send("batch", self.rng.randint(2, BATCH_BURST_MAX))
        else:
            self._send("delayed", 1, self.rng.randint(0, self.delay_ms_max))

    def _send(self, name: str, count: int, delay_ms: int = 0) -> None:
        producer = self.producers[name]
        burst_key = f"k{self.rng.randrange(KEYS)}"
        for _ in range(count):
            while not self._in_flight.acquire(timeout=0.05):
                if self._stop.is_set():
                    return
            key = (name, self.next_sequence[name])
            self.next_sequence[name] += 1
            deliver_at_ms = int(time.time() * 1000) + delay_ms if delay_ms else 0
            self.book.sending(key, deliver_at_ms)
            try:
                producer.send_async(
                    message_payload(self.seed, key), self._callback(key),
                    partition_key=burst_key if name == "batch" else message_key_text(key),
                    sequence_id=None if name == "batch" else key[1],
                    deliver_after=datetime.timedelta(milliseconds=delay_ms) if delay_ms else None)
            except pulsar.PulsarException:  # the queue is full or the producer is gone
                self.book.published(key, False)
                self._in_flight.release()

    def _callback(self, key: MessageKey) -> object:
        def done(result: pulsar.Result, _message_id: pulsar.MessageId) -> None:
            self.book.published(key, result == pulsar.Result.Ok)
            self._in_flight.release()

        return done

    def _consume(self, name: str, consumer: pulsar.Consumer, rng: random.Random) -> None:
        while not self._stop.is_set():
            try:
                message = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            except pulsar.Timeout:
                continue
            except pulsar.PulsarException:  # the broker went away or the client closed
                return
            key = message_key_of(message.data())
            if key is None or message.data() != message_payload(self.seed, key):
                self.book.error(f"subscription {name} received a message the workload never "
                                f"sent: {message.data()[:40]!r} at {message.message_id()}")
                continue
            try:
                if rng.random() < NACK_CHANCE:
                    consumer.negative_acknowledge(message)
                else:
                    self.book.acked(name, key)
                    consumer.acknowledge(message)
            except pulsar.PulsarException:
                return

    def stop(self) -> None:
        """End every thread and shut the client down at once (nothing is flushed)."""
        self._stop.set()
        self.receipts.stop()
        self.retry.stop()
        with contextlib.suppress(pulsar.PulsarException):
            self.client.shutdown()
        for thread in self.threads:
            if thread.ident is not None:
                thread.join()
        with contextlib.suppress(pulsar.PulsarException):
            self.client.close()
