"""The forecast gate: use the forecasts only while replaying the past says they shortened the last day.

Issue 14 asks for a policy that bad forecasts cannot make worse than no forecasts. A forecaster's own error
does not tell: ordering by forecasts no better than a half-hour prior as point estimates still gained 8%, and
trust weights built from that error cost 7-10% (docs/design/0003-forecast-trust.md). The counterfactual the
evaluation uses does tell, and a scheduler can run it on its own past: every `every_s`, replay the jobs
submitted so far through the same scheduling core twice, with the forecasts they were given and without, and
keep the forecasts on while they shortened the last `window_s` of time in system. Replaying from the first
job, not from the window's start, gives each arm the backlog it built itself; a replay started on an empty
cluster found no difference in most windows. Jobs unfinished at the look are censored, not guessed: they
cannot finish inside the replay in either arm, so no arm is flattered by a run time nobody knows yet.

Pure: it runs the simulator, which is pure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kumiki.sched.cluster import ClusterSpec
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast

if TYPE_CHECKING:
    from kumiki.sim.engine import SimConfig


@dataclass(frozen=True, slots=True)
class GateConfig:
    """How often the gate looks, how much of the past it scores, and from how far back it replays."""

    window_s: float = 86400.0
    every_s: float = 21600.0
    # how far back the replay starts (it scores only the last `window_s`, so the backlog the window opened
    # with is the one each arm built up); inf: from the first job
    replay_s: float = math.inf
    # forecasts are used before the first replay that has anything to say (the forecaster's own cold start
    # is the uninformed prior, so early forecasts order like no forecasts)
    start_on: bool = True

    def __post_init__(self) -> None:
        if not self.window_s > 0 or not math.isfinite(self.window_s):
            raise ValueError(f"forecast gate window_s must be a positive number of seconds, got {self.window_s}")
        if not self.every_s > 0 or not math.isfinite(self.every_s):
            raise ValueError(f"forecast gate every_s must be a positive number of seconds, got {self.every_s}")
        if not self.replay_s > 0:
            raise ValueError(f"forecast gate replay_s must be a positive number of seconds, got {self.replay_s}")


@dataclass(frozen=True, slots=True)
class PastJob:
    """A job as the gate sees it at its look: what it was told at submit, and what has happened since."""

    job_id: str
    queue: str
    gpus: int
    submit_s: float
    forecast: RuntimeForecast
    # its run time if it has finished, else None (censored)
    runtime_s: float | None


@dataclass(frozen=True, slots=True)
class GateLook:
    """One look: the last window's replayed time in system with and without forecasts, per queue, and whether
    the forecasts are on after it."""

    at_s: float
    jobs: int
    with_forecasts_s: Mapping[str, float]
    without_forecasts_s: Mapping[str, float]
    on: bool


class RecordedForecasts:
    """A forecaster that answers with the forecasts the jobs were given at the time, and learns nothing."""

    def __init__(self, forecasts: Mapping[str, RuntimeForecast]) -> None:
        self.forecasts = forecasts

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        return self.forecasts[job.job_id]

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        return None


def time_in_system(
    spec: ClusterSpec,
    jobs: Sequence[PastJob],
    config: SimConfig,
    *,
    with_forecasts: bool,
    from_s: float,
    until_s: float,
) -> dict[str, float]:
    """Seconds each queue's jobs spent submitted-and-unfinished between `from_s` and `until_s`, replayed on an
    empty cluster from the first job."""
    from kumiki.sim.engine import SimJobSpec, Simulator

    specs = [
        SimJobSpec(
            job.job_id,
            job.submit_s,
            job.gpus,
            # censored: longer than the whole replay, so it cannot finish inside it in either arm
            job.runtime_s if job.runtime_s is not None else until_s - job.submit_s + 1.0,
            queue=job.queue,
        )
        for job in jobs
    ]
    policy = replace(config.policy, gate_forecasts=False, uses_forecast=with_forecasts)
    forecaster = RecordedForecasts({job.job_id: job.forecast for job in jobs}) if with_forecasts else None
    result = Simulator(spec, specs, replace(config, policy=policy, audit=False), forecaster=forecaster).run(
        until_s=until_s
    )
    finished = {done.job_id: done.finish_s for done in result.jobs}
    totals: dict[str, float] = defaultdict(float)
    for job in jobs:
        totals[job.queue] += max(0.0, min(finished.get(job.job_id, until_s), until_s) - max(job.submit_s, from_s))
    return dict(totals)


@dataclass(slots=True)
class ForecastGate:
    """Are forecasts used for the jobs queued, resumed or re-ranked now? One switch for the cluster: a switch per
    queue was measured and lost (docs/design/0003-forecast-trust.md, "Seventh step")."""

    config: GateConfig = field(default_factory=GateConfig)
    on: bool = field(init=False)
    looks: list[GateLook] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.on = self.config.start_on

    def look(self, now: float, spec: ClusterSpec, past: Sequence[PastJob], config: SimConfig) -> GateLook | None:
        """Replay both ways and switch; None (nothing changes) while no job in the replay has finished."""
        replayed = [job for job in past if now - self.config.replay_s <= job.submit_s < now]
        if not any(job.runtime_s is not None for job in replayed):
            return None
        from_s = now - self.config.window_s
        with_forecasts = time_in_system(spec, replayed, config, with_forecasts=True, from_s=from_s, until_s=now)
        without = time_in_system(spec, replayed, config, with_forecasts=False, from_s=from_s, until_s=now)
        with_total, without_total = math.fsum(with_forecasts.values()), math.fsum(without.values())
        # an exact tie (nothing in the window was ordered differently) keeps the state
        if with_total != without_total:
            self.on = with_total < without_total
        look = GateLook(now, len(replayed), with_forecasts, without, self.on)
        self.looks.append(look)
        return look


def share_on(looks: Sequence[GateLook]) -> float | None:
    """Share of the looks after which the forecasts were on (None before any look)."""
    return sum(1 for look in looks if look.on) / len(looks) if looks else None
