"""The default forecaster weighs its experts and both baselines online, per key, by their recent error."""

from __future__ import annotations

import math
import random

import pytest

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.forecast.evaluate import replay, rolling_origin, verdicts
from kumiki.forecast.models import (
    SelectionConfig,
    WeightedSelection,
    build_default_forecaster,
    job_keys,
    weighted_median,
)
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, tell_started, tell_stopped
from kumiki.sim.trace import TraceJob
from kumiki.sim.workload import featured_trace, without_pod_features

from .synthetic import trace_job


def test_weighted_median_follows_the_weight() -> None:
    assert weighted_median((1.0, 2.0, 3.0), (1.0, 1.0, 1.0)) == 2.0
    assert weighted_median((1.0, 2.0, 3.0), (0.1, 0.1, 0.8)) == 3.0
    assert weighted_median((3.0, 1.0), (0.6, 0.4)) == 3.0
    with pytest.raises(ValueError):
        WeightedSelection(SelectionConfig(experts=("no-such-model",)))


def shifted_trace(seed: int = 5) -> list[TraceJob]:
    """Queue "a" runs ~100 s, then 10x longer from job 600 on; queue "b" stays at ~5,000 s throughout."""
    rng = random.Random(seed)
    jobs = []
    for index in range(1200):
        queue = "a" if index % 3 else "b"
        base = 5_000.0 if queue == "b" else (100.0 if index < 600 else 1_000.0)
        jobs.append(trace_job(f"j{index}", index * 30.0, base * math.exp(rng.gauss(0.0, 0.1)), queue=queue))
    return jobs


def test_after_a_tenfold_shift_the_weight_moves_to_the_models_that_follow_it() -> None:
    jobs = shifted_trace()[:800]  # 200 jobs after the shift: the long-memory models still say ~100 s for queue a
    factories = {"kumiki": build_default_forecaster, "global-median": GlobalMedianSoFar, "last-two": LastTwoSameKey}
    forecaster = WeightedSelection()
    evaluation = replay(jobs, {**factories, "probe": lambda: forecaster}, start_s=600 * 30.0 + 3_000.0)
    # Queue a's long history says 100 s; after the shift the per-key recent models are right and win the weight.
    weights = forecaster.weights(forecaster_features("a"))
    assert weights["last-two"] + weights["history-100"] > weights["history-median"] + weights["global-median"]
    scores = evaluation.scores
    better = min(scores["global-median"].median_abs_log_error, scores["last-two"].median_abs_log_error)
    assert scores["kumiki"].median_abs_log_error <= better + 0.02
    assert scores["kumiki"].median_abs_log_error < 0.5 * scores["global-median"].median_abs_log_error


def forecaster_features(queue: str):  # type: ignore[no-untyped-def]
    from kumiki.sched.forecasting import JobFeatures

    return JobFeatures("probe", queue, "", 1.0, "", 1e9)


def test_a_new_queue_with_no_history_gets_the_parent_levels_forecast_and_trust() -> None:
    forecaster = WeightedSelection()
    jobs = shifted_trace()[:300]
    replay(jobs, {"probe": lambda: forecaster})
    fresh = forecaster.predict(forecaster_features("never-seen"))
    assert fresh.trust is not None and 0.0 <= fresh.trust <= 1.0
    # the cluster-level record answers: a forecast between the two queues' run times, with a spread
    assert 50.0 < fresh.p50_s < 10_000.0 and fresh.p90_s >= fresh.p50_s and fresh.log_sigma is not None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rolling_origin_scores_every_day_against_the_better_baseline(seed: int) -> None:
    rng = random.Random(seed)
    jobs = [trace_job(f"j{i}", i * 600.0, 300.0 * math.exp(rng.gauss(0, 0.3)), queue="q") for i in range(3 * 144)]
    factories = {"kumiki": build_default_forecaster, "global-median": GlobalMedianSoFar, "last-two": LastTwoSameKey}
    evaluation = replay(jobs, factories)
    by_day = rolling_origin(evaluation)
    assert list(by_day) == ["day 0", "day 1", "day 2"]
    days = verdicts(by_day, "kumiki")
    assert [v.jobs for v in days] == [144, 144, 144]
    for verdict in days[1:]:
        assert verdict.better_baseline in ("global-median", "last-two")
        # One steady key (log-normal, sigma 0.3): every model estimates the same median, so the ratio is 1 up to
        # the sampling noise of which estimate the weighting follows (0.99-1.06 over seeds 1-5; a model that
        # followed a wrong one would be off by far more)
        assert verdict.ratio <= 1.1


class Constant:
    """An expert that always says the same run time."""

    def __init__(self, runtime_s: float) -> None:
        self.runtime_s = runtime_s

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        return RuntimeForecast(self.runtime_s, 2.0 * self.runtime_s, f"constant-{self.runtime_s:g}", 1)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        pass


def short_and_long(score_running: bool) -> WeightedSelection:
    factories = {"short": lambda: Constant(100.0), "long": lambda: Constant(10_000.0)}
    return WeightedSelection(SelectionConfig(experts=("short", "long"), score_running=score_running), factories)


def feature(job_id: str, submit_s: float) -> JobFeatures:
    return JobFeatures(job_id, "q", "", 1.0, "", submit_s)


def finish_short_runs(selection: WeightedSelection, count: int) -> None:
    """`count` jobs that ran 100 s each: the short expert exact, the long one 100x off (clipped to 3)."""
    for index in range(count):
        features = feature(f"done-{index}", index * 200.0)
        selection.predict(features)
        tell_started(selection, features.job_id, features.submit_s)
        selection.observe(features, 100.0, features.submit_s + 100.0)


@pytest.mark.parametrize("score_running", [True, False])
def test_running_jobs_past_an_experts_forecast_count_against_it_while_they_run(score_running: bool) -> None:
    selection = short_and_long(score_running)
    finish_short_runs(selection, 20)
    for index in range(30):  # a sweep starts at 10,000 s, and none of it has ended at 15,000 s
        selection.predict(feature(f"sweep-{index}", 10_000.0))
        tell_started(selection, f"sweep-{index}", 10_000.0)
    selection.predict(feature("probe", 15_000.0))  # the forecaster's clock moves with what it hears
    weights = selection.weights(feature("probe-2", 15_000.0))
    if score_running:
        # each sweep job has run 5,000 s: the short expert is at least 50x off on it (clipped to 3), the long
        # one not yet off at all; 30 such against 20 finished short runs make the long expert the better one
        assert weights["long"] > 0.9
    else:  # finished jobs alone: only the short runs, which the short expert got right
        assert weights["short"] > 0.9


def test_a_running_job_proves_nothing_until_it_outruns_a_forecast_and_its_end_replaces_the_bound() -> None:
    selection = short_and_long(score_running=True)
    finish_short_runs(selection, 20)
    selection.predict(feature("sweep", 10_000.0))
    tell_started(selection, "sweep", 10_000.0)
    before = selection.weights(feature("probe", 10_050.0))
    selection.predict(feature("probe", 10_050.0))  # 50 s into the run: under both forecasts, no bound yet
    assert selection.weights(feature("probe-2", 10_050.0)) == before
    tell_stopped(selection, "sweep", 10_060.0)  # preempted at 60 s: it does not age while it waits
    selection.predict(feature("probe-3", 50_000.0))
    assert selection.weights(feature("probe-4", 50_000.0)) == before
    tell_started(selection, "sweep", 50_000.0)
    selection.predict(feature("probe-5", 55_000.0))  # 5,060 s run: the short expert is off by >= log(50.6)
    assert selection.weights(feature("probe-6", 55_000.0))["short"] < before["short"]
    provisional = selection.weights(feature("probe-6", 55_000.0))
    selection.observe(feature("sweep", 10_000.0), 6_000.0, 55_940.0)  # its end: the true error replaces the bound
    assert selection.weights(feature("probe-7", 56_000.0)) != provisional
    reference = short_and_long(score_running=True)  # the same runs, without the probes and the wait
    finish_short_runs(reference, 20)
    reference.predict(feature("sweep", 10_000.0))
    tell_started(reference, "sweep", 10_000.0)
    reference.observe(feature("sweep", 10_000.0), 6_000.0, 55_940.0)
    assert selection.weights(feature("probe-7", 56_000.0)) == reference.weights(feature("probe-7", 56_000.0))


def test_the_jobs_own_script_is_the_most_specific_key_and_traces_without_it_keep_their_keys() -> None:
    plain = JobFeatures("j", "vc1", "alice", 1.0, "bert", 0.0)
    featured = JobFeatures("j", "vc1", "alice", 1.0, "bert", 0.0, "img:1", "python train.py", 7200.0)
    assert job_keys(plain) == (("k", "vc1", "alice", "1", "bert"), ("qg", "vc1", "1"), ("q", "vc1"), ("all",))
    assert job_keys(featured)[0] == ("s", "vc1", "alice", "1", "img:1", "python train.py", "7200")
    assert job_keys(featured)[1:] == job_keys(plain)
    renamed = JobFeatures("j", "vc1", "alice", 1.0, "bert-run-2", 0.0, "img:1", "python train.py", 7200.0)
    assert job_keys(renamed)[0] == job_keys(featured)[0], "a fresh job name is the same script"
    anonymous = JobFeatures("j", "vc1", "", 1.0, "", 0.0, "", "python eval.py")
    assert [key[0] for key in job_keys(anonymous)] == ["s", "qg", "q", "all"]


def test_no_forecast_exceeds_the_time_the_job_asked_for() -> None:
    forecaster = build_default_forecaster()
    for index in range(40):  # the key runs ten hours
        job = JobFeatures(f"long-{index}", "vc1", "alice", 1.0, "", float(index))
        forecaster.predict(job)
        forecaster.observe(job, 36_000.0, float(index) + 36_000.0)
    unlimited = forecaster.predict(JobFeatures("free", "vc1", "alice", 1.0, "", 50_000.0))
    limited = forecaster.predict(JobFeatures("capped", "vc1", "alice", 1.0, "", 50_000.0, time_limit_s=3600.0))
    assert unlimited.p50_s > 10_000.0
    assert (limited.p50_s, limited.p90_s) == (pytest.approx(3600.0), pytest.approx(3600.0))
    roomy = forecaster.predict(JobFeatures("roomy", "vc1", "alice", 1.0, "", 50_000.0, time_limit_s=1e7))
    assert (roomy.p50_s, roomy.p90_s) == (pytest.approx(unlimited.p50_s), pytest.approx(unlimited.p90_s))


def test_pod_features_let_the_forecaster_tell_scripts_apart() -> None:
    """Within a team's queue and GPU count run times differ by orders of magnitude from script to script; with the
    image, command and time limit the forecaster keys on the script, without them on (queue, GPUs) at best."""
    jobs = featured_trace(2000, total_gpus=32, seed=3)
    factories = {"kumiki": build_default_forecaster}
    with_features = replay(jobs, factories).scores["kumiki"]
    without = replay(without_pod_features(jobs), factories).scores["kumiki"]
    assert with_features.median_abs_log_error < 0.5 * without.median_abs_log_error
    assert 0.8 <= with_features.p90_coverage <= 0.97
