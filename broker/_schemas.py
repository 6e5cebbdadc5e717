"""The schema registry: the schemas of each topic, versioned, in the metadata store.

Theory of operation
-------------------
Each topic (the partitioned base for a partition) has a list of schema versions 0, 1, ...
stored as one JSON record under `b"schema/<topic>"` in the storage's metadata store. A
producer's schema is registered with `add`: a definition already stored gets its version back,
a new definition of the latest schema's type becomes the next version, and a different type is
IncompatibleSchema. Producers without a schema (bytes) are always admitted, and a consumer's
schema is only stored when the topic has none (`add_if_absent`). Version numbers travel on the
wire as 8 big-endian bytes.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from codec import pb
from storage import MetadataStore

from ._errors import IncompatibleSchemaError
from ._names import TopicName

__all__ = ["SCHEMA_VERSION_BYTES", "SchemaRegistry", "StoredSchema", "encode_schema_version"]

SCHEMA_KEY_PREFIX: Final = b"schema/"
SCHEMA_VERSION_BYTES: Final = 8

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


def encode_schema_version(version: int) -> bytes:
    """Pulsar's schema version bytes: the version as an 8-byte big-endian number."""
    assert version >= 0
    return version.to_bytes(SCHEMA_VERSION_BYTES, "big")


class SchemaRegistry:
    """Schemas per topic in the metadata store (see the module comment for the policy).

    Args:
        metadata: the storage's metadata store; records live under `b"schema/<topic>"`.
    """

    def __init__(self, metadata: MetadataStore):
        self.metadata = metadata

    @staticmethod
    def _key(topic: TopicName) -> bytes:
        return SCHEMA_KEY_PREFIX + quote(str(topic.partitioned_base), safe=":/").encode()

    def versions(self, topic: TopicName) -> list[StoredSchema]:
        """Every version of the topic's schema, oldest first (empty: no schema)."""
        raw = self.metadata.get(self._key(topic))
        if raw is None:
            return []
        return [StoredSchema.from_json(item) for item in json.loads(raw)["versions"]]

    def get(self, topic: TopicName, version: int | None = None) -> tuple[int, StoredSchema] | None:
        """The requested version (the latest when None), or None when there is no such one."""
        versions = self.versions(topic)
        if not versions:
            return None
        index = len(versions) - 1 if version is None else version
        if not 0 <= index < len(versions):
            return None
        return index, versions[index]

    def add(self, topic: TopicName, schema: StoredSchema) -> int:
        """Register a producer's schema; returns its version.

        Raises:
            IncompatibleSchemaError: the topic's latest schema has another type.
        """
        versions = self.versions(topic)
        if schema in versions:
            return versions.index(schema)
        if versions and versions[-1].type != schema.type:
            latest = pb.Schema.Type.Name(versions[-1].type)
            raise IncompatibleSchemaError(
                f"Trying to register a {pb.Schema.Type.Name(schema.type)} schema "
                f"on topic {topic.partitioned_base} whose schema is {latest}")
        versions.append(schema)
        record = {"versions": [v.to_json() for v in versions]}
        self.metadata.put(self._key(topic), json.dumps(record, separators=(",", ":")).encode())
        return len(versions) - 1

    def add_if_absent(self, topic: TopicName, schema: StoredSchema) -> None:
        """A consumer's schema: stored only when the topic has none yet."""
        if not self.versions(topic):
            self.add(topic, schema)
