"""Producer access modes of a persistent topic (Pulsar's PIP-68 exclusive producers).

Theory of operation
-------------------
`ExclusiveAccess` is owned by one `PersistentTopic` and decides, for each producer that
asks to join, whether it may. It knows the topic's producers only through the callbacks it
is given, and holds:

* `epoch`: the topic epoch, or None before any exclusive producer ever joined. It is stored
  as the managed-ledger property `pulsar.topic.epoch` (Pulsar's name), written durably
  before the producer that caused the change is admitted, so it survives restarts.
* `holder`: the name of the producer that holds exclusive access, or None.
* `waiters`: WaitForExclusive producers queued FIFO, at most `waiters_max`.

Rules (as Pulsar applies them):

* Shared: refused with ProducerBusy while an exclusive producer holds the topic or waits.
* Exclusive: refused with ProducerFenced while any producer is connected or waits, and
  when it presents a topic epoch lower than the current one (a newer exclusive producer
  took over in between); otherwise it becomes the holder.
* ExclusiveWithFencing: every connected producer is evicted (the `evict` callback closes it,
  which the client sees as CLOSE_PRODUCER) and every waiter fails with ProducerFenced; then
  as Exclusive.
* WaitForExclusive: queued while any producer is connected (its `admitted` future resolves
  once it is promoted: when the holder, or the last shared producer, leaves; the connection
  answers producer_ready=false meanwhile); otherwise as Exclusive.

The epoch: a producer that presents a topic epoch (a reconnect) keeps it; otherwise the
epoch goes up by one (the first exclusive producer gets 0). When the holder leaves, the
first waiter is promoted with the next epoch. Shared producers get no epoch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import ProducerBusyError, ProducerFencedError, ServiceNotReadyError

__all__ = ["EXCLUSIVE_WAITERS_MAX_DEFAULT", "TOPIC_EPOCH_PROPERTY", "ExclusiveAccess",
           "Waiter"]

TOPIC_EPOCH_PROPERTY: Final = "pulsar.topic.epoch"
EXCLUSIVE_WAITERS_MAX_DEFAULT: Final = 1000  # WaitForExclusive producers queued per topic
ACCESS_MODES: Final = frozenset({"Shared", "Exclusive", "ExclusiveWithFencing",
                                 "WaitForExclusive"})


@dataclass(eq=False)
class Waiter:
    """A WaitForExclusive producer in the queue. `admitted` resolves with its epoch when
    it is promoted, or fails with ProducerFencedError when a fencing producer clears the
    queue; it is cancelled when the producer leaves first."""

    name: str
    producer: Any  # the owner's producer object, admitted on promotion
    topic_epoch: int | None = None  # the epoch it presented (a reconnect)
    admitted: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class ExclusiveAccess:
    """The access-mode bookkeeping of one topic (see the module docstring)."""

    __slots__ = ("_persist", "epoch", "holder", "waiters", "waiters_max")

    def __init__(self, epoch: int | None, persist: Callable[[int], None],
                 waiters_max: int = EXCLUSIVE_WAITERS_MAX_DEFAULT):
        """`persist(epoch)` stores a new epoch durably (raising leaves nothing changed)."""
        assert waiters_max >= 0
        assert epoch is None or epoch >= 0
        self.epoch = epoch
        self.holder: str | None = None
        self.waiters: list[Waiter] = []  # FIFO; a list, as an empty deque takes 0.6 KB
        self.waiters_max = waiters_max
        self._persist = persist

    @staticmethod
    def restored_epoch(properties: Mapping[str, str]) -> int | None:
        raw = properties.get(TOPIC_EPOCH_PROPERTY)
        return int(raw) if raw is not None and raw.isdigit() else None

    def admit(self, name: str, mode: str, topic_epoch: int | None, connected: int,
              evict: Callable[[], None], producer: Any = None) -> int | Waiter | None:
        """Decide on a producer `name` asking for `mode` while `connected` producers are on
        the topic (an ExclusiveWithFencing producer first calls `evict`, which must remove
        them all).

        Returns:
            the epoch granted (exclusive modes), a `Waiter` (queued WaitForExclusive), or
            None (a Shared producer).

        Raises:
            ProducerBusyError: a Shared producer while exclusive access is held or awaited;
                nothing changed.
            ProducerFencedError: an exclusive mode while other producers are there, or
                `topic_epoch` is older than the current epoch; nothing changed (except, for
                ExclusiveWithFencing, the evictions already done).
            ServiceNotReadyError: the wait queue is full; nothing changed.
        """
        assert mode in ACCESS_MODES, mode
        if mode == "Shared":
            if self.holder is not None or self.waiters:
                raise ProducerBusyError(
                    f"Topic has an existing exclusive producer: {self.holder}")
            return None
        if mode == "ExclusiveWithFencing" and (connected or self.holder or self.waiters):
            self._fail_waiters()
            evict()
            connected = 0
        if mode == "WaitForExclusive" and (connected or self.holder is not None):
            if len(self.waiters) >= self.waiters_max:
                raise ServiceNotReadyError(
                    f"Too many producers waiting for exclusive access ({self.waiters_max})")
            waiter = Waiter(name, producer, topic_epoch)
            self.waiters.append(waiter)
            return waiter
        if self.holder is not None or self.waiters:
            raise ProducerFencedError(f"Topic has an existing exclusive producer: {self.holder}")
        if connected:
            raise ProducerFencedError("Topic has existing shared producers")
        return self._grant(name, topic_epoch)

    def _grant(self, name: str, topic_epoch: int | None) -> int:
        if topic_epoch is not None and self.epoch is not None and topic_epoch < self.epoch:
            raise ProducerFencedError(
                f"Topic epoch {topic_epoch} is older than the current epoch {self.epoch}")
        epoch = topic_epoch if topic_epoch is not None else \
            (0 if self.epoch is None else self.epoch + 1)
        if epoch != self.epoch:
            self._persist(epoch)
            self.epoch = epoch
        self.holder = name
        return epoch

    def _fail_waiters(self) -> None:
        while self.waiters:
            waiter = self.waiters.pop(0)
            if not waiter.admitted.done():
                waiter.admitted.set_exception(ProducerFencedError("Fenced out"))
                waiter.admitted.exception()  # retrieved: its creation reports it

    def removed(self, name: str, waiter: Waiter | None, producers_left: int) -> Waiter | None:
        """A producer left (closed, disconnected or evicted): drop it from the queue, or,
        when it held the topic, promote the first waiter once no producer is left (returned;
        the owner admits its producer)."""
        if waiter is not None:
            if waiter in self.waiters:
                self.waiters.remove(waiter)
                waiter.admitted.cancel()
            return None
        if self.holder == name:
            self.holder = None
        return self.promote(producers_left)

    def promote(self, producers_left: int) -> Waiter | None:
        """Hand exclusive access to the first live waiter when nobody holds the topic and
        returns it. A failure to store the epoch fails that waiter."""
        if self.holder is not None or producers_left:
            return None
        while self.waiters:
            waiter = self.waiters.pop(0)
            if waiter.admitted.done():
                continue
            try:
                epoch = self._grant(waiter.name, waiter.topic_epoch)
            except Exception as exc:  # storing the epoch failed: this waiter fails
                waiter.admitted.set_exception(exc)
                waiter.admitted.exception()
                continue
            waiter.admitted.set_result(epoch)
            return waiter
        return None
