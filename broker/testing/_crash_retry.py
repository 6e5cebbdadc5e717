"""The broker crash harness's retry flow: our own client (`magnetar`) on the `retry`
subscription, retrying a seeded subset of messages through its retry topic, some of them
until they land in the dead-letter topic; and the check of what a crash left (see
`crashtest` for the theory of operation).

The workload side (`RetryConsumer`) subscribes Shared with `retry_enable=True` and a
dead-letter policy of `RETRIES_MAX` (so it also consumes `<topic>-retry-RETRY`; past the
maximum a copy goes to `<topic>-retry-DLQ`, whose subscription `dlq` is created with it).
Each message's key decides, from the seed, how often it is retried (`retries_wanted`): most
never (acknowledged at once), some up to `RETRIES_MAX` times, some once more (dead-lettered).
Every action is written to the book before it is taken (and a reconsume again once it
returned).

What our client promises (magnetar/_retry.py): `reconsume_later` stores the copy (its
publish acknowledged) before it acknowledges the message it copies. So after a crash, every
generation of a message (0: the original, g: the copy with RECONSUMETIMES g) that the
consumer reconsumed is either still there or followed by generation g+1 -- possibly both (a
duplicate, allowed), never neither. The check walks each acknowledged publish of the topic
from generation 0: a generation found (the topic, the retry topic, the dead-letter topic,
each drained without acknowledging) ends the walk; one the consumer acknowledged ends it too
(an ack without a receipt may or may not stick); one it reconsumed passes to the next; one it
never touched and not found is a loss. Every copy found must have been asked for (a
reconsume of the generation before it) and carry REAL_TOPIC (the topic), ORIGIN_MESSAGE_ID
(the original's id as the consumer saw it) and RECONSUMETIMES (1..`RETRIES_MAX` in the retry
topic, `RETRIES_MAX` + 1 in the dead-letter topic).

This is the one broker module that imports the client package (test tooling above it; see
tests/test_exports.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulsar

import magnetar

from ._crash_book import (
    RETRY_SUBSCRIPTION,
    AckBook,
    MessageKey,
    examples,
    message_key_of,
    message_payload,
)

__all__ = ["RETRIES_MAX", "RetryCheck", "RetryConsumer", "check_retry_flow", "retries_wanted"]

RETRIES_MAX = 2  # the dead-letter policy's max_redeliver_count: copies 1..2 retry, 3 is dead
RETRY_CHANCE = 0.25  # the share of messages retried at least once
RETRY_DELAY_MS_MAX = 100  # reconsume_later's delay, at most
DLQ_SUBSCRIPTION = "dlq"
OPERATION_TIMEOUT_S = 10
RECEIVE_TIMEOUT_MS = 100  # how often the consumer thread looks at its stop flag while idle
RECONSUMETIMES = "RECONSUMETIMES"
REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
# The states an acknowledged publish of the topic ends in, for the `retry` subscription.
STATES = ("acknowledged", "acknowledged after a retry", "on the topic", "in the retry topic",
          "dead-lettered")


def retry_topic(topic: str) -> str:
    return f"{topic}-{RETRY_SUBSCRIPTION}-RETRY"


def dead_letter_topic(topic: str) -> str:
    return f"{topic}-{RETRY_SUBSCRIPTION}-DLQ"


def retries_wanted(seed: int, key: MessageKey) -> int:
    """How often message `key` is reconsumed: 0 for most; 1..RETRIES_MAX + 1 for a seeded
    `RETRY_CHANCE` of them (RETRIES_MAX + 1: the last copy is dead-lettered)."""
    digest = hashlib.blake2b(f"{seed}/retry/{key[0]}:{key[1]}".encode(), digest_size=8).digest()
    draw = int.from_bytes(digest, "big") / 2**64
    if draw >= RETRY_CHANCE:
        return 0
    return 1 + int(draw / RETRY_CHANCE * (RETRIES_MAX + 1))


class RetryConsumer:
    """Our client's consumer of the `retry` subscription of `topic` (see the module comment).
    `start()` subscribes (raises magnetar's errors when it cannot); `stop()` ends it."""

    def __init__(self, url: str, topic: str, seed: int, book: AckBook, rng: random.Random):
        self.url = url
        self.topic = topic
        self.seed = seed
        self.book = book
        self.rng = rng
        self._stop = threading.Event()
        self.client: magnetar.Client | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.client = magnetar.Client(self.url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
        policy = magnetar.ConsumerDeadLetterPolicy(
            max_redeliver_count=RETRIES_MAX, initial_subscription_name=DLQ_SUBSCRIPTION)
        consumer = self.client.subscribe(
            self.topic, RETRY_SUBSCRIPTION, consumer_type=magnetar.ConsumerType.Shared,
            initial_position=magnetar.InitialPosition.Earliest, retry_enable=True,
            dead_letter_policy=policy, receiver_queue_size=200)
        self._thread = threading.Thread(target=self._run, args=(consumer,),
                                        name="crashtest-retry", daemon=True)
        self._thread.start()

    def _run(self, consumer: magnetar.Consumer) -> None:
        while not self._stop.is_set():
            try:
                message = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            except magnetar.Timeout:
                continue
            except magnetar.PulsarException:  # the client closed
                return
            try:
                self._handle(consumer, message)
            except magnetar.PulsarException:  # the broker went away: the workload ends
                return

    def _handle(self, consumer: magnetar.Consumer, message: magnetar.Message) -> None:
        data = message.data()
        key = message_key_of(data)
        if key is None or data != message_payload(self.seed, key):
            self.book.error(f"subscription {RETRY_SUBSCRIPTION} received a message the "
                            f"workload never sent: {data[:40]!r} at {message.message_id()}")
            return
        generation = _generation(message.properties())
        if generation == 0:
            self.book.origin(key, str(message.codec_id))  # the form ORIGIN_MESSAGE_ID takes
        if generation < retries_wanted(self.seed, key):
            delay_ms = self.rng.randint(0, RETRY_DELAY_MS_MAX)
            due_ms = int(time.time() * 1000) + delay_ms
            self.book.retry_acted(key, generation, "reconsume", due_ms)
            consumer.reconsume_later(message, delay_ms)
            self.book.retry_acted(key, generation, "reconsumed")
        else:
            self.book.retry_acted(key, generation, "ack")
            consumer.acknowledge(message)

    def stop(self) -> None:
        """End the thread and shut the client down at once (what is pending fails)."""
        self._stop.set()
        if self.client is not None:
            with contextlib.suppress(magnetar.PulsarException):
                self.client.shutdown()
        if self._thread is not None:
            self._thread.join()


def _generation(properties: Mapping[str, str]) -> int:
    try:
        return int(properties.get(RECONSUMETIMES, "0"))
    except ValueError:
        return -1


@dataclass
class RetryCheck:
    """What the retry check found: `violations` (messages affected, line), the number of
    acknowledged publishes in each of `STATES`, those that went through the retry topic and
    were found as promised (`retried`), those found dead-lettered (`dead_lettered`), and those
    found in two generations (`duplicates`, allowed)."""

    violations: list[tuple[int, str]] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    retried: int = 0
    dead_lettered: int = 0
    duplicates: int = 0


def check_retry_flow(client: pulsar.Client, topic: str, seed: int, book: AckBook,
                     on_topic: set[MessageKey], quiet_ms: int,
                     deadline_s: float) -> RetryCheck:
    """Drain the retry and dead-letter topics (without acknowledging) and check the promise
    of the module comment; `on_topic` is what the `retry` subscription delivered from the
    topic itself after the restart."""
    result = RetryCheck()
    found: dict[MessageKey, set[int]] = {k: {0} for k in on_topic}
    bad: dict[str, set[MessageKey]] = {}
    for where, name, subscription in (("retry", retry_topic(topic), RETRY_SUBSCRIPTION),
                                      ("dead-letter", dead_letter_topic(topic),
                                       DLQ_SUBSCRIPTION)):
        for key, properties in _drain(client, name, subscription, seed, book, quiet_ms,
                                      deadline_s, bad):
            generation = _generation(properties)
            for problem in _copy_problems(where, topic, key, generation, properties, book):
                bad.setdefault(problem, set()).add(key)
            found.setdefault(key, set()).add(generation)
    for problem, keys in sorted(bad.items()):
        result.violations.append((len(keys), f"{problem}: {len(keys)} ({examples(keys)})"))
    with book.lock:
        actions: dict[MessageKey, dict[int, set[str]]] = {}
        for (key, generation), done in book.retry_actions.items():
            actions.setdefault(key, {})[generation] = set(done)
    lost: dict[int, set[MessageKey]] = {}
    for sent in book.acknowledged():
        _walk(sent.key, found.get(sent.key, set()), actions.get(sent.key, {}), result, lost)
    for generation, keys in sorted(lost.items()):
        result.violations.append((len(keys), (
            f"subscription {RETRY_SUBSCRIPTION}: messages reconsumed (the copy's publish "
            f"acknowledged before the ack) found neither as RECONSUMETIMES {generation} nor "
            f"later: {len(keys)} ({examples(keys)})")))
    return result


def _walk(key: MessageKey, found: set[int], actions: dict[int, set[str]],
          result: RetryCheck, lost: dict[int, set[MessageKey]]) -> None:
    """Follow `key` from its original through the generations the consumer reconsumed (see
    the module comment; `found`: the generations found, `actions`: what the consumer did to
    each) and count the state it ends in."""
    generation = 0
    if len(found) > 1:
        result.duplicates += 1
    while True:
        if generation in found:
            state = ("on the topic" if generation == 0 else "in the retry topic"
                     if generation <= RETRIES_MAX else "dead-lettered")
            break
        done = actions.get(generation, set())
        if "ack" in done:
            state = "acknowledged" if generation == 0 else "acknowledged after a retry"
            break
        if done and generation <= RETRIES_MAX:  # reconsumed: the next generation is stored
            generation += 1
            continue
        if generation > 0:
            lost.setdefault(generation, set()).add(key)
        return  # generation 0 untouched and gone: the subscription's own check reports it
    result.states[state] += 1
    if generation > 0:
        result.retried += 1
        result.dead_lettered += state == "dead-lettered"


def _copy_problems(where: str, topic: str, key: MessageKey, generation: int,
                   properties: Mapping[str, str], book: AckBook) -> list[str]:
    """What is wrong with a copy of `key` found in the `where` topic."""
    problems = []
    dead = where == "dead-letter"
    if generation != RETRIES_MAX + 1 if dead else not 1 <= generation <= RETRIES_MAX:
        problems.append(f"{where} topic: copies with a wrong {RECONSUMETIMES}")
    with book.lock:
        asked = (key, generation - 1) in book.retry_actions and \
            book.retry_actions[(key, generation - 1)] - {"ack"}
        origin = book.origin_ids.get(key)
    if not asked:
        problems.append(f"{where} topic: copies the consumer never asked for")
    if properties.get(REAL_TOPIC) != topic:
        problems.append(f"{where} topic: copies with a wrong {REAL_TOPIC}")
    if origin is None or properties.get(ORIGIN_MESSAGE_ID) != origin:
        problems.append(f"{where} topic: copies with a wrong {ORIGIN_MESSAGE_ID}")
    return problems


def _drain(client: pulsar.Client, topic: str, subscription: str, seed: int, book: AckBook,
           quiet_ms: int, deadline_s: float,
           bad: dict[str, set[MessageKey]]) -> list[tuple[MessageKey, dict[str, str]]]:
    """Every message `subscription` delivers until nothing more comes for `quiet_ms` after
    the last copy was due (or `deadline_s`), without acknowledging."""
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                receiver_queue_size=1000)
    copies: list[tuple[MessageKey, dict[str, str]]] = []
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=quiet_ms)
            except pulsar.Timeout:
                if time.time() * 1000 > book.retry_due_ms + quiet_ms:
                    break
                continue
            key = message_key_of(message.data())
            if key is None or message.data() != message_payload(seed, key):
                bad.setdefault(f"{topic}: messages the workload never sent", set()).add(
                    ("?", len(copies)))
                continue
            copies.append((key, dict(message.properties())))
    finally:
        consumer.close()
    return copies

