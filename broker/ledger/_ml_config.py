"""`ManagedLedgerConfig`: the per-topic settings of a managed ledger (`_managed_ledger.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._redelivery import (
    REDELIVERY_COUNTS_MEMORY_MAX_DEFAULT,
    REDELIVERY_COUNTS_PERSIST_MAX_DEFAULT,
)

if TYPE_CHECKING:
    from .._config import BrokerConfig

__all__ = ["ManagedLedgerConfig", "MiB"]

MiB = 1024 * 1024


@dataclass(frozen=True)
class ManagedLedgerConfig:
    """Per-topic managed-ledger settings (Pulsar's `ManagedLedgerConfig` as the broker sets
    it). Retention: 0 deletes consumed ledgers at once, -1 keeps them without limit."""

    max_entries_per_ledger: int = 50_000
    max_size_per_ledger_bytes: int = 2048 * MiB
    max_ledger_rollover_time_s: float = 240 * 60
    min_ledger_rollover_time_s: float = 10 * 60
    retention_time_minutes: float = 0
    retention_size_mb: float = 0
    max_unacked_ranges_to_persist: int = 10_000
    max_batch_deleted_index_to_persist: int = 10_000
    max_redelivery_counts_to_persist: int = REDELIVERY_COUNTS_PERSIST_MAX_DEFAULT
    batch_index_ack_enabled: bool = True

    def __post_init__(self) -> None:
        assert self.max_entries_per_ledger >= 1
        assert self.max_size_per_ledger_bytes >= 1
        assert self.max_unacked_ranges_to_persist >= 0
        assert self.max_batch_deleted_index_to_persist >= 0
        assert 0 <= self.max_redelivery_counts_to_persist <= REDELIVERY_COUNTS_MEMORY_MAX_DEFAULT

    @classmethod
    def from_broker_config(cls, config: BrokerConfig) -> ManagedLedgerConfig:
        """The broker-wide defaults (namespace/topic policies may override retention)."""
        return cls(
            max_entries_per_ledger=config.managed_ledger_max_entries_per_ledger,
            max_size_per_ledger_bytes=config.managed_ledger_max_size_per_ledger_bytes,
            max_ledger_rollover_time_s=config.managed_ledger_max_ledger_rollover_time_s,
            min_ledger_rollover_time_s=config.managed_ledger_min_ledger_rollover_time_s,
            retention_time_minutes=config.default_retention_time_minutes,
            retention_size_mb=config.default_retention_size_mb,
            max_unacked_ranges_to_persist=config.managed_ledger_max_unacked_ranges_to_persist,
            max_redelivery_counts_to_persist=(
                config.managed_ledger_max_redelivery_counts_to_persist),
            batch_index_ack_enabled=config.acknowledgment_at_batch_index_level_enabled,
        )
