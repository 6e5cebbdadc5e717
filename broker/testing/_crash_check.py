"""The broker crash harness's checks after a restart (see `crashtest` for the theory of
operation and the table of what is checked), through a fresh official client.

Order matters: the named producers are re-created and resend first (their dedup state is
read before anything new is published), then a reader reads the whole topic (so a duplicate
that a resend made is seen), then each subscription is drained.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import pulsar

from ._crash_book import (
    EXAMPLES_MAX,
    RETRY_SUBSCRIPTION,
    SUBSCRIPTIONS,
    AckBook,
    MessageKey,
    examples,
    message_key_of,
    message_payload,
)
from ._crash_retry import check_retry_flow
from ._crash_workload import PRODUCERS, new_client

__all__ = ["Verification", "verify_after_restart"]

RESEND_ACKNOWLEDGED_MAX = 3  # acknowledged messages each producer sends again (must be dropped)
RESEND_DEADLINE_S = 30.0
READ_TIMEOUT_MS = 5000
DRAIN_DEADLINE_S = 30.0  # for a subscription to deliver everything it must
QUIET_MS = 300  # a drain ends when nothing more came for this long (after what it must)


@dataclass
class Verification:
    """What the checks after one restart found. `violations`: (messages affected, line)."""

    violations: list[tuple[int, str]] = field(default_factory=list)
    acknowledged_verified: int = 0
    receipted_acks_verified: int = 0
    attempted_acks_redelivered: int = 0
    resends: int = 0
    resends_dropped: int = 0
    retried_verified: int = 0
    dead_lettered_verified: int = 0
    retry_states: dict[str, int] = field(default_factory=dict)
    retry_duplicates: int = 0

    def violation(self, keys: list[MessageKey] | set[MessageKey], what: str) -> None:
        if keys:
            self.violations.append((len(keys), f"{what}: {len(keys)} ({examples(keys)})"))


def verify_after_restart(url: str, topic: str, seed: int, book: AckBook, rng: random.Random,
                         drain_deadline_s: float = DRAIN_DEADLINE_S) -> Verification:
    """Run every check against the restarted broker at `url` (see the module comment); a
    subscription gets `drain_deadline_s` to deliver what it must.

    Raises pulsar's errors when the broker does not answer (the caller reports them)."""
    result = Verification()
    client = new_client(url)
    try:
        resent = _check_dedup_and_resend(client, topic, seed, book, rng, result)
        stored = _read_topic(client, topic, seed, result)
        _check_stored(stored, book, resent, result)
        on_topic = {name: _drain(client, topic, name, kind, book, result, drain_deadline_s)
                    for name, kind in SUBSCRIPTIONS}
        retry = check_retry_flow(client, topic, seed, book, on_topic[RETRY_SUBSCRIPTION],
                                 QUIET_MS, drain_deadline_s)
    finally:
        client.close()
    result.violations += retry.violations
    result.retried_verified = retry.retried
    result.dead_lettered_verified = retry.dead_lettered
    result.retry_states = retry.states
    result.retry_duplicates = retry.duplicates
    return result


def _check_dedup_and_resend(client: pulsar.Client, topic: str, seed: int, book: AckBook,
                            rng: random.Random, result: Verification) -> set[MessageKey]:
    """Re-create each named producer: its `last_sequence_id` must be at least the last one
    acknowledged and at most the last one sent. Then send again, with their sequence ids,
    every message whose publish was not acknowledged and a few that were: deduplication must
    store none of them twice. Returns the resends the broker acknowledged."""
    last_acked = book.last_acknowledged()
    sent_by: dict[str, list[MessageKey]] = {name: [] for name in PRODUCERS}
    for key in book.sent:
        sent_by[key[0]].append(key)
    unacknowledged = {s.key for s in book.unacknowledged()}
    acknowledged: set[MessageKey] = set()
    lock = threading.Lock()
    done = threading.Semaphore(0)
    for name in PRODUCERS:
        producer = client.create_producer(topic, producer_name=name, batching_enabled=False)
        last = producer.last_sequence_id()
        required = last_acked.get(name, -1)
        if last < required:
            result.violations.append((1, f"producer {name}: last_sequence_id {last} after the "
                                          f"restart, below its last acknowledged {required}"))
        highest_sent = max((k[1] for k in sent_by[name]), default=-1)
        if last > highest_sent:
            result.violations.append((1, f"producer {name}: last_sequence_id {last} after the "
                                          f"restart, above the highest ever sent "
                                          f"{highest_sent}"))
        # Not sequence id 0: the Python client would replace it with its own (see Workload).
        resendable = [k for k in sorted(sent_by[name]) if k[1] > 0]
        keys = [k for k in resendable if k in unacknowledged]
        acked = [k for k in resendable if k not in unacknowledged]
        keys += sorted(rng.sample(acked, min(RESEND_ACKNOWLEDGED_MAX, len(acked))))
        for key in keys:
            def callback(res: pulsar.Result, message_id: pulsar.MessageId,
                         key: MessageKey = key) -> None:
                with lock:
                    if res == pulsar.Result.Ok:
                        acknowledged.add(key)
                        if message_id.ledger_id() < 0 or message_id.entry_id() < 0:
                            result.resends_dropped += 1
                done.release()

            producer.send_async(message_payload(seed, key), callback, sequence_id=key[1])
            result.resends += 1
        producer.flush()
        producer.close()
    deadline = time.monotonic() + RESEND_DEADLINE_S
    for _ in range(result.resends):
        if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            result.violations.append((1, "resends: not every send callback ran in "
                                          f"{RESEND_DEADLINE_S:.0f} s"))
            break
    with lock:
        return set(acknowledged)


def _read_topic(client: pulsar.Client, topic: str, seed: int,
                result: Verification) -> dict[MessageKey, int]:
    """How often each message is stored, read from the earliest with a reader."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    counts: dict[MessageKey, int] = {}
    strangers: list[str] = []
    try:
        while reader.has_message_available():
            message = reader.read_next(READ_TIMEOUT_MS)
            key = message_key_of(message.data())
            if key is None or message.data() != message_payload(seed, key):
                strangers.append(f"{message.message_id()}: {message.data()[:24]!r}")
                continue
            counts[key] = counts.get(key, 0) + 1
    finally:
        reader.close()
    if strangers:
        result.violations.append((len(strangers), f"stored messages with bytes the workload "
                                                  f"never sent: {len(strangers)} "
                                                  f"({', '.join(strangers[:EXAMPLES_MAX])})"))
    return counts


def _check_stored(stored: dict[MessageKey, int], book: AckBook, resent: set[MessageKey],
                  result: Verification) -> None:
    """No message stored twice; every acknowledged publish (before the crash, or a resend
    after it) is stored, unless every subscription acknowledged it (its ledger may then
    have been trimmed)."""
    result.violation({k for k, n in stored.items() if n > 1},
                     "messages of deduplicated producers stored more than once")
    acked_everywhere = set.intersection(*(book.acked_on(name) for name, _ in SUBSCRIPTIONS))
    acknowledged = {s.key for s in book.acknowledged()}
    missing = {k for k in acknowledged | resent
               if k not in stored and k not in acked_everywhere}
    result.violation(missing, "acknowledged publishes missing from the topic")
    result.acknowledged_verified += len(acknowledged - missing)


def _drain(client: pulsar.Client, topic: str, name: str, kind: str, book: AckBook,
           result: Verification, deadline_s: float) -> set[MessageKey]:
    """Attach a consumer to subscription `name` (without acknowledging anything) and receive
    until every message it must deliver came and nothing more comes for `QUIET_MS`: each
    acknowledged publish not acknowledged on it; never a message acknowledged with a
    receipt. Returns the messages delivered."""
    acked = book.acked_on(name)
    receipted = set(book.receipted_acks) if name == "receipt" else set()
    receipted_at = set(book.receipted_positions) if name == "receipt" else set()
    published = book.acknowledged()
    expected = {s.key for s in published} - acked
    due_ms = max((s.deliver_at_ms for s in published), default=0)
    consumer = client.subscribe(topic, name, consumer_type=getattr(
        pulsar.ConsumerType, kind.replace("_", "")), receiver_queue_size=1000)
    seen: set[MessageKey] = set()
    undone: set[MessageKey] = set()
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            try:
                message = consumer.receive(timeout_millis=QUIET_MS)
            except pulsar.Timeout:
                if expected <= seen and time.time() * 1000 > due_ms + QUIET_MS:
                    break
                continue
            key = message_key_of(message.data())
            if key is not None:
                seen.add(key)
                message_id = message.message_id()
                if (message_id.ledger_id(), message_id.entry_id()) in receipted_at:
                    undone.add(key)
    finally:
        consumer.close()
    result.violation(expected - seen, f"subscription {name}: acknowledged publishes, not "
                                      f"acknowledged there, not delivered after the restart")
    result.violation(undone, f"subscription {name}: acks acknowledged with a receipt, "
                             f"undone (delivered again)")
    result.receipted_acks_verified += len(receipted - undone)
    result.attempted_acks_redelivered += len(seen & (acked - receipted))
    return seen
