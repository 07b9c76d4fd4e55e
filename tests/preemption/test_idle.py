"""Idle reclaim end to end: telemetry's kumiki.gpu.idle reports a training job's GPUs idle past its queue's
threshold while a job waits (`KUMIKI_PLACEMENT_IDLE_RECLAIM=team=waiting:5`); placement names it as victim, the
coordinator has it checkpoint and evicts it, and the waiting job gets its GPUs. The idle report is published
here as telemetry-ingest publishes it (tests/telemetry show telemetry producing it from NVML samples)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import GPU_IDLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import events_pb2, placement_pb2
from tests.conftest import wait_until
from tests.preemption.support import Stack, bind_until_bound, job_ref, live_stack, start_attempt, train_request

pytestmark = pytest.mark.slow

JOB = "team/train"


async def report_idle(stack: Stack, node: str) -> None:
    """kumiki.gpu.idle for the job's first attempt, idle for the last 10 s, as telemetry-ingest publishes it."""
    now = time.time()
    idle = events_pb2.GpuIdle(
        job=job_ref(JOB, 1), queue="team", node=node, mean_utilization_pct=0.0, idle_gpu_seconds=40.0
    )
    idle.since.FromNanoseconds(int((now - 10.0) * 1e9))
    idle.until.FromNanoseconds(int(now * 1e9))
    async with EventProducer(stack.kafka, "//kumiki/telemetry/test") as producer:
        await producer.publish(GPU_IDLE, JOB, idle)


async def test_job_idle_past_its_queues_threshold_is_checkpointed_and_its_gpus_go_to_a_waiting_job(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    async with live_stack(kafka, database_settings, tmp_path, deadline_s=30.0, idle_reclaim="team=waiting:5") as stack:
        await bind_until_bound(stack, train_request("team/filler", 1, gpus=8))
        train_node = await bind_until_bound(stack, train_request(JOB, 1, preemptible=True))
        first = await start_attempt(stack, JOB, 1, tmp_path, steps=3000, step_s=0.02)
        await wait_until(lambda: len(first.steps()) >= 20, timeout_s=60, what="the job to run")
        waiting = train_request("team/next", 1, gpus=8)
        assert (await stack.placement.Bind(waiting)).outcome == placement_pb2.BindResponse.OUTCOME_PENDING
        assert not stack.events.preempt_decisions(JOB)  # waiting alone does not preempt it (same tier, rank)

        await report_idle(stack, train_node)

        assert await first.process.wait() == 0  # asked to checkpoint, did, exited
        assert first.steps()[-1][0] < 3000
        assert await bind_until_bound(stack, waiting) == train_node  # the waiting job got the idle GPUs
        (decision,) = stack.events.preempt_decisions(JOB)
        assert decision.preemption_reason == "idle-reclaim" and decision.beneficiary.job_id == "team/next"
        checkpoint = stack.events.command(JOB, 1, events_pb2.PREEMPTION_ACTION_CHECKPOINT)
        evict = stack.events.command(JOB, 1, events_pb2.PREEMPTION_ACTION_EVICT)
        assert checkpoint is not None and checkpoint.reason == "idle-reclaim"
        assert evict is not None and not evict.forced and evict.checkpoint_step == first.steps()[-1][0]
        # requeued as generation 2, it waits for room like any job
        assert (2, events_pb2.JOB_STATE_SUBMITTED) in stack.events.states(JOB)


async def test_a_placement_restarted_while_an_idle_victim_drains_still_counts_its_eviction_an_idle_reclaim(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    """Placement keeps why it chose a victim only while the victim drains. Restarted meanwhile, it rebuilds the
    victim as simply bound, and learns the cause from the coordinator's Release (the PREEMPT decision's reason):
    the PREEMPTED event still says idle reclaim, and the next generation still counts it."""
    async with live_stack(kafka, database_settings, tmp_path, deadline_s=8.0, idle_reclaim="team=waiting:5") as stack:
        await bind_until_bound(stack, train_request("team/filler", 1, gpus=8))
        train_node = await bind_until_bound(stack, train_request(JOB, 1, preemptible=True))
        waiting = train_request("team/next", 1, gpus=8)
        assert (await stack.placement.Bind(waiting)).outcome == placement_pb2.BindResponse.OUTCOME_PENDING
        await report_idle(stack, train_node)
        # nothing answers the CHECKPOINT (no training process): the victim drains until the 8 s deadline
        await wait_until(
            lambda: stack.events.command(JOB, 1, events_pb2.PREEMPTION_ACTION_CHECKPOINT),
            timeout_s=30,
            what="the CHECKPOINT command",
        )
        # the job it drains for goes away, so the restarted placement has no cause to decide the reclaim again
        withdrawn = placement_pb2.ReleaseRequest(job=job_ref("team/next", 0), reason="withdrawn")
        assert (await stack.placement.Release(withdrawn)).released
        await stack.restart_placement()

        def preempted() -> list[str]:
            return [
                event.reason
                for event in stack.events.lifecycle
                if event.job.job_id == JOB and event.state == events_pb2.JOB_STATE_PREEMPTED
            ]

        await wait_until(preempted, timeout_s=60, what="the forced eviction released as PREEMPTED")
        assert preempted() == ["preempted (idle-reclaim)"]
        assert len(stack.events.preempt_decisions(JOB)) == 1  # the restart did not decide it again
        explained = await stack.placement.Explain(placement_pb2.ExplainRequest(job_id=JOB))
        assert (explained.evictions, explained.idle_reclaims) == (1, 1)
