"""The forecast gate: replays the past with and without the forecasts given, and keeps them where they helped."""

from __future__ import annotations

import math

import pytest

from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.gate import ForecastGate, GateConfig, PastJob, share_on, time_in_system
from kumiki.sim.workload import synthetic_jobs

ONE_GPU = uniform_cluster(1, 1)
GATED = SimConfig(POLICIES["kumiki-gated"])


def forecast(p50_s: float) -> RuntimeForecast:
    return RuntimeForecast(p50_s, p50_s * 1.5, "test", 0, log_sigma=0.3)


def past(*jobs: tuple[str, float, float, float | None]) -> list[PastJob]:
    """(job id, submit, forecast p50, run time or None) on queue q, one GPU each."""
    return [PastJob(job_id, "q", 1, submit_s, forecast(p50), runtime) for job_id, submit_s, p50, runtime in jobs]


def test_time_in_system_counts_a_censored_job_to_the_end_and_only_inside_the_window() -> None:
    jobs = past(("done", 0.0, 100.0, 100.0), ("open", 10.0, 100.0, None))
    whole = time_in_system(ONE_GPU, jobs, GATED, with_forecasts=True, from_s=0.0, until_s=50.0)
    assert whole == {"q": pytest.approx(50.0 + 40.0)}
    window = time_in_system(ONE_GPU, jobs, GATED, with_forecasts=True, from_s=20.0, until_s=50.0)
    assert window == {"q": pytest.approx(30.0 + 30.0)}


def test_forecasts_that_put_the_long_job_first_are_switched_off() -> None:
    # a blocker holds the GPU to t=100; then three 10 s jobs and a 1,000 s one wait. Without forecasts they go
    # in submit order (short ones first); the forecasts say the long one is short and the short ones long.
    jobs = past(
        ("blocker", 0.0, 100.0, 100.0),
        ("short-1", 1.0, 10_000.0, 10.0),
        ("short-2", 2.0, 10_000.0, 10.0),
        ("short-3", 3.0, 10_000.0, 10.0),
        ("long", 4.0, 5.0, 1000.0),
    )
    gate = ForecastGate(GateConfig(window_s=5000.0))
    look = gate.look(5000.0, ONE_GPU, jobs, GATED)
    assert look is not None
    assert look.with_forecasts_s["q"] > look.without_forecasts_s["q"] + 2000.0
    assert not gate.on and look.on is False


def test_forecasts_that_put_the_short_jobs_first_stay_on() -> None:
    # the same jobs, the long one submitted first (so it goes first without forecasts), forecast honestly
    jobs = past(
        ("blocker", 0.0, 100.0, 100.0),
        ("long", 1.0, 1000.0, 1000.0),
        ("short-1", 2.0, 10.0, 10.0),
        ("short-2", 3.0, 10.0, 10.0),
        ("short-3", 4.0, 10.0, 10.0),
    )
    gate = ForecastGate(GateConfig(window_s=5000.0, start_on=False))
    look = gate.look(5000.0, ONE_GPU, jobs, GATED)
    assert look is not None and look.with_forecasts_s["q"] < look.without_forecasts_s["q"]
    assert gate.on and share_on(gate.looks) == 1.0


def test_a_look_with_nothing_finished_changes_nothing() -> None:
    gate = ForecastGate(GateConfig(start_on=False))
    assert gate.look(50.0, ONE_GPU, past(("open", 0.0, 5.0, None)), GATED) is None
    assert not gate.on and gate.looks == [] and share_on(gate.looks) is None


@pytest.mark.parametrize(
    ("field", "value"), [("window_s", 0.0), ("every_s", -1.0), ("every_s", math.inf), ("replay_s", 0.0)]
)
def test_a_gate_config_out_of_range_is_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        GateConfig(**{field: value})


class Recorded:
    """Forecasts from a table; learns nothing."""

    def __init__(self, p50_s: dict[str, float]) -> None:
        self.p50_s = p50_s

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        return forecast(self.p50_s[job.job_id])

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        return None


def run(policy: str, jobs: list[SimJobSpec], p50_s: dict[str, float]) -> tuple[float, list[bool]]:
    result = Simulator(uniform_cluster(2, 8), jobs, SimConfig(POLICIES[policy]), forecaster=Recorded(p50_s)).run()
    return sum(job.jct_s for job in result.jobs) / len(result.jobs), [look.on for look in result.gate_looks]


@pytest.mark.parametrize("seed", [0, 1])
def test_in_a_simulation_true_forecasts_stay_on_and_reversed_ones_mostly_off(seed: int) -> None:
    jobs = synthetic_jobs(600, total_gpus=16, load=1.0, seed=seed)  # about four days of arrivals
    truth = {job.job_id: job.duration_s for job in jobs}
    by_length = sorted(jobs, key=lambda job: job.duration_s)
    reversed_ = {short.job_id: long.duration_s for short, long in zip(by_length, reversed(by_length), strict=True)}
    gated_truth, truth_looks = run("kumiki-gated", jobs, truth)
    _, reversed_looks = run("kumiki-gated", jobs, reversed_)
    assert len(truth_looks) >= 10
    # a gate that stays on is exactly `kumiki`
    if all(truth_looks):
        assert gated_truth == run("kumiki", jobs, truth)[0]
    assert sum(truth_looks) >= 0.9 * len(truth_looks)
    assert sum(reversed_looks) <= 0.5 * len(reversed_looks)
