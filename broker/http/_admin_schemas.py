"""The admin API's schema endpoints and the namespaces' schema policies (Pulsar's v2 paths).

Theory of operation
-------------------
`add_schema_routes(router)` registers, under `/admin/v2/schemas/{tenant}/{namespace}/{topic}`
(the persistent topic of that name; its partitions share the base's schemas):

* `GET …/schema` the latest version, `GET …/schema/{version}` one version, `GET …/schemas`
  every active version (`{"getSchemaResponses": [...]}`), each as Pulsar's
  GetSchemaResponse `{"version", "type", "timestamp", "data", "properties"}`;
* `POST …/schema` registers a PostSchemaPayload `{"type", "schema", "properties"}` with the
  producer's rules and answers `{"version": {"version": n}}`; `DELETE …/schema` appends a
  deletion marker and answers `{"version": n}`;
* `POST …/compatibility` tests a payload without registering it:
  `{"isCompatibility": bool, "schemaCompatibilityStrategy": "FULL"}`.

KEY_VALUE data travels in these bodies as Pulsar shows it, a JSON text `{"key": …,
"value": …}` whose parts are the components' definitions; it is stored packed (each part
behind a 4-byte big-endian length). Errors: 404 no such namespace, schema or version, 400 a
malformed payload, 409 an incompatible schema, 422 a definition that does not parse.

The namespace endpoints `schemaCompatibilityStrategy` (GET, PUT or POST a strategy name,
DELETE), `isAllowAutoUpdateSchema` and `schemaValidationEnforced` (GET, POST true/false,
DELETE) set the policies `_schemas.SchemaRegistry` applies; a GET of an unset one answers
the value in force (UNDEFINED for the strategy: the broker default applies).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web

from .._errors import IncompatibleSchemaError, InvalidSchemaError
from .._names import NamespaceName, TopicName
from ..schemas._schema_compat import KEY_VALUE, NAME_TO_WIRE, STRATEGIES, type_name
from ..schemas._schemas import SchemaEntry, StoredSchema
from ._admin_namespaces import _set_policy
from ._rest import RestError, _body, _namespace, _ok, _service

__all__ = ["add_schema_routes"]

KV_LENGTH_BYTES: Final = 4
_SCHEMAS: Final = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
_NS: Final = "/admin/v2/namespaces/{tenant}/{namespace}"


def add_schema_routes(router: web.UrlDispatcher) -> None:
    """Register the schema endpoints and the namespace schema-policy endpoints."""
    router.add_get(_SCHEMAS + "/schema", get_latest)
    router.add_get(_SCHEMAS + "/schema/{version:[0-9]+}", get_version)
    router.add_get(_SCHEMAS + "/schemas", get_all)
    router.add_post(_SCHEMAS + "/schema", upload)
    router.add_delete(_SCHEMAS + "/schema", delete)
    router.add_post(_SCHEMAS + "/compatibility", compatibility)
    get, put, remove = _policy("schema_compatibility_strategy", _check_strategy,
                               lambda service: "UNDEFINED")
    router.add_get(_NS + "/schemaCompatibilityStrategy", get)
    router.add_put(_NS + "/schemaCompatibilityStrategy", put)
    router.add_post(_NS + "/schemaCompatibilityStrategy", put)
    router.add_delete(_NS + "/schemaCompatibilityStrategy", remove)
    get, put, remove = _policy("is_allow_auto_update_schema", _check_bool,
                               lambda service: service.config.is_allow_auto_update_schema_enabled)
    router.add_get(_NS + "/isAllowAutoUpdateSchema", get)
    router.add_post(_NS + "/isAllowAutoUpdateSchema", put)
    router.add_delete(_NS + "/isAllowAutoUpdateSchema", remove)
    get, put, remove = _policy("schema_validation_enforced", _check_bool,
                               lambda service: service.config.is_schema_validation_enforced)
    router.add_get(_NS + "/schemaValidationEnforced", get)
    router.add_post(_NS + "/schemaValidationEnforced", put)
    router.add_delete(_NS + "/schemaValidationEnforced", remove)


# -- schemas --------------------------------------------------------------------------------


def _topic(request: web.Request) -> TopicName:
    namespace = NamespaceName.parse(_namespace(request))
    local = request.match_info["topic"]
    if not local:
        raise RestError(412, "Topic name is not valid")
    return TopicName("persistent", namespace.tenant, namespace.namespace, local)


def _response(entry: SchemaEntry) -> dict[str, Any]:
    """Pulsar's GetSchemaResponse for a version."""
    schema = entry.schema
    return {"version": entry.version, "type": type_name(schema.type),
            "timestamp": entry.timestamp_ms, "data": _shown_data(schema),
            "properties": dict(schema.properties)}


def _shown_data(schema: StoredSchema) -> str:
    if schema.type != KEY_VALUE:
        return schema.data.decode("utf-8", errors="replace")
    parts: dict[str, Any] = {}
    data, offset = schema.data, 0
    for part in ("key", "value"):
        length = max(int.from_bytes(data[offset:offset + KV_LENGTH_BYTES], "big",
                                    signed=True), 0)
        offset += KV_LENGTH_BYTES
        text = data[offset:offset + length].decode("utf-8", errors="replace")
        offset += length
        try:
            parts[part] = json.loads(text)
        except ValueError:
            parts[part] = text
    return json.dumps(parts)


async def get_latest(request: web.Request) -> web.Response:
    name = _topic(request)
    found = _service(request).schemas.get(name)
    if found is None:
        raise RestError(404, f"Schema not found for topic {name}")
    return _ok(_response(found))


async def get_version(request: web.Request) -> web.Response:
    name = _topic(request)
    version = int(request.match_info["version"])
    found = _service(request).schemas.get(name, version)
    if found is None:
        raise RestError(404, f"Schema version {version} not found for topic {name}")
    return _ok(_response(found))


async def get_all(request: web.Request) -> web.Response:
    name = _topic(request)
    history = _service(request).schemas.history(name)
    if not history:
        raise RestError(404, f"Schema not found for topic {name}")
    return _ok({"getSchemaResponses": [_response(entry) for entry in history]})


def _payload(body: Any, name: TopicName) -> StoredSchema:
    """A PostSchemaPayload as the schema to register.

    Raises:
        RestError: 400 when the body is not a payload, or 422 for bad KEY_VALUE data.
    """
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        raise RestError(400, "The body must be a PostSchemaPayload: {\"type\": \"AVRO\", "
                             "\"schema\": \"<definition>\", \"properties\": {}}")
    kind = NAME_TO_WIRE.get(body["type"].upper())
    if kind is None or body["type"].upper() in ("NONE", "AUTO_CONSUME"):
        raise RestError(400, f"Unknown schema type {body['type']!r}")
    definition = body.get("schema", "")
    properties = body.get("properties") or {}
    if not isinstance(definition, str) or not isinstance(properties, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
        raise RestError(400, "The payload's schema must be a string and its properties an "
                             "object of strings")
    data = definition.encode()
    if kind == KEY_VALUE:
        data = _packed_key_value(definition)
    return StoredSchema(name.local_name, kind, data, tuple(sorted(properties.items())))


def _packed_key_value(definition: str) -> bytes:
    try:
        parts = json.loads(definition)
    except ValueError as error:
        raise RestError(422, f"Invalid KEY_VALUE schema: not JSON ({error})") from error
    if not isinstance(parts, dict) or set(parts) != {"key", "value"}:
        raise RestError(422, "Invalid KEY_VALUE schema: expected {\"key\": …, \"value\": …}")
    packed = b""
    for part in ("key", "value"):
        value = parts[part]
        encoded = (value if isinstance(value, str) else json.dumps(value)).encode()
        packed += len(encoded).to_bytes(KV_LENGTH_BYTES, "big") + encoded
    return packed


def _refusal(error: IncompatibleSchemaError) -> RestError:
    if isinstance(error, InvalidSchemaError):
        return RestError(422, str(error))
    return RestError(409, str(error))


async def upload(request: web.Request) -> web.Response:
    name = _topic(request)
    schema = _payload(await _body(request), name)
    try:
        version = _service(request).schemas.add(name, schema)
    except IncompatibleSchemaError as error:
        raise _refusal(error) from error
    return _ok({"version": {"version": version}})


async def delete(request: web.Request) -> web.Response:
    name = _topic(request)
    version = _service(request).schemas.delete(name)
    if version is None:
        raise RestError(404, f"Schema not found for topic {name}")
    return _ok({"version": version})


async def compatibility(request: web.Request) -> web.Response:
    name = _topic(request)
    schema = _payload(await _body(request), name)
    registry = _service(request).schemas
    strategy = registry.policy(name).compatibility_strategy
    try:
        registry.check(name, schema)
        compatible = True
    except InvalidSchemaError as error:
        raise _refusal(error) from error
    except IncompatibleSchemaError:
        compatible = False
    return _ok({"isCompatibility": compatible, "schemaCompatibilityStrategy": strategy})


# -- namespace schema policies --------------------------------------------------------------


def _check_strategy(value: Any) -> Any:
    if not isinstance(value, str) or value.upper() not in STRATEGIES:
        raise RestError(400, f"The body must be a schema compatibility strategy, one of "
                             f"{', '.join(STRATEGIES)}")
    return value.upper()


def _check_bool(value: Any) -> Any:
    if not isinstance(value, bool):
        raise RestError(400, "The body must be true or false")
    return value


Handler = Callable[[web.Request], Any]


def _policy(field: str, check: Callable[[Any], Any],
            unset: Callable[[Any], Any]) -> tuple[Handler, Handler, Handler]:
    """GET (the value, or `unset(service)` when none), set and DELETE for one policy."""

    async def get(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        service = _service(request)
        value = service.namespaces.policies(namespace).get(field)
        return _ok(unset(service) if value is None else value)

    async def put(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        await _set_policy(_service(request), namespace, field, check(await _body(request)))
        return _ok()

    async def remove(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        await _set_policy(_service(request), namespace, field, None)
        return _ok()

    return get, put, remove

