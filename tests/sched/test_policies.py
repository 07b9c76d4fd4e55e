import dataclasses
import math

import pytest

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import JobView, OracleJobView
from kumiki.sched.policies import (
    GITTINS_TAIL_SIGMA,
    GITTINS_TAIL_WEIGHT,
    NO_FORECAST_FLOOR_S,
    NO_FORECAST_P50_S,
    NO_FORECAST_P90_S,
    POLICIES,
    Z90,
    estimate_remaining,
    gittins_rank,
    policy_named,
    posterior_trust,
    preempt_margin,
    running_rank,
    tiresias_level,
    waiting_key,
)


def view(**kwargs):
    features = JobFeatures("j", "q", "", 1.0, "", 0.0)
    return JobView(features=features, gpus=1, queue="q", submit_s=5.0, **kwargs)


def test_policy_names_cover_the_issue():
    assert set(POLICIES) >= {
        "fifo",
        "fifo-backfill",
        "sjf-oracle",
        "srtf-oracle",
        "tiresias",
        "kumiki",
        "kumiki-oracle",
        "kumiki-noforecast",
    }
    with pytest.raises(ValueError, match="unknown policy"):
        policy_named("lottery")


def test_only_oracles_are_marked_oracle():
    for name, policy in POLICIES.items():
        assert policy.oracle == name.endswith("-oracle")


def test_oracle_policies_refuse_views_without_the_truth():
    with pytest.raises(TypeError):
        waiting_key(POLICIES["sjf-oracle"], view())
    with pytest.raises(TypeError):
        estimate_remaining(POLICIES["kumiki-oracle"], view(), 0.0)


def test_forecast_estimate_moves_through_quantiles():
    policy = POLICIES["kumiki"]
    forecast = RuntimeForecast(p50_s=100.0, p90_s=1000.0, model="m", model_version=1)
    job = view(forecast=forecast)
    assert estimate_remaining(policy, job, 0.0) == 100.0
    assert estimate_remaining(policy, job, 0.0, pessimistic=True) == 1000.0
    assert estimate_remaining(policy, job, 500.0) == 500.0  # past p50: towards p90
    assert estimate_remaining(policy, job, 5000.0) == 5000.0  # past p90: as long again
    # no forecast: attained service, never below the floor
    assert estimate_remaining(POLICIES["kumiki-noforecast"], job, 0.0) == NO_FORECAST_FLOOR_S


def test_keys():
    oracle = OracleJobView(
        features=JobFeatures("j", "q", "", 1.0, "", 0.0),
        gpus=1,
        queue="q",
        submit_s=5.0,
        executed_s=30.0,
        remaining_s=70.0,
    )
    assert waiting_key(POLICIES["sjf-oracle"], oracle) == 100.0
    assert waiting_key(POLICIES["srtf-oracle"], oracle) == 70.0
    assert waiting_key(POLICIES["fifo"], view()) == 5.0
    assert tiresias_level(0.0) == 0 and tiresias_level(3600.0) == 1 and tiresias_level(1e9) == 3


def survival(t: float, p50: float, sigma: float, tail_weight: float, tail_sigma: float) -> float:
    """P(S > t) for the forecast mixture, written out independently of the policy's table."""
    z = math.log(t / p50)
    upper = 0.5 * math.erfc(z / sigma / math.sqrt(2.0))
    wide = 0.5 * math.erfc(z / tail_sigma / math.sqrt(2.0))
    return (1.0 - tail_weight) * upper + tail_weight * wide


def brute_force_rank(p50: float, p90: float, attained: float, tail_weight: float, tail_sigma: float) -> float:
    """1 / sup_b P(a < S <= b | S > a) / E[min(S, b) - a | S > a], by direct integration on a log grid."""
    sigma = math.log(p90 / p50) / 1.2815515655446004
    start = max(attained, p50 * 1e-6)
    points = [start * math.exp(step * 0.002) for step in range(1, 12_000)]
    base = survival(start, p50, sigma, tail_weight, tail_sigma)
    best, work, previous, previous_survival = 0.0, 0.0, start, base
    for t in points:
        current = survival(t, p50, sigma, tail_weight, tail_sigma)
        work += 0.5 * (current + previous_survival) * (t - previous)
        best = max(best, (base - current) / work)
        previous, previous_survival = t, current
    return 1.0 / best


@pytest.mark.parametrize(
    ("p50", "p90", "attained"),
    [
        (100.0, 200.0, 0.0),
        (100.0, 200.0, 150.0),
        (3600.0, 36_000.0, 0.0),
        (3600.0, 36_000.0, 50_000.0),
        (60.0, 65.0, 30.0),
    ],
)
def test_gittins_rank_matches_a_direct_computation(p50, p90, attained):
    expected = brute_force_rank(p50, p90, attained, GITTINS_TAIL_WEIGHT, GITTINS_TAIL_SIGMA)
    assert gittins_rank(p50, p90, attained) == pytest.approx(expected, rel=0.03)


def test_gittins_rank_is_srpt_for_a_point_forecast():
    # no tail and p90 == p50: the run time is known, so the rank is the remaining time
    for attained in (0.0, 100.0, 500.0, 900.0):
        assert gittins_rank(1000.0, 1000.0, attained, tail_weight=0.0) == pytest.approx(1000.0 - attained, rel=0.02)
    jobs = [(500.0, 0.0), (2000.0, 1800.0), (800.0, 100.0), (3000.0, 0.0)]
    ranks = [gittins_rank(size, size, done, tail_weight=0.0) for size, done in jobs]
    remaining = [size - done for size, done in jobs]
    assert sorted(range(4), key=ranks.__getitem__) == sorted(range(4), key=remaining.__getitem__)


def test_gittins_rank_scales_with_the_forecast():
    for attained in (0.0, 50.0, 500.0):
        assert gittins_rank(1000.0, 3000.0, attained * 10) == pytest.approx(10 * gittins_rank(100.0, 300.0, attained))


def test_gittins_rank_falls_towards_the_median_then_grows_like_las_in_the_tail():
    # a tight forecast: the closer to the median, the sooner the job is expected to finish (SRPT-like)
    near = [gittins_rank(1000.0, 1100.0, attained) for attained in (0.0, 300.0, 600.0, 900.0)]
    assert near == sorted(near, reverse=True)
    # far past its forecast the wide tail rules: the longer it has run, the lower its priority (LAS-like)
    tail = [gittins_rank(1000.0, 1100.0, attained) for attained in (5_000.0, 20_000.0, 100_000.0, 1e6)]
    assert tail == sorted(tail) and tail[-1] > 10 * tail[0]


def test_kumiki_keys_use_forecast_and_gpus_and_the_oracle_uses_the_truth():
    features = JobFeatures("j", "q", "", 4.0, "", 0.0)
    forecast = RuntimeForecast(p50_s=1000.0, p90_s=3000.0, model="m", model_version=1)
    job = JobView(features=features, gpus=4, queue="q", submit_s=0.0, forecast=forecast)
    assert waiting_key(POLICIES["kumiki"], job) == pytest.approx(4 * gittins_rank(1000.0, 3000.0, 0.0))
    truth = OracleJobView(features=features, gpus=4, queue="q", submit_s=0.0, executed_s=10.0, remaining_s=90.0)
    assert waiting_key(POLICIES["kumiki-oracle"], truth) == pytest.approx(4 * 90.0)
    # the oracle's running rank is SRPT on the truth, counted down as it runs
    assert running_rank(POLICIES["kumiki-oracle"], truth, 40.0, 0.0) == pytest.approx(4 * 60.0)
    # no forecast: the same index on one wide prior for every job
    blind = JobView(features=features, gpus=4, queue="q", submit_s=0.0, forecast=forecast)
    assert waiting_key(POLICIES["kumiki-noforecast"], blind) == pytest.approx(
        4 * gittins_rank(NO_FORECAST_P50_S, NO_FORECAST_P90_S, 0.0)
    )


def test_kumiki_reads_the_forecasts_log_sigma_in_place_of_its_p90_when_given():
    features = JobFeatures("j", "q", "", 2.0, "", 0.0)
    # a p90 1,500x the median, but a forecaster that knows its errors are mostly small
    forecast = RuntimeForecast(p50_s=1000.0, p90_s=1.5e6, model="m", model_version=1, log_sigma=0.3)
    job = JobView(features=features, gpus=2, queue="q", submit_s=0.0, forecast=forecast)
    tight = 2 * gittins_rank(1000.0, 1000.0 * math.exp(Z90 * 0.3), 0.0)
    assert waiting_key(POLICIES["kumiki"], job) == pytest.approx(tight)
    from_p90 = 2 * gittins_rank(1000.0, 1.5e6, 0.0)
    # read off the p90 (sigma clamped to 4), a fresh job looks likely to end at once and jumps the queue
    assert from_p90 < 0.1 * tight
    ignoring = dataclasses.replace(POLICIES["kumiki"], use_log_sigma=False)
    assert waiting_key(ignoring, job) == pytest.approx(from_p90)
    # a fixed sigma overrides both
    fixed = dataclasses.replace(POLICIES["kumiki"], forecast_sigma=1.0)
    assert waiting_key(fixed, job) == pytest.approx(2 * gittins_rank(1000.0, 1000.0 * math.exp(Z90), 0.0))


def test_kumiki_variants_differ_only_in_what_they_know():
    kumiki = POLICIES["kumiki"]
    oracle = POLICIES["kumiki-oracle"]
    assert dataclasses.replace(oracle, name="kumiki", oracle=False, uses_forecast=True) == kumiki


def test_trust_mixes_the_forecast_rank_towards_the_forecast_free_one():
    trusting = POLICIES["kumiki-trust"]
    features = JobFeatures("j", "q", "", 1.0, "", 0.0)

    def key(trust, executed_s=0.0):
        forecast = RuntimeForecast(1e5, 2e5, "m", 1, log_sigma=0.3, trust=trust)
        job = JobView(features=features, gpus=1, queue="q", submit_s=0.0, forecast=forecast, executed_s=executed_s)
        return waiting_key(trusting, job)

    blind = gittins_rank(NO_FORECAST_P50_S, NO_FORECAST_P90_S, 0.0)
    sharp = gittins_rank(1e5, 1e5 * math.exp(Z90 * 0.3), 0.0)
    assert key(0.0) == pytest.approx(blind)  # no trust: exactly the kumiki-noforecast order
    assert key(1.0) == pytest.approx(sharp)  # full trust: exactly the forecast's
    assert key(None) == pytest.approx(sharp)  # a model that measures no trust is fully trusted
    assert blind < key(0.5) < sharp  # in between, monotone in trust
    assert key(0.2) < key(0.5) < key(0.8)
    # `kumiki` itself ignores trust (measured: docs/design/0003-forecast-trust.md)
    plain = JobView(
        features=features, gpus=1, queue="q", submit_s=0.0, forecast=RuntimeForecast(1e5, 2e5, "m", 1, 0.3, 0.0)
    )
    assert waiting_key(POLICIES["kumiki"], plain) == pytest.approx(sharp)


def test_a_job_outliving_its_forecast_shifts_belief_to_the_prior():
    # forecast 60 s, tight; having run an hour, the forecast hypothesis has all but lost
    assert posterior_trust(0.9, 60.0, 70.0, 0.0) == pytest.approx(0.9)
    assert posterior_trust(0.9, 60.0, 70.0, 30.0) > 0.85
    assert posterior_trust(0.9, 60.0, 70.0, 3600.0) < 0.5
    assert posterior_trust(0.0, 60.0, 70.0, 3600.0) == 0.0


def test_kumiki_orders_on_the_keys_measured_error_and_on_the_claimed_spread_without_one():
    features = JobFeatures("j", "q", "", 1.0, "", 0.0)
    forecast = RuntimeForecast(1000.0, 3000.0, "m", 1, log_sigma=0.3, error_sigma=1.5)
    job = JobView(features=features, gpus=1, queue="q", submit_s=0.0, forecast=forecast)
    assert waiting_key(POLICIES["kumiki"], job) == pytest.approx(
        gittins_rank(1000.0, 1000.0 * math.exp(Z90 * 1.5), 0.0)
    )
    claimed = dataclasses.replace(POLICIES["kumiki"], use_error_sigma=False)  # before the seventeenth step
    assert waiting_key(claimed, job) == pytest.approx(gittins_rank(1000.0, 1000.0 * math.exp(Z90 * 0.3), 0.0))
    unmeasured = dataclasses.replace(job, forecast=dataclasses.replace(forecast, error_sigma=None))
    assert waiting_key(POLICIES["kumiki"], unmeasured) == waiting_key(claimed, job)


def test_the_preemption_margin_is_read_off_both_forecasts_error_spreads():
    kumiki = POLICIES["kumiki"]

    def job(job_id: str, forecast: RuntimeForecast | None) -> JobView:
        return JobView(JobFeatures(job_id, "q", "", 1.0, "", 0.0), 1, "q", 0.0, forecast=forecast)

    sharp = job("sharp", RuntimeForecast(1000.0, 3000.0, "m", 1, log_sigma=0.3, error_sigma=0.2))
    wide = job("wide", RuntimeForecast(1000.0, 3000.0, "m", 1, log_sigma=0.3, error_sigma=1.5))
    ratio = kumiki.preempt_ratio
    assert preempt_margin(kumiki, sharp, wide, 0.0) == pytest.approx(ratio * math.exp(Z90 * math.hypot(0.2, 1.5)))
    assert preempt_margin(kumiki, sharp, wide, 0.0) == preempt_margin(kumiki, wide, sharp, 0.0)
    # the error's margin multiplies the one kept on exact run times: two well-forecast keys evict a little past
    # it, never more eagerly than on exact run times; two badly forecast ones hardly by rank
    both_sharp, both_wide = preempt_margin(kumiki, sharp, sharp, 0.0), preempt_margin(kumiki, wide, wide, 0.0)
    assert ratio < both_sharp < 1.5 * ratio < both_wide
    # the ninth step's margin, the error's alone: near SRPT's 1 for well-forecast keys
    alone = dataclasses.replace(kumiki, spread_over_ratio=False)
    assert preempt_margin(alone, sharp, sharp, 0.0) == pytest.approx(both_sharp / ratio)
    assert 1.0 < preempt_margin(alone, sharp, sharp, 0.0) < 1.5
    # a claimed spread is not a record: a key with no measured error yet (however tight its log_sigma or p90)
    # gets the forecast-free margin, as does a job without a forecast
    claimed = job("claimed", RuntimeForecast(1000.0, 1100.0, "m", 1, log_sigma=0.05))
    assert preempt_margin(kumiki, claimed, claimed, 0.0) == kumiki.preempt_ratio == 4.0
    assert preempt_margin(kumiki, sharp, claimed, 0.0) == kumiki.preempt_ratio
    assert preempt_margin(kumiki, claimed, sharp, 0.0) == kumiki.preempt_ratio
    assert preempt_margin(kumiki, sharp, job("none", None), 0.0) == kumiki.preempt_ratio
    # and the policies that use no forecasts keep it whatever the views carry
    for name in ("kumiki-noforecast", "kumiki-oracle"):
        assert preempt_margin(POLICIES[name], sharp, sharp, 0.0) == POLICIES[name].preempt_ratio == 4.0


def test_a_victim_past_its_forecast_is_held_to_at_most_the_forecast_free_margin():
    """Past p50 x e^(Z90 x its error) the victim's rank is its attained service's, not its forecast's."""
    kumiki = POLICIES["kumiki"]

    def job(job_id: str, error_sigma: float) -> JobView:
        forecast = RuntimeForecast(1000.0, 3000.0, "m", 1, log_sigma=0.3, error_sigma=error_sigma)
        return JobView(JobFeatures(job_id, "q", "", 1.0, "", 0.0), 1, "q", 0.0, forecast=forecast)

    wide, sharp = job("wide", 1.5), job("sharp", 0.2)
    full = kumiki.preempt_ratio * math.exp(Z90 * math.hypot(1.5, 1.5))
    edge = 1000.0 * math.exp(Z90 * 1.5)  # the wide victim's p90 by its measured error: ~6,800 s
    assert full > kumiki.preempt_ratio
    assert preempt_margin(kumiki, wide, wide, 0.0) == pytest.approx(full)
    assert preempt_margin(kumiki, wide, wide, 0.99 * edge) == pytest.approx(full)
    assert preempt_margin(kumiki, wide, wide, 1.01 * edge) == kumiki.preempt_ratio
    # a cap, not a floor: with the error's margin alone (the ninth step's), two well-forecast keys keep their own
    # smaller margin past it
    alone = dataclasses.replace(kumiki, spread_over_ratio=False)
    assert preempt_margin(alone, sharp, sharp, 1e6) == pytest.approx(math.exp(Z90 * math.hypot(0.2, 0.2)))
    assert preempt_margin(kumiki, sharp, sharp, 1e6) == kumiki.preempt_ratio
    # the measured error sets the edge: a sharp victim is past its forecast long before a wide one
    assert preempt_margin(kumiki, wide, sharp, 2000.0) == kumiki.preempt_ratio
    assert preempt_margin(kumiki, sharp, wide, 2000.0) == pytest.approx(
        kumiki.preempt_ratio * math.exp(Z90 * math.hypot(0.2, 1.5))
    )
    uncapped = dataclasses.replace(kumiki, cap_margin_past_forecast=False)
    assert preempt_margin(uncapped, wide, wide, 1e6) == pytest.approx(full)
