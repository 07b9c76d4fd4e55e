"""Apache Kafka with KRaft's StandardAuthorizer (nothing allowed without an ACL), one SCRAM user per service
and for the node agent, and exactly the ACLs `kumiki.common.bus.access` derives, added and read back through
the Admin API (`kumiki.common.bus.admin`). Every service runs as its own user, a job goes through placement,
quota, forecast and preemption, and telemetry turns an agent's samples into node state; the agent's user is
refused the lifecycle topic it must never write; a service started as another role's user stops at start with
one line naming the variable and the topic."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import grpc
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from kumiki.common.bus.access import (
    ACCESS,
    SERVICE_ROLES,
    AclBinding,
    acl_bindings,
    bindings_for,
    default_user,
    missing_and_extra,
)
from kumiki.common.bus.admin import create_acls, describe_acls
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.devstack.broker import add_scram_user
from kumiki.devstack.cluster import publish_nodes
from kumiki.devstack.processes import free_port
from tests.conftest import read_records, wait_until
from tests.placement.support import bind_request, default_nodes, whole
from tests.security.support import (
    SecureBroker,
    process_env,
    record_dcgm_page,
    run_agent,
    secret_file,
    secure_kafka,
    services_running,
)

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.slow]
PREFIX = "acl."
USERS = {role: default_user(role) for role in ACCESS}


@pytest.fixture(scope="module")
def locked_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """The broker with an authorizer and the policy's ACLs for every role, as its admin adds them."""
    with secure_kafka(tmp_path_factory.mktemp("acl"), list(USERS.values()), authorizer=True) as (broker, _):
        admin = broker.settings("admin", PREFIX)
        sent = asyncio.run(create_acls(admin, acl_bindings(PREFIX, USERS)))
        assert sent == len(acl_bindings(PREFIX, USERS))
        yield broker


def add_user(broker: SecureBroker, user: str, folder: Path) -> Path:
    password = secrets.token_urlsafe(18)
    assert broker.listener is not None
    add_scram_user(broker.bootstrap, broker.listener, user, password, folder)
    return secret_file(folder, user, password)


def test_the_broker_holds_exactly_the_policy(locked_broker: SecureBroker) -> None:
    wanted = acl_bindings(PREFIX, USERS)
    present = asyncio.run(describe_acls(locked_broker.settings("admin", PREFIX)))
    assert missing_and_extra(wanted, present) == ([], [])
    # adding the same rules again changes nothing (an upgrade re-runs it)
    asyncio.run(create_acls(locked_broker.settings("admin", PREFIX), wanted[:5]))
    assert sorted(asyncio.run(describe_acls(locked_broker.settings("admin", PREFIX)))) == sorted(present)


def test_a_service_user_may_not_manage_acls(locked_broker: SecureBroker) -> None:
    from kumiki.common.bus.admin import BrokerUnavailable

    with pytest.raises(BrokerUnavailable, match="user 'kumiki-placement' may not manage ACLs"):
        asyncio.run(describe_acls(locked_broker.settings("kumiki-placement", PREFIX)))


async def _count(database_url: str, query: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        return int(await connection.fetchval(query))
    finally:
        await connection.close()


async def _bind_and_release(address: str, job: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = placement_pb2_grpc.PlacementStub(channel)
        bound = await stub.Bind(bind_request(job, [whole(1)]), timeout=60)
        assert bound.outcome == placement_pb2.BindResponse.OUTCOME_BOUND, bound
        released = await stub.Release(
            placement_pb2.ReleaseRequest(
                job=common_pb2.JobRef(job_id=job, generation=1), final_state=events_pb2.JOB_STATE_COMPLETED
            ),
            timeout=60,
        )
        assert released.released


def test_every_service_works_as_its_own_user_with_only_its_acls(
    locked_broker: SecureBroker, database_url: str, tmp_path: Path
) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(json.dumps({"cluster": {"gpus": {"A100": 16}}, "queues": [{"name": "team-a", "guarantee": 8}]}))
    shared = {
        "KUMIKI_TOPIC_PREFIX": PREFIX,
        "KUMIKI_DATABASE_URL": database_url,
        "KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true",
        "KUMIKI_QUOTA_CONFIG_FILE": str(queues),
        "KUMIKI_QUOTA_STATE_INTERVAL_S": "0.5",
    }
    quota_port = free_port()
    env_of = {role: {**shared, **locked_broker.env(USERS[role])} for role in SERVICE_ROLES}
    env_of["quota"]["KUMIKI_QUOTA_GRPC_PORT"] = str(quota_port)
    env_of["placement"]["KUMIKI_QUOTA_ADDRESS"] = f"127.0.0.1:{quota_port}"
    admin = locked_broker.settings("admin", PREFIX)
    subscriber = locked_broker.settings(USERS["subscriber"], PREFIX)
    asyncio.run(publish_nodes(admin, default_nodes(2)))  # the cluster, as an operator (the admin) emulates it
    with services_running(env_of, tmp_path) as running:  # placement's book holds the nodes once it is ready
        asyncio.run(_bind_and_release(f"127.0.0.1:{running['placement'].grpc_port}", "acl-job-1"))

        # the agent, as its own user, sends a DCGM page's samples; telemetry (its own user) makes node state
        recording, _ = record_dcgm_page(tmp_path)
        agent = run_agent(recording, {**locked_broker.env(USERS["agent"]), "KUMIKI_TOPIC_PREFIX": PREFIX})
        assert agent.returncode == 0, agent.stderr[-2000:]

        # what each service wrote, read back as a subscriber (read-only on the public topics)
        def keyed(topic: str, key: str) -> list[object]:
            return asyncio.run(
                read_records(
                    subscriber, f"{PREFIX}{topic}", 1, timeout_s=90,
                    until=lambda records: any(record.key == key.encode() for record in records),
                )
            )  # fmt: skip

        assert keyed("job.lifecycle", "acl-job-1")  # placement: BOUND, COMPLETED
        assert keyed("scheduling.decisions", "acl-job-1")  # placement
        assert keyed("job.forecast", "acl-job-1")  # forecast, from lifecycle (its group)
        assert keyed("quota.state", "team-a")  # quota
        assert keyed("cluster.state", "gpu-node-7")  # telemetry, from the agent's inventory and samples

        async def ledger_and_groups() -> tuple[int, int]:
            ledger = await _count(database_url, "SELECT count(*) FROM quota.ledger WHERE job_id = 'acl-job-1'")
            groups = await _count(
                database_url,
                "SELECT count(DISTINCT group_id) FROM kumiki_bus.consumer_offsets"
                " WHERE group_id IN ('kumiki-quota', 'kumiki-forecast', 'preemption-lifecycle',"
                " 'preemption-decisions') AND next_offset > 0",
            )
            return ledger, groups

        async def settled() -> bool:
            return await ledger_and_groups() == (1, 4)

        asyncio.run(wait_until(settled, timeout_s=90, what="the ledger row and four groups past their records"))
        for name, service in running.items():
            assert service.process.poll() is None, f"{name} exited: {service.log.read_text()[-2000:]}"
            refused = [line for line in service.log.read_text().splitlines() if "AUTHORIZATION_FAILED" in line]
            assert not refused, f"{name}: {refused[:3]}"


def test_the_agent_user_cannot_forge_lifecycle_or_read_decisions(locked_broker: SecureBroker) -> None:
    agent = locked_broker.settings(USERS["agent"], PREFIX)

    async def forge() -> None:
        producer = AIOKafkaProducer(**agent.client_options(), request_timeout_ms=15000)
        await producer.start()
        try:
            await producer.send_and_wait(f"{PREFIX}job.lifecycle", b"forged", key=b"someone-elses-job")
        finally:
            await producer.stop()

    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(forge())

    async def peek() -> None:
        consumer = AIOKafkaConsumer(
            f"{PREFIX}scheduling.decisions", **agent.client_options(), group_id=None, auto_offset_reset="earliest"
        )
        try:
            await consumer.start()
            await consumer.getone()
        finally:
            await consumer.stop()

    with pytest.raises(KafkaError):  # aiokafka: TopicAuthorizationFailedError from the fetch's metadata
        asyncio.run(asyncio.wait_for(peek(), 30))


def _stops_with(service: str, user: str, broker: SecureBroker, **extra: str) -> list[str]:
    """Start one service as `user`; it must exit 3 without a traceback. Its lines naming itself."""
    variable = "KUMIKI_" + service.upper()
    env = {
        **broker.env(user),
        "KUMIKI_TOPIC_PREFIX": PREFIX,
        f"{variable}_GRPC_PORT": str(free_port()),
        f"{variable}_HTTP_PORT": str(free_port()),
        **extra,
    }
    result = subprocess.run(
        [sys.executable, "-m", f"kumiki.{service}"], env=process_env(env), capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return [line for line in result.stderr.splitlines() if line.startswith(f"kumiki-{service}:")]


def test_a_service_run_as_another_roles_user_stops_with_one_line(locked_broker: SecureBroker) -> None:
    errors = _stops_with("placement", USERS["agent"], locked_broker)
    assert errors == [
        f"kumiki-placement: KUMIKI_KAFKA_SASL_USERNAME: the broker at {locked_broker.bootstrap} does not let user"
        f" 'kumiki-agent' use topic {PREFIX}job.lifecycle (TOPIC_AUTHORIZATION_FAILED): is this the service's own"
        " user? Its ACLs: kumiki kafka acls"
    ]


def test_a_service_whose_acls_leave_out_its_group_stops_with_one_line(
    locked_broker: SecureBroker, database_url: str, tmp_path: Path
) -> None:
    """Forecast with every rule of its role but READ on one of its consumer groups (a hand-made ACL set that
    forgot one): it starts, then the group's join is refused; it exits 3 naming the group, no traceback."""
    user = "kumiki-forecast-partial"
    locked_broker.passwords[user] = add_user(locked_broker, user, tmp_path)
    partial = [
        rule for rule in bindings_for(ACCESS["forecast"], user, PREFIX) if rule.name != "kumiki-forecast-progress"
    ]
    asyncio.run(create_acls(locked_broker.settings("admin", PREFIX), partial))
    errors = _stops_with("forecast", user, locked_broker, KUMIKI_DATABASE_URL=database_url)
    assert errors == [
        f"kumiki-forecast: KUMIKI_KAFKA_SASL_USERNAME: the broker at {locked_broker.bootstrap} does not let user"
        f" '{user}' use consumer group kumiki-forecast-progress (GROUP_AUTHORIZATION_FAILED): is this the service's"
        " own user? Its ACLs: kumiki kafka acls"
    ]


def _cli(broker: SecureBroker, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = process_env({**broker.env(user), "KUMIKI_TOPIC_PREFIX": PREFIX})
    return subprocess.run(
        [sys.executable, "-m", "kumiki.cli", "kafka", "acls", *argv], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_the_cli_checks_then_adds_a_new_agents_rules(locked_broker: SecureBroker) -> None:
    everything = _cli(locked_broker, "admin", "--check")
    assert everything.returncode == 0, everything.stderr
    assert f"all {len(acl_bindings(PREFIX, USERS))} rules present" in everything.stderr

    new_agent = ["--roles", "agent", "--user", "agent=kumiki-agent-rack-9"]
    missing = _cli(locked_broker, "admin", "--check", *new_agent)
    assert missing.returncode == 1, missing.stderr
    assert "4 of 4 rules missing" in missing.stderr and "kumiki-agent-rack-9" in missing.stderr
    added = _cli(locked_broker, "admin", "--apply", *new_agent)
    assert added.returncode == 0, added.stderr
    assert "added 4 rules for 1 users" in added.stderr
    assert _cli(locked_broker, "admin", "--check", *new_agent).returncode == 0

    not_admin = _cli(locked_broker, USERS["quota"], "--check")
    assert not_admin.returncode == 3
    assert not_admin.stderr.strip().splitlines() == [
        "kumiki kafka acls: listing ACLs: error 31: user 'kumiki-quota' may not manage ACLs (run it as the broker's"
        " admin)"
    ]


def test_checking_a_broker_without_an_authorizer_says_so(kafka: KafkaSettings) -> None:
    """The plain test broker runs no authorizer: `--check` cannot compare anything, and says why in one line."""
    env = process_env({"KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap, "KUMIKI_TOPIC_PREFIX": PREFIX})
    result = subprocess.run(
        [sys.executable, "-m", "kumiki.cli", "kafka", "acls", "--check"], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == [
        "kumiki kafka acls: listing ACLs: error 54: the broker runs no authorizer (authorizer.class.name is not set)"
    ]


def test_prune_removes_what_a_user_holds_beyond_the_policy_and_nothing_else(locked_broker: SecureBroker) -> None:
    """An agent's user that once got WRITE on lifecycle (a hand-made rule, or a role that used to need it): `--check`
    lists it as beyond the policy, `--prune` removes exactly it, and the agent's own four rules stay."""
    user = "kumiki-agent-stray"
    roles = ["--roles", "agent", "--user", f"agent={user}"]
    admin = locked_broker.settings("admin", PREFIX)
    stray = AclBinding(f"User:{user}", "TOPIC", f"{PREFIX}job.lifecycle", "LITERAL", "WRITE")
    asyncio.run(create_acls(admin, [*bindings_for(ACCESS["agent"], user, PREFIX), stray]))
    checked = _cli(locked_broker, "admin", "--check", *roles)
    assert checked.returncode == 0, checked.stderr  # nothing missing
    assert "granted beyond the policy" in checked.stderr and "job.lifecycle" in checked.stderr
    pruned = _cli(locked_broker, "admin", "--prune", *roles)
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1 rules beyond the policy" in pruned.stderr
    held = [rule for rule in asyncio.run(describe_acls(admin)) if rule.user == user]
    assert sorted(held) == bindings_for(ACCESS["agent"], user, PREFIX)
    assert "all 4 rules present" in _cli(locked_broker, "admin", "--check", *roles).stderr
