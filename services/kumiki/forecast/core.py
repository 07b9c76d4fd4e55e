"""The forecast service's pure core: which jobs are open, what to learn from a lifecycle event.

The models themselves are `kumiki.forecast.models`, the same code the simulator's `kumiki` policy uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, RuntimeForecaster


@dataclass(frozen=True, slots=True)
class FinishedJob:
    features: JobFeatures
    runtime_s: float
    finished_s: float


@dataclass
class ForecastBook:
    """Jobs submitted but not finished, and the forecaster that learns as they finish."""

    forecaster: RuntimeForecaster
    open_jobs: dict[str, JobFeatures] = field(default_factory=dict)
    learned: int = 0

    def submitted(self, features: JobFeatures) -> RuntimeForecast:
        self.open_jobs[features.job_id] = features
        return self.forecaster.predict(features)

    def finished(self, job_id: str, runtime_s: float, finished_s: float, fallback: JobFeatures) -> FinishedJob | None:
        """Learn from a finished job (the submit-time features if we saw the submit); None for a bad runtime."""
        features = self.open_jobs.pop(job_id, fallback)
        if runtime_s <= 0:
            return None
        self.forecaster.observe(features, runtime_s, finished_s)
        self.learned += 1
        return FinishedJob(features, runtime_s, finished_s)

    def warm_start(self, history: list[FinishedJob]) -> None:
        """Replay stored history in finish order, so a restart forecasts as well as before it."""
        for job in sorted(history, key=lambda item: item.finished_s):
            self.forecaster.observe(job.features, job.runtime_s, job.finished_s)
            self.learned += 1
