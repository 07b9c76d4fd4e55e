"""Forecasts from reported progress: the run time a report implies, and a spread measured on the reports' record."""

from __future__ import annotations

import math

import pytest

from kumiki.forecast.models import build_default_forecaster
from kumiki.forecast.models.progress import PROGRESS_MODEL, ProgressConfig, ProgressForecaster
from kumiki.sched.forecasting import Z90, JobFeatures, tell_progress, tell_started
from tests.sim.forecasters import QueueMedianForecaster


def features(job_id: str) -> JobFeatures:
    return JobFeatures(job_id, "research", "ada", 8.0, "train", 0.0)


def test_a_report_forecasts_the_run_so_far_over_the_fraction_done() -> None:
    forecaster = ProgressForecaster(QueueMedianForecaster())
    forecaster.predict(features("a"))
    forecaster.started("a", 100.0)
    forecast = forecaster.progressed("a", 0.25, 1_100.0)
    assert forecast is not None
    assert forecast.model == PROGRESS_MODEL
    assert forecast.p50_s == pytest.approx(4_000.0)
    # nothing has shown yet how well reports predict: the belief is the prior's width, and the p90 says so
    assert forecast.error_sigma == pytest.approx(ProgressConfig().prior_sigma)
    assert forecast.p90_s == pytest.approx(4_000.0 * math.exp(Z90 * ProgressConfig().prior_sigma))


def test_time_stopped_between_runs_is_not_run_time() -> None:
    forecaster = ProgressForecaster(QueueMedianForecaster())
    forecaster.started("a", 0.0)
    forecaster.stopped("a", 500.0)  # preempted, waits 500 s
    forecaster.started("a", 1_000.0)
    forecast = forecaster.progressed("a", 0.5, 1_500.0)
    assert forecast is not None and forecast.p50_s == pytest.approx(2_000.0)


def test_a_job_that_has_not_run_gets_no_progress_forecast() -> None:
    forecaster = ProgressForecaster(QueueMedianForecaster())
    forecaster.predict(features("a"))
    assert forecaster.progressed("a", 0.5, 100.0) is None


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, math.nan])
def test_a_fraction_outside_zero_to_one_is_refused_by_name(fraction: float) -> None:
    forecaster = ProgressForecaster(QueueMedianForecaster())
    forecaster.started("a", 0.0)
    with pytest.raises(ValueError, match="progress fraction"):
        forecaster.progressed("a", fraction, 10.0)


def run_reporting_jobs(forecaster: ProgressForecaster, count: int, actual_over_implied: float) -> None:
    """`count` jobs that each report halfway through a run they then finish `actual_over_implied` times longer."""
    for index in range(count):
        job_id = f"j{index}"
        start = 10_000.0 * index
        forecaster.predict(features(job_id))
        forecaster.started(job_id, start)
        forecaster.progressed(job_id, 0.5, start + 1_000.0)  # implies 2,000 s
        forecaster.observe(features(job_id), 2_000.0 * actual_over_implied, start + 2_000.0 * actual_over_implied)


def test_the_spread_narrows_when_reports_predict_and_widens_when_they_do_not() -> None:
    prior = ProgressConfig().prior_sigma
    honest = ProgressForecaster(QueueMedianForecaster())
    run_reporting_jobs(honest, 50, 1.0)
    assert honest.error_sigma() < 0.4 * prior
    misleading = ProgressForecaster(QueueMedianForecaster())
    run_reporting_jobs(misleading, 50, math.exp(3.0))  # ran e^3 times longer than their reports said
    assert misleading.error_sigma() > prior
    honest.started("next", 0.0)
    forecast = honest.progressed("next", 0.5, 1_000.0)
    assert forecast is not None and forecast.error_sigma == pytest.approx(honest.error_sigma())


def test_jobs_that_never_reported_leave_the_record_alone_and_reach_the_inner_model() -> None:
    inner = QueueMedianForecaster()
    forecaster = ProgressForecaster(inner)
    forecaster.predict(features("quiet"))
    forecaster.started("quiet", 0.0)
    forecaster.observe(features("quiet"), 100_000.0, 100_000.0)
    assert forecaster.error_sigma() == pytest.approx(ProgressConfig().prior_sigma)
    assert inner.observed == ["quiet"]
    assert forecaster.predict(features("next")).p50_s == pytest.approx(100_000.0)  # the inner model learned


def test_the_default_forecaster_listens_for_progress() -> None:
    forecaster = build_default_forecaster()
    forecaster.predict(features("a"))
    assert tell_progress(forecaster, "a", 0.5, 10.0) is None  # not started: no forecast from progress
    tell_started(forecaster, "a", 0.0)
    forecast = tell_progress(forecaster, "a", 0.1, 600.0)
    assert forecast is not None and forecast.p50_s == pytest.approx(6_000.0)


@pytest.mark.parametrize(
    ("field", "value"), [("window", 0), ("prior_sigma", 0.0), ("prior_weight", -1.0)], ids=lambda item: str(item)
)
def test_config_is_checked_by_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ProgressConfig(**{field: value})
