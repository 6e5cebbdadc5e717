"""Avro schema resolution: can a reader schema read data written with a writer schema?

Theory of operation
-------------------
`parse_avro` turns an Avro schema definition (JSON text) into a small tree: primitives,
arrays, maps and unions are nodes; every named type (record, enum, fixed) is stored once in
the parsed schema's `names` table under its full name and referred to by `_Named` nodes, so
recursive records make a finite tree. Parsing checks the shape (a record has a name and a
list of fields with names and types, an enum a list of symbols, a fixed an integer size, a
type name refers to a primitive or to a type already defined) and raises InvalidSchemaError
naming what is wrong and where.

`read_problems(reader, writer)` says what prevents reading (empty: readable). It answers
as Pulsar's broker does. Pulsar's AvroSchemaBasedCompatibilityCheck hands the strategy to
Avro's SchemaValidatorBuilder (BACKWARD: canReadStrategy, FORWARD: canBeReadStrategy, FULL:
mutualReadStrategy; validateLatest, or validateAll for the _TRANSITIVE forms). Each of
those asks Avro's ResolvingGrammarGenerator for the grammar that reads the writer's data
with the reader's schema and refuses only when it holds an error symbol; the grammar comes
from Avro's Resolver, which first applies the reader's aliases to the writer's schema.
(Avro's SchemaCompatibility class, which also compares record names, is not used.) Hence:

* a writer union is readable when each of its branches is;
* a reader union reads a writer type with one branch, chosen as Avro's resolver does: for
  a named writer type, the branch of the same full name (or one with it as an alias) when
  there is one; a record otherwise by any record branch that reads it; an enum or fixed
  only by such a named branch; any other type by a branch that reads it;
* primitives: the same type, or a promotion int→long→float→double, string↔bytes;
* records are never compared by name: a renamed record class reads and is read like the
  original (how Python users evolve a schema). Every reader field is found in the writer
  by name (or by one of its aliases) and read from it, or has a default; writer fields the
  reader lacks are skipped;
* enums and fixed types: the unqualified names match (as in current Avro) or a reader alias
  names the writer's type; fixed sizes must be equal. Enum symbols are not compared: the
  resolver turns a writer symbol the reader lacks into an adjustment that fails only when
  such a value is decoded, and the validator looks for error symbols alone, so Pulsar
  admits added and removed symbols under every strategy;
* arrays by items, maps by values; any other pair of kinds does not read.

Named pairs already under comparison are assumed readable, which ends recursion (the
answer is the greatest fixed point, as in Avro's own checker). Logical types are read as
their underlying types. Defaults are not checked against their field's type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import InvalidSchemaError

__all__ = ["ParsedAvro", "can_read", "parse_avro", "read_problems"]

PRIMITIVES: Final = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED_KINDS: Final = frozenset({"record", "error", "enum", "fixed"})
# writer type -> reader types that can read it besides itself
PROMOTIONS: Final = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}
DEPTH_MAX: Final = 64  # nesting levels of a definition parse_avro accepts
PROBLEMS_MAX: Final = 8  # problems read_problems reports at most


@dataclass(frozen=True)
class _Primitive:
    name: str


@dataclass(frozen=True)
class _Array:
    items: _Node


@dataclass(frozen=True)
class _Map:
    values: _Node


@dataclass(frozen=True)
class _Union:
    branches: tuple[_Node, ...]


@dataclass(frozen=True)
class _Named:
    full_name: str


_Node = _Primitive | _Array | _Map | _Union | _Named


@dataclass(frozen=True)
class _Field:
    name: str
    aliases: frozenset[str]
    type: _Node
    has_default: bool


@dataclass
class _Definition:
    """A named type: kind record, enum or fixed."""

    kind: str
    full_name: str
    aliases: frozenset[str]
    fields: tuple[_Field, ...] = ()
    symbols: tuple[str, ...] = ()
    size: int = 0  # fixed

    @property
    def name(self) -> str:
        return self.full_name.rsplit(".", 1)[-1]


@dataclass
class ParsedAvro:
    """A parsed Avro schema: its root node and its named types by full name."""

    root: _Node
    names: dict[str, _Definition] = field(default_factory=dict)


def parse_avro(text: str | bytes) -> ParsedAvro:
    """Parse an Avro schema definition.

    Raises:
        InvalidSchemaError: not JSON, or not a valid Avro schema (the message says where).
    """
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidSchemaError(f"Invalid Avro schema: not JSON ({error})") from error
    except RecursionError as error:  # the JSON itself nests too deep for the decoder
        raise InvalidSchemaError(f"Invalid Avro schema: nested deeper than {DEPTH_MAX} "
                                 "levels") from error
    parsed = ParsedAvro(_Primitive("null"))
    parsed.root = _Parser(parsed.names).node(document, "", "schema", 0)
    return parsed


class _Parser:
    def __init__(self, names: dict[str, _Definition]):
        self.names = names

    def node(self, value: Any, namespace: str, where: str, depth: int) -> _Node:
        if depth > DEPTH_MAX:
            raise InvalidSchemaError(f"Invalid Avro schema: nested deeper than {DEPTH_MAX} "
                                     f"levels at …{where[-60:]}")
        if isinstance(value, str):
            return self.reference(value, namespace, where)
        if isinstance(value, list):
            if not value:
                raise InvalidSchemaError(f"Invalid Avro schema: empty union at {where}")
            return _Union(tuple(self.node(v, namespace, f"{where}[{i}]", depth + 1)
                                for i, v in enumerate(value)))
        if not isinstance(value, dict):
            raise InvalidSchemaError(f"Invalid Avro schema: {json.dumps(value)} at {where} is "
                                     "not a type")
        kind = value.get("type")
        if isinstance(kind, dict | list):  # {"type": {...}} nests a type
            return self.node(kind, namespace, f"{where}.type", depth + 1)
        if not isinstance(kind, str):
            raise InvalidSchemaError(f"Invalid Avro schema: unknown type {json.dumps(kind)} "
                                     f"at {where}")
        if kind in PRIMITIVES:
            return _Primitive(kind)  # {"type": "long", "logicalType": ...}
        if kind == "array":
            return _Array(self.node(self.need(value, "items", where), namespace,
                                    f"{where}.items", depth + 1))
        if kind == "map":
            return _Map(self.node(self.need(value, "values", where), namespace,
                                  f"{where}.values", depth + 1))
        if kind in NAMED_KINDS:
            return self.named(value, namespace, where, depth)
        return self.reference(kind, namespace, where)  # {"type": "MyRecord"}, or unknown

    @staticmethod
    def need(value: dict[str, Any], key: str, where: str) -> Any:
        if key not in value:
            raise InvalidSchemaError(f"Invalid Avro schema: {where} has no '{key}'")
        return value[key]

    def reference(self, name: str, namespace: str, where: str) -> _Node:
        if name in PRIMITIVES:
            return _Primitive(name)
        for candidate in (_full_name(name, namespace), name):
            if candidate in self.names:
                return _Named(candidate)
        raise InvalidSchemaError(f"Invalid Avro schema: unknown type '{name}' at {where}")

    def named(self, value: dict[str, Any], namespace: str, where: str, depth: int) -> _Node:
        name = self.need(value, "name", where)
        if not isinstance(name, str) or not name:
            raise InvalidSchemaError(f"Invalid Avro schema: {where} has an invalid name")
        own_namespace = value.get("namespace", namespace)
        if not isinstance(own_namespace, str):
            raise InvalidSchemaError(f"Invalid Avro schema: {where} has an invalid namespace")
        full = _full_name(name, own_namespace)
        if full in self.names:
            raise InvalidSchemaError(f"Invalid Avro schema: type {full} is defined twice")
        inner = full.rpartition(".")[0]
        aliases = self.aliases(value, inner, f"{where} ({full})")
        definition = _Definition(str(value["type"]), full, aliases)
        self.names[full] = definition  # before the fields: they may refer to it
        where = f"{where} ({full})"
        if definition.kind in ("record", "error"):
            definition.kind = "record"
            definition.fields = self.fields(self.need(value, "fields", where), inner, where,
                                            depth)
        elif definition.kind == "enum":
            symbols = self.need(value, "symbols", where)
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise InvalidSchemaError(f"Invalid Avro schema: the symbols of {where} must "
                                         "be a list of strings")
            definition.symbols = tuple(symbols)
        else:
            size = self.need(value, "size", where)
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidSchemaError(f"Invalid Avro schema: the size of {where} must be "
                                         "a non-negative integer")
            definition.size = size
        return _Named(full)

    @staticmethod
    def aliases(value: dict[str, Any], namespace: str, where: str) -> frozenset[str]:
        aliases = value.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise InvalidSchemaError(f"Invalid Avro schema: the aliases of {where} must be a "
                                     "list of strings")
        return frozenset(_full_name(a, namespace) for a in aliases) | frozenset(aliases)

    def fields(self, value: Any, namespace: str, where: str, depth: int) -> tuple[_Field, ...]:
        if not isinstance(value, list):
            raise InvalidSchemaError(f"Invalid Avro schema: the fields of {where} must be a "
                                     "list")
        fields: list[_Field] = []
        for index, item in enumerate(value):
            at = f"{where}.fields[{index}]"
            if not isinstance(item, dict):
                raise InvalidSchemaError(f"Invalid Avro schema: {at} is not an object")
            name = self.need(item, "name", at)
            if not isinstance(name, str) or not name:
                raise InvalidSchemaError(f"Invalid Avro schema: {at} has an invalid name")
            if any(f.name == name for f in fields):
                raise InvalidSchemaError(f"Invalid Avro schema: field {name} appears twice "
                                         f"in {where}")
            node = self.node(self.need(item, "type", at), namespace, f"{at} ({name})",
                             depth + 1)
            aliases = item.get("aliases", [])
            if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
                raise InvalidSchemaError(f"Invalid Avro schema: the aliases of {at} must be "
                                         "a list of strings")
            fields.append(_Field(name, frozenset(aliases), node, "default" in item))
        return tuple(fields)


def _full_name(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def read_problems(reader: ParsedAvro, writer: ParsedAvro) -> list[str]:
    """Why `reader` cannot read data written with `writer` (empty: it can)."""
    checker = _Checker(reader, writer)
    checker.check(reader.root, writer.root, "")
    return checker.problems


def can_read(reader: ParsedAvro, writer: ParsedAvro) -> bool:
    """Whether `reader` can read everything written with `writer`."""
    return not read_problems(reader, writer)


class _Checker:
    def __init__(self, reader: ParsedAvro, writer: ParsedAvro):
        self.reader = reader
        self.writer = writer
        self.assumed: set[tuple[str, str]] = set()  # named pairs under comparison
        self.problems: list[str] = []

    def fail(self, where: str, text: str) -> bool:
        if len(self.problems) < PROBLEMS_MAX:
            self.problems.append(f"{where or 'the root'}: {text}")
        return False

    def check(self, r: _Node, w: _Node, where: str) -> bool:
        if isinstance(w, _Union):
            ok = [self.check(r, branch, f"{where}<{_describe(branch)}>")
                  for branch in w.branches]
            return all(ok)
        if isinstance(r, _Union):
            return self.union(r, w, where)
        if isinstance(r, _Primitive) and isinstance(w, _Primitive):
            if r.name == w.name or r.name in PROMOTIONS.get(w.name, ()):
                return True
            return self.fail(where, f"{w.name} written, {r.name} read")
        if isinstance(r, _Array) and isinstance(w, _Array):
            return self.check(r.items, w.items, f"{where}[]")
        if isinstance(r, _Map) and isinstance(w, _Map):
            return self.check(r.values, w.values, f"{where}{{}}")
        if isinstance(r, _Named) and isinstance(w, _Named):
            return self.named(self.reader.names[r.full_name], self.writer.names[w.full_name],
                              where)
        return self.fail(where, f"{_describe(w)} written, {_describe(r)} read")

    def union(self, r: _Union, w: _Node, where: str) -> bool:
        if isinstance(w, _Named):
            written = self.writer.names[w.full_name]
            for branch in r.branches:  # the branch of the writer's name answers alone
                if isinstance(branch, _Named):
                    candidate = self.reader.names[branch.full_name]
                    if candidate.kind == written.kind and _names(candidate, written.full_name):
                        return self.check(branch, w, where)
            if written.kind != "record":
                return self.fail(where, f"{written.kind} {written.full_name} written, no "
                                        f"branch of the reader's union {_describe(r)} has "
                                        "its name")
        for branch in r.branches:
            probe = _Checker(self.reader, self.writer)
            probe.assumed = set(self.assumed)
            if probe.check(branch, w, where):
                return True
        return self.fail(where, f"{_describe(w)} written, no branch of the reader's union "
                                f"{_describe(r)} reads it")

    def named(self, r: _Definition, w: _Definition, where: str) -> bool:
        if (r.full_name, w.full_name) in self.assumed:
            return True
        if r.kind != w.kind:
            return self.fail(where, f"{w.kind} {w.full_name} written, {r.kind} "
                                    f"{r.full_name} read")
        if r.kind != "record" and r.name != w.name and not {w.full_name, w.name} & r.aliases:
            return self.fail(where, f"{w.kind} {w.full_name} written, {r.full_name} read "
                                    "(names differ and no alias matches)")
        self.assumed.add((r.full_name, w.full_name))
        where = f"{where}.{r.name}" if where else r.name
        if r.kind == "record":
            return self.record(r, w, where)
        if r.kind == "enum":  # symbols are not compared (see the module comment)
            return True
        if r.size != w.size:
            return self.fail(where, f"fixed size {w.size} written, {r.size} read")
        return True

    def record(self, r: _Definition, w: _Definition, where: str) -> bool:
        by_name = {f.name: f for f in w.fields}
        ok = True
        for reader_field in r.fields:
            writer_field = by_name.get(reader_field.name)
            if writer_field is None:
                matches = [by_name[a] for a in sorted(reader_field.aliases) if a in by_name]
                writer_field = matches[0] if matches else None
            at = f"{where}.{reader_field.name}"
            if writer_field is not None:
                ok = self.check(reader_field.type, writer_field.type, at) and ok
            elif not reader_field.has_default:
                ok = self.fail(at, "the reader's field is not written and has no default")
        return ok


def _names(definition: _Definition, full_name: str) -> bool:
    """Whether `definition` is the type called `full_name` (by its own name or an alias)."""
    return definition.full_name == full_name or full_name in definition.aliases


def _describe(node: _Node) -> str:
    if isinstance(node, _Primitive):
        return node.name
    if isinstance(node, _Array):
        return f"array<{_describe(node.items)}>"
    if isinstance(node, _Map):
        return f"map<{_describe(node.values)}>"
    if isinstance(node, _Union):
        return "[" + ", ".join(_describe(b) for b in node.branches) + "]"
    return node.full_name
