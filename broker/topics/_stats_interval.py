"""The stats interval: close every rate meter and histogram window of the loaded topics.

Pulsar's broker recomputes its rates every `statsUpdateFrequencyInSecs` (the module
comment of `broker/_rates.py` says how); `BrokerService.run_maintenance` calls
`update_rates` every `stats_update_frequency_s`. One pass walks each topic, its producers,
its subscriptions and their consumers once, on the event loop: no lock, no I/O, a few
arithmetic operations per meter.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._nonpersistent_topic import NonPersistentTopic
from ._topic import PersistentTopic

__all__ = ["update_rates"]


def update_rates(topics: Iterable[PersistentTopic | NonPersistentTopic], now: float) -> None:
    """Close the stats interval at `now` (monotonic seconds) for every topic given."""
    for topic in topics:
        topic.rate_in.update(now, topic.msg_in_counter, topic.bytes_in_counter)
        topic.rate_out.update(now, topic.msg_out_counter, topic.bytes_out_counter)
        for producer in topic.producers.values():
            producer.rate_in.update(now, producer.msg_in_counter, producer.bytes_in_counter)
        if isinstance(topic, PersistentTopic):
            topic.add_latency_window.update()
            topic.entry_size_window.update()
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
