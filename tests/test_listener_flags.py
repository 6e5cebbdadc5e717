"""`magnetar standalone --advertised-listeners/--internal-listener-name` and their `--config`
forms: a malformed value is one line naming the problem (exit 2, nothing opened); settings
that contradict the TLS flags or --advertised-url stop the broker before it opens anything."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from magnetar.broker.cli import main

GOOD = "internal:pulsar://127.0.0.1:6650,external:pulsar://example.com:6650"


def _standalone(data_dir: Path, *flags: str) -> int:
    return main(["standalone", "--data-dir", str(data_dir), "--port", "0", "--http-port", "0",
                 *flags])


@pytest.mark.parametrize(("flags", "reason"), [
    (("--advertised-listeners", "pulsar://127.0.0.1:6650"), "does not name its listener"),
    (("--advertised-listeners", "a:pulsar://127.0.0.1"), "is not NAME:pulsar://HOST:PORT"),
    (("--advertised-listeners", "a:pulsar://127.0.0.1:6650,a:pulsar://127.0.0.1:6651"),
     "more than one pulsar:// URL"),
    (("--advertised-listeners", GOOD, "--internal-listener-name", "nope"),
     "internal_listener_name 'nope' is not one of the advertised_listeners"),
    (("--config", "advertised_listeners=a:pulsar://h:1,b:pulsar://h:1"),
     "is given to listeners 'a' and 'b'"),
    (("--config", f"advertised_listeners={GOOD}", "--config", "internal_listener_name=x"),
     "internal_listener_name 'x' is not one of"),
])
def test_a_malformed_listener_setting_is_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  flags: tuple[str, ...], reason: str) -> None:
    data_dir = tmp_path / "data"
    assert _standalone(data_dir, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("magnetar standalone: ")
    assert reason in err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert not data_dir.exists()


@pytest.mark.parametrize(("flags", "reason"), [
    (("--advertised-listeners", GOOD, "--advertised-url", "pulsar://127.0.0.1:6650"),
     "advertised_listeners and --advertised-url/--advertised-url-tls must not appear together"),
    (("--advertised-listeners", "a:pulsar://127.0.0.1:6650,a:pulsar+ssl://127.0.0.1:6651"),
     "advertised_listeners: listener 'a' has a pulsar+ssl:// URL, but the broker serves no TLS"),
])
def test_listeners_that_contradict_other_flags_stop_the_broker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, flags: tuple[str, ...],
        reason: str) -> None:
    data_dir = tmp_path / "data"
    with caplog.at_level(logging.ERROR):
        assert _standalone(data_dir, *flags) == 1
    assert f"cannot start: {reason}" in caplog.text
    assert not data_dir.exists()  # refused before the data directory was opened


def test_help_lists_the_listener_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["standalone", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--advertised-listeners NAME:URL,..." in out
    assert "--internal-listener-name NAME" in out
