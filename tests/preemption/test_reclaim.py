"""Quota reclaim end to end: quota's own core (the real store and its reclaim publisher) lends a team's unused
guarantee to a borrower; when the owner's job arrives it chooses the borrower as victim and publishes RECLAIM;
the coordinator has the borrower checkpoint, evicts it through placement, and the owner's job gets the GPUs.
The borrower resumes later where it stopped (bitwise equal). Placement admits everything here (its quota client is
tested in tests/placement/test_admission.py); what is live is the decision path from quota to the job."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kumiki.common.bus import EventProducer
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import events_pb2, placement_pb2
from kumiki.quota.adapters.publisher import Publisher
from kumiki.quota.adapters.store import QuotaStore, write_config
from kumiki.quota.core import AdmitRequest, Outcome, parse_config
from tests.conftest import wait_until
from tests.preemption.support import (
    bind_until_bound,
    job_ref,
    live_stack,
    reference_weights,
    start_attempt,
    train_request,
)
from tests.quota.helpers import migrated_pool

pytestmark = pytest.mark.slow

JOB = "team/train"
TREE = {
    "cluster": {"gpus": {"H100-80GB": 16}},
    "rates": {"H100-80GB": 2.0},
    "queues": [
        {"name": "team-a", "guarantee": 16, "limit": 16},
        {"name": "batch", "guarantee": 0},
    ],
}


async def test_borrower_is_checkpointed_and_evicted_when_the_owner_job_arrives(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    steps, step_s = 300, 0.02
    reference = reference_weights(tmp_path, steps)
    pool = await migrated_pool(database_settings)
    await write_config(pool, parse_config(TREE), "test")
    store = QuotaStore(pool)
    try:
        async with live_stack(kafka, database_settings, tmp_path, deadline_s=30.0) as stack:
            owner_first = await store.admit(AdmitRequest("team-a/filler", 1, "team-a", 8), None)
            borrower = await store.admit(AdmitRequest(JOB, 1, "batch", 4, preemptible=True), None)
            assert owner_first.admission.outcome is Outcome.ADMITTED and borrower.admission.outcome is Outcome.BORROWED
            filler_node = await bind_until_bound(stack, train_request("team-a/filler", 1, gpus=8))
            train_node = await bind_until_bound(stack, train_request(JOB, 1, preemptible=True))
            first = await start_attempt(stack, JOB, 1, tmp_path, steps=steps, step_s=step_s)
            await wait_until(lambda: len(first.steps()) >= 40, timeout_s=60, what="the borrower to train")

            owner = train_request("team-a/owner", 1, gpus=8)
            assert (await stack.placement.Bind(owner)).outcome == placement_pb2.BindResponse.OUTCOME_PENDING
            admitted = await store.admit(AdmitRequest("team-a/owner", 1, "team-a", 8), None)
            assert [victim.job_id for victim in admitted.victims] == [JOB]  # quota's victim choice
            async with EventProducer(kafka, "//kumiki/quota/test") as producer:
                publisher = Publisher(store, producer, asyncio.Event(), interval_s=1.0, half_life_s=3600.0)
                assert await publisher.publish_reclaims() == 1  # RECLAIM on kumiki.scheduling.decisions

            assert await first.process.wait() == 0  # checkpointed when asked, then exited
            assert await bind_until_bound(stack, owner) == train_node  # the owner gets the borrower's GPUs
            events = stack.events
            checkpoint = events.command(JOB, 1, events_pb2.PREEMPTION_ACTION_CHECKPOINT)
            evict = events.command(JOB, 1, events_pb2.PREEMPTION_ACTION_EVICT)
            assert checkpoint is not None and checkpoint.reason == "quota-reclaim"
            assert checkpoint.beneficiary.job_id == "team-a/owner"
            assert evict is not None and not evict.forced and [p.node for p in evict.assignments] == [train_node]
            assert evict.gpus == 4

            await stack.placement.Release(
                placement_pb2.ReleaseRequest(
                    job=job_ref("team-a/filler", 1), final_state=events_pb2.JOB_STATE_COMPLETED
                )
            )
            assert await bind_until_bound(stack, train_request(JOB, 2, preemptible=True)) == filler_node
            second = await start_attempt(stack, JOB, 2, tmp_path, steps=steps, step_s=0.0)
            assert await second.process.wait() == 0
            assert (tmp_path / "weights.npy").read_bytes() == reference
    finally:
        await pool.close()
