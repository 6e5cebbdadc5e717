"""The package's shape: `__all__` lists every public name exactly once, and the codec stays
sans-IO and independent (no storage, broker, sockets, threads or asyncio)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from magnetar import codec

CODEC_DIR = Path(codec.__file__).parent
MODULES = sorted(p for p in CODEC_DIR.glob("_*.py") if p.name != "__init__.py")
FORBIDDEN_IMPORTS = {"storage", "broker", "socket", "asyncio", "threading", "selectors", "ssl"}
CORE_MODULES = {
    "_batch_payload.py",
    "_batching.py",
    "_chunking.py",
    "_compression.py",
    "_connection.py",
    "_framer.py",
    "_hashing.py",
    "_message_id.py",
    "_wire.py",
}


def test_all_lists_every_public_name_once() -> None:
    assert len(codec.__all__) == len(set(codec.__all__))
    for name in codec.__all__:
        assert hasattr(codec, name), name
    # "@py_builtins"/"@pytest_ar": pytest's assertion rewriting, which covers every module of
    # the distribution that provides a pytest plugin (ours: magnetar.pytest_plugin)
    exported = {name for name in vars(codec) if not name.startswith(("_", "@"))}
    assert exported == set(codec.__all__)


def test_each_private_module_declares_what_it_exports() -> None:
    for path in MODULES:
        module = importlib.import_module(f"magnetar.codec.{path.stem}")
        assert hasattr(module, "__all__"), path.name
        for name in module.__all__:
            assert hasattr(module, name), (path.name, name)


def _root(module: str) -> str:
    """The package a dotted name belongs to, looking inside the `magnetar` namespace."""
    return module.removeprefix("magnetar.").split(".")[0]


def test_codec_imports_no_io_and_no_other_package() -> None:
    for path in [*MODULES, CODEC_DIR / "__init__.py"]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {_root(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = {_root(node.module)}
            else:
                continue
            assert not roots & FORBIDDEN_IMPORTS, (path.name, roots)


def test_core_modules_open_with_a_theory_of_operation() -> None:
    for path in MODULES:
        if path.name not in CORE_MODULES:
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        assert docstring is not None, path.name
        assert len(docstring.splitlines()) >= 10, path.name
        assert "|" in docstring or "layout" in docstring.lower(), path.name
