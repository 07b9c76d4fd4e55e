from __future__ import annotations

import pytest

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.sched.forecasting import JobFeatures


def job(job_id: str, *, queue: str = "vc1", gpus: float = 1.0, user: str = "") -> JobFeatures:
    return JobFeatures(job_id=job_id, queue=queue, user=user, gpus=gpus, name="", submit_s=0.0)


def test_global_median_so_far_uses_every_finished_job() -> None:
    model = GlobalMedianSoFar()
    for index, runtime in enumerate([10.0, 1_000.0, 100.0, 50.0, 5_000.0]):
        model.observe(job(f"j{index}", queue=f"q{index}"), runtime, 0.0)
    forecast = model.predict(job("new", queue="other"))
    assert forecast.p50_s == pytest.approx(100.0)
    assert forecast.model == "global-median"
    # 90th percentile of {10, 50, 100, 1000, 5000} on log scale, interpolated between 1000 and 5000.
    assert 1_000.0 < forecast.p90_s < 5_000.0


def test_last_two_averages_the_last_two_runs_of_the_same_queue_and_gpu_count() -> None:
    model = LastTwoSameKey()
    model.observe(job("a"), 100.0, 0.0)
    model.observe(job("b"), 300.0, 0.0)
    model.observe(job("c"), 500.0, 0.0)  # the last two are 300 and 500
    model.observe(job("other-size", gpus=8), 9_999.0, 0.0)
    model.observe(job("other-queue", queue="vc2"), 7_777.0, 0.0)
    forecast = model.predict(job("new"))
    assert forecast.p50_s == pytest.approx(400.0)
    assert forecast.p90_s == pytest.approx(500.0)
    assert forecast.model == "last-two"


def test_last_two_keys_on_user_when_the_trace_has_one() -> None:
    model = LastTwoSameKey()
    model.observe(job("a", user="ann", queue="vc1"), 100.0, 0.0)
    model.observe(job("b", user="bob", queue="vc1"), 900.0, 0.0)
    assert model.predict(job("new", user="ann", queue="vc2")).p50_s == pytest.approx(100.0)


def test_last_two_cold_key_falls_back_to_the_global_median() -> None:
    model = LastTwoSameKey()
    for index, runtime in enumerate([10.0, 20.0, 30.0]):
        model.observe(job(f"j{index}", queue="vc1"), runtime, 0.0)
    forecast = model.predict(job("new", queue="never-seen"))
    assert forecast.p50_s == pytest.approx(20.0)
    assert forecast.model == "last-two/global-median"
