"""The bus's least-privilege table and the ACLs it derives (pure), and the two places it is enforced without a
secured broker: a service's producer and its consumers. The same table on a broker with an authorizer:
tests/security/test_kafka_acls.py."""

from __future__ import annotations

import re

import pytest

from kumiki.common.bus.access import (
    ACCESS,
    PUBLIC_TOPICS,
    SERVICE_ROLES,
    AccessError,
    AclBinding,
    UndeclaredAccess,
    acl_bindings,
    bindings_for,
    default_user,
    kafka_acls_commands,
    missing_and_extra,
    strimzi_users,
)
from kumiki.common.bus.producer import EventProducer
from kumiki.common.bus.topics import (
    ALL_TOPICS,
    CHECKPOINTS,
    DEAD_LETTER,
    GPU_SAMPLES,
    JOB_LIFECYCLE,
    NODE_INVENTORY,
    SCHEDULING_DECISIONS,
)
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2


def writers_of(topic: object) -> set[str]:
    return {role for role, access in ACCESS.items() if topic in access.writes}


def test_only_the_deciders_write_decisions_and_lifecycle() -> None:
    """What docs/security.md promises: a node agent cannot forge a bind or a completion."""
    assert writers_of(JOB_LIFECYCLE) == {"placement", "binder"}
    assert writers_of(SCHEDULING_DECISIONS) == {"placement", "quota"}
    assert writers_of(GPU_SAMPLES) == {"agent"}
    assert ACCESS["agent"].writes == (GPU_SAMPLES, NODE_INVENTORY) and ACCESS["agent"].reads == ()
    assert ACCESS["subscriber"].writes == () and DEAD_LETTER not in ACCESS["subscriber"].reads


def test_every_consumer_of_a_topic_may_dead_letter_and_every_topic_has_a_writer() -> None:
    for role, access in ACCESS.items():
        if access.groups or access.own_prefix:  # group consumers dead-letter what they cannot decode
            assert DEAD_LETTER in access.writes, role
    written = {topic for access in ACCESS.values() for topic in access.writes}
    assert set(ALL_TOPICS) == written
    assert set(PUBLIC_TOPICS) == set(ALL_TOPICS) - {DEAD_LETTER, GPU_SAMPLES, NODE_INVENTORY}


def test_the_agent_gets_exactly_four_rules_under_the_prefix() -> None:
    assert bindings_for(ACCESS["agent"], "agent-7", "p.") == [
        AclBinding("User:agent-7", "TOPIC", "p.gpu.samples", "LITERAL", "CREATE"),
        AclBinding("User:agent-7", "TOPIC", "p.gpu.samples", "LITERAL", "WRITE"),
        AclBinding("User:agent-7", "TOPIC", "p.node.inventory", "LITERAL", "CREATE"),
        AclBinding("User:agent-7", "TOPIC", "p.node.inventory", "LITERAL", "WRITE"),
    ]


def test_telemetry_owns_its_prefix_and_a_subscriber_only_reads() -> None:
    telemetry = bindings_for(ACCESS["telemetry-ingest"], "t", "kumiki.")
    prefixed = {(rule.resource, rule.name, rule.operation) for rule in telemetry if rule.pattern == "PREFIXED"}
    assert prefixed == {
        ("TOPIC", "kumiki.telemetry-ingest", "READ"),
        ("TOPIC", "kumiki.telemetry-ingest", "WRITE"),
        ("TOPIC", "kumiki.telemetry-ingest", "CREATE"),
        ("GROUP", "kumiki.telemetry-ingest", "READ"),
    }
    subscriber = bindings_for(ACCESS["subscriber"], "s", "kumiki.")
    assert {rule.operation for rule in subscriber} == {"READ"}
    assert AclBinding("User:s", "GROUP", "kumiki.subscriber-", "PREFIXED", "READ") in subscriber


def test_roles_sharing_one_user_get_the_union_once() -> None:
    shared = acl_bindings("k.", dict.fromkeys(SERVICE_ROLES, "kumiki-services"))
    apart = acl_bindings("k.", {role: default_user(role) for role in SERVICE_ROLES})
    assert len(shared) == len(set(shared)) < len(apart)
    assert {(r.resource, r.name, r.pattern, r.operation) for r in shared} == {
        (r.resource, r.name, r.pattern, r.operation) for r in apart
    }


@pytest.mark.parametrize(
    ("users", "message"),
    [
        ({"schedular": "x"}, "unknown role 'schedular'"),
        ({"agent": "a b"}, "agent: a Kafka user name without spaces"),
        ({"agent": ""}, "agent: a Kafka user name"),
        ({"quota": "User:q"}, "quota: a Kafka user name without spaces, ',', ';', '=' or ':'"),
    ],
)
def test_a_bad_role_or_user_is_named(users: dict[str, str], message: str) -> None:
    with pytest.raises(AccessError, match=message):
        acl_bindings("kumiki.", users)


def test_missing_and_extra_compare_only_the_policys_users() -> None:
    wanted = bindings_for(ACCESS["agent"], "a", "k.")
    stray = AclBinding("User:a", "TOPIC", "k.job.lifecycle", "LITERAL", "WRITE")  # more than least privilege
    other = AclBinding("User:someone-else", "TOPIC", "k.x", "LITERAL", "READ")  # not ours to judge
    assert missing_and_extra(wanted, [*wanted[1:], stray, other]) == ([wanted[0]], [stray])


def test_the_rules_render_for_kafka_acls_and_strimzi() -> None:
    rules = bindings_for(ACCESS["telemetry-ingest"], "t", "kumiki.")
    lines = kafka_acls_commands(rules)
    assert len(lines) == len(rules)
    assert (
        'kafka-acls.sh --bootstrap-server "$KAFKA_BOOTSTRAP" --command-config admin.properties --add'
        " --allow-principal User:t --operation Read --group kumiki.telemetry-ingest --resource-pattern-type prefixed"
    ) in lines
    [user] = strimzi_users(rules, "my-kafka", "gpu")
    assert user["metadata"] == {"name": "t", "labels": {"strimzi.io/cluster": "my-kafka"}, "namespace": "gpu"}
    acls = user["spec"]["authorization"]["acls"]  # type: ignore[index]
    samples = next(acl for acl in acls if acl["resource"]["name"] == "kumiki.gpu.samples")
    assert samples == {
        "resource": {"type": "topic", "name": "kumiki.gpu.samples", "patternType": "literal"},
        "operations": ["Create", "Read"],
    }
    assert sum(len(acl["operations"]) for acl in acls) == len(rules)


def test_a_consumer_outside_the_declaration_is_refused_by_name() -> None:
    quota = ACCESS["quota"]
    quota.check_consumer([JOB_LIFECYCLE], "kumiki-quota")
    with pytest.raises(UndeclaredAccess, match="quota: consuming checkpoints, not among the topics it reads"):
        quota.check_consumer([JOB_LIFECYCLE, CHECKPOINTS], "kumiki-quota")
    with pytest.raises(UndeclaredAccess, match="quota: joining consumer group 'kumiki-quota-2'"):
        quota.check_consumer([JOB_LIFECYCLE], "kumiki-quota-2")


async def test_a_producer_refuses_a_topic_its_process_does_not_write() -> None:
    """Refused before anything is queued or sent: no broker is needed to see it (the client is never started)."""
    producer = EventProducer(KafkaSettings(topic_prefix="t."), "//kumiki/agent/n1", writes=ACCESS["agent"].writes)
    forged = events_pb2.JobLifecycle(job=common_pb2.JobRef(job_id="j", generation=1), state=events_pb2.JOB_STATE_BOUND)
    try:
        with pytest.raises(UndeclaredAccess, match=re.escape("publishing to t.job.lifecycle, a topic this process")):
            await producer.publish(JOB_LIFECYCLE, "j", forged)
        with pytest.raises(UndeclaredAccess, match=re.escape("publishing to t.dead-letter")):
            await producer.send_raw("t.dead-letter", b"k", b"v", [])
    finally:
        await producer.stop()
