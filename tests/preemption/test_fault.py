"""The coordinator is SIGKILLed between CHECKPOINT and EVICT, and again between EVICT and RESUME: the protocol
resumes where it stood after each restart, and every job ends completed once (none twice, none lost)."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import events_pb2, placement_pb2
from tests.conftest import wait_until
from tests.preemption.support import (
    Stack,
    bind_until_bound,
    job_ref,
    live_stack,
    reference_weights,
    start_attempt,
    train_request,
)

pytestmark = pytest.mark.slow

JOB = "team/train"


async def phase(database: DatabaseSettings) -> str | None:
    connection = await asyncpg.connect(database.url)
    try:
        value: str | None = await connection.fetchval(
            "SELECT phase FROM preemption.protocols WHERE job_id = $1 AND generation = 1", JOB
        )
        return value
    except asyncpg.UndefinedTableError:
        return None
    finally:
        await connection.close()


async def complete(stack: Stack, job: str, generation: int) -> None:
    await stack.placement.Release(
        placement_pb2.ReleaseRequest(job=job_ref(job, generation), final_state=events_pb2.JOB_STATE_COMPLETED)
    )


async def test_coordinator_sigkilled_mid_protocol_twice_every_job_completes_once(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    steps, step_s = 300, 0.02
    reference = reference_weights(tmp_path, steps)
    async with live_stack(kafka, database_settings, tmp_path, deadline_s=60.0) as stack:
        coordinator = stack.coordinator
        await bind_until_bound(stack, train_request("team/filler", 1, gpus=8))
        await bind_until_bound(stack, train_request(JOB, 1, preemptible=True))
        first = await start_attempt(stack, JOB, 1, tmp_path, steps=steps, step_s=step_s, save_s=2.0)
        await wait_until(lambda: len(first.steps()) >= 40, timeout_s=60, what="the first attempt to train")
        urgent = train_request("team/urgent", 1, gpus=8, priority_tier=1)
        await stack.placement.Bind(urgent)

        # 1: CHECKPOINT delivered, the job is writing its checkpoint (2 s), no acknowledgement yet: kill. The
        # job's report waits for the restart.
        await wait_until(first.answering, timeout_s=30, interval_s=0.01, what="the job to answer CHECKPOINT")
        coordinator.kill()
        assert await phase(database_settings) == "checkpointing"  # read after the kill: nothing moved it on
        await coordinator.start()
        assert await first.process.wait() == 0  # acknowledged by the restarted coordinator, then exited
        assert first.steps()[-1][0] < steps  # it stopped for the preemption, it did not run to the end
        await wait_until(lambda: stack.events.command(JOB, 1, events_pb2.PREEMPTION_ACTION_EVICT), timeout_s=30)

        # 2: evicted and requeued, generation 2 not bound yet: kill; the bind happens while it is down.
        assert await bind_until_bound(stack, urgent)
        coordinator.kill()
        assert await phase(database_settings) in ("evicting", "requeued")  # no RESUME yet
        await complete(stack, "team/filler", 1)
        await bind_until_bound(stack, train_request(JOB, 2, preemptible=True))
        await coordinator.start()
        second = await start_attempt(stack, JOB, 2, tmp_path, steps=steps, step_s=0.0)
        assert await second.process.wait() == 0  # its resume point came from the restarted coordinator
        await complete(stack, JOB, 2)
        await complete(stack, "team/urgent", 1)
        assert (tmp_path / "weights.npy").read_bytes() == reference

        events = stack.events
        await wait_until(lambda: events.command(JOB, 2, events_pb2.PREEMPTION_ACTION_RESUME), timeout_s=30)
        assert await phase(database_settings) == "resumed"
        await wait_until(
            lambda: sum(e.state == events_pb2.JOB_STATE_COMPLETED for e in events.lifecycle) >= 3, timeout_s=30
        )
        completed = [e.job.job_id for e in events.lifecycle if e.state == events_pb2.JOB_STATE_COMPLETED]
        assert sorted(completed) == ["team/filler", "team/train", "team/urgent"]  # each once
        preempted = [e for e in events.lifecycle if e.state == events_pb2.JOB_STATE_PREEMPTED]
        assert [(e.job.job_id, e.job.generation) for e in preempted] == [(JOB, 1)]  # evicted once
        ids = {(c.action, c.command_id) for c in events.commands}  # a command re-sent after a crash keeps its id
        assert sorted(action for action, _ in ids) == [
            events_pb2.PREEMPTION_ACTION_CHECKPOINT,
            events_pb2.PREEMPTION_ACTION_EVICT,
            events_pb2.PREEMPTION_ACTION_RESUME,
        ]
