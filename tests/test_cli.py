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
