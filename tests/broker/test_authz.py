"""Authorization rules (security/_authz.py), table-driven, over grants stored in a real
metadata store; grants survive a restart; grant and revoke edge cases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from magnetar.broker._errors import AuthorizationError, MetadataError, NotAllowedError
from magnetar.broker._names import TopicName
from magnetar.broker.security._authz import AuthorizationService

from .helpers import broker_env

T = TopicName.parse("persistent://acme/ns/t")
T_PARTITION = TopicName.parse("persistent://acme/ns/t-partition-3")
T2 = TopicName.parse("persistent://acme/ns/t2")
OTHER_TENANT = TopicName.parse("persistent://public/default/t")

Question = Callable[[AuthorizationService, str | None], bool]

QUESTIONS: dict[str, Question] = {
    "produce t": lambda a, r: a.can_produce(T, r),
    "produce t-partition-3": lambda a, r: a.can_produce(T_PARTITION, r),
    "produce t2": lambda a, r: a.can_produce(T2, r),
    "consume t": lambda a, r: a.can_consume(T, r, "any"),
    "consume t locked": lambda a, r: a.can_consume(T, r, "locked"),
    "consume t2": lambda a, r: a.can_consume(T2, r, "any"),
    "lookup t": lambda a, r: a.can_lookup(T, r),
    "lookup t2": lambda a, r: a.can_lookup(T2, r),
    "list acme/ns": lambda a, r: a.can_list_topics("acme/ns", r),
    "functions acme/ns": lambda a, r: a.can_namespace_action("acme/ns", r, "functions"),
    "sources acme/ns": lambda a, r: a.can_namespace_action("acme/ns", r, "sources"),
    "sinks acme/ns": lambda a, r: a.can_namespace_action("acme/ns", r, "sinks"),
    "packages acme/ns": lambda a, r: a.can_namespace_action("acme/ns", r, "packages"),
    "admin acme": lambda a, r: a.is_tenant_admin("acme", r),
    "admin public": lambda a, r: a.is_tenant_admin("public", r),
    "produce public": lambda a, r: a.can_produce(OTHER_TENANT, r),
}

# role -> the questions answered yes (every other question is no).
ALLOWED: dict[str | None, set[str]] = {
    "root": set(QUESTIONS),  # a superuser may do everything
    "acme-admin": set(QUESTIONS) - {"admin public", "produce public"},  # its tenant only
    "ns-producer": {"produce t", "produce t-partition-3", "produce t2", "lookup t", "lookup t2",
                    "list acme/ns"},
    "ns-consumer": {"consume t", "consume t2", "lookup t", "lookup t2", "list acme/ns"},
    "t-producer": {"produce t", "produce t-partition-3", "lookup t"},
    "t-consumer": {"consume t", "consume t locked", "lookup t"},
    "fn": {"functions acme/ns"},
    "connectors": {"sources acme/ns", "sinks acme/ns"},
    "pkg": {"packages acme/ns"},
    "stranger": set(),
    None: set(),  # no authentication: no role, nothing
}

TABLE = [(role, question, question in allowed)
         for role, allowed in ALLOWED.items() for question in QUESTIONS]


def _grant_everything(authz: AuthorizationService) -> None:
    registry = authz.registry
    registry.create_tenant("acme", {"adminRoles": ["acme-admin"]})
    registry.create_namespace("acme/ns")
    authz.grant_namespace("acme/ns", "ns-producer", ["produce"])
    authz.grant_namespace("acme/ns", "ns-consumer", ["consume"])
    authz.grant_namespace("acme/ns", "fn", ["functions"])
    authz.grant_namespace("acme/ns", "connectors", ["sources", "sinks"])
    authz.grant_namespace("acme/ns", "pkg", ["packages"])
    authz.grant_topic(T, "t-producer", ["produce"])
    authz.grant_topic(T, "t-consumer", ["consume"])
    authz.grant_subscription("acme/ns", "locked", ["t-consumer"])


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str | None, str], bool]:
    """Every (role, question) answered once over one real store."""
    async def scenario() -> dict[tuple[str | None, str], bool]:
        async with broker_env(tmp_path_factory.mktemp("authz")) as env:
            authz = AuthorizationService(env.service.namespaces, ["root"])
            _grant_everything(authz)
            return {(role, name): question(authz, role)
                    for role in ALLOWED for name, question in QUESTIONS.items()}

    return asyncio.run(scenario())


@pytest.mark.parametrize(("role", "question", "expected"), TABLE)
def test_rule(answers: dict[tuple[str | None, str], bool], role: str | None, question: str,
              expected: bool) -> None:
    assert answers[(role, question)] is expected


async def test_grants_survive_a_restart_and_prefix_mode(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        authz = AuthorizationService(env.service.namespaces, ["root"])
        _grant_everything(authz)
        service = await env.restart()
        authz = AuthorizationService(service.namespaces, ["root"])
        assert authz.namespace_permissions("acme/ns") == {
            "connectors": ["sinks", "sources"], "fn": ["functions"], "ns-consumer": ["consume"],
            "ns-producer": ["produce"], "pkg": ["packages"]}
        assert authz.topic_permissions(T_PARTITION)["t-producer"] == ["produce"]
        assert authz.subscription_permissions("acme/ns") == {"locked": ["t-consumer"]}
        assert authz.can_produce(T, "t-producer")
        service.namespaces.set_policy("acme/ns", "subscription_auth_mode", "Prefix")
        assert authz.can_consume(T, "ns-consumer", "ns-consumer-sub")
        with pytest.raises(AuthorizationError, match="prefixed by the authentication role"):
            authz.can_consume(T, "ns-consumer", "other-sub")
        assert authz.can_consume(T, "acme-admin", "other-sub")  # admins are not checked
        assert authz.can_lookup(T, "ns-consumer")  # lookups name no subscription


async def test_grant_and_revoke_edges(tmp_path: Path) -> None:
    async with broker_env(tmp_path) as env:
        authz = AuthorizationService(env.service.namespaces)
        _grant_everything(authz)
        with pytest.raises(NotAllowedError, match="Unknown action 'publish'"):
            authz.grant_namespace("acme/ns", "x", ["publish"])
        with pytest.raises(MetadataError, match="does not exist"):
            authz.grant_namespace("acme/missing", "x", ["produce"])
        with pytest.raises(NotAllowedError, match="not set at the topic level"):
            authz.revoke_topic(T, "ns-producer")  # its grant is the namespace's
        authz.grant_namespace("acme/ns", "ns-producer", ["consume", "consume"])
        assert authz.namespace_permissions("acme/ns")["ns-producer"] == ["consume"]
        authz.revoke_namespace("acme/ns", "ns-producer")
        assert not authz.can_lookup(T, "ns-producer")
        authz.revoke_topic(T, "t-producer")
        assert not authz.can_produce(T, "t-producer")
        authz.revoke_subscription("acme/ns", "locked", "t-consumer")
        assert authz.can_consume(T, "ns-consumer", "locked")  # an empty list: open again
        with pytest.raises(NotAllowedError, match="couldn't find subscription"):
            authz.revoke_subscription("acme/ns", "never-listed", "x")
