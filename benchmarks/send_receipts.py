"""Receipts of `send_async` in the benchmarks' publish loops (bench_e2e, its pulsar-lite and
many-topics workloads, bench_client): one definition of what is counted (good receipts, failed
ones, the time of the last good one) and of waiting for the rest."""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["BoundedReceipts", "ReceiptCount"]

POLL_S = 0.002  # how often a wait looks at the count


class ReceiptCount:
    """Receipts counted under a lock: `done`, `failed` (each failure's result) and `last_s`
    (perf_counter time of the last good receipt; the construction time until one arrives)."""

    def __init__(self, ok: object):
        self.ok = ok
        self.lock = threading.Lock()
        self.done = 0
        self.failed: list[str] = []
        self.last_s = time.perf_counter()

    def count(self, result: object) -> None:
        now = time.perf_counter()
        with self.lock:
            if result == self.ok:
                self.done += 1
                self.last_s = now
            else:
                self.failed.append(str(result))

    def answered(self, sent: int) -> bool:
        """Whether every one of `sent` sends has its receipt, good or failed."""
        with self.lock:
            return self.done + len(self.failed) >= sent

    def quiet_s(self) -> float:
        """Seconds since the last good receipt."""
        with self.lock:
            return time.perf_counter() - self.last_s

    def wait_all(self, sent: int, deadline_s: float) -> None:
        """Wait until all `sent` are answered. Raises RuntimeError after `deadline_s`, or when
        any failed (naming the first)."""
        deadline = time.monotonic() + deadline_s
        while not self.answered(sent):
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.done} of {sent} sends were receipted")
            time.sleep(POLL_S)
        if self.failed:
            raise RuntimeError(f"{len(self.failed)} sends failed, first {self.failed[0]}")


class BoundedReceipts(ReceiptCount):
    """A count that also bounds the sends in flight: acquire `slots` before each send; each
    receipt releases one."""

    def __init__(self, ok: object, in_flight_max: int):
        super().__init__(ok)
        self.slots = threading.Semaphore(in_flight_max)

    def callback(self, result: Any, _message_id: Any) -> None:
        self.count(result)
        self.slots.release()
