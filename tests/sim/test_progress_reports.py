"""Jobs that report their progress in the simulator: which report, and what the order does with it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kumiki.forecast.models.progress import ProgressForecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import Z90, JobFeatures, RuntimeForecast
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.scenarios import ProgressReports
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs
from tests.sim.test_trust_fallback import TINY


class StatedForecaster:
    """Submit-time forecasts stated per job (median and measured error), so a test can make one wrong on purpose."""

    def __init__(self, beliefs: dict[str, tuple[float, float]]) -> None:
        self.beliefs = beliefs

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        p50, sigma = self.beliefs[job.job_id]
        return RuntimeForecast(p50, p50 * math.exp(Z90 * sigma), "stated", 0, log_sigma=sigma, error_sigma=sigma)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        pass


def jcts(jobs: list[SimJobSpec], beliefs: dict[str, tuple[float, float]], reports: ProgressReports | None):
    forecaster = ProgressForecaster(StatedForecaster(beliefs))
    config = SimConfig(POLICIES["kumiki"], audit=True, progress_reports=reports)
    result = Simulator(uniform_cluster(1, 8), jobs, config, forecaster=forecaster).run()
    return {job.job_id: job for job in result.jobs}


def test_a_long_job_forecast_short_is_found_out_by_its_report_and_yields() -> None:
    # A whole-node job forecast at 30,000 s runs 360,000 s. A short one arrives at 40,000 s. Without progress
    # the long job still looks near its end, and the short one waits for it to run past its forecast; with
    # it, the report at 28,800 s of progress (8%) says 360,000 s, and the short job evicts it on arrival.
    jobs = [SimJobSpec("long", 0.0, 8, 360_000.0), SimJobSpec("short", 40_000.0, 8, 3_600.0)]
    beliefs = {"long": (30_000.0, 0.7), "short": (3_600.0, 0.3)}
    blind = jcts(jobs, beliefs, None)
    told = jcts(jobs, beliefs, ProgressReports(min_gpus=8, noise_sigma=0.0))
    assert blind["short"].jct_s > 10 * 3_600.0
    assert told["short"].jct_s < 1.1 * 3_600.0
    assert told["long"].preemptions == 1


def test_the_reporting_jobs_are_chosen_by_size_and_share_and_seed() -> None:
    jobs = [SimJobSpec(f"j{index}", float(index), 1 + index % 8, 100.0) for index in range(400)]
    big = {job.job_id for job in jobs if job.gpus >= 8}
    assert set(ProgressReports(min_gpus=8).reporters(jobs)) == big
    assert ProgressReports(min_gpus=1, share=0.0).reporters(jobs) == {}
    half = ProgressReports(min_gpus=1, share=0.5, seed=1).reporters(jobs)
    assert 150 < len(half) < 250
    assert half == ProgressReports(min_gpus=1, share=0.5, seed=1).reporters(jobs)
    assert half != ProgressReports(min_gpus=1, share=0.5, seed=2).reporters(jobs)
    exact = ProgressReports(min_gpus=1, noise_sigma=0.0).reporters(jobs)
    assert set(exact.values()) == {1.0}


@pytest.mark.parametrize(("field", "value"), [("min_gpus", 0), ("share", 1.5), ("noise_sigma", -0.1)])
def test_a_bad_scenario_is_refused_by_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ProgressReports(**{field: value})


def test_nobody_reporting_is_the_run_without_reports() -> None:
    """The scenario switched on with no reporter changes nothing: the forecaster is only told when a job reports."""
    jobs = sim_jobs(load_jobs(TINY), max_gpus=32)

    def run(reports: ProgressReports | None) -> list[tuple[str, float, int]]:
        from kumiki.forecast.models import build_default_forecaster

        config = SimConfig(POLICIES["kumiki"], progress_reports=reports)
        result = Simulator(uniform_cluster(4, 8), jobs, config, forecaster=build_default_forecaster()).run()
        return [(job.job_id, job.finish_s, job.preemptions) for job in result.jobs]

    assert run(None) == run(ProgressReports(share=0.0))
    assert run(None) != run(ProgressReports(min_gpus=1))


def test_only_forecasting_policies_hear_reports() -> None:
    jobs = [SimJobSpec("long", 0.0, 8, 360_000.0), SimJobSpec("short", 40_000.0, 8, 3_600.0)]
    config = dataclasses.replace(SimConfig(POLICIES["kumiki-noforecast"]), progress_reports=ProgressReports())
    simulator = Simulator(uniform_cluster(1, 8), jobs, config)
    assert simulator.reporters == {}
    assert len(simulator.run().jobs) == 2
