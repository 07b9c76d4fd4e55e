from __future__ import annotations

import math
import random

import pytest

from kumiki.forecast.demand import (
    HOUR_S,
    Arrival,
    backtest,
    fallback_forecast,
    forecast_queues,
    forecast_series,
    hourly_demand,
    seasonal_naive,
)


def test_hourly_demand_counts_arrivals_and_requested_gpu_hours_by_submit_hour() -> None:
    arrivals = [
        Arrival("a", 10.0, 2.0, 1_800.0),  # hour 0: 1 GPU-hour
        Arrival("a", 3_599.0, 1.0, 7_200.0),  # hour 0: 2 GPU-hours
        Arrival("a", 3_600.0, 4.0, None),  # hour 1: counted, duration unknown
        Arrival("b", 7_300.0, 8.0, 450.0),  # hour 2: 1 GPU-hour
        Arrival("b", 99_999.0, 1.0, 1.0),  # outside the range
    ]
    demand = hourly_demand(arrivals, 0.0, 3 * HOUR_S)
    assert demand["a"].arrivals == (2.0, 1.0, 0.0)
    assert demand["a"].gpu_hours == pytest.approx((3.0, 0.0, 0.0))
    assert demand["b"].arrivals == (0.0, 0.0, 1.0)
    assert demand["b"].gpu_hours == pytest.approx((0.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="end_s"):
        hourly_demand(arrivals, 10.0, 10.0)


def daily_cycle(days: int, seed: int = 2) -> list[float]:
    """Busy days, quiet nights, Poisson-like noise: what a team's submissions look like."""
    rng = random.Random(seed)
    series = []
    for hour in range(days * 24):
        level = 20.0 + 15.0 * math.sin(2 * math.pi * hour / 24)
        series.append(max(0.0, round(level + rng.gauss(0.0, math.sqrt(level)))))
    return series


def test_holt_winters_learns_a_daily_cycle_better_than_the_mean() -> None:
    series = daily_cycle(8)
    train, truth = series[:-24], series[-24:]
    seasonal = forecast_series(train, 24)
    flat = fallback_forecast(train, 24)
    assert seasonal.model == "holt-winters"
    assert len(seasonal.values) == 24

    def mae(values: tuple[float, ...]) -> float:
        return sum(abs(p - a) for p, a in zip(values, truth, strict=True)) / 24

    assert mae(seasonal.values) < 0.6 * mae(flat.values)
    # The forecast peaks where the cycle peaks (hour 6 of each day) and is lowest near hour 18.
    assert max(range(24), key=lambda h: seasonal.values[h]) in range(3, 10)
    assert min(range(24), key=lambda h: seasonal.values[h]) in range(15, 22)


def test_short_empty_and_flat_histories_fall_back() -> None:
    assert forecast_series([3.0] * 10 + [5.0] * 10, 4) == fallback_forecast([3.0] * 10 + [5.0] * 10, 4)
    assert forecast_series([3.0] * 10 + [5.0] * 10, 4).model == "mean"
    assert forecast_series([], 3).values == (0.0, 0.0, 0.0)
    assert forecast_series([], 3).model == "none"
    assert forecast_series([7.0] * 100, 2).values == (7.0, 7.0)
    assert seasonal_naive(list(range(48)), 2).values == (24, 25)


def test_forecasts_are_never_negative_even_on_a_falling_sparse_queue() -> None:
    series = [0.0] * 60 + [50.0, 0.0, 0.0, 30.0] + [0.0] * 20
    result = forecast_series(series, 48)
    assert all(value >= 0.0 for value in result.values)


def test_horizon_and_history_are_validated() -> None:
    with pytest.raises(ValueError, match="horizon"):
        forecast_series([1.0] * 50, 0)
    with pytest.raises(ValueError, match="horizon"):
        forecast_series([1.0] * 50, 169)
    with pytest.raises(ValueError, match="non-negative"):
        forecast_series([1.0, -1.0], 1)


def test_backtest_scores_each_method_per_queue_and_metric() -> None:
    arrivals = [
        Arrival("busy", hour * HOUR_S + slot * 60.0, 1.0, 600.0)
        for hour, count in enumerate(daily_cycle(5))
        for slot in range(int(count))
    ]
    arrivals.append(Arrival("rare", 3.5 * HOUR_S, 2.0, 3_600.0))
    demand = hourly_demand(arrivals, 0.0, 5 * 24 * HOUR_S)
    scores = backtest(demand, 24)
    assert {(s.queue, s.metric, s.model) for s in scores} == {
        (queue, metric, model)
        for queue in ("busy", "rare")
        for metric in ("arrivals", "gpu_hours")
        for model in ("holt-winters", "mean", "seasonal-naive")
    }
    busy = {s.model: s for s in scores if s.queue == "busy" and s.metric == "arrivals"}
    assert busy["holt-winters"].used == "holt-winters"
    assert busy["holt-winters"].mae < busy["mean"].mae
    assert busy["holt-winters"].actual_total == pytest.approx(sum(daily_cycle(5)[-24:]))
    with pytest.raises(ValueError, match="hold out"):
        backtest(demand, 5 * 24)
    forecasts = forecast_queues(demand, 12)
    assert [f.queue for f in forecasts] == ["busy", "rare"]
    assert len(forecasts[0].gpu_hours_per_hour.values) == 12
