"""Trust in a key's forecasts: from their errors against the forecast-free prior, or from how well they order."""

from __future__ import annotations

import math
import random

import pytest

from kumiki.forecast.models import (
    ConcordanceTrust,
    ForecastTrust,
    SelectionConfig,
    TrustConfig,
    WeightedSelection,
    build_trust,
)
from kumiki.sched.forecasting import JobFeatures


def job(queue: str, index: int) -> JobFeatures:
    return JobFeatures(f"{queue}{index}", queue, "", 1.0, "", float(index))


def value(trust: ForecastTrust, queue: str) -> float:
    return trust.trust(job(queue, 0))


def test_exact_forecasts_are_trusted_and_noise_is_not_per_key() -> None:
    rng = random.Random(4)
    trust = ForecastTrust(TrustConfig())
    # Run times spread ~100x either way around the prior's half hour; noise forecasts are drawn from the
    # same distribution, independent of the run: no better than the prior, so no trust.
    center = math.log(1800.0)
    for index in range(400):
        actual = center + rng.gauss(0.0, 2.5)
        trust.update(job("exact", index), actual, actual + rng.gauss(0.0, 0.05))
        noisy = center + rng.gauss(0.0, 2.5)
        trust.update(job("noise", index), noisy, center + rng.gauss(0.0, 2.5))
    exact, noise = trust.trust(job("exact", 999)), trust.trust(job("noise", 999))
    assert exact > 0.95
    assert noise < 0.05


def test_trust_falls_when_a_key_shifts_and_recovers_when_its_forecasts_do() -> None:
    trust = ForecastTrust(TrustConfig(window=50))
    for index in range(100):
        trust.update(job("a", index), math.log(36_000.0), math.log(36_000.0))
    assert value(trust, "a") > 0.99
    for index in range(100, 140):  # the forecast still says 10 h, the runs now take 30 s
        trust.update(job("a", index), math.log(30.0), math.log(36_000.0))
    assert value(trust, "a") < 0.05
    for index in range(140, 200):
        trust.update(job("a", index), math.log(30.0), math.log(30.0))
    assert value(trust, "a") > 0.9


def test_no_trust_before_any_run() -> None:
    assert ForecastTrust().trust(job("a", 0)) == 0.0


def test_concordance_trusts_forecasts_that_order_right_however_far_off_they_are() -> None:
    rng = random.Random(7)
    by_error, by_order = ForecastTrust(TrustConfig()), ConcordanceTrust(TrustConfig())
    # one key, forecast 20x long every time: useless as a point estimate, exact as an order
    for index in range(300):
        actual = math.log(1800.0) + rng.gauss(0.0, 2.0)
        forecast = actual + math.log(20.0) + rng.gauss(0.0, 0.1)
        by_error.update(job("long", index), actual, forecast)
        by_order.update(job("long", index), actual, forecast)
    assert value(by_error, "long") < 0.05
    assert by_order.trust(job("long", 999)) > 0.99


def test_concordance_distrusts_reversed_forecasts_per_key() -> None:
    rng = random.Random(8)
    trust = ConcordanceTrust(TrustConfig())
    for index in range(300):
        actual = rng.gauss(7.5, 2.0)
        trust.update(job("right", index), actual, actual + rng.gauss(0.0, 0.3))
        reversed_actual = rng.gauss(7.5, 2.0)
        trust.update(job("reversed", index), reversed_actual, 15.0 - reversed_actual)
    assert trust.trust(job("right", 999)) > 0.99
    assert trust.trust(job("reversed", 999)) < 0.01


def test_concordance_scores_only_pairs_the_forecast_tells_apart() -> None:
    trust = ConcordanceTrust(TrustConfig())
    assert trust.score(5.0, 5.0) is None  # nothing to compare with yet
    trust.update(job("a", 0), math.log(100.0), math.log(600.0))
    trust.update(job("a", 1), math.log(900.0), math.log(600.0))
    # the same forecast as both references: a forecast-free order ties them too, so nothing is scored
    assert trust.score(math.log(50.0), math.log(600.0)) is None
    assert trust.score(math.log(50.0), math.log(60.0)) == 1.0  # shorter than both, and forecast so
    assert trust.score(math.log(500.0), math.log(60.0)) == 0.0  # one pair right, one wrong
    assert trust.trust(job("a", 2)) == 0.0  # no pair told apart yet: no record, no trust


def test_trust_measure_is_checked_and_reaches_the_forecasts() -> None:
    with pytest.raises(ValueError, match="trust measure"):
        build_trust(TrustConfig(measure="r2"))
    with pytest.raises(ValueError, match="window"):
        ConcordanceTrust(TrustConfig(window=1))
    forecaster = WeightedSelection(SelectionConfig(trust=TrustConfig(measure="concordance")))
    assert isinstance(forecaster.trust, ConcordanceTrust)
    rng = random.Random(9)
    for index in range(200):
        features = JobFeatures(f"j{index}", "q", "", float(1 + index % 4), "", float(index))
        forecaster.predict(features)
        # run times grow with the GPU count, which the per-key models learn: the forecasts order
        forecaster.observe(features, 60.0 * (1 + index % 4) ** 3 * math.exp(rng.gauss(0.0, 0.2)), float(index))
    forecast = forecaster.predict(JobFeatures("next", "q", "", 2.0, "", 300.0))
    assert forecast.trust is not None and forecast.trust > 0.9
