"""Defragmentation end to end across the live services (placement with the `kumiki-defrag` policy, the coordinator
as a process, Apache Kafka, Postgres) and a real training process through the SDK.

Two 8-GPU nodes, each with 4 GPUs free: 8 free in all, none together. A job that needs a whole node arrives:
the scheduling pass moves the small training job (checkpointed a moment ago, so it loses almost nothing) off
its node, since the gang's expected wait outweighs that. The training job checkpoints, is evicted, restarts at
once on the other node's free GPUs (ahead of the queue order: it was moved, not stopped) and ends bitwise equal
to an uninterrupted run; the gang gets the freed node whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import events_pb2, placement_pb2
from tests.conftest import wait_until
from tests.preemption.support import (
    bind_until_bound,
    job_ref,
    live_stack,
    reference_weights,
    start_attempt,
    train_request,
)

pytestmark = pytest.mark.slow

JOB = "team/small"
PENDING = placement_pb2.BindResponse.OUTCOME_PENDING
CHECKPOINT = events_pb2.PREEMPTION_ACTION_CHECKPOINT
EVICT = events_pb2.PREEMPTION_ACTION_EVICT
RESUME = events_pb2.PREEMPTION_ACTION_RESUME


async def test_a_gang_blocked_by_fragmentation_gets_its_node_after_a_small_job_is_checkpointed_and_moved(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    steps, step_s = 300, 0.02
    reference = reference_weights(tmp_path, steps)
    async with live_stack(kafka, database_settings, tmp_path, deadline_s=30.0, policy="kumiki-defrag") as stack:
        # fragment the cluster: two 4-GPU jobs per node, then one of each pair ends
        small = await bind_until_bound(stack, train_request(JOB, 1, preemptible=True))
        assert await bind_until_bound(stack, train_request("team/mate", 1)) == small  # packed beside it
        other = await bind_until_bound(stack, train_request("team/filler", 1))  # not preemptible
        assert other != small
        assert await bind_until_bound(stack, train_request("team/mate2", 1)) == other
        for done in ("team/mate", "team/mate2"):
            await stack.placement.Release(
                placement_pb2.ReleaseRequest(job=job_ref(done, 1), final_state=events_pb2.JOB_STATE_COMPLETED)
            )

        first = await start_attempt(stack, JOB, 1, tmp_path, steps=steps, step_s=step_s)
        await wait_until(lambda: len(first.steps()) >= 40, timeout_s=60, what="the small job to train")
        gang = train_request("team/gang", 1, gpus=8)
        answer = await stack.placement.Bind(gang)
        assert answer.outcome == PENDING and answer.reasons[0].resource == "preemption", answer.reasons

        assert await first.process.wait() == 0  # it checkpointed when asked and exited
        stopped_at = first.steps()[-1][0]
        assert stopped_at < steps
        assert await bind_until_bound(stack, gang) == small  # the gang has the freed node whole
        # the moved job was bound again at once, on the other node's free GPUs, without another Bind waiting
        events = stack.events
        await wait_until(
            lambda: (2, events_pb2.JOB_STATE_BOUND) in events.states(JOB), timeout_s=30, what="generation 2 bound"
        )
        assert await bind_until_bound(stack, train_request(JOB, 2, preemptible=True)) == other
        second = await start_attempt(stack, JOB, 2, tmp_path, steps=steps, step_s=step_s)
        assert await second.process.wait() == 0
        assert second.steps()[0][0] == stopped_at + 1  # resumed exactly where it stopped
        assert (tmp_path / "weights.npy").read_bytes() == reference  # bitwise equal to the uninterrupted run

        (decision,) = events.preempt_decisions(JOB)
        assert decision.preemption_reason == "defragmentation" and decision.beneficiary.job_id == "team/gang"
        assert not events.preempt_decisions("team/filler")  # not preemptible: never moved
        await wait_until(lambda: events.command(JOB, 2, RESUME), timeout_s=30, what="RESUME of generation 2")
        checkpoint, evict = events.command(JOB, 1, CHECKPOINT), events.command(JOB, 1, EVICT)
        resume = events.command(JOB, 2, RESUME)
        assert checkpoint is not None and checkpoint.reason == "defragmentation"
        assert evict is not None and not evict.forced and evict.checkpoint_step == stopped_at
        assert resume is not None and resume.checkpoint_step == stopped_at
        preempted = next(e for e in events.lifecycle if e.state == events_pb2.JOB_STATE_PREEMPTED)
        assert 0 <= preempted.lost_gpu_seconds < 4 * 2.0  # it stopped at the checkpoint: almost nothing lost
