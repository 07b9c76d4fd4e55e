"""The seam between the scheduling core and run-time forecasting.

Policies see a job through `JobFeatures` (what a live cluster knows at submit time) and ask a
`RuntimeForecaster` for quantiles. The true duration is never part of `JobFeatures`: that is how
non-oracle policies are kept from reading it. `kumiki.forecast` implements the forecaster; the
simulator and the live forecast service call the same implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What is known about a job when it is submitted."""

    job_id: str
    queue: str
    user: str
    gpus: float
    name: str
    submit_s: float


@dataclass(frozen=True, slots=True)
class RuntimeForecast:
    """Predicted run time quantiles in seconds, and which model produced them.

    `log_sigma`, when a model gives it, is its calibrated spread of log run time around the p50 (a
    log-normal sigma fitted to its own past errors): schedulers that weigh uncertainty use it instead
    of reading a sigma off the p90, which a conformal p90 stretches to cover the rare long runs.
    """

    p50_s: float
    p90_s: float
    model: str
    model_version: int
    log_sigma: float | None = None


class RuntimeForecaster(Protocol):
    """Predicts run time at submit; learns from jobs as they finish (online)."""

    def predict(self, job: JobFeatures) -> RuntimeForecast: ...

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None: ...
