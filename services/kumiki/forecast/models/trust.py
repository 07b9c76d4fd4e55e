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

A second measure, `ConcordanceTrust` (`TrustConfig(measure="concordance")`), asks what an order needs
instead of what a point estimate needs: whether the key's forecasts put its jobs on the right side of
the cluster's other recent jobs more often than a coin would (issue 14's twelfth step; measured, not in
the default `kumiki` policy, docs/design/0003-forecast-trust.md).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from kumiki.forecast.models.history import GLOBAL_KEY, PRIOR_LOG_S, Key, RollingWindow, job_keys
from kumiki.sched.forecasting import JobFeatures


@dataclass(frozen=True, slots=True)
class TrustConfig:
    window: int = 100  # a key level's most recent finished runs its error is measured on
    min_runs: int = 5  # runs before a key level's own record answers (else its parent's)
    # recent cluster-wide runs the forecast-free spread ("error") or the reference order ("concordance") is
    # measured on
    spread_window: int = 1000
    # "error": the forecasts' median |log error| against the prior's (R^2, `ForecastTrust`); "concordance":
    # the probability that they order the key's jobs better than a coin (`ConcordanceTrust`)
    measure: str = "error"


TRUST_MEASURES = ("error", "concordance")


class TrustMeasure(Protocol):
    def trust(self, job: JobFeatures) -> float: ...

    def update(self, job: JobFeatures, log_runtime_s: float, log_p50_s: float) -> None: ...


def build_trust(config: TrustConfig | None = None) -> TrustMeasure:
    """The trust measure the config names."""
    config = config or TrustConfig()
    if config.measure == "error":
        return ForecastTrust(config)
    if config.measure == "concordance":
        return ConcordanceTrust(config)
    raise ValueError(f"trust measure must be one of {TRUST_MEASURES}, got {config.measure!r}")


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


class ConcordanceTrust:
    """Per key level: the probability that the key's forecasts order its jobs better than a coin.

    An order needs only to know which of two jobs is longer. Each finished job is scored against the
    cluster's last `spread_window` finished jobs: among the pairs its forecast tells apart (a different
    forecast, a different run time), the share ordered right minus the share ordered wrong (Somers' D,
    in [-1, 1]; 0 for a coin, and for ties, which a forecast-free order makes too). A key level keeps its
    last `window` scores; trust is the probability that their mean is above 0 (normal approximation,
    mean / standard error), so a key whose forecasts clearly order gets ~1 whatever their size of error,
    a key no better than a coin ~0.5 or less, and nothing has to be tuned to a trace. 0 before any run.
    """

    def __init__(self, config: TrustConfig | None = None) -> None:
        self.config = config or TrustConfig()
        if self.config.window < 2 or self.config.min_runs < 2 or self.config.spread_window < 1:
            raise ValueError("window and min_runs must be >= 2 and spread_window >= 1")
        self._scores: dict[Key, RollingWindow] = {}
        # (log p50 issued, log run time) of the cluster's most recent finished jobs
        self._reference: deque[tuple[float, float]] = deque(maxlen=self.config.spread_window)

    def score(self, log_runtime_s: float, log_p50_s: float) -> float | None:
        """Somers' D of one finished job's forecast against the reference jobs (None: it tells none apart)."""
        right = wrong = 0
        for reference_p50, reference_runtime in self._reference:
            agreement = (log_p50_s - reference_p50) * (log_runtime_s - reference_runtime)
            if agreement > 0.0:
                right += 1
            elif agreement < 0.0:
                wrong += 1
        if right + wrong == 0:
            return None
        return (right - wrong) / (right + wrong)

    def record(self, key: Key) -> tuple[float, int] | None:
        """A key level's mean score over its window and the number of scores (None: never scored)."""
        window = self._scores.get(key)
        if window is None or not len(window):
            return None
        scores = window.last(len(window))
        return sum(scores) / len(scores), len(scores)

    def trust(self, job: JobFeatures) -> float:
        for key in job_keys(job):
            window = self._scores.get(key)
            needed = 2 if key == GLOBAL_KEY else self.config.min_runs
            if window is not None and len(window) >= needed:
                return probability_above_zero(window.last(len(window)))
        return 0.0

    def update(self, job: JobFeatures, log_runtime_s: float, log_p50_s: float) -> None:
        score = self.score(log_runtime_s, log_p50_s)
        if score is not None:
            for key in job_keys(job):
                window = self._scores.get(key)
                if window is None:
                    window = self._scores[key] = RollingWindow(self.config.window)
                window.add(score)
        self._reference.append((log_p50_s, log_runtime_s))


def probability_above_zero(values: list[float]) -> float:
    """P(mean > 0) from a sample, by the normal approximation to its mean (a zero spread decides by sign)."""
    mean = statistics.fmean(values)
    variance = statistics.variance(values, mean)
    if variance <= 0.0:
        return 1.0 if mean > 0.0 else 0.0 if mean < 0.0 else 0.5
    return statistics.NormalDist().cdf(mean / math.sqrt(variance / len(values)))
