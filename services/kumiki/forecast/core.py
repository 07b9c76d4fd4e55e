"""The forecast service's pure core: which jobs are open, what to learn from a lifecycle event, what a running
job's progress report says of its run time.

The models themselves are `kumiki.forecast.models`, the same code the simulator's `kumiki` policy uses.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kumiki.forecast.models.history import remember
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


@dataclass(frozen=True, slots=True)
class OpenJob:
    """A job submitted or bound but not ended, as a restarted service finds it again in its history: what it was
    forecast at first, the work its preempted attempts kept, and since when its current attempt runs (None: it
    waits, queued again after a preemption at `stopped_s`)."""

    features: JobFeatures
    given: RuntimeForecast
    done_s: float = 0.0
    running_since_s: float | None = None
    stopped_s: float = 0.0


@dataclass
class ForecastBook:
    """Jobs open (submitted or bound, not ended) and the forecaster that learns as they end.

    A job is one entry across its generations: a preempted attempt is a stop, not an ending, so what is learned
    at the end is the job's whole run time (the work its earlier attempts kept, plus the last attempt), as the
    simulator learns a job's duration; an attempt's run time alone would teach the forecaster that the jobs long
    enough to be preempted are short."""

    forecaster: RuntimeForecaster
    open_jobs: dict[str, JobFeatures] = field(default_factory=dict)
    learned: int = 0
    given: dict[str, RuntimeForecast] = field(default_factory=dict)  # the forecast each open job was given
    done_s: dict[str, float] = field(default_factory=dict)  # work kept by an open job's preempted attempts
    # job -> (fraction, at_s) of a progress report heard before the job's bind: the checkpoints and the lifecycle
    # are read apart, so a report can overtake the BOUND it follows (bounded; applied at the bind)
    early_progress: dict[str, tuple[float, float]] = field(default_factory=dict)
    accuracy: AccuracyWindow = field(default_factory=AccuracyWindow)
    last_accuracy: Accuracy | None = None  # of the latest ending scored

    def _open(self, features: JobFeatures) -> RuntimeForecast | None:
        """Open a job not open yet: its forecast (to publish); None when it is open already."""
        if features.job_id in self.open_jobs:
            return None
        self.open_jobs[features.job_id] = features
        forecast = self.forecaster.predict(features)
        self.given[features.job_id] = forecast
        return forecast

    def submitted(self, features: JobFeatures) -> RuntimeForecast | None:
        """A job joined the queue: its forecast to publish, or None for a job already open (a generation queued
        again after a preemption keeps the forecast it has, which its progress may have given it)."""
        return self._open(features)

    def bound(self, features: JobFeatures, at_s: float) -> RuntimeForecast | None:
        """A generation's pods were bound at `at_s`: its run clock (re)starts, and a forecaster that listens counts
        it a miss once it outruns its p90. A job first seen here (bound at once, never queued) is opened and
        forecast, as the simulator forecasts every arrival. A progress report of this run heard before the bind
        is applied now. Returns the forecast to publish (the newest), else None."""
        forecast = self._open(features)
        tell_started(self.forecaster, features.job_id, at_s)
        early = self.early_progress.pop(features.job_id, None)
        if early is not None and early[1] >= at_s:  # one from an earlier attempt says nothing of this one's clock
            forecast = tell_progress(self.forecaster, features.job_id, *early) or forecast
        return forecast

    def preempted(self, job_id: str, ran_s: float, lost_s: float, at_s: float) -> None:
        """An attempt that ran `ran_s` was evicted at `at_s`, losing `lost_s` of work since its last checkpoint: a
        stop, not an ending. The job stays open for its next generation, nothing is learned, and the work kept
        counts towards its run time when it ends."""
        if job_id not in self.open_jobs:
            return
        self.done_s[job_id] = self.done_s.get(job_id, 0.0) + max(0.0, ran_s - max(0.0, lost_s))
        tell_stopped(self.forecaster, job_id, at_s)

    def progressed(self, job_id: str, fraction: float, at_s: float) -> RuntimeForecast | None:
        """An open job reports `fraction` of its work done at `at_s`: its new forecast, or None (not open, not
        started, or the forecaster does not listen; kept, to apply at the job's bind if it comes later).
        `given` keeps the submit-time forecast: an ending scores the
        forecast a job was given before it ran, not one read off its own progress."""
        forecast = tell_progress(self.forecaster, job_id, fraction, at_s) if job_id in self.open_jobs else None
        if forecast is None:  # perhaps ahead of its bind: kept for it (a job that never binds is forgotten in time)
            remember(self.early_progress, job_id, (fraction, at_s))
        return forecast

    def released(self, job_id: str, at_s: float) -> None:
        """An open job was cancelled before it finished: nothing to learn, but a forecaster that counts running jobs
        (the censored expert, the selection's record, the p90's coverage) must stop its clock, or it would count
        the job as running, longer and longer, for ever."""
        self.early_progress.pop(job_id, None)
        if self.open_jobs.pop(job_id, None) is not None:
            self.given.pop(job_id, None)
            self.done_s.pop(job_id, None)
            tell_stopped(self.forecaster, job_id, at_s)

    def finished(self, job_id: str, runtime_s: float, finished_s: float, fallback: JobFeatures) -> FinishedJob | None:
        """Learn from a job whose last attempt ran `runtime_s` (the submit-time features if we saw the submit); None
        for a bad runtime. The run time learned is the whole job's: the work its preempted attempts kept, plus
        this attempt.

        Before learning, the ending scores the forecast the job was given at submission (or, for a job first
        seen at its end, what the model would have said): `last_accuracy`."""
        features = self.open_jobs.pop(job_id, fallback)
        given = self.given.pop(job_id, None)
        kept_s = self.done_s.pop(job_id, 0.0)
        self.early_progress.pop(job_id, None)
        self.last_accuracy = None
        if runtime_s <= 0:
            tell_stopped(self.forecaster, job_id, finished_s)  # ended, with nothing to learn: its clock stops
            return None
        total_s = kept_s + runtime_s
        self.last_accuracy = self.accuracy.add(given or self.forecaster.predict(features), total_s)
        self.forecaster.observe(features, total_s, finished_s)
        self.learned += 1
        return FinishedJob(features, total_s, finished_s)

    def warm_start(self, history: list[FinishedJob], open_jobs: list[OpenJob] | None = None) -> None:
        """Replay stored history in finish order, then take back the jobs still open, so a restart forecasts as
        well as before it and still knows the jobs it forecast: their progress reports are heard, and their
        endings learn their whole run time and score the forecast they were given."""
        for job in sorted(history, key=lambda item: item.finished_s):
            self.forecaster.observe(job.features, job.runtime_s, job.finished_s)
            self.learned += 1
        for open_job in open_jobs or ():
            self.reopen(open_job)

    def reopen(self, job: OpenJob) -> None:
        """A job open before a restart: known again with the forecast it was given, and its run clock where it
        was (the earlier attempts' work banked; running since its current attempt's start, or stopped)."""
        job_id = job.features.job_id
        self.open_jobs[job_id] = job.features
        self.forecaster.predict(job.features)  # a forecaster that follows the jobs it forecast knows it again
        self.given[job_id] = job.given
        if job.done_s > 0.0:
            self.done_s[job_id] = job.done_s
        if job.running_since_s is not None:
            tell_started(self.forecaster, job_id, job.running_since_s - job.done_s)
        elif job.done_s > 0.0:  # queued again after a preemption: its clock holds the work done, stopped
            tell_started(self.forecaster, job_id, job.stopped_s - job.done_s)
            tell_stopped(self.forecaster, job_id, job.stopped_s)
