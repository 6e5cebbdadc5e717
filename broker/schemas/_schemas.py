"""The schema registry: the schemas of each topic, versioned, in the metadata store.

Theory of operation
-------------------
Each topic (the partitioned base for a partition) has a history of schema versions 0, 1, ...
stored as one JSON record under `b"schema/<topic>"` in the storage's metadata store: a list
whose index is the version, each item a schema (name, type, data, properties, timestamp) or
a deletion marker. The *active* versions are those after the last marker; a topic whose
latest item is a marker (or that has none) has no schema. Deleting a schema appends a
marker, so versions keep growing and are never reused; deleting the topic removes the record.

Admission follows Pulsar, with the topic's `SchemaPolicy` (namespace policies over the
broker configuration; `_schema_compat` has the strategies):

* a producer's schema (`add`): an active version with the same type and definition (for
  the primitive types: the same type) is reused; a topic without a schema takes any schema;
  otherwise, with isAllowAutoUpdateSchema off the schema is refused, else it must pass the
  strategy's check against the active versions and becomes the next version;
* a producer without a schema (`admit_schemaless_producer`) is refused when the topic has a
  schema and schemaValidationEnforced is on;
* a consumer's schema (`admit_consumer`) is stored when the topic has none, else it must be
  registered already or able to read the active versions (`check_readable`); an
  AUTO_CONSUME consumer takes whatever the topic has and is never checked;
* `check` answers the admin's compatibility test without registering anything.

Refusals raise IncompatibleSchemaError (InvalidSchemaError for a definition that does not
parse) and leave the record unchanged. Version numbers travel on the wire as 8 big-endian
bytes.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from magnetar.codec import pb
from magnetar.storage import LedgerMetadata

from .._errors import IncompatibleSchemaError
from .._names import TopicName
from .._namespaces import NamespaceRegistry, SchemaPolicy
from ._schema_compat import (
    BROKER_DEFAULT_STRATEGY,
    KEY_VALUE,
    check_compatible,
    check_readable,
)

__all__ = ["SCHEMA_VERSION_BYTES", "SchemaEntry", "SchemaRegistry", "StoredSchema",
           "encode_schema_version"]

SCHEMA_KEY_PREFIX: Final = b"schema/"
SCHEMA_VERSION_BYTES: Final = 8
# Types whose definition is their data: a new definition is a new version. The others are
# primitives: the type is the whole schema.
TYPES_WITH_DATA: Final = frozenset({pb.Schema.Avro, pb.Schema.Json, pb.Schema.Protobuf,
                                    pb.Schema.ProtobufNative, KEY_VALUE,
                                    pb.Schema.External})
AUTO_CONSUME: Final = pb.Schema.AutoConsume
DEFAULT_POLICY: Final = SchemaPolicy(BROKER_DEFAULT_STRATEGY, True, False)


@dataclass(frozen=True)
class StoredSchema:
    """One schema version as the registry keeps it."""

    name: str
    type: int  # a pb.Schema.Type value
    data: bytes
    properties: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_proto(cls, schema: pb.Schema) -> StoredSchema:
        pairs = tuple(sorted((p.key, p.value) for p in schema.properties))
        return cls(schema.name, int(schema.type), bytes(schema.schema_data), pairs)

    def to_proto(self) -> pb.Schema:
        schema = pb.Schema(name=self.name, schema_data=self.data, type=self.type)  # type: ignore[arg-type]
        for key, value in self.properties:
            schema.properties.add(key=key, value=value)
        return schema

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type,
                "data": base64.b64encode(self.data).decode(), "properties": dict(self.properties)}

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> StoredSchema:
        pairs = tuple(sorted(item.get("properties", {}).items()))
        return cls(item["name"], int(item["type"]), base64.b64decode(item["data"]), pairs)

    def same_as(self, other: StoredSchema) -> bool:
        """Whether registering `other` would register this one again."""
        if self.type != other.type:
            return False
        if self.type not in TYPES_WITH_DATA:
            return True
        if self.type == KEY_VALUE and self.properties != other.properties:
            return False  # the component types live in the properties
        return self.data == other.data


@dataclass(frozen=True)
class SchemaEntry:
    """A registered version: its number, the schema and when it was registered."""

    version: int
    schema: StoredSchema
    timestamp_ms: int


def encode_schema_version(version: int) -> bytes:
    """Pulsar's schema version bytes: the version as an 8-byte big-endian number."""
    assert version >= 0
    return version.to_bytes(SCHEMA_VERSION_BYTES, "big")


class SchemaRegistry:
    """Schemas per topic in the metadata store (see the module comment for the policy).

    Args:
        metadata: the storage's metadata store; records live under `b"schema/<topic>"`.
        namespaces: where the schema policies come from; None: the broker defaults (FULL,
            auto update on, validation not enforced).
        clock: the time source of the registration timestamps, in seconds.
    """

    def __init__(self, metadata: LedgerMetadata, namespaces: NamespaceRegistry | None = None,
                 clock: Callable[[], float] = time.time):
        self.metadata = metadata
        self.namespaces = namespaces
        self.clock = clock

    @staticmethod
    def _key(topic: TopicName) -> bytes:
        return SCHEMA_KEY_PREFIX + quote(str(topic.partitioned_base), safe=":/").encode()

    def _items(self, topic: TopicName) -> list[dict[str, Any]]:
        raw = self.metadata.get(self._key(topic))
        return [] if raw is None else list(json.loads(raw)["versions"])

    def _store(self, topic: TopicName, items: list[dict[str, Any]]) -> None:
        record = {"versions": items}
        self.metadata.put(self._key(topic), json.dumps(record, separators=(",", ":")).encode())

    @staticmethod
    def _entry(version: int, item: dict[str, Any]) -> SchemaEntry:
        assert not item.get("deleted")
        return SchemaEntry(version, StoredSchema.from_json(item), int(item.get("timestamp", 0)))

    def policy(self, topic: TopicName) -> SchemaPolicy:
        """The schema policies in force for the topic."""
        if self.namespaces is None:
            return DEFAULT_POLICY
        base = topic.partitioned_base
        return self.namespaces.schema_policy(str(base), base.namespace_name)

    # -- reading ---------------------------------------------------------------------------

    def history(self, topic: TopicName) -> list[SchemaEntry]:
        """The active versions, oldest first (empty: the topic has no schema)."""
        items = self._items(topic)
        start = max((i + 1 for i, item in enumerate(items) if item.get("deleted")), default=0)
        return [self._entry(i, items[i]) for i in range(start, len(items))]

    def versions(self, topic: TopicName) -> list[StoredSchema]:
        """The active schemas, oldest first (empty: no schema)."""
        return [entry.schema for entry in self.history(topic)]

    def get(self, topic: TopicName, version: int | None = None) -> SchemaEntry | None:
        """The requested version (the latest active one when None), or None when there is
        no such version, it marks a deletion, or (latest) the topic has no schema."""
        items = self._items(topic)
        index = len(items) - 1 if version is None else version
        if not 0 <= index < len(items) or items[index].get("deleted"):
            return None
        return self._entry(index, items[index])

    def find(self, topic: TopicName, schema: StoredSchema) -> SchemaEntry | None:
        """The active version `schema` would reuse, if any."""
        return next((e for e in self.history(topic) if e.schema.same_as(schema)), None)

    # -- admission -------------------------------------------------------------------------

    def add(self, topic: TopicName, schema: StoredSchema) -> int:
        """Register a producer's (or an admin's) schema; returns its version.

        Raises:
            IncompatibleSchemaError: refused by the topic's policies (nothing is stored).
            InvalidSchemaError: the definition does not parse (nothing is stored).
        """
        active = self.history(topic)
        found = next((e for e in active if e.schema.same_as(schema)), None)
        if found is not None:
            return found.version
        policy = self.policy(topic)
        if active and not policy.allow_auto_update:
            raise IncompatibleSchemaError(
                f"Schema not found and schema auto updating is disabled for "
                f"{topic.partitioned_base} (isAllowAutoUpdateSchema is false)")
        check_compatible(schema, [e.schema for e in active], policy.compatibility_strategy)
        return self._append(topic, schema.to_json())

    def admit_schemaless_producer(self, topic: TopicName) -> None:
        """Whether a producer without a schema may publish.

        Raises:
            IncompatibleSchemaError: the topic has a schema and schema validation is enforced.
        """
        if self.policy(topic).validation_enforced and self.history(topic):
            raise IncompatibleSchemaError(
                f"Producers without a schema are refused on {topic.partitioned_base}: it has "
                "a schema and its namespace enforces schema validation")

    def admit_consumer(self, topic: TopicName, schema: StoredSchema) -> None:
        """A consumer's schema: stored when the topic has none, else it must be registered
        or able to read the topic's data.

        Raises:
            IncompatibleSchemaError: it cannot read it (nothing is stored).
            InvalidSchemaError: the definition does not parse (nothing is stored).
        """
        if schema.type == AUTO_CONSUME:
            return  # it takes whatever the topic has, as in Pulsar
        active = self.history(topic)
        if not active:
            check_compatible(schema, [], self.policy(topic).compatibility_strategy)
            self._append(topic, schema.to_json())
        elif not any(e.schema.same_as(schema) for e in active):
            check_readable(schema, [e.schema for e in active],
                           self.policy(topic).compatibility_strategy)

    def check(self, topic: TopicName, schema: StoredSchema) -> str:
        """Test `schema` against the topic's versions without registering it; returns the
        strategy applied.

        Raises:
            IncompatibleSchemaError: it would be refused.
        """
        strategy = self.policy(topic).compatibility_strategy
        active = self.history(topic)
        if not any(e.schema.same_as(schema) for e in active):
            check_compatible(schema, [e.schema for e in active], strategy)
        return strategy

    # -- deletion --------------------------------------------------------------------------

    def delete(self, topic: TopicName) -> int | None:
        """Delete the topic's schema (a marker version); returns the marker's version, None
        when the topic has no schema (nothing changes then)."""
        if not self.history(topic):
            return None
        return self._append(topic, {"deleted": True})

    def delete_all(self, topic: TopicName) -> None:
        """Forget every version (the topic is deleted)."""
        self.metadata.delete(self._key(topic))

    def _append(self, topic: TopicName, item: dict[str, Any]) -> int:
        items = self._items(topic)
        items.append({**item, "timestamp": int(self.clock() * 1000)})
        self._store(topic, items)
        return len(items) - 1

