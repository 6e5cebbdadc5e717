"""A seeded simulation of the broker service, checked against a model of what it promised.

Theory of operation
-------------------
`run_simulation(SimulationConfig(seed=S, steps=N))` drives one `BrokerService` in process,
on one asyncio event loop, with a `random.Random(S)` choosing every operation:

* producers publish keyed single messages, key-based batches (one key per batch, as
  Key_Shared needs), delayed messages (one per entry, as clients send them) and bursts of
  concurrent publishes; on the topics with deduplication they sometimes resend an entry
  they sent before (the same bytes and sequence ids);
* consumers join and leave the four subscriptions of every topic (Exclusive, Shared,
  Failover without failover delay, Key_Shared), grant permits, acknowledge individually,
  by batch index, cumulatively (Exclusive and Failover; on Shared too, where it must be
  ignored), and ask for redelivery (negative acks, redeliver-all);
* the broker restarts: cleanly (service and storage closed, then reopened), killed
  (`Storage.abandon`, what `kill -9` leaves), or by a power loss (the storage runs on a
  `storage.testing.simfs.SimFileSystem`, stopped at a step or at a file operation it picked, whose
  unsynced writes are then dropped, torn or corrupted); a kill or power loss may cut
  publishes and acks short;
* every `drain_every_steps` steps and at the end, every subscription is drained: it gets a
  consumer and permits, and its consumers acknowledge what they hold until everything
  published is acknowledged.

The model knows every entry sent (its messages, and its position once the publish returned
or a delivery showed it), per subscription the acks that returned (and those under way,
which a crash leaves undecided until the cursor is read back), and per consumer the
messages it holds: delivered, not acknowledged, not given back. Invariants:

1. each published message reaches each subscription until acknowledged: a drain ends with
   every published message acknowledged and the broker's backlog at 0;
2. a message whose ack returned is never delivered again, and a delivery's ack set skips
   only acknowledged messages;
3. Shared and Key_Shared: a message is held by one consumer at most and is not delivered to
   it twice without a redelivery, and an entry's redelivery count is its negative acks (a
   consumer leaving does not count; the last one leaving clears the counts; a crash may lose
   count changes not yet durable, a clearing included); Exclusive and Failover: only the
   active consumer receives;
4. Key_Shared: a key is never unacknowledged in two consumers at once;
5. per-key order (Key_Shared, Exclusive, Failover): within a window, which every restart
   and drain starts afresh, a message is delivered for the first time only after every
   earlier unacknowledged message with its key; a Key_Shared key leaves the window when it
   is negatively acknowledged (upstream lets a redelivered message be overtaken then);
6. Shared and Key_Shared deliver a delayed message at most one tick early;
7. one producer's publishes return in the order they were sent (a client expects its send
   receipts in order), and a new entry is never answered as a duplicate;
8. after a restart: every entry whose publish returned is in the log with its bytes (unless
   its ledger was trimmed, and only consumed ledgers may be), no entry is stored twice, and
   on deduplicated topics no producer sequence id is stored twice; every cursor
   acknowledges exactly what the model says; the dedup state's last sequence id per
   producer is the highest stored; after a clean restart the cursors and the dedup state
   are exactly as before. Delayed messages stay delayed through restarts (invariant 6).

A violation names the seed, the step, the topic, the subscription and the message id; the
run stops at the step that found the first one.

Determinism: by default the storage runs without background threads (a task on the loop
pumps its journal and takes checkpoints), and the loop runs on virtual time that the
broker also uses as its clock (`_VirtualTimeLoop`), so a run is single-threaded and a seed
replays the same operations and outcomes, delayed deliveries included. With
`storage_threads=True` the storage's own journal and checkpoint threads run, as in the
real broker, on the wall clock: group commits and timers interleave differently on every
run, and the seed only picks the operations.

Power loss: the storage is killed first, then the file system stops and loses its
unsynced writes, so no storage thread sees the stop. Without storage threads every
journal write is synced in the same pump, so a power loss at a step loses little; the
crash points (a file operation picked ahead, which can fall between a write and its sync
or inside a checkpoint) are what tear journals and entry logs.

Layout: `_sim_model` (settings, report, the model), `_sim_core` (the broker incarnation,
publishing, consumers), `_sim_traffic` (deliveries, acknowledgements) and this module (the run,
restarts, crashes, the checks after them and the drains), each class extending the one before.
"""


from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from magnetar.storage.testing.simfs import SimFileSystem

from ..dispatch._subscription import ACK_INDIVIDUAL
from ..ledger._position import Position
from ..topics._topic import PersistentTopic
from ._sim_model import (
    CONCURRENT_OPERATIONS,
    CONCURRENT_OPERATIONS_MAX,
    CRASH_OPS_AHEAD_MAX,
    CRASH_OPS_AHEAD_MIN,
    DRAIN_PERMITS,
    DRAIN_POLL_S,
    LOOP_TICK_S,
    OPERATION_ERRORS,
    OPERATION_WEIGHTS,
    SETTLE_YIELDS,
    VIOLATIONS_PER_DRAIN_MAX,
    SimulationConfig,
    SimulationReport,
    Violation,
    _Entry,
    _scan,
    _SubModel,
    _TopicModel,
    _uids_of,
    _valid_positions,
    _words_bit,
)
from ._sim_traffic import _SimulationTraffic

__all__ = ["SimulationConfig", "SimulationReport", "Violation", "run_simulation"]

log = logging.getLogger(__name__)


def run_simulation(config: SimulationConfig) -> SimulationReport:
    """Run one simulation in a new event loop; see the module comment."""
    started = time.perf_counter()
    with _data_dir(config.data_dir) as directory:
        simulation = _Simulation(config, directory)
        if config.storage_threads:
            factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
        else:
            factory = functools.partial(_VirtualTimeLoop, time.time())
        with asyncio.Runner(loop_factory=factory) as runner:
            report = runner.run(simulation.run())
    report.seconds = time.perf_counter() - started
    return report


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only with the loop: `LOOP_TICK_S` per iteration,
    or straight to the next timer when nothing is ready. The clock reads as epoch
    seconds (it starts at `start_s`), and the simulation gives it to the broker as its
    clock, so delayed delivery falls due at the same iteration on every run. Only for a
    loop that never waits for other threads: it never blocks in `select`."""

    def __init__(self, start_s: float) -> None:
        super().__init__()
        self._virtual_s = start_s

    def time(self) -> float:
        return self._virtual_s

    def _run_once(self) -> None:
        ready: Any = self._ready  # type: ignore[attr-defined]
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if not ready and scheduled:
            self._virtual_s = max(self._virtual_s, scheduled[0].when())
        else:
            self._virtual_s += LOOP_TICK_S
        super()._run_once()  # type: ignore[misc]


@contextlib.contextmanager
def _data_dir(given: str | None) -> Iterator[str]:
    if given is not None:
        os.makedirs(given, exist_ok=True)
        yield given
        return
    path = tempfile.mkdtemp(prefix="magnetar-sim-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class _Simulation(_SimulationTraffic):
    """The run, restarts and crashes, the checks after them, and the drains."""

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> SimulationReport:
        asyncio.get_running_loop().set_exception_handler(self._on_loop_exception)
        try:
            await self._open()
            await self._set_up()
            self._arm_crash_point()
            await self._steps()
            if self.report.ok:
                await self._drain()
        except Exception as error:
            log.exception("simulation stopped")
            self.violation(None, None, None, f"operation failed: {error!r}")
        finally:
            await self._shut_down()
        return self.report

    async def _steps(self) -> None:
        operations = list(OPERATION_WEIGHTS)
        weights = [OPERATION_WEIGHTS[name] for name in operations]
        for step in range(1, self.config.steps + 1):
            self.step = step
            name = self.rng.choices(operations, weights)[0]
            try:
                await getattr(self, f"_op_{name}")()
            except OPERATION_ERRORS as error:
                if not self._expected_failure(error):
                    self.violation(None, None, None, f"{name} failed: {error!r}")
            await self._settle()
            if self.report.ok and self._storage_stopped():
                await self._restart("power")
            if self.report.ok and step % self.config.drain_every_steps == 0:
                await self._drain()
            self.report.steps_run = step
            if not self.report.ok:
                return

    async def _settle(self) -> None:
        for _ in range(SETTLE_YIELDS):
            await asyncio.sleep(0)

    async def _shut_down(self) -> None:
        if self.node is None:
            return
        self._quiet = True
        try:
            if self.node.failed:
                await self.node.kill()
            else:
                await asyncio.wait_for(self.node.close(), self.config.op_timeout_s)
        except Exception as error:
            if self.report.ok and not self.node.failed:  # not a crash point reached meanwhile
                self.violation(None, None, None, f"clean shutdown failed: {error!r}")
            with contextlib.suppress(Exception):
                await self.node.kill()
        self.node = None

    # -- maintenance and restarts ----------------------------------------------------------

    async def _op_concurrent(self) -> None:
        """Two or three operations at once: acks racing negative acks, consumers leaving
        while their acks are under way, publishes racing both."""
        names = [self.rng.choice(CONCURRENT_OPERATIONS)
                 for _ in range(self.rng.randint(2, CONCURRENT_OPERATIONS_MAX))]
        outcomes = await asyncio.gather(*(getattr(self, f"_op_{name}")() for name in names),
                                        return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _op_maintenance(self) -> None:
        assert self.node is not None
        await self.timed(self.service.run_maintenance(force=True))
        self.node.checkpoint()
        self.counts["maintenance"] += 1

    async def _op_restart(self) -> None:
        assert self.node is not None
        kinds = ["clean", "kill"]
        if isinstance(self.node.fs, SimFileSystem):
            kinds.append("power")
        await self._restart(self.rng.choice(kinds))

    async def _restart(self, kind: str) -> None:
        """Stop the broker (see `_close_cleanly` and `_crash`), start it again, and check
        what it recovered against the model."""
        assert self.node is not None
        assert kind in ("clean", "kill", "power")
        before: dict[str, Any] | None = None
        if kind == "clean":
            before = self._capture()
            kind = await self._close_cleanly()
            before = before if kind == "clean" else None
        else:
            await self._crash(kind)
        self.node = None
        self.counts[f"restarts_{kind}"] += 1
        for sub in self._all_subs():
            for model in list(sub.consumers.values()):
                self._forget_consumer(model)
            sub.reset_window()
            if kind != "clean" and sub.redeliveries_cleared:
                self.counts["redelivery_clears_in_doubt"] += 1
            sub.after_restart(kind == "clean")
        await self._open()
        lost: list[_Entry] = []
        for topic in self.topics:
            lost.extend(await self._verify_topic(topic, before))
        await self._connect_producers()
        self._verify_last_sequence_ids()
        for entry in lost:
            await self._resend_lost(entry)
        self._arm_crash_point()
        self._progress(f"restart ({kind})")

    async def _close_cleanly(self) -> str:
        """Close service and storage; "power" when the storage stopped at its crash point
        meanwhile (the file system then loses what was not synced)."""
        node = self.node
        assert node is not None
        try:
            await self.timed(node.close())
        except Exception as error:
            if not node.failed:
                raise
            log.info("the storage stopped while closing: %r", error)
            self._quiet = True
            with contextlib.suppress(Exception):
                await node.kill()
        if not node.failed:
            return "clean"
        self.counts["crash_points"] += 1
        if isinstance(node.fs, SimFileSystem):
            node.fs.power_loss()
        return "power"

    async def _crash(self, kind: str) -> None:
        """Kill the broker, maybe with publishes and acks under way; a power loss also
        drops, tears or corrupts what the disk had not synced."""
        node = self.node
        assert node is not None
        in_flight = [asyncio.ensure_future(self._in_flight_work())
                     for _ in range(self.rng.randint(0, 3))]
        for _ in range(self.rng.randint(0, 6)):
            await asyncio.sleep(0)
        self._quiet = True
        await node.kill()  # first: no storage thread may see the file system stop
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        self.counts["uncertain_acks"] += sum(len(s.acks_under_way) for s in self._all_subs())
        if kind == "power" and isinstance(node.fs, SimFileSystem):
            node.fs.crash("simulated power loss")
            log.debug("power loss: %s", node.fs.power_loss())

    async def _in_flight_work(self) -> None:
        holding = self._holding_consumers()
        if self.rng.random() < 0.5 or not holding:
            await self._publish(self._fresh_entry(self.rng.choice(("single", "batch"))))
        else:
            model = self.rng.choice(holding)
            await self._ack_individual(model, list(model.holding.values())[:3])

    def _arm_crash_point(self) -> None:
        """Maybe stop the storage at a file operation a little ahead (pumped mode only,
        where operation counts replay)."""
        assert self.node is not None
        fs = self.node.fs
        if isinstance(fs, SimFileSystem) and not self.config.storage_threads and \
                self.rng.random() < self.config.crash_point_chance:
            fs.crash_at_op = fs.ops + self.rng.randint(CRASH_OPS_AHEAD_MIN, CRASH_OPS_AHEAD_MAX)

    def _capture(self) -> dict[str, Any]:
        """The broker state a clean restart must keep: per subscription what its cursor
        says of each stored entry, and per topic the dedup state."""
        captured: dict[str, Any] = {}
        for topic in self.topics:
            broker = self.broker_topic(topic)
            positions = _valid_positions(broker)
            for sub in topic.subs.values():
                cursor = broker.subscriptions[sub.name].cursor
                captured[f"{topic.name}/{sub.name}"] = {
                    position: (cursor.is_acked(Position(*position)),
                               cursor.get_ack_set(Position(*position)))
                    for position in positions}
            if broker.dedup is not None:
                captured[f"{topic.name}/dedup"] = {
                    name: broker.dedup.highest_persisted(name) for name in topic.producers}
        return captured

    def _progress(self, what: str) -> None:
        if self.config.progress is not None:
            c = self.counts
            self.config.progress(f"step {self.step}: {what}; {c['messages_published']} "
                                 f"messages published, {c['acks']} acks")

    # -- checks after a restart ------------------------------------------------------------

    async def _verify_topic(self, topic: _TopicModel, before: dict[str, Any] | None,
                            ) -> list[_Entry]:
        """Check one topic after a restart; returns the entries a crash cut short that are
        not stored (to send again)."""
        broker = await self.timed(self.service.get_topic(
            f"persistent://public/default/{topic.name}", create=False))
        assert isinstance(broker, PersistentTopic)
        missing = [name for name in topic.subs if name not in broker.subscriptions]
        for name in missing:
            self.violation(topic, name, None, "the subscription is gone after the restart")
        lost = self._verify_log(topic, broker)
        for sub in topic.subs.values():
            if sub.name not in missing:
                self._verify_cursor(sub, broker)
        if before is not None:
            self._verify_unchanged(topic, broker, before)
        return lost

    def _verify_log(self, topic: _TopicModel, broker: PersistentTopic) -> list[_Entry]:
        """Every stored entry is where the model has it (unless trimmed), none is stored
        twice, no producer sequence id twice with deduplication; entries cut short are
        found, or returned as lost."""
        found: dict[int, list[tuple[int, int]]] = {}
        sequences: dict[tuple[str, int], tuple[int, int]] = {}
        for position, data in _scan(broker):
            uids = _uids_of(data)
            message = self.messages.get(uids[0]) if uids else None
            if message is None or message.entry.topic is not topic or \
                    message.entry.data != data:
                self.violation(topic, None, f"{position[0]}:{position[1]}",
                               "the log holds an entry the producers never sent")
                continue
            entry = message.entry
            found.setdefault(message.uid, []).append(position)
            if not topic.dedup:
                continue
            for sequence_id in range(entry.sequence_id, entry.highest_sequence_id + 1):
                other = sequences.setdefault((entry.producer, sequence_id), position)
                if other != position:
                    self.violation(topic, None, message,
                                   f"deduplication stored producer {entry.producer} "
                                   f"sequence id {sequence_id} twice (also at {other})")
        return [entry for entry in topic.entries
                if self._reconcile_entry(topic, broker, entry,
                                         found.get(entry.messages[0].uid, []))]

    def _reconcile_entry(self, topic: _TopicModel, broker: PersistentTopic, entry: _Entry,
                         positions: list[tuple[int, int]]) -> bool:
        """Check one entry against where the log holds it; True when a crash cut its
        publish short and it is not stored."""
        first = entry.messages[0]
        cut_short, entry.cut_short = entry.cut_short, False
        if len(positions) > 1:
            self.violation(topic, None, first, f"stored {len(positions)} times: {positions}")
        if entry.position is not None:
            ledger_exists = broker.managed_ledger.has_ledger(entry.position[0])
            if ledger_exists and entry.position not in positions:
                self.violation(topic, None, first, "a publish that returned is lost")
            elif not ledger_exists:
                self._check_trimmed(topic, entry)
            return False
        if positions:
            if not cut_short:
                self.violation(topic, None, first, "stored, but its publish failed")
            topic.place(entry, positions[0])
            self.counts["messages_published"] += len(entry.messages)
            return False
        if cut_short:
            self.counts["lost_publishes"] += 1
        return cut_short

    def _check_trimmed(self, topic: _TopicModel, entry: _Entry) -> None:
        for sub in topic.subs.values():
            for message in entry.messages:
                if not sub.is_acked(message) and not sub.acks_under_way[message.uid]:
                    self.violation(topic, sub, message,
                                   "its ledger was trimmed while it was unacknowledged")
                    return

    def _verify_cursor(self, sub: _SubModel, broker: PersistentTopic) -> None:
        """The cursor acknowledges exactly what the model says; acks under way at a crash
        are decided by what the cursor says."""
        cursor = broker.subscriptions[sub.name].cursor
        ml = broker.managed_ledger
        for entry in sub.topic.stored():
            assert entry.position is not None
            position = Position(*entry.position)
            if not ml.is_valid_position(position):
                continue  # trimmed: see _check_trimmed
            whole = cursor.is_acked(position)
            words = cursor.get_ack_set(position)
            for message in entry.messages:
                stored = whole or (words is not None and not _words_bit(words, message.index))
                if sub.acks_under_way[message.uid]:
                    if stored:
                        sub.acked.add(message.uid)
                    continue
                if stored != sub.is_acked(message):
                    what = ("acknowledged in the cursor but never by a consumer" if stored
                            else "acknowledged (the ack returned) but not in the cursor")
                    self.violation(sub.topic, sub, message, f"after the restart: {what}")
        sub.acks_under_way.clear()

    def _verify_unchanged(self, topic: _TopicModel, broker: PersistentTopic,
                          before: dict[str, Any]) -> None:
        for sub in topic.subs.values():
            cursor = broker.subscriptions[sub.name].cursor
            for position, was in before[f"{topic.name}/{sub.name}"].items():
                now = (cursor.is_acked(Position(*position)),
                       cursor.get_ack_set(Position(*position)))
                if now != was:
                    self.violation(topic, sub, f"{position[0]}:{position[1]}",
                                   f"a clean restart changed the cursor: {was} -> {now}")
        dedup_before = before.get(f"{topic.name}/dedup")
        if dedup_before is None or broker.dedup is None:
            return
        for name, persisted in dedup_before.items():
            recovered = broker.dedup.highest_persisted(name)
            if recovered != persisted:
                self.violation(topic, None, None, f"a clean restart changed the dedup state "
                               f"of producer {name}: {persisted} -> {recovered}")

    def _verify_last_sequence_ids(self) -> None:
        """With deduplication, each producer's last sequence id is the highest stored."""
        for topic in (t for t in self.topics if t.dedup):
            broker = self.broker_topic(topic)
            for model in topic.producers.values():
                expected = max((e.highest_sequence_id for e in topic.entries
                                if e.producer == model.name and e.position is not None),
                               default=-1)
                assert model.producer is not None
                actual = broker.last_sequence_id(model.producer)
                if actual != expected:
                    self.violation(topic, None, None,
                                   f"producer {model.name}: last sequence id {actual} after "
                                   f"the restart, but the highest stored is {expected}")

    async def _resend_lost(self, entry: _Entry) -> None:
        """A client sends again what a crash cut short. With deduplication it must be
        stored now (its sequence id is above everything stored)."""
        if not entry.topic.dedup or not self.report.ok:
            return
        await self._publish(entry, resend=True)
        if entry.position is None and not entry.cut_short and self.report.ok:
            self.violation(entry.topic, None, entry.messages[0],
                           "cut short by a crash and not stored, yet not stored when sent "
                           "again")

    # -- drains ----------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Acknowledge everything: each subscription gets a consumer and permits, and its
        consumers acknowledge what they hold until every stored message is acknowledged."""
        self.counts["drains"] += 1
        for sub in self._all_subs():
            if not sub.consumers:
                await self._join(sub)
            for model in sub.consumers.values():
                assert model.consumer is not None
                self.broker_sub(sub).flow(model.consumer, DRAIN_PERMITS)
        latest_s = max((e.deliver_at for t in self.topics for e in t.entries
                        if e.deliver_at is not None), default=0) / 1000
        deadline = max(self.clock(), latest_s) + self.config.drain_timeout_s
        while self.report.ok:
            await self._ack_everything_held()
            if self._storage_stopped():
                await self._restart("power")
                return
            if self._everything_acked():
                break
            if self.clock() > deadline:
                self._report_undelivered()
                return
            await asyncio.sleep(DRAIN_POLL_S)
        if self.report.ok:  # a violation stopped the drain: its backlog says nothing more
            self._after_drain()

    async def _ack_everything_held(self) -> None:
        for model in self._holding_consumers():
            entries = {m.message_id[:2]: m.entry for m in model.holding.values()}
            acks: list[tuple[int, int, list[int] | None]] = [
                (ledger_id, entry_id, None) for ledger_id, entry_id in sorted(entries)]
            covered = [m for e in entries.values() for m in e.messages]
            await self._acknowledge(model, ACK_INDIVIDUAL, acks, covered)

    def _everything_acked(self) -> bool:
        return all(sub.is_acked(m) for t in self.topics for e in t.stored()
                   for m in e.messages for sub in t.subs.values())

    def _report_undelivered(self) -> None:
        reported = 0
        for topic in self.topics:
            for sub in topic.subs.values():
                waiting = [m for e in topic.stored() for m in e.messages if not sub.is_acked(m)]
                if waiting and reported < VIOLATIONS_PER_DRAIN_MAX:
                    reported += 1
                    self.violation(topic, sub, waiting[0],
                                   f"never reached the subscription ({len(waiting)} messages "
                                   f"waiting; published at step {waiting[0].entry.step}; "
                                   f"{len(sub.consumers)} consumers connected)")

    def _after_drain(self) -> None:
        for topic in self.topics:
            broker = self.broker_topic(topic)
            for sub in topic.subs.values():
                backlog = broker.subscriptions[sub.name].backlog()
                if backlog != 0:
                    self.violation(topic, sub, None,
                                   f"backlog is {backlog} entries after everything was "
                                   "acknowledged")
                sub.reset_window()
        self._progress("drained")
