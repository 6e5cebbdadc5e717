"""What a plain `pip install magnetar` gets (issue 11, sections 2 and 6).

The wheel's runtime dependencies include the official client that `magnetar produce`/`consume`
drive, and leave out what only the harnesses need (tqdm, matplotlib: the `bench` and
`crashtest` extras) and what only the tests need (crcmod). A harness command whose extra is
missing says which extra to install, in one line, before it does any work. `import
magnetar.storage` does not load the harnesses. The last test installs the wheel with only its
runtime dependencies into a fresh venv and runs the documented commands there, beside a user's
own packages named `storage`, `broker` and `codec` (issue 11, section 5: everything of ours
installs under the one name `magnetar`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from magnetar.broker.cli import main
from magnetar.storage.testing.benchmark import TINY_SCALE, BenchOptions, run_storage_benchmark
from tests.interop import BrokerProcess

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "magnetar", "storage", "broker", "codec")
HARNESS_MODULES = ("magnetar.storage.testing", "tqdm", "matplotlib")
PIP_INSTALL_TIMEOUT_S = 240  # generous: the wheel's runtime dependencies from the index


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of the sources (so no build/ lands in the repository)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "--wheel-dir", str(root / "dist"), str(source)],
                   check=True, capture_output=True, timeout=120)
    (built,) = (root / "dist").glob("magnetar-*.whl")
    return built


def requirements_of(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(metadata).decode())
    return [Requirement(line) for line in message.get_all("Requires-Dist", [])]


def test_wheel_requires_the_client_and_not_the_harness_packages(wheel: Path) -> None:
    requirements = requirements_of(wheel)
    runtime = {r.name for r in requirements if r.marker is None}
    assert "pulsar-client" in runtime
    assert not runtime & {"tqdm", "matplotlib", "crcmod"}, runtime

    def extra_of(name: str) -> set[str]:
        return {extra for r in requirements if r.name == name and r.marker is not None
                for extra in ("bench", "crashtest", "test")
                if r.marker.evaluate({"extra": extra})}

    assert extra_of("tqdm") == {"bench", "crashtest", "test"}
    assert extra_of("matplotlib") == {"bench", "test"}
    assert extra_of("crcmod") == {"test"}


def test_wheel_ships_the_harnesses_and_the_command(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "magnetar = magnetar.broker.cli:main" in archive.read(entry_points).decode()
    assert {"magnetar/storage/testing/__init__.py", "magnetar/storage/testing/simfs.py",
            "magnetar/storage/testing/crashtest.py",
            "magnetar/storage/testing/_crashtest_child.py",
            "magnetar/storage/testing/benchmark.py", "magnetar/broker/cli/__init__.py",
            "magnetar/codec/_proto/pulsar_api.proto", "magnetar/__init__.py",
            "magnetar/asyncio.py", "magnetar/py.typed"} <= names
    top_level = {name.split("/")[0] for name in names if not name.startswith("magnetar-")}
    assert top_level == {"magnetar"}


def test_import_storage_loads_no_harness() -> None:
    code = ("import sys, magnetar.storage; "
            f"print([m for m in sys.modules if m.split('.')[0] in {HARNESS_MODULES[1:]!r} "
            "or m.startswith('magnetar.storage.testing')])")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


@pytest.fixture
def without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib as if not installed: find_spec answers None for it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.usefixtures("without_matplotlib")
def test_bench_plot_names_the_extra_before_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "x.png"
    status = main(["bench", "storage", "--quick", "--dir", str(tmp_path), "--plot", str(plot)])
    out, err = capsys.readouterr()
    assert status == 2
    assert err == ("magnetar bench storage: needs matplotlib, which this installation lacks; "
                   "install the 'bench' extra: pip install 'magnetar[bench]' "
                   "(nothing was run)\n")
    assert out == ""  # no table: nothing was measured
    assert os.listdir(tmp_path) == []  # no scratch directory either


@pytest.mark.usefixtures("without_matplotlib")
def test_run_storage_benchmark_refuses_a_plot_before_measuring(tmp_path: Path) -> None:
    options = BenchOptions(directory=str(tmp_path / "bench"), plot_path=str(tmp_path / "x.png"),
                           progress=False, scale=TINY_SCALE)
    with pytest.raises(ModuleNotFoundError, match=r"magnetar\[bench\]"):
        run_storage_benchmark(options)
    assert os.listdir(tmp_path) == []


def test_crashtest_names_its_extra_when_tqdm_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    status = main(["crashtest", "--data-dir", str(tmp_path), "--iterations", "1"])
    assert status == 2
    assert capsys.readouterr().err == (
        "magnetar crashtest: needs tqdm, which this installation lacks; install the "
        "'crashtest' extra: pip install 'magnetar[crashtest]' (nothing was run)\n")
    assert os.listdir(tmp_path) == []


def test_a_plain_install_runs_the_documented_commands(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv (no system site-packages) with the wheel and only its runtime
    dependencies, from the configured package index (about 15 s, most of it pip)."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(wheel)],
                   check=True, capture_output=True, timeout=PIP_INSTALL_TIMEOUT_S)
    magnetar = str(env_dir / "bin" / "magnetar")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([magnetar, *args], cwd=cwd, env=clean, capture_output=True,
                              text=True, timeout=120)

    installed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                               check=True, capture_output=True, text=True, env=clean).stdout
    names = {line.split("==")[0].lower() for line in installed.splitlines()}
    assert "pulsar-client" in names
    assert not names & {"tqdm", "matplotlib", "crcmod"}, names

    for package in ("storage", "broker", "codec"):  # a user's own packages, common names
        (cwd / package).mkdir()
        (cwd / package / "__init__.py").write_text(f"MINE = {package!r}\n")
    imported = subprocess.run(
        [str(python), "-c", "import storage, broker, codec, magnetar.storage, magnetar.broker, "
         "magnetar.codec, magnetar.broker.cli; print(storage.MINE, broker.MINE, codec.MINE, "
         "magnetar.storage.Storage.__name__, magnetar.broker.BrokerService.__name__, "
         "magnetar.codec.MessageId.__name__)"],
        cwd=cwd, env=clean, capture_output=True, text=True, timeout=60)
    assert (imported.returncode, imported.stderr) == (0, "")
    assert imported.stdout.split() == ["storage", "broker", "codec", "Storage", "BrokerService",
                                       "MessageId"]
    for package in ("storage", "broker", "codec"):
        shutil.rmtree(cwd / package)

    for args in (["--help"], ["produce", "--help"], ["consume", "--help"]):
        done = run(*args)
        assert done.returncode == 0, (args, done.stderr)
        assert done.stdout.startswith("usage: magnetar"), args
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")  # the repository's
    broker.start()
    try:
        url = ["--url", broker.url, "--timeout-s", "10"]
        produced = run("produce", "plain-install", "-m", "hello", *url)
        assert (produced.returncode, produced.stderr) == (0, "")
        consumed = run("consume", "plain-install", "-s", "sub", "-p", "Earliest", "-n", "1",
                       *url)
        assert (consumed.returncode, consumed.stderr) == (0, "")
        assert consumed.stdout.endswith("1 messages successfully consumed\n")
    finally:
        broker.cleanup()

    script = ("import magnetar\n"
              "with magnetar.Client('client-data') as client:\n"
              "    reader = client.create_reader('t', magnetar.MessageId.earliest)\n"
              "    client.create_producer('t').send(b'embedded')\n"
              "    print(reader.read_next(10000).data())\n")
    embedded = subprocess.run([str(python), "-c", script], cwd=tmp_path, env=clean,
                              capture_output=True, text=True, timeout=120)
    assert (embedded.returncode, embedded.stderr) == (0, "")
    assert embedded.stdout == "b'embedded'\n"

    done = run("bench", "storage", "--plot", "x.png", "--quick")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == ("magnetar bench storage: needs tqdm and matplotlib, which this "
                           "installation lacks; install the 'bench' extra: pip install "
                           "'magnetar[bench]' (nothing was run)\n")
    assert os.listdir(cwd) == []

    done = run("crashtest", "--data-dir", str(cwd / "crash"), "--iterations", "1")
    assert done.returncode == 2
    assert "pip install 'magnetar[crashtest]'" in done.stderr
    assert len(done.stderr.splitlines()) == 1
