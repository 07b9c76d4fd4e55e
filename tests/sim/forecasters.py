"""A trivial forecaster for tests only: the median of finished run times per queue."""

from __future__ import annotations

import statistics

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast


class QueueMedianForecaster:
    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {}
        self.observed: list[str] = []

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        values = self.history.get(job.queue, [])
        p50 = statistics.median(values) if values else 600.0
        return RuntimeForecast(p50, 4 * p50, "queue-median", len(self.observed))

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.history.setdefault(job.queue, []).append(runtime_s)
        self.observed.append(job.job_id)
