"""The seeded broker simulation's engine, part 2 (see `_simulation` for the theory of
operation): `_SimulationTraffic` checks every delivery against the model (redelivery counts,
delays, which consumer may hold a message, order) and acknowledges (individually, cumulatively,
negatively) as a client would.
"""


from __future__ import annotations

import logging

from ..dispatch._consumer import Delivery
from ..dispatch._subscription import ACK_CUMULATIVE, ACK_INDIVIDUAL
from ._sim_core import _SimulationCore
from ._sim_model import (
    MULTI_CONSUMER,
    OPERATION_ERRORS,
    ORDERED,
    SINGLE_ACTIVE,
    SUB_TYPES,
    WHOLE_ENTRY,
    _ConsumerModel,
    _Entry,
    _mask_words,
    _Message,
    _SubModel,
    _uids_of,
    _within,
    _words_bit,
)

__all__: list[str] = []

log = logging.getLogger(__name__)


class _SimulationTraffic(_SimulationCore):
    """Deliveries and acknowledgements; see the module comment."""

    # -- deliveries ------------------------------------------------------------------------

    def on_deliveries(self, model: _ConsumerModel, deliveries: list[Delivery]) -> None:
        sub = model.sub
        if sub.sub_type in SINGLE_ACTIVE and sub.active is not model:
            self.violation(sub.topic, sub, None,
                           f"delivered to {model.tag}, which is not the active consumer")
        for delivery in deliveries:
            entry = self._entry_of(sub, delivery)
            if entry is None:
                continue
            self._check_redelivery_count(sub, entry, delivery.redelivery_count)
            for message, wanted in self._delivered_messages(sub, entry, delivery.ack_set):
                if wanted:
                    self.trace(sub, f"deliver {message.label()} key {message.key} to "
                               f"{model.tag}")
                    self._check_delivery(model, message)
                    self.counts["deliveries"] += 1
                elif not sub.is_acked(message) and not sub.acks_under_way[message.uid]:
                    self.violation(sub.topic, sub, message,
                                   "the delivery's ack set skips an unacknowledged message")

    def _entry_of(self, sub: _SubModel, delivery: Delivery) -> _Entry | None:
        """The model's entry for a delivery, checked against the delivered bytes."""
        topic = sub.topic
        position = (delivery.ledger_id, delivery.entry_id)
        uids = _uids_of(delivery.entry)
        first = self.messages.get(uids[0]) if uids else None
        if first is None or first.entry.topic is not topic:
            self.violation(topic, sub, f"{position[0]}:{position[1]}",
                           f"delivered an entry the producers never sent (uids {uids[:3]})")
            return None
        entry = first.entry
        if entry.data != delivery.entry or [m.uid for m in entry.messages] != uids:
            self.violation(topic, sub, first, "delivered bytes differ from the entry sent")
            return None
        if entry.position is None:
            topic.place(entry, position)  # a publish still under way (or cut short)
            self.counts["messages_published"] += len(entry.messages)
        elif entry.position != position:
            self.violation(topic, sub, first,
                           f"the same entry is also stored at {position[0]}:{position[1]}")
            return None
        return entry

    def _check_redelivery_count(self, sub: _SubModel, entry: _Entry, count: int) -> None:
        """Shared and Key_Shared count negative acks per entry; a consumer leaving does
        not count."""
        position = entry.position
        assert position is not None
        if sub.sub_type not in MULTI_CONSUMER or position in sub.redeliveries_unknown:
            return
        expected = sub.redeliveries[position]
        if count != expected:
            self.violation(sub.topic, sub, entry.messages[0],
                           f"redelivery count {count}, but it was negatively acknowledged "
                           f"{expected} times")

    def _delivered_messages(self, sub: _SubModel, entry: _Entry, ack_set: list[int] | None,
                            ) -> list[tuple[_Message, bool]]:
        """(message, delivered) for each message of an entry: the client skips the indexes
        that the ack set marks as acknowledged."""
        if not entry.batched or ack_set is None:
            return [(m, True) for m in entry.messages]
        return [(m, _words_bit(ack_set, m.index)) for m in entry.messages]

    def _check_delivery(self, model: _ConsumerModel, message: _Message) -> None:
        sub = model.sub
        if sub.is_acked(message) and not sub.acks_under_way[message.uid]:
            self.violation(sub.topic, sub, message,
                           f"acknowledged (the ack returned) but delivered again to "
                           f"{model.tag}")
        self._check_delay(sub, message)
        self._check_holders(model, message)
        if sub.sub_type in ORDERED and message.entry.deliver_at is None and \
                message.key not in sub.tainted and message.uid not in sub.window:
            self._check_order(sub, message)
            sub.window.add(message.uid)
        if message.uid not in model.holding:
            model.hold(message)

    def _check_delay(self, sub: _SubModel, message: _Message) -> None:
        deliver_at = message.entry.deliver_at
        if deliver_at is None or sub.sub_type not in MULTI_CONSUMER:
            return
        early_ms = deliver_at - self.config.tick_ms - self.now_ms()
        if early_ms > 0:
            self.violation(sub.topic, sub, message,
                           f"delayed message delivered {early_ms:.0f} ms before its time "
                           f"(deliver at {deliver_at}, tick {self.config.tick_ms} ms)")

    def _check_holders(self, model: _ConsumerModel, message: _Message) -> None:
        sub = model.sub
        holders = sub.holders(message.uid)
        if model in holders:
            self.violation(sub.topic, sub, message,
                           f"delivered twice to {model.tag} without a redelivery")
        if sub.sub_type not in MULTI_CONSUMER:
            return
        others = [c for c in holders if c is not model]
        if others:
            self.violation(sub.topic, sub, message,
                           f"delivered to {model.tag} while {others[0].tag} holds it")
        if sub.sub_type != "Key_Shared":
            return
        for other in sub.consumers.values():
            if other is model or other.keys.get(message.key, 0) == 0:
                continue
            # An ack under way may already have released the key in the broker.
            held = [m for m in other.holding.values()
                    if m.key == message.key and not sub.acks_under_way[m.uid]]
            if held:
                self.violation(sub.topic, sub, message,
                               f"key {message.key} delivered to {model.tag} while "
                               f"{other.tag} holds {held[0].label()} unacknowledged")
                return

    def _check_order(self, sub: _SubModel, message: _Message) -> None:
        """Nothing earlier with the key may still wait for its first delivery in this
        window (see the module comment)."""
        items = sub.topic.by_key.get(message.key, [])
        at = sub.frontier.get(message.key, 0)
        while at < len(items) and (items[at].uid in sub.window or sub.is_acked(items[at])
                                   or sub.acks_under_way[items[at].uid]):
            at += 1
        sub.frontier[message.key] = at
        if at < len(items) and items[at] is not message and \
                items[at].message_id < message.message_id:
            self.violation(sub.topic, sub, message,
                           f"key {message.key} out of order: delivered before "
                           f"{items[at].label()}, which is older and still unacknowledged")

    # -- acknowledgements ------------------------------------------------------------------

    def _holding_consumers(self, types: tuple[str, ...] = SUB_TYPES) -> list[_ConsumerModel]:
        return [c for c in self._connected() if c.holding and c.sub.sub_type in types]

    async def _op_ack(self) -> None:
        candidates = self._holding_consumers()
        if not candidates:
            await self._op_flow()
            return
        model = self.rng.choice(candidates)
        held = sorted(model.holding.values(), key=lambda m: m.message_id)
        chosen = self.rng.sample(held, self.rng.randint(1, min(5, len(held))))
        if model.sub.sub_type in SINGLE_ACTIVE and self.rng.random() < 0.3:
            await self._ack_cumulative(model, max(chosen, key=lambda m: m.message_id))
        else:
            await self._ack_individual(model, chosen)

    def _individual_acks(self, chosen: list[_Message]
                         ) -> tuple[list[tuple[int, int, list[int] | None]], list[_Message]]:
        """The ack list for some held messages, and every message it acknowledges: a whole
        entry, or (batches, by chance) just the chosen indexes."""
        by_entry: dict[tuple[int, int], list[_Message]] = {}
        for message in chosen:
            position = message.entry.position
            assert position is not None
            by_entry.setdefault(position, []).append(message)
        acks: list[tuple[int, int, list[int] | None]] = []
        covered: list[_Message] = []
        for (ledger_id, entry_id), messages in sorted(by_entry.items()):
            entry = messages[0].entry
            if entry.batched and self.rng.random() < 0.5:
                indexes = {m.index for m in messages}
                acks.append((ledger_id, entry_id, _mask_words(len(entry.messages), indexes)))
                covered.extend(messages)
                self.counts["batch_index_acks"] += 1
            else:
                acks.append((ledger_id, entry_id, None))
                covered.extend(entry.messages)
        return acks, covered

    async def _ack_individual(self, model: _ConsumerModel, chosen: list[_Message]) -> None:
        acks, covered = self._individual_acks(chosen)
        await self._acknowledge(model, ACK_INDIVIDUAL, acks, covered)

    async def _ack_cumulative(self, model: _ConsumerModel, last: _Message) -> None:
        entry = last.entry
        ledger_id, entry_id, index = last.message_id
        bound = (ledger_id, entry_id, WHOLE_ENTRY)
        ack_set: list[int] | None = None
        if entry.batched and index < len(entry.messages) - 1 and self.rng.random() < 0.5:
            ack_set = _mask_words(len(entry.messages), set(range(index + 1)))
            bound = (ledger_id, entry_id, index)
        self.counts["cumulative_acks"] += 1
        covered = [m for e in model.sub.topic.stored() for m in e.messages
                   if _within(m.message_id, bound)]
        await self._acknowledge(model, ACK_CUMULATIVE, [(ledger_id, entry_id, ack_set)],
                                covered, bound)

    async def _acknowledge(self, model: _ConsumerModel, ack_type: int,
                           acks: list[tuple[int, int, list[int] | None]],
                           covered: list[_Message],
                           bound: tuple[int, int, int] | None = None) -> None:
        sub = model.sub
        assert model.consumer is not None
        for message in covered:
            sub.acks_under_way[message.uid] += 1
        try:
            await self.timed(self.broker_sub(sub).acknowledge(model.consumer, ack_type, acks))
        except OPERATION_ERRORS as error:
            if not self._expected_failure(error):
                self.violation(sub.topic, sub, covered[0] if covered else None,
                               f"acknowledgement {acks[:3]} failed: {error!r}")
            self.counts["uncertain_acks"] += 1
            return  # under way until a restart reads the cursor back
        self.counts["acks"] += 1
        self.trace(sub, f"{model.tag} acked {acks} "
                   f"(type {ack_type})")
        for message in covered:
            sub.acks_under_way[message.uid] -= 1
            if sub.acks_under_way[message.uid] <= 0:
                del sub.acks_under_way[message.uid]
            sub.acked.add(message.uid)
            sub.release_everywhere(message.uid)
        if bound is not None and (sub.cumulative is None or bound > sub.cumulative):
            sub.cumulative = bound

    async def _op_shared_cumulative(self) -> None:
        """A cumulative ack on Shared or Key_Shared: the broker must ignore it."""
        candidates = self._holding_consumers(MULTI_CONSUMER)
        if not candidates:
            return
        model = self.rng.choice(candidates)
        last = max(model.holding.values(), key=lambda m: m.message_id)
        ledger_id, entry_id, _ = last.message_id
        assert model.consumer is not None
        try:
            await self.timed(self.broker_sub(model.sub).acknowledge(
                model.consumer, ACK_CUMULATIVE, [(ledger_id, entry_id, None)]))
        except OPERATION_ERRORS as error:
            if not self._expected_failure(error):
                self.violation(model.sub.topic, model.sub, last,
                               f"ignored cumulative ack failed: {error!r}")

    async def _op_nack(self) -> None:
        candidates = self._holding_consumers()
        if not candidates:
            return
        model = self.rng.choice(candidates)
        sub = model.sub
        assert model.consumer is not None
        positions = sorted({m.entry.position for m in model.holding.values()
                            if m.entry.position is not None})
        chosen: list[tuple[int, int]] | None = None
        if self.rng.random() < 0.75:
            chosen = self.rng.sample(positions, self.rng.randint(1, min(3, len(positions))))
        self.broker_sub(sub).redeliver(model.consumer, chosen)
        self.counts["nacks"] += 1
        self.trace(sub, f"{model.tag} nacked {chosen}")
        if sub.sub_type in SINGLE_ACTIVE:
            if sub.active is model:
                model.release_all()  # the cursor rewinds to the first unacknowledged entry
            return
        wanted = None if chosen is None else set(chosen)
        counted: set[tuple[int, int]] = set()
        for message in list(model.holding.values()):
            position = message.entry.position
            if wanted is None or position in wanted:
                model.release(message.uid)
                if sub.sub_type == "Key_Shared":
                    sub.tainted.add(message.key)
                assert position is not None
                if sub.acks_under_way[message.uid]:
                    sub.redeliveries_unknown.add(position)  # the broker may have it acked
                elif position not in counted:
                    counted.add(position)
                    sub.redeliveries[position] += 1
