"""The schema registry over a real storage and service: versions, strategies from the
namespace policies and the broker default, deletion, consumers and topic deletion."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from magnetar.broker import BrokerService, TopicName
from magnetar.broker._errors import IncompatibleSchemaError, InvalidSchemaError
from magnetar.broker.schemas._schemas import StoredSchema
from magnetar.codec import pb

from .helpers import broker_env

TOPIC = TopicName.parse("persistent://public/default/t")
NS = "public/default"


def avro(*fields: tuple[str, str, Any]) -> StoredSchema:
    """An AVRO record R with fields (name, type, default or ... for none)."""
    items = [{"name": n, "type": t, **({} if d is ... else {"default": d})}
             for n, t, d in fields]
    definition = {"type": "record", "name": "R", "fields": items}
    return StoredSchema("R", pb.Schema.Avro, json.dumps(definition).encode())


V1 = avro(("a", "int", ...))
V2 = avro(("a", "int", ...), ("b", "string", ""))  # adds b with a default
NO_DEFAULT = avro(("a", "int", ...), ("c", "string", ...))
STRING = StoredSchema("s", pb.Schema.String, b"")


@asynccontextmanager
async def serving(tmp_path: Path, **config: Any) -> AsyncIterator[BrokerService]:
    """A started in-process service over a real storage in `tmp_path`, closed on the way out."""
    async with broker_env(tmp_path, **config) as env:
        yield env.service


async def test_versions_grow_and_identical_schemas_reuse_theirs(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        registry = service.schemas
        assert registry.get(TOPIC) is None
        assert registry.add(TOPIC, V1) == 0
        assert registry.add(TOPIC, V2) == 1
        assert registry.add(TOPIC, V1) == 0  # registered already: its version
        partition = TOPIC.partition(3)  # partitions share the base's schemas
        assert registry.add(partition, V2) == 1
        latest = registry.get(TOPIC)
        assert latest is not None
        assert (latest.version, latest.schema) == (1, V2)
        assert latest.timestamp_ms > 0
        with pytest.raises(IncompatibleSchemaError, match="no default"):
            registry.add(TOPIC, NO_DEFAULT)
        with pytest.raises(IncompatibleSchemaError, match="STRING"):
            registry.add(TOPIC, STRING)
        assert [e.version for e in registry.history(TOPIC)] == [0, 1]  # refusals store nothing


async def test_primitive_types_are_one_version_whatever_their_data(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        other = TopicName.parse("persistent://public/default/strings")
        assert service.schemas.add(other, STRING) == 0
        assert service.schemas.add(other, StoredSchema("x", pb.Schema.String, b"null")) == 0
        protobuf = StoredSchema("p", pb.Schema.Protobuf, b"one")
        assert service.schemas.add(TOPIC, protobuf) == 0
        # PROTOBUF (and PROTOBUF_NATIVE): a new definition is admitted as a new version.
        assert service.schemas.add(TOPIC, StoredSchema("p", pb.Schema.Protobuf, b"two")) == 1


async def test_the_namespace_strategy_beats_the_broker_default(tmp_path: Path) -> None:
    async with serving(tmp_path, schema_compatibility_strategy="BACKWARD") as service:
        registry = service.schemas
        registry.add(TOPIC, V1)
        with pytest.raises(IncompatibleSchemaError, match="BACKWARD"):
            registry.add(TOPIC, NO_DEFAULT)  # the broker default here is BACKWARD
        service.namespaces.set_policy(NS, "schema_compatibility_strategy", "FORWARD")
        assert registry.add(TOPIC, NO_DEFAULT) == 1  # the old schema reads it
        service.namespaces.set_policy(NS, "schema_compatibility_strategy", "UNDEFINED")
        assert registry.policy(TOPIC).compatibility_strategy == "BACKWARD"
        service.namespaces.set_policy(NS, "schema_compatibility_strategy",
                                      "ALWAYS_COMPATIBLE")
        assert registry.add(TOPIC, STRING) == 2  # even a change of type


async def test_transitive_strategies_compare_with_every_version(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        registry = service.schemas
        # v1 adds b without a default: build the history under ALWAYS_COMPATIBLE.
        service.namespaces.set_policy(NS, "schema_compatibility_strategy", "ALWAYS_COMPATIBLE")
        registry.add(TOPIC, avro(("a", "int", ...)))
        registry.add(TOPIC, avro(("a", "int", ...), ("b", "int", ...)))
        newest = avro(("a", "int", ...), ("b", "int", ...), ("c", "int", 0))
        service.namespaces.set_policy(NS, "schema_compatibility_strategy",
                                      "BACKWARD_TRANSITIVE")
        with pytest.raises(IncompatibleSchemaError, match=r"R\.b"):
            registry.add(TOPIC, newest)  # cannot read v0's data: b has no default
        service.namespaces.set_policy(NS, "schema_compatibility_strategy", "BACKWARD")
        assert registry.add(TOPIC, newest) == 2  # the latest alone is readable


async def test_auto_update_off_admits_only_registered_schemas(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        registry = service.schemas
        service.namespaces.set_policy(NS, "is_allow_auto_update_schema", False)
        assert registry.add(TOPIC, V1) == 0  # a topic without a schema takes one
        with pytest.raises(IncompatibleSchemaError, match="auto updating is disabled"):
            registry.add(TOPIC, V2)
        assert registry.add(TOPIC, V1) == 0
        service.namespaces.set_policy(NS, "is_allow_auto_update_schema", None)
        assert registry.add(TOPIC, V2) == 1


async def test_validation_enforced_refuses_schemaless_producers_on_topics_with_a_schema(
        tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        registry = service.schemas
        service.namespaces.set_policy(NS, "schema_validation_enforced", True)
        registry.admit_schemaless_producer(TOPIC)  # no schema yet: fine
        registry.add(TOPIC, V1)
        with pytest.raises(IncompatibleSchemaError, match="enforces schema validation"):
            registry.admit_schemaless_producer(TOPIC)
        service.namespaces.set_policy(NS, "schema_validation_enforced", False)
        registry.admit_schemaless_producer(TOPIC)


async def test_consumers_store_a_first_schema_and_must_read_the_topics(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        registry = service.schemas
        registry.admit_consumer(TOPIC, V2)
        assert registry.versions(TOPIC) == [V2]
        registry.admit_consumer(TOPIC, V1)  # reads V2's data (skips b); not stored
        registry.admit_consumer(TOPIC, V2)
        assert registry.versions(TOPIC) == [V2]
        with pytest.raises(IncompatibleSchemaError, match="consumer"):
            registry.admit_consumer(TOPIC, NO_DEFAULT)
        with pytest.raises(IncompatibleSchemaError):
            registry.admit_consumer(TOPIC, STRING)
        with pytest.raises(InvalidSchemaError):
            registry.admit_consumer(TopicName.parse("fresh"),
                                    StoredSchema("x", pb.Schema.Avro, b"{oops"))
        assert registry.get(TopicName.parse("fresh")) is None
        auto = StoredSchema("auto", pb.Schema.AutoConsume, b"")
        registry.admit_consumer(TOPIC, auto)  # takes whatever the topic has
        registry.admit_consumer(TopicName.parse("fresh"), auto)
        assert registry.get(TopicName.parse("fresh")) is None  # and is never stored


def test_the_broker_default_strategy_is_a_checked_setting() -> None:
    from magnetar.broker.cli._standalone import config_with_overrides

    assert config_with_overrides([]).schema_compatibility_strategy == "FULL"
    assert config_with_overrides(["schema_compatibility_strategy=FORWARD"]
                                 ).schema_compatibility_strategy == "FORWARD"
    with pytest.raises(ValueError, match="schema_compatibility_strategy must be one of"):
        config_with_overrides(["schema_compatibility_strategy=SOMETIMES"])


async def test_deletion_frees_the_topic_and_never_reuses_versions(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        registry = service.schemas
        registry.add(TOPIC, V1)
        registry.add(TOPIC, V2)
        assert registry.delete(TOPIC) == 2
        assert registry.get(TOPIC) is None
        assert registry.history(TOPIC) == []
        assert registry.delete(TOPIC) is None  # nothing left to delete
        assert registry.add(TOPIC, STRING) == 3  # any schema, the next version
        old = registry.get(TOPIC, 1)
        assert old is not None
        assert old.schema == V2  # old versions stay readable
        assert registry.get(TOPIC, 2) is None  # the marker is no schema
        assert [e.version for e in registry.history(TOPIC)] == [3]


async def test_deleting_a_topic_deletes_its_schemas(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        await service.create_topic(TOPIC)
        service.schemas.add(TOPIC, V1)
        await service.delete_topic(TOPIC)
        assert service.schemas.get(TOPIC) is None
        assert service.schemas.get(TOPIC, 0) is None
        base = TopicName.parse("persistent://public/default/parts")
        await service.create_partitioned_topic(base, 2)
        service.schemas.add(base.partition(0), V1)
        assert service.schemas.get(base) is not None
        await service.delete_partitioned_topic(base)
        assert service.schemas.get(base) is None


async def test_schemas_survive_a_restart(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        env.service.schemas.add(TOPIC, V1)
        env.service.schemas.delete(TOPIC)
        env.service.schemas.add(TOPIC, V2)
        service = await env.restart()
        assert [(e.version, e.schema) for e in service.schemas.history(TOPIC)] == [(2, V2)]
