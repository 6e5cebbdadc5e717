"""`magnetar perf` argument errors: one line on stderr naming the problem, exit status 2,
before any connection is tried (no broker is needed: nothing listens on the default URL's
port in these runs, and none of them gets that far)."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.broker.cli import main


@pytest.mark.parametrize(("argv", "says"), [
    (["perf", "produce", "t", "--rate", "-1"], "--rate: invalid number '-1': must be 0 or more"),
    (["perf", "produce", "t", "--rate", "nan"], "--rate: invalid number 'nan'"),
    (["perf", "produce", "t", "--size", "0"], "--size: invalid number '0'"),
    (["perf", "produce", "t", "-m", "many"], "--num-messages: invalid number 'many'"),
    (["perf", "produce", "t", "--max-pending", "0"], "--max-pending: invalid number '0'"),
    (["perf", "produce", "t", "--num-topics", "0"], "--num-topics: invalid number '0'"),
    (["perf", "produce", "t", "--duration-s", "-3"], "--duration-s: invalid number '-3'"),
    (["perf", "produce", "t", "--report-interval-s", "0"], "--report-interval-s"),
    (["perf", "produce"], "the following arguments are required: topic"),
    (["perf"], "the following arguments are required: COMMAND"),
    (["perf", "consume", "t", "-st", "Bogus"], "--subscription-type: invalid choice"),
    (["perf", "consume", "t", "-n", "2"], "--num-consumers 2 needs --subscription-type"),
    (["perf", "produce", "persistent://only-two/parts"], "only-two/parts"),
])
def test_bad_arguments_get_one_line_and_status_2(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own checks exit from inside parse_args
        status = exit_.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("magnetar perf")
    assert says in err


def test_an_unwritable_json_path_is_refused_before_connecting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing-dir" / "out.json"
    assert main(["perf", "produce", "t", "--json", str(target)]) == 2
    _, err = capsys.readouterr()
    assert err == (f"magnetar perf produce: cannot write --json {target}: "
                   "No such file or directory\n")
