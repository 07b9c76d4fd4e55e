"""The seam between the scheduling core and run-time forecasting.

Policies see a job through `JobFeatures` (what a live cluster knows at submit time) and ask a
`RuntimeForecaster` for quantiles. The true duration is never part of `JobFeatures`: that is how
non-oracle policies are kept from reading it. `kumiki.forecast` implements the forecaster; the
simulator and the live forecast service call the same implementation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# The belief a scheduler forms from a forecast, shared by the forecaster (which measures how well that
# belief has explained each key's runs) and the policies (which order jobs by it). A forecast says: log
# run time ~ Normal(log p50, sigma), except that a share WRONG_TAIL_WEIGHT of forecasts are simply wrong
# and spread Normal(log p50, WRONG_TAIL_SIGMA). Without a forecast (or with one that has not earned
# trust) a job is drawn from one wide, uninformed prior: median half an hour, p90 e^2 (~7x) above it.
Z90 = 1.2815515655446004
UNINFORMED_P50_S = 1800.0
UNINFORMED_P90_S = 1800.0 * math.exp(2.0)
UNINFORMED_LOG_SIGMA = 2.0 / Z90
WRONG_TAIL_WEIGHT = 0.1
WRONG_TAIL_SIGMA = 2.5


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What is known about a job when it is submitted.

    `image`, `command` and `time_limit_s` are what a pod carries and a trace usually does not (its container
    image, its first container's command and arguments, the run time it asked for: `activeDeadlineSeconds` or
    the `kumiki.io/time-limit` annotation); empty or None when unknown."""

    job_id: str
    queue: str
    user: str
    gpus: float
    name: str
    submit_s: float
    image: str = ""
    command: str = ""
    time_limit_s: float | None = None


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
    # Posterior probability (0..1) that this forecast's belief, rather than the uninformed prior, describes
    # runs of this job's key, from the forecaster's own record on that key (None: the model keeps none, and
    # consumers trust it fully). A policy mixes its ordering towards the forecast-free order as this falls.
    trust: float | None = None
    # The honest spread of this key's errors (sigma of a zero-centred normal of log actual - log p50, bias
    # included), when the model measures it; wider than `log_sigma` where forecasts are biased.
    error_sigma: float | None = None


def _log_normal_density(x: float, mean: float, sigma: float) -> float:
    z = (x - mean) / sigma
    return -0.5 * z * z - math.log(sigma) - 0.5 * math.log(2.0 * math.pi)


def belief_log_density(log_runtime_s: float, log_p50_s: float, log_sigma: float) -> float:
    """Log density of a log run time under the belief a forecast (log p50, sigma) induces, wrong tail included."""
    sharp = _log_normal_density(log_runtime_s, log_p50_s, max(log_sigma, 0.02))
    wide = _log_normal_density(log_runtime_s, log_p50_s, WRONG_TAIL_SIGMA)
    high = max(sharp, wide)
    return high + math.log(
        (1.0 - WRONG_TAIL_WEIGHT) * math.exp(sharp - high) + WRONG_TAIL_WEIGHT * math.exp(wide - high)
    )


def uninformed_log_density(log_runtime_s: float) -> float:
    """Log density of a log run time under the uninformed prior (the belief with no forecast)."""
    return belief_log_density(log_runtime_s, math.log(UNINFORMED_P50_S), UNINFORMED_LOG_SIGMA)


def belief_survival(log_attained_s: float, log_p50_s: float, log_sigma: float) -> float:
    """P(run time > attained) under the belief of a forecast (log p50, sigma), wrong tail included."""
    sharp = 0.5 * math.erfc((log_attained_s - log_p50_s) / (max(log_sigma, 0.02) * math.sqrt(2.0)))
    wide = 0.5 * math.erfc((log_attained_s - log_p50_s) / (WRONG_TAIL_SIGMA * math.sqrt(2.0)))
    return (1.0 - WRONG_TAIL_WEIGHT) * sharp + WRONG_TAIL_WEIGHT * wide


class RuntimeForecaster(Protocol):
    """Predicts run time at submit; learns from jobs as they finish (online)."""

    def predict(self, job: JobFeatures) -> RuntimeForecast: ...

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None: ...


@runtime_checkable
class ObservesStarts(Protocol):
    """A forecaster that also hears when a forecast job begins (or, after a stop, resumes) running: one still
    running past its p90 is a miss known before it ends, and one running long is a lower bound on its run time
    (censored feedback), so learning need not wait a whole run time."""

    def started(self, job_id: str, start_s: float) -> None: ...


@runtime_checkable
class ObservesStops(Protocol):
    """A forecaster that also hears when a started job stops without ending (preempted, to run again later), so
    that the time it then waits is not counted as run time."""

    def stopped(self, job_id: str, stop_s: float) -> None: ...


@runtime_checkable
class ObservesProgress(Protocol):
    """A forecaster that hears how far a running job has got (a fraction of its work: step / total steps) and
    forecasts it again from that; None where it cannot (the job has not run)."""

    def progressed(self, job_id: str, fraction: float, at_s: float) -> RuntimeForecast | None: ...


def tell_started(forecaster: object, job_id: str, start_s: float) -> None:
    """Pass a job's (re)start to the forecaster, if it listens for starts (most models do not)."""
    if isinstance(forecaster, ObservesStarts):
        forecaster.started(job_id, start_s)


def tell_stopped(forecaster: object, job_id: str, stop_s: float) -> None:
    """Pass a job's stop short of its end to the forecaster, if it listens for stops."""
    if isinstance(forecaster, ObservesStops):
        forecaster.stopped(job_id, stop_s)


def tell_progress(forecaster: object, job_id: str, fraction: float, at_s: float) -> RuntimeForecast | None:
    """Pass a job's progress report to the forecaster, if it listens for them: the job's new forecast, or None."""
    if isinstance(forecaster, ObservesProgress):
        return forecaster.progressed(job_id, fraction, at_s)
    return None
