"""A managed ledger's records: its settings (`ManagedLedgerConfig`), its metadata key
(`ml_key`) and its durable cursors' (`cursor_key`), and each of its ledgers, as reported
(`LedgerRecord`) and as kept (`_Ledger`, the entries of the record's JSON list; see
`_managed_ledger.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._config import BrokerConfig
from ._redelivery import (
    REDELIVERY_COUNTS_MEMORY_MAX_DEFAULT,
    REDELIVERY_COUNTS_PERSIST_MAX_DEFAULT,
)

__all__ = ["LedgerRecord", "ManagedLedgerConfig", "cursor_key", "cursor_prefix", "ml_key"]

MiB = 1024 * 1024


def ml_key(name: str) -> bytes:
    """The metadata key of a managed ledger's record."""
    return b"ml/" + name.encode()


def cursor_prefix(ml_name: str) -> bytes:
    """The metadata key prefix of a managed ledger's durable cursors."""
    return b"cursor/" + ml_name.encode() + b"\x00"


def cursor_key(ml_name: str, cursor_name: str) -> bytes:
    """The metadata key of a durable cursor's record."""
    return cursor_prefix(ml_name) + cursor_name.encode()


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


@dataclass(frozen=True)
class LedgerRecord:
    """One ledger of a managed ledger, as `ManagedLedger.ledgers()` reports it."""

    ledger_id: int
    entries: int
    size_bytes: int
    timestamp_ms: int  # close time; 0 for the current ledger


class _Ledger:
    """A ledger's mutable bookkeeping inside the ML."""

    __slots__ = ("entries", "ledger_id", "size", "timestamp_ms")

    def __init__(self, ledger_id: int, entries: int = 0, size: int = 0, timestamp_ms: int = 0):
        self.ledger_id = ledger_id
        self.entries = entries
        self.size = size
        self.timestamp_ms = timestamp_ms

    def to_json(self) -> dict[str, int]:
        return {"ledger_id": self.ledger_id, "entries": self.entries, "size": self.size,
                "timestamp_ms": self.timestamp_ms}

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> _Ledger:
        return cls(int(item["ledger_id"]), int(item["entries"]), int(item["size"]),
                   int(item["timestamp_ms"]))
