"""The default forecaster weighs its experts and both baselines online, per key, by their recent error."""

from __future__ import annotations

import math
import random

import pytest

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.forecast.evaluate import replay, rolling_origin, verdicts
from kumiki.forecast.models import SelectionConfig, WeightedSelection, build_default_forecaster, weighted_median
from kumiki.sim.trace import TraceJob

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
    jobs = shifted_trace()
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


def test_rolling_origin_scores_every_day_against_the_better_baseline() -> None:
    rng = random.Random(1)
    jobs = [trace_job(f"j{i}", i * 600.0, 300.0 * math.exp(rng.gauss(0, 0.3)), queue="q") for i in range(3 * 144)]
    factories = {"kumiki": build_default_forecaster, "global-median": GlobalMedianSoFar, "last-two": LastTwoSameKey}
    evaluation = replay(jobs, factories)
    by_day = rolling_origin(evaluation)
    assert list(by_day) == ["day 0", "day 1", "day 2"]
    days = verdicts(by_day, "kumiki")
    assert [v.jobs for v in days] == [144, 144, 144]
    for verdict in days[1:]:
        assert verdict.better_baseline in ("global-median", "last-two")
        assert verdict.ratio <= 1.0  # on a steady key it is at least as good as the better baseline
