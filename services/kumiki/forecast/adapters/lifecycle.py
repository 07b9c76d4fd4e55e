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
from kumiki.forecast.core import ACCURACY_WINDOW, Accuracy, FinishedJob, ForecastBook, OpenJob
from kumiki.forecast.demand import Arrival
from kumiki.forecast.models.progress import PROGRESS_MODEL
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
PROGRESS_FORECASTS = Counter(
    "kumiki_forecast_progress_forecasts_total", "Running jobs forecast again from the progress they reported", ["model"]
)


def record_accuracy(accuracy: Accuracy) -> None:
    ABS_LOG_ERROR.labels(accuracy.model).set(accuracy.mean_abs_log_error)
    P90_COVERAGE.labels(accuracy.model).set(accuracy.p90_coverage)
    SCORED.labels(accuracy.model).inc()


FINAL_STATES = {  # a job's endings (PREEMPTED ends an attempt, not the job: a stop)
    events_pb2.JOB_STATE_COMPLETED: "completed",
    events_pb2.JOB_STATE_FAILED: "failed",
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


_COLUMNS = "job_id, generation, queue, user_name, name, gpus, image, command, time_limit_s"
_HISTORY_ROW = (  # a bind's start is kept from the first BOUND (a RUNNING after it, or a redelivery, keeps it)
    f"INSERT INTO forecast.job_history ({_COLUMNS}, submitted_at, p50_s, p90_s, model, started_at)"
    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14) ON CONFLICT (job_id, generation) DO UPDATE"
    " SET started_at = coalesce(forecast.job_history.started_at, EXCLUDED.started_at)"
)
_ENDING_ROW = (
    f"INSERT INTO forecast.job_history ({_COLUMNS}, submitted_at, finished_at, final_state, runtime_s, attempt_s,"
    " lost_s) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15)"
    " ON CONFLICT (job_id, generation) DO UPDATE SET finished_at = EXCLUDED.finished_at,"
    " final_state = EXCLUDED.final_state, runtime_s = EXCLUDED.runtime_s, attempt_s = EXCLUDED.attempt_s,"
    " lost_s = EXCLUDED.lost_s"
)


class LifecycleHandler:
    """Follows each job across its generations (`ForecastBook`) and keeps `forecast.job_history` so that a restart
    finds the same jobs open (`load_open_jobs`) and learns from the same endings (`load_history`)."""

    def __init__(self, book: ForecastBook, producer: EventProducer) -> None:
        self.book = book
        self.producer = producer

    async def __call__(self, event: Event, connection: asyncpg.Connection | None) -> None:
        assert connection is not None, "the forecast service consumes job.lifecycle exactly once"
        message = event.payload
        assert isinstance(message, events_pb2.JobLifecycle)
        at = message.at.ToDatetime(tzinfo=UTC) if message.HasField("at") else datetime.now(UTC)
        job, generation = message.job.job_id, message.job.generation
        if message.state == events_pb2.JOB_STATE_SUBMITTED:
            features = features_of(message)
            forecast = self.book.submitted(features)
            await self._record(connection, features, generation, at, started_at=None)
            if forecast is not None:  # a generation queued again after a preemption keeps the forecast it has
                await publish_forecast(self.producer, message.job, forecast)
        elif message.state in (events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_RUNNING):
            features = features_of(message)
            forecast = self.book.bound(features, at.timestamp())
            await self._record(connection, features, generation, at, started_at=at)
            if forecast is not None:  # bound at once (forecast now, as the simulator does), or progress heard early
                await publish_forecast(self.producer, message.job, forecast)
                if forecast.model == PROGRESS_MODEL:
                    PROGRESS_FORECASTS.labels(forecast.model).inc()
        elif message.state == events_pb2.JOB_STATE_RELEASED:
            self.book.released(job, at.timestamp())
            await connection.execute(
                "UPDATE forecast.job_history SET finished_at = $3, final_state = 'released'"
                " WHERE job_id = $1 AND generation = $2 AND final_state IS NULL",
                job,
                generation,
                at,
            )
        elif message.state == events_pb2.JOB_STATE_PREEMPTED:
            attempt_s = max(0.0, message.runtime_s)
            lost_s = message.lost_gpu_seconds / message.gpus if message.gpus > 0 else 0.0
            self.book.preempted(job, attempt_s, lost_s, at.timestamp())
            features = features_of(message)
            started = at - timedelta(seconds=attempt_s)
            await connection.execute(
                _ENDING_ROW, *_identity(features, generation), started, at, "preempted", None, attempt_s, lost_s
            )
        elif message.state in FINAL_STATES:
            # a job first seen at its end (its bind was never seen): it started at least its run time ago
            started = at - timedelta(seconds=max(0.0, message.runtime_s))
            fallback = replace(features_of(message), submit_s=started.timestamp())
            learned = self.book.finished(job, message.runtime_s, at.timestamp(), fallback)
            if self.book.last_accuracy is not None:
                record_accuracy(self.book.last_accuracy)
            await connection.execute(
                _ENDING_ROW,
                *_identity(fallback, generation),
                started,
                at,
                FINAL_STATES[message.state],
                learned.runtime_s if learned is not None else None,
                max(0.0, message.runtime_s),
                0.0,
            )

    async def _record(
        self,
        connection: asyncpg.Connection,
        features: JobFeatures,
        generation: int,
        at: datetime,
        started_at: datetime | None,
    ) -> None:
        """The generation's row, with the forecast the job was given (and, once bound, since when it runs)."""
        given = self.book.given.get(features.job_id)
        await connection.execute(
            _HISTORY_ROW,
            *_identity(features, generation),
            at,
            given.p50_s if given is not None else None,
            given.p90_s if given is not None else None,
            given.model if given is not None else None,
            started_at,
        )


def _features(row: asyncpg.Record, submit_s: float) -> JobFeatures:
    return JobFeatures(
        row["job_id"],
        row["queue"],
        row["user_name"],
        row["gpus"],
        row["name"],
        submit_s,
        row["image"],
        row["command"],
        row["time_limit_s"],
    )


async def load_history(pool: asyncpg.Pool, limit: int = 200_000) -> list[FinishedJob]:
    rows = await pool.fetch(
        f"SELECT {_COLUMNS}, submitted_at, finished_at, runtime_s FROM forecast.job_history"
        " WHERE runtime_s IS NOT NULL ORDER BY finished_at DESC LIMIT $1",
        limit,
    )
    return [
        FinishedJob(_features(row, row["submitted_at"].timestamp()), row["runtime_s"], row["finished_at"].timestamp())
        for row in rows
    ]


_ENDED = ("completed", "failed", "released")


async def load_open_jobs(pool: asyncpg.Pool, limit: int = 100_000) -> list[OpenJob]:
    """The jobs open when the service stopped (the newest `limit`): those whose latest generation has not ended, or
    was preempted and waits to run again, each with its rows since its previous ending."""
    rows = await pool.fetch(
        f"SELECT h.{_COLUMNS.replace(', ', ', h.')}, h.submitted_at, h.started_at, h.finished_at, h.final_state,"
        " h.attempt_s, h.lost_s, h.p50_s, h.p90_s, h.model FROM forecast.job_history AS h"
        " JOIN (SELECT job_id FROM (SELECT DISTINCT ON (job_id) job_id, final_state, submitted_at"
        "   FROM forecast.job_history ORDER BY job_id, generation DESC) AS latest"
        "   WHERE final_state IS NULL OR final_state = 'preempted' ORDER BY submitted_at DESC LIMIT $1) AS open"
        " ON open.job_id = h.job_id ORDER BY h.job_id, h.generation",
        limit,
    )
    runs: dict[str, list[asyncpg.Record]] = {}
    for row in rows:
        run = runs.setdefault(row["job_id"], [])
        if row["final_state"] in _ENDED:  # an earlier run of the same job id ended here: the open run starts after
            run.clear()
        else:
            run.append(row)
    return [job for job in map(_open_job, runs.values()) if job is not None]


def _open_job(run: list[asyncpg.Record]) -> OpenJob | None:
    """One open job from its generations' rows, oldest first (the first is its submission)."""
    if not run:
        return None
    first, latest = run[0], run[-1]
    forecast = next((row for row in run if row["p50_s"] is not None), None)
    if forecast is None:  # recorded before it was forecast (an older service): forecast it again on reopening
        return None
    done_s = sum(max(0.0, row["attempt_s"] - row["lost_s"]) for row in run if row["final_state"] == "preempted")
    running = latest["final_state"] is None and latest["started_at"] is not None
    return OpenJob(
        _features(first, first["submitted_at"].timestamp()),
        RuntimeForecast(forecast["p50_s"], forecast["p90_s"], forecast["model"] or "unknown", 0),
        done_s,
        latest["started_at"].timestamp() if running else None,
        latest["finished_at"].timestamp() if latest["final_state"] == "preempted" else 0.0,
    )


async def load_arrivals(pool: asyncpg.Pool, start_s: float, end_s: float, queue: str = "") -> list[Arrival]:
    """Jobs submitted in [start_s, end_s) for demand forecasting, once each: a generation queued again after a
    preemption is not a new arrival, and the run time is the job's, from its ending (None until it ends)."""
    rows = await pool.fetch(
        "SELECT arrival.queue, extract(epoch FROM arrival.submitted_at) AS submit_s, arrival.gpus,"
        " (SELECT ending.runtime_s FROM forecast.job_history AS ending WHERE ending.job_id = arrival.job_id"
        "   AND ending.generation >= arrival.generation AND ending.runtime_s IS NOT NULL"
        "   ORDER BY ending.generation LIMIT 1) AS runtime_s"
        " FROM forecast.job_history AS arrival"
        " WHERE arrival.submitted_at >= to_timestamp($1) AND arrival.submitted_at < to_timestamp($2)"
        " AND ($3 = '' OR arrival.queue = $3) AND NOT EXISTS (SELECT 1 FROM forecast.job_history AS earlier"
        "   WHERE earlier.job_id = arrival.job_id AND earlier.generation = arrival.generation - 1"
        "   AND earlier.final_state = 'preempted')",
        start_s,
        end_s,
        queue,
    )
    return [Arrival(row["queue"], float(row["submit_s"]), row["gpus"], row["runtime_s"]) for row in rows]
