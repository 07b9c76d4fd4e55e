"""Scoring models on the jobs they forecast, counting the jobs still running (pure, deterministic).

A model's record kept on finished jobs only is biased towards the models that say "short": early in a
cold start, or while a sweep of long runs is going in a key whose runs are usually short, the only jobs
that have finished are the short ones. On the tests' 300-job Philly prefix the first 100 jobs were forecast
70-750x too short while the record said the forecasts were good (docs/design/0003-forecast-trust.md,
thirteenth and fourteenth steps). A job still running is censored: its run time is at least what it has run
so far, so a model that forecast less has an error of at least the difference and one that forecast more
an error of at least 0. Counting those lower bounds while the jobs run corrects the record while it matters.

Which jobs are counted matters as much. The jobs running at a moment are a length-biased sample (a job that
runs 100x longer is 100x more likely to be running), so adding every running job would overcorrect towards
the models that say "long". Each key level therefore keeps a cohort: its last `window` *started* jobs, in
start order, whatever their length. A finished member counts its true error; a running member counts its
proven lower bound once it has outrun some model's forecast (before that it proves nothing about any of
them, and counting it as 0 for all would only dilute the differences). Its end replaces the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kumiki.forecast.models.censored import RunClock
from kumiki.forecast.models.history import Key, log_runtime
from kumiki.forecast.models.lanes import KeyLanes


@dataclass(slots=True)
class _Member:
    log_p50s: tuple[float, ...]  # what each model forecast for the job
    clock: RunClock = field(default_factory=RunClock)
    errors: tuple[float, ...] | None = None  # each model's clipped |log error|, once the job finished
    lanes: int = 0  # cohorts still holding it (forgotten at 0)


@dataclass(slots=True)
class _Cohort:
    finished_errors: list[float] = field(default_factory=list)  # summed over the finished members
    finished: int = 0
    running: dict[str, None] = field(default_factory=dict)


@dataclass(slots=True)
class StartCohorts:
    """Per key level, each model's summed |log error| over its last `window` started jobs (module docstring)."""

    models: int
    window: int = 100
    clip: float = 3.0  # one job's |log error| counts at most this much
    _cohorts: dict[Key, _Cohort] = field(default_factory=dict)
    _lanes: KeyLanes[_Member] = field(init=False)

    def __post_init__(self) -> None:
        if self.models < 1 or self.window < 1 or self.clip <= 0.0:
            raise ValueError("models and window must be >= 1 and clip > 0")
        self._lanes = KeyLanes(self.window)

    def started(self, job_id: str, keys: Sequence[Key], log_p50s: tuple[float, ...], start_s: float) -> None:
        """The job began running (a restart after a preemption resumes its clock)."""
        member = self._lanes.members.get(job_id)
        if member is None:
            member = self._enter(job_id, keys, log_p50s)
        if member.errors is None:
            member.clock.start(start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        member = self._lanes.members.get(job_id)
        if member is not None:
            member.clock.stop(stop_s)

    def finished(self, job_id: str, keys: Sequence[Key], log_p50s: tuple[float, ...], log_runtime_s: float) -> None:
        """The job ended: its true errors replace its bounds (a job never seen to start enters finished)."""
        member = self._lanes.members.get(job_id)
        if member is None:
            member = self._enter(job_id, keys, log_p50s)
        elif member.errors is not None:
            return
        member.clock.since_s = None
        errors = tuple(min(abs(value - log_runtime_s), self.clip) for value in member.log_p50s)
        member.errors = errors
        for key in keys:
            cohort = self._cohorts.get(key)
            if cohort is not None and job_id in cohort.running:
                del cohort.running[job_id]
                cohort.finished_errors = _plus(cohort.finished_errors, errors, 1.0)
                cohort.finished += 1

    def score(self, key: Key, now_s: float) -> tuple[list[float], int]:
        """Each model's summed error over the key level's scored members at `now_s`, and how many were scored."""
        cohort = self._cohorts.get(key)
        if cohort is None:
            return [0.0] * self.models, 0
        errors = [max(0.0, total) for total in cohort.finished_errors]  # (no float drift below 0)
        counted = cohort.finished
        for job_id in cohort.running:
            member = self._lanes.members[job_id]
            ran = log_runtime(member.clock.ran_s(now_s))
            bounds = [ran - value for value in member.log_p50s]
            if max(bounds) <= 0.0:
                continue
            for index, bound in enumerate(bounds):
                if bound > 0.0:
                    errors[index] += min(bound, self.clip)
            counted += 1
        return errors, counted

    def _enter(self, job_id: str, keys: Sequence[Key], log_p50s: tuple[float, ...]) -> _Member:
        if len(log_p50s) != self.models:
            raise ValueError(f"expected {self.models} forecasts for job {job_id!r}, got {len(log_p50s)}")
        member = self._lanes.enter(job_id, _Member(log_p50s), keys, self._leave)
        for key in keys:
            cohort = self._cohorts.get(key)
            if cohort is None:
                cohort = self._cohorts[key] = _Cohort(finished_errors=[0.0] * self.models)
            cohort.running[job_id] = None
        return member

    def _leave(self, key: Key, job_id: str, member: _Member) -> None:
        cohort = self._cohorts[key]
        if job_id in cohort.running:
            del cohort.running[job_id]
        elif member.errors is not None:  # a finished member: its errors leave the sums
            cohort.finished_errors = _plus(cohort.finished_errors, member.errors, -1.0)
            cohort.finished -= 1


def _plus(totals: list[float], errors: tuple[float, ...], sign: float) -> list[float]:
    return [total + sign * error for total, error in zip(totals, errors, strict=True)]
