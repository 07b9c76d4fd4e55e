from __future__ import annotations

import math

import pytest

from kumiki.data import TRACES_DIR
from kumiki.forecast.evaluate import ModelScore, Prediction, default_factories, replay, score, verdicts
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sim.trace import TraceJob, load_jobs

from .synthetic import keyed_trace, trace_job


class Spy:
    """Records, at each forecast, which jobs it has been told about; forecasts the last run time seen."""

    def __init__(self, trace: dict[str, TraceJob]) -> None:
        self.trace = trace
        self.observed: dict[str, tuple[float, float]] = {}  # job id -> (runtime, finished_s)
        self.checked = 0

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        now = job.submit_s
        assert job.job_id not in self.observed, "a job's own run time was learned before its forecast"
        for job_id, (_, finished_s) in self.observed.items():
            assert finished_s < now, f"{job_id} finishing at {finished_s} was visible at {now}"
        finished_before = {
            other.job_id
            for other in self.trace.values()
            if other.submit_s is not None and other.duration_s is not None and other.submit_s + other.duration_s < now
        }
        assert set(self.observed) == finished_before, "a finished job was withheld or an unfinished one shown"
        self.checked += 1
        last = max(self.observed.values(), key=lambda item: item[1], default=(60.0, 0.0))[0]
        return RuntimeForecast(last, 2 * last, "spy", len(self.observed))

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        truth = self.trace[job.job_id]
        assert truth.submit_s is not None and truth.duration_s is not None
        assert runtime_s == truth.duration_s
        assert finished_s == truth.submit_s + truth.duration_s
        self.observed[job.job_id] = (runtime_s, finished_s)


def test_replay_shows_only_jobs_finished_strictly_before_each_submit() -> None:
    jobs = [
        trace_job("long", 0.0, 1_000.0),
        trace_job("short", 10.0, 5.0),  # finishes at 15
        trace_job("at-15", 15.0, 50.0),  # submitted as "short" finishes: must not see it yet
        trace_job("zero", 20.0, 0.0),  # finishes at its own submit time
        trace_job("same-time", 20.0, 30.0),  # must not see "zero" either (strictly before)
        trace_job("later", 100.0, 10.0),
    ]
    jobs += [
        trace_job(job.job_id, (job.submit_s or 0.0) + 200.0, job.duration_s, queue=job.queue)
        for job in keyed_trace(200, medians_s={"a": 40.0, "b": 400.0}, gap_s=7.0)
    ]
    spy = Spy({job.job_id: job for job in jobs})
    evaluation = replay(jobs, {"spy": lambda: spy})
    assert spy.checked == len(jobs)
    by_id = {p.job_id: p for p in evaluation.predictions}
    assert by_id["at-15"].p50_s == 60.0  # nothing had finished before t=15
    assert by_id["later"].p50_s == 50.0  # "at-15" (50 s, finished at 65) was the last to finish


def test_only_jobs_in_the_window_are_scored_but_earlier_ones_train() -> None:
    jobs = keyed_trace(100, medians_s={"a": 5.0}, gap_s=10.0)  # submits at 0, 10, ..., 990
    spy = Spy({job.job_id: job for job in jobs})
    evaluation = replay(jobs, {"spy": lambda: spy}, start_s=500.0, end_s=800.0)
    scored = {p.job_id for p in evaluation.predictions}
    assert scored == {job.job_id for job in jobs if job.submit_s is not None and 500.0 <= job.submit_s < 800.0}
    assert evaluation.trained_only == 50
    assert evaluation.scores["spy"].jobs == 30
    # The training-only jobs were observed: the first scored forecast is a learned run time, not the
    # spy's 60 s default, and only scored jobs appear in the predictions.
    first_scored = min(evaluation.predictions, key=lambda p: p.submit_s)
    assert first_scored.p50_s != 60.0
    assert len(spy.observed) >= 49


def test_replay_orders_by_submit_and_skips_jobs_it_cannot_replay() -> None:
    jobs = [
        trace_job("third", 30.0, 1.0),
        trace_job("first", 10.0, 1.0),
        trace_job("no-duration", 15.0, None),
        TraceJob("no-submit", None, 1.0, None, None, 5.0, "", "a", "", ""),
        trace_job("second", 20.0, 1.0),
    ]
    evaluation = replay(jobs, {"m": default_factories()["global-median"]})
    assert [p.job_id for p in evaluation.predictions] == ["first", "second", "third"]
    assert evaluation.skipped == 2


def test_score_is_median_abs_log_error_mae_and_p90_coverage() -> None:
    def prediction(p50: float, p90: float, actual: float) -> Prediction:
        return Prediction("j", "m", p50, p90, actual, "m", 0.0)

    result = score(
        [
            prediction(100.0, 200.0, 100.0),  # |log err| 0, covered
            prediction(100.0, 150.0, 200.0),  # ln 2, not covered
            prediction(100.0, 1_000.0, 1_000.0),  # ln 10, covered (equal counts as under)
        ]
    )
    assert result.jobs == 3
    assert result.median_abs_log_error == pytest.approx(math.log(2.0))
    assert result.mae_s == pytest.approx((0.0 + 100.0 + 900.0) / 3)
    assert result.p90_coverage == pytest.approx(2 / 3)
    assert math.isnan(score([]).median_abs_log_error)
    # one p50 for all three: it orders nothing, however close it is
    assert math.isnan(result.rank_agreement)
    assert score([]).as_dict()["rank_agreement"] is None


def test_rank_agreement_tells_forecasts_that_order_from_ones_that_are_merely_close() -> None:
    actuals = [60.0, 600.0, 1_800.0, 3_600.0, 36_000.0]

    def scored(p50s: list[float]) -> ModelScore:
        return score(
            [
                Prediction(f"j{i}", "m", p50, p50 * 2, actual, "m", 0.0)
                for i, (p50, actual) in enumerate(zip(p50s, actuals, strict=True))
            ]
        )

    # near the centre of every run, in the wrong order: small error, reversed order
    close = scored([2_000.0, 1_900.0, 1_800.0, 1_700.0, 1_600.0])
    # 20x long every time, in the right order: large error, exact order
    ordered = scored([actual * 20.0 for actual in actuals])
    assert close.median_abs_log_error < ordered.median_abs_log_error
    assert close.rank_agreement == pytest.approx(-1.0)
    assert ordered.rank_agreement == pytest.approx(1.0)
    verdict = verdicts({"day 1": {"kumiki": ordered, "global-median": close}})[0]
    assert verdict.as_dict()["rank_agreement"] == pytest.approx(1.0)
    assert verdict.as_dict()["better_baseline_rank_agreement"] == pytest.approx(-1.0)


def test_bad_window_and_empty_model_set_are_rejected() -> None:
    jobs = [trace_job("a", 0.0, 1.0)]
    with pytest.raises(ValueError, match="end_s"):
        replay(jobs, default_factories(), start_s=10.0, end_s=10.0)
    with pytest.raises(ValueError, match="no models"):
        replay(jobs, {})


def test_every_default_model_is_scored_on_every_window_job() -> None:
    jobs = keyed_trace(120, medians_s={"a": 20.0, "b": 200.0}, gap_s=5.0)
    evaluation = replay(jobs, default_factories(), start_s=300.0)
    window_jobs = sum(1 for job in jobs if job.submit_s is not None and job.submit_s >= 300.0)
    assert set(evaluation.scores) == {
        "kumiki",
        "kumiki-ensemble",
        "history-median",
        "quantreg",
        "global-median",
        "last-two",
    }
    for result in evaluation.scores.values():
        assert result.jobs == window_jobs
    assert len(evaluation.predictions) == window_jobs * 6


PHILLY = TRACES_DIR / "philly-slice.csv"


def test_philly_slice_meets_the_issue_target() -> None:
    """After two days of history: median |log error| >= 20% below the better baseline, p90 coverage 85-95%."""
    factories = default_factories()
    names = ("kumiki", "global-median", "last-two")
    scores = replay(load_jobs(PHILLY), {name: factories[name] for name in names}, start_s=172_800.0).scores
    better = min(scores["global-median"].median_abs_log_error, scores["last-two"].median_abs_log_error)
    assert scores["kumiki"].median_abs_log_error <= 0.8 * better
    assert 0.85 <= scores["kumiki"].p90_coverage <= 0.95
