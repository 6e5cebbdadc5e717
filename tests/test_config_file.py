"""`magnetar standalone --config-file / MAGNETAR_<key> / --print-config`: a real broker takes
its ports and limits from a Pulsar-style file and the environment; precedence, units, empty
values, unknown keys; every invalid input is one line on stderr with exit status 2."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from magnetar.broker._config import BrokerConfig
from magnetar.broker.cli._config_file import build, from_file, merge
from magnetar.broker.cli._settings import SETTINGS, STORAGE, TLS
from magnetar.broker.cli._standalone import StandaloneOptions
from magnetar.broker.security._tls import TlsOptions
from magnetar.codec import pb
from magnetar.storage import StorageConfig
from tests.interop import HOST, REPO_ROOT, STARTUP_DEADLINE_S, RawClient, free_port, wait_for

CLI_DEADLINE_S = 60.0
STOP_DEADLINE_S = 20.0
MiB = 1024 * 1024
# StorageConfig fields no key sets: derived (journal_record_bytes_max follows the entry size),
# fixed by the on-disk format, or for the simulation harness only.
STORAGE_NOT_SETTINGS = {"journal_record_bytes_max", "journal_alignment_bytes",
                        "journal_prealloc_bytes", "background_threads",
                        "skip_corrupt_journal_segments"}


def _magnetar(*argv: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith("MAGNETAR_")}
    return subprocess.run([sys.executable, "-m", "magnetar.broker.cli", *argv], capture_output=True,
                          text=True, check=False, timeout=CLI_DEADLINE_S, cwd=REPO_ROOT,
                          env=clean | (env or {}))


def _conf(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "standalone.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def _printed(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert (done.returncode, "Traceback" in done.stderr) == (0, False), done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines()
                if line and not line.startswith("#"))


def test_a_broker_takes_ports_and_limits_from_the_file_and_the_environment(
        tmp_path: Path) -> None:
    port, http_port = free_port(), free_port()
    conf = _conf(tmp_path, "# a Pulsar standalone.conf, trimmed", "",
                 f"dataDir={tmp_path / 'data'}", f"bindAddress={HOST}",
                 f"brokerServicePort={port}", f"webServicePort={http_port}",
                 "advertisedAddress=localhost", "maxMessageSize=1000000",
                 "zookeeperServers=", "managedLedgerCacheSizeMB=64", "journalSyncData=false")
    log_path = tmp_path / "broker.log"
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith("MAGNETAR_")}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "magnetar.broker.cli", "standalone", "--config-file", str(conf)],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
            env=clean | {"MAGNETAR_maxMessageSize": "2048", "PYTHONUNBUFFERED": "1"})
    try:
        def ready() -> bool:
            assert process.poll() is None, log_path.read_text()
            return "Magnetar standalone ready" in log_path.read_text()

        wait_for(ready, STARTUP_DEADLINE_S, "the broker to start")
        client = RawClient(port)
        try:
            assert client.handshake().max_message_size == 2048  # the environment beat the file
            reply = client.request(pb.CommandLookupTopic(
                topic="persistent://public/default/x", request_id=1),
                pb.BaseCommand.LOOKUP_RESPONSE)
            assert reply.brokerServiceUrl == f"pulsar://localhost:{port}"
        finally:
            client.close()
        with urllib.request.urlopen(f"http://{HOST}:{http_port}/admin/v2/tenants",
                                    timeout=10) as answer:
            assert "public" in json.loads(answer.read())
    finally:
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=STOP_DEADLINE_S) == 0
    warnings = [line for line in log_path.read_text().splitlines() if "unknown key" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith(f"{conf}: ignoring 2 unknown keys: zookeeperServers, "
                                "managedLedgerCacheSizeMB")


def test_print_config_lists_every_setting_with_default_unit_and_meaning(
        tmp_path: Path) -> None:
    done = _magnetar("standalone", "--print-config")
    printed = _printed(done)
    assert list(printed) == [setting.key for setting in SETTINGS]
    assert done.stderr == ""
    text = done.stdout
    block = text[:text.index("\nmaxMessageSize=")].rsplit("\n\n", 1)[1]
    assert block == ("# Largest message (or batch) a producer may send.\n"
                     "# Unit: bytes. Allowed: at least 1. Default: 5242880.")
    assert printed["maxMessageSize"] == "5242880"
    assert printed["managedLedgerMaxSizePerLedgerMbytes"] == "2048"  # Pulsar's unit, MiB
    assert printed["journalSyncData"] == "true"
    assert text.count("Default: ") == len(SETTINGS)


def test_print_config_output_is_a_config_file_giving_the_same_settings(tmp_path: Path) -> None:
    first = _magnetar("standalone", "--print-config", "--port", "7000",
                      env={"MAGNETAR_maxMessageSize": "4096"})
    conf = tmp_path / "printed.conf"
    conf.write_text(first.stdout)
    again = _magnetar("standalone", "--print-config", "--config-file", str(conf))
    assert _printed(again) == _printed(first)
    assert _printed(again)["brokerServicePort"] == "7000"
    assert f"Set by {conf}:" in again.stdout


@pytest.mark.parametrize(("use_env", "use_config", "use_flag", "port", "size"), [
    (False, False, False, "6651", "1000"),
    (True, False, False, "6652", "2000"),
    (True, True, False, "6653", "3000"),
    (True, True, True, "6654", "3000"),
    (False, False, True, "6654", "1000"),
])
def test_precedence_is_file_then_environment_then_config_then_flags(
        tmp_path: Path, use_env: bool, use_config: bool, use_flag: bool, port: str,
        size: str) -> None:
    conf = _conf(tmp_path, "brokerServicePort=6651", "maxMessageSize=1000")
    argv = ["standalone", "--print-config", "--config-file", str(conf)]
    if use_config:
        argv += ["--config", "brokerServicePort=6653", "--config", "maxMessageSize=3000"]
    if use_flag:
        argv += ["--port", "6654"]
    env = {"MAGNETAR_brokerServicePort": "6652", "MAGNETAR_maxMessageSize": "2000"}
    printed = _printed(_magnetar(*argv, env=env if use_env else None))
    assert (printed["brokerServicePort"], printed["maxMessageSize"]) == (port, size)


def test_an_empty_value_means_the_default(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "maxMessageSize=1000", "maxMessageSize=", "clusterName=",
                 "brokerDeduplicationEnabled=true")
    printed = _printed(_magnetar("standalone", "--print-config", "--config-file", str(conf),
                                 env={"MAGNETAR_brokerDeduplicationEnabled": ""}))
    assert printed["maxMessageSize"] == "5242880"
    assert printed["clusterName"] == "standalone"
    assert printed["brokerDeduplicationEnabled"] == "true"  # an empty variable: no override


def test_keys_in_other_units_set_the_fields_in_theirs(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "dataDir=/d", "managedLedgerMaxSizePerLedgerMbytes=10",
                 "managedLedgerMaxLedgerRolloverTimeMinutes=3", "brokerShutdownTimeoutMs=2500",
                 "dbStorage_writeCacheMaxSizeMb=32", "journalSyncData=false",
                 "journalSyncIntervalMs=50", "tlsCertificateFilePath=/c",
                 "tlsKeyFilePath=/k", "brokerServicePortTls=6651",
                 "superUserRoles=admin, ops")
    options = build(merge(from_file(str(conf))))
    assert options.data_dir == "/d"
    assert options.config.managed_ledger_max_size_per_ledger_bytes == 10 * MiB
    assert options.config.managed_ledger_max_ledger_rollover_time_s == 180
    assert options.config.superuser_roles == ("admin", "ops")
    assert options.shutdown_grace_s == 2.5
    storage = options.storage_config()
    assert (storage.write_cache_bytes_max, storage.journal_sync,
            storage.journal_sync_interval_ms) == (32 * MiB, False, 50)
    assert options.tls == TlsOptions("/c", "/k")
    assert options.tls_port == 6651


def test_a_larger_entry_size_lets_a_larger_message_size_start(tmp_path: Path) -> None:
    conf = _conf(tmp_path, "dataDir=/d", "maxMessageSize=10485760",
                 "entrySizeBytesMax=11534336", "dbStorage_writeCacheMaxSizeMb=64")
    storage = build(merge(from_file(str(conf)))).storage_config()
    assert storage.entry_size_bytes_max == 11534336
    assert storage.journal_record_bytes_max >= storage.entry_size_bytes_max + 64


def test_every_field_has_one_setting() -> None:
    keys = [setting.key for setting in SETTINGS]
    assert len(keys) == len(set(keys))
    fields = {(setting.target, setting.field) for setting in SETTINGS}
    assert len(fields) == len(SETTINGS)
    by_target: dict[str, set[str]] = {}
    for target, field in fields:
        by_target.setdefault(target, set()).add(field)
    names = {each.name for each in dataclasses.fields(BrokerConfig)}
    assert by_target["broker"] == names
    names = {each.name for each in dataclasses.fields(StandaloneOptions)}
    assert by_target["standalone"] == names - {"config", "tls", "storage"}
    assert by_target[TLS] == {each.name for each in dataclasses.fields(TlsOptions)}
    names = {each.name for each in dataclasses.fields(StorageConfig)}
    assert by_target[STORAGE] == names - STORAGE_NOT_SETTINGS
    # The broker's ranges live in SETTING_RANGES alone.
    assert all(s.low is None and s.high is None for s in SETTINGS if s.target == "broker")


BAD_FILES = [
    (("maxMessageSize=big",), "{conf}:2: maxMessageSize takes a number, not 'big'"),
    (("maxMessageSize=0",), "{conf}:2: maxMessageSize must be at least 1, not 0"),
    (("brokerServicePort=70000",),
     "{conf}:2: brokerServicePort must be from 0 to 65535, not 70000"),
    (("keepAliveIntervalSeconds=inf",),
     "{conf}:2: keepAliveIntervalSeconds takes a finite number, not 'inf'"),
    (("managedLedgerMaxSizePerLedgerMbytes=0",),
     "{conf}:2: managedLedgerMaxSizePerLedgerMbytes must be at least 1, not 0"),
    (("entryLogCompactionLiveRatioMin=1.5",),
     "{conf}:2: entryLogCompactionLiveRatioMin must be from 0 to 1, not 1.5"),
    (("brokerDeduplicationEnabled=maybe",),
     "{conf}:2: brokerDeduplicationEnabled takes true or false, not 'maybe'"),
    (("schemaCompatibilityStrategy=SOMETIMES",),
     "{conf}:2: schemaCompatibilityStrategy must be one of ALWAYS_INCOMPATIBLE, "
     "ALWAYS_COMPATIBLE, BACKWARD, FORWARD, FULL, BACKWARD_TRANSITIVE, FORWARD_TRANSITIVE, "
     "FULL_TRANSITIVE, not 'SOMETIMES'"),
    (("advertisedUrl=http://h:1",),
     "{conf}:2: advertisedUrl must be pulsar://HOST:PORT, not 'http://h:1'"),
    (("", "brokerServicePort 6650"),
     "{conf}:3: expected key=value, not 'brokerServicePort 6650'"),
    (("=6650",), "{conf}:2: expected key=value, not '=6650'"),
    (("entrySizeBytesMax=20971520", "dbStorage_writeCacheMaxSizeMb=16"),
     "dbStorage_writeCacheMaxSizeMb must hold two entries of entrySizeBytesMax (20971520 "
     "bytes): at least 40, not 16"),
    (("tlsCertificateFilePath=/c",),
     "TLS needs both --tls-cert-file and --tls-key-file (tlsCertificateFilePath, "
     "tlsKeyFilePath)"),
]


@pytest.mark.parametrize(("lines", "line", "print_config"),
                         [(*case, index % 3 == 0) for index, case in enumerate(BAD_FILES)])
def test_a_bad_file_is_one_line_and_status_2(tmp_path: Path, lines: tuple[str, ...],
                                             line: str, print_config: bool) -> None:
    """With --print-config too (every third case): it validates what it prints."""
    conf = _conf(tmp_path, "# settings", *lines)
    data_dir = tmp_path / "data"
    flag = ["--print-config"] if print_config else []
    done = _magnetar("standalone", "--data-dir", str(data_dir), "--port", "0", "--http-port",
                     "0", "--config-file", str(conf), *flag)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"magnetar standalone: {line.format(conf=conf)}\n"
    assert not data_dir.exists()


@pytest.mark.parametrize(("make", "reason"), [
    (lambda path: None, "No such file or directory"),
    (lambda path: path.mkdir(), "Is a directory"),
    (lambda path: path.write_bytes(b"maxMessageSize=\xff\xfe\n"), "not UTF-8 text"),
])
def test_a_missing_or_unreadable_file_is_one_line(tmp_path: Path, make: object,
                                                  reason: str) -> None:
    conf = tmp_path / "standalone.conf"
    make(conf)  # type: ignore[operator]
    done = _magnetar("standalone", "--data-dir", str(tmp_path / "data"), "--config-file",
                     str(conf))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"magnetar standalone: cannot read --config-file {conf}: {reason}\n"


@pytest.mark.parametrize(("argv", "env", "line"), [
    ((), {"MAGNETAR_maxMessageSize": "-1"},
     "environment variable MAGNETAR_maxMessageSize: maxMessageSize must be at least 1, "
     "not -1"),
    ((), {"MAGNETAR_journalSyncData": "sometimes"},
     "environment variable MAGNETAR_journalSyncData: journalSyncData takes true or false, "
     "not 'sometimes'"),
    (("--config", "maxMesageSize=5"), {},
     "not a broker setting: 'maxMesageSize=5'; did you mean maxMessageSize?"),
    (("--config", "gcWaitTime=0"), {}, "gcWaitTime must be at least 1, not 0"),
])
def test_bad_environment_and_config_items_are_one_line(
        tmp_path: Path, argv: tuple[str, ...], env: dict[str, str], line: str) -> None:
    data_dir = tmp_path / "data"
    done = _magnetar("standalone", "--data-dir", str(data_dir), *argv, env=env)
    assert (done.returncode, done.stderr) == (2, f"magnetar standalone: {line}\n")
    assert not data_dir.exists()


def test_a_data_directory_is_needed_from_somewhere(tmp_path: Path) -> None:
    done = _magnetar("standalone", "--port", "0")
    assert (done.returncode, done.stderr) == (
        2, "magnetar standalone: no data directory: give --data-dir, dataDir in the "
        "--config-file or MAGNETAR_dataDir\n")
    printed = _printed(_magnetar("standalone", "--print-config",
                                 env={"MAGNETAR_dataDir": str(tmp_path)}))
    assert printed["dataDir"] == str(tmp_path)


def test_a_key_in_the_wrong_case_in_the_environment_is_warned_about() -> None:
    done = _magnetar("standalone", "--print-config", env={"MAGNETAR_MAXMESSAGESIZE": "5"})
    assert _printed(done)["maxMessageSize"] == "5242880"
    assert done.stderr.count("\n") == 1
    assert ("ignoring environment variable MAGNETAR_MAXMESSAGESIZE: keys are case-sensitive; "
            "did you mean MAGNETAR_maxMessageSize?") in done.stderr
