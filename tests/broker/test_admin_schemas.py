"""The admin API's schema endpoints and namespace schema policies over real HTTP: Pulsar's
paths, JSON shapes and status codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from magnetar.broker import TopicName

from .helpers import admin_env
from .test_admin import expect

SCHEMAS = "/admin/v2/schemas/public/default"
NS = "/admin/v2/namespaces/public/default"


def avro_payload(*fields: dict[str, Any]) -> dict[str, Any]:
    definition = {"type": "record", "name": "R", "fields": list(fields)}
    return {"type": "AVRO", "schema": json.dumps(definition), "properties": {"k": "v"}}


V1 = avro_payload({"name": "a", "type": "int"})
V2 = avro_payload({"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""})
NO_DEFAULT = avro_payload({"name": "a", "type": "int"}, {"name": "c", "type": "long"})


async def test_upload_get_versions_delete(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        topic = f"{SCHEMAS}/t"
        reason = await expect(client, "GET", f"{topic}/schema", 404)
        assert "Schema not found" in reason
        assert await expect(client, "POST", f"{topic}/schema", 200, V1) == {
            "version": {"version": 0}}
        assert await expect(client, "POST", f"{topic}/schema", 200, V2) == {
            "version": {"version": 1}}
        assert await expect(client, "POST", f"{topic}/schema", 200, V1) == {
            "version": {"version": 0}}  # registered already
        latest = await expect(client, "GET", f"{topic}/schema", 200)
        assert set(latest) == {"version", "type", "timestamp", "data", "properties"}
        assert (latest["version"], latest["type"], latest["properties"]) == (1, "AVRO",
                                                                             {"k": "v"})
        assert json.loads(latest["data"]) == json.loads(V2["schema"])
        assert latest["timestamp"] > 0
        first = await expect(client, "GET", f"{topic}/schema/0", 200)
        assert json.loads(first["data"]) == json.loads(V1["schema"])
        await expect(client, "GET", f"{topic}/schema/7", 404)
        every = await expect(client, "GET", f"{topic}/schemas", 200)
        assert [v["version"] for v in every["getSchemaResponses"]] == [0, 1]
        # The registry the broker uses saw the same thing.
        stored = env.service.schemas.get(TopicName.parse("public/default/t"))
        assert stored is not None
        assert stored.version == 1
        assert await expect(client, "DELETE", f"{topic}/schema", 200) == {"version": 2}
        await expect(client, "GET", f"{topic}/schema", 404)
        await expect(client, "GET", f"{topic}/schemas", 404)
        await expect(client, "DELETE", f"{topic}/schema", 404)
        string = {"type": "STRING", "schema": "", "properties": {}}
        assert await expect(client, "POST", f"{topic}/schema", 200, string) == {
            "version": {"version": 3}}  # any schema after a deletion; no reuse


async def test_incompatible_is_409_invalid_is_422_malformed_is_400(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (_, _, client):
        topic = f"{SCHEMAS}/t"
        await expect(client, "POST", f"{topic}/schema", 200, V1)
        reason = await expect(client, "POST", f"{topic}/schema", 409, NO_DEFAULT)
        assert "R.c" in reason
        assert "no default" in reason
        bad = {"type": "AVRO", "schema": '{"type": "record", "name": "R"}'}
        assert "has no 'fields'" in await expect(client, "POST", f"{topic}/schema", 422,
                                                 bad)
        await expect(client, "POST", f"{topic}/schema", 400, {"schema": "x"})
        await expect(client, "POST", f"{topic}/schema", 400, {"type": "NOPE"})
        await expect(client, "POST", f"{topic}/schema", 400, raw="{not json")
        await expect(client, "GET", "/admin/v2/schemas/public/missing/t/schema", 404)
        assert [v["version"] for v in (await expect(
            client, "GET", f"{topic}/schemas", 200))["getSchemaResponses"]] == [0]


async def test_compatibility_test_registers_nothing(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (_, _, client):
        topic = f"{SCHEMAS}/t"
        await expect(client, "POST", f"{topic}/schema", 200, V1)
        assert await expect(client, "POST", f"{topic}/compatibility", 200, V2) == {
            "isCompatibility": True, "schemaCompatibilityStrategy": "FULL"}
        assert await expect(client, "POST", f"{topic}/compatibility", 200,
                            NO_DEFAULT) == {"isCompatibility": False,
                                            "schemaCompatibilityStrategy": "FULL"}
        await expect(client, "PUT", f"{NS}/schemaCompatibilityStrategy", 204, "FORWARD")
        assert (await expect(client, "POST", f"{topic}/compatibility", 200,
                             NO_DEFAULT))["isCompatibility"] is True
        latest = await expect(client, "GET", f"{topic}/schema", 200)
        assert latest["version"] == 0


async def test_namespace_schema_policies(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        strategy = f"{NS}/schemaCompatibilityStrategy"
        assert await expect(client, "GET", strategy, 200) == "UNDEFINED"
        view = await expect(client, "GET", NS, 200)
        assert (view["schema_compatibility_strategy"], view["is_allow_auto_update_schema"],
                view["schema_validation_enforced"]) == ("UNDEFINED", None, False)
        await expect(client, "PUT", strategy, 204, "BACKWARD_TRANSITIVE")
        assert await expect(client, "GET", strategy, 200) == "BACKWARD_TRANSITIVE"
        await expect(client, "PUT", strategy, 400, "SOMETIMES")
        await expect(client, "DELETE", strategy, 204)
        assert await expect(client, "GET", strategy, 200) == "UNDEFINED"
        auto = f"{NS}/isAllowAutoUpdateSchema"
        assert await expect(client, "GET", auto, 200) is True
        await expect(client, "POST", auto, 204, False)
        assert await expect(client, "GET", auto, 200) is False
        await expect(client, "POST", auto, 400, "no")
        enforced = f"{NS}/schemaValidationEnforced"
        assert await expect(client, "GET", enforced, 200) is False
        await expect(client, "POST", enforced, 204, True)
        policy = env.service.namespaces.schema_policy("persistent://public/default/t",
                                                      "public/default")
        assert (policy.compatibility_strategy, policy.allow_auto_update,
                policy.validation_enforced) == ("FULL", False, True)
        topic = f"{SCHEMAS}/t"
        await expect(client, "POST", f"{topic}/schema", 200, V1)  # the first one
        reason = await expect(client, "POST", f"{topic}/schema", 409, V2)
        assert "auto updating is disabled" in reason
        await expect(client, "GET", "/admin/v2/namespaces/public/none/"
                                    "schemaValidationEnforced", 404)


async def test_key_value_schemas_show_and_take_their_parts_as_json(tmp_path: Path) -> None:
    async with admin_env(tmp_path) as (env, _, client):
        topic = f"{SCHEMAS}/kv"
        key = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "long"}]}
        value = json.loads(V1["schema"])
        payload = {"type": "KEY_VALUE", "schema": json.dumps({"key": key, "value": value}),
                   "properties": {"key.schema.type": "AVRO", "value.schema.type": "AVRO",
                                  "kv.encoding.type": "SEPARATED"}}
        await expect(client, "POST", f"{topic}/schema", 200, payload)
        stored = env.service.schemas.get(TopicName.parse("public/default/kv"))
        assert stored is not None
        key_length = int.from_bytes(stored.schema.data[:4], "big")
        assert json.loads(stored.schema.data[4:4 + key_length]) == key
        shown = await expect(client, "GET", f"{topic}/schema", 200)
        assert shown["type"] == "KEY_VALUE"
        assert json.loads(shown["data"]) == {"key": key, "value": value}
        value["fields"].append({"name": "n", "type": "int"})  # no default
        payload["schema"] = json.dumps({"key": key, "value": value})
        assert "value R.n" in await expect(client, "POST", f"{topic}/schema", 409, payload)
        await expect(client, "POST", f"{topic}/schema", 422,
                     {**payload, "schema": '{"key": 1}'})
