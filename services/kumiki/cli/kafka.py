"""`kumiki kafka acls`: the bus's least-privilege ACLs, one Kafka user per service and for the node agents.

The rules come from one table (`kumiki.common.bus.access`): what each service reads, writes and joins. Print
them as a table, as Apache Kafka's `kafka-acls.sh` commands, as Strimzi KafkaUser resources, or as JSON; add
them to a broker (`--apply`, as its admin, with the usual KUMIKI_KAFKA_* settings); compare the broker's ACLs
with them (`--check`: exit 1 when a rule is missing); or remove what these users hold beyond them (`--prune`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import yaml
from rich.console import Console
from rich.table import Table

from kumiki.cli.main import UsageError, message_console
from kumiki.common.bus.access import (
    ACCESS,
    AccessError,
    AclBinding,
    acl_bindings,
    default_user,
    kafka_acls_commands,
    missing_and_extra,
    strimzi_users,
)
from kumiki.common.config import ConfigError, KafkaSettings

console = message_console()
FORMATS = ("table", "kafka-acls", "strimzi", "json")
EXIT_BROKER = 3


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    kafka = subparsers.add_parser("kafka", help="the bus's ACLs: one Kafka user per service, least privilege")
    commands = kafka.add_subparsers(dest="kafka_command", required=True, metavar="SUBCOMMAND")
    acls = commands.add_parser(
        "acls",
        help="print, add (--apply) or check (--check) the ACLs each Kumiki user needs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    acls.add_argument(
        "--roles",
        default=",".join(ACCESS),
        help=f"roles to cover, comma-separated (default: all of {', '.join(ACCESS)})",
    )
    acls.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="ROLE=USER",
        help="the Kafka user a role runs as (default kumiki-ROLE); repeat per role; roles may share a user",
    )
    acls.add_argument("--prefix", default=None, help="topic prefix (default: KUMIKI_TOPIC_PREFIX, else 'kumiki.')")
    acls.add_argument("--format", choices=FORMATS, default="table", help="how to print the rules")
    acls.add_argument("--strimzi-cluster", default="kafka", help="with --format strimzi: the Kafka resource's name")
    acls.add_argument("--namespace", default=None, help="with --format strimzi: the KafkaUsers' namespace")
    action = acls.add_mutually_exclusive_group()
    action.add_argument(
        "--apply", action="store_true", help="add the rules to the broker of KUMIKI_KAFKA_* (run as its admin)"
    )
    action.add_argument(
        "--check", action="store_true", help="compare with the broker's ACLs; exit 1 if a rule is missing"
    )
    action.add_argument(
        "--prune",
        action="store_true",
        help="remove the rules these users hold beyond the policy (a topic a role no longer uses); run as admin",
    )
    acls.set_defaults(handler=_acls)


def _users(args: argparse.Namespace) -> dict[str, str]:
    roles = [role.strip() for role in args.roles.split(",") if role.strip()]
    if not roles:
        raise UsageError("--roles must name at least one role")
    for role in roles:
        if role not in ACCESS:
            raise UsageError(f"--roles: unknown role {role!r} (known: {', '.join(ACCESS)})")
    users = {role: default_user(role) for role in roles}
    for given in args.user:
        role, equals, user = given.partition("=")
        if not equals or not role or not user:
            raise UsageError(f"--user: expected ROLE=USER, got {given!r}")
        if role not in users:
            raise UsageError(f"--user: role {role!r} is not among --roles ({', '.join(users)})")
        users[role] = user
    return users


def _settings(prefix: str | None) -> KafkaSettings:
    env = dict(os.environ)
    if prefix is not None:
        env["KUMIKI_TOPIC_PREFIX"] = prefix
    try:
        return KafkaSettings.from_env(env)
    except ConfigError as error:
        message = str(error).replace("KUMIKI_TOPIC_PREFIX", "--prefix") if prefix is not None else str(error)
        raise UsageError(message) from None


def _table(rules: list[AclBinding], title: str) -> Table:
    table = Table(title=title)
    for column in ("user", "resource", "name", "pattern", "operation"):
        table.add_column(column, overflow="fold")
    for rule in rules:
        table.add_row(rule.user, rule.resource.lower(), rule.name, rule.pattern.lower(), rule.operation)
    return table


def _print(rules: list[AclBinding], args: argparse.Namespace) -> None:
    out = Console(soft_wrap=True)
    if args.format == "table":
        out.print(_table(rules, f"Kafka ACLs for {len({rule.user for rule in rules})} users ({len(rules)} rules)"))
    elif args.format == "kafka-acls":
        sys.stdout.write("".join(f"{line}\n" for line in kafka_acls_commands(rules)))
    elif args.format == "strimzi":
        sys.stdout.write(
            yaml.safe_dump_all(strimzi_users(rules, args.strimzi_cluster, args.namespace), sort_keys=False)
        )
    else:
        sys.stdout.write(json.dumps([rule.__dict__ for rule in rules], indent=2) + "\n")


def _acls(args: argparse.Namespace) -> int:
    users = _users(args)
    settings = _settings(args.prefix)
    try:
        rules = acl_bindings(settings.topic_prefix, users)
    except AccessError as error:
        raise UsageError(f"--user: {error}") from None
    if not (args.apply or args.check or args.prune):
        _print(rules, args)
        return 0
    from kumiki.common.bus.admin import BrokerUnavailable, create_acls, delete_acls, describe_acls

    try:
        if args.apply:
            added = asyncio.run(create_acls(settings, rules))
            console.print(f"added {added} rules for {len(set(users.values()))} users on {settings.bootstrap}")
            return 0
        missing, extra = missing_and_extra(rules, asyncio.run(describe_acls(settings)))
        if args.prune:
            removed = asyncio.run(delete_acls(settings, extra))
            if extra:
                console.print(_table(extra, "removed: granted beyond the policy"))
            console.print(f"removed {removed} rules beyond the policy on {settings.bootstrap}")
            return 0
    except BrokerUnavailable as error:
        console.print(f"kumiki kafka acls: {error}", markup=False, highlight=False)
        return EXIT_BROKER
    if extra:
        console.print(_table(extra, "granted beyond the policy (more than least privilege)"))
    if missing:
        console.print(_table(missing, "missing: these users will be refused"))
        console.print(
            f"{len(missing)} of {len(rules)} rules missing on {settings.bootstrap}: kumiki kafka acls --apply"
        )
        return 1
    console.print(f"all {len(rules)} rules present on {settings.bootstrap}, {len(extra)} beyond the policy")
    return 0
