"""job.lifecycle → job history (Postgres, exactly once) and job.forecast (compacted)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg
from prometheus_client import Counter, Gauge

from kumiki.common.bus import Event, EventProducer, EventRejected
from kumiki.common.bus.topics import JOB_FORECAST
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.grpcutil import InvalidRequest, job_feature_fields, timestamp, unix_seconds
from kumiki.forecast.core import ACCURACY_WINDOW, Accuracy, FinishedJob, ForecastBook
from kumiki.forecast.demand import Arrival
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast

ABS_LOG_ERROR = Gauge(
    "kumiki_forecast_abs_log_error",
    f"Mean |log(actual / p50)| over each model's last {ACCURACY_WINDOW} job endings (0.69: off by 2x)",
    ["model"],
)
P90_COVERAGE = Gauge(
    "kumiki_forecast_p90_coverage_ratio",
    f"Share of each model's last {ACCURACY_WINDOW} job endings that ran no longer than their p90 (target 0.9)",
    ["model"],
)
SCORED = Counter("kumiki_forecast_scored_total", "Job endings scored against their forecast", ["model"])


def record_accuracy(accuracy: Accuracy) -> None:
    ABS_LOG_ERROR.labels(accuracy.model).set(accuracy.mean_abs_log_error)
    P90_COVERAGE.labels(accuracy.model).set(accuracy.p90_coverage)
    SCORED.labels(accuracy.model).inc()


FINAL_STATES = {
    events_pb2.JOB_STATE_COMPLETED: "completed",
    events_pb2.JOB_STATE_FAILED: "failed",
    events_pb2.JOB_STATE_PREEMPTED: "preempted",
}


def features_of(message: events_pb2.JobLifecycle) -> JobFeatures:
    """The job's features as the event carries them; a feature that is not usable rejects the event (dead letter,
    naming the field) rather than failing the handler again and again."""
    try:
        image, command, time_limit_s = job_feature_fields(message)
    except InvalidRequest as error:
        raise EventRejected(str(error)) from None
    return JobFeatures(
        job_id=message.job.job_id,
        queue=message.queue,
        user=message.user,
        gpus=message.gpus,
        name=message.name,
        submit_s=unix_seconds(message.at),
        image=image,
        command=command,
        time_limit_s=time_limit_s,
    )


def _identity(features: JobFeatures, generation: int) -> tuple[str, int, str, str, str, float, str, str, float | None]:
    """The job_history columns every lifecycle row starts with."""
    return (
        features.job_id,
        generation,
        features.queue,
        features.user,
        features.name,
        features.gpus,
        features.image,
        features.command,
        features.time_limit_s,
    )


async def publish_forecast(producer: EventProducer, job: common_pb2.JobRef, forecast: RuntimeForecast) -> None:
    """A job's forecast on job.forecast (compacted by job: placement keeps the newest), at submit or from progress."""
    await producer.publish(
        JOB_FORECAST,
        job.job_id,
        events_pb2.RuntimeForecast(
            job=common_pb2.JobRef(job_id=job.job_id, generation=job.generation),
            p50_s=forecast.p50_s,
            p90_s=forecast.p90_s,
            model=forecast.model,
            model_version=forecast.model_version,
            at=timestamp(),
            log_sigma=forecast.log_sigma,
            error_sigma=forecast.error_sigma,
        ),
    )


class LifecycleHandler:
    def __init__(self, book: ForecastBook, producer: EventProducer) -> None:
        self.book = book
        self.producer = producer

    async def __call__(self, event: Event, connection: asyncpg.Connection | None) -> None:
        assert connection is not None, "the forecast service consumes job.lifecycle exactly once"
        message = event.payload
        assert isinstance(message, events_pb2.JobLifecycle)
        at = message.at.ToDatetime(tzinfo=UTC) if message.HasField("at") else datetime.now(UTC)
        if message.state == events_pb2.JOB_STATE_SUBMITTED:
            features = features_of(message)
            forecast = self.book.submitted(features)
            await connection.execute(
                "INSERT INTO forecast.job_history (job_id, generation, queue, user_name, name, gpus, image, command,"
                " time_limit_s, submitted_at, p50_s, p90_s, model) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)"
                " ON CONFLICT DO NOTHING",
                *_identity(features, message.job.generation),
                at,
                forecast.p50_s,
                forecast.p90_s,
                forecast.model,
            )
            await publish_forecast(self.producer, message.job, forecast)
        elif message.state in (events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_RUNNING):
            self.book.started(message.job.job_id, at.timestamp())
        elif message.state == events_pb2.JOB_STATE_RELEASED:
            self.book.released(message.job.job_id, at.timestamp())
        elif message.state in FINAL_STATES:
            # a job first seen at its end (bound at once, never queued): it started at least its run time ago
            started = at - timedelta(seconds=max(0.0, message.runtime_s))
            fallback = replace(features_of(message), submit_s=started.timestamp())
            learned = self.book.finished(message.job.job_id, message.runtime_s, at.timestamp(), fallback)
            if self.book.last_accuracy is not None:
                record_accuracy(self.book.last_accuracy)
            await connection.execute(
                "INSERT INTO forecast.job_history (job_id, generation, queue, user_name, name, gpus, image, command,"
                " time_limit_s, submitted_at, finished_at, final_state, runtime_s)"
                " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)"
                " ON CONFLICT (job_id, generation) DO UPDATE SET finished_at = EXCLUDED.finished_at,"
                " final_state = EXCLUDED.final_state, runtime_s = EXCLUDED.runtime_s",
                *_identity(fallback, message.job.generation),
                started,
                at,
                FINAL_STATES[message.state],
                message.runtime_s if learned else None,
            )


async def load_history(pool: asyncpg.Pool, limit: int = 200_000) -> list[FinishedJob]:
    rows = await pool.fetch(
        "SELECT job_id, queue, user_name, name, gpus, image, command, time_limit_s, submitted_at, finished_at,"
        " runtime_s FROM forecast.job_history WHERE runtime_s IS NOT NULL ORDER BY finished_at DESC LIMIT $1",
        limit,
    )
    return [
        FinishedJob(
            JobFeatures(
                row["job_id"],
                row["queue"],
                row["user_name"],
                row["gpus"],
                row["name"],
                row["submitted_at"].timestamp(),
                row["image"],
                row["command"],
                row["time_limit_s"],
            ),
            row["runtime_s"],
            row["finished_at"].timestamp(),
        )
        for row in rows
    ]


async def load_arrivals(pool: asyncpg.Pool, start_s: float, end_s: float, queue: str = "") -> list[Arrival]:
    """Submitted jobs in [start_s, end_s) for demand forecasting (run time known once finished)."""
    rows = await pool.fetch(
        "SELECT queue, extract(epoch FROM submitted_at) AS submit_s, gpus, runtime_s FROM forecast.job_history"
        " WHERE submitted_at >= to_timestamp($1) AND submitted_at < to_timestamp($2) AND ($3 = '' OR queue = $3)",
        start_s,
        end_s,
        queue,
    )
    return [Arrival(row["queue"], float(row["submit_s"]), row["gpus"], row["runtime_s"]) for row in rows]
