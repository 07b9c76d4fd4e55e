"""Forecasts from the progress a running job reports (a fraction of its work done: step / total steps).

A week of Philly jobs gives a whole-node job nothing but a queue and a GPU count, and their first forecasts are a
median 5.8x off; their true run times alone would recover 82% of the oracle's gain at 48 x 8 GPUs (issue 14,
docs/design/0007-progress-reports.md). A training job knows how far it has got. Having run `r` seconds and
reported fraction `f`, it is believed to run `r / f` in all; how far to believe that is measured, not assumed:
the spread of log(actual / implied) over the last finished jobs that reported, shrunk towards a wide prior
while there are few of them. Reports that do not predict (a rate that changes, a job stopped early) widen the
belief, and the scheduler's order turns attained-service-like for them, as it does for bad forecasts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kumiki.forecast.models.censored import RunClock
from kumiki.forecast.models.history import log_runtime, remember
from kumiki.sched.forecasting import (
    Z90,
    JobFeatures,
    RuntimeForecast,
    RuntimeForecaster,
    tell_started,
    tell_stopped,
)

PROGRESS_MODEL = "progress"


@dataclass(frozen=True, slots=True)
class ProgressConfig:
    """How the spread of progress-implied run times is measured: over the last `window` finished jobs that
    reported, shrunk towards `prior_sigma` as if it had been seen `prior_weight` times (wide: until jobs have
    shown their reports predict, a report moves the order little)."""

    window: int = 200
    prior_sigma: float = 1.5
    prior_weight: float = 5.0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not self.prior_sigma > 0.0:
            raise ValueError(f"prior_sigma must be > 0, got {self.prior_sigma}")
        if not self.prior_weight > 0.0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")


def check_fraction(fraction: float) -> float:
    """A reported fraction of work done, checked: in (0, 1]."""
    if not 0.0 < fraction <= 1.0 or math.isnan(fraction):
        raise ValueError(f"progress fraction must be in (0, 1], got {fraction}")
    return fraction


@dataclass
class ProgressForecaster:
    """Wraps a forecaster: submit-time forecasts are the inner one's; a job's progress report gives a new one."""

    inner: RuntimeForecaster
    config: ProgressConfig = field(default_factory=ProgressConfig)
    _clocks: dict[str, RunClock] = field(default_factory=dict)
    _implied_s: dict[str, float] = field(default_factory=dict)  # job -> run time its last report implied
    _residuals: deque[float] = field(init=False)  # log(actual / implied), last `window` reporting jobs

    def __post_init__(self) -> None:
        self._residuals = deque(maxlen=self.config.window)

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        return self.inner.predict(job)

    def started(self, job_id: str, start_s: float) -> None:
        clock = self._clocks.get(job_id)
        if clock is None:
            clock = RunClock()
            remember(self._clocks, job_id, clock)  # bounded: jobs cancelled before they end are forgotten
        clock.start(start_s)
        tell_started(self.inner, job_id, start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        clock = self._clocks.get(job_id)
        if clock is not None:
            clock.stop(stop_s)
        tell_stopped(self.inner, job_id, stop_s)

    def progressed(self, job_id: str, fraction: float, at_s: float) -> RuntimeForecast | None:
        """The job reports `fraction` of its work done at `at_s`: its forecast from that (None: it has not run)."""
        check_fraction(fraction)
        clock = self._clocks.get(job_id)
        ran_s = clock.ran_s(at_s) if clock is not None else 0.0
        if ran_s <= 0.0:
            return None
        implied = ran_s / fraction
        remember(self._implied_s, job_id, implied)
        sigma = self.error_sigma()
        return RuntimeForecast(
            implied, implied * math.exp(Z90 * sigma), PROGRESS_MODEL, 1, log_sigma=sigma, error_sigma=sigma
        )

    def error_sigma(self) -> float:
        """The measured spread of log(actual / implied), bias included, shrunk towards the prior."""
        weight = self.config.prior_weight
        squares = weight * self.config.prior_sigma**2 + sum(residual * residual for residual in self._residuals)
        return math.sqrt(squares / (weight + len(self._residuals)))

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        implied = self._implied_s.pop(job.job_id, None)
        if implied is not None:
            self._residuals.append(log_runtime(runtime_s) - log_runtime(implied))
        self._clocks.pop(job.job_id, None)
        self.inner.observe(job, runtime_s, finished_s)
