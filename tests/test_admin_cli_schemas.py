"""`magnetar schemas …` and the namespaces' schema policy commands against an in-process
admin API (see tests/test_admin_cli.py for the `Cli` runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from magnetar.broker import TopicName
from magnetar.broker.cli import main
from tests.broker.helpers import admin_env
from tests.test_admin_cli import Cli

SCHEMA_COMMANDS = ("get", "upload", "delete", "compatibility")
V1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
V2 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"},
                                                 {"name": "b", "type": "int", "default": 0}]}
NO_DEFAULT = {"type": "record", "name": "R", "fields": [{"name": "c", "type": "int"}]}


@pytest.mark.parametrize("command", SCHEMA_COMMANDS)
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["schemas", command, "--help"])
    assert exit_info.value.code == 0
    assert "--admin-url" in capsys.readouterr().out


def _file(tmp_path: Path, name: str, definition: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"type": "AVRO", "schema": json.dumps(definition),
                                "properties": {}}))
    return str(path)


async def test_schema_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with admin_env(tmp_path / "data") as (env, server, _):
        cli = Cli(server.url, capsys)
        url = ("--admin-url", server.url)
        topic = "public/default/orders"
        v1, v2 = _file(tmp_path, "v1.json", V1), _file(tmp_path, "v2.json", V2)
        bad = _file(tmp_path, "bad.json", NO_DEFAULT)
        assert json.loads(await cli("schemas", "upload", topic, "-f", v1, *url)) == {
            "version": {"version": 0}}
        assert json.loads(await cli("schemas", "compatibility", topic, "-f", bad, *url)
                          )["isCompatibility"] is False
        assert "HTTP 409" in await cli("schemas", "upload", topic, "-f", bad, *url,
                                       ok=False)
        await cli("schemas", "upload", topic, "-f", v2, *url)
        latest = json.loads(await cli("schemas", "get", topic, *url))
        assert (latest["version"], json.loads(latest["data"])) == (1, V2)
        first = json.loads(await cli("schemas", "get", topic, "--version", "0", *url))
        assert json.loads(first["data"]) == V1
        every = json.loads(await cli("schemas", "get", topic, "--all-versions", *url))
        assert len(every["getSchemaResponses"]) == 2
        assert json.loads(await cli("schemas", "delete", topic, *url)) == {"version": 2}
        assert env.service.schemas.get(TopicName.parse(topic)) is None
        assert "HTTP 404" in await cli("schemas", "get", topic, *url, ok=False)
        missing = await cli("schemas", "upload", topic, "-f", str(tmp_path / "none"),
                            *url, ok=False)
        assert "cannot read the schema file" in missing
        (tmp_path / "list.json").write_text("[]")
        assert "must hold a JSON object" in await cli(
            "schemas", "compatibility", topic, "-f", str(tmp_path / "list.json"), *url,
            ok=False)

        await cli("namespaces", "set-schema-compatibility-strategy", "public/default",
                  "-c", "FORWARD")
        assert await cli("namespaces", "get-schema-compatibility-strategy",
                         "public/default") == '"FORWARD"\n'
        await cli("namespaces", "set-is-allow-auto-update-schema", "public/default",
                  "--disable")
        await cli("namespaces", "set-schema-validation-enforce", "public/default", "-e")
        policy = env.service.namespaces.schema_policy(topic, "public/default")
        assert (policy.compatibility_strategy, policy.allow_auto_update,
                policy.validation_enforced) == ("FORWARD", False, True)
        await cli("namespaces", "remove-schema-compatibility-strategy", "public/default")
        assert await cli("namespaces", "get-schema-compatibility-strategy",
                         "public/default") == '"UNDEFINED"\n'
