"""`magnetar standalone` refuses unusable security settings before it opens anything: exit 1
and a log line that names the problem."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from magnetar.broker.cli import main


@pytest.mark.parametrize(("flags", "reason"), [
    (("--tls-cert-file", "{missing}", "--tls-key-file", "{missing}", "--tls-port", "0"),
     "cannot load the TLS certificate"),
    (("--tls-port", "0"), "--tls-port and --https-port need --tls-cert-file"),
    (("--tls-cert-file", "{missing}", "--tls-key-file", "{missing}", "--tls-port", "0",
      "--tls-require-trusted-client-cert"), "needs --tls-trust-certs-file"),
    (("--auth-token-secret-key", "{missing}"), "cannot read key file"),
    (("--auth-token-public-key", "{garbage}"), "not a DER or PEM public key"),
    (("--auth-token-secret-key", "data:;base64,!!"), "not valid base64"),
])
def test_bad_security_settings_stop_the_broker_with_a_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, flags: tuple[str, ...],
        reason: str) -> None:
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"not a key")
    names = {"missing": str(tmp_path / "missing.pem"), "garbage": str(garbage)}
    data_dir = tmp_path / "data"
    with caplog.at_level(logging.ERROR):
        status = main(["standalone", "--data-dir", str(data_dir), "--port", "0",
                       "--http-port", "0", *(flag.format(**names) for flag in flags)])
    assert status == 1
    assert reason in caplog.text
    assert not data_dir.exists()  # refused before the data directory was opened


def test_tls_needs_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["standalone", "--data-dir", str(tmp_path), "--tls-cert-file", "c.pem"]) == 2
    assert "needs both --tls-cert-file and --tls-key-file" in capsys.readouterr().err
