import pytest

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import JobView, OracleJobView
from kumiki.sched.policies import (
    NO_FORECAST_FLOOR_S,
    POLICIES,
    estimate_remaining,
    policy_named,
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
