"""The coordinator reading a decision before the BOUND event of its attempt (decisions and lifecycle are separate
topics, consumed independently: the live replay's "attempt never bound; ignored"). The real coordinator process
over Apache Kafka and Postgres; the events are published as quota and placement publish them, in the order
that used to lose the preemption."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import grpc
import pytest

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import CHECKPOINTS, JOB_LIFECYCLE, SCHEDULING_DECISIONS
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc, common_pb2, events_pb2
from kumiki.common.grpcutil import timestamp
from tests.conftest import read_records, wait_until
from tests.preemption.support import Coordinator, Events, follow

pytestmark = pytest.mark.slow

CHECKPOINT = events_pb2.PREEMPTION_ACTION_CHECKPOINT


def reclaim(job: str, decision_id: str) -> events_pb2.SchedulingDecision:
    """Quota's RECLAIM: it names the job only (quota.adapters.convert.reclaim_event)."""
    return events_pb2.SchedulingDecision(
        decision_id=decision_id,
        kind=events_pb2.DECISION_KIND_RECLAIM,
        job=common_pb2.JobRef(job_id=job, generation=1),
        queue="batch",
        beneficiary=common_pb2.JobRef(job_id="team/owner", generation=1),
        policy="kumiki-quota",
        at=timestamp(),
    )


def bound(job: str, node: str) -> events_pb2.JobLifecycle:
    return events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=job, generation=1),
        state=events_pb2.JOB_STATE_BOUND,
        at=timestamp(),
        queue="batch",
        assignments=[common_pb2.PodAssignment(pod_index=0, node=node, gpu_indices=[0, 1, 2, 3])],
    )


async def test_a_reclaim_read_before_its_attempts_bind_is_held_durably_and_begins_when_the_bind_is_seen(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    coordinator = Coordinator(kafka, database_settings, "127.0.0.1:1", 600.0, tmp_path / "preemption.log")
    coordinator.env["KUMIKI_PREEMPTION_HOLD_S"] = "120"  # longer than a restart
    events, stopping = Events(), asyncio.Event()
    follower: asyncio.Task[None] | None = None
    pool = await asyncpg.create_pool(database_settings.url, min_size=1, max_size=2)
    try:
        await coordinator.start()
        follower = asyncio.create_task(follow(kafka, events, stopping))  # the topics exist now
        async with EventProducer(kafka, "//kumiki/quota/test") as producer:
            # the decision first, its attempt's BOUND not yet published: it must be held, not ignored
            await producer.publish(SCHEDULING_DECISIONS, "batch/early", reclaim("batch/early", "d-early"))

            async def held() -> object:
                return (
                    await pool.fetchval("SELECT count(*) FROM preemption.held_decisions WHERE job_id = 'batch/early'")
                    or None
                )

            await wait_until(held, timeout_s=60, what="the early decision held")
            coordinator.kill()  # durably: a SIGKILL between the decision and the bind loses nothing
            await coordinator.start()
            await producer.publish(JOB_LIFECYCLE, "batch/early", bound("batch/early", "node-a"))
            checkpoint = await wait_until(
                lambda: events.command("batch/early", 1, CHECKPOINT), timeout_s=60, what="CHECKPOINT after the bind"
            )
            assert checkpoint.reason == "quota-reclaim" and checkpoint.beneficiary.job_id == "team/owner"
            assert checkpoint.gpus == 4.0  # completed from the BOUND event that came later
            assert await pool.fetchval("SELECT count(*) FROM preemption.held_decisions") == 0

            # a decision whose bind never comes is dropped at the hold deadline, and begins nothing
            coordinator.stop()
            coordinator.env["KUMIKI_PREEMPTION_HOLD_S"] = "2"
            await coordinator.start()
            await producer.publish(SCHEDULING_DECISIONS, "batch/never", reclaim("batch/never", "d-never"))
            await wait_until(
                lambda: pool.fetchval("SELECT count(*) FROM preemption.held_decisions WHERE job_id = 'batch/never'"),
                timeout_s=60,
                what="the unbound decision held",
            )
            held_at = time.time()

            async def dropped() -> bool:
                return await pool.fetchval("SELECT count(*) FROM preemption.held_decisions") == 0

            await wait_until(dropped, timeout_s=60, what="the unbound decision dropped")
            assert time.time() - held_at >= 1.0  # it waited for its bind first
            assert await pool.fetchval("SELECT count(*) FROM preemption.protocols WHERE job_id = 'batch/never'") == 0

            # a decision read after its attempt ended is ignored at once, never held
            await producer.publish(JOB_LIFECYCLE, "batch/late", bound("batch/late", "node-b"))
            ended = bound("batch/late", "node-b")
            ended.state = events_pb2.JOB_STATE_COMPLETED
            await producer.publish(JOB_LIFECYCLE, "batch/late", ended)
            await wait_until(
                lambda: pool.fetchval(
                    "SELECT ended_unix_s IS NOT NULL FROM preemption.attempts WHERE job_id = 'batch/late'"
                ),
                timeout_s=60,
                what="the attempt's end recorded",
            )
            await producer.publish(SCHEDULING_DECISIONS, "batch/late", reclaim("batch/late", "d-late"))
            # same key, same partition: consumed after it
            await producer.publish(SCHEDULING_DECISIONS, "batch/late", reclaim("batch/marker", "d-marker"))
            await wait_until(
                lambda: pool.fetchval("SELECT count(*) FROM preemption.held_decisions WHERE job_id = 'batch/marker'"),
                timeout_s=60,
                what="the decision after it consumed",
            )
            late = "SELECT count(*) FROM preemption.{} WHERE job_id = 'batch/late'"
            assert await pool.fetchval(late.format("held_decisions")) == 0
            assert await pool.fetchval(late.format("protocols")) == 0
        assert [c.job.job_id for c in events.commands if c.action == CHECKPOINT] == ["batch/early"]
    finally:
        stopping.set()
        if follower is not None:
            await follower
        coordinator.stop()
        await pool.close()


async def test_an_accepted_reports_checkpoint_event_carries_its_total_steps(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path
) -> None:
    """The forecast service re-forecasts a running job from step / total_steps on kumiki.checkpoints."""
    coordinator = Coordinator(kafka, database_settings, "127.0.0.1:1", 600.0, tmp_path / "preemption.log")
    try:
        await coordinator.start()
        async with grpc.aio.insecure_channel(coordinator.address) as channel:
            stub = checkpoints_pb2_grpc.CheckpointsStub(channel)
            sent = checkpoints_pb2.CheckpointReport(
                job=common_pb2.JobRef(job_id="batch/train", generation=1),
                uri="s3://ckpt/300",
                step=300,
                total_steps=1200,
                completed_at=timestamp(),
            )
            assert (await stub.Report(sent)).recorded
        [record] = await read_records(kafka, CHECKPOINTS.full_name(kafka.topic_prefix), 1)
        published = checkpoints_pb2.CheckpointReport.FromString(record.value)
        assert (published.job.job_id, published.step, published.total_steps) == ("batch/train", 300, 1200)
    finally:
        coordinator.stop()
