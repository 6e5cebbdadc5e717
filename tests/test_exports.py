"""Package surfaces and the direction of imports.

Every name a package lists in `__all__` exists. Imports point down only: `storage` and
`codec` never import `broker`, and neither imports the other's internals (modules or
names with a leading underscore).
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("storage", "codec", "broker")
LOWER = ("storage", "codec")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_exists(package: str) -> None:
    module = importlib.import_module(package)
    exported = module.__all__
    assert isinstance(exported, list)
    assert len(exported) == len(set(exported)), f"{package}.__all__ has duplicates"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == [], f"{package}.__all__ names what it does not define"


def test_storage_modules_export_what_they_define() -> None:
    for path in sorted((REPO / "storage").glob("*.py")):
        name = "storage" if path.stem == "__init__" else f"storage.{path.stem}"
        module = importlib.import_module(name)
        for exported in getattr(module, "__all__", []):
            assert hasattr(module, exported), f"{name}.__all__ lists missing {exported}"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in a source file. For `from a import
    b`, both `a` and `a.b` are listed, so imported names are checked like modules."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def sources(package: str) -> list[Path]:
    paths = sorted((REPO / package).rglob("*.py"))
    assert paths, f"no sources found for {package}"
    return paths


def violations(package: str, forbidden: str, internals_only: bool) -> list[str]:
    bad = []
    for path in sources(package):
        for line, name in imports_of(path):
            parts = name.split(".")
            if parts[0] != forbidden:
                continue
            if internals_only and not any(p.startswith("_") for p in parts[1:]):
                continue
            bad.append(f"{path.relative_to(REPO)}:{line}: imports {name}")
    return bad


@pytest.mark.parametrize("package", LOWER)
def test_lower_layers_never_import_broker(package: str) -> None:
    assert violations(package, "broker", internals_only=False) == []


@pytest.mark.parametrize(("package", "other"), [("storage", "codec"), ("codec", "storage")])
def test_no_imports_of_each_others_internals(package: str, other: str) -> None:
    assert violations(package, other, internals_only=True) == []


def test_the_import_scan_sees_imports(tmp_path: Path) -> None:
    # Guard the scanner itself: every way of importing is seen, relative ones are not.
    source = tmp_path / "sample.py"
    source.write_text("import broker.topics\n"
                      "from codec._wire import parse\n"
                      "from . import _sibling\n"
                      "def late() -> None:\n"
                      "    from codec import _frames\n")
    assert sorted(imports_of(source)) == [(1, "broker.topics"), (2, "codec._wire"),
                                          (2, "codec._wire.parse"), (5, "codec"),
                                          (5, "codec._frames")]


@pytest.mark.parametrize("package", LOWER)
def test_importing_a_lower_layer_loads_no_broker(package: str) -> None:
    """Transitively too: import the package in a fresh interpreter and look at what
    got loaded."""
    script = (f"import json, sys; import {package}; "
              "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    loaded = json.loads(out)
    assert not [m for m in loaded if m == "broker" or m.startswith("broker.")]
    other = "codec" if package == "storage" else "storage"
    assert not [m for m in loaded if m.startswith(f"{other}._")]
