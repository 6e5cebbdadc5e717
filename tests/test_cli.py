"""The `magnetar` command line: help texts, and the storage tools on a real directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import build_parser, main
from storage import Storage


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("storage", "crashtest", "bench"):
        assert command in out


@pytest.mark.parametrize(
    "argv",
    [["storage", "--help"], ["storage", "check", "--help"], ["storage", "inspect", "--help"],
     ["crashtest", "--help"], ["bench", "--help"], ["bench", "storage", "--help"]],
)
def test_each_subcommand_has_its_own_help(argv: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: magnetar" in out
    assert len(out.splitlines()) > 3


def test_missing_subcommand_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([])
    assert exit_info.value.code == 2
    assert "required" in capsys.readouterr().err


def _populate(data_dir: Path) -> int:
    with Storage.open(data_dir) as store:
        ledger = store.create_ledger({"topic": "persistent://public/default/t"}).result()
        for i in range(20):
            store.add_entry(ledger, b"entry-%d" % i).result()
        return ledger


def test_storage_check_reports_a_clean_directory(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _populate(tmp_path)
    assert main(["storage", "check", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 ledgers, 20 entries, 0 problems" in out


def test_storage_check_fails_on_a_damaged_entry_log(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _populate(tmp_path)
    log_file = next((tmp_path / "entrylogs").glob("*.log"))
    raw = bytearray(log_file.read_bytes())
    raw[1024 + 30] ^= 0xFF  # inside the first record's bytes
    log_file.write_bytes(bytes(raw))
    assert main(["storage", "check", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "fails its CRC" in out
    assert str(log_file) in out


def test_storage_inspect_lists_ledgers_and_segments(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    ledger = _populate(tmp_path)
    assert main(["storage", "inspect", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"  {ledger}  open  lac=19" in out
    assert ".jnl" in out
    assert "mark: JournalMark" in out


def test_console_script_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "broker.cli", "--help"], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0
    assert "crashtest" in done.stdout


def _corrupt_journal_mid_segment(data_dir: Path, entries: int = 30, victim: int = 10) -> int:
    """Acknowledged entries that live only in the journal (a crash before any checkpoint),
    then one byte flipped inside the payload of entry `victim`'s record. Returns the
    damaged record's offset."""
    from storage import StorageConfig
    from storage._journal_format import RecordType, ScanResult, SegmentHeader, scan_segment

    store = Storage.open(data_dir, StorageConfig(background_threads=False))
    ledger = store.wait(store.create_ledger({"topic": "persistent://public/default/t"}))
    for i in range(entries):
        store.wait(store.add_entry(ledger, b"entry-%d" % i))
    store.abandon()
    (segment,) = (data_dir / "journal").glob("*.jnl")
    with segment.open("rb") as f:
        raw = f.read()
    header = SegmentHeader.decode(raw[:4096], str(segment))

    class Handle:
        path = str(segment)

        def pread(self, size: int, offset: int) -> bytes:
            return raw[offset:offset + size]

        def size(self) -> int:
            return len(raw)

    result = ScanResult(0, -1, 0, True)
    adds = [r.offset for r in scan_segment(Handle(), header, header.alignment,  # type: ignore[arg-type]
                                            None, 1 << 20, result)
            if r.kind == RecordType.ADD_ENTRY]
    damaged = bytearray(raw)
    damaged[adds[victim] + 24 + 17] ^= 0x10
    segment.write_bytes(bytes(damaged))
    return adds[victim]


def _standalone(data_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "standalone", "--data-dir", str(data_dir),
         "--port", "0", "--http-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_standalone_refuses_a_corrupt_journal_unless_told(tmp_path: Path) -> None:
    """Issue 10 item 1: a damaged record with acknowledged records after it is not a torn
    tail. The broker refuses to start with one line naming file, offset and how many valid
    records follow; --skip-corrupt-journal-segments starts it and logs what was lost."""
    offset = _corrupt_journal_mid_segment(tmp_path)
    refused = _standalone(tmp_path)
    out, _ = refused.communicate(timeout=60)
    assert refused.returncode == 1, out
    assert "Traceback" not in out
    (line,) = [x for x in out.splitlines() if "cannot start" in x]
    assert f"at offset {offset}" in line
    assert ".jnl" in line
    assert "followed by 38 valid records" in line, line  # 19 adds after it, 19 PADs
    accepted = _standalone(tmp_path, "--skip-corrupt-journal-segments")
    try:
        assert accepted.stdout is not None
        seen = []
        for text in accepted.stdout:  # ends when the process exits
            seen.append(text)
            if "ready on" in text:
                break
        assert any("LOST: 38 journal records" in x for x in seen), "".join(seen)
        assert any("ready on" in x for x in seen), "".join(seen)
    finally:
        accepted.terminate()
        accepted.communicate(timeout=60)
    assert accepted.returncode == 0


def _snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under `root`: size, mtime and content digest."""
    import hashlib

    found = {}
    for path in sorted(root.rglob("*")):
        stat = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns, digest)
    return found


def _journal_only_entries(data_dir: Path) -> None:
    """A clean run, then entries that only the journal holds (a crash)."""
    from storage import StorageConfig

    ledger = _populate(data_dir)
    store = Storage.open(data_dir, StorageConfig(background_threads=False))
    for i in range(20, 30):
        store.wait(store.add_entry(ledger, b"entry-%d" % i))
    store.abandon()


@pytest.mark.parametrize("read_only_copy", [False, True])
def test_storage_check_and_inspect_change_nothing(tmp_path: Path, read_only_copy: bool,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 10 item 3: no recovery, no new segment, no deleted segment, no LMDB lock
    file: every file's bytes and mtime and every listing stay as they were; and the
    report says what recovery would do."""
    data_dir = tmp_path / "data"
    _journal_only_entries(data_dir)
    if read_only_copy:
        subprocess.run(["chmod", "-R", "a-w", str(data_dir)], check=True)
    before = _snapshot(data_dir)
    try:
        assert main(["storage", "check", "--data-dir", str(data_dir)]) == 0
        checked = capsys.readouterr().out
        assert main(["storage", "inspect", "--data-dir", str(data_dir)]) == 0
        inspected = capsys.readouterr().out
        assert _snapshot(data_dir) == before
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(data_dir)], check=True)
    assert "1 ledgers, 20 entries, 0 problems" in checked
    assert "would replay 20 journal records" in checked  # 10 adds, each with its PAD
    assert "lac=29" in inspected  # as recovery would leave it
    assert "would replay 20 journal records" in inspected


def test_storage_check_reports_a_corrupt_journal_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    offset = _corrupt_journal_mid_segment(tmp_path)
    before = _snapshot(tmp_path)
    assert main(["storage", "check", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "1 problems" in out
    (line,) = [x for x in out.splitlines() if "corrupt journal record" in x]
    assert "followed by 38 valid records" in line
    assert f"at offset {offset}" in line
    assert "would refuse to start" in line
    assert _snapshot(tmp_path) == before


def test_storage_check_reports_a_corrupted_index(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with Storage.open(tmp_path) as store:
        ledger = store.create_ledger().result()
        for completion in [store.add_entry(ledger, b"e%d" % i) for i in range(3000)]:
            completion.result()
    index_file = tmp_path / "index" / "data.mdb"
    raw = bytearray(index_file.read_bytes())
    page = len(raw) // 2 // 4096 * 4096
    raw[page:page + 64] = bytes(b ^ 0xFF for b in raw[page:page + 64])
    index_file.write_bytes(bytes(raw))
    assert main(["storage", "check", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "is unreadable" in x]
    assert str(index_file) in line
    assert "CorruptedError" in line


def test_storage_check_and_inspect_refuse_a_live_brokers_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _populate(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from storage import Storage; "
         f"s = Storage.open({str(tmp_path)!r}); print('open', flush=True); "
         "sys.stdin.read(); s.close()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"
        for command in ("check", "inspect"):
            assert main(["storage", command, "--data-dir", str(tmp_path)]) == 2
            captured = capsys.readouterr()
            assert captured.out == ""
            (line,) = captured.err.strip().splitlines()
            assert f"locked by process {holder.pid}" in line
            assert "running" in line
    finally:
        holder.communicate("", timeout=60)
