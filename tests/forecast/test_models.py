from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kumiki.forecast.evaluate import job_features, replay
from kumiki.forecast.models import (
    PRIOR_LOG_S,
    CalibrationConfig,
    ConformalP90,
    HistoryConfig,
    KeyedHistory,
    KumikiConfig,
    KumikiForecaster,
    QuantileRegression,
    QuantRegConfig,
    QuantRegForecaster,
    RollingWindow,
    SpreadConfig,
    build_default_forecaster,
    job_keys,
)
from kumiki.sched.forecasting import JobFeatures, tell_started

from .synthetic import keyed_trace, trace_job


def features(
    job_id: str, *, queue: str = "a", gpus: float = 1.0, user: str = "", name: str = "", submit_s: float = 0.0
) -> JobFeatures:
    return JobFeatures(job_id=job_id, queue=queue, user=user, gpus=gpus, name=name, submit_s=submit_s)


def test_rolling_window_quantiles_match_numpy_over_the_last_values() -> None:
    rng = random.Random(3)
    window = RollingWindow(50)
    values = [rng.lognormvariate(0, 2) for _ in range(237)]
    for value in values:
        window.add(value)
    assert len(window) == 50
    for level in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert window.quantile(level) == pytest.approx(float(np.quantile(values[-50:], level)))
    assert window.last(2) == values[-2:]


def test_keys_go_from_specific_to_global_and_skip_empty_user_and_name() -> None:
    philly = job_keys(features("x", queue="vc1", gpus=4))
    assert philly == (("qg", "vc1", "4"), ("q", "vc1"), ("all",))
    named = job_keys(features("x", queue="vc1", gpus=4, user="ann", name="resnet"))
    assert named[0] == ("k", "vc1", "ann", "4", "resnet")
    assert named[1:] == philly


def test_cold_key_falls_back_to_queue_then_global_then_prior() -> None:
    history = KeyedHistory(HistoryConfig(min_count=3))
    assert history.median(features("cold"), 100) == PRIOR_LOG_S
    for index in range(5):
        history.add(features(f"a{index}", queue="a", gpus=1), math.log(100.0))
        history.add(features(f"b{index}", queue="b", gpus=1), math.log(10_000.0))
    # Seen key: its own median.
    assert history.median(features("x", queue="a", gpus=1), 100) == pytest.approx(math.log(100.0))
    # Unseen GPU count in a known queue: the queue's median, not the other queue's.
    assert history.median(features("x", queue="a", gpus=8), 100) == pytest.approx(math.log(100.0))
    # Unseen queue: the global median, between the two queues.
    global_median = history.median(features("x", queue="new", gpus=8), 100)
    assert math.log(100.0) < global_median < math.log(10_000.0)
    # Too little history for a key (below min_count) also falls back to its queue.
    history.add(features("a8", queue="a", gpus=8), math.log(5.0))
    assert history.median(features("x", queue="a", gpus=8), 100) == pytest.approx(math.log(100.0))


def test_forecaster_error_drops_as_it_learns_a_keyed_structure() -> None:
    # Run times well inside the trace's span (600 jobs x 30 s), so every queue's jobs finish and teach.
    jobs = keyed_trace(600, medians_s={"a": 30.0, "b": 300.0, "c": 3_000.0}, gap_s=30.0)
    early = replay(jobs, {"kumiki": build_default_forecaster}, end_s=900.0).scores["kumiki"]
    late = replay(jobs, {"kumiki": build_default_forecaster}, start_s=9_000.0).scores["kumiki"]
    assert late.median_abs_log_error < early.median_abs_log_error / 2
    # Noise is N(0, 0.2) on log run time: the median |error| of a perfect median forecast is ~0.135.
    assert late.median_abs_log_error < 0.25


def test_kumiki_beats_global_median_when_keys_differ() -> None:
    from kumiki.forecast.baselines import GlobalMedianSoFar

    jobs = keyed_trace(900, medians_s={"a": 60.0, "b": 3_600.0, "c": 86_400.0}, gap_s=10.0)
    scores = replay(jobs, {"kumiki": build_default_forecaster, "global": GlobalMedianSoFar}, start_s=3_000.0).scores
    assert scores["kumiki"].median_abs_log_error < 0.5 * scores["global"].median_abs_log_error


def test_p90_is_calibrated_and_tighter_for_steady_keys() -> None:
    jobs = keyed_trace(
        4_000, medians_s={"steady": 600.0, "erratic": 600.0}, sigma={"steady": 0.1, "erratic": 1.5}, gap_s=1.0
    )
    forecaster = KumikiForecaster()
    result = replay(jobs, {"kumiki": lambda: forecaster}, start_s=1_000.0).scores["kumiki"]
    assert 0.85 <= result.p90_coverage <= 0.95
    steady = forecaster.predict(features("s", queue="steady"))
    erratic = forecaster.predict(features("e", queue="erratic"))
    assert steady.p90_s / steady.p50_s < erratic.p90_s / erratic.p50_s
    # The p90 of the steady key sits near its true 90% quantile: 600 * e^(1.2816 * 0.1).
    assert steady.p90_s == pytest.approx(600.0 * math.exp(1.2816 * 0.1), rel=0.15)


def test_log_sigma_follows_each_keys_true_spread_and_is_absent_before_any_history() -> None:
    forecaster = KumikiForecaster()
    assert forecaster.predict(features("cold")).log_sigma is None
    jobs = keyed_trace(
        4_000, medians_s={"steady": 600.0, "erratic": 600.0}, sigma={"steady": 0.1, "erratic": 1.5}, gap_s=1.0
    )
    replay(jobs, {"kumiki": lambda: forecaster}, start_s=1_000.0)
    steady = forecaster.predict(features("s", queue="steady")).log_sigma
    erratic = forecaster.predict(features("e", queue="erratic")).log_sigma
    assert steady is not None and erratic is not None
    assert steady == pytest.approx(0.1, rel=0.35)
    assert erratic == pytest.approx(1.5, rel=0.25)


def residuals_fed(values: list[float], *, queue: str = "a") -> ConformalP90:
    calibration = ConformalP90(CalibrationConfig())
    for value in values:
        calibration.update(features("r", queue=queue), value, None)
    return calibration


def test_spread_leaves_out_the_bias_that_the_p90_offset_must_carry() -> None:
    # A key whose forecasts run 20x short (residuals around +3) but vary little around that.
    rng = random.Random(3)
    calibration = residuals_fed([3.0 + rng.gauss(0.0, 0.2) for _ in range(300)])
    job = features("x")
    assert calibration.offset(job) > 3.0  # the p90 must cover the bias
    sigma = calibration.spread(job, SpreadConfig())
    assert sigma is not None and sigma == pytest.approx(0.2, rel=0.35)
    # read off the p90 instead, the same key would look more than ten times as uncertain
    assert calibration.offset(job) / 1.2816 > 10 * sigma


def test_spread_of_a_young_key_falls_back_to_or_shrinks_towards_its_parent_level() -> None:
    rng = random.Random(5)
    calibration = residuals_fed([rng.gauss(0.0, 2.0) for _ in range(400)], queue="wide")
    for _ in range(20):  # a second queue: 20 residuals with almost no spread
        calibration.update(features("n", queue="narrow"), rng.gauss(0.0, 0.01), None)
    overall = calibration.spread(features("g", queue="unseen"), SpreadConfig())
    narrow = features("n", queue="narrow")
    own = calibration.spread(narrow, SpreadConfig())
    too_young = calibration.spread(narrow, SpreadConfig(min_residuals=21))
    shrunk = calibration.spread(narrow, SpreadConfig(shrink=20.0))
    assert overall is not None and own is not None and too_young is not None and shrunk is not None
    assert own < 0.05 < 1.0 < overall  # a key with history uses its own spread
    assert too_young == pytest.approx(overall)  # below min_residuals: the parent level's (here the global)
    assert own < shrunk < overall
    assert ConformalP90(CalibrationConfig()).spread(narrow, SpreadConfig()) is None


def test_coverage_correction_reacts_when_run_times_shift_up() -> None:
    # All these jobs share one submit time, which would look like one sweep: test the ensemble path.
    forecaster = KumikiForecaster(KumikiConfig(burst_min_jobs=0))
    rng = random.Random(1)
    for index in range(500):
        job = features(f"warm{index}")
        forecaster.predict(job)
        forecaster.observe(job, 100.0 * math.exp(rng.gauss(0, 0.3)), float(index))
    before = forecaster.calibration.correction
    for index in range(50):  # every job now takes 10x longer than forecast: every p90 misses
        job = features(f"shift{index}")
        forecaster.predict(job)
        forecaster.observe(job, 1_000.0, float(500 + index))
    # Both mechanisms react: the global correction rises on the misses, and the key's residual
    # quantile moves once a tenth of its window has shifted, so the p90 covers the new run time.
    assert forecaster.calibration.correction > before + 0.05
    assert forecaster.predict(features("after")).p90_s >= 1_000.0


def test_forecast_carries_model_name_and_a_version_that_counts_updates() -> None:
    forecaster = build_default_forecaster()
    first = forecaster.predict(features("j1"))
    # the default names the expert it weighs most (equal weights before any record: the first)
    assert first.model == "kumiki/kumiki-ensemble"
    assert first.model_version == 0
    assert first.p50_s == pytest.approx(math.exp(PRIOR_LOG_S))
    forecaster.observe(features("j1"), 42.0, 42.0)
    forecaster.observe(features("j2"), 43.0, 43.0)  # never forecast (warm start): still learned
    assert forecaster.predict(features("j3")).model_version == 2


def test_forecaster_is_deterministic() -> None:
    jobs = keyed_trace(300, medians_s={"a": 30.0, "b": 900.0}, sigma={"a": 1.0, "b": 1.0}, gap_s=5.0)
    first = replay(jobs, {"m": build_default_forecaster}).predictions
    second = replay(jobs, {"m": build_default_forecaster}).predictions
    assert first == second


def test_unknown_expert_is_rejected() -> None:
    with pytest.raises(ValueError, match="experts"):
        KumikiForecaster(KumikiConfig(experts=("crystal-ball",)))


def test_quantile_regression_recovers_a_linear_relation() -> None:
    rng = np.random.default_rng(5)
    regression = QuantileRegression(QuantRegConfig(refit_every=10_000, window=2_000, min_rows=1_000))
    noise = rng.laplace(0.0, 0.5, size=1_000)
    for x, error in zip(rng.uniform(0, 5, size=1_000), noise, strict=True):
        regression.add((1.0, float(x)), 1.0 + 2.0 * float(x) + float(error))
    assert regression.version == 1
    assert regression.coef_p50 is not None
    assert regression.coef_p50 == pytest.approx([1.0, 2.0], abs=0.15)
    predicted = regression.predict((1.0, 2.0))
    assert predicted is not None
    log_p50, log_p90 = predicted
    assert log_p50 == pytest.approx(5.0, abs=0.15)
    # Laplace(0, b) has its 90% quantile at b*ln(5) above the median.
    assert log_p90 - log_p50 == pytest.approx(0.5 * math.log(5.0), abs=0.2)


def test_quantreg_forecaster_refits_periodically_not_per_job() -> None:
    config = QuantRegConfig(refit_every=200, window=1_000, min_rows=100)
    forecaster = QuantRegForecaster(config)
    jobs = keyed_trace(700, medians_s={"a": 60.0, "b": 6_000.0}, gap_s=1.0)
    for job in jobs:
        assert job.duration_s is not None
        forecaster.predict(job_features(job))
        forecaster.observe(job_features(job), job.duration_s, 0.0)
    # First fit at 100 rows, then one per 200 completions: 100, 300, 500, 700.
    assert forecaster.regression.version == 4
    forecast = forecaster.predict(job_features(trace_job("new", 0.0, None, queue="b")))
    assert forecast.model == "quantreg"
    assert forecast.p90_s >= forecast.p50_s
    assert abs(math.log(forecast.p50_s / 6_000.0)) < 0.3


def test_finished_jobs_of_the_same_burst_predict_the_rest_of_it() -> None:
    """Sweeps: bursts of 20 near-identical jobs a minute apart, each burst with its own run time."""
    rng = random.Random(9)
    jobs = []
    for burst in range(12):
        runtime = rng.choice((90.0, 900.0, 9_000.0)) * rng.uniform(0.5, 2.0)
        for index in range(20):
            submit = burst * 40_000.0 + index * 30.0
            jobs.append(trace_job(f"b{burst}-{index}", submit, runtime * math.exp(rng.gauss(0, 0.05))))
    forecaster = KumikiForecaster()
    evaluation = replay(jobs, {"kumiki": lambda: forecaster}, start_s=80_000.0)
    by_path: dict[str, list[float]] = {}
    for p in evaluation.predictions:
        by_path.setdefault(p.chosen, []).append(abs(math.log(p.p50_s / p.actual_s)))
    # Only the 90 s bursts finish while they are still being submitted; there the burst expert
    # takes over and is nearly exact, while the ensemble can only guess from earlier bursts.
    assert "kumiki/burst" in by_path
    assert max(by_path["kumiki/burst"]) < 0.2
    assert sum(by_path["kumiki/ensemble"]) / len(by_path["kumiki/ensemble"]) > 0.5
    # Disabled, the same jobs get the ensemble.
    plain = KumikiForecaster(KumikiConfig(burst_min_jobs=0))
    assert {p.chosen for p in replay(jobs, {"k": lambda: plain}).predictions} == {"kumiki/ensemble"}


def test_open_forecasts_are_bounded_and_a_requery_is_one_sibling(monkeypatch: pytest.MonkeyPatch) -> None:
    import kumiki.forecast.models.history as models

    monkeypatch.setattr(models, "MAX_OPEN_FORECASTS", 10)
    forecaster = KumikiForecaster()
    for index in range(25):  # jobs that never report their end
        forecaster.predict(features(f"lost{index}"))
    assert len(forecaster._issued) == 10
    # Three siblings finish; the fourth is forecast twice: it must still count once among siblings.
    for index in range(3):
        sibling = features(f"s{index}")
        forecaster.predict(sibling)
        forecaster.observe(sibling, 100.0, 100.0)
    query = features("q")
    first = forecaster.predict(query)
    again = forecaster.predict(query)
    assert first.model == again.model == "kumiki/burst"
    assert again.p50_s == pytest.approx(first.p50_s)


def test_quantreg_extrapolating_wildly_is_capped_at_a_year_not_an_overflow() -> None:
    """A fit on few runs can extrapolate to exp(1000); the replay's excerpt hit it (OverflowError in predict)."""
    forecaster = QuantRegForecaster()
    forecaster.regression.predict = lambda row: (1000.0, 1001.0)  # type: ignore[method-assign]
    forecast = forecaster.predict(features("j1"))
    assert forecast.p50_s == forecast.p90_s == pytest.approx(365 * 86400.0)


def test_a_running_job_past_its_p90_is_counted_a_miss_before_it_ends() -> None:
    calibration = residuals_fed([random.Random(2).gauss(0.0, 0.3) for _ in range(300)])
    calibration.started("long", log_p90=math.log(100.0), start_s=0.0)
    calibration.advance(99.0)
    assert calibration.correction == 0.0  # not yet past its p90
    calibration.advance(101.0)
    missed = calibration.correction
    assert missed == pytest.approx(CalibrationConfig().step * 0.9)
    calibration.advance(10_000.0)  # counted once, however long it runs
    calibration.update(features("long"), 3.0, covered=False)  # the miss it ended with was already counted
    assert calibration.correction == pytest.approx(missed)


def test_a_miss_counted_while_running_becomes_a_cover_if_the_job_ends_within_its_p90() -> None:
    # wall time since the start overstates run time when a job is preempted: the ending corrects the count
    calibration = residuals_fed([0.0] * 300)
    calibration.started("paused", log_p90=math.log(100.0), start_s=0.0)
    calibration.advance(500.0)
    calibration.update(features("paused"), 0.0, covered=True)
    step = CalibrationConfig().step
    assert calibration.correction == pytest.approx(-step * 0.1)  # exactly one covered outcome
    calibration.started("finished", log_p90=math.log(100.0), start_s=600.0)
    calibration.update(features("finished"), 0.0, covered=True)
    calibration.advance(5_000.0)  # already ended: nothing to count
    assert calibration.correction == pytest.approx(-step * 0.2)


def test_a_sweep_of_long_runs_widens_the_p90_before_any_of_them_finishes() -> None:
    # A key whose runs take ~100 s; then a sweep of 10x longer jobs, one submitted every 100 s. Told when
    # they start, the forecaster widens the p90 of the later ones while all of the sweep is still running.
    def run(listens: bool) -> float:
        rng = random.Random(4)
        forecaster = build_default_forecaster()
        for index in range(400):
            job = features(f"w{index}", submit_s=float(index))
            forecaster.predict(job)
            forecaster.observe(job, 100.0 * math.exp(rng.gauss(0.0, 0.2)), float(index) + 0.5)
        for index in range(60):
            job = features(f"sweep{index}", submit_s=1_000.0 + 100.0 * index)
            last = forecaster.predict(job)
            if listens:
                tell_started(forecaster, job.job_id, job.submit_s)
        return last.p90_s

    assert run(listens=True) > 1.2 * run(listens=False)
