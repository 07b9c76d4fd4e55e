"""Preemption end to end across the live services (placement with the `kumiki` policy, the coordinator as a
process, Apache Kafka, Postgres) and a real training process through the SDK (deterministic numpy loop).

A low-priority job is preempted by a higher-priority one, checkpoints within the deadline, is evicted, resumes
on another node, and ends with the same bytes as a run that was never interrupted. A job that ignores the
command is evicted at the deadline and loses exactly the work since its last periodic checkpoint.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import events_pb2, placement_pb2
from tests.conftest import wait_until
from tests.preemption.support import (
    Stack,
    bind_until_bound,
    job_ref,
    live_stack,
    quota_ledger,
    reference_weights,
    start_attempt,
    train_request,
)

pytestmark = pytest.mark.slow

JOB = "team/train"
PENDING = placement_pb2.BindResponse.OUTCOME_PENDING
CHECKPOINT = events_pb2.PREEMPTION_ACTION_CHECKPOINT
EVICT = events_pb2.PREEMPTION_ACTION_EVICT
RESUME = events_pb2.PREEMPTION_ACTION_RESUME


def seconds(stamp: object) -> float:
    return stamp.seconds + stamp.nanos / 1e9  # type: ignore[attr-defined,no-any-return]


async def preempt_with_urgent_job(stack: Stack) -> placement_pb2.BindRequest:
    """A tier-1 job that needs a whole node: only the training job's node can be freed (the filler is not
    preemptible), so the pass names the training job as its victim and the urgent job waits nominated."""
    urgent = train_request("team/urgent", 1, gpus=8, priority_tier=1)
    answer = await stack.placement.Bind(urgent)
    assert answer.outcome == PENDING
    assert "preempted" in answer.reasons[0].message, answer.reasons
    return urgent


async def resume_elsewhere(stack: Stack, tmp: Path, urgent: placement_pb2.BindRequest, nodes: dict[str, str]) -> str:
    """The urgent job gets the victim's node; the next generation waits until the filler ends, then binds on
    the filler's node (another node), and its attempt runs to the end."""
    assert await bind_until_bound(stack, urgent) == nodes["train"]
    again = train_request(JOB, 2, preemptible=True)
    answer = await stack.placement.Bind(again)
    assert answer.outcome == PENDING  # nothing is free, and nothing it may preempt
    await stack.placement.Release(
        placement_pb2.ReleaseRequest(job=job_ref("team/filler", 1), final_state=events_pb2.JOB_STATE_COMPLETED)
    )
    node = await bind_until_bound(stack, again)
    assert node == nodes["filler"] != nodes["train"]
    return node


async def start_two_jobs(stack: Stack) -> dict[str, str]:
    filler = await bind_until_bound(stack, train_request("team/filler", 1, gpus=8))
    train = await bind_until_bound(stack, train_request(JOB, 1, preemptible=True))
    assert filler != train
    return {"filler": filler, "train": train}


async def test_preempted_job_checkpoints_is_evicted_and_resumes_elsewhere_bitwise_equal(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    steps, step_s, deadline_s = 300, 0.02, 30.0
    reference = reference_weights(tmp_path, steps)
    async with live_stack(kafka, database_settings, tmp_path, deadline_s=deadline_s) as stack:
        nodes = await start_two_jobs(stack)
        first = await start_attempt(stack, JOB, 1, tmp_path, steps=steps, step_s=step_s)
        await wait_until(lambda: len(first.steps()) >= 40, timeout_s=60, what="the first attempt to train")
        urgent = await preempt_with_urgent_job(stack)

        assert await first.process.wait() == 0  # it checkpointed when asked and exited
        stopped_at = first.steps()[-1][0]
        assert stopped_at < steps
        await resume_elsewhere(stack, tmp_path, urgent, nodes)
        second = await start_attempt(stack, JOB, 2, tmp_path, steps=steps, step_s=step_s)
        assert await second.process.wait() == 0
        assert (tmp_path / "weights.npy").read_bytes() == reference  # bitwise equal to the uninterrupted run
        assert second.steps()[0][0] == stopped_at + 1  # resumed exactly where it stopped

        events = stack.events
        await wait_until(lambda: events.command(JOB, 2, RESUME), timeout_s=30, what="RESUME of generation 2")
        checkpoint, evict = events.command(JOB, 1, CHECKPOINT), events.command(JOB, 1, EVICT)
        resume = events.command(JOB, 2, RESUME)
        assert checkpoint is not None and evict is not None and resume is not None
        assert checkpoint.reason == "priority" and checkpoint.beneficiary.job_id == "team/urgent"
        assert not evict.forced and evict.checkpoint_step == stopped_at
        assert seconds(evict.issued_at) - seconds(checkpoint.issued_at) < deadline_s
        assert [pod.node for pod in evict.assignments] == [nodes["train"]]
        assert (resume.checkpoint_uri, resume.checkpoint_step) == (evict.checkpoint_uri, stopped_at)
        states = events.states(JOB)
        assert (1, events_pb2.JOB_STATE_PREEMPTED) in states and (2, events_pb2.JOB_STATE_SUBMITTED) in states
        preempted = next(e for e in events.lifecycle if e.state == events_pb2.JOB_STATE_PREEMPTED)
        assert preempted.lost_gpu_seconds == pytest.approx(evict.lost_gpu_seconds)
        assert 0 <= preempted.lost_gpu_seconds < 4 * 2.0  # it stopped at the checkpoint: almost nothing lost


async def test_job_ignoring_the_command_is_evicted_at_the_deadline_losing_the_work_since_its_last_checkpoint(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    steps, step_s, deadline_s, interval_s = 80, 0.2, 2.0, 0.5
    reference = reference_weights(tmp_path, steps)
    async with live_stack(kafka, database_settings, tmp_path, deadline_s=deadline_s) as stack:
        nodes = await start_two_jobs(stack)
        first = await start_attempt(
            stack, JOB, 1, tmp_path, steps=steps, step_s=step_s, interval_s=interval_s, ignore=True, max_checkpoints=2
        )
        checkpoints = tmp_path / "checkpoints"
        await wait_until(lambda: len(list(checkpoints.glob("*.npz"))) == 2, timeout_s=60, what="2 checkpoints")
        await preempt_with_urgent_job(stack)
        events = stack.events
        evict = await wait_until(lambda: events.command(JOB, 1, EVICT), timeout_s=30, what="EVICT at the deadline")
        first.process.send_signal(signal.SIGKILL)  # what the binder's eviction does to a pod that will not stop
        await first.process.wait()

        checkpoint = events.command(JOB, 1, CHECKPOINT)
        assert checkpoint is not None and evict.forced
        assert seconds(evict.issued_at) - seconds(checkpoint.issued_at) >= deadline_s
        progress = dict(first.steps())
        last_saved = max(int(path.stem.removeprefix("step-")) for path in checkpoints.glob("*.npz"))
        assert evict.checkpoint_step == last_saved
        # The work lost is the training done after the checkpoint was written (writing it, with its fsyncs, is
        # not training), up to the eviction. The job's own record: training resumed one step before the first
        # step after the checkpoint ended.
        lost_s = evict.lost_gpu_seconds / 4
        times = sorted(progress.values())
        one_step_s = sorted(b - a for a, b in itertools.pairwise(times))[len(times) // 2]
        trained_after_s = seconds(evict.issued_at) - (progress[last_saved + 1] - one_step_s)
        assert abs(lost_s - trained_after_s) <= one_step_s, (lost_s, trained_after_s, one_step_s)
        await wait_until(
            lambda: (1, events_pb2.JOB_STATE_PREEMPTED) in events.states(JOB), timeout_s=30, what="PREEMPTED"
        )
        preempted = next(e for e in events.lifecycle if e.state == events_pb2.JOB_STATE_PREEMPTED)
        assert preempted.lost_gpu_seconds == pytest.approx(evict.lost_gpu_seconds)
        async with quota_ledger(kafka, database_settings) as ledger:  # quota's ledger books it as lost work

            async def booked() -> object:
                return await ledger.fetchrow("SELECT * FROM quota.lost_work WHERE job_id = $1", JOB)

            row = await wait_until(booked, timeout_s=30, what="lost work in the quota ledger")
        assert (row["generation"], row["queue"]) == (1, "team")  # type: ignore[index]
        assert float(row["lost_gpu_seconds"]) == pytest.approx(evict.lost_gpu_seconds)  # type: ignore[index]

        # it resumes from its last periodic checkpoint and still ends with the reference's bytes
        urgent = train_request("team/urgent", 1, gpus=8, priority_tier=1)
        await resume_elsewhere(stack, tmp_path, urgent, nodes)
        second = await start_attempt(stack, JOB, 2, tmp_path, steps=steps, step_s=0.0)
        assert await second.process.wait() == 0
        assert second.steps()[0][0] == last_saved + 1
        assert (tmp_path / "weights.npy").read_bytes() == reference
