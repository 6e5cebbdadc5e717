"""`magnetar schemas get|upload|delete|compatibility`: `pulsar-admin schemas` over the admin API.

Theory of operation
-------------------
Each subcommand is one request to `/admin/v2/schemas/{tenant}/{namespace}/{topic}/…` (see
`_admin_schemas`) made with `_admin_http`'s helpers, whose JSON answer is printed; an error
answer prints `HTTP <status>: <reason>` on stderr and exits 1. `upload` and `compatibility`
read a schema file as `pulsar-admin` does: JSON `{"type": "AVRO", "schema": "<definition>",
"properties": {}}`. A file that cannot be read or is not such an object exits 1 with a
message naming the file, before any request.

`add_namespace_schema_commands` adds the namespaces' schema policies to `magnetar
namespaces` with pulsar-admin's names: get-/set-/remove-schema-compatibility-strategy,
…-is-allow-auto-update-schema and …-schema-validation-enforce.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import TYPE_CHECKING, Any

from ._admin_http import Handler, _call, _command, _group, _policy_commands

__all__ = ["add_namespace_schema_commands", "add_schema_commands"]

if TYPE_CHECKING:
    from ._admin_http import SubParsers


def _schemas_path(topic: str, suffix: str) -> str:
    from .._names import TopicName

    name = TopicName.parse(topic)
    local = urllib.parse.quote(name.local_name, safe="")
    return f"/admin/v2/schemas/{name.namespace_name}/{local}/{suffix}"


def _get_path(args: argparse.Namespace) -> str:
    if args.all_versions:
        return _schemas_path(args.topic, "schemas")
    if args.version is not None:
        return _schemas_path(args.topic, f"schema/{args.version}")
    return _schemas_path(args.topic, "schema")


def _read_payload(filename: str) -> dict[str, Any] | str:
    """The schema file's PostSchemaPayload, or what is wrong with the file."""
    try:
        with open(filename, encoding="utf-8") as source:
            payload = json.load(source)
    except (OSError, ValueError) as error:
        return f"cannot read the schema file {filename}: {error}"
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        return (f"the schema file {filename} must hold a JSON object "
                '{"type": ..., "schema": ..., "properties": {}}')
    return payload


def _post_file(suffix: str) -> Handler:
    """POST the schema file of `--filename` to the topic's `suffix` endpoint."""

    def handle(args: argparse.Namespace) -> int:
        payload = _read_payload(args.filename)
        if isinstance(payload, str):
            print(f"magnetar: {payload}", file=sys.stderr)
            return 1
        return _call("POST", lambda a: _schemas_path(a.topic, suffix), lambda a: payload)(args)

    return handle


def add_schema_commands(sub: SubParsers) -> None:
    """Register `magnetar schemas …` on `magnetar`'s parser."""
    commands = _group(sub, "schemas", "manage topics' schemas through the admin API",
                      "Topic schemas (pulsar-admin schemas) through the admin HTTP API.")
    get = _command(commands, "get", "show a topic's schema (the latest version by default)",
                   _call("GET", _get_path))
    get.add_argument("topic")
    which = get.add_mutually_exclusive_group()
    which.add_argument("--version", type=int, help="show this version")
    which.add_argument("-a", "--all-versions", action="store_true", help="show every version")
    upload = _command(commands, "upload", "register a schema for a topic",
                      _post_file("schema"))
    check = _command(commands, "compatibility",
                     "test a schema against a topic's schemas without registering it",
                     _post_file("compatibility"))
    for parser in (upload, check):
        parser.add_argument("topic")
        parser.add_argument("-f", "--filename", required=True,
                            help='a JSON file: {"type": "AVRO", "schema": "<definition>", '
                                 '"properties": {}}')
    delete = _command(commands, "delete", "delete a topic's schema (versions are not reused)",
                      _call("DELETE", lambda a: _schemas_path(a.topic, "schema")))
    delete.add_argument("topic")


def add_namespace_schema_commands(commands: SubParsers) -> None:
    """The schema policy subcommands of `magnetar namespaces`."""
    from ..schemas._schema_compat import STRATEGIES

    strategy = _policy_commands(commands, "schema-compatibility-strategy",
                                "schemaCompatibilityStrategy", lambda a: a.compatibility)
    strategy.add_argument("-c", "--compatibility", required=True, choices=STRATEGIES,
                          help="the strategy new schemas are checked with (UNDEFINED: the "
                               "broker's default)")
    for name, endpoint in (("is-allow-auto-update-schema", "isAllowAutoUpdateSchema"),
                           ("schema-validation-enforce", "schemaValidationEnforced")):
        setter = _policy_commands(commands, name, endpoint, lambda a: a.enable)
        on_off = setter.add_mutually_exclusive_group(required=True)
        on_off.add_argument("-e", "--enable", dest="enable", action="store_true")
        on_off.add_argument("-d", "--disable", dest="enable", action="store_false")
