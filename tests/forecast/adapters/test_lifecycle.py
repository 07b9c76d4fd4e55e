"""job.lifecycle → the forecast service over Apache Kafka and Postgres, across preemptions and a restart: a
preempted attempt is a stop, not an ending (its run time is not learned as the job's), the generation queued
again keeps the forecast it has, a job bound at once is forecast at its bind, and a restarted service knows the
jobs still open (their progress reports are heard; their ending learns the whole run time)."""

from __future__ import annotations

import time

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import CHECKPOINTS, JOB_FORECAST, JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import checkpoints_pb2, common_pb2, events_pb2
from kumiki.forecast.models.progress import PROGRESS_MODEL
from tests.conftest import read_records, wait_until
from tests.forecast.adapters.support import forecast_service, forecasts, lifecycle

pytestmark = pytest.mark.slow

JOB = "team/pretrain"
AT_ONCE = "team/eval"


async def records_in(kafka: KafkaSettings, topic: str) -> int:
    """How many records the topic holds (its producers are idempotent, not transactional: offsets count records)."""
    consumer = AIOKafkaConsumer(topic, **kafka.client_options(), enable_auto_commit=False, group_id=None)
    await consumer.start()  # subscribed: it reads the topic's metadata
    try:
        partitions = [TopicPartition(topic, partition) for partition in consumer.partitions_for_topic(topic) or ()]
        assert partitions, f"{topic} has no partitions"
        ends = await consumer.end_offsets(partitions)
        return sum(ends.values())
    finally:
        await consumer.stop()


async def test_a_job_is_followed_across_its_preemptions_and_a_restart(
    kafka: KafkaSettings, database_settings: DatabaseSettings
) -> None:
    forecast_topic = JOB_FORECAST.full_name(kafka.topic_prefix)
    t0 = int(time.time()) - 7200  # whole seconds: run times are exact
    async with EventProducer(kafka, "//kumiki/placement/test") as producer:
        async with forecast_service(kafka, database_settings, "f-1"):
            for message in (
                lifecycle(JOB, events_pb2.JOB_STATE_SUBMITTED, t0 - 60),
                lifecycle(JOB, events_pb2.JOB_STATE_BOUND, t0),
                # evicted after 600 s, the last 100 s unsaved (800 GPU-s on 8 GPUs): 500 s of work kept
                lifecycle(JOB, events_pb2.JOB_STATE_PREEMPTED, t0 + 600, runtime_s=600.0),
                lifecycle(JOB, events_pb2.JOB_STATE_SUBMITTED, t0 - 60, generation=2),
                lifecycle(JOB, events_pb2.JOB_STATE_BOUND, t0 + 1000, generation=2),
                lifecycle(AT_ONCE, events_pb2.JOB_STATE_BOUND, t0),
            ):
                if message.state == events_pb2.JOB_STATE_PREEMPTED:
                    message.lost_gpu_seconds = 800.0
                await producer.publish(JOB_LIFECYCLE, message.job.job_id, message)
            # on JOB's partition after its events: its forecast tells they were all consumed (no sleep, no race)
            await producer.publish(JOB_LIFECYCLE, JOB, lifecycle("team/marker", events_pb2.JOB_STATE_SUBMITTED, t0))
            first = forecasts(await read_records(kafka, forecast_topic, 3))
            assert sorted((f.job.job_id, f.job.generation) for f in first) == [
                (AT_ONCE, 1),  # bound at once, never queued: forecast at its bind
                ("team/marker", 1),
                (JOB, 1),
            ]
        assert await records_in(kafka, forecast_topic) == 3, "generation 2 queued again: no new forecast"

        # a new instance: the job is open again, running since generation 2's bind with 500 s of work banked
        async with forecast_service(kafka, database_settings, "f-2") as host:
            report = checkpoints_pb2.CheckpointReport(
                job=common_pb2.JobRef(job_id=JOB, generation=2), uri="s3://ckpt/3", step=1, total_steps=2
            )
            report.completed_at.seconds = t0 + 1600  # 500 s before, 600 s since the restart: 1,100 s, half done
            await producer.publish(CHECKPOINTS, JOB, report)
            records = await read_records(kafka, forecast_topic, 4)
            [progressed] = [forecast for forecast in forecasts(records) if forecast.model == PROGRESS_MODEL]
            assert progressed.job.job_id == JOB and progressed.p50_s == pytest.approx(2200.0, rel=1e-9)
            await producer.publish(
                JOB_LIFECYCLE,
                JOB,
                lifecycle(JOB, events_pb2.JOB_STATE_COMPLETED, t0 + 1900, generation=2, runtime_s=900.0),
            )
            pool = host.runtime.pool  # type: ignore[union-attr]
            assert isinstance(pool, asyncpg.Pool)

            async def rows() -> list[asyncpg.Record]:
                found = await pool.fetch(
                    "SELECT generation, final_state, runtime_s, attempt_s, lost_s, started_at, p50_s"
                    " FROM forecast.job_history WHERE job_id = $1 ORDER BY generation",
                    JOB,
                )
                return found if found and found[-1]["final_state"] == "completed" else []

            first_attempt, last_attempt = await wait_until(rows, what="the job's ending in the history")
    assert (first_attempt["final_state"], first_attempt["runtime_s"]) == ("preempted", None), "an attempt: not learned"
    assert (first_attempt["attempt_s"], first_attempt["lost_s"]) == (600.0, 100.0)
    assert last_attempt["runtime_s"] == 1400.0, "the whole job: 500 s kept + 900 s of its last attempt"
    assert last_attempt["attempt_s"] == 900.0
    assert last_attempt["started_at"].timestamp() == t0 + 1000
    assert first_attempt["p50_s"] == last_attempt["p50_s"], "every generation keeps the forecast it was given"
