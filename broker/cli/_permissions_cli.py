"""`magnetar namespaces|topics grant-permission|revoke-permission|permissions` and the
namespaces' subscription permissions, with pulsar-admin's names and options.

Theory of operation
-------------------
`add_permission_commands` finds the `namespaces` and `topics` groups `_admin_cli` made on
`magnetar`'s parser and adds, to each, commands that make one admin API request
(`http/_permissions.py`) with `_admin_cli`'s helpers (admin URL, token, trusted CAs) and print
its JSON answer:

* `namespaces permissions NS`, `grant-permission NS --role R --actions produce,consume`,
  `revoke-permission NS --role R`, `grant-subscription-permission NS --subscription S --roles
  A,B`, `revoke-subscription-permission NS --subscription S --role R`;
* `topics permissions TOPIC`, `grant-permission TOPIC --role R --actions ...`,
  `revoke-permission TOPIC --role R`.

An unknown action is refused before any request (exit 2, naming it and the known ones).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..security._authz import ACTIONS
from ._admin_http import _call, _command, _namespace_path, _quote, _topic_path

if TYPE_CHECKING:
    from ._admin_http import SubParsers

__all__ = ["add_permission_commands"]


def _actions(text: str) -> list[str]:
    actions = [action.strip() for action in text.split(",") if action.strip()]
    for action in actions:
        if action not in ACTIONS:
            raise argparse.ArgumentTypeError(f"unknown action {action!r}; actions are "
                                             f"{', '.join(ACTIONS)}")
    if not actions:
        raise argparse.ArgumentTypeError("name at least one action")
    return actions


def _roles(text: str) -> list[str]:
    roles = [role.strip() for role in text.split(",") if role.strip()]
    if not roles:
        raise argparse.ArgumentTypeError("name at least one role")
    return roles


def _commands_of(sub: SubParsers, group: str) -> SubParsers:
    parser = sub.choices[group]
    for action in parser._actions:  # argparse keeps a group's subcommands there
        if isinstance(action, argparse._SubParsersAction):
            found: SubParsers = action
            return found
    raise AssertionError(f"magnetar {group} has no subcommands")


def _add_namespace_commands(commands: SubParsers) -> None:
    def ns(args: argparse.Namespace) -> str:
        return _namespace_path(args.namespace)

    _command(commands, "permissions", "show the roles and actions granted on a namespace",
             _call("GET", lambda a: ns(a) + "/permissions")).add_argument("namespace")
    grant = _command(commands, "grant-permission", "grant a role actions on a namespace",
                     _call("POST", lambda a: f"{ns(a)}/permissions/{_quote(a.role)}",
                           lambda a: a.actions))
    revoke = _command(commands, "revoke-permission", "revoke a role's namespace grant",
                      _call("DELETE", lambda a: f"{ns(a)}/permissions/{_quote(a.role)}"))
    for parser in (grant, revoke):
        parser.add_argument("namespace")
        parser.add_argument("--role", required=True, help="the role")
    grant.add_argument("--actions", type=_actions, required=True,
                       help=f"comma-separated, among {', '.join(ACTIONS)}")
    _command(commands, "subscription-permissions", "show the roles allowed on each "
             "subscription of a namespace",
             _call("GET", lambda a: ns(a) + "/permissions/subscription")
             ).add_argument("namespace")
    sub_grant = _command(commands, "grant-subscription-permission", "allow only these roles "
                         "on a subscription of the namespace",
                         _call("POST", lambda a: f"{ns(a)}/permissions/subscription/"
                               f"{_quote(a.subscription)}", lambda a: a.roles))
    sub_revoke = _command(commands, "revoke-subscription-permission", "remove a role from "
                          "those allowed on a subscription",
                          _call("DELETE", lambda a: f"{ns(a)}/permissions/"
                                f"{_quote(a.subscription)}/{_quote(a.role)}"))
    for parser in (sub_grant, sub_revoke):
        parser.add_argument("namespace")
        parser.add_argument("--subscription", required=True, help="the subscription")
    sub_grant.add_argument("--roles", type=_roles, required=True, help="comma-separated roles")
    sub_revoke.add_argument("--role", required=True, help="the role")


def _add_topic_commands(commands: SubParsers) -> None:
    def topic(args: argparse.Namespace) -> str:
        return _topic_path(args.topic)

    _command(commands, "permissions", "show the roles and actions granted on a topic (its "
             "namespace's grants included)",
             _call("GET", lambda a: topic(a) + "/permissions")).add_argument("topic")
    grant = _command(commands, "grant-permission", "grant a role actions on a topic",
                     _call("POST", lambda a: f"{topic(a)}/permissions/{_quote(a.role)}",
                           lambda a: a.actions))
    revoke = _command(commands, "revoke-permission", "revoke a role's topic grant",
                      _call("DELETE", lambda a: f"{topic(a)}/permissions/{_quote(a.role)}"))
    for parser in (grant, revoke):
        parser.add_argument("topic")
        parser.add_argument("--role", required=True, help="the role")
    grant.add_argument("--actions", type=_actions, required=True,
                       help=f"comma-separated, among {', '.join(ACTIONS)}")


def add_permission_commands(sub: SubParsers) -> None:
    """Add the permission commands to `magnetar namespaces` and `magnetar topics` (which
    `_admin_cli.add_commands` must have made)."""
    _add_namespace_commands(_commands_of(sub, "namespaces"))
    _add_topic_commands(_commands_of(sub, "topics"))
