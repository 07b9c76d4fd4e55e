"""kumiki.checkpoints → job.forecast: a running job that says how far it has got (step of total_steps) is forecast
again from its progress, and placement ranks it by that forecast instead of its submit-time one."""

from __future__ import annotations

import asyncpg

from kumiki.common.bus import Event, EventProducer, EventRejected
from kumiki.common.contracts.v1 import checkpoints_pb2
from kumiki.common.grpcutil import unix_seconds
from kumiki.forecast.adapters.lifecycle import PROGRESS_FORECASTS, publish_forecast
from kumiki.forecast.core import ForecastBook, progress_fraction


class ProgressHandler:
    """At least once: a redelivered report forecasts the job again from the same progress, the same forecast."""

    def __init__(self, book: ForecastBook, producer: EventProducer) -> None:
        self.book = book
        self.producer = producer

    async def __call__(self, event: Event, connection: asyncpg.Connection | None) -> None:
        report = event.payload
        assert isinstance(report, checkpoints_pb2.CheckpointReport)
        fraction = progress_fraction(report.step, report.total_steps)
        if fraction is None:  # a report that does not say how far the job has got
            return
        if not report.HasField("completed_at"):
            raise EventRejected("completed_at: required with total_steps (the progress is as of then)")
        at_s = unix_seconds(report.completed_at)
        forecast = self.book.progressed(report.job.job_id, fraction, at_s)
        if forecast is None:  # not started (yet: the book applies it at the bind), or a model that does not listen
            return
        await publish_forecast(self.producer, report.job, forecast)
        PROGRESS_FORECASTS.labels(forecast.model).inc()
