"""The client core's own rules, driven directly on a real embedded client (no broker-side
trick can produce these inputs): deliveries from a broker that stamps no epochs."""

from __future__ import annotations

from pathlib import Path

import magnetar
from magnetar._consumer import TopicConsumer
from magnetar._transport import Incoming
from magnetar.codec import SingleMessage, build_message

RECEIVE_MS = 5000


def _incoming(epoch: int | None) -> Incoming:
    metadata, payload = build_message(SingleMessage(payload=b"old broker"),
                                      producer_name="p", publish_time=1)
    return Incoming(1, 0, -1, 0, None, epoch, metadata, payload)


def test_deliveries_without_an_epoch_are_kept_after_a_redelivery(tmp_path: Path) -> None:
    """Brokers before consumer epochs send none: after `redeliver_unacknowledged_messages`
    raised ours, their deliveries must still count (only older stamped epochs are stale).
    Before the fix every later message was dropped."""
    with magnetar.Client(str(tmp_path / "data")) as client:
        consumer = client.subscribe("t", "sub")
        consumer.redeliver_unacknowledged_messages()  # epoch 1
        (group,) = client._core.consumers
        (child,) = group.children.values()
        assert isinstance(child, TopicConsumer)
        assert child.epoch == 1

        async def deliver() -> None:
            child.on_message(_incoming(0))  # stamped and stale: dropped
            child.on_message(_incoming(None))  # unstamped: kept

        client._run(deliver())
        assert consumer.receive(RECEIVE_MS).data() == b"old broker"
        assert not client._run(_queued(child))


async def _queued(child: TopicConsumer) -> bool:
    return child.group.queued_for(child)
