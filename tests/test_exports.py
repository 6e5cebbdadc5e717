"""Package surfaces and the direction of imports.

Every name a package lists in `__all__` exists. Imports point down only: `storage` and
`codec` never import `broker`, and neither imports the other's internals (modules or
names with a leading underscore).

The floor plan of broker/: its wings (sub-packages) import downwards only, and broker uses
only the public names of `storage` and `codec`. Every broker module's imports are read with
`ast` (also those under `if TYPE_CHECKING:` and inside functions: a lazy import is still a
dependency), resolved to the modules they name, and checked against `WING_RANK`: a module may
import its own wing and any wing ranked lower, never one ranked higher or another wing of the
same rank. The import cycles inside broker/ are counted: none may span two wings, and the
cycles inside one wing may only become fewer.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from magnetar import broker

REPO = Path(__file__).resolve().parents[1]
# Modules below the client that may import it anyway: test tooling that sits above it.
CLIENT_USERS = {
    # the broker crash harness drives our own client's retry flow (and the official one)
    "broker/testing/_crash_retry.py",
}
PACKAGES = ("storage", "codec", "broker")
LOWER = ("storage", "codec")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_exists(package: str) -> None:
    module = importlib.import_module(f"magnetar.{package}")
    exported = module.__all__
    assert isinstance(exported, list)
    assert len(exported) == len(set(exported)), f"{package}.__all__ has duplicates"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == [], f"{package}.__all__ names what it does not define"


def test_storage_modules_export_what_they_define() -> None:
    for path in sorted((REPO / "storage").glob("*.py")):
        name = "magnetar.storage" + ("" if path.stem == "__init__" else f".{path.stem}")
        module = importlib.import_module(name)
        for exported in getattr(module, "__all__", []):
            assert hasattr(module, exported), f"{name}.__all__ lists missing {exported}"


def in_magnetar(name: str) -> str:
    """The dotted name inside the `magnetar` namespace (`magnetar.codec._wire` ->
    `codec._wire`); a name from elsewhere (a top-level `codec`) comes back unchanged."""
    return name.removeprefix("magnetar.")


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
            parts = in_magnetar(name).split(".")
            if parts[0] != forbidden:
                continue
            if internals_only and not any(p.startswith("_") for p in parts[1:]):
                continue
            bad.append(f"{path.relative_to(REPO)}:{line}: imports {name}")
    return bad


@pytest.mark.parametrize("package", LOWER)
def test_lower_layers_never_import_broker(package: str) -> None:
    assert violations(package, "broker", internals_only=False) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_nothing_below_the_client_imports_magnetar(package: str) -> None:
    """`magnetar` (the client) may import broker, storage and codec; never the reverse. They
    import each other as magnetar.storage, magnetar.codec, magnetar.broker: anything else
    under the `magnetar` name is the client."""
    bad = []
    for path in sources(package):
        if str(path.relative_to(REPO)) in CLIENT_USERS:
            continue
        imports = imports_of(path)
        namespaced = {line for line, name in imports if name.split(".")[:2] in
                      (["magnetar", p] for p in PACKAGES)}
        for line, name in imports:
            parts = name.split(".")
            if parts[0] != "magnetar" or (len(parts) > 1 and parts[1] in PACKAGES):
                continue
            if len(parts) == 1 and line in namespaced:  # `from magnetar import codec`
                continue
            bad.append(f"{path.relative_to(REPO)}:{line}: imports {name}")
    assert bad == []


def test_the_client_message_id_wraps_the_codecs() -> None:
    import magnetar
    from magnetar import codec

    # The client's id has the official accessors; the one codec class (loaded once) is inside.
    assert magnetar.MessageId is not codec.MessageId
    assert magnetar.MessageId.earliest.codec is codec.MessageId.earliest
    assert magnetar.MessageId.earliest == codec.MessageId.earliest


def test_the_client_import_check_sees_a_client_import(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text("from magnetar import codec\nfrom magnetar._client import Client\n")
    names = [name for _, name in imports_of(source)]
    assert "magnetar._client" in names
    assert "magnetar.codec" in names


def test_magnetar_exports_what_it_lists() -> None:
    import magnetar

    assert len(magnetar.__all__) == len(set(magnetar.__all__))
    assert [name for name in magnetar.__all__ if not hasattr(magnetar, name)] == []


@pytest.mark.parametrize(("package", "other"), [("storage", "codec"), ("codec", "storage")])
def test_no_imports_of_each_others_internals(package: str, other: str) -> None:
    assert violations(package, other, internals_only=True) == []


def test_the_import_scan_sees_imports(tmp_path: Path) -> None:
    # Guard the scanner itself: every way of importing is seen, relative ones are not.
    source = tmp_path / "sample.py"
    source.write_text("import magnetar.broker.topics\n"
                      "from magnetar.codec._wire import parse\n"
                      "from . import _sibling\n"
                      "def late() -> None:\n"
                      "    from magnetar.codec import _frames\n")
    assert sorted(imports_of(source)) == [
        (1, "magnetar.broker.topics"), (2, "magnetar.codec._wire"),
        (2, "magnetar.codec._wire.parse"), (5, "magnetar.codec"), (5, "magnetar.codec._frames")]


def test_everything_imports_through_the_magnetar_namespace() -> None:
    """storage/, broker/ and codec/ install as magnetar.storage, magnetar.broker and
    magnetar.codec: an absolute import of a bare `storage` would load a second copy of the
    engine from the repository (or a user's own package of that name) when installed."""
    bare = []
    for folder in ("magnetar", "storage", "broker", "codec", "tests", "tools", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if folder == "magnetar" and path.parent != REPO / "magnetar":
                continue  # the links to the three packages, seen at their real paths
            bare.extend(f"{path.relative_to(REPO)}:{line}: imports {name}"
                        for line, name in imports_of(path)
                        if name.split(".")[0] in PACKAGES)
    assert bare == []


@pytest.mark.parametrize("package", LOWER)
def test_importing_a_lower_layer_loads_no_broker(package: str) -> None:
    """Transitively too: import the package in a fresh interpreter and look at what
    got loaded."""
    script = (f"import json, sys; import magnetar.{package}; "
              "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    loaded = json.loads(out)
    assert not [m for m in loaded if m == "magnetar.broker" or m.startswith("magnetar.broker.")]
    other = "codec" if package == "storage" else "storage"
    assert not [m for m in loaded if m.startswith(f"magnetar.{other}._")]
    assert not [m for m in loaded if m.split(".")[0] in PACKAGES]


# The base (broker/_config, _errors, _names, _namespaces, _policies, _listeners, _tasks) is
# "", the wings are broker's sub-packages. Imports run from a higher rank to a lower one.
WING_RANK: dict[str, int] = {
    "": 0,
    "ledger": 1,
    "security": 1,
    "dispatch": 2,
    "schemas": 3,
    "topics": 4,
    "wire": 5,
    "http": 5,
    "testing": 6,
    "cli": 7,  # the outermost shell: `magnetar crashtest broker` runs broker/testing's harness
}

# Private modules of storage/codec that broker may import, with the reason. Empty: broker
# uses what storage/__init__ and codec/__init__ export.
PRIVATE_IMPORTS_ALLOWED: dict[str, str] = {}

# Import cycles whose modules all lie in one wing, today: _config/_listeners, the managed
# ledger and its cursors, the subscription and its dispatchers, the service and its topics
# (with producers and non-persistent topics). Most close only under `if TYPE_CHECKING:`.
# They may become fewer, never more.
CYCLES_INSIDE_WINGS_MAX = 4


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


BROKER_MODULES: dict[str, Path] = {
    _module_name(path): path for path in sorted((REPO / "broker").rglob("*.py"))}


def _broker_imports(module: str) -> set[str]:
    """The modules `module` imports (every import statement, wherever it stands)."""
    path = BROKER_MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(in_magnetar(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = in_magnetar(node.module or "")
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in BROKER_MODULES else target)
    return found


BROKER_GRAPH: dict[str, set[str]] = {
    module: {dep for dep in _broker_imports(module) if dep in BROKER_MODULES}
    for module in BROKER_MODULES}


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and not parts[1].startswith("_")) \
        else ""


def _cycles() -> list[set[str]]:
    """The strongly connected components of BROKER_GRAPH with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(BROKER_GRAPH[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(BROKER_GRAPH):
        if node not in index:
            visit(node)
    return found


def test_every_wing_is_ranked() -> None:
    wings = {_wing(module) for module in BROKER_MODULES if module != "broker"}
    assert wings == set(WING_RANK)


def test_wings_import_downwards_only() -> None:
    wrong = []
    for module, deps in BROKER_GRAPH.items():
        if module == "broker":  # the package's front door re-exports from every wing
            continue
        wing = _wing(module)
        for dep in deps:
            dep_wing = _wing(dep)
            if dep == "broker" or (dep_wing != wing
                                   and WING_RANK[dep_wing] >= WING_RANK[wing]):
                wrong.append(f"{module} ({wing or 'base'}) imports {dep} "
                             f"({dep_wing or 'base'})")
    assert not wrong, "\n".join(sorted(wrong))


def test_broker_uses_public_names_of_storage_and_codec() -> None:
    wrong = []
    for module in BROKER_MODULES:
        for dep in _broker_imports(module):
            top, _, rest = dep.partition(".")
            private = any(part.startswith("_") for part in rest.split("."))
            if top in ("storage", "codec") and private and dep not in PRIVATE_IMPORTS_ALLOWED:
                wrong.append(f"{module} imports {dep}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycle_spans_two_wings() -> None:
    cycles = _cycles()
    spanning = [sorted(cycle) for cycle in cycles if len({_wing(m) for m in cycle}) > 1]
    assert not spanning
    assert len(cycles) <= CYCLES_INSIDE_WINGS_MAX, [sorted(cycle) for cycle in cycles]


def test_the_checker_sees_an_upward_import() -> None:
    """The rule is not vacuous: the graph resolves relative imports to real modules."""
    assert "broker.topics._topic" in BROKER_GRAPH["broker.topics._service"]
    assert "broker.dispatch._subscription" in BROKER_GRAPH["broker.topics._topic"]
    assert "broker.cli._admin_cli" in BROKER_GRAPH["broker.cli._main"]  # `from . import _admin_cli`
    assert WING_RANK[_wing("broker.topics._topic")] > WING_RANK[_wing("broker._config")]


def test_all_lists_what_users_need() -> None:
    assert len(broker.__all__) <= 30
    assert sorted(broker.__all__) == sorted(set(broker.__all__))
    for name in broker.__all__:
        assert getattr(broker, name) is not None
    assert not any(name.startswith("_") for name in broker.__all__)
    assert set(broker.__all__) <= set(dir(broker))


@pytest.mark.parametrize("heavy", ["aiohttp", "magnetar.broker.testing._simulation",
                                   "magnetar.broker.cli", "magnetar.broker.http._admin"])
def test_import_broker_loads_no_harness_http_or_cli(heavy: str) -> None:
    code = f"import sys, magnetar.broker; sys.exit({heavy!r} in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, f"import broker loads {heavy}: {done.stderr}"


# -- module length ---------------------------------------------------------------------------

MODULE_LINES_MAX = 600
LONG_MODULE_LINES_MAX = 1000  # even a cohesive module is split beyond this
# Library modules allowed over MODULE_LINES_MAX, each with why it stays one piece.
LONG_MODULES_ALLOWED: dict[str, str] = {
    "broker/ledger/_managed_ledger.py": "one class over one metadata record: ledger rollover, "
                                        "trimming and reads all change the same ledger list",
    "broker/dispatch/_selectors.py": "the three Key_Shared selectors behind one Protocol, "
                                     "with the hash-range types they all return",
    "broker/ledger/_cursor.py": "one class: mark-delete, ack holes, batch acks and their "
                                "persistence are one state machine",
    "storage/_recovery.py": "the recovery procedure's steps run in order over one plan; "
                            "its theory of operation reads top to bottom",
    "storage/_storage.py": "the engine's front door, one class whose methods each hand off "
                           "to a component (journal, cache, checkpoint, gc)",
}


def _library_lengths() -> dict[str, int]:
    lengths = {}
    client = [path for path in sorted((REPO / "magnetar").rglob("*.py"))
              if path.relative_to(REPO / "magnetar").parts[0] not in PACKAGES]  # not the links
    for package in PACKAGES:
        for path in [*sources(package), *(client if package == PACKAGES[0] else [])]:
            name = path.relative_to(REPO).as_posix()
            if name.startswith("codec/_proto/"):  # generated by protoc
                continue
            lengths[name] = len(path.read_text().splitlines())
    return lengths


def test_library_modules_are_short_unless_named_cohesive() -> None:
    lengths = _library_lengths()
    too_long = [f"{name}: {lines} lines" for name, lines in sorted(lengths.items())
                if lines > MODULE_LINES_MAX and name not in LONG_MODULES_ALLOWED]
    assert not too_long, (f"over {MODULE_LINES_MAX} lines: split them, or name them in "
                          f"LONG_MODULES_ALLOWED with the reason\n" + "\n".join(too_long))
    for name, reason in LONG_MODULES_ALLOWED.items():
        assert reason.strip(), name
        assert name in lengths, f"{name} is allowed to be long but does not exist"
        assert MODULE_LINES_MAX < lengths[name] <= LONG_MODULE_LINES_MAX, \
            f"{name}: {lengths[name]} lines; drop it from the list or split it"


def test_the_length_check_sees_long_modules() -> None:
    lengths = _library_lengths()
    assert "broker/http/_admin.py" in lengths
    assert all(name in lengths for name in LONG_MODULES_ALLOWED)
    assert max(lengths.values()) > MODULE_LINES_MAX  # the allowed ones are counted too
