"""The forecast book scores each ending against the forecast the job was given, forecasts a running job again from
its progress, follows a job across the generations its preemptions make, and takes open jobs back after a restart
(pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from kumiki.forecast.core import AccuracyWindow, ForecastBook, OpenJob, progress_fraction
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


def test_a_bound_job_is_passed_to_a_forecaster_that_listens_for_starts() -> None:
    listening = ListensForStarts()
    book = ForecastBook(listening)
    assert book.submitted(features("a")) is not None
    assert book.bound(features("a"), 12.0) is None, "forecast at its submission: nothing new to publish"
    assert listening.starts == [("a", 12.0)]
    deaf = ForecastBook(Fixed())  # most models do not listen: a start is simply not passed on
    deaf.submitted(features("a"))
    deaf.bound(features("a"), 12.0)
    assert deaf.finished("a", 50.0, 62.0, features("a")) is not None


def test_a_job_bound_at_once_is_forecast_at_its_bind_as_the_simulator_forecasts_every_arrival() -> None:
    book = ForecastBook(ListensForStarts())
    forecast = book.bound(features("at-once"), 13.0)
    assert forecast is not None and book.given["at-once"] == forecast
    assert book.bound(features("at-once"), 14.0) is None, "RUNNING after BOUND: the same job, no second forecast"
    book.finished("at-once", 200.0, 213.0, features("at-once"))
    assert book.last_accuracy is not None and book.last_accuracy.mean_abs_log_error == pytest.approx(math.log(2))


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
        book.bound(features(job), 10.0)
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
    book.bound(features("a"), 100.0)
    forecast = book.progressed("a", 0.25, 700.0)
    assert forecast is not None and forecast.p50_s == pytest.approx(2400.0)  # 600 s run / a quarter done
    assert book.given["a"] == given  # an ending scores the forecast given before the job ran
    assert book.progressed("never-submitted", 0.5, 700.0) is None
    book.finished("a", 2400.0, 2500.0, features("a"))
    assert book.progressed("a", 0.5, 2600.0) is None  # finished: no longer open


def test_a_forecaster_that_does_not_listen_for_progress_gives_no_new_forecast() -> None:
    book = ForecastBook(ListensForStarts())
    book.submitted(features("a"))
    book.bound(features("a"), 100.0)
    assert book.progressed("a", 0.25, 700.0) is None


def test_a_preempted_attempt_is_a_stop_and_the_ending_learns_the_whole_jobs_run_time() -> None:
    listening = ListensForStops()
    book = ForecastBook(listening)
    given = book.submitted(features("a"))
    assert given is not None
    book.bound(features("a"), 100.0)
    book.preempted("a", 600.0, 100.0, 700.0)  # ran 600 s, lost the last 100 s: 500 s of work kept
    assert listening.observed == [] and "a" in book.open_jobs, "nothing learned: the job runs again"
    assert listening.stops == [("a", 700.0)]
    assert book.submitted(features("a")) is None, "its next generation keeps the forecast it has"
    book.bound(features("a"), 1000.0)
    book.preempted("a", 200.0, 500.0, 1200.0)  # lost more than it ran (restore cost): keeps nothing, not less
    book.bound(features("a"), 1500.0)
    learned = book.finished("a", 300.0, 1800.0, features("a"))
    assert learned is not None and learned.runtime_s == 800.0  # 500 + 0 + 300
    assert listening.observed == [800.0]
    assert book.last_accuracy is not None  # scored on the forecast given at the first submission (p50 100 s)
    assert book.last_accuracy.mean_abs_log_error == pytest.approx(math.log(800.0 / given.p50_s))
    assert book.done_s == {} and book.open_jobs == {}
    book.preempted("never-submitted", 100.0, 0.0, 10.0)  # not open: nothing to stop
    assert "never-submitted" not in book.done_s


def test_a_progress_report_after_a_preemption_counts_every_attempts_run() -> None:
    book = ForecastBook(build_default_forecaster())
    book.submitted(features("a"))
    book.bound(features("a"), 100.0)
    book.preempted("a", 600.0, 0.0, 700.0)
    book.submitted(features("a"))
    book.bound(features("a"), 1000.0)  # waited 300 s: not run time
    forecast = book.progressed("a", 0.5, 1600.0)
    assert forecast is not None and forecast.p50_s == pytest.approx(2400.0)  # (600 + 600) s run / half done


def test_a_restarted_book_takes_open_jobs_back_where_they_were() -> None:
    given = RuntimeForecast(1000.0, 3000.0, "history-censored", 0)
    running = OpenJob(features("running"), given, done_s=500.0, running_since_s=2000.0)
    waiting = OpenJob(features("waiting"), given, done_s=400.0, running_since_s=None, stopped_s=1500.0)
    book = ForecastBook(build_default_forecaster())
    book.warm_start([], [running, waiting])
    assert set(book.open_jobs) == {"running", "waiting"} and book.given["running"] == given
    assert book.submitted(features("waiting")) is None, "known again: its next generation is not forecast anew"
    # its run clock: 500 s from earlier attempts, 500 s since this attempt's start
    progressed = book.progressed("running", 0.25, 2500.0)
    assert progressed is not None and progressed.p50_s == pytest.approx(4000.0)
    stopped = book.progressed("waiting", 0.5, 5000.0)  # stopped since 1,500 s: still 400 s run
    assert stopped is not None and stopped.p50_s == pytest.approx(800.0)
    learned = book.finished("running", 700.0, 2700.0, features("running"))
    assert learned is not None and learned.runtime_s == 1200.0
    assert book.last_accuracy is not None and book.last_accuracy.model == "history-censored"


def test_a_progress_report_heard_before_its_bind_is_applied_at_the_bind() -> None:
    book = ForecastBook(build_default_forecaster())
    book.submitted(features("a"))
    assert book.progressed("a", 0.25, 700.0) is None, "its BOUND not read yet: nothing to divide by"
    forecast = book.bound(features("a"), 100.0)
    assert forecast is not None and forecast.model == "progress" and forecast.p50_s == pytest.approx(2400.0)
    assert book.given["a"].model != "progress", "scored on its submit-time forecast all the same"
    # a report dated before the bind is not of this attempt: its clock says nothing of it
    book.submitted(features("b"))
    assert book.progressed("b", 0.5, 50.0) is None
    assert book.bound(features("b"), 100.0) is None and book.early_progress == {}
    book.progressed("gone", 0.5, 10.0)  # a job that ends (or is cancelled) drops what was kept for it
    book.released("gone", 20.0)
    assert "gone" not in book.early_progress
