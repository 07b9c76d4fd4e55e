"""kumiki.checkpoints → job.forecast through the real forecast service over Apache Kafka and Postgres: a running job's
report of step of total_steps gives it a new forecast, its run so far over the fraction done; a report that does
not say how far the job has got gives none, and a malformed one is dead-lettered without stopping the consumer."""

from __future__ import annotations

import time

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client import REGISTRY

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import CHECKPOINTS, DEAD_LETTER, JOB_FORECAST, JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import checkpoints_pb2, common_pb2, events_pb2
from kumiki.forecast.models.progress import PROGRESS_MODEL
from tests.conftest import read_records
from tests.forecast.adapters.support import forecast_service, forecasts, lifecycle

pytestmark = pytest.mark.slow

JOB = "team/train"


def report(step: int, total_steps: int, completed_s: int | None, job_id: str = JOB) -> checkpoints_pb2.CheckpointReport:
    message = checkpoints_pb2.CheckpointReport(
        job=common_pb2.JobRef(job_id=job_id, generation=1), uri=f"s3://ckpt/{step}", step=step, total_steps=total_steps
    )
    if completed_s is not None:
        message.completed_at.seconds = completed_s
    return message


def progress_forecasts_counted() -> float:
    return REGISTRY.get_sample_value("kumiki_forecast_progress_forecasts_total", {"model": PROGRESS_MODEL}) or 0.0


async def test_a_running_jobs_progress_report_publishes_its_new_forecast(
    kafka: KafkaSettings, database_settings: DatabaseSettings
) -> None:
    forecast_topic = JOB_FORECAST.full_name(kafka.topic_prefix)
    bound_s = int(time.time()) - 3600  # whole seconds: the run so far is exact
    counted_before = progress_forecasts_counted()
    async with forecast_service(kafka, database_settings):
        async with EventProducer(kafka, "//kumiki/placement/test") as producer:
            await producer.publish(JOB_LIFECYCLE, JOB, lifecycle(JOB, events_pb2.JOB_STATE_SUBMITTED, bound_s - 60))
            await producer.publish(JOB_LIFECYCLE, JOB, lifecycle(JOB, events_pb2.JOB_STATE_BOUND, bound_s))
            # same key, same partition: its forecast tells the BOUND before it was consumed (no sleep, no race)
            marker = lifecycle("team/marker", events_pb2.JOB_STATE_SUBMITTED, bound_s)
            await producer.publish(JOB_LIFECYCLE, JOB, marker)
            submitted = forecasts(await read_records(kafka, forecast_topic, 2))
            assert sorted(forecast.job.job_id for forecast in submitted) == ["team/marker", JOB]

            # in one partition, in order: one that does not say how far, one malformed, one that does
            await producer.publish(CHECKPOINTS, JOB, report(300, 0, bound_s + 600))
            await producer.publish(CHECKPOINTS, JOB, report(300, 1200, None))
            await producer.publish(CHECKPOINTS, JOB, report(300, 1200, bound_s + 600))
            # any forecast from the first two would come before the third's on the job's partition
            published = forecasts(await read_records(kafka, forecast_topic, 3))
        ours = [forecast for forecast in published if forecast.job.job_id == JOB]
        assert len(ours) == 2 and ours[0].model != PROGRESS_MODEL
        progressed = ours[1]
        assert (progressed.model, progressed.job.generation) == (PROGRESS_MODEL, 1)
        # 600 s since the bind, a quarter of the steps done: 2400 s in all (whole-second times: float rounding only)
        assert progressed.p50_s == pytest.approx(2400.0, rel=1e-9)
        assert progressed.p90_s > progressed.p50_s and progressed.HasField("error_sigma")
        [dead] = await read_records(kafka, DEAD_LETTER.full_name(kafka.topic_prefix), 1)
        assert dict(dead.headers)["kumiki_dlq_reason"].decode().startswith("rejected: completed_at: required")
        assert progress_forecasts_counted() == counted_before + 1


async def test_a_report_read_before_its_jobs_bind_is_applied_when_the_bind_is_read(
    kafka: KafkaSettings, database_settings: DatabaseSettings
) -> None:
    """The checkpoints and the lifecycle are read by two consumers: a report can overtake the BOUND it follows."""
    forecast_topic = JOB_FORECAST.full_name(kafka.topic_prefix)
    bound_s = int(time.time()) - 3600
    early, marker = "team/early", "team/marker"
    async with forecast_service(kafka, database_settings):
        async with EventProducer(kafka, "//kumiki/placement/test") as producer:
            await producer.publish(JOB_LIFECYCLE, marker, lifecycle(marker, events_pb2.JOB_STATE_BOUND, bound_s))
            await read_records(kafka, forecast_topic, 1)  # the marker, bound at once, is forecast
            for job_id, step, total in ((early, 1, 4), (marker, 1, 2)):  # one partition (one key), in this order
                await producer.publish(CHECKPOINTS, early, report(step, total, bound_s + 600, job_id))
            # the marker's progress forecast says the early report before it was read, and found no bind
            await read_records(kafka, forecast_topic, 2)
            await producer.publish(JOB_LIFECYCLE, early, lifecycle(early, events_pb2.JOB_STATE_BOUND, bound_s))

            def early_forecast(records: list[ConsumerRecord]) -> bool:
                return any(forecast.job.job_id == early for forecast in forecasts(records))

            published = forecasts(await read_records(kafka, forecast_topic, 3, until=early_forecast))
        [applied] = [forecast for forecast in published if forecast.job.job_id == early]
        assert applied.model == PROGRESS_MODEL, "the report, applied at the bind, supersedes the opening forecast"
        assert applied.p50_s == pytest.approx(2400.0, rel=1e-9)  # 600 s since the bind, a quarter done
