"""Demand per queue: job arrivals and requested GPU-hours per hour, forecast hours ahead (pure).

Arrivals are bursty counts with a daily cycle, so the model is additive Holt-Winters (statsmodels
ExponentialSmoothing, season 24 h) on log1p of the hourly value, back-transformed and clipped at 0.
Holt-Winters needs two full seasons to initialise; a shorter history gets the mean of its last day
("mean"), and no history gets zeros ("none"). A failed fit falls back the same way, so a forecast is
always returned and always says which model made it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from statsmodels.tsa.holtwinters import ExponentialSmoothing

HOUR_S = 3600.0
SEASON_HOURS = 24
MAX_HORIZON_HOURS = 168


@dataclass(frozen=True, slots=True)
class Arrival:
    """One submitted job as demand sees it: when, where, and the GPU-hours it asked for."""

    queue: str
    submit_s: float
    gpus: float
    duration_s: float | None  # None while unknown: counts as an arrival, adds no GPU-hours


@dataclass(frozen=True, slots=True)
class HourlyDemand:
    queue: str
    start_s: float  # start of the first hour
    arrivals: tuple[float, ...]
    gpu_hours: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SeriesForecast:
    values: tuple[float, ...]
    model: str  # "holt-winters", "mean" or "none"


@dataclass(frozen=True, slots=True)
class QueueDemandForecast:
    queue: str
    arrivals_per_hour: SeriesForecast
    gpu_hours_per_hour: SeriesForecast


def hourly_demand(arrivals: Iterable[Arrival], start_s: float, end_s: float) -> dict[str, HourlyDemand]:
    """Per queue, arrivals and requested GPU-hours in each whole hour of [start_s, end_s), by submit hour."""
    if end_s <= start_s:
        raise ValueError(f"end_s ({end_s:g}) must be after start_s ({start_s:g})")
    hours = math.ceil((end_s - start_s) / HOUR_S)
    counts: dict[str, list[float]] = {}
    work: dict[str, list[float]] = {}
    for arrival in arrivals:
        if not start_s <= arrival.submit_s < end_s:
            continue
        index = int((arrival.submit_s - start_s) // HOUR_S)
        count = counts.setdefault(arrival.queue, [0.0] * hours)
        gpu_hours = work.setdefault(arrival.queue, [0.0] * hours)
        count[index] += 1.0
        if arrival.duration_s is not None:
            gpu_hours[index] += arrival.gpus * arrival.duration_s / HOUR_S
    return {queue: HourlyDemand(queue, start_s, tuple(counts[queue]), tuple(work[queue])) for queue in sorted(counts)}


def fallback_forecast(history: Sequence[float], horizon: int) -> SeriesForecast:
    if not history:
        return SeriesForecast((0.0,) * horizon, "none")
    recent = history[-SEASON_HOURS:]
    return SeriesForecast((sum(recent) / len(recent),) * horizon, "mean")


def seasonal_naive(history: Sequence[float], horizon: int) -> SeriesForecast:
    """The same hour one day earlier: the benchmark a seasonal model has to beat."""
    if len(history) < SEASON_HOURS:
        return fallback_forecast(history, horizon)
    last_day = history[-SEASON_HOURS:]
    return SeriesForecast(tuple(last_day[step % SEASON_HOURS] for step in range(horizon)), "seasonal-naive")


def forecast_series(history: Sequence[float], horizon: int) -> SeriesForecast:
    """Holt-Winters (additive, daily season, on log1p) when there are two days of history, else the mean."""
    if not 1 <= horizon <= MAX_HORIZON_HOURS:
        raise ValueError(f"horizon must be 1..{MAX_HORIZON_HOURS} hours, got {horizon}")
    if any(value < 0 or not math.isfinite(value) for value in history):
        raise ValueError("demand history must be finite and non-negative")
    if len(history) < 2 * SEASON_HOURS or max(history) == min(history):
        return fallback_forecast(history, horizon)
    series = np.log1p(np.asarray(history, dtype=float))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning on sparse queues: judged by the result below
        try:
            fitted = ExponentialSmoothing(
                series,
                trend=None,
                seasonal="add",
                seasonal_periods=SEASON_HOURS,
                initialization_method="estimated",
            ).fit()
            values = np.expm1(np.asarray(fitted.forecast(horizon), dtype=float))
        except (np.linalg.LinAlgError, ValueError):
            return fallback_forecast(history, horizon)
    if not bool(np.all(np.isfinite(values))):
        return fallback_forecast(history, horizon)
    return SeriesForecast(tuple(max(0.0, float(value)) for value in values), "holt-winters")


def forecast_queues(demand: dict[str, HourlyDemand], horizon: int) -> list[QueueDemandForecast]:
    return [
        QueueDemandForecast(
            queue, forecast_series(hourly.arrivals, horizon), forecast_series(hourly.gpu_hours, horizon)
        )
        for queue, hourly in sorted(demand.items())
    ]


@dataclass(frozen=True, slots=True)
class BacktestScore:
    """Mean absolute error per hour over a held-out horizon, for one queue, metric and model."""

    queue: str
    metric: str  # "arrivals" or "gpu_hours"
    model: str  # the method asked for: "holt-winters", "mean" or "seasonal-naive"
    used: str  # what actually produced it ("mean" when Holt-Winters had too little history)
    mae: float
    actual_total: float
    predicted: tuple[float, ...]
    actual: tuple[float, ...]


def backtest(demand: dict[str, HourlyDemand], holdout_hours: int) -> list[BacktestScore]:
    """Fit on all but the last `holdout_hours`, forecast them, and score each method against the truth."""
    scores: list[BacktestScore] = []
    for queue, hourly in sorted(demand.items()):
        for metric, series in (("arrivals", hourly.arrivals), ("gpu_hours", hourly.gpu_hours)):
            if len(series) <= holdout_hours:
                raise ValueError(f"{len(series)} hours of history cannot hold out {holdout_hours}")
            train, truth = series[:-holdout_hours], series[-holdout_hours:]
            methods = {
                "holt-winters": forecast_series(train, holdout_hours),
                "mean": fallback_forecast(train, holdout_hours),
                "seasonal-naive": seasonal_naive(train, holdout_hours),
            }
            for name, forecast in methods.items():
                mae = sum(abs(p - a) for p, a in zip(forecast.values, truth, strict=True)) / holdout_hours
                scores.append(
                    BacktestScore(queue, metric, name, forecast.model, mae, sum(truth), forecast.values, truth)
                )
    return scores
