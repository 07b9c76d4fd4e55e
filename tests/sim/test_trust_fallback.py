"""The `kumiki-trust` order degrades gracefully: noise forecasts cost little, true ones gain."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np

from kumiki.forecast.models import ForecastTrust
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

TINY = Path(__file__).resolve().parent / "data" / "philly-tiny.csv"


class MeasuredForecaster:
    """Issues p50s from `guess` with a tight claimed spread, and measures its trust like the real one."""

    def __init__(self, guess: dict[str, float]) -> None:
        self.guess = guess
        self.trust = ForecastTrust()
        self.issued: dict[str, float] = {}

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        p50 = self.guess[job.job_id]
        self.issued[job.job_id] = p50
        return RuntimeForecast(p50, p50 * 1.5, "test", 0, log_sigma=0.3, trust=self.trust.trust(job))

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.trust.update(job, math.log(max(runtime_s, 1.0)), math.log(max(self.issued[job.job_id], 1.0)))


def average_jct(policy: str, jobs: list[SimJobSpec], forecaster: MeasuredForecaster | None) -> float:
    result = Simulator(uniform_cluster(4, 8), jobs, SimConfig(POLICIES[policy]), forecaster=forecaster).run()
    return float(np.mean([job.jct_s for job in result.jobs]))


def test_noise_forecasts_cost_nothing_and_true_ones_gain() -> None:
    jobs = sim_jobs(load_jobs(TINY), max_gpus=32)
    rng = random.Random(0)
    noise = {job.job_id: 1800.0 * math.exp(rng.gauss(0.0, 2.5)) for job in jobs}
    truth = {job.job_id: job.duration_s for job in jobs}
    blind = average_jct("kumiki-noforecast", jobs, None)
    with_noise = average_jct("kumiki-trust", jobs, MeasuredForecaster(noise))
    with_truth = average_jct("kumiki-trust", jobs, MeasuredForecaster(truth))
    trusting_noise = average_jct("kumiki", jobs, MeasuredForecaster(noise))
    # The same noise fully trusted costs time on this trace; measured trust takes all of it back. Measured since
    # the simulator runs a pass at each starvation limit (a starving job no longer waits for the next event):
    # 102,433 s blind, 96,770 s noise with trust, 104,127 s noise trusted, 67,396 s truth with trust. Before
    # that, 92,781 / 91,419 / 101,756 / 67,331 s (the noise cost 10%); before issue 14's eleventh step the
    # noise cost 16%, and with the 6 h protection of `kumiki-protect` 38%.
    assert trusting_noise > blind
    assert with_noise - blind < 0.2 * (trusting_noise - blind)
    assert with_truth < 0.8 * blind


def test_forecast_free_fallback_is_not_behind_tiresias() -> None:
    """What `kumiki` falls back to with no forecast (`kumiki-noforecast`) must not be behind Tiresias (on this
    small trace both it and its 6 h-protected form are; on the Philly slice at 48 x 8 only the unprotected one
    is, docs/simulator.md)."""
    jobs = sim_jobs(load_jobs(TINY), max_gpus=32)
    assert average_jct("kumiki-noforecast", jobs, None) <= average_jct("tiresias", jobs, None)
