"""Trust in a key's forecasts is measured from their own errors against the forecast-free prior."""

from __future__ import annotations

import math
import random

from kumiki.forecast.models import ForecastTrust, TrustConfig
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
