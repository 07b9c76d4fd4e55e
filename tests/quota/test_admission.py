"""Quota.Admit and Quota.Usage over a real gRPC server on loopback with the real Postgres store."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import grpc
import pytest

from kumiki.common.bus import Event
from kumiki.common.bus.cloudevents import CloudEventAttributes
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, quota_pb2
from kumiki.quota.adapters.ledger import LedgerHandler
from kumiki.quota.adapters.store import write_config
from kumiki.quota.core import parse_config
from tests.quota.helpers import admit_request, bearer, quota_server, tree

pytestmark = pytest.mark.postgres

ADMITTERS = 50


async def test_fifty_concurrent_admitters_never_exceed_a_limit(database_settings: DatabaseSettings) -> None:
    async with quota_server(database_settings, tree(capacity=16), pool_max=20) as quota:
        replies = await asyncio.gather(
            *(
                quota.stub.Admit(admit_request(f"a-{i}", "org/team-a", 1), metadata=bearer("alice"))
                for i in range(ADMITTERS)
            )
        )
        admitted = [reply for reply in replies if reply.admitted]
        assert len(admitted) == 10, [reply.reason.code for reply in replies]
        assert {reply.reason.code for reply in replies if not reply.admitted} == {"limit_exceeded"}
        held = await quota.pool.fetchval("SELECT sum(gpus) FROM quota.holdings WHERE queue = 'org/team-a'")
        assert held == 10


async def test_fifty_concurrent_borrowers_in_two_subtrees_never_exceed_capacity(
    database_settings: DatabaseSettings,
) -> None:
    async with quota_server(database_settings, tree(capacity=16), pool_max=20) as quota:
        replies = await asyncio.gather(
            *(
                quota.stub.Admit(
                    admit_request(f"b-{i}", "org/batch" if i % 2 else "other/batch2", 1, preemptible=True),
                    metadata=bearer("erin"),
                )
                for i in range(ADMITTERS)
            )
        )
        borrowed = [reply for reply in replies if reply.admitted]
        assert len(borrowed) == 16 and all(reply.borrowed for reply in borrowed)
        assert await quota.pool.fetchval("SELECT sum(gpus) FROM quota.holdings") == 16


async def test_guaranteed_admission_reclaims_from_borrowers(database_settings: DatabaseSettings) -> None:
    async with quota_server(database_settings, tree(capacity=16)) as quota:
        for i in range(16):
            reply = await quota.stub.Admit(
                admit_request(f"b-{i}", "org/batch", 1, preemptible=True), metadata=bearer("erin")
            )
            assert reply.borrowed
        reply = await quota.stub.Admit(admit_request("needs-3", "org/team-a", 3), metadata=bearer("alice"))
        assert reply.admitted and not reply.borrowed and "reclaimed" in reply.reason.message
        rows = await quota.pool.fetch("SELECT * FROM quota.reclaim_decisions ORDER BY victim_job")
        assert [row["victim_job"] for row in rows] == ["b-13", "b-14", "b-15"]  # latest admitted lose least work
        assert {row["beneficiary_job"] for row in rows} == {"needs-3"}
        reclaiming = await quota.pool.fetchval("SELECT count(*) FROM quota.holdings WHERE reclaiming")
        assert reclaiming == 3
        # the same admission again is idempotent: no new victims
        again = await quota.stub.Admit(admit_request("needs-3", "org/team-a", 3), metadata=bearer("alice"))
        assert again.admitted and again.reason.code == "already_admitted"
        assert await quota.pool.fetchval("SELECT count(*) FROM quota.reclaim_decisions") == 3


async def test_reclaim_takes_running_borrowers_before_ones_not_bound_yet(database_settings: DatabaseSettings) -> None:
    """The three latest borrowers were admitted but never bound (they wait in placement for nodes): reclaiming
    them would free no GPU. The victims are the latest three that run (BOUND, an open interval in the ledger)."""
    async with quota_server(database_settings, tree(capacity=16)) as quota:
        for i in range(16):
            reply = await quota.stub.Admit(
                admit_request(f"b-{i}", "org/batch", 1, preemptible=True), metadata=bearer("erin")
            )
            assert reply.borrowed
        handler = LedgerHandler()
        async with quota.pool.acquire() as connection, connection.transaction():
            for i in range(13):
                bound = lifecycle(f"b-{i}", 1, events_pb2.JOB_STATE_BOUND, 1_800_000_000.0, gpus=1, queue="org/batch")
                await handler(bound, connection)
        reply = await quota.stub.Admit(admit_request("needs-3", "org/team-a", 3), metadata=bearer("alice"))
        assert reply.admitted and not reply.borrowed
        rows = await quota.pool.fetch("SELECT victim_job FROM quota.reclaim_decisions ORDER BY victim_job")
        assert [row["victim_job"] for row in rows] == ["b-10", "b-11", "b-12"]


async def test_callers_must_own_the_queue(database_settings: DatabaseSettings) -> None:
    async with quota_server(database_settings, tree()) as quota:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await quota.stub.Admit(admit_request("x", "org/team-a", 1), metadata=bearer("bob"))
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "queue org/team-a" in (error.value.details() or "") and "bob" in (error.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await quota.stub.Admit(
                admit_request("x", "org/team-a", 1), metadata=(("authorization", "Bearer not-a-known-token"),)
            )
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "queue org/team-a" in (error.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await quota.stub.Admit(admit_request("x", "org/team-a", 1))
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await quota.stub.Admit(admit_request("x", "nowhere", 1), metadata=bearer("alice"))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND and "nowhere" in (error.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await quota.stub.Admit(admit_request("x", "org/team-a", -1), metadata=bearer("alice"))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error.value.details().startswith("gpus:")
        assert await quota.pool.fetchval("SELECT count(*) FROM quota.holdings") == 0


async def test_invalid_reload_leaves_the_tree_untouched(database_settings: DatabaseSettings) -> None:
    async with quota_server(database_settings, tree()) as quota:
        bad = tree()
        bad["queues"].append({"name": "x", "parent": "org", "guarantee": 50})
        with pytest.raises(ValueError, match="queue org/x: guarantee"):
            await write_config(quota.pool, parse_config(bad), "bad")
        assert await quota.pool.fetchval("SELECT count(*) FROM quota.queues") == 5
        grown = tree(capacity=32, extra={"guarantee": 4, "owners": ["bob"]})
        version = await write_config(quota.pool, parse_config(grown), "grown")
        assert version == 2
        reply = await quota.stub.Admit(admit_request("e", "extra", 4), metadata=bearer("bob"))
        assert reply.admitted and not reply.borrowed


def lifecycle(
    job: str, generation: int, state: int, at_s: float, *, gpus: float = 2.0, queue: str = "org/team-a"
) -> Event:
    message = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=job, generation=generation),
        state=state,  # type: ignore[arg-type]
        queue=queue,
        gpus=gpus,
        gpu_model="A100",
        priority_tier=1,
    )
    message.at.seconds = int(at_s)
    message.at.nanos = round((at_s - int(at_s)) * 1e9)
    attributes = CloudEventAttributes.new(JOB_LIFECYCLE.ce_type, "//test", None, None)
    return Event(JOB_LIFECYCLE, job, message, attributes, [], 0, 0)


async def test_usage_splits_intervals_at_the_window_and_prices_them(database_settings: DatabaseSettings) -> None:
    async with quota_server(database_settings, tree()) as quota:
        handler = LedgerHandler()
        t0 = 1_800_000_000.0
        async with quota.pool.acquire() as connection, connection.transaction():
            await handler(lifecycle("j1", 1, events_pb2.JOB_STATE_RUNNING, t0), connection)
            await handler(lifecycle("j1", 1, events_pb2.JOB_STATE_COMPLETED, t0 + 7200), connection)
            await handler(lifecycle("j1", 1, events_pb2.JOB_STATE_COMPLETED, t0 + 9000), connection)  # repeated
        window = quota_pb2.UsageRequest(queue="org")
        window.since.seconds = int(t0 + 3600)
        window.until.seconds = int(t0 + 10_800)
        reply = await quota.stub.Usage(window, metadata=bearer("alice"))
        assert [(row.queue, row.gpu_model, row.priority_tier) for row in reply.usage] == [("org/team-a", "A100", 1)]
        assert reply.usage[0].gpu_seconds == 2.0 * 3600
        assert reply.usage[0].cost == pytest.approx(2.0 * 3600 / 3600 * 2.0)
        total = await quota.pool.fetchval("SELECT sum(gpu_seconds) FROM quota.ledger")
        assert total == Decimal(2 * 7200)
        # erin owns nothing under org: sees nothing there
        erin = await quota.stub.Usage(quota_pb2.UsageRequest(), metadata=bearer("erin"))
        assert list(erin.usage) == []


async def test_kai_1750_over_grpc_reclaims_the_over_quota_sibling(database_settings: DatabaseSettings) -> None:
    """kai-scheduler/KAI-Scheduler#1750 end to end: a protected lower-priority queue exists, the reclaimer's
    over-quota sibling is still reclaimed, and the protected queue's work is never chosen."""
    config = {
        "cluster": {"gpus": {"A100": 10}},
        "queues": [
            {"name": "org-parent", "guarantee": 6},
            {"name": "reclaimer", "parent": "org-parent", "guarantee": 4, "owners": ["alice"]},
            {"name": "batch", "parent": "org-parent", "guarantee": 0, "owners": ["erin"]},
            {"name": "protected", "guarantee": 4, "priority_tiers": [0], "owners": ["bob"]},
        ],
    }
    async with quota_server(database_settings, config) as quota:
        low = await quota.stub.Admit(admit_request("protected-1", "protected", 3, tier=0), metadata=bearer("bob"))
        assert low.admitted and not low.borrowed
        for job in ("batch-1", "batch-2"):
            reply = await quota.stub.Admit(
                admit_request(job, "org-parent/batch", 3, preemptible=True, tier=5), metadata=bearer("erin")
            )
            assert reply.borrowed
        reply = await quota.stub.Admit(admit_request("pending", "org-parent/reclaimer", 4), metadata=bearer("alice"))
        assert reply.admitted and not reply.borrowed
        rows = await quota.pool.fetch("SELECT victim_job, victim_queue, beneficiary_job FROM quota.reclaim_decisions")
        assert [tuple(row.values()) for row in rows] == [("batch-2", "org-parent/batch", "pending")]
