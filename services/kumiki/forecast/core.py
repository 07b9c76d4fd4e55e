"""The forecast service's pure core: which jobs are open, what to learn from a lifecycle event, what a running
job's progress report says of its run time.

The models themselves are `kumiki.forecast.models`, the same code the simulator's `kumiki` policy uses.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kumiki.sched.forecasting import (
    JobFeatures,
    RuntimeForecast,
    RuntimeForecaster,
    tell_progress,
    tell_started,
    tell_stopped,
)

ACCURACY_WINDOW = 200  # endings per model in the rolling accuracy figures


@dataclass(frozen=True, slots=True)
class FinishedJob:
    features: JobFeatures
    runtime_s: float
    finished_s: float


def progress_fraction(step: int, total_steps: int) -> float | None:
    """How far a job that reported checkpoint `step` of `total_steps` has got (capped at 1: a job may run past the
    end it announced); None when it does not say (total_steps 0) or has done nothing yet (step 0)."""
    if total_steps <= 0 or step <= 0:
        return None
    return min(1.0, step / total_steps)


@dataclass(frozen=True, slots=True)
class Accuracy:
    """A model's rolling record over its last `ACCURACY_WINDOW` scored endings."""

    model: str
    scored: int  # endings in the window
    mean_abs_log_error: float  # mean |log(actual / p50)|: 0.69 means off by a factor of 2 on average
    p90_coverage: float  # share of runs that ended within the p90 (a calibrated p90 covers 0.9)


@dataclass
class AccuracyWindow:
    """|log error| of the p50 and whether the p90 covered the run, for each model's last endings."""

    size: int = ACCURACY_WINDOW
    scores: dict[str, deque[tuple[float, bool]]] = field(default_factory=dict)

    def add(self, forecast: RuntimeForecast, runtime_s: float) -> Accuracy:
        window = self.scores.setdefault(forecast.model, deque(maxlen=self.size))
        window.append((abs(math.log(runtime_s / max(forecast.p50_s, 1e-9))), runtime_s <= forecast.p90_s))
        return Accuracy(
            forecast.model,
            len(window),
            sum(error for error, _ in window) / len(window),
            sum(covered for _, covered in window) / len(window),
        )


@dataclass
class ForecastBook:
    """Jobs submitted but not finished, and the forecaster that learns as they finish."""

    forecaster: RuntimeForecaster
    open_jobs: dict[str, JobFeatures] = field(default_factory=dict)
    learned: int = 0
    given: dict[str, RuntimeForecast] = field(default_factory=dict)  # the forecast each open job was given
    accuracy: AccuracyWindow = field(default_factory=AccuracyWindow)
    last_accuracy: Accuracy | None = None  # of the latest ending scored

    def submitted(self, features: JobFeatures) -> RuntimeForecast:
        self.open_jobs[features.job_id] = features
        forecast = self.forecaster.predict(features)
        self.given[features.job_id] = forecast
        return forecast

    def started(self, job_id: str, at_s: float) -> None:
        """An open job's pods were bound: a forecaster that listens counts it a miss once it outruns its p90."""
        if job_id in self.open_jobs:
            tell_started(self.forecaster, job_id, at_s)

    def progressed(self, job_id: str, fraction: float, at_s: float) -> RuntimeForecast | None:
        """An open job reports `fraction` of its work done at `at_s`: its new forecast, or None (not open, not
        started, or the forecaster does not listen). `given` keeps the submit-time forecast: an ending scores the
        forecast a job was given before it ran, not one read off its own progress."""
        if job_id not in self.open_jobs:
            return None
        return tell_progress(self.forecaster, job_id, fraction, at_s)

    def released(self, job_id: str, at_s: float) -> None:
        """An open job was cancelled before it finished: nothing to learn, but a forecaster that counts running jobs
        (the censored expert, the selection's record, the p90's coverage) must stop its clock, or it would count
        the job as running, longer and longer, for ever."""
        if self.open_jobs.pop(job_id, None) is not None:
            self.given.pop(job_id, None)
            tell_stopped(self.forecaster, job_id, at_s)

    def finished(self, job_id: str, runtime_s: float, finished_s: float, fallback: JobFeatures) -> FinishedJob | None:
        """Learn from a finished job (the submit-time features if we saw the submit); None for a bad runtime.

        Before learning, the ending scores the forecast the job was given at submission (or, for a job first
        seen at its end, what the model would have said): `last_accuracy`."""
        features = self.open_jobs.pop(job_id, fallback)
        given = self.given.pop(job_id, None)
        self.last_accuracy = None
        if runtime_s <= 0:
            tell_stopped(self.forecaster, job_id, finished_s)  # ended, with nothing to learn: its clock stops
            return None
        self.last_accuracy = self.accuracy.add(given or self.forecaster.predict(features), runtime_s)
        self.forecaster.observe(features, runtime_s, finished_s)
        self.learned += 1
        return FinishedJob(features, runtime_s, finished_s)

    def warm_start(self, history: list[FinishedJob]) -> None:
        """Replay stored history in finish order, so a restart forecasts as well as before it."""
        for job in sorted(history, key=lambda item: item.finished_s):
            self.forecaster.observe(job.features, job.runtime_s, job.finished_s)
            self.learned += 1
