"""Creating a topic costs the same however many exist (issue 14, target 5): what the broker
reads or writes when the N-th topic is created or loaded is counted, and must not grow with
N. Deterministic counts, not timings (the timings live in benchmarks/bench_many_topics.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.broker import BrokerService
from magnetar.storage._ledger import LedgerInfo, LedgerState
from tests.broker.helpers import broker_env

NS = "public/default"
EXISTING = 40  # topics created before the one whose cost is counted


class _Counter:
    def __init__(self) -> None:
        self.calls = 0


def _count_ledger_reads(monkeypatch: pytest.MonkeyPatch) -> _Counter:
    """Count the storage's reads of one ledger's state (`LedgerState.info`)."""
    counter = _Counter()
    info = LedgerState.info

    def counted(ledger: LedgerState) -> LedgerInfo:
        counter.calls += 1
        return info(ledger)

    monkeypatch.setattr(LedgerState, "info", counted)
    return counter


async def _create(service: BrokerService, index: int) -> None:
    await service.get_topic(f"persistent://{NS}/t-{index}")


async def test_creating_a_topic_reads_no_other_topics_ledgers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic's load looks for its orphan ledgers (its managed ledger's and its compacted
    ones) among its own, not among every topic's (it read all N ledgers twice)."""
    async with broker_env(tmp_path) as env:
        for index in range(EXISTING):
            await _create(env.service, index)
        reads = _count_ledger_reads(monkeypatch)
        await _create(env.service, EXISTING)
        assert reads.calls <= 2
