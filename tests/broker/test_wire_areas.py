"""The shape of the connection (broker/wire): connection mechanics in `ConnectionHandler`,
the commands of each area (producers, consumers, lookup and discovery) in one small class that
sees the connection only through `ConnectionView`, and one dispatch table that sends every
command type to one method."""

from __future__ import annotations

import ast
from pathlib import Path

from magnetar.broker.wire._connection_handler import ConnectionHandler
from magnetar.broker.wire._connection_view import ServerContext
from magnetar.codec import pb

from .helpers import broker_env

WIRE = Path(__file__).resolve().parents[2] / "broker" / "wire"
AREA_MODULES = ("_producers", "_consumers", "_discovery")
AREA_IMPORTS_ALLOWED = {"_connection_view", "_topic_watchers"}  # of broker/wire's modules
MODULE_LINES_MAX = 600


def _wire_imports(module: str) -> set[str]:
    """The broker/wire modules a module of broker/wire imports (relative imports)."""
    tree = ast.parse((WIRE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module)
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_command_areas_see_the_connection_only_through_its_view() -> None:
    for module in AREA_MODULES:
        assert _wire_imports(module) <= AREA_IMPORTS_ALLOWED, module


def test_every_module_of_the_connection_stays_short() -> None:
    for path in sorted(WIRE.glob("*.py")):
        lines = len(path.read_text().splitlines())
        assert lines <= MODULE_LINES_MAX, f"{path.name}: {lines} lines"


async def test_every_command_type_goes_to_one_method_of_the_connection_or_one_area(
        tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        context = ServerContext(env.service, "pulsar://127.0.0.1:6650",
                                env.service.schemas)
        handler = ConnectionHandler(context, lambda data: None, lambda: None, "/127.0.0.1:1")
        owners = {handler, handler.producers, handler.consumers, handler.discovery}
        table = handler._dispatch_table
        for kind, method in table.items():
            assert getattr(method, "__self__", None) in owners, pb.BaseCommand.Type.Name(kind)
        dispatched = {(id(method.__self__), method.__name__)  # type: ignore[attr-defined]
                      for method in table.values()}
        for area in (handler.producers, handler.consumers, handler.discovery):
            for name in dir(area):
                # Events that are not frames: a bad CRC, and a plain SEND (codec's `Send`).
                if name.startswith("on_") and name not in ("on_corrupt_send", "on_plain_send"):
                    assert (id(area), name) in dispatched, f"{type(area).__name__}.{name}"
        handler.close()
