"""Who may read and write which topic: one declaration per Kafka principal, and the ACLs that follow from it.

The table below is the bus's least-privilege policy. Services create only the topics they declare
(`ServiceHost`), their producer refuses to publish to a topic they do not declare writing, and
`acl_bindings` turns the table into the exact ACLs a broker running an authorizer needs (`kumiki kafka acls`
prints or applies them). A service that reaches for an undeclared topic therefore fails in every test, not
only on a secured broker. Pure: no I/O, nothing of Kafka's client.

Kafka's rules this leans on: READ and WRITE each imply DESCRIBE; WRITE on any topic implies IDEMPOTENT_WRITE
(KIP-679); a consumer group needs READ on the group to join and commit; CREATE on a topic lets its user create
it (the services create the topics they use when missing, as on an open broker).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kumiki.common.bus.topics import (
    CHECKPOINTS,
    CLUSTER_STATE,
    DEAD_LETTER,
    GPU_BUSY,
    GPU_IDLE,
    GPU_SAMPLES,
    JOB_FORECAST,
    JOB_LIFECYCLE,
    NODE_INVENTORY,
    PREEMPTION_COMMANDS,
    QUOTA_STATE,
    SCHEDULING_DECISIONS,
    TopicSpec,
)

# What a system outside Kumiki may subscribe to: every decision and its inputs, not the dead letters (they
# hold whatever a producer sent, unvalidated).
PUBLIC_TOPICS: tuple[TopicSpec, ...] = (
    SCHEDULING_DECISIONS,
    JOB_LIFECYCLE,
    JOB_FORECAST,
    QUOTA_STATE,
    CLUSTER_STATE,
    GPU_IDLE,
    GPU_BUSY,
    PREEMPTION_COMMANDS,
    CHECKPOINTS,
)


@dataclass(frozen=True)
class Access:
    """One principal's share of the bus.

    `groups`: consumer groups joined by literal name. `own_prefix`: a name (after the topic prefix) under which
    the principal keeps its own topics and groups, granted whole (telemetry's faust app: its changelogs,
    internal topics and groups all start with it). `group_prefix`: groups it may name freely under the topic
    prefix (a subscriber's own groups).
    """

    role: str
    reads: tuple[TopicSpec, ...] = ()
    writes: tuple[TopicSpec, ...] = ()
    groups: tuple[str, ...] = ()
    own_prefix: str | None = None
    group_prefix: str | None = None
    creates: bool = True  # creates the topics it uses when they are missing

    @property
    def topics(self) -> tuple[TopicSpec, ...]:
        """Every topic it reads or writes, each once, in declaration order."""
        return tuple(dict.fromkeys((*self.reads, *self.writes)))

    def check_consumer(self, topics: Iterable[TopicSpec], group: str) -> None:
        """Raise UndeclaredAccess unless the role declares reading every topic and joining the group."""
        undeclared = [topic.name for topic in topics if topic not in self.reads]
        if undeclared:
            raise UndeclaredAccess(f"{self.role}: consuming {', '.join(undeclared)}, not among the topics it reads")
        if group not in self.groups:
            raise UndeclaredAccess(f"{self.role}: joining consumer group {group!r}, not among its groups")


ACCESS: dict[str, Access] = {
    access.role: access
    for access in (
        # rebuilds its book from lifecycle and follows nodes, checkpoints, forecasts and idle and busy findings with
        # group-less readers; publishes every decision and the lifecycle it decides
        Access(
            "placement",
            reads=(JOB_LIFECYCLE, CLUSTER_STATE, CHECKPOINTS, JOB_FORECAST, GPU_IDLE, GPU_BUSY),
            writes=(SCHEDULING_DECISIONS, JOB_LIFECYCLE),
        ),
        # meters lifecycle in its group; follows nodes with a group-less reader (the capacity it lends)
        Access(
            "quota",
            reads=(JOB_LIFECYCLE, CLUSTER_STATE),
            writes=(QUOTA_STATE, SCHEDULING_DECISIONS, DEAD_LETTER),
            groups=("kumiki-quota",),
        ),
        Access(
            "forecast",
            reads=(JOB_LIFECYCLE, CHECKPOINTS),
            writes=(JOB_FORECAST, DEAD_LETTER),
            groups=("kumiki-forecast", "kumiki-forecast-progress"),
        ),
        Access(
            "preemption",
            reads=(SCHEDULING_DECISIONS, JOB_LIFECYCLE),
            writes=(PREEMPTION_COMMANDS, CHECKPOINTS, DEAD_LETTER),
            groups=("preemption-decisions", "preemption-lifecycle"),
        ),
        Access(
            "telemetry-ingest",
            reads=(GPU_SAMPLES, NODE_INVENTORY, JOB_LIFECYCLE, CLUSTER_STATE),
            writes=(CLUSTER_STATE, GPU_IDLE, GPU_BUSY, DEAD_LETTER),
            own_prefix="telemetry-ingest",
        ),
        # the Kubernetes binder: follows lifecycle and nodes, takes preemption commands, reports pods running
        # and nodes gone
        Access(
            "binder",
            reads=(JOB_LIFECYCLE, CLUSTER_STATE, PREEMPTION_COMMANDS),
            writes=(JOB_LIFECYCLE, CLUSTER_STATE, DEAD_LETTER),
            groups=("kumiki-binder",),
        ),
        # one per GPU node, next to user workloads: telemetry only, never a decision or a lifecycle event
        Access("agent", writes=(GPU_SAMPLES, NODE_INVENTORY)),
        # other systems reading Kumiki's decisions: read only, groups of their own naming
        Access("subscriber", reads=PUBLIC_TOPICS, group_prefix="subscriber-", creates=False),
    )
}
SERVICE_ROLES = ("placement", "quota", "forecast", "preemption", "telemetry-ingest")


class UndeclaredAccess(PermissionError):
    """A service reaching for a topic or group its declaration leaves out: a programming error."""


class AccessError(ValueError):
    """A role or user name that the policy cannot use; the message names it."""


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ALLOW rule, in Kafka's own words: `principal` is `User:<name>`, `resource` TOPIC or GROUP, `pattern`
    LITERAL or PREFIXED, `operation` READ, WRITE, CREATE or DESCRIBE (as kafka-acls.sh and the Admin API
    name them)."""

    principal: str
    resource: str
    name: str
    pattern: str
    operation: str

    @property
    def user(self) -> str:
        return self.principal.removeprefix("User:")


def default_user(role: str) -> str:
    return f"kumiki-{role}" if not role.startswith("kumiki-") else role


def _valid_user(role: str, user: str) -> str:
    if not user or any(character in user for character in ",;=: \t\n"):
        raise AccessError(f"{role}: a Kafka user name without spaces, ',', ';', '=' or ':', got {user!r}")
    return user


def bindings_for(access: Access, user: str, prefix: str) -> list[AclBinding]:
    """The ALLOW rules one principal needs, and nothing more."""
    principal = f"User:{_valid_user(access.role, user)}"

    def rule(resource: str, name: str, operation: str, pattern: str = "LITERAL") -> AclBinding:
        return AclBinding(principal, resource, name, pattern, operation)

    rules = [rule("TOPIC", topic.full_name(prefix), "READ") for topic in access.reads]
    rules += [rule("TOPIC", topic.full_name(prefix), "WRITE") for topic in access.writes]
    if access.creates:
        rules += [rule("TOPIC", topic.full_name(prefix), "CREATE") for topic in access.topics]
    rules += [rule("GROUP", group, "READ") for group in access.groups]
    if access.own_prefix:
        own = f"{prefix}{access.own_prefix}"
        rules += [rule("TOPIC", own, operation, "PREFIXED") for operation in ("READ", "WRITE", "CREATE")]
        rules.append(rule("GROUP", own, "READ", "PREFIXED"))
    if access.group_prefix:
        rules.append(rule("GROUP", f"{prefix}{access.group_prefix}", "READ", "PREFIXED"))
    return sorted(set(rules))


def acl_bindings(prefix: str, users: Mapping[str, str]) -> list[AclBinding]:
    """Every rule for the roles in `users` (role -> Kafka user). Two roles may share one user (a small install
    running every service as one): that user gets the union."""
    unknown = sorted(set(users) - set(ACCESS))
    if unknown:
        raise AccessError(f"unknown role {unknown[0]!r} (known: {', '.join(ACCESS)})")
    return sorted({rule for role, user in users.items() for rule in bindings_for(ACCESS[role], user, prefix)})


def missing_and_extra(
    wanted: Iterable[AclBinding], present: Iterable[AclBinding]
) -> tuple[list[AclBinding], list[AclBinding]]:
    """What a broker lacks of the policy, and what it grants the policy's users beyond it (a stale or hand-made
    rule: more than least privilege)."""
    wanted_set, present_set = set(wanted), set(present)
    users = {rule.principal for rule in wanted_set}
    extra = {rule for rule in present_set - wanted_set if rule.principal in users}
    return sorted(wanted_set - present_set), sorted(extra)


def kafka_acls_commands(bindings: Iterable[AclBinding], command_config: str = "admin.properties") -> list[str]:
    """The same rules as Apache Kafka's own tool adds them (`kafka-acls.sh --add`), one line per rule."""
    lines = []
    for rule in bindings:
        pattern = " --resource-pattern-type prefixed" if rule.pattern == "PREFIXED" else ""
        lines.append(
            'kafka-acls.sh --bootstrap-server "$KAFKA_BOOTSTRAP" --command-config'
            f" {command_config} --add --allow-principal {rule.principal}"
            f" --operation {rule.operation.title()} --{rule.resource.lower()} {rule.name}{pattern}"
        )
    return lines


def strimzi_users(
    bindings: Iterable[AclBinding], cluster: str, namespace: str | None = None
) -> list[dict[str, object]]:
    """The same rules as Strimzi KafkaUser resources (SCRAM-SHA-512, simple authorization), one per user: the
    operator then creates the user, its password Secret and its ACLs."""
    by_user: dict[str, list[AclBinding]] = {}
    for rule in bindings:
        by_user.setdefault(rule.user, []).append(rule)
    resources: list[dict[str, object]] = []
    for user, rules in sorted(by_user.items()):
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for rule in rules:
            grouped.setdefault((rule.resource, rule.name, rule.pattern), []).append(rule.operation)
        acls = [
            {
                "resource": {"type": resource.lower(), "name": name, "patternType": pattern.lower()},
                "operations": [operation.title() for operation in sorted(operations)],
            }
            for (resource, name, pattern), operations in sorted(grouped.items())
        ]
        metadata: dict[str, object] = {"name": user, "labels": {"strimzi.io/cluster": cluster}}
        if namespace:
            metadata["namespace"] = namespace
        resources.append(
            {
                "apiVersion": "kafka.strimzi.io/v1beta2",
                "kind": "KafkaUser",
                "metadata": metadata,
                "spec": {
                    "authentication": {"type": "scram-sha-512"},
                    "authorization": {"type": "simple", "acls": acls},
                },
            }
        )
    return resources
