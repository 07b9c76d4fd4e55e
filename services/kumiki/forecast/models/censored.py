"""The censored-history expert: a key's recent median that counts the runs still going.

Rolling medians learn only from finished jobs. When a key's runs turn long (on the Philly slice, sweeps of
40-67 jobs that ran 16,000-64,000 s in a key whose runs usually take ~1,000 s) they go on forecasting the old
run time until the first long run ends, hours after the sweep and everything submitted behind it was
forecast. Yet by then the scheduler has watched the sweep's first jobs run far past that: each is a
*censored* observation (its run time is at least what it has run so far). This expert forecasts the
Kaplan-Meier median of the key's last `window` started jobs, finished ones at their run time and running
ones censored at their run time so far, so a regime change is seen while its jobs run, not after they end.
A short regime is seen as early as before: its jobs finish.

The run time so far is the time since the job's latest start plus what it ran before it was stopped
(`stopped`, for preemptions the job survives), so a preempted job is not counted as running while it waits.
Like every expert it is weighed by its own record per key (`WeightedSelection`), so it is only followed
where censoring helps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kumiki.forecast.models.history import (
    GLOBAL_KEY,
    MAX_LOG_S,
    PRIOR_LOG_S,
    PRIOR_P90_OFFSET,
    HistoryConfig,
    Key,
    job_keys,
    log_runtime,
    remember,
)
from kumiki.forecast.models.lanes import KeyLanes
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast

_HISTORY = HistoryConfig()  # the same window and minimum as the rolling-median experts


def kaplan_meier_quantiles(samples: list[tuple[float, bool]], levels: tuple[float, ...]) -> list[float | None]:
    """Quantiles of (value, exact) samples, censored ones (exact False) known only to exceed their value: for each
    level, the smallest value at which the Kaplan-Meier survival estimate falls to 1 - level (one sort, one pass).

    None for a level it never reaches (more than 1 - level of the samples may still run past every value)."""
    ordered = sorted(samples, key=lambda sample: (sample[0], not sample[1]))  # an event precedes a tie's censoring
    found: list[float | None] = [None] * len(levels)
    survival = 1.0
    index = 0
    while index < len(ordered) and None in found:
        value, exact = ordered[index]
        if not exact:
            index += 1
            continue
        at_risk = len(ordered) - index
        events = 0
        while index < len(ordered) and ordered[index] == (value, True):
            events += 1
            index += 1
        survival *= 1.0 - events / at_risk
        for position, level in enumerate(levels):
            if found[position] is None and survival <= 1.0 - level + 1e-12:
                found[position] = value
    return found


def kaplan_meier_median(samples: list[tuple[float, bool]]) -> float | None:
    """Median of (value, exact) samples (`kaplan_meier_quantiles` at 1/2)."""
    return kaplan_meier_quantiles(samples, (0.5,))[0]


@dataclass(slots=True)
class RunClock:
    """How long a started job has run: seconds banked before its last stop, plus the time since its running start.

    Preemptions the job survives stop the clock, so a job waiting to restart is not counted as running."""

    banked_s: float = 0.0
    since_s: float | None = None  # running since (None: stopped, or finished)

    def start(self, start_s: float) -> None:
        if self.since_s is None:
            self.since_s = start_s

    def stop(self, stop_s: float) -> None:
        if self.since_s is not None:
            self.banked_s += max(0.0, stop_s - self.since_s)
            self.since_s = None

    def ran_s(self, now_s: float) -> float:
        return self.banked_s + (max(0.0, now_s - self.since_s) if self.since_s is not None else 0.0)


@dataclass(slots=True)
class _Run:
    """A started job in the key lanes: its clock, its run time once it finished, the lanes still holding it."""

    offset: float = 0.0  # subtracted from its log run time (the log p50 issued, for residuals)
    clock: RunClock = field(default_factory=RunClock)
    log_runtime_s: float | None = None  # set when it finished
    lanes: int = 0  # key lanes still holding it (forgotten at 0)

    def sample(self, now_s: float) -> tuple[float, bool]:
        if self.log_runtime_s is not None:
            return self.log_runtime_s - self.offset, True
        return log_runtime(self.clock.ran_s(now_s)) - self.offset, False


class StartedLanes(KeyLanes[_Run]):
    """Each key level's last started jobs (`KeyLanes`): finished ones at their log run time, running ones
    censored at what they have run so far (each less its offset)."""

    __slots__ = ()

    def started(self, job_id: str, start_s: float, keys: tuple[Key, ...] = (), offset: float = 0.0) -> None:
        """The job began running (a restart after a preemption resumes its clock); `keys` and `offset` place a job
        not in the lanes yet."""
        run = self.members.get(job_id) or self.enter(job_id, _Run(offset), keys)
        if run.log_runtime_s is None:
            run.clock.start(start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        run = self.members.get(job_id)
        if run is not None:
            run.clock.stop(stop_s)

    def finished(self, job_id: str, keys: tuple[Key, ...], log_runtime_s: float, offset: float = 0.0) -> None:
        """The job ended: its run time replaces its bound (a run never seen to start enters exact)."""
        run = self.members.get(job_id) or self.enter(job_id, _Run(offset), keys)
        run.clock.since_s = None
        run.log_runtime_s = log_runtime_s

    def samples(self, key: Key, now_s: float) -> list[tuple[float, bool]]:
        lane = self.lanes.get(key)
        return [] if lane is None else [self.members[job_id].sample(now_s) for job_id in lane]


@dataclass(slots=True)
class CensoredHistory:
    """Kaplan-Meier median of log run time over each key level's last `window` started jobs (module docstring)."""

    window: int = _HISTORY.short_window
    min_count: int = _HISTORY.min_count  # a key level needs this many started jobs, one of them finished
    name: str = "history-censored"
    version: int = 0
    _pending: dict[str, JobFeatures] = field(default_factory=dict)  # forecast, not started yet
    started_lanes: StartedLanes = field(init=False)

    def __post_init__(self) -> None:
        self.started_lanes = StartedLanes(self.window)

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        if job.job_id not in self.started_lanes.members:
            remember(self._pending, job.job_id, job)
        log_p50 = self.log_median(job, job.submit_s)
        return RuntimeForecast(
            math.exp(min(log_p50, MAX_LOG_S)),
            math.exp(min(log_p50 + PRIOR_P90_OFFSET, MAX_LOG_S)),
            self.name,
            self.version,
        )

    def log_median(self, job: JobFeatures, now_s: float) -> float:
        """The most specific key level's censored median. Where a level's median is still unknown (more than half
        of its runs outlast every end), the longest run so far is a lower bound: the answer is then the next
        level's median, but no less than that bound; with no level's median known, the bound itself."""
        floor = -math.inf
        for key in job_keys(job):
            needed = 1 if key == GLOBAL_KEY else self.min_count
            if self.started_lanes.size(key) < needed:
                continue
            samples = self.started_lanes.samples(key, now_s)
            if not any(exact for _, exact in samples):
                floor = max(floor, max(value for value, _ in samples))
                continue
            median = kaplan_meier_median(samples)
            if median is not None:
                return max(median, floor)
            floor = max(floor, max(value for value, _ in samples))
        return floor if floor > -math.inf else PRIOR_LOG_S

    def started(self, job_id: str, start_s: float) -> None:
        keys: tuple[Key, ...] = ()
        if job_id not in self.started_lanes.members:
            job = self._pending.pop(job_id, None)
            if job is None:
                return  # never forecast here (or forgotten): nothing to place it in
            keys = job_keys(job)
        self.started_lanes.started(job_id, start_s, keys)

    def stopped(self, job_id: str, stop_s: float) -> None:
        self.started_lanes.stopped(job_id, stop_s)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self._pending.pop(job.job_id, None)
        self.started_lanes.finished(job.job_id, job_keys(job), log_runtime(runtime_s))  # unseen start: exact only
        self.version += 1
