"""Every example in README.md runs as written.

The fenced ```python blocks run in a subprocess, in a fresh directory, against a private
standalone broker: the one substitution is the service URL, `pulsar://127.0.0.1:6650` becomes
the fixture broker's (its port is free, not 6650, which may be in use). The ```sh blocks run
where practical: `make` lines as dry runs (`make -n TARGET`: the target exists and would run;
really running them would build a virtualenv or the whole suite), the rest with bash in a
fresh directory, where `magnetar` is this checkout's CLI and a final `magnetar standalone` is
started on free ports (its 6651 and 8443 rewritten, --port and --http-port added), checked
with the official client, and stopped with SIGTERM. Files an example takes as given
(`server.pem`, `server.key`) are made by the test. A hanging example fails when its deadline
passes.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pulsar
import pytest

from . import HOST, REPO_ROOT, STARTUP_DEADLINE_S, STOP_DEADLINE_S, free_port, wait_for
from .conftest import OPERATION_TIMEOUT_S, BrokerFactory
from .security import make_pki

pytestmark = pytest.mark.interop

README = REPO_ROOT / "README.md"
README_URL = "pulsar://127.0.0.1:6650"
EXAMPLE_DEADLINE_S = 180.0  # a README example that takes longer hangs (a Spark example starts
#                            a JVM: over 60 s on a loaded 2-core machine)
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(language: str) -> list[str]:
    return [code for lang, code in _BLOCK.findall(README.read_text()) if lang == language]


def _commands(block: str) -> list[str]:
    """The block's commands, continuation lines joined, comments and blank lines left out."""
    joined = block.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(line.split(" #", 1)[0].strip())
    return commands


def _env() -> dict[str, str]:
    """This checkout's packages first, wherever the example runs."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(REPO_ROOT) + (os.pathsep + path if path else ""),
                PYTHONUNBUFFERED="1")


def _run(argv: list[str], cwd: Path, what: str) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True,
                              timeout=EXAMPLE_DEADLINE_S, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} did not finish within {EXAMPLE_DEADLINE_S} s "
                             "(it hangs)") from None
    assert "Traceback" not in done.stderr, f"{what}:\n{done.stderr}"
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done


def test_the_readme_has_the_examples_this_file_runs() -> None:
    assert len(_blocks("python")) == 5
    assert len(_blocks("sh")) == 5
    assert {lang for lang, _ in _BLOCK.findall(README.read_text())} == {"python", "sh"}


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_example_runs_as_written(index: int, broker_factory: BrokerFactory,
                                        tmp_path: Path) -> None:
    code = _blocks("python")[index]
    if README_URL in code:
        code = code.replace(README_URL, broker_factory().url)
    _run([sys.executable, "-c", code], tmp_path, f"README python example {index + 1}")


@pytest.mark.parametrize("index", range(len(_blocks("sh"))))
def test_sh_example_runs_as_written(index: int, tmp_path: Path) -> None:
    commands = _commands(_blocks("sh")[index])
    script: list[str] = []
    for command in commands:
        words = shlex.split(command)
        if words[0] == "make":
            _run(["make", "-n", *words[1:]], REPO_ROOT, f"README: {command}")
        else:
            script.append(command)
    if script:
        _run_script(script, tmp_path)


def _run_script(commands: list[str], directory: Path) -> None:
    """Run the commands with bash; a final `magnetar standalone` is started on free ports,
    used with the official client and stopped."""
    prelude = ['set -euo pipefail',
               'magnetar() { "$MAGNETAR_PYTHON" -m magnetar.broker.cli "$@"; }',
               'python() { "$MAGNETAR_PYTHON" "$@"; }']
    # the README's commands run from the repository root; these run in a scratch directory
    commands = [command.replace("python tools/", f"python {REPO_ROOT}/tools/")
                for command in commands]
    *before, last = commands
    if not last.startswith("magnetar standalone"):
        _bash([*prelude, *commands], directory)
        return
    make_pki(directory)  # server.pem, server.key (and the CA that signed them: ca.pem)
    ports = {"6651": free_port(), "8443": free_port()}
    for given, port in ports.items():
        last = re.sub(rf"\b{given}\b", str(port), last)
    plain_port = free_port()
    broker = ('exec "$MAGNETAR_PYTHON" -m magnetar.broker.cli standalone'
              + last.removeprefix("magnetar standalone")
              + f" --port {plain_port} --http-port {free_port()}")
    log = (directory / "broker.log").open("wb")
    process = subprocess.Popen(["bash", "-c", "\n".join([*prelude, *before, broker])],
                               cwd=directory, env=dict(_env(), MAGNETAR_PYTHON=sys.executable),
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        tls_port = ports["6651"]
        wait_for(lambda: _accepting(process, tls_port, directory), STARTUP_DEADLINE_S,
                 f"the README's broker on port {tls_port}")
        _produce_over_tls_with_a_token(directory, tls_port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_DEADLINE_S) == 0, _tail(directory)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_DEADLINE_S)
        log.close()


def _bash(lines: list[str], directory: Path) -> None:
    done = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=directory,
                          env=dict(_env(), MAGNETAR_PYTHON=sys.executable), capture_output=True,
                          text=True, timeout=EXAMPLE_DEADLINE_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _accepting(process: subprocess.Popen[bytes], port: int, directory: Path) -> bool:
    import socket

    if process.poll() is not None:
        raise AssertionError(f"the README's broker exited with {process.returncode}:\n"
                             f"{_tail(directory)}")
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(directory: Path) -> str:
    return "\n".join((directory / "broker.log").read_text(errors="replace").splitlines()[-20:])


def _produce_over_tls_with_a_token(directory: Path, tls_port: int) -> None:
    """A token from the README's secret key, over the README's TLS listener."""
    token = subprocess.run(
        [sys.executable, "-m", "magnetar.broker.cli", "tokens", "create", "--secret-key",
         "secret.key", "--subject", "alice"], cwd=directory, env=_env(), capture_output=True,
        text=True, timeout=EXAMPLE_DEADLINE_S, check=True).stdout.strip()
    client = pulsar.Client(f"pulsar+ssl://{HOST}:{tls_port}",
                           authentication=pulsar.AuthenticationToken(token),
                           tls_trust_certs_file_path=str(directory / "ca.pem"),
                           operation_timeout_seconds=OPERATION_TIMEOUT_S,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        client.create_producer("readme-tls").send(b"over TLS, with a token")
    finally:
        client.close()
