"""Reading entries without blocking the event loop: runs, the hot path, and the loader.

Theory of operation
-------------------
Every read of a managed ledger's entries is a list of *runs*: `(ledger_id, first, last)`
ranges of consecutive entries, in the order they are wanted, planned on the loop from the
ledger layout (and, for a cursor, around its acknowledged ranges). `collect` walks the runs
in chunks of at most `READ_CHUNK_ENTRIES_MAX` entries and stops before the entry that would
take the total above `max_bytes` (but returns at least one).

Two ways to fetch a chunk:

* hot: `storage.try_read_entries`, memory only (the write cache); it answers None when the
  chunk would need the disk, and `collect` then returns the prefix it has. Cheap and bounded
  (a dictionary lookup per entry, at most the read's entry limit), so it runs on the loop;
* cold: `storage.read_entries`, which may `pread` entry logs. It runs only in the
  `EntryLoader`'s worker threads.

`EntryLoader` is the one bounded worker of a broker: at most `loads_in_flight_max` loads run
at once (threads), and a load starts only while the bytes that the running loads may return
(each counts its `max_bytes`) stay within `loaded_bytes_max` (one load always may run).
Waiting loads queue in arrival order; the queue is bounded by its callers (a subscription
has at most one load at a time, a topic's dedup recovery one). A load's result or error is
handed back on the event loop that asked for it.

The loader also holds the broker's budget for loads read ahead (`read_ahead_bytes_max`): the
subscriptions (`dispatch/_reads.py`) count what their read-aheads may hold, on the loop, and
start none beyond it, so that consumers that stop asking cannot pin memory without bound.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from magnetar.storage import LedgerStorage

from ._layout import LedgerLayout
from ._position import InvalidPositionError, Position

__all__ = ["EntryLoader", "LedgerReads", "Run", "collect", "default_loader"]

READ_CHUNK_ENTRIES_MAX = 64  # entries fetched from storage per call when reading
LOADS_IN_FLIGHT_MAX_DEFAULT = 4
LOADED_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
READ_AHEAD_BYTES_MAX_DEFAULT = 64 * 1024 * 1024

Run = tuple[int, int, int]  # (ledger id, first entry, last entry), inclusive
Fetch = Callable[[int, int, int], "list[bytes] | None"]


def collect(fetch: Fetch, runs: list[Run], max_bytes: int) -> list[tuple[Position, bytes]]:
    """The entries of `runs`, in order, within `max_bytes` (at least one when any is
    wanted); stops early at a chunk `fetch` answers None for.

    Raises:
        Whatever `fetch` raises (storage errors, `OSError`).
    """
    found: list[tuple[Position, bytes]] = []
    total = 0
    for ledger_id, first, last in runs:
        at = first
        while at <= last:
            chunk_last = min(last, at + READ_CHUNK_ENTRIES_MAX - 1)
            datas = fetch(ledger_id, at, chunk_last)
            if datas is None:
                return found
            for offset, data in enumerate(datas):
                if found and total + len(data) > max_bytes:
                    return found
                found.append((Position(ledger_id, at + offset), data))
                total += len(data)
            at = chunk_last + 1
    return found


def runs_of(positions: list[Position]) -> list[Run]:
    """Sorted positions grouped into runs of consecutive entries of one ledger."""
    runs: list[Run] = []
    if not positions:
        return runs
    ledger_id, first = positions[0]
    last = first - 1
    for position_ledger, entry_id in positions:  # the open run is kept in locals
        if position_ledger != ledger_id or entry_id != last + 1:
            runs.append((ledger_id, first, last))
            ledger_id, first = position_ledger, entry_id
        last = entry_id
    runs.append((ledger_id, first, last))
    return runs


@dataclass
class _Load:
    storage: LedgerStorage
    runs: list[Run]
    max_bytes: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[tuple[Position, bytes]]]


class EntryLoader:
    """The bounded worker for reads that may touch the disk (see the module comment)."""

    def __init__(self, loads_in_flight_max: int = LOADS_IN_FLIGHT_MAX_DEFAULT,
                 loaded_bytes_max: int = LOADED_BYTES_MAX_DEFAULT, *, on_loop: bool = False,
                 read_ahead_bytes_max: int = READ_AHEAD_BYTES_MAX_DEFAULT):
        """`on_loop`: for the seeded simulation only, which must replay exactly: each load
        runs in a later callback of the loop that asked for it (so the callers' paths for
        a read in flight run, deterministically), not in a thread."""
        assert loads_in_flight_max >= 1
        assert loaded_bytes_max >= 1
        self.loads_in_flight_max = loads_in_flight_max
        self.loaded_bytes_max = loaded_bytes_max
        assert read_ahead_bytes_max >= 0
        self.read_ahead_bytes_max = read_ahead_bytes_max
        self.read_ahead_bytes = 0  # held or reserved by read-aheads; the loop's count
        self._lock = threading.Lock()
        self._waiting: deque[_Load] = deque()
        self.running = 0
        self.running_bytes = 0
        self.on_loop = on_loop
        self._executor = ThreadPoolExecutor(max_workers=loads_in_flight_max,
                                            thread_name_prefix="entry-loader")

    def load(self, storage: LedgerStorage, runs: list[Run],
             max_bytes: int) -> asyncio.Future[list[tuple[Position, bytes]]]:
        """Read `runs` (as `collect` with `storage.read_entries`) in a worker thread; the
        future, on the calling loop, gives the entries or the storage's error."""
        loop = asyncio.get_running_loop()
        load = _Load(storage, runs, max_bytes, loop, loop.create_future())
        if self.on_loop:
            loop.call_soon(self._run_on_loop, load)
            return load.future
        with self._lock:
            self._waiting.append(load)
        self._start_what_fits()
        return load.future

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _start_what_fits(self) -> None:
        started: list[_Load] = []
        with self._lock:
            while self._waiting and self.running < self.loads_in_flight_max:
                head = self._waiting[0]
                if self.running and self.running_bytes + head.max_bytes > self.loaded_bytes_max:
                    break
                self._waiting.popleft()
                self.running += 1
                self.running_bytes += head.max_bytes
                started.append(head)
        for load in started:
            try:
                self._executor.submit(self._run, load)
            except RuntimeError:  # closed: the load fails, nothing reads any more
                self._done(load, None, RuntimeError("the entry loader is closed"))

    def _done(self, load: _Load, found: list[tuple[Position, bytes]] | None,
              error: BaseException | None) -> None:
        with self._lock:
            self.running -= 1
            self.running_bytes -= load.max_bytes
        try:
            load.loop.call_soon_threadsafe(_finish, load.future, found, error)
        except RuntimeError:
            pass  # the loop is closed: nobody waits any more

    def _run(self, load: _Load) -> None:
        try:
            found = collect(load.storage.read_entries, load.runs, load.max_bytes)
            outcome: tuple[list[tuple[Position, bytes]] | None, BaseException | None] = \
                (found, None)
        except Exception as error:  # handed to the loop, which decides
            outcome = (None, error)
        self._done(load, *outcome)
        self._start_what_fits()

    @staticmethod
    def _run_on_loop(load: _Load) -> None:
        try:
            found = collect(load.storage.read_entries, load.runs, load.max_bytes)
        except Exception as error:
            _finish(load.future, None, error)
            return
        _finish(load.future, found, None)

    def close(self) -> None:
        """Stop taking loads; running ones finish, waiting ones are dropped."""
        with self._lock:
            self._waiting.clear()
        self._executor.shutdown(wait=False)


def _finish(future: asyncio.Future[list[tuple[Position, bytes]]],
            found: list[tuple[Position, bytes]] | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert found is not None
        future.set_result(found)


_DEFAULT: EntryLoader | None = None
_DEFAULT_LOCK = threading.Lock()


def default_loader() -> EntryLoader:
    """The process's shared loader with the default limits (for managed ledgers opened
    without one, e.g. in tests)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = EntryLoader()
        return _DEFAULT


class LedgerReads(LedgerLayout):
    """The reads of `ManagedLedger` (its base class): planning runs over its ledger layout,
    serving them from memory on the loop or loading them off it, and searches by content.
    The layout itself (positions, entry counts) is its base, `LedgerLayout`."""

    __slots__ = ()

    storage: LedgerStorage
    loader: EntryLoader
    name: str

    def plan_runs(self, start: Position, max_entries: int) -> list[Run]:
        """The runs (`_loader.py`) of the first `max_entries` confirmed entries at or after
        `start`, crossing ledgers. Memory only."""
        runs: list[Run] = []
        wanted = max_entries
        at = self.first_entry_at_or_after(start)
        while wanted > 0 and at <= self.last_confirmed_position:
            count = min(wanted, self.ledger_entries(at.ledger_id) - at.entry_id)
            assert count > 0
            runs.append((at.ledger_id, at.entry_id, at.entry_id + count - 1))
            wanted -= count
            at = self.next_position(Position(at.ledger_id, at.entry_id + count - 1))
        return runs

    def read_entries(self, start: Position, max_entries: int,
                     max_bytes: int) -> list[tuple[Position, bytes]]:
        """Confirmed entries from the first one at or after `start`, crossing ledgers.

        Returns at most `max_entries` entries, stopping before the one that would take the
        total above `max_bytes` — but always at least one when any is available. May read
        the disk: for threads (tests, checks); the event loop uses `read_cached`/`load`.

        Raises:
            CorruptionError, NoSuchEntryError: from the storage read.
        """
        assert max_entries >= 0
        return collect(self.storage.read_entries, self.plan_runs(start, max_entries),
                       max_bytes)

    def read_cached(self, runs: list[Run], max_bytes: int) -> list[tuple[Position, bytes]]:
        """The longest prefix of `runs` (within `max_bytes`) the storage serves from memory;
        never touches the disk, so the loop may call it.

        Raises:
            LedgerNotFoundError, NoSuchEntryError: the runs are not (or no longer) entries.
        """
        return collect(self.storage.try_read_entries, runs, max_bytes)

    def load(self, runs: list[Run], max_bytes: int) -> asyncio.Future[list[tuple[Position, bytes]]]:
        """Read `runs` (within `max_bytes`) in the loader's worker threads; the future gives
        the entries or the storage's error (CorruptionError, NoSuchEntryError, ...)."""
        return self.loader.load(self.storage, runs, max_bytes)

    async def read_entries_async(self, start: Position, max_entries: int,
                                 max_bytes: int) -> list[tuple[Position, bytes]]:
        """`read_entries` for the event loop: from memory when it can, else loaded off the
        loop."""
        runs = self.plan_runs(start, max_entries)
        found = self.read_cached(runs, max_bytes)
        if len(found) == sum(last - first + 1 for _, first, last in runs):
            return found
        return await self.load(runs, max_bytes)

    def read_entry(self, position: Position) -> bytes:
        """One confirmed entry.

        Raises:
            InvalidPositionError: not a confirmed entry of this ML.
        """
        if not self.is_valid_position(position):
            raise InvalidPositionError(f"{position} is not an entry of {self.name}")
        return self.storage.read_entry(position.ledger_id, position.entry_id)

    async def read_entry_async(self, position: Position) -> bytes:
        """One confirmed entry, from memory or loaded off the loop.

        Raises:
            InvalidPositionError: not a confirmed entry of this ML.
        """
        if not self.is_valid_position(position):
            raise InvalidPositionError(f"{position} is not an entry of {self.name}")
        found = await self.read_entries_async(position, 1, 1)
        return found[0][1]

    async def find_newest_matching(self, predicate: Callable[[bytes], bool],
                                   start: Position | None = None) -> Position | None:
        """The newest entry (from `start`, default the first) for which `predicate` holds,
        assuming it holds for a prefix of the entries (binary search, ~log2(n) reads, each
        from memory or loaded off the loop). None when it does not hold for the first one."""
        first = self.first_entry_at_or_after(start or self.first_position())
        count = self.entries_between(first, self.last_confirmed_position)
        if count == 0 or not predicate(await self.read_entry_async(first)):
            return None
        low, high = 0, count - 1  # predicate holds at `low`
        while low < high:
            middle = (low + high + 1) // 2
            if predicate(await self.read_entry_async(self._nth_from(first, middle))):
                low = middle
            else:
                high = middle - 1
        return self._nth_from(first, low)

    def _nth_from(self, first: Position, offset: int) -> Position:
        return first if offset == 0 else self.position_after_n(first, offset)

    async def find_position_by_time(self, timestamp_ms: int,
                                    entry_timestamp: Callable[[bytes], int],
                                    start: Position | None = None) -> Position:
        """Where a seek by time lands (§4.7): right after the newest entry whose timestamp is
        below `timestamp_ms`, or the first entry when none is. Timestamps must rise."""
        newest = await self.find_newest_matching(
            lambda data: entry_timestamp(data) < timestamp_ms, start)
        if newest is None:
            return self.first_entry_at_or_after(start or self.first_position())
        return self.next_valid_position(newest)
