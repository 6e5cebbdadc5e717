"""Storage configuration: every limit the engine enforces, each named with its unit."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StorageConfig"]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class StorageConfig:
    """Tunables of a `Storage`. The defaults suit one broker on one disk.

    Durability: with `journal_sync=True` (the default) an add completes only after the
    fdatasync that covers it. `journal_sync=False` acknowledges after the write reaches the
    OS and syncs every `journal_sync_interval_ms`: a power loss (not a process crash) can
    then lose up to that interval of acknowledged adds.
    """

    # Entries. The default holds a broker's largest message at Pulsar's default maxMessageSize
    # (5 MiB) with room for its frame padding and broker entry metadata; the broker checks
    # the fit of its own settings against this at start.
    entry_size_bytes_max: int = 5 * MiB + 64 * KiB

    # Journal.
    journal_sync: bool = True
    journal_sync_interval_ms: int = 1000
    journal_segment_bytes_max: int = 512 * MiB
    # Zeros written ahead of the journal's data, a step at a time (so that a sync need not
    # update the file size). The sync after a step writes its zeros too: 16 MiB (BookKeeper's
    # step) cost that sync 10-20 ms, a publish-latency spike every 16 MiB of journal; 1 MiB
    # costs it about 1 ms. Smaller is not better: a step also grows the file, so its sync
    # waits for an ext4 journal commit (with whatever other processes have pending), and 256
    # KiB steps gave a worse publish-latency p99 than 1 MiB in 7 of 10 alternated rounds.
    journal_prealloc_bytes: int = 1 * MiB
    journal_alignment_bytes: int = 4096
    journal_batch_bytes_max: int = 512 * KiB
    journal_queue_requests_max: int = 10_000
    journal_record_bytes_max: int = 8 * MiB
    journal_segments_kept_max: int = 2
    # A thread that blocks on an add's completion while the journal is idle writes and
    # syncs the queued records itself instead of waiting for the journal threads: one add
    # in flight then costs one fdatasync and no thread wake-ups. Group commit is unchanged
    # under load, and asyncio callers (which await, never block) are not affected.
    journal_caller_syncs_when_idle: bool = True
    # Recovery refuses to start on journal corruption it must not repair silently (a
    # damaged record with valid records after it, a missing segment; see _recovery.py).
    # True accepts the loss instead: the rest of that segment is skipped, and what is lost
    # (records, bytes) is logged at ERROR. `magnetar standalone
    # --skip-corrupt-journal-segments` sets it.
    skip_corrupt_journal_segments: bool = False

    # Write cache and checkpoints.
    write_cache_bytes_max: int = 64 * MiB
    write_cache_wait_ms_max: int = 10_000
    checkpoint_interval_ms: int = 1000
    # Deleted ledgers' records removed by one checkpoint once its mark is past them (one
    # LMDB delete each, in the checkpoint's transaction); a backlog (a restart that found
    # many, a broker deleting thousands at once) goes over the next checkpoints.
    tombstones_purged_per_checkpoint_max: int = 1000

    # Entry logs, reads, GC.
    entry_log_bytes_max: int = 512 * MiB
    open_entry_logs_max: int = 64
    read_batch_bytes_max: int = 4 * MiB
    compaction_live_ratio_min: float = 0.5
    gc_interval_ms: int = 10_000

    # LMDB.
    lmdb_map_bytes: int = 32 * GiB

    # Run the journal and checkpoint threads (False: the caller pumps I/O itself, for
    # deterministic simulation).
    background_threads: bool = True

    def __post_init__(self) -> None:
        assert self.entry_size_bytes_max > 0
        assert self.journal_alignment_bytes >= 512
        assert self.journal_alignment_bytes & (self.journal_alignment_bytes - 1) == 0
        assert self.journal_record_bytes_max >= self.entry_size_bytes_max + 64
        assert self.journal_prealloc_bytes % self.journal_alignment_bytes == 0
        assert self.journal_segment_bytes_max >= self.journal_alignment_bytes * 4
        assert self.write_cache_bytes_max >= 2 * self.entry_size_bytes_max
        assert 0.0 <= self.compaction_live_ratio_min <= 1.0
        assert self.tombstones_purged_per_checkpoint_max >= 1
        assert self.entry_log_bytes_max < 2**32, "locations keep a 32-bit offset"
