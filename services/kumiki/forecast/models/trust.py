"""How far a key's forecasts have earned a scheduler's trust, measured online (pure, deterministic).

A scheduler that orders jobs by forecasts gains only as far as the forecasts tell long jobs from short
ones better than no forecast does. Without a forecast every job looks the same (one uninformed prior),
and the uncertainty the order faces is the spread of run times across the cluster: the mean absolute
deviation of recent log run times from their median (`spread`: the median absolute deviation of
recent log run times). A key's forecasts remove part of it; what they leave is their own median |log
error| on the key's last `window` finished jobs (`error`). Trust is the share removed, on the variance
scale:

    trust = clip(1 - (error / spread)^2, 0, 1)

(for normal errors, 1 - error variance / run-time variance: the R^2 of the forecast against the
constant a forecast-free scheduler uses). Exact forecasts get 1; forecasts no better than a constant, or
worse (noise), get 0, and the policy then orders those jobs exactly as without forecasts. It is measured
per key level (the most specific with a few finished runs, else its parent), so one VC whose run times
shift loses trust within about half a window of its runs while the others keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kumiki.forecast.models.experts import GLOBAL_KEY, PRIOR_LOG_S, Key, RollingWindow, job_keys
from kumiki.sched.forecasting import JobFeatures


@dataclass(frozen=True, slots=True)
class TrustConfig:
    window: int = 100  # a key level's most recent finished runs its error is measured on
    min_runs: int = 5  # runs before a key level's own record answers (else its parent's)
    spread_window: int = 1000  # recent cluster-wide runs the forecast-free spread is measured on


class ForecastTrust:
    """Per key level: decayed mean |log error| of the issued forecasts, against the cluster's run-time spread."""

    def __init__(self, config: TrustConfig | None = None) -> None:
        self.config = config or TrustConfig()
        if self.config.window < 1 or self.config.min_runs < 1:
            raise ValueError("window and min_runs must be >= 1")
        self._errors: dict[Key, RollingWindow] = {}
        self._prior_errors: dict[Key, RollingWindow] = {}
        self._recent = RollingWindow(self.config.spread_window)
        self._spread: float | None = None
        self._since_spread = 0

    def spread(self) -> float | None:
        """Mean |log run time - median| of recent runs cluster-wide (recomputed every 50 runs; None when empty)."""
        if self._spread is None or self._since_spread >= 50:
            if len(self._recent) < 2:
                return None
            center = self._recent.median()
            values = sorted(abs(value - center) for value in self._recent.last(len(self._recent)))
            self._spread = values[len(values) // 2]
            self._since_spread = 0
        return self._spread

    def trust(self, job: JobFeatures) -> float:
        """Share of the forecast-free uncertainty this key's forecasts remove (0..1); 0 before any run:
        trust is earned, so a forecaster with no record yet is ordered as no forecast."""
        for key in job_keys(job):
            window = self._errors.get(key)
            needed = 1 if key == GLOBAL_KEY else self.config.min_runs
            if window is not None and len(window) >= needed:
                prior = self._prior_errors[key].median()
                if prior <= 0.0:
                    return 0.0
                return max(0.0, 1.0 - (window.median() / prior) ** 2)
        return 0.0

    def update(self, job: JobFeatures, log_runtime_s: float, log_p50_s: float) -> None:
        """Learn one finished job: its forecast's |log error| on every key level, its run time cluster-wide."""
        error = abs(log_runtime_s - log_p50_s)
        prior_error = abs(log_runtime_s - PRIOR_LOG_S)
        for key in job_keys(job):
            window = self._errors.get(key)
            if window is None:
                window = self._errors[key] = RollingWindow(self.config.window)
                self._prior_errors[key] = RollingWindow(self.config.window)
            window.add(error)
            self._prior_errors[key].add(prior_error)
        self._recent.add(log_runtime_s)
        self._since_spread += 1
