"""Schema evolution through the official client: AVRO/JSON records evolve under the broker's
FULL default, incompatible producers and consumers get IncompatibleSchema, consumers decode
old records with the writer's schema fetched by GET_SCHEMA, and the namespace policies
isAllowAutoUpdateSchema and schemaValidationEnforced (set over the admin API) apply."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import _pulsar
import pulsar
import pytest
from pulsar.schema import (
    Array,
    AvroSchema,
    Boolean,
    Integer,
    JsonSchema,
    Long,
    Map,
    Record,
    String,
    StringSchema,
)

from . import HTTP_TIMEOUT_S, HttpBrokerProcess
from .conftest import new_client

pytestmark = pytest.mark.interop

RECEIVE_TIMEOUT_MS = 10_000


def _point_v1() -> type[Record]:
    class Point(Record):  # the Avro record name is the class name: each version is "Point"
        _avro_namespace = "magnetar.test"
        name = String()
        x = Integer()
    return Point


def _point_v2() -> type[Record]:
    class Point(Record):
        _avro_namespace = "magnetar.test"
        name = String()
        x = Integer()
        y = Integer(default=7, required=True, required_default=True)
    return Point


def _point_no_default() -> type[Record]:
    class Point(Record):
        _avro_namespace = "magnetar.test"
        name = String()
        x = Integer()
        z = Integer(required=True)  # no default: v2 cannot read v1's records
    return Point


PointV1 = _point_v1()
PointV2 = _point_v2()
PointNoDefault = _point_no_default()


# Python users evolve a schema by writing a new Record class: the Avro record takes the new
# class's name. Pulsar's check does not compare record names (these pairs come from the
# official Python client's own tests, run against Pulsar).
class MySubRecord(Record):
    _sorted_fields = True
    x = Integer()
    y = Long()
    z = String()


class Example(Record):
    a = Integer()
    b = Boolean(required=True)
    c = Long()
    h = Array(String())
    i = Map(String())
    j = MySubRecord()


class ExampleRequiredDefault(Record):
    _sorted_fields = True
    a = Integer(required_default=True)
    b = Boolean(required=True, required_default=True)
    c = Long(required_default=True)
    h = Array(String(), required_default=True)
    i = Map(String(), required_default=True)
    j = MySubRecord(required_default=True)


class User1(Record):
    name = String()
    age = Integer()


class User2(Record):
    name = String()
    age = Integer()
    email = String()  # ["null", "string"] without a default: User2 cannot read User1's data


class User3(Record):  # User1's fields under another name
    name = String()
    age = Integer()


@pytest.fixture(scope="module")
def http_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpBrokerProcess]:
    base = tmp_path_factory.mktemp("schema-broker")
    process = HttpBrokerProcess(base / "data", base / "broker.log")
    process.start()
    yield process
    process.cleanup()


@pytest.fixture
def schema_client(http_broker: HttpBrokerProcess) -> Iterator[pulsar.Client]:
    official = new_client(http_broker.url)
    yield official
    official.close()


def admin(process: HttpBrokerProcess, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{process.http_port}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
        raw = answer.read()
    return json.loads(raw) if raw.strip() else None


def fresh_namespace(process: HttpBrokerProcess, **policies: Any) -> str:
    """A new namespace of tenant public with the given policy endpoints set."""
    namespace = f"public/schemas-{uuid.uuid4().hex[:8]}"
    admin(process, "PUT", f"/admin/v2/namespaces/{namespace}")
    for endpoint, value in policies.items():
        admin(process, "POST", f"/admin/v2/namespaces/{namespace}/{endpoint}", value)
    return namespace


def topic_in(namespace: str) -> str:
    return f"persistent://{namespace}/t-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("schema_class", [AvroSchema, JsonSchema])
def test_a_field_with_a_default_evolves_and_old_records_decode(
        schema_client: pulsar.Client, http_broker: HttpBrokerProcess,
        schema_class: Any) -> None:
    topic = topic_in("public/default")
    v1 = schema_client.create_producer(topic, schema=schema_class(PointV1))
    v1.send(PointV1(name="old", x=1))
    v2 = schema_client.create_producer(topic, schema=schema_class(PointV2))
    v2.send(PointV2(name="new", x=2, y=3))
    versions = admin(http_broker, "GET",
                     f"/admin/v2/schemas/public/default/{topic.rsplit('/', 1)[1]}/schemas")
    assert [v["version"] for v in versions["getSchemaResponses"]] == [0, 1]
    consumer = schema_client.subscribe(topic, "s", schema=schema_class(PointV2),
                                       initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(RECEIVE_TIMEOUT_MS) for _ in range(2)]
    # The client shows the version bytes as a str of code points.
    assert [m.schema_version().encode("latin-1") for m in got] == [bytes(8),
                                                                   (1).to_bytes(8, "big")]
    if schema_class is AvroSchema:  # decoded with the writer's schema: y takes its default
        assert [(p.name, p.x, p.y) for p in (m.value() for m in got)] == [("old", 1, 7),
                                                                          ("new", 2, 3)]
    else:
        assert [m.value().name for m in got] == ["old", "new"]
    for closable in (consumer, v1, v2):
        closable.close()


def test_a_renamed_record_class_evolves_under_full(schema_client: pulsar.Client) -> None:
    topic = topic_in("public/default")  # the namespace sets nothing: the broker's FULL
    producer = schema_client.create_producer(topic, schema=AvroSchema(Example))
    renamed = schema_client.create_producer(topic, schema=AvroSchema(ExampleRequiredDefault))
    consumer = schema_client.subscribe(topic, "old-class", schema=AvroSchema(Example))
    renamed.send(ExampleRequiredDefault(b=True, c=3))
    producer.send(Example(b=False, c=4))
    assert [consumer.receive(RECEIVE_TIMEOUT_MS).value().c for _ in range(2)] == [3, 4]
    for client_object in (consumer, renamed, producer):
        client_object.close()


def post_schema(process: HttpBrokerProcess, topic: str, record: type[Record]) -> tuple[int, str]:
    """POST the record's Avro schema as the topic's next version: (HTTP status, body)."""
    path = topic.removeprefix("persistent://")
    payload = {"type": "AVRO", "schema": AvroSchema(record).schema_info().schema(),
               "properties": {}}
    try:
        return 200, json.dumps(admin(process, "POST", f"/admin/v2/schemas/{path}/schema",
                                     payload))
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def test_a_renamed_record_class_is_checked_by_its_fields_under_each_direction(
        schema_client: pulsar.Client, http_broker: HttpBrokerProcess) -> None:
    forward = topic_in(fresh_namespace(http_broker, schemaCompatibilityStrategy="FORWARD"))
    schema_client.create_producer(forward, schema=AvroSchema(User1)).close()
    schema_client.create_producer(forward, schema=AvroSchema(User2)).close()  # User1 skips email
    with pytest.raises(pulsar.IncompatibleSchema):  # User2 cannot read User3's: no email
        schema_client.create_producer(forward, schema=AvroSchema(User3))
    schema_client.create_producer(forward, schema=AvroSchema(User1)).close()  # registered
    backward = topic_in(fresh_namespace(http_broker, schemaCompatibilityStrategy="BACKWARD"))
    schema_client.create_producer(backward, schema=AvroSchema(User1)).close()
    with pytest.raises(pulsar.IncompatibleSchema):
        schema_client.create_producer(backward, schema=AvroSchema(User2))
    status, reason = post_schema(http_broker, backward, User2)
    assert status == 409
    assert "User2.email: the reader's field is not written and has no default" in reason
    assert "names differ" not in reason
    for strategy in ("FULL", "FULL_TRANSITIVE", "BACKWARD_TRANSITIVE", "ALWAYS_INCOMPATIBLE"):
        namespace = fresh_namespace(http_broker, schemaCompatibilityStrategy=strategy)
        topic = topic_in(namespace)
        schema_client.create_producer(topic, schema=AvroSchema(User1)).close()
        with pytest.raises(pulsar.IncompatibleSchema):
            schema_client.create_producer(topic, schema=AvroSchema(User2))
    always = topic_in(fresh_namespace(http_broker, schemaCompatibilityStrategy="ALWAYS_COMPATIBLE"))
    schema_client.create_producer(always, schema=AvroSchema(User2)).close()
    schema_client.create_producer(always, schema=StringSchema()).close()
    with pytest.raises(urllib.error.HTTPError) as refused:  # Pulsar has no strategy NONE
        fresh_namespace(http_broker, schemaCompatibilityStrategy="NONE")
    refused.value.close()
    assert refused.value.code == 400


def test_get_schema_through_the_client(schema_client: pulsar.Client) -> None:
    topic = topic_in("public/default")
    schema_client.create_producer(topic, schema=AvroSchema(PointV1)).close()
    schema_client.create_producer(topic, schema=AvroSchema(PointV2)).close()
    first = schema_client._client.get_schema_info(topic, 0)
    second = schema_client._client.get_schema_info(topic, 1)
    assert [f["name"] for f in json.loads(first.schema())["fields"]] == ["name", "x"]
    assert [f["name"] for f in json.loads(second.schema())["fields"]] == ["name", "x", "y"]
    assert (first.schema_type(), second.schema_type()) == (_pulsar.SchemaType.AVRO,) * 2
    with pytest.raises(pulsar.PulsarException):  # no such version
        schema_client._client.get_schema_info(topic, 9)


def test_incompatible_producers_and_consumers_are_refused(schema_client: pulsar.Client) -> None:
    topic = topic_in("public/default")
    producer = schema_client.create_producer(topic, schema=AvroSchema(PointV1))
    with pytest.raises(pulsar.IncompatibleSchema):
        schema_client.create_producer(topic, schema=AvroSchema(PointNoDefault))
    with pytest.raises(pulsar.IncompatibleSchema):
        schema_client.create_producer(topic, schema=StringSchema())
    with pytest.raises(pulsar.IncompatibleSchema):  # it cannot read z from v1's records
        schema_client.subscribe(topic, "bad", schema=AvroSchema(PointNoDefault))
    consumer = schema_client.subscribe(topic, "good", schema=AvroSchema(PointV2))
    producer.send(PointV1(name="still", x=5))  # the v1 producer is unaffected
    assert consumer.receive(RECEIVE_TIMEOUT_MS).value().y == 7
    consumer.close()
    producer.close()


def test_auto_update_off_admits_only_registered_schemas(
        schema_client: pulsar.Client, http_broker: HttpBrokerProcess) -> None:
    namespace = fresh_namespace(http_broker, isAllowAutoUpdateSchema=False)
    topic = topic_in(namespace)
    schema_client.create_producer(topic, schema=AvroSchema(PointV1)).close()  # the first
    with pytest.raises(pulsar.IncompatibleSchema):
        schema_client.create_producer(topic, schema=AvroSchema(PointV2))  # compatible, new
    schema_client.create_producer(topic, schema=AvroSchema(PointV1)).close()
    admin(http_broker, "POST", f"/admin/v2/namespaces/{namespace}/isAllowAutoUpdateSchema",
          True)
    schema_client.create_producer(topic, schema=AvroSchema(PointV2)).close()


def test_validation_enforced_refuses_producers_without_a_schema(
        schema_client: pulsar.Client, http_broker: HttpBrokerProcess) -> None:
    namespace = fresh_namespace(http_broker, schemaValidationEnforced=True)
    topic = topic_in(namespace)
    schema_client.create_producer(topic_in(namespace)).close()  # no schema anywhere: fine
    schema_client.create_producer(topic, schema=AvroSchema(PointV1)).close()
    with pytest.raises(pulsar.IncompatibleSchema):
        schema_client.create_producer(topic)  # bytes on a topic with a schema
    plain = topic_in("public/default")  # not enforced there
    schema_client.create_producer(plain, schema=AvroSchema(PointV1)).close()
    schema_client.create_producer(plain).close()


def test_after_deletion_any_schema_registers(schema_client: pulsar.Client,
                                             http_broker: HttpBrokerProcess) -> None:
    topic = topic_in("public/default")
    schema_client.create_producer(topic, schema=AvroSchema(PointV1)).close()
    local = topic.rsplit("/", 1)[1]
    assert admin(http_broker, "DELETE",
                 f"/admin/v2/schemas/public/default/{local}/schema") == {"version": 1}
    producer = schema_client.create_producer(topic, schema=StringSchema())
    producer.send("text")
    latest = admin(http_broker, "GET", f"/admin/v2/schemas/public/default/{local}/schema")
    assert (latest["version"], latest["type"]) == (2, "STRING")
    producer.close()
