"""The `magnetar` command line: help texts, and the storage tools on a real directory."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from magnetar.broker._errors import ConfigurationError
from magnetar.broker.cli import build_parser, main
from magnetar.broker.cli._standalone import config_with_overrides
from magnetar.storage import Storage

T = TypeVar("T")


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
    done = subprocess.run([sys.executable, "-m", "magnetar.broker.cli", "--help"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0
    assert "crashtest" in done.stdout


# -- wrong arguments: one clear line on stderr, never a traceback ---------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]
CLI_DEADLINE_S = 60  # a generous bound for one `magnetar` run in a subprocess
# Were a refusal to regress, the broker would start: on free ports, in the test's directory.
STANDALONE = ["standalone", "--data-dir", "{tmp}", "--port", "0", "--http-port", "0"]
SHORT_NAME_RULE = ("it should be in the format of <tenant>/<namespace>/<topic> or <topic>")


def _magnetar(*argv: str) -> subprocess.CompletedProcess[str]:
    """`magnetar ARGV` in a subprocess (this checkout's code), its output captured."""
    return subprocess.run([sys.executable, "-m", "magnetar.broker.cli", *argv], capture_output=True,
                          text=True, check=False, timeout=CLI_DEADLINE_S, cwd=REPO_ROOT)


def _closed_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.parametrize(("argv", "code", "line"), [
    (["topics", "create", "acme//x"], 2,
     f"magnetar topics create: Invalid short topic name 'acme//x', {SHORT_NAME_RULE}"),
    (["namespaces", "create", "acme"], 2,
     "magnetar namespaces create: Invalid namespace format. expected <tenant>/<namespace> or "
     "<tenant>/<cluster>/<namespace> but got: acme"),
    (["standalone", "--data-dir", "{tmp}/data", "--port", "70000"], 2,
     "magnetar standalone: argument --port: invalid port 70000: must be from 0 (any free "
     "port) to 65535 (see magnetar standalone --help)"),
    (["standalone", "--data-dir", "{tmp}/data", "--config", "max_message_size_bytes=-5"], 2,
     "magnetar standalone: max_message_size_bytes must be at least 1, not -5"),
])
def test_the_issue_s_commands_print_one_line(argv: list[str], code: int, line: str,
                                             tmp_path: Path) -> None:
    done = _magnetar(*[arg.format(tmp=tmp_path) for arg in argv])
    assert "Traceback" not in done.stderr
    assert (done.returncode, done.stderr) == (code, line + "\n")
    assert not (tmp_path / "data").exists()  # refused before the data directory is touched


@pytest.mark.parametrize(("argv", "code", "line"), [
    ([*STANDALONE, "--port", "-1"], 2,
     "magnetar standalone: argument --port: invalid port -1: must be from 0 (any free port) "
     "to 65535 (see magnetar standalone --help)"),
    ([*STANDALONE, "--http-port", "http"], 2,
     "magnetar standalone: argument --http-port: invalid port 'http': not a number (see "
     "magnetar standalone --help)"),
    ([*STANDALONE, "--tls-port", "65536"], 2,
     "magnetar standalone: argument --tls-port: invalid port 65536: must be from 0 (any free "
     "port) to 65535 (see magnetar standalone --help)"),
    ([*STANDALONE, "--max-pending-sends", "0"], 2,
     "magnetar standalone: argument --max-pending-sends: invalid number 0: must be at least 1 "
     "(see magnetar standalone --help)"),
    ([*STANDALONE, "--config", "max_mesage_size_bytes=5"], 2,
     "magnetar standalone: not a broker setting: 'max_mesage_size_bytes=5'; did you mean "
     "max_message_size_bytes?"),
    ([*STANDALONE, "--config", "nonsense"], 2,
     "magnetar standalone: not a broker setting: 'nonsense' (expected name=value)"),
    ([*STANDALONE, "--config", "default_num_partitions=0"], 2,
     "magnetar standalone: default_num_partitions must be at least 1, not 0"),
    ([*STANDALONE, "--config", "retention_check_interval_s=nan"], 2,
     "magnetar standalone: retention_check_interval_s takes a number, not 'nan'"),
    ([*STANDALONE, "--config", "token_allowed_clock_skew_s=inf"], 2,
     "magnetar standalone: token_allowed_clock_skew_s takes a finite number, not 'inf'"),
    ([*STANDALONE, "--config", "allow_auto_topic_creation_type=some"], 2,
     "magnetar standalone: allow_auto_topic_creation_type must be one of non-partitioned, "
     "partitioned, not 'some'"),
    ([*STANDALONE, "--keepalive-interval-s", "nan"], 2,
     "magnetar standalone: argument --keepalive-interval-s: invalid time 'nan': must be a "
     "number of seconds, 0 or more (see magnetar standalone --help)"),
    ([*STANDALONE, "--shutdown-grace-s", "-1"], 2,
     "magnetar standalone: argument --shutdown-grace-s: invalid time '-1': must be a number "
     "of seconds, 0 or more (see magnetar standalone --help)"),
    ([*STANDALONE, "--advertised-url", "broker.example.test"], 2,
     "magnetar standalone: argument --advertised-url: invalid URL 'broker.example.test': "
     "expected pulsar://HOST:PORT (see magnetar standalone --help)"),
    ([*STANDALONE, "--advertised-url-tls", "pulsar://h:6651"], 2,
     "magnetar standalone: argument --advertised-url-tls: invalid URL 'pulsar://h:6651': "
     "expected pulsar+ssl://HOST:PORT (see magnetar standalone --help)"),
    (["crashtest", "--data-dir", "{tmp}", "--iterations", "0"], 2,
     "magnetar crashtest: argument --iterations: invalid number 0: must be at least 1 (see "
     "magnetar crashtest --help)"),
    (["produce", "a//b", "-m", "x", "--url", "pulsar://127.0.0.1:1"], 2,
     f"magnetar produce: Invalid short topic name 'a//b', {SHORT_NAME_RULE}"),
    (["consume", "persistent://a/b", "-s", "s", "--url", "pulsar://127.0.0.1:1"], 2,
     "magnetar consume: Invalid topic name: persistent://a/b"),
    (["topics", "stats", "t", "--admin-url", "127.0.0.1:8080"], 1,
     "magnetar topics stats: invalid --admin-url '127.0.0.1:8080': expected http://HOST:PORT "
     "or https://HOST:PORT"),
    (["topics", "stats", "t", "--admin-url", "http://[::1"], 1,
     "magnetar topics stats: invalid --admin-url 'http://[::1': Invalid IPv6 URL"),
    (["topics", "skip", "t", "-s", "s", "-n", "-5"], 2,
     "magnetar topics skip: argument -n/--count: invalid count -5: must be at least 1 (see "
     "magnetar topics skip --help)"),
    (["topics", "expire-messages", "t", "-s", "s", "-t", "-5"], 2,
     "magnetar topics expire-messages: argument -t/--expireTime: invalid time '-5': must not "
     "be negative (see magnetar topics expire-messages --help)"),
    (["topics", "reset-cursor", "t", "-s", "s", "-m", "abc"], 2,
     "magnetar topics reset-cursor: invalid message id 'abc': use latest, earliest or "
     "ledger:entry"),
    (["topics", "create-subscription", "t", "-s", "s", "-m", "1:x"], 2,
     "magnetar topics create-subscription: invalid message id '1:x': use latest, earliest or "
     "ledger:entry"),
    (["topics", "list", "public/default", "--admin-url", "https://127.0.0.1:1",
      "--tls-trust-certs-file", "{tmp}/missing.pem"], 1,
     "magnetar topics list: cannot use --tls-trust-certs-file {tmp}/missing.pem: No such file "
     "or directory"),
    (["produce", "t", "-m", "x", "--url", "pulsar+ssl://127.0.0.1:1",
      "--tls-trust-certs-file", "{tmp}/missing.pem"], 1,
     "magnetar: cannot read --tls-trust-certs-file {tmp}/missing.pem: No such file or "
     "directory"),
    (["namespaces", "set-retention", "acme", "-t", "1h", "-s", "1M"], 2,
     "magnetar namespaces set-retention: Invalid namespace format. expected "
     "<tenant>/<namespace> or <tenant>/<cluster>/<namespace> but got: acme"),
])
def test_wrong_arguments_print_one_line(argv: list[str], code: int, line: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main([arg.format(tmp=tmp_path) for arg in argv])
    except SystemExit as exit_info:  # argparse's refusals
        status = exit_info.code  # type: ignore[assignment]
    assert (status, capsys.readouterr().err) == (code, line.format(tmp=tmp_path) + "\n")


def test_an_unreachable_admin_api_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = _closed_url()
    # `tenants create` asks the API for its clusters before the request itself.
    assert main(["tenants", "create", "acme", "--admin-url", url]) == 1
    assert capsys.readouterr().err == (f"magnetar tenants create: cannot reach the admin API at "
                                       f"{url}: [Errno 111] Connection refused\n")


class _HtmlPage(http.server.BaseHTTPRequestHandler):
    """Any web server that is not the admin API: 200 with an HTML page."""

    def do_GET(self) -> None:
        body = b"<html><body>a web page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_admin_url_that_is_not_the_admin_api_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _HtmlPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["topics", "list", "public/default", "--admin-url", url]) == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert capsys.readouterr().err == (
        f"magnetar topics list: {url} is not the admin API: it answered "
        f"{url}/admin/v2/persistent/public/default with something other than JSON\n")


def _last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    return stderr.rstrip("\n").splitlines()[-1]


def test_standalone_refuses_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    done = _magnetar("standalone", "--data-dir", str(tmp_path / "file"), "--port", "0",
                     "--http-port", "0")
    assert done.returncode == 1
    assert _last_line(done.stderr).endswith(
        f"cannot start: --data-dir {tmp_path / 'file'} is not a directory")


def test_standalone_refuses_a_locked_data_dir(tmp_path: Path) -> None:
    with Storage.open(tmp_path):
        done = _magnetar("standalone", "--data-dir", str(tmp_path), "--port", "0",
                         "--http-port", "0")
    assert done.returncode == 1
    assert _last_line(done.stderr).endswith(
        f"cannot start: data directory {tmp_path} is locked by process {os.getpid()}")


def test_standalone_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _magnetar("standalone", "--data-dir", str(tmp_path), "--port", str(port),
                         "--http-port", "0")
    assert done.returncode == 1
    assert "address already in use" in _last_line(done.stderr)
    assert f"('127.0.0.1', {port})" in _last_line(done.stderr)


def _ranged_settings() -> list[tuple[str, float]]:
    try:
        from magnetar.broker._config import SETTING_RANGES
    except ImportError:  # before the settings had ranges: every setting failed the same way
        return [("max_message_size_bytes", 1)]
    return sorted((name, low) for name, (low, _) in SETTING_RANGES.items())


def test_standalone_names_a_host_that_does_not_resolve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from magnetar.broker.cli._standalone import StandaloneOptions, run_standalone

    def unknown(host: object, *args: object, **kwargs: object) -> object:
        # What the resolver answers for an unknown name (no DNS query made by the test).
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    options = StandaloneOptions(data_dir=str(tmp_path), host="broker.invalid", port=0,
                                http_port=0)
    assert run_standalone(options) == 1
    assert caplog.messages[-1] == "cannot start: --host broker.invalid: Name or service not known"


@pytest.mark.parametrize(("name", "low"), _ranged_settings())
def test_every_ranged_setting_names_itself_and_its_range(name: str, low: float) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{name} must be at least {low}, not -?\d"):
        config_with_overrides([f"{name}={int(low) - 1}"])
    config_with_overrides([f"{name}={int(low)}"])  # the bound itself is allowed


def _corrupt_journal_mid_segment(data_dir: Path, entries: int = 30, victim: int = 10) -> int:
    """Acknowledged entries that live only in the journal (a crash before any checkpoint),
    then one byte flipped inside the payload of entry `victim`'s record. Returns the
    damaged record's offset."""
    from magnetar.storage import StorageConfig
    from magnetar.storage._journal_format import RecordType, ScanResult, SegmentHeader, scan_segment

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
        [sys.executable, "-m", "magnetar.broker.cli", "standalone", "--data-dir", str(data_dir),
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
    from magnetar.storage import StorageConfig

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


def test_every_number_setting_has_a_range() -> None:
    """A new int/float setting gets its range in `broker._config.SETTING_RANGES`, so
    `--config NAME=-5` is refused with one line instead of misbehaving."""
    import typing

    from magnetar.broker._config import SETTING_RANGES, BrokerConfig

    numbers = {name for name, kind in typing.get_type_hints(BrokerConfig).items()
               if kind in (int, float)}
    assert numbers - set(SETTING_RANGES) == set(), "add these to SETTING_RANGES"
    assert set(SETTING_RANGES) <= numbers


def _when_standalone_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            probe: Callable[[], T]) -> T:
    """What `probe` sees once `magnetar standalone` is about to serve (its server replaced by
    the probe); the interpreter state the command sets (GIL switch interval, GC thresholds,
    frozen objects) is restored afterwards."""
    import gc

    from magnetar.broker.cli import _standalone

    seen: list[T] = []

    def serve(options: object) -> int:
        seen.append(probe())
        return 0

    monkeypatch.setattr(_standalone, "run_standalone", serve)
    before, threshold = sys.getswitchinterval(), gc.get_threshold()
    try:
        assert main(["standalone", "--data-dir", str(tmp_path)]) == 0
    finally:
        sys.setswitchinterval(before)
        gc.set_threshold(*threshold)
        gc.unfreeze()
    assert len(seen) == 1
    return seen[0]


def test_standalone_freezes_what_is_loaded_before_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`magnetar standalone` moves the objects loaded before it serves out of the cyclic GC's
    full collections (`gc.freeze`), which pause every thread while they walk them."""
    import gc

    gc.unfreeze()  # what an earlier in-process `main(["standalone", ...])` froze
    assert gc.get_freeze_count() == 0
    assert _when_standalone_serves(tmp_path, monkeypatch, gc.get_freeze_count) > 10_000


def test_standalone_shortens_the_gil_switch_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`magnetar standalone` serves with `GIL_SWITCH_INTERVAL_S`, not Python's 5 ms: a thread
    waiting for the GIL (the journal's, the event loop) forces a switch that much sooner."""
    from magnetar.broker.cli import _standalone

    before = sys.getswitchinterval()
    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL_S)
    try:
        interval = _when_standalone_serves(tmp_path, monkeypatch, sys.getswitchinterval)
    finally:
        sys.setswitchinterval(before)
    assert interval == pytest.approx(_standalone.GIL_SWITCH_INTERVAL_S)
    assert _standalone.GIL_SWITCH_INTERVAL_S < PYTHON_SWITCH_INTERVAL_S


def test_standalone_raises_the_young_gc_threshold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`magnetar standalone` serves with the cyclic GC's first threshold at
    `GC_YOUNG_THRESHOLD`, not Python's 700, and its older thresholds as they were: young
    collections, which hold the GIL, come several times less often."""
    import gc

    from magnetar.broker.cli import _standalone

    threshold = gc.get_threshold()
    gc.set_threshold(PYTHON_GC_THRESHOLD[0], threshold[1], threshold[2])
    try:
        seen = _when_standalone_serves(tmp_path, monkeypatch, gc.get_threshold)
    finally:
        gc.set_threshold(*threshold)
    assert seen == (_standalone.GC_YOUNG_THRESHOLD, threshold[1], threshold[2])
    assert PYTHON_GC_THRESHOLD[0] < _standalone.GC_YOUNG_THRESHOLD


PYTHON_GC_THRESHOLD = (700, 10, 10)  # Python's default


PYTHON_SWITCH_INTERVAL_S = 0.005  # Python's default


def test_standalone_serves_before_it_imports_the_admin_server_and_token_auth(
        tmp_path: Path) -> None:
    """What `magnetar standalone` imports before its binary port serves holds neither the
    admin HTTP server's modules (aiohttp, prometheus_client: imported on a worker thread once
    the port serves), nor token authentication's (jwt, cryptography: only when enabled), nor
    the other commands' parsers."""
    code = ("import sys\n"
            "from magnetar.broker.cli import _main, _standalone\n"
            "_standalone.run_standalone = lambda options: 0\n"
            f"assert _main.main(['standalone', '--data-dir', {str(tmp_path)!r}]) == 0\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'aiohttp', 'prometheus_client', 'jwt', 'cryptography'}), "
            "'magnetar.broker.cli._admin_cli' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=CLI_DEADLINE_S, check=True)
    assert done.stdout.strip() == "[] False"
