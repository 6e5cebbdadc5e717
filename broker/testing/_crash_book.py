"""What the broker crash harness knows: its options and summary, the payload of every
message (derived from the seed, never stored), and the book of what the broker
acknowledged during one iteration (see `crashtest` for the theory of operation).

The book is written from the official client's callback and listener threads, the
receipt consumer's thread and the harness thread, so every change takes its lock.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import IO

__all__ = [
    "EXAMPLES_MAX",
    "RETRY_SUBSCRIPTION",
    "SUBSCRIPTIONS",
    "AckBook",
    "BrokerCrashTestOptions",
    "BrokerCrashTestSummary",
    "MessageKey",
    "Sent",
    "examples",
    "message_key_of",
    "message_payload",
]

VIOLATIONS_LISTED_MAX = 200  # violations printed (all are counted)
EXAMPLES_MAX = 5  # message keys named in one violation line
PAYLOAD_FILLER_BYTES_MAX = 300  # a message is its key's text plus up to this many bytes
MODES = ("kill", "powerloss", "both")

# The subscriptions every iteration's topic has: (name, type). `receipt` is acknowledged by
# the harness's own protocol consumer, which asks for ack receipts; `retry` by our own client
# (`magnetar`), which retries some messages through its retry topic (`_crash_retry`); the
# others by the official client, whose Python API cannot ask for receipts (its acks are
# "attempted").
SUBSCRIPTIONS = (("shared", "Shared"), ("key-shared", "Key_Shared"), ("receipt", "Shared"),
                 ("retry", "Shared"))
RETRY_SUBSCRIPTION = "retry"
# What the `retry` subscription's consumer did with one generation of a message (0: the
# original on the topic; g >= 1: its copy with RECONSUMETIMES g): "ack" (an attempted ack),
# "reconsume" (reconsume_later called), "reconsumed" (reconsume_later returned).
RetryAction = str

MessageKey = tuple[str, int]  # (producer name, sequence id)


@dataclass
class BrokerCrashTestOptions:
    """What `run_broker_crashtest` does.

    `data_dir` is a scratch directory: the harness replaces its `broker-kill` and
    `broker-powerloss` subdirectories (one data directory per mode, reused across that
    mode's iterations) and leaves anything else there alone. `mode` is 'kill', 'powerloss'
    or 'both' (iterations alternate, kill first). `seed` None picks one at random (printed).
    """

    data_dir: str
    iterations: int
    seed: int | None = None
    mode: str = "both"
    progress: bool = True
    crash_after_s_max: float = 2.0  # the crash comes this long after the workload began, at most
    delay_ms_max: int = 800  # delayed messages are delivered this long after sending, at most
    out: IO[str] | None = None  # where the seed, violations and summary go (stdout)

    def __post_init__(self) -> None:
        assert self.mode in MODES, self.mode
        assert self.iterations >= 0
        assert self.crash_after_s_max > 0
        assert self.delay_ms_max >= 0


@dataclass
class BrokerCrashTestSummary:
    """What a run found. `acknowledged_verified` counts the acknowledged publishes found
    intact after the crash that followed them; `receipted_acks_verified` the acks
    acknowledged with a receipt found still in force; `attempted_acks_redelivered` the
    official client's acks (sent without a receipt) whose message came again, which the
    durability promise allows; `resends_dropped` the resends of messages already stored
    that deduplication dropped (a resend of a message not yet stored is stored);
    `retried_verified` the acknowledged publishes that `reconsume_later` sent through the retry
    topic and that were found where the promise says (`_crash_retry`), `dead_lettered_verified`
    those of them found in the dead-letter topic."""

    seed: int
    iterations: int = 0
    kill_iterations: int = 0
    powerloss_iterations: int = 0
    acknowledged_verified: int = 0
    receipted_acks_verified: int = 0
    attempted_acks_redelivered: int = 0
    resends: int = 0
    resends_dropped: int = 0
    retried_verified: int = 0
    dead_lettered_verified: int = 0
    retry_states: dict[str, int] = field(default_factory=dict)  # see `RetryCheck`
    retry_duplicates: int = 0
    violations: int = 0
    violation_messages: list[str] = field(default_factory=list)
    crashes: dict[str, int] = field(default_factory=dict)  # how powerloss crashes came

    def line(self) -> str:
        return (f"crashtest broker: {self.iterations} iterations, {self.acknowledged_verified} "
                f"acknowledged messages verified ({self.retried_verified} retried, "
                f"{self.dead_lettered_verified} dead-lettered), {self.violations} violations")


def examples(keys: list[MessageKey] | set[MessageKey]) -> str:
    """A few of `keys`, for a violation line."""
    shown = sorted(keys)[:EXAMPLES_MAX]
    more = ", ..." if len(keys) > EXAMPLES_MAX else ""
    return ", ".join(f"{p}:{s}" for p, s in shown) + more


def message_payload(seed: int, key: MessageKey) -> bytes:
    """The bytes of message `key`: its key's text, then filler derived from (seed, key)."""
    producer, sequence_id = key
    head = f"{producer}:{sequence_id}:".encode()
    digest = hashlib.blake2b(head, key=str(seed).encode()[:64], digest_size=32).digest()
    size = digest[0] * PAYLOAD_FILLER_BYTES_MAX // 255
    return head + (digest * (size // len(digest) + 1))[:size]


def message_key_of(payload: bytes) -> MessageKey | None:
    """The key a payload names (None when it names none)."""
    producer, sep, rest = payload.partition(b":")
    number, sep2, _ = rest.partition(b":")
    if not sep or not sep2 or not number.isdigit():
        return None
    return producer.decode(errors="replace"), int(number)


@dataclass
class Sent:
    """One message the workload sent: when it is due (delayed) and how its publish ended
    (None: no answer yet)."""

    key: MessageKey
    deliver_at_ms: int = 0
    acknowledged: bool | None = None


class AckBook:
    """What one iteration sent and what the broker acknowledged (see the module comment)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[MessageKey, Sent] = {}
        self.attempted_acks: dict[str, set[MessageKey]] = {n: set() for n, _ in SUBSCRIPTIONS}
        self.receipted_acks: set[MessageKey] = set()  # on the `receipt` subscription
        self.receipted_positions: set[tuple[int, int]] = set()  # their (ledger, entry)
        self.errors: list[str] = []  # what the workload saw that the broker must never do
        # the `retry` subscription: (key, generation) -> what was done; each key's original id
        self.retry_actions: dict[tuple[MessageKey, int], set[RetryAction]] = {}
        self.origin_ids: dict[MessageKey, str] = {}
        self.retry_due_ms = 0  # when the last copy sent to the retry topic is due

    def sending(self, key: MessageKey, deliver_at_ms: int = 0) -> None:
        with self.lock:
            assert key not in self.sent, key
            self.sent[key] = Sent(key, deliver_at_ms)

    def published(self, key: MessageKey, ok: bool) -> None:
        """The send callback of `key` ran; `ok`: the broker acknowledged it."""
        with self.lock:
            self.sent[key].acknowledged = ok

    def acked(self, subscription: str, key: MessageKey) -> None:
        with self.lock:
            self.attempted_acks[subscription].add(key)

    def retry_acted(self, key: MessageKey, generation: int, action: RetryAction,
                    due_ms: int = 0) -> None:
        """The `retry` consumer did `action` to generation `generation` of `key` (an ack or
        reconsume of the original counts as an attempted ack on the topic)."""
        with self.lock:
            self.retry_actions.setdefault((key, generation), set()).add(action)
            self.retry_due_ms = max(self.retry_due_ms, due_ms)
            if generation == 0:
                self.attempted_acks[RETRY_SUBSCRIPTION].add(key)

    def origin(self, key: MessageKey, message_id: str) -> None:
        with self.lock:
            self.origin_ids.setdefault(key, message_id)

    def receipted(self, position: tuple[int, int], keys: list[MessageKey]) -> None:
        """The ack of the entry at `position`, holding `keys`, came back with a receipt."""
        with self.lock:
            self.receipted_acks.update(keys)
            self.receipted_positions.add(position)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def acknowledged(self) -> list[Sent]:
        with self.lock:
            return [s for s in self.sent.values() if s.acknowledged]

    def unacknowledged(self) -> list[Sent]:
        with self.lock:
            return [s for s in self.sent.values() if not s.acknowledged]

    def last_acknowledged(self) -> dict[str, int]:
        """The highest acknowledged sequence id of each producer that has one."""
        last: dict[str, int] = {}
        for sent in self.acknowledged():
            producer, sequence_id = sent.key
            last[producer] = max(last.get(producer, -1), sequence_id)
        return last

    def acked_on(self, subscription: str) -> set[MessageKey]:
        """Every message an ack was sent for on `subscription` (receipt or not)."""
        with self.lock:
            found = set(self.attempted_acks[subscription])
            if subscription == "receipt":
                found |= self.receipted_acks
            return found
