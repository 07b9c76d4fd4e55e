"""The error spread counted on a key's last started jobs (kumiki.forecast.models.calibration.CensoredResiduals,
`SelectionConfig.censored_sigma`, measured and off by default), pure."""

import math

import pytest

from kumiki.forecast.models.calibration import CensoredResiduals
from kumiki.forecast.models.history import job_keys
from kumiki.forecast.models.selection import SelectionConfig, WeightedSelection
from kumiki.sched.forecasting import JobFeatures


def job(job_id: str, submit_s: float, queue: str = "vc") -> JobFeatures:
    return JobFeatures(job_id=job_id, queue=queue, user="", gpus=1.0, name="", submit_s=submit_s)


def residual_lanes() -> CensoredResiduals:
    """A key of 40 finished runs forecast well (residuals within +-0.1), in the same queue as the sweep below."""
    residuals = CensoredResiduals(window=300, min_residuals=30)
    for index in range(40):
        features = job(f"ok{index}", float(index))
        residuals.started(features.job_id, job_keys(features), math.log(100.0), float(index))
        residuals.finished(
            features.job_id, job_keys(features), math.log(100.0), math.log(100.0) + 0.1 * (index % 3 - 1)
        )
    return residuals


def test_a_sweep_running_far_past_its_forecasts_widens_the_error_before_any_of_it_ends() -> None:
    residuals = residual_lanes()
    query = job("next", 1_000.0)
    calm = residuals.sigma(query, 1_000.0)
    assert calm is not None and calm < 0.15
    for index in range(20):  # forecast 100 s, each still running after 10,000 s
        features = job(f"sweep{index}", 1_000.0)
        residuals.started(features.job_id, job_keys(features), math.log(100.0), 1_000.0)
    assert residuals.sigma(query, 1_050.0) == pytest.approx(calm, abs=0.05)  # not past their forecasts yet
    wide = residuals.sigma(query, 11_000.0)
    assert wide is not None and wide > 1.0  # a third of the key's runs are 100x past their p50


def test_time_a_run_spends_stopped_is_not_error_and_its_end_replaces_its_bound() -> None:
    residuals = residual_lanes()
    query = job("next", 1_000.0)
    for index in range(20):
        features = job(f"sweep{index}", 1_000.0)
        residuals.started(features.job_id, job_keys(features), math.log(100.0), 1_000.0)
        residuals.stopped(features.job_id, 1_100.0)  # preempted after 100 s: as long as forecast, no longer
    paused = residuals.sigma(query, 50_000.0)
    assert paused is not None and paused < 0.3
    for index in range(20):
        features = job(f"sweep{index}", 1_000.0)
        residuals.finished(features.job_id, job_keys(features), math.log(100.0), math.log(100.0))
    ended = residuals.sigma(query, 50_000.0)
    assert ended is not None and ended < 0.15


def test_a_key_with_no_end_and_no_run_past_its_forecast_leaves_the_error_to_the_next_level() -> None:
    residuals = CensoredResiduals(window=300, min_residuals=30)
    assert residuals.sigma(job("cold", 0.0), 0.0) is None
    other = job("other", 0.0, queue="elsewhere")
    residuals.finished("other", job_keys(other), math.log(100.0), math.log(100.0) + 2.0)
    residuals.finished("other2", job_keys(other), math.log(100.0), math.log(100.0) - 2.0)
    for index in range(40):  # a new key's runs, all just started
        features = job(f"new{index}", 0.0)
        residuals.started(features.job_id, job_keys(features), math.log(100.0), 0.0)
    # the new queue's level says nothing yet; the global level (the two ended runs, and the new ones censored
    # below 0) answers
    sigma = residuals.sigma(job("query", 10.0), 10.0)
    assert sigma is not None and sigma > 1.0
    with pytest.raises(ValueError, match="window"):
        CensoredResiduals(window=1, min_residuals=30)


def test_the_forecaster_reads_its_error_spread_off_the_running_jobs_only_when_asked() -> None:
    """The same history told to two forecasters: 40 runs of ~100 s finish, then a sweep of 20 starts and runs on.
    A day later only the one with `censored_sigma` forecasts the key's next job with a wider error."""

    def error_after_sweep(censored: bool) -> tuple[float, float]:
        forecaster = WeightedSelection(SelectionConfig(censored_sigma=censored))
        for index in range(40):
            features = job(f"ok{index}", float(index) * 200.0)
            forecaster.predict(features)
            forecaster.started(features.job_id, features.submit_s)
            forecaster.observe(features, 100.0 * (1.0 + 0.05 * (index % 3)), features.submit_s + 100.0)
        before = forecaster.predict(job("before", 9_000.0)).error_sigma
        for index in range(20):
            features = job(f"sweep{index}", 10_000.0)
            forecaster.predict(features)
            forecaster.started(features.job_id, 10_000.0)
        after = forecaster.predict(job("after", 96_400.0)).error_sigma
        assert before is not None and after is not None
        return before, after

    plain_before, plain_after = error_after_sweep(censored=False)
    assert plain_after == pytest.approx(plain_before)  # nothing has finished: the finished residuals are the same
    censored_before, censored_after = error_after_sweep(censored=True)
    assert censored_before == pytest.approx(plain_before, abs=0.1)
    assert censored_after > censored_before + 1.0
