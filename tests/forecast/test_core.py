"""The forecast book scores each ending against the forecast the job was given, and forecasts a running job
again from its progress (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from kumiki.forecast.core import AccuracyWindow, ForecastBook, progress_fraction
from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast


@dataclass
class Fixed:
    """A forecaster that always says p50 = 100 s, p90 = 300 s, and counts what it learned."""

    observed: list[float] = field(default_factory=list)

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        return RuntimeForecast(100.0 * (1 + len(self.observed)), 300.0, "fixed", 1)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.observed.append(runtime_s)


def features(job: str) -> JobFeatures:
    return JobFeatures(job_id=job, queue="q", user="u", gpus=1, name="n", submit_s=0.0)


def test_an_ending_scores_the_forecast_given_at_submission_not_a_later_one() -> None:
    book = ForecastBook(Fixed())
    given = book.submitted(features("a"))  # p50 100 s
    book.finished("b", 50.0, 10.0, features("b"))  # learning in between changes later predictions
    book.finished("a", 200.0, 20.0, features("a"))
    assert given.p50_s == 100.0
    accuracy = book.last_accuracy
    assert accuracy is not None and accuracy.model == "fixed" and accuracy.scored == 2
    # b (first seen at its end) is scored on what the model said then (p50 100): |log 0.5|; a on its p50 100
    assert accuracy.mean_abs_log_error == pytest.approx((math.log(2) + math.log(2)) / 2)
    assert accuracy.p90_coverage == 1.0


def test_coverage_counts_runs_past_the_p90_and_the_window_rolls() -> None:
    window = AccuracyWindow(size=4)
    forecast = RuntimeForecast(100.0, 300.0, "m", 1)
    for runtime in (100.0, 400.0, 100.0, 100.0):
        accuracy = window.add(forecast, runtime)
    assert accuracy.p90_coverage == 0.75
    for _ in range(4):  # the long run leaves the window
        accuracy = window.add(forecast, 100.0)
    assert accuracy.p90_coverage == 1.0 and accuracy.mean_abs_log_error == 0.0 and accuracy.scored == 4


def test_a_bad_runtime_is_not_scored() -> None:
    book = ForecastBook(Fixed())
    book.submitted(features("a"))
    assert book.finished("a", 0.0, 1.0, features("a")) is None
    assert book.last_accuracy is None


@dataclass
class ListensForStarts(Fixed):
    starts: list[tuple[str, float]] = field(default_factory=list)

    def started(self, job_id: str, start_s: float) -> None:
        self.starts.append((job_id, start_s))


def test_a_bound_open_job_is_passed_to_a_forecaster_that_listens_for_starts() -> None:
    listening = ListensForStarts()
    book = ForecastBook(listening)
    book.submitted(features("a"))
    book.started("a", 12.0)
    book.started("never-submitted", 13.0)  # nothing to count a miss against
    assert listening.starts == [("a", 12.0)]
    deaf = ForecastBook(Fixed())  # most models do not listen: a start is simply not passed on
    deaf.submitted(features("a"))
    deaf.started("a", 12.0)
    assert deaf.finished("a", 50.0, 62.0, features("a")) is not None


@dataclass
class ListensForStops(ListensForStarts):
    stops: list[tuple[str, float]] = field(default_factory=list)

    def stopped(self, job_id: str, stop_s: float) -> None:
        self.stops.append((job_id, stop_s))


def test_a_cancelled_or_unmeasurable_job_stops_its_clock_in_a_forecaster_that_counts_running_jobs() -> None:
    listening = ListensForStops()
    book = ForecastBook(listening)
    for job in ("cancelled", "no-runtime"):
        book.submitted(features(job))
        book.started(job, 10.0)
    book.released("cancelled", 500.0)
    book.released("cancelled", 600.0)  # told twice (a redelivery): stopped once
    book.released("never-submitted", 700.0)
    assert book.finished("no-runtime", 0.0, 800.0, features("no-runtime")) is None
    assert listening.stops == [("cancelled", 500.0), ("no-runtime", 800.0)]
    assert "cancelled" not in book.open_jobs and "cancelled" not in book.given
    assert listening.observed == []  # nothing learned from either


def test_progress_is_the_step_over_the_total_capped_at_the_end() -> None:
    assert progress_fraction(300, 1200) == 0.25
    assert progress_fraction(1300, 1200) == 1.0  # ran past the end it announced
    assert progress_fraction(300, 0) is None  # the job does not know where it ends
    assert progress_fraction(0, 1200) is None  # nothing done yet: no run time to scale


def test_a_running_open_job_is_forecast_again_from_its_progress_but_scored_on_its_submit_time_forecast() -> None:
    book = ForecastBook(build_default_forecaster())
    given = book.submitted(features("a"))
    assert book.progressed("a", 0.25, 50.0) is None  # not started: no run time to scale
    book.started("a", 100.0)
    forecast = book.progressed("a", 0.25, 700.0)
    assert forecast is not None and forecast.p50_s == pytest.approx(2400.0)  # 600 s run / a quarter done
    assert book.given["a"] == given  # an ending scores the forecast given before the job ran
    assert book.progressed("never-submitted", 0.5, 700.0) is None
    book.finished("a", 2400.0, 2500.0, features("a"))
    assert book.progressed("a", 0.5, 2600.0) is None  # finished: no longer open


def test_a_forecaster_that_does_not_listen_for_progress_gives_no_new_forecast() -> None:
    book = ForecastBook(ListensForStarts())
    book.submitted(features("a"))
    book.started("a", 100.0)
    assert book.progressed("a", 0.25, 700.0) is None
