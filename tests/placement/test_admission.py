"""Placement asks the real quota service (its own process shell: gRPC, Postgres, the job.lifecycle ledger)
before binding: a job beyond its queue's limit waits with the quota's reason, a caller who does not own the
queue is refused, and a waiting job binds once a release gives its queue room again."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from kumiki.common.config import ConfigError, DatabaseSettings, KafkaSettings, ServerSettings, Settings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.service import ServiceHost
from kumiki.devstack.cluster import NodeShape, emulated_nodes
from kumiki.placement.app import quota_credentials
from kumiki.quota.adapters.auth import token_digest
from kumiki.quota.app import SPEC as QUOTA
from tests.conftest import wait_until
from tests.placement.support import bind_request, emulate, running_placement, whole
from tests.placement.test_service import BOUND, PENDING, host_book
from tests.quota.helpers import TOKENS, migrated_pool, tree
from tests.quota.test_service import make_certificates


@contextlib.asynccontextmanager
async def placement_asking_quota(
    kafka: KafkaSettings, database_settings: DatabaseSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[placement_pb2_grpc.PlacementStub]:
    """The quota process (tree(): team-a limited to 10 GPUs) and placement asking it as alice, on two 8-GPU nodes."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({token_digest(token): who for who, token in TOKENS.items()}))
    queues = tmp_path / "queues.yaml"
    queues.write_text(yaml.safe_dump(tree(capacity=16)))
    monkeypatch.setenv("KUMIKI_QUOTA_TOKENS_FILE", str(tokens))
    monkeypatch.setenv("KUMIKI_QUOTA_CONFIG_FILE", str(queues))
    shape = NodeShape("A100", 8, 81920, 8, 96_000, 1_048_576)
    await emulate(kafka, emulated_nodes(2, shapes=(shape,)))
    quota = ServiceHost(QUOTA, Settings("quota", kafka, database_settings, ServerSettings(), instance="quota-test"))
    try:
        await quota.start()
        monkeypatch.setenv("KUMIKI_QUOTA_ADDRESS", f"127.0.0.1:{quota.grpc_port}")
        monkeypatch.setenv("KUMIKI_QUOTA_TOKEN", TOKENS["alice"])
        async with running_placement(kafka) as (host, stub):
            await wait_until(lambda: len(host_book(host).nodes) == 2, what="the nodes")
            yield stub
    finally:
        await quota.stop()


async def test_quota_limit_keeps_jobs_pending_until_room(
    kafka: KafkaSettings, database_settings: DatabaseSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with placement_asking_quota(kafka, database_settings, monkeypatch, tmp_path) as stub:
        first = await stub.Bind(bind_request("a-1", [whole(8)], queue="org/team-a"))
        over = await stub.Bind(bind_request("a-2", [whole(4)], queue="org/team-a"))
        assert first.outcome == BOUND
        assert over.outcome == PENDING, "team-a's limit is 10 GPUs: 8 + 4 must wait although 8 GPUs are free"
        assert over.reasons[0].code == "quota_exceeded"
        explained = await stub.Explain(placement_pb2.ExplainRequest(job_id="a-2"))
        assert explained.status == "pending" and explained.reasons[0].code == "quota_exceeded"

        not_owner = await stub.Bind(bind_request("b-1", [whole(1)], queue="other/batch2"))
        assert not_owner.outcome == PENDING and "PERMISSION_DENIED" in not_owner.reasons[0].message

        await stub.Release(placement_pb2.ReleaseRequest(job=common_pb2.JobRef(job_id="a-1", generation=1)))

        async def bound_after_release() -> bool:
            return (await stub.Explain(placement_pb2.ExplainRequest(job_id="a-2"))).status == "bound"

        await wait_until(bound_after_release, timeout_s=60, what="a-2 to be admitted once a-1 freed its quota")


async def test_a_preempted_jobs_next_generation_is_admitted_again_before_it_runs(
    kafka: KafkaSettings, database_settings: DatabaseSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PREEMPTED ends an attempt's admission in quota's ledger. Were the next generation queued without asking
    again, it would run on GPUs quota no longer counts, and a-2 would then be admitted past team-a's limit."""
    pool = await migrated_pool(database_settings)
    try:
        async with placement_asking_quota(kafka, database_settings, monkeypatch, tmp_path) as stub:
            assert (await stub.Bind(bind_request("a-1", [whole(8)], queue="org/team-a"))).outcome == BOUND
            over = await stub.Bind(bind_request("a-2", [whole(4)], queue="org/team-a"))
            assert over.outcome == PENDING and over.reasons[0].code == "quota_exceeded"
            evicted = placement_pb2.ReleaseRequest(
                job=common_pb2.JobRef(job_id="a-1", generation=1),
                reason="preempted",
                final_state=events_pb2.JOB_STATE_PREEMPTED,
            )
            assert (await stub.Release(evicted)).released  # as the coordinator does after the eviction

            async def ledger_closed_and_rebound() -> bool:
                closed = await pool.fetchval(
                    "SELECT count(*) FROM quota.ledger WHERE job_id = 'a-1' AND generation = 1"
                )
                status = (await stub.Explain(placement_pb2.ExplainRequest(job_id="a-1"))).status
                return closed == 1 and status == "bound"

            await wait_until(ledger_closed_and_rebound, timeout_s=60, what="a-1's attempt metered and a-1 bound again")
            holdings = await pool.fetch("SELECT job_id, generation, gpus FROM quota.holdings ORDER BY job_id")
            assert [(row["job_id"], row["generation"], row["gpus"]) for row in holdings] == [("a-1", 2, 8)]
            waiting = await stub.Explain(placement_pb2.ExplainRequest(job_id="a-2"))
            assert waiting.status == "pending" and waiting.reasons[0].code == "quota_exceeded"
    finally:
        await pool.close()


async def test_placement_reaches_quota_over_mtls_as_its_certificate_identity(
    kafka: KafkaSettings, database_settings: DatabaseSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Quota requires client certificates; placement's certificate CN is the identity that must own the queue."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificates")
    make_certificates(tmp_path)
    queues = tmp_path / "queues.yaml"
    queues.write_text(yaml.safe_dump(tree(capacity=16)))
    monkeypatch.setenv("KUMIKI_QUOTA_CONFIG_FILE", str(queues))
    monkeypatch.setenv("KUMIKI_TLS_CLIENT_CAFILE", str(tmp_path / "ca.crt"))  # quota: identities from certificates
    tls = ServerSettings(
        tls_certfile=tmp_path / "server.crt", tls_keyfile=tmp_path / "server.key", tls_client_cafile=tmp_path / "ca.crt"
    )
    await emulate(kafka, emulated_nodes(1))
    quota = ServiceHost(QUOTA, Settings("quota", kafka, database_settings, tls, instance="quota-mtls"))
    try:
        await quota.start()
        monkeypatch.delenv("KUMIKI_TLS_CLIENT_CAFILE")
        monkeypatch.setenv("KUMIKI_QUOTA_ADDRESS", f"127.0.0.1:{quota.grpc_port}")
        monkeypatch.setenv("KUMIKI_QUOTA_CAFILE", str(tmp_path / "ca.crt"))
        for client, outcome in (("alice", BOUND), ("mallory", PENDING)):
            monkeypatch.setenv("KUMIKI_QUOTA_CERTFILE", str(tmp_path / f"{client}.crt"))
            monkeypatch.setenv("KUMIKI_QUOTA_KEYFILE", str(tmp_path / f"{client}.key"))
            async with running_placement(kafka) as (host, stub):
                await wait_until(lambda: len(host_book(host).nodes) == 1, what="the node")
                reply = await stub.Bind(bind_request(f"{client}-1", [whole(1)], queue="org/team-a"))
                assert reply.outcome == outcome, (client, reply)
                if outcome == PENDING:
                    assert "PERMISSION_DENIED" in reply.reasons[0].message and "mallory" in reply.reasons[0].message
        # without a client certificate the TLS handshake fails: placement fails closed, the job waits
        monkeypatch.delenv("KUMIKI_QUOTA_CERTFILE")
        monkeypatch.delenv("KUMIKI_QUOTA_KEYFILE")
        async with running_placement(kafka) as (host, stub):
            await wait_until(lambda: len(host_book(host).nodes) == 1, what="the node")
            reply = await stub.Bind(bind_request("anonymous-1", [whole(1)], queue="org/team-a"))
            assert reply.outcome == PENDING and "quota service answered" in reply.reasons[0].message
    finally:
        await quota.stop()


def test_quota_client_certificate_needs_its_key(tmp_path: Path) -> None:
    cert = tmp_path / "placement.crt"
    cert.write_text("not checked here")
    with pytest.raises(ConfigError, match="KUMIKI_QUOTA_KEYFILE"):
        quota_credentials({"KUMIKI_QUOTA_CERTFILE": str(cert)})
    with pytest.raises(ConfigError, match="KUMIKI_QUOTA_CAFILE: expected a readable file"):
        quota_credentials({"KUMIKI_QUOTA_CAFILE": str(tmp_path / "missing.crt")})
    assert quota_credentials({}) is None
