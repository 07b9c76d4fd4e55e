"""The statsmodels quantile regression over the history medians: a model of its own and an optional expert
(it scored worse than the medians on Philly, so it is not in the default; docs/forecast.md)."""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np
from statsmodels.regression.quantile_regression import QuantReg

from kumiki.forecast.models.history import P90_LEVEL, KeyedHistory, job_keys
from kumiki.sched.forecasting import JobFeatures


@dataclass(frozen=True, slots=True)
class QuantRegConfig:
    refit_every: int = 1000  # completions between refits: bounds CPU, serving never waits on it
    window: int = 4000  # most recent completions a refit sees
    min_rows: int = 300
    max_iter: int = 500


FEATURE_NAMES = (
    "intercept",
    "history_long",
    "history_short",
    "history_recent",
    "queue_long",
    "global_long",
    "log2_gpus",
    "log_key_count",
)


def job_vector(job: JobFeatures, history: KeyedHistory) -> tuple[float, ...]:
    """The regression's features of a job, from what is known at the moment it is called."""
    config = history.config
    key = job_keys(job)[0]
    return (
        1.0,
        history.median(job, config.long_window),
        history.median(job, config.short_window),
        history.median(job, config.recent_window),
        history.median(job, config.long_window, skip_levels=len(job_keys(job)) - 2),
        history.median(job, config.long_window, skip_levels=len(job_keys(job)) - 1),
        math.log2(max(job.gpus, 1e-3)),
        math.log1p(history.counts.get(key, 0)),
    )


def regression_row(features: tuple[float, ...]) -> tuple[float, ...]:
    """The regression's design row: every history median relative to the key's long median.

    The target is likewise log run time minus the long median, so a regression that learns nothing
    (all coefficients 0) forecasts the long median instead of extrapolating from the raw levels,
    which are nearly collinear and shift as history fills.
    """
    base = features[1]
    return (
        1.0,
        features[2] - base,
        features[3] - base,
        features[4] - base,
        features[5] - base,
        *features[6:],
    )


class QuantileRegression:
    """statsmodels QuantReg for the p50 and p90 of a target, refit periodically on a bounded window.

    Rows are the features a job had at submit (cached then), so training sees what serving saw.
    A failed or non-converged fit keeps the previous coefficients.
    """

    def __init__(self, config: QuantRegConfig) -> None:
        self.config = config
        self._rows: deque[tuple[tuple[float, ...], float]] = deque(maxlen=config.window)
        self._since_fit = 0
        self.coef_p50: np.ndarray | None = None
        self.coef_p90: np.ndarray | None = None
        self.version = 0

    def add(self, features: tuple[float, ...], log_runtime_s: float) -> None:
        self._rows.append((features, log_runtime_s))
        self._since_fit += 1
        first_fit = self.coef_p50 is None and len(self._rows) >= self.config.min_rows
        if first_fit or (self.coef_p50 is not None and self._since_fit >= self.config.refit_every):
            self.refit()

    def refit(self) -> None:
        self._since_fit = 0
        design = np.array([row for row, _ in self._rows], dtype=float)
        target = np.array([value for _, value in self._rows], dtype=float)
        p50 = self._fit(design, target, 0.5)
        p90 = self._fit(design, target, P90_LEVEL)
        if p50 is not None and p90 is not None:
            self.coef_p50, self.coef_p90 = p50, p90
            self.version += 1

    def _fit(self, design: np.ndarray, target: np.ndarray, level: float) -> np.ndarray | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # IterationLimitWarning, ConvergenceWarning: judged below
            try:
                result = QuantReg(target, design).fit(q=level, max_iter=self.config.max_iter)
            except (np.linalg.LinAlgError, ValueError):
                return None
        params = np.asarray(result.params, dtype=float)
        return params if bool(np.all(np.isfinite(params))) else None

    def predict(self, features: tuple[float, ...]) -> tuple[float, float] | None:
        if self.coef_p50 is None or self.coef_p90 is None:
            return None
        vector = np.asarray(features, dtype=float)
        log_p50 = float(vector @ self.coef_p50)
        return log_p50, max(log_p50, float(vector @ self.coef_p90))
