"""Schema compatibility: Pulsar's strategies applied to one new schema and a topic's versions.

Theory of operation
-------------------
A strategy (Pulsar's SchemaCompatibilityStrategy names) says which registered versions a
new schema is compared with and in which direction:

| strategy              | compared with | the check                                   |
|-----------------------|---------------|---------------------------------------------|
| ALWAYS_COMPATIBLE     | nothing       | always admitted, even a change of type       |
| ALWAYS_INCOMPATIBLE   | -             | only a schema already registered is admitted |
| BACKWARD              | the latest    | the new schema reads data written with it    |
| FORWARD               | the latest    | it reads data written with the new schema    |
| FULL                  | the latest    | both                                         |
| *_TRANSITIVE          | every version | the same, against each one                   |

UNDEFINED (a namespace that sets nothing) means the broker's default
(`NamespaceRegistry.schema_policy` resolves it; the checks never see it).
A pair of versions is compared by type: a different type is incompatible; AVRO and JSON
(whose definitions are Avro records) with Avro's resolution rules (`_avro_compat`);
KEY_VALUE component by component (its schema data packs the key's and the value's
definitions, each behind a 4-byte big-endian length; the properties `key.schema.type` and
`value.schema.type` name their types); every other type with data (PROTOBUF,
PROTOBUF_NATIVE, ...) admits any new definition of the same type as a new version, and the
primitive types (STRING, INT32, ...) have nothing to compare.

A consumer's schema is checked in the read direction only (`check_readable`): it must read
what was written with the latest version (the transitive strategies: with every version).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from magnetar.codec import pb

from .._config import SCHEMA_STRATEGIES
from .._errors import IncompatibleSchemaError, InvalidSchemaError
from ._avro_compat import ParsedAvro, parse_avro, read_problems

__all__ = ["BROKER_DEFAULT_STRATEGY", "KEY_VALUE", "NAME_TO_WIRE", "STRATEGIES", "SchemaDefinition",
           "check_compatible", "check_readable", "type_name", "validate"]

STRATEGIES: Final = ("UNDEFINED", *SCHEMA_STRATEGIES)
BROKER_DEFAULT_STRATEGY: Final = "FULL"
KEY_VALUE: Final = pb.Schema.Type.Value("KeyValue")  # the stub's Schema.KeyValue is a message
AVRO_TYPES: Final = frozenset({pb.Schema.Avro, pb.Schema.Json})
KV_LENGTH_BYTES: Final = 4
KV_PROPERTY_TYPES: Final = ("key.schema.type", "value.schema.type")
# Pulsar's SchemaType names of the components a KEY_VALUE schema may carry.
KV_AVRO_NAMES: Final = frozenset({"AVRO", "JSON"})


class SchemaDefinition(Protocol):
    """What the checks read of a schema (StoredSchema has it)."""

    @property
    def type(self) -> int: ...  # a pb.Schema.Type value

    @property
    def data(self) -> bytes: ...

    @property
    def properties(self) -> tuple[tuple[str, str], ...]: ...


def validate(schema: SchemaDefinition) -> None:
    """Check that the definition parses (AVRO/JSON, KEY_VALUE components).

    Raises:
        InvalidSchemaError: what is wrong with it.
    """
    if schema.type in AVRO_TYPES:
        parse_avro(schema.data)
    elif schema.type == KEY_VALUE:
        for kind, data in _components(schema):
            if kind in KV_AVRO_NAMES:
                parse_avro(data)


def check_compatible(new: SchemaDefinition, existing: Sequence[SchemaDefinition],
                     strategy: str) -> None:
    """Whether `new` may follow `existing` (oldest first) as the next version.

    Raises:
        IncompatibleSchemaError: it may not; the message says why.
        InvalidSchemaError: `new` does not parse.
    """
    assert strategy in SCHEMA_STRATEGIES, strategy
    validate(new)
    if strategy == "ALWAYS_COMPATIBLE" or not existing:
        return
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchemaError("The schema compatibility strategy is "
                                      "ALWAYS_INCOMPATIBLE: no new schema is admitted")
    base = strategy.removesuffix("_TRANSITIVE")
    targets = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    for old in reversed(targets):
        if base in ("BACKWARD", "FULL"):
            _check_pair(new, old, f"{strategy}: the new schema cannot read data written "
                                  "with an existing one")
        if base in ("FORWARD", "FULL"):
            _check_pair(old, new, f"{strategy}: an existing schema cannot read data "
                                  "written with the new one")


def check_readable(reader: SchemaDefinition, existing: Sequence[SchemaDefinition],
                   strategy: str) -> None:
    """Whether a consumer with schema `reader` can read the topic's data.

    Raises:
        IncompatibleSchemaError: it cannot; the message says why.
    """
    assert strategy in SCHEMA_STRATEGIES, strategy
    validate(reader)
    if strategy == "ALWAYS_COMPATIBLE" or not existing:
        return
    if strategy == "ALWAYS_INCOMPATIBLE":
        raise IncompatibleSchemaError("The schema compatibility strategy is "
                                      "ALWAYS_INCOMPATIBLE: only a registered schema may "
                                      "subscribe")
    targets = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    for writer in reversed(targets):
        _check_pair(reader, writer, f"{strategy}: the consumer's schema cannot read data "
                                    "written with the topic's schema")


def _check_pair(reader: SchemaDefinition, writer: SchemaDefinition, context: str) -> None:
    if reader.type != writer.type:
        raise IncompatibleSchemaError(
            f"{context}: a {type_name(writer.type)} schema cannot be read as "
            f"{type_name(reader.type)}")
    problems: list[str] = []
    if reader.type in AVRO_TYPES:
        problems = read_problems(_parsed(reader.data), _parsed(writer.data))
    elif reader.type == KEY_VALUE:
        for part, (r, w) in zip(("key", "value"), zip(_components(reader),
                                                      _components(writer), strict=True),
                                strict=True):
            if r[0] != w[0]:
                problems.append(f"the {part} is {w[0]} written, {r[0]} read")
            elif r[0] in KV_AVRO_NAMES:
                problems += [f"{part} {p}" for p in read_problems(_parsed(r[1]),
                                                                  _parsed(w[1]))]
    if problems:
        raise IncompatibleSchemaError(f"{context}: {'; '.join(problems)}")


def _parsed(data: bytes) -> ParsedAvro:
    return parse_avro(data)


def _components(schema: SchemaDefinition) -> list[tuple[str, bytes]]:
    """[(key type name, key data), (value type name, value data)] of a KEY_VALUE schema.

    Raises:
        InvalidSchemaError: the data is not two length-prefixed parts.
    """
    data, offset, parts = schema.data, 0, []
    properties = dict(schema.properties)
    for name in KV_PROPERTY_TYPES:
        if offset + KV_LENGTH_BYTES > len(data):
            raise InvalidSchemaError(f"Invalid KEY_VALUE schema: no length of the "
                                     f"{name.split('.')[0]} schema at byte {offset}")
        length = int.from_bytes(data[offset:offset + KV_LENGTH_BYTES], "big", signed=True)
        offset += KV_LENGTH_BYTES
        length = max(length, 0)  # Pulsar writes -1 for an empty part
        if offset + length > len(data):
            raise InvalidSchemaError(f"Invalid KEY_VALUE schema: the {name.split('.')[0]} "
                                     f"schema needs {length} bytes at byte {offset}, "
                                     f"{len(data) - offset} remain")
        parts.append((properties.get(name, "BYTES").upper(), data[offset:offset + length]))
        offset += length
    return parts


def type_name(schema_type: int) -> str:
    """Pulsar's SchemaType name of a wire Schema.Type value (e.g. AVRO, KEY_VALUE)."""
    return WIRE_TO_NAME.get(schema_type, pb.Schema.Type.Name(schema_type).upper())


WIRE_TO_NAME: Final[dict[int, str]] = {
    pb.Schema.Type.Value("None"): "NONE", pb.Schema.String: "STRING", pb.Schema.Json: "JSON",
    pb.Schema.Protobuf: "PROTOBUF", pb.Schema.Avro: "AVRO", pb.Schema.Bool: "BOOLEAN",
    pb.Schema.Int8: "INT8", pb.Schema.Int16: "INT16", pb.Schema.Int32: "INT32",
    pb.Schema.Int64: "INT64", pb.Schema.Float: "FLOAT", pb.Schema.Double: "DOUBLE",
    pb.Schema.Date: "DATE", pb.Schema.Time: "TIME", pb.Schema.Timestamp: "TIMESTAMP",
    KEY_VALUE: "KEY_VALUE", pb.Schema.Instant: "INSTANT",
    pb.Schema.LocalDate: "LOCAL_DATE", pb.Schema.LocalTime: "LOCAL_TIME",
    pb.Schema.LocalDateTime: "LOCAL_DATE_TIME", pb.Schema.ProtobufNative: "PROTOBUF_NATIVE",
    pb.Schema.AutoConsume: "AUTO_CONSUME", pb.Schema.External: "EXTERNAL",
}
NAME_TO_WIRE: Final[dict[str, int]] = {name: value for value, name in WIRE_TO_NAME.items()}
