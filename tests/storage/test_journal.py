"""The journal: group commit, segment rollover, ack-before-sync mode, back-pressure, and
segment life cycle through `Storage`."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from magnetar.storage import Completion, OsFileSystem, Storage, StorageConfig, StorageFailedError
from magnetar.storage._fs import FileSystem
from magnetar.storage._journal import Journal, JournalRequest, parse_segment_name, segment_file_name
from magnetar.storage._journal_batch import CountedCondition
from magnetar.storage._journal_format import RecordType, ScanResult, SegmentHeader, scan_segment
from magnetar.storage.testing.simfs import SimFileSystem
from tests.storage.helpers import CountingFileSystem, journal_files, small_config, wait_until

WAIT_RESULT_S = 10.0


class JournalHarness:
    """A `Journal` in a directory of its own, with callbacks that record what became
    durable or failed and finish the requests' completions."""

    def __init__(self, directory: Path, config: StorageConfig, fs: FileSystem | None = None,
                 *, segment_id: int = 1, last_lsn: int = 0):
        directory.mkdir(exist_ok=True)
        self.directory = directory
        self.fs = fs or OsFileSystem()
        self.lock = threading.Lock()
        self.durable: list[int] = []
        self.failed: list[tuple[int, BaseException]] = []
        self.journal = Journal(self.fs, str(directory), config, segment_id=segment_id,
                               last_lsn=last_lsn, on_durable=self._on_durable,
                               on_failed=self._on_failed)
        self.submitted = 0

    def _on_durable(self, requests: list[JournalRequest]) -> None:
        with self.lock:
            self.durable.extend(r.entry_id for r in requests)
        for request in requests:
            if request.completion is not None:
                request.completion.set_result(request.entry_id)

    def _on_failed(self, requests: list[JournalRequest], error: BaseException) -> None:
        with self.lock:
            self.failed.extend((r.entry_id, error) for r in requests)
        for request in requests:
            if request.completion is not None:
                request.completion.set_exception(error)

    def submit(self, payload: bytes) -> Completion[int]:
        completion: Completion[int] = Completion()
        number = self.submitted
        self.submitted += 1
        self.journal.submit(JournalRequest(RecordType.ADD_ENTRY, payload, completion, None,
                                           number))
        return completion


def read_journal(directory: Path, alignment: int) -> list[tuple[int, str, ScanResult,
                                                               list[tuple[int, bytes]]]]:
    """(segment id, path, scan result, [(lsn, payload)] without PADs) for every segment."""
    out = []
    fs = OsFileSystem()
    for name in sorted(os.listdir(directory)):
        segment_id = parse_segment_name(name)
        assert segment_id is not None
        path = str(directory / name)
        handle = fs.open_read(path)
        try:
            header = SegmentHeader.decode(handle.pread(alignment, 0), path)
            assert header.segment_id == segment_id
            result = ScanResult(0, 0, 0, False)
            records = [(r.lsn, bytes(r.payload))
                       for r in scan_segment(handle, header, alignment, header.first_lsn - 1,
                                             1 << 20, result)
                       if r.kind != RecordType.PAD]
        finally:
            handle.close()
        out.append((segment_id, path, result, records))
    return out


def payload(number: int, size: int = 300) -> bytes:
    return number.to_bytes(4, "big") * (size // 4)


def test_segment_names() -> None:
    assert segment_file_name(0x2A) == "000000000000002a.jnl"
    assert parse_segment_name("000000000000002a.jnl") == 0x2A
    for bad in ("2a.jnl", "000000000000002a.log", "000000000000002a", "zzzzzzzzzzzzzzzz.jnl"):
        assert parse_segment_name(bad) is None


# -- group commit ------------------------------------------------------------------------

def test_one_pump_makes_a_whole_batch_durable_with_one_sync(tmp_path: Path) -> None:
    fs = CountingFileSystem()
    harness = JournalHarness(tmp_path / "journal", small_config(background_threads=False), fs)
    syncs_at_start = fs.total("sync")
    completions = [harness.submit(payload(i)) for i in range(100)]
    assert not any(c.done() for c in completions), "nothing is durable before a sync"
    assert harness.journal.pump()
    assert [c.result(0) for c in completions] == list(range(100))
    assert fs.total("sync") - syncs_at_start == 1
    assert harness.journal.synced_mark.lsn == 101, "100 records and one PAD"
    assert not harness.journal.pump(), "nothing left to do"
    harness.journal.close()
    ((_, _, result, records),) = read_journal(tmp_path / "journal", 4096)
    assert [p for _, p in records] == [payload(i) for i in range(100)]
    assert result.clean


def test_batches_are_bounded_by_journal_batch_bytes_max(tmp_path: Path) -> None:
    fs = CountingFileSystem()
    config = small_config(background_threads=False, journal_batch_bytes_max=3000)
    harness = JournalHarness(tmp_path / "journal", config, fs)
    completions = [harness.submit(payload(i, 1000)) for i in range(10)]
    assert harness.journal.pump()
    assert sum(c.done() for c in completions) == 3
    while harness.journal.pump():
        pass
    assert [c.result(0) for c in completions] == list(range(10))
    harness.journal.close()


def test_group_commit_groups_under_concurrent_load(tmp_path: Path) -> None:
    """Many adds in flight from several threads complete with far fewer fdatasyncs of the
    journal than adds."""
    fs = CountingFileSystem()
    store = Storage.open(tmp_path / "data", small_config(), fs=fs)
    journal_dir = tmp_path / "data" / "journal"
    ledger = store.create_ledger().result(10)
    syncs_before = fs.total("sync", journal_dir)
    threads_count, adds_per_thread = 8, 250
    results: dict[int, bytes] = {}
    lock = threading.Lock()

    def writer(number: int) -> None:
        datas = [f"{number}:{i}".encode() for i in range(adds_per_thread)]
        completions = [store.add_entry(ledger, data) for data in datas]
        for data, completion in zip(datas, completions, strict=True):
            entry_id = completion.result(30)
            with lock:
                results[entry_id] = data

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    adds = threads_count * adds_per_thread
    syncs = fs.total("sync", journal_dir) - syncs_before
    assert sorted(results) == list(range(adds)), "entry ids dense from 0"
    assert 1 <= syncs <= adds // 10, f"{syncs} journal syncs for {adds} adds"
    assert store.read_entries(ledger, 0, adds - 1) == [results[i] for i in range(adds)]
    store.close()


def test_writer_and_syncer_threads_make_every_request_durable_in_order(tmp_path: Path) -> None:
    harness = JournalHarness(tmp_path / "journal", small_config())
    completions = [harness.submit(payload(i, 64)) for i in range(2000)]
    assert [c.result(30) for c in completions] == list(range(2000))
    assert harness.durable == list(range(2000)), "durable in submission order"
    harness.journal.close()
    records = [p for *_, rs in read_journal(tmp_path / "journal", 4096) for _, p in rs]
    assert records == [payload(i, 64) for i in range(2000)]


# -- rollover ----------------------------------------------------------------------------

ROLLING = dict(background_threads=False, journal_alignment_bytes=512,
               journal_segment_bytes_max=4096, journal_prealloc_bytes=4096)


def test_rollover_at_journal_segment_bytes_max(tmp_path: Path) -> None:
    harness = JournalHarness(tmp_path / "journal", small_config(**ROLLING), segment_id=5,
                             last_lsn=100)
    for i in range(40):
        completion = harness.submit(payload(i))
        harness.journal.pump()
        assert completion.result(0) == i
    assert harness.journal.current_segment_id > 5
    harness.journal.close()
    segments = read_journal(tmp_path / "journal", 512)
    ids = [segment_id for segment_id, *_ in segments]
    assert ids == list(range(5, 5 + len(ids))), "segment ids are consecutive"
    assert len(ids) >= 5
    for segment_id, path, result, _ in segments[:-1]:
        assert result.clean, f"segment {segment_id} is complete"
        assert result.end_offset >= 4096, "a segment rolls only once full"
        assert os.path.getsize(path) >= result.end_offset
    lsns = [lsn for *_, records in segments for lsn, _ in records]
    assert lsns == sorted(lsns)
    assert lsns[0] == 101
    # LSNs run on across segments: each header's first LSN follows the previous segment.
    previous_last = 100
    for _, path, result, _ in segments:
        with open(path, "rb") as f:
            header = SegmentHeader.decode(f.read(512), path)
        assert header.first_lsn == previous_last + 1
        previous_last = result.last_lsn
    assert [p for *_, records in segments for _, p in records] == [payload(i) for i in range(40)]


def test_crash_after_rollovers_tears_only_the_newest_segment(tmp_path: Path, seed: int) -> None:
    fs = SimFileSystem(seed, crash_at_point="journal:before-sync", point_hits=30)
    harness = JournalHarness(tmp_path / "journal", small_config(**ROLLING), fs)
    completions = []
    for i in range(40):
        completions.append(harness.submit(payload(i)))
        harness.journal.pump()
        if fs.crashed:
            break
    assert fs.crashed
    harness.journal.abandon()
    fs.power_loss()
    acknowledged = [c.result(0) for c in completions if c.done() and c.exception() is None]
    assert acknowledged == list(range(len(acknowledged)))
    assert len(acknowledged) >= 20
    segments = read_journal(tmp_path / "journal", 512)
    assert len(segments) >= 3
    for segment_id, _, result, _ in segments[:-1]:
        assert result.clean, f"older segment {segment_id} was synced before the rollover"
    found = [p for *_, records in segments for _, p in records]
    assert found[:len(acknowledged)] == [payload(i) for i in acknowledged]
    assert found == [payload(i) for i in range(len(found))], "whole records, in order"


def test_storage_replays_across_many_segments(tmp_path: Path) -> None:
    # Many rollovers and no checkpoint before a crash (BookieJournalRollingTest
    # testJournalRollingWithoutSyncup): replay across every segment restores all entries.
    config = small_config(**ROLLING)
    store = Storage.open(tmp_path, config)
    ledger = store.wait(store.create_ledger())
    datas = [payload(i, 200) for i in range(60)]
    for data in datas:
        store.wait(store.add_entry(ledger, data))
    _rolled_and_replayed(tmp_path, config, store, ledger, datas)


def _rolled_and_replayed(tmp_path: Path, config: StorageConfig, store: Storage, ledger: int,
                         datas: list[bytes]) -> None:
    """The journal rolled over at least 4 times; after a crash (`abandon`), replay across
    every segment restores `datas` as the ledger's entries."""
    assert len(journal_files(tmp_path)) >= 5
    store.abandon()
    reopened = Storage.open(tmp_path, config)
    assert reopened.last_add_confirmed(ledger) == len(datas) - 1
    assert reopened.read_entries(ledger, 0, len(datas) - 1) == datas
    reopened.close()


def test_lone_adds_led_by_their_callers_roll_segments_over(tmp_path: Path) -> None:
    """With the journal threads running, each lone add is written and synced by the thread
    that waits on it (`try_lead`), rollovers included: every add completes, the journal
    rolls over many times, and replay restores them all."""
    config = small_config(**{**ROLLING, "background_threads": True})
    store = Storage.open(tmp_path, config)
    ledger = store.create_ledger().result(WAIT_RESULT_S)
    datas = [payload(i, 200) for i in range(60)]
    for i, data in enumerate(datas):
        assert store.add_entry(ledger, data).result(WAIT_RESULT_S) == i
    _rolled_and_replayed(tmp_path, config, store, ledger, datas)


def test_checkpoint_deletes_old_segments_keeping_a_few(tmp_path: Path) -> None:
    config = small_config(**ROLLING, journal_segments_kept_max=2)
    store = Storage.open(tmp_path, config)
    ledger = store.wait(store.create_ledger())
    for i in range(60):
        store.wait(store.add_entry(ledger, payload(i, 200)))
    before = [parse_segment_name(os.path.basename(p)) for p in journal_files(tmp_path)]
    store.checkpoint()
    after = [parse_segment_name(os.path.basename(p)) for p in journal_files(tmp_path)]
    assert len(before) >= 6
    mark = store.index.persisted_mark
    assert mark is not None
    assert store.journal is not None
    assert mark.segment_id == store.journal.current_segment_id
    assert after == before[-3:], "the marked segment and two older ones"
    store.close()
    reopened = Storage.open(tmp_path, config)
    assert reopened.read_entries(ledger, 0, 59) == [payload(i, 200) for i in range(60)]
    reopened.close()


def test_every_open_starts_one_new_segment(tmp_path: Path) -> None:
    config = small_config(background_threads=False, journal_segments_kept_max=10)
    seen: list[int] = []
    for _ in range(3):
        store = Storage.open(tmp_path, config)
        assert store.journal is not None
        seen.append(store.journal.current_segment_id)
        store.wait(store.create_ledger())
        store.close()
    assert seen == sorted(set(seen)), "strictly increasing segment ids"
    assert seen[1] == seen[0] + 1
    assert seen[2] == seen[1] + 1


# -- ack before sync ---------------------------------------------------------------------

def test_no_sync_mode_acks_before_the_sync_and_moves_the_mark_after(tmp_path: Path) -> None:
    fs = CountingFileSystem()
    config = small_config(background_threads=False, journal_sync=False)
    observed: list[tuple[int, int]] = []
    harness = JournalHarness(tmp_path / "journal", config, fs)
    journal_dir = tmp_path / "journal"
    start_mark = harness.journal.synced_mark
    syncs_at_start = fs.total("sync", journal_dir)
    completions = [harness.submit(payload(i)) for i in range(5)]
    for completion in completions:
        completion.add_done_callback(lambda _: observed.append(
            (fs.total("sync", journal_dir), harness.journal.synced_mark.lsn)))
    assert harness.journal.pump()
    assert [c.result(0) for c in completions] == list(range(5))
    assert observed == [(syncs_at_start, start_mark.lsn)] * 5, \
        "acknowledged before any sync, with the mark unmoved"
    assert fs.total("sync", journal_dir) == syncs_at_start + 1
    assert harness.journal.synced_mark.lsn == start_mark.lsn + 6  # five records and a PAD
    harness.journal.close()


def test_no_sync_mode_syncs_on_its_timer(tmp_path: Path) -> None:
    fs = CountingFileSystem()
    config = small_config(journal_sync=False, journal_sync_interval_ms=20)
    harness = JournalHarness(tmp_path / "journal", config, fs)
    completions = [harness.submit(payload(i)) for i in range(10)]
    assert [c.result(10) for c in completions] == list(range(10))
    wait_until(lambda: harness.journal.synced_mark.lsn >= 10, "the timed sync")
    assert fs.total("sync", tmp_path / "journal") >= 2, "creation and the timed sync"
    harness.journal.close()


def test_no_sync_mode_does_not_move_the_mark_before_the_interval(tmp_path: Path) -> None:
    fs = CountingFileSystem()
    config = small_config(journal_sync=False, journal_sync_interval_ms=600_000)
    harness = JournalHarness(tmp_path / "journal", config, fs)
    start_mark = harness.journal.synced_mark
    syncs_at_start = fs.total("sync", tmp_path / "journal")
    completions = [harness.submit(payload(i)) for i in range(10)]
    assert [c.result(10) for c in completions] == list(range(10))
    assert harness.journal.synced_mark == start_mark
    assert fs.total("sync", tmp_path / "journal") == syncs_at_start
    harness.journal.close()  # close syncs what was written
    assert fs.total("sync", tmp_path / "journal") > syncs_at_start
    assert harness.journal.synced_mark.lsn >= 10


def test_no_sync_mode_storage_survives_a_process_crash(tmp_path: Path) -> None:
    # BookieJournalNoSyncTest: acknowledged without sync, the process dies, the OS keeps
    # the page cache: every entry is readable after restart.
    config = small_config(journal_sync=False, journal_sync_interval_ms=600_000)
    store = Storage.open(tmp_path, config)
    ledger = store.create_ledger().result(10)
    completions = [store.add_entry(ledger, payload(i, 40)) for i in range(100)]
    assert [c.result(10) for c in completions] == list(range(100))
    store.abandon()
    reopened = Storage.open(tmp_path, small_config())
    assert reopened.read_entries(ledger, 0, 99) == [payload(i, 40) for i in range(100)]
    reopened.close()


# -- back-pressure -----------------------------------------------------------------------

def test_submit_blocks_at_journal_queue_requests_max(tmp_path: Path) -> None:
    config = small_config(background_threads=False, journal_queue_requests_max=4)
    harness = JournalHarness(tmp_path / "journal", config)
    returned: list[int] = []
    completions: list[Completion[int]] = []

    def producer() -> None:
        for i in range(10):
            completions.append(harness.submit(payload(i)))
            returned.append(i)

    thread = threading.Thread(target=producer)
    thread.start()
    wait_until(lambda: harness.journal.pending() == 4, "a full queue")
    thread.join(0.2)
    assert thread.is_alive(), "the fifth submit waits for room"
    assert returned == [0, 1, 2, 3]
    while thread.is_alive() or harness.journal.pending():
        assert harness.journal.pending() <= 4
        harness.journal.pump()
        thread.join(0.001)
    assert [c.result(0) for c in completions] == list(range(10))
    assert harness.durable == list(range(10))
    harness.journal.close()


def test_close_writes_and_syncs_what_is_queued(tmp_path: Path) -> None:
    # close() writes and syncs what is queued: nothing is dropped.
    harness = JournalHarness(tmp_path / "journal", small_config(background_threads=False))
    completions = [harness.submit(payload(i)) for i in range(5)]
    harness.journal.close()
    assert [c.result(0) for c in completions] == list(range(5))


def test_submit_after_close_fails(tmp_path: Path) -> None:
    from magnetar.storage import StorageClosedError

    harness = JournalHarness(tmp_path / "journal", small_config(background_threads=False))
    harness.journal.close()
    with pytest.raises(StorageClosedError):
        harness.submit(b"late").result(0)


def test_a_lone_add_is_synced_by_the_waiting_thread(tmp_path: Path) -> None:
    """With the journal idle, the thread that blocks on an add's completion writes and syncs
    it itself: the completion finishes in that thread, with one journal sync per add."""
    fs = CountingFileSystem()
    store = Storage.open(tmp_path / "data", small_config(), fs=fs)
    journal_dir = tmp_path / "data" / "journal"
    ledger = store.create_ledger().result(10)
    finished_in: list[threading.Thread] = []
    syncs_before = fs.total("sync", journal_dir)
    for i in range(20):
        completion = store.add_entry(ledger, b"lone-%d" % i)
        completion.add_done_callback(lambda _: finished_in.append(threading.current_thread()))
        assert completion.result(10) == i
    assert fs.total("sync", journal_dir) - syncs_before == 20
    assert finished_in.count(threading.current_thread()) >= 15  # the writer may win a race
    store.close()


@pytest.mark.parametrize("use", ["callback", "done", "await"])
def test_a_lone_add_is_written_when_its_completion_is_used_without_blocking(
        tmp_path: Path, use: str) -> None:
    """A lone `add_entry` into an idle journal does not wake the writer (its caller most
    likely blocks on it and writes it itself); a callback, a poll of `done` or an await
    must wake it instead, or the add would wait for the next record."""
    store = Storage.open(tmp_path / "data", small_config())
    try:
        ledger = store.create_ledger().result(WAIT_RESULT_S)
        for i in range(3):  # each one into an idle journal
            completion = store.add_entry(ledger, b"lone-%d" % i)
            if use == "callback":
                finished = threading.Event()
                completion.add_done_callback(lambda _, event=finished: event.set())
                assert finished.wait(WAIT_RESULT_S)
            elif use == "done":
                wait_until(completion.done, "the add to be durable")
            else:
                async def awaited(c: Completion[int] = completion) -> int:
                    return await c
                assert asyncio.run(asyncio.wait_for(awaited(), WAIT_RESULT_S)) == i
            assert completion.result(0) == i
    finally:
        store.close()


def test_counted_condition_wakes_its_waiters_and_skips_a_notify_nobody_hears() -> None:
    """The journal's own condition counts its waiters: `notify_all` must still wake one
    that waits (it is skipped only when nobody does)."""
    condition = CountedCondition(threading.RLock())
    woken = threading.Event()
    go = False

    def waiter() -> None:
        with condition:
            while not go:
                condition.wait()
            woken.set()

    with condition:
        condition.notify_all()  # nobody waits: nothing happens
    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: condition.waiting == 1, "the waiter to wait")
    with condition:
        go = True
        condition.notify_all()
    assert woken.wait(WAIT_RESULT_S)
    thread.join(WAIT_RESULT_S)
    assert condition.waiting == 0


def test_the_waiting_thread_does_not_sync_when_disabled(tmp_path: Path) -> None:
    store = Storage.open(tmp_path / "data",
                         small_config(journal_caller_syncs_when_idle=False))
    ledger = store.create_ledger().result(10)
    finished_in: list[threading.Thread] = []
    for i in range(5):
        completion = store.add_entry(ledger, b"x")
        completion.add_done_callback(lambda _: finished_in.append(threading.current_thread()))
        assert completion.result(10) == i
    assert threading.current_thread() not in finished_in
    store.close()


@pytest.mark.parametrize("point", ["journal:before-sync", "journal:after-sync"])
def test_a_crash_at_a_sync_point_fails_the_batch_in_the_syncer_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """With background threads, a simulated crash around the sync must fail the waiting
    requests (never leave them unanswered) and must not kill the syncer thread with an
    unhandled exception."""
    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    fs = SimFileSystem(3, crash_at_point=point)
    harness = JournalHarness(tmp_path / "journal", small_config(background_threads=True), fs)
    completion = harness.submit(b"only")
    with pytest.raises(StorageFailedError, match=f"simulated crash at {point}"):
        completion.result(timeout=WAIT_RESULT_S)
    assert fs.crashed
    harness.journal.abandon()
    assert escaped == []


def test_a_sync_writes_one_small_preallocation_step_at_most(tmp_path: Path) -> None:
    """Preallocated zeros are data that the next fdatasync writes: with the default step no
    sync of the journal has more than 1 MiB of zeros besides its batch (16 MiB made that
    sync take 10-20 ms, a latency spike every 16 MiB of journal)."""
    fs = CountingFileSystem()
    config = StorageConfig(background_threads=False)  # the default preallocation step
    harness = JournalHarness(tmp_path / "journal", config, fs)
    batch_bytes = 400 * 1024
    for number in range(8):  # 3.2 MiB: past the first 1 MiB and a few steps more
        completion = harness.submit(payload(number, batch_bytes))
        harness.journal.pump()
        assert completion.result(0) == number
    (segment,) = journal_files(tmp_path)
    harness.journal.close()
    alignment = config.journal_alignment_bytes
    assert fs.synced_bytes_max[segment] <= 1024 * 1024 + batch_bytes + 2 * alignment
