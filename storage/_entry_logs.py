"""The entry-log manager: which entry logs exist, the one being written, and their reader.

It owns the registry of entry logs (`records`: each log's GC record, as committed to the
index), the log checkpoints append to (`writer`), the id counter for new logs and the
reader that serves reads by location. The checkpointer appends through it, the garbage
collector drops and replaces logs through it, recovery loads the registry into it, and
`Storage` reads through its reader. It does no locking of its own: the checkpoint lock
(appends, GC) and the storage lock (reads of the registry) order the callers.
"""

from __future__ import annotations

from ._config import StorageConfig
from ._entry_log import EntryLogReader, EntryLogWriter
from ._fs import FileSystem
from ._index import EntryLogRecord

__all__ = ["EntryLogs"]


class EntryLogs:
    """The entry logs of one data directory's `entrylogs/` folder."""

    def __init__(self, fs: FileSystem, directory: str, config: StorageConfig):
        self.fs = fs
        self.directory = directory
        self.records: dict[int, EntryLogRecord] = {}
        self.writer: EntryLogWriter | None = None
        self.next_id = 1
        self.reader = EntryLogReader(fs, directory, config.open_entry_logs_max)
        self._retired: list[EntryLogReader] = []  # readers of a replaced state (resume)

    def path(self, log_id: int) -> str:
        return self.reader.path(log_id)

    def new_writer(self) -> EntryLogWriter:
        """Create the next entry log, unregistered (its id is persisted when first
        committed; an uncommitted file is removed at the next start)."""
        log_id = self.next_id
        self.next_id += 1
        return EntryLogWriter(self.fs, self.directory, log_id)

    def start_current(self) -> EntryLogWriter:
        """A new log becomes the one checkpoints append to, registered empty."""
        writer = self.new_writer()
        self.writer = writer
        self.records[writer.log_id] = EntryLogRecord(writer.log_id, writer.position)
        return writer

    def close_current(self) -> None:
        """Close the log being written (writes are off, or the engine stops)."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()

    def forget(self, log_id: int) -> None:
        """Unregister a log and close its read handles (before its file is removed)."""
        del self.records[log_id]
        self.reader.forget(log_id)
        for reader in self._retired:
            reader.forget(log_id)

    def take_readers_of(self, older: EntryLogs) -> None:
        """This state replaces `older` (a resume after a full disk): reads in flight on
        the older reader keep working until `close`."""
        self._retired += [older.reader, *older._retired]
        older._retired = []

    def close(self) -> None:
        """Close the writer and every reader. Idempotent."""
        self.close_current()
        self.reader.close()
        for reader in self._retired:
            reader.close()
