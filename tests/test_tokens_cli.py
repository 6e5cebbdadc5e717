"""`magnetar tokens`: keys and tokens round-trip (create -> show -> validate) for secrets and key
pairs, and invalid tokens exit 1 with the reason."""

from __future__ import annotations

import argparse
import base64
import json
import time
from pathlib import Path

import pytest

from magnetar.broker.cli import main
from magnetar.broker.cli._tokens_cli import parse_expiry_s


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out.strip(), captured.err.strip()


def test_secret_key_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "secret.key"
    assert _run(capsys, "tokens", "create-secret-key", "--output", str(key))[0] == 0
    assert len(key.read_bytes()) == 32
    assert key.stat().st_mode & 0o077 == 0  # private to its owner
    status, token, _ = _run(capsys, "tokens", "create", "--secret-key", str(key),
                            "--subject", "alice", "--expiry-time", "1h")
    assert status == 0
    status, shown, _ = _run(capsys, "tokens", "show", token)
    header, claims = (json.loads(line) for line in shown.splitlines())
    assert header == {"alg": "HS256"}
    assert claims["sub"] == "alice"
    assert 3590 <= claims["exp"] - time.time() <= 3600
    status, validated, _ = _run(capsys, "tokens", "validate", "--secret-key", f"file://{key}",
                                token)
    assert status == 0
    assert json.loads(validated)["sub"] == "alice"


def test_base64_secret_key_as_a_data_url(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    status, encoded, _ = _run(capsys, "tokens", "create-secret-key", "--base64", "-a", "HS512")
    assert status == 0
    assert len(base64.b64decode(encoded)) == 64
    source = f"data:;base64,{encoded}"
    status, token, _ = _run(capsys, "tokens", "create", "--secret-key", source, "-s", "bob",
                            "-a", "HS512")
    assert status == 0
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    status, validated, _ = _run(capsys, "tokens", "validate", "--secret-key", source,
                                "--token-file", str(token_file))
    assert status == 0
    assert json.loads(validated) == {"sub": "bob"}


@pytest.mark.parametrize("alg", ["RS256", "ES384"])
def test_key_pair_round_trip(alg: str, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    private, public = tmp_path / "private.key", tmp_path / "public.key"
    assert _run(capsys, "tokens", "create-key-pair", "--output-private-key", str(private),
                "--output-public-key", str(public), "-a", alg)[0] == 0
    assert public.read_bytes()[:1] == b"\x30"  # DER: a SEQUENCE
    status, token, _ = _run(capsys, "tokens", "create", "--private-key", str(private),
                            "-s", "svc")
    assert status == 0
    status, shown, _ = _run(capsys, "tokens", "show", token)
    assert json.loads(shown.splitlines()[0]) == {"alg": alg}
    status, validated, _ = _run(capsys, "tokens", "validate", "--public-key", str(public), token)
    assert (status, json.loads(validated)) == (0, {"sub": "svc"})


def test_invalid_tokens_exit_1_with_the_reason(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    key, other = tmp_path / "a.key", tmp_path / "b.key"
    for path in (key, other):
        assert _run(capsys, "tokens", "create-secret-key", "-o", str(path))[0] == 0
    _, token, _ = _run(capsys, "tokens", "create", "--secret-key", str(key), "-s", "x")
    status, _, err = _run(capsys, "tokens", "validate", "--secret-key", str(other), token)
    assert (status, "signature does not verify" in err) == (1, True)
    status, _, err = _run(capsys, "tokens", "validate", "--secret-key", str(key), "nonsense")
    assert (status, "3 dot-separated parts" in err) == (1, True)
    status, _, err = _run(capsys, "tokens", "validate", "--secret-key",
                          str(tmp_path / "missing.key"), token)
    assert (status, "cannot read key file" in err) == (1, True)
    status, _, err = _run(capsys, "tokens", "create", "--private-key", str(key), "-s", "x")
    assert (status, "not a DER or PEM private key" in err) == (1, True)


def test_expiry_times() -> None:
    assert parse_expiry_s("90") == 90
    assert parse_expiry_s("10m") == 600
    assert parse_expiry_s("2d") == 172800
    assert parse_expiry_s("1y") == 365 * 86400
    for bad in ("0", "-1h", "1x", "h"):
        with pytest.raises(argparse.ArgumentTypeError, match="invalid expiry time"):
            parse_expiry_s(bad)
