"""HTTP lookup on the admin server (real HTTP, in-process service): the partition metadata a
client asks with `checkAllowAutoCreation=true` follows the binary PARTITIONED_METADATA
(auto-created partitioned topics, 0 for a missing topic), while the admin's own question about
a missing topic stays a 404; a lookup before any broker URL is known is a 503."""

from __future__ import annotations

from pathlib import Path

from .helpers import admin_env

CLIENT = {"checkAllowAutoCreation": "true"}
PATH = "/admin/v2/persistent/public/default/{}/partitions"


async def test_client_partition_metadata_follows_auto_creation(tmp_path: Path) -> None:
    async with admin_env(tmp_path, allow_auto_topic_creation_type="partitioned",
                         default_num_partitions=3) as (env, _, client):
        assert (await client.call("GET", PATH.format("admin-asks"))).status == 404
        answer = await client.call("GET", PATH.format("client-asks"), query=CLIENT)
        assert (answer.status, answer.body) == (200, {"partitions": 3})
        assert env.service.namespaces.partitions(
            "persistent://public/default/client-asks") == 3
        missing_ns = await client.call("GET", "/admin/v2/persistent/public/nope/t/partitions",
                                       query=CLIENT)
        assert missing_ns.status == 404
        bad = await client.call("GET", "/admin/v2/persistent/bad%20tenant/default/t/partitions",
                                query=CLIENT)
        assert bad.status == 412  # an invalid name, as upstream answers it


async def test_client_partition_metadata_without_auto_creation_is_zero(tmp_path: Path) -> None:
    async with admin_env(tmp_path, allow_auto_topic_creation=False) as (env, _, client):
        answer = await client.call("GET", PATH.format("absent"), query=CLIENT)
        assert (answer.status, answer.body) == (200, {"partitions": 0})
        assert not env.service.topic_exists("persistent://public/default/absent")
        lookup = await client.call("GET", "/lookup/v2/topic/persistent/public/default/t")
        assert lookup.status == 503  # this admin server was given no broker URL
