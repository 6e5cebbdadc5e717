"""The stats interval: close every rate meter and histogram window of the loaded topics.

Pulsar's broker recomputes its rates every `statsUpdateFrequencyInSecs` (the module
comment of `broker/_rates.py` says how); `BrokerService.run_maintenance` calls
`update_rates` every `stats_update_frequency_s`. One pass walks each topic, its producers,
its subscriptions and their consumers once, on the event loop: no lock, no I/O, a few
arithmetic operations per meter.

Only the topics that may have moved are walked (`StatsInterval`), so the pass costs what the
busy topics cost, not what every loaded topic does: a topic is *active* from its load or
from when it gets a producer or a consumer (`touch`), and stays active until an interval
closes with it idle -- no producer, no consumer, zero rates in and out (its counters can
only move through a producer or a consumer, so its rates would stay zero). An idle topic
keeps the meters of the interval that found it idle; when it is touched again, it is first
brought to the last interval's end (its counters have not moved since), so its next interval
is measured over that interval's length, as if it had been walked all along.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .._rates import closed_add_interval
from ._nonpersistent_topic import NonPersistentTopic
from ._topic import PersistentTopic

__all__ = ["StatsInterval", "update_rates"]

Topic = PersistentTopic | NonPersistentTopic


class StatsInterval:
    """The active topics (module comment) and where the last interval ended."""

    def __init__(self) -> None:
        self._active: set[Topic] = set()
        self._ended_at: float | None = None  # monotonic seconds

    def __len__(self) -> int:
        return len(self._active)

    def touch(self, topic: Topic) -> None:
        """The topic was loaded, or gets a producer or a consumer: walk it from now on."""
        if topic in self._active:
            return
        if self._ended_at is not None:
            update_rates((topic,), self._ended_at)
        self._active.add(topic)

    def close(self, now: float, loaded: Mapping[str, Topic]) -> None:
        """Close the interval at `now` for the active topics still `loaded`; forget those
        found idle and those no longer loaded."""
        topics = [topic for topic in self._active if loaded.get(str(topic.name)) is topic]
        update_rates(topics, now)
        self._ended_at = now
        self._active = set()
        for topic in topics:
            if not _idle(topic):
                self._active.add(topic)
            elif isinstance(topic, PersistentTopic):
                topic.idle()


def _idle(topic: Topic) -> bool:
    return (not topic.producers and topic.consumer_count() == 0
            and topic.rate_in.rate == 0 and topic.rate_out.rate == 0)


def update_rates(topics: Iterable[PersistentTopic | NonPersistentTopic], now: float) -> None:
    """Close the stats interval at `now` (monotonic seconds) for every topic given."""
    for topic in topics:
        topic.rate_in.update(now, topic.msg_in_counter, topic.bytes_in_counter)
        topic.rate_out.update(now, topic.msg_out_counter, topic.bytes_out_counter)
        for producer in topic.producers.values():
            producer.rate_in.update(now, producer.msg_in_counter, producer.bytes_in_counter)
        if isinstance(topic, PersistentTopic):
            ml = topic.managed_ledger
            topic.add_interval = closed_add_interval(ml.add_figures)
            ml.add_figures = None
            for subscription in topic.all_subscriptions():
                subscription.rate_out.update(now, subscription.msg_out_counter,
                                             subscription.bytes_out_counter)
                for consumer in subscription.consumers:
                    consumer.rate_out.update(now, consumer.msg_out_counter,
                                             consumer.bytes_out_counter)
        else:
            for np_subscription in topic.subscriptions.values():
                for consumer in np_subscription.consumers:
                    consumer.rate_out.update(now, consumer.msg_out_counter,
                                             consumer.bytes_out_counter)
