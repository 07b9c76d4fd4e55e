"""Each key level scores the models on its last started jobs: finished ones by their error, running ones by the
error they already prove."""

import math

import pytest

from kumiki.forecast.models.cohort import StartCohorts

KEY = ("q", "a")
OTHER = ("q", "b")
SHORT_LONG = (math.log(100.0), math.log(10_000.0))  # two models: one says 100 s, the other 10,000 s


def test_a_running_job_counts_once_it_outruns_a_forecast_by_the_error_it_proves() -> None:
    cohorts = StartCohorts(models=2)
    cohorts.started("sweep", (KEY,), SHORT_LONG, 0.0)
    assert cohorts.score(KEY, 50.0) == ([0.0, 0.0], 0)  # under both forecasts: proves nothing yet
    errors, counted = cohorts.score(KEY, 1_000.0)
    assert counted == 1
    assert errors == pytest.approx([math.log(10.0), 0.0])  # >= 10x off for "100 s", not off yet for "10,000 s"
    assert cohorts.score(KEY, 100_000.0)[0] == pytest.approx([3.0, math.log(10.0)])  # 1,000x off clipped to 3


def test_a_stopped_job_does_not_age_and_its_end_replaces_the_bound() -> None:
    cohorts = StartCohorts(models=2)
    cohorts.started("job", (KEY,), SHORT_LONG, 0.0)
    cohorts.stopped("job", 500.0)
    assert cohorts.score(KEY, 90_000.0)[0] == pytest.approx([math.log(5.0), 0.0])
    cohorts.started("job", (KEY,), SHORT_LONG, 100_000.0)
    assert cohorts.score(KEY, 100_500.0)[0] == pytest.approx([math.log(10.0), 0.0])
    cohorts.finished("job", (KEY,), SHORT_LONG, math.log(2_000.0))
    assert cohorts.score(KEY, 1e9) == (pytest.approx([math.log(20.0), math.log(5.0)]), 1)


def test_the_cohort_is_the_last_started_jobs_whatever_their_length() -> None:
    # 10 long jobs start, then 10 short ones start and finish: with a window of 10, only the short ones remain
    # (counting every running job instead would let the long ones outweigh them however many short ones ran)
    cohorts = StartCohorts(models=2, window=10)
    for index in range(10):
        cohorts.started(f"long-{index}", (KEY,), SHORT_LONG, 0.0)
    assert cohorts.score(KEY, 5_000.0)[1] == 10
    for index in range(10):
        cohorts.started(f"short-{index}", (KEY,), SHORT_LONG, 5_000.0 + index)
        cohorts.finished(f"short-{index}", (KEY,), SHORT_LONG, math.log(100.0))
    errors, counted = cohorts.score(KEY, 50_000.0)
    assert counted == 10
    assert errors == pytest.approx([0.0, 10 * 3.0])
    assert len(cohorts._lanes.members) == 10  # the long ones left every cohort and were forgotten


def test_a_job_leaves_one_key_levels_cohort_and_stays_in_the_others() -> None:
    cohorts = StartCohorts(models=2, window=2)
    cohorts.started("x", (KEY, ("q",)), SHORT_LONG, 0.0)
    cohorts.finished("x", (KEY, ("q",)), SHORT_LONG, math.log(100.0))
    for index in range(2):  # two jobs of another key fill the queue level's cohort
        cohorts.started(f"y{index}", (OTHER, ("q",)), SHORT_LONG, 10.0)
    assert cohorts.score(("q",), 20.0) == ([0.0, 0.0], 0)  # x left it; y0, y1 prove nothing yet
    assert cohorts.score(KEY, 20.0) == (pytest.approx([0.0, 3.0]), 1)  # x is still in its own key's
    cohorts.finished("y0", (OTHER, ("q",)), SHORT_LONG, math.log(10_000.0))
    assert cohorts.score(("q",), 20.0) == (pytest.approx([3.0, 0.0]), 1)


def test_a_job_never_seen_to_start_enters_at_its_end_and_mismatched_forecasts_are_refused() -> None:
    cohorts = StartCohorts(models=2)
    cohorts.finished("history", (KEY,), SHORT_LONG, math.log(100.0))
    assert cohorts.score(KEY, 0.0) == (pytest.approx([0.0, 3.0]), 1)
    with pytest.raises(ValueError, match="expected 2 forecasts"):
        cohorts.started("bad", (KEY,), (1.0,), 0.0)
    with pytest.raises(ValueError):
        StartCohorts(models=0)
