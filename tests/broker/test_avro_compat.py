"""Avro schema resolution (`_avro_compat`) and Pulsar's strategies over it (`_schema_compat`):
tables of old/new schema pairs with the answer each strategy must give."""

from __future__ import annotations

import json
from typing import Any

import pytest

from magnetar.broker._errors import IncompatibleSchemaError, InvalidSchemaError
from magnetar.broker.schemas._avro_compat import can_read, parse_avro, read_problems
from magnetar.broker.schemas._schema_compat import KEY_VALUE, check_compatible, check_readable
from magnetar.broker.schemas._schemas import StoredSchema
from magnetar.codec import pb


def record(*fields: dict[str, Any], name: str = "R", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def f(name: str, kind: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, **extra}


def avro(definition: Any, kind: int = pb.Schema.Avro) -> StoredSchema:
    return StoredSchema("s", kind, json.dumps(definition).encode())


def reads(reader: Any, writer: Any) -> bool:
    return can_read(parse_avro(json.dumps(reader)), parse_avro(json.dumps(writer)))


V1 = record(f("a", "int"))
ENUM_ABC = {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}
ENUM_AB = {"type": "enum", "name": "E", "symbols": ["A", "B"]}

# (case, old, new, backward ok (new reads old), forward ok (old reads new))
PAIRS: list[tuple[str, Any, Any, bool, bool]] = [
    ("identical", V1, V1, True, True),
    ("add field with default", V1, record(f("a", "int"), f("b", "string", default="")),
     True, True),
    ("add field without default", V1, record(f("a", "int"), f("b", "string")), False, True),
    ("remove field with default", record(f("a", "int"), f("b", "long", default=0)), V1,
     True, True),
    ("remove field without default", record(f("a", "int"), f("b", "long")), V1, True, False),
    ("promote int to long", V1, record(f("a", "long")), True, False),
    ("promote int to double", V1, record(f("a", "double")), True, False),
    ("promote float to double", record(f("a", "float")), record(f("a", "double")), True,
     False),
    ("string to bytes", record(f("a", "string")), record(f("a", "bytes")), True, True),
    ("long to int", record(f("a", "long")), V1, False, True),
    ("int to string", V1, record(f("a", "string")), False, False),
    ("union widened", record(f("a", ["null", "int"])),
     record(f("a", ["null", "int", "string"])), True, False),
    ("union narrowed", record(f("a", ["null", "int", "string"])),
     record(f("a", ["null", "int"])), False, True),
    ("value made nullable", V1, record(f("a", ["null", "int"])), True, False),
    # Pulsar's check (Avro's SchemaValidator) never compares enum symbols: a symbol the
    # reader lacks fails only when such a value is decoded.
    ("enum symbol added", record(f("e", ENUM_AB)), record(f("e", ENUM_ABC)), True, True),
    ("enum symbol removed", record(f("e", ENUM_ABC)), record(f("e", ENUM_AB)), True, True),
    ("enum symbol removed, reader default", record(f("e", {**ENUM_ABC, "default": "A"})),
     record(f("e", {**ENUM_AB, "default": "A"})), True, True),
    ("nested record field added with default",
     record(f("in", record(f("x", "int"), name="In"))),
     record(f("in", record(f("x", "int"), f("y", "int", default=1), name="In"))), True, True),
    ("nested record field added without default",
     record(f("in", record(f("x", "int"), name="In"))),
     record(f("in", record(f("x", "int"), f("y", "int"), name="In"))), False, True),
    # Records are matched by their fields, never by name (Pulsar's check, through Avro's
    # Resolver): renaming the record class is how Python users evolve a schema.
    ("record renamed", V1, record(f("a", "int"), name="Other"), True, True),
    ("record renamed with alias", V1, record(f("a", "int"), name="Other", aliases=["R"]),
     True, True),
    ("record renamed into a namespace", V1, record(f("a", "int"), name="Other",
                                                   namespace="x.y"), True, True),
    ("record renamed, field added with default", V1,
     record(f("a", "int"), f("b", ["null", "string"], default=None), name="Other"),
     True, True),
    ("record renamed, field added without default", V1,
     record(f("a", "int"), f("b", ["null", "string"]), name="Other"), False, True),
    ("record renamed, field removed without default", record(f("a", "int"), f("b", "long")),
     record(f("a", "int"), name="Other"), True, False),
    ("record renamed, int promoted to long", V1, record(f("a", "long"), name="Other"), True,
     False),
    ("record renamed, long to int", record(f("a", "long")), record(f("a", "int"), name="O"),
     False, True),
    ("nested record renamed", record(f("in", record(f("x", "int"), name="In"))),
     record(f("in", record(f("x", "int"), f("y", "int", default=1), name="Inner"))), True,
     True),
    # Enums and fixed types keep their name rule: the unqualified names match, or a reader
    # alias names the writer's type.
    ("enum renamed", record(f("e", ENUM_AB)), record(f("e", {**ENUM_AB, "name": "F"})), False,
     False),
    ("enum renamed with alias", record(f("e", ENUM_AB)),
     record(f("e", {**ENUM_AB, "name": "F", "aliases": ["E"]})), True, False),
    ("enum moved to another namespace", record(f("e", ENUM_AB)),
     record(f("e", {**ENUM_AB, "namespace": "x.y"})), True, True),
    ("fixed renamed", record(f("x", {"type": "fixed", "name": "F", "size": 4})),
     record(f("x", {"type": "fixed", "name": "G", "size": 4})), False, False),
    ("field renamed with alias", V1, record(f("z", "int", aliases=["a"])), True, False),
    ("array items promoted", record(f("l", {"type": "array", "items": "int"})),
     record(f("l", {"type": "array", "items": "long"})), True, False),
    ("map values changed", record(f("m", {"type": "map", "values": "int"})),
     record(f("m", {"type": "map", "values": "boolean"})), False, False),
    ("fixed size changed", record(f("x", {"type": "fixed", "name": "F", "size": 4})),
     record(f("x", {"type": "fixed", "name": "F", "size": 8})), False, False),
    ("fixed same", record(f("x", {"type": "fixed", "name": "F", "size": 4})),
     record(f("x", {"type": "fixed", "name": "F", "size": 4})), True, True),
]

LINKED_V1 = record(f("value", "int"), f("next", ["null", "Node"]), name="Node")
LINKED_V2 = record(f("value", "int"), f("next", ["null", "Node"]),
                   f("label", "string", default=""), name="Node")
LINKED_BAD = record(f("value", "int"), f("next", ["null", "Node"]), f("label", "string"),
                    name="Node")
PAIRS += [
    ("recursive record, field with default", LINKED_V1, LINKED_V2, True, True),
    ("recursive record, field without default", LINKED_V1, LINKED_BAD, False, True),
    ("named type reference", record(f("a", ENUM_AB), f("b", "E")),
     record(f("a", ENUM_ABC), f("b", "int")), False, False),
    ("named type reference, symbol added", record(f("a", ENUM_AB), f("b", "E")),
     record(f("a", ENUM_ABC), f("b", "E")), True, True),
]

EXPECTED = {  # strategy -> (needs backward, needs forward)
    "BACKWARD": (True, False), "FORWARD": (False, True), "FULL": (True, True),
}


@pytest.mark.parametrize(("case", "old", "new", "backward", "forward"), PAIRS,
                         ids=[p[0] for p in PAIRS])
def test_resolution_rules(case: str, old: Any, new: Any, backward: bool,
                          forward: bool) -> None:
    assert reads(new, old) is backward, read_problems(parse_avro(json.dumps(new)),
                                                      parse_avro(json.dumps(old)))
    assert reads(old, new) is forward
    for kind in (pb.Schema.Avro, pb.Schema.Json):  # JSON schemas carry Avro records
        for strategy, (needs_backward, needs_forward) in EXPECTED.items():
            allowed = (backward or not needs_backward) and (forward or not needs_forward)
            for suffix in ("", "_TRANSITIVE"):
                if allowed:
                    check_compatible(avro(new, kind), [avro(old, kind)], strategy + suffix)
                else:
                    with pytest.raises(IncompatibleSchemaError):
                        check_compatible(avro(new, kind), [avro(old, kind)],
                                         strategy + suffix)
        check_compatible(avro(new, kind), [avro(old, kind)], "ALWAYS_COMPATIBLE")
        with pytest.raises(IncompatibleSchemaError, match="ALWAYS_INCOMPATIBLE"):
            check_compatible(avro(new, kind), [avro(old, kind)], "ALWAYS_INCOMPATIBLE")


def nullable(kind: Any) -> list[Any]:
    return ["null", kind]


# What the official Python client's AvroSchema(Record class) sends: the record is named after
# the class, optional fields are ["null", type] unions, and required_default=True adds a
# "default": null.
SUB = record(f("x", nullable("int")), f("y", nullable("long")), name="MySubRecord")
EXAMPLE = record(f("a", nullable("int")), f("b", "boolean"), f("c", nullable("long")),
                 f("j", nullable(SUB)), name="Example")
EXAMPLE_REQUIRED_DEFAULT = record(
    f("a", nullable("int"), default=None), f("b", "boolean"),
    f("c", nullable("long"), default=None), f("j", nullable(SUB), default=None),
    name="ExampleRequiredDefault")
USER1 = record(f("name", nullable("string")), f("age", nullable("int")), name="User1")
USER2 = record(f("name", nullable("string")), f("age", nullable("int")),
               f("email", nullable("string")), name="User2")  # email: no default
USER2_DEFAULT = record(f("name", nullable("string")), f("age", nullable("int")),
                       f("email", nullable("string"), default=None), name="User2")
USER2_LONG_AGE = record(f("name", nullable("string")), f("age", nullable("long")),
                        name="User2")
HISTORY = [record(f("a", "int"), name="V1"),
           record(f("a", "int", default=0), f("b", "int", default=0), name="V2")]
V3 = record(f("b", "int", default=0), name="V3")  # drops a, which V1 needs without a default

ALL_STRATEGIES = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                  "FULL_TRANSITIVE", "ALWAYS_COMPATIBLE", "ALWAYS_INCOMPATIBLE")
# (case, versions registered (oldest first), new schema, strategies that admit it)
STRATEGY_CASES: list[tuple[str, list[Any], Any, set[str]]] = [
    ("Example then ExampleRequiredDefault", [EXAMPLE], EXAMPLE_REQUIRED_DEFAULT,
     set(ALL_STRATEGIES) - {"ALWAYS_INCOMPATIBLE"}),
    ("User1 then User2, field without default", [USER1], USER2,
     {"FORWARD", "FORWARD_TRANSITIVE", "ALWAYS_COMPATIBLE"}),
    ("User1 then User2, field with default", [USER1], USER2_DEFAULT,
     set(ALL_STRATEGIES) - {"ALWAYS_INCOMPATIBLE"}),
    ("User2 then User1, field without default removed", [USER2], USER1,
     {"BACKWARD", "BACKWARD_TRANSITIVE", "ALWAYS_COMPATIBLE"}),
    ("User1 then User2, int promoted to long", [USER1], USER2_LONG_AGE,
     {"BACKWARD", "BACKWARD_TRANSITIVE", "ALWAYS_COMPATIBLE"}),
    ("User2 then User1, long to int", [USER2_LONG_AGE], USER1,
     {"FORWARD", "FORWARD_TRANSITIVE", "ALWAYS_COMPATIBLE"}),
    ("a Python CustomEnum gains a symbol", [record(f("c", nullable(ENUM_AB)), name="V1")],
     record(f("c", nullable(ENUM_ABC)), name="V2"), set(ALL_STRATEGIES) - {"ALWAYS_INCOMPATIBLE"}),
    ("renamed each version, only the latest is compatible", HISTORY, V3,
     {"BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FULL", "ALWAYS_COMPATIBLE"}),
]


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
@pytest.mark.parametrize(("case", "history", "new", "admitted"), STRATEGY_CASES,
                         ids=[c[0] for c in STRATEGY_CASES])
def test_each_strategy_on_evolving_record_classes(case: str, history: list[Any], new: Any,
                                                  admitted: set[str], strategy: str) -> None:
    existing = [avro(version) for version in history]
    if strategy in admitted:
        check_compatible(avro(new), existing, strategy)
    else:
        with pytest.raises(IncompatibleSchemaError, match=strategy):
            check_compatible(avro(new), existing, strategy)


def test_a_renamed_record_class_is_refused_only_for_its_fields() -> None:
    with pytest.raises(IncompatibleSchemaError,
                       match=r"BACKWARD: .*User2\.email: the reader's field is not written "
                             "and has no default"):
        check_compatible(avro(USER2), [avro(USER1)], "BACKWARD")
    assert "names differ" not in " ".join(read_problems(parse_avro(json.dumps(USER2)),
                                                        parse_avro(json.dumps(USER1))))


A_OF_INT = record(f("a", "int"), name="A")


def test_a_reader_union_reads_a_record_with_its_branch_of_the_same_name() -> None:
    # Avro's resolver takes the union branch of the writer's full name when there is one,
    # and only then one whose fields read the writer's record.
    a_needs_b = record(f("a", "int"), f("b", "int"), name="A")
    b_of_int = record(f("a", "int"), name="B")
    assert not reads(record(f("x", ["null", a_needs_b, b_of_int])), record(f("x", A_OF_INT)))
    assert reads(record(f("x", ["null", b_of_int])), record(f("x", A_OF_INT)))
    a_with_default = record(f("a", "int"), f("b", "int", default=0), name="A")
    assert reads(record(f("x", ["null", b_of_int, a_with_default])), record(f("x", A_OF_INT)))
    assert reads(record(f("x", ["null", "long"])), record(f("x", "int")))  # promoted


def test_a_problem_names_the_field_and_the_reason() -> None:
    problems = read_problems(parse_avro(json.dumps(record(f("a", "int"), f("b", "string")))),
                             parse_avro(json.dumps(V1)))
    assert problems == ["R.b: the reader's field is not written and has no default"]
    with pytest.raises(IncompatibleSchemaError, match=r"BACKWARD.*R\.b.*no default"):
        check_compatible(avro(record(f("a", "int"), f("b", "string"))), [avro(V1)],
                         "BACKWARD")


def test_transitive_strategies_check_every_version_the_others_only_the_latest() -> None:
    v1 = record(f("a", "int"))
    v2 = record(f("a", "int", default=0), f("b", "int", default=0))
    v3 = record(f("b", "int", default=0))  # drops a, which only v1 needs without a default
    history = [avro(v1), avro(v2)]
    check_compatible(avro(v3), history, "FORWARD")  # v2 reads v3: its a has a default
    with pytest.raises(IncompatibleSchemaError):
        check_compatible(avro(v3), history, "FORWARD_TRANSITIVE")


def test_always_incompatible_and_type_changes() -> None:
    with pytest.raises(IncompatibleSchemaError, match="ALWAYS_INCOMPATIBLE"):
        check_compatible(avro(V1), [avro(V1)], "ALWAYS_INCOMPATIBLE")
    check_compatible(avro(V1), [], "ALWAYS_INCOMPATIBLE")  # the first schema is free
    string = StoredSchema("s", pb.Schema.String, b"")
    with pytest.raises(IncompatibleSchemaError, match="STRING schema cannot be read as AVRO"):
        check_compatible(avro(V1), [string], "FULL")
    check_compatible(avro(V1), [string], "ALWAYS_COMPATIBLE")
    protobuf_v1 = StoredSchema("p", pb.Schema.Protobuf, b"one")
    check_compatible(StoredSchema("p", pb.Schema.Protobuf, b"two"), [protobuf_v1], "FULL")


def test_a_consumer_must_read_the_topics_data() -> None:
    writer = avro(record(f("a", "int"), f("b", "string")))
    check_readable(avro(record(f("a", "long"))), [writer], "FULL")  # skips b, promotes a
    with pytest.raises(IncompatibleSchemaError, match="consumer"):
        check_readable(avro(record(f("a", "int"), f("c", "int"))), [writer], "FULL")
    old = avro(record(f("z", "int")))
    check_readable(avro(record(f("a", "int"))), [old, writer], "BACKWARD")
    with pytest.raises(IncompatibleSchemaError):
        check_readable(avro(record(f("a", "int"))), [old, writer], "BACKWARD_TRANSITIVE")


def key_value(key: Any, value: Any, key_type: str = "AVRO",
              value_type: str = "AVRO") -> StoredSchema:
    parts = [json.dumps(p).encode() if not isinstance(p, bytes) else p for p in (key, value)]
    data = b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    return StoredSchema("kv", KEY_VALUE, data, (("key.schema.type", key_type),
                                                ("value.schema.type", value_type)))


def test_key_value_components_are_checked_separately() -> None:
    key = record(f("id", "long"), name="K")
    old = key_value(key, V1)
    check_compatible(key_value(key, record(f("a", "int"), f("b", "int", default=0))), [old],
                     "FULL")
    with pytest.raises(IncompatibleSchemaError, match=r"value R\.b"):
        check_compatible(key_value(key, record(f("a", "int"), f("b", "int"))), [old], "FULL")
    with pytest.raises(IncompatibleSchemaError, match=r"key K\.id"):
        check_compatible(key_value(record(f("id", "string"), name="K"), V1), [old], "FULL")
    with pytest.raises(IncompatibleSchemaError, match="key is AVRO written, STRING read"):
        check_compatible(key_value(b"", V1, key_type="STRING"), [old], "FULL")
    with pytest.raises(InvalidSchemaError, match="KEY_VALUE"):
        check_compatible(StoredSchema("kv", KEY_VALUE, b"\x00\x00\x00\x09ab"), [old], "FULL")


BAD_DEFINITIONS = [
    ("{not json", "not JSON"),
    ('{"type": "record", "fields": []}', "has no 'name'"),
    ('{"type": "record", "name": "R"}', "has no 'fields'"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a"}]}', "has no 'type'"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Missing"}]}',
     "unknown type 'Missing'"),
    ('{"type": "enum", "name": "E", "symbols": [1]}', "symbols"),
    ('{"type": "fixed", "name": "F", "size": "4"}', "size"),
    ("[]", "empty union"),
    ("42", "not a type"),
    ('{"type": 5}', "unknown type 5"),
    ('{"type": "wat"}', "unknown type 'wat'"),
    ("[" * 100_000, "nested deeper"),
    ('{"type": ' * 70 + '"int"' + "}" * 70, "nested deeper than 64 levels"),
]


@pytest.mark.parametrize(("text", "message"), BAD_DEFINITIONS)
def test_bad_definitions_are_invalid_schemas_naming_the_problem(text: str,
                                                                message: str) -> None:
    with pytest.raises(InvalidSchemaError, match=message):
        parse_avro(text)
    with pytest.raises(InvalidSchemaError):  # an IncompatibleSchemaError, never a crash
        check_compatible(StoredSchema("s", pb.Schema.Avro, text.encode()), [avro(V1)],
                         "ALWAYS_COMPATIBLE")


def test_logical_types_and_namespaces() -> None:
    stamp_old = record(f("t", {"type": "long", "logicalType": "timestamp-millis"}),
                       namespace="a.b")
    stamp_new = record(f("t", "long"), f("n", "null", default=None), namespace="a.b")
    assert reads(stamp_new, stamp_old)
    assert reads(stamp_old, stamp_new)
    parsed = parse_avro(json.dumps(record(f("x", {"type": "enum", "name": "E",
                                                  "symbols": ["A"]}),
                                          f("y", "a.b.E"), namespace="a.b")))
    assert set(parsed.names) == {"a.b.R", "a.b.E"}
