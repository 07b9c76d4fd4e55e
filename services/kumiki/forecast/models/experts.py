"""The experts: run-time forecasters learned online from job history (pure: no I/O, deterministic).

Run times are heavy-tailed (seconds to weeks), so every model works on log run time and its error
is measured as |log error|. A forecaster sees a job at submit (`predict`) and learns from it when it
finishes (`observe`); it never sees a duration before the job has finished.

What Philly taught (docs/forecast.md has the numbers): a key's *long* history predicts better than
its last few runs, because jobs arrive in bursts of ~100 near-identical runs (sweeps) and the last
burst says little about the next one. So the default forecaster keeps rolling medians over short and
long windows per key (O(window) memmove per completion, no refit), falls back key → queue → global
for cold keys, takes the median of a few such experts, and calibrates its p90 online. The statsmodels
quantile regression (refit every `refit_every` completions on a bounded window) is a model of its own
and an optional expert: it scored worse than the medians on Philly, so it is not in the default.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from kumiki.forecast.models.calibration import CalibrationConfig, ConformalP90, SpreadConfig
from kumiki.forecast.models.history import (
    MAX_LOG_S,
    PRIOR_P90_OFFSET,
    HistoryConfig,
    Key,
    KeyedHistory,
    job_keys,
    log_runtime,
    median,
    remember,
)
from kumiki.forecast.models.regression import (
    QuantileRegression,
    QuantRegConfig,
    job_vector,
    regression_row,
)
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast


@dataclass(frozen=True, slots=True)
class Issued:
    """What was forecast for a job at submit, kept until it finishes to calibrate on it."""

    features: tuple[float, ...]
    log_p50: float
    log_p90: float
    calibrated: bool  # the p90 came from a calibrator with enough residuals for this job
    burst: bool  # the p50 came from finished siblings of the same burst


# Expert name -> index of its value in job_vector().
EXPERT_FEATURES = {
    "history-long": 1,
    "history-short": 2,
    "history-recent": 3,
    "queue-long": 4,
    "global-long": 5,
}
EXPERTS = (*EXPERT_FEATURES, "quantreg")
DEFAULT_EXPERTS = ("history-short", "history-long", "global-long")


@dataclass(frozen=True, slots=True)
class KumikiConfig:
    history: HistoryConfig = HistoryConfig()
    quantreg: QuantRegConfig = QuantRegConfig()
    calibration: CalibrationConfig = CalibrationConfig()
    spread: SpreadConfig = SpreadConfig()
    experts: tuple[str, ...] = DEFAULT_EXPERTS
    burst_window_s: float = 600.0  # siblings: same key, submitted at most this long before the job
    burst_min_jobs: int = 3  # finished siblings needed before the burst expert takes over (0: never)


class BurstSiblings:
    """Recent submissions per most specific key and the run times of those that finished: sweeps.

    Jobs of one sweep are submitted within minutes and run alike; once most of the siblings submitted
    shortly before a job have finished, their median predicts it better than any longer history.
    Only the short jobs of a heterogeneous key finish early, so finished siblings are a short-biased
    sample. The estimate is therefore taken only when (a) more than half of the siblings have
    finished: counting the running ones as longer than every finished one, the siblings' median is
    then an order statistic of the finished ones, unbiased; or (b) the finished ones agree within
    `agreement` (log seconds), which a sweep does and a heterogeneous key does not.
    """

    def __init__(self, window_s: float, min_finished: int, *, agreement: float = 1.0, capacity: int = 256) -> None:
        self.window_s = window_s
        self.min_finished = min_finished
        self.agreement = agreement
        self._submitted: dict[Key, deque[tuple[float, str]]] = {}
        self._finished: dict[str, float] = {}
        self._capacity = capacity

    def submitted(self, job: JobFeatures) -> None:
        key = job_keys(job)[0]
        recent = self._submitted.get(key)
        if recent is None:
            recent = self._submitted[key] = deque(maxlen=self._capacity)
        if any(job_id == job.job_id for _, job_id in recent):
            return  # forecast again (a re-query, a retry): still one sibling
        while len(recent) == recent.maxlen or (recent and job.submit_s - recent[0][0] > self.window_s):
            _, old = recent.popleft()
            self._finished.pop(old, None)
        recent.append((job.submit_s, job.job_id))

    def finished(self, job: JobFeatures, log_runtime_s: float) -> None:
        recent = self._submitted.get(job_keys(job)[0])
        if recent is not None and any(job_id == job.job_id for _, job_id in recent):
            self._finished[job.job_id] = log_runtime_s

    def estimate(self, job: JobFeatures) -> float | None:
        """The siblings' median log run time, or None when too few of them have finished."""
        if self.min_finished <= 0:
            return None
        recent = self._submitted.get(job_keys(job)[0], ())
        siblings = [job_id for submit_s, job_id in recent if 0.0 <= job.submit_s - submit_s <= self.window_s]
        done = sorted(self._finished[job_id] for job_id in siblings if job_id in self._finished)
        if len(done) < self.min_finished:
            return None
        if 2 * len(done) > len(siblings):
            # Median of all siblings with the running ones at +infinity: an order statistic of `done`.
            middle = len(siblings) // 2
            return done[middle] if len(siblings) % 2 else (done[middle - 1] + done[middle]) / 2.0
        if done[-1] - done[0] <= self.agreement:
            return median(done)
        return None


class KumikiForecaster:
    """A burst expert when a sweep's first jobs have finished, else the median of several experts.

    The default experts are the key's median over its last 100 and last 1000 runs and the median
    of the last 1000 runs cluster-wide. Their median follows a key that has a stable history,
    and shrinks a key whose recent burst disagrees with its long history towards the cluster-wide
    value; on Philly it beat each expert alone, per-key selection of the best expert by its recent
    error, and a quantile regression stacked on the experts (docs/forecast.md). When at least
    `burst_min_jobs` jobs of the same key submitted within `burst_window_s` before this one have
    finished, their median is used instead. Each path has its own conformal p90.

    `model` of a forecast is "kumiki/burst" or "kumiki/ensemble"; `model_version` counts the
    completions learned from, so equal versions mean the same state.
    """

    name = "kumiki"

    def __init__(self, config: KumikiConfig | None = None) -> None:
        self.config = config or KumikiConfig()
        unknown = set(self.config.experts) - set(EXPERTS)
        if unknown or not self.config.experts:
            raise ValueError(f"experts must be a non-empty subset of {EXPERTS}, got {self.config.experts}")
        self.history = KeyedHistory(self.config.history)
        self.regression = QuantileRegression(self.config.quantreg) if "quantreg" in self.config.experts else None
        self.calibration = ConformalP90(self.config.calibration)
        self.burst_calibration = ConformalP90(self.config.calibration)
        self.bursts = BurstSiblings(self.config.burst_window_s, self.config.burst_min_jobs)
        self.version = 0
        self._issued: dict[str, Issued] = {}

    def _log_p50(self, features: tuple[float, ...]) -> float:
        values = [features[EXPERT_FEATURES[name]] for name in self.config.experts if name in EXPERT_FEATURES]
        if self.regression is not None:
            fitted = self.regression.predict(regression_row(features))
            values.append(features[1] + (0.0 if fitted is None else fitted[0]))
        return median(values)

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        features = job_vector(job, self.history)
        sibling_median = self.bursts.estimate(job)
        burst = sibling_median is not None
        log_p50 = sibling_median if sibling_median is not None else self._log_p50(features)
        calibration = self.calibration
        if burst and self.burst_calibration.is_calibrated(job):
            calibration = self.burst_calibration
        log_p90 = log_p50 + calibration.offset(job)
        # A burst forecast with the ensemble's offset feeds no coverage back: it would mix the two.
        calibrated = calibration.is_calibrated(job) and (calibration is self.burst_calibration) == burst
        remember(self._issued, job.job_id, Issued(features, log_p50, log_p90, calibrated, burst))
        self.bursts.submitted(job)
        path = "burst" if burst else "ensemble"
        log_sigma = calibration.spread(job, self.config.spread)
        return RuntimeForecast(
            math.exp(log_p50), math.exp(log_p90), f"{self.name}/{path}", self.version, log_sigma=log_sigma
        )

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        actual = log_runtime(runtime_s)
        issued = self._issued.pop(job.job_id, None)
        if issued is None:  # learned from history it never forecast (e.g. a warm start)
            features = job_vector(job, self.history)
            self.calibration.update(job, actual - self._log_p50(features), None)
        else:
            features = issued.features
            covered = actual <= issued.log_p90 if issued.calibrated else None
            calibration = self.burst_calibration if issued.burst else self.calibration
            calibration.update(job, actual - issued.log_p50, covered)
        if self.regression is not None:
            self.regression.add(regression_row(features), actual - features[1])
        self.history.add(job, actual)
        self.bursts.finished(job, actual)
        self.version += 1


class HistoryMedianForecaster:
    """One expert alone: hierarchical rolling median of log run time, with the same conformal p90."""

    def __init__(self, *, window: int = 1000, name: str = "history-median") -> None:
        self.name = name
        self.window = window
        self.history = KeyedHistory(HistoryConfig(long_window=window, short_window=window, recent_window=window))
        self.calibration = ConformalP90(CalibrationConfig())
        self.version = 0
        self._issued: dict[str, tuple[float, float, bool]] = {}

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        log_p50 = self.history.median(job, self.window)
        log_p90 = log_p50 + self.calibration.offset(job)
        remember(self._issued, job.job_id, (log_p50, log_p90, self.calibration.is_calibrated(job)))
        return RuntimeForecast(math.exp(log_p50), math.exp(log_p90), self.name, self.version)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        actual = log_runtime(runtime_s)
        issued = self._issued.pop(job.job_id, None)
        if issued is None:
            self.calibration.update(job, actual - self.history.median(job, self.window), None)
        else:
            log_p50, log_p90, calibrated = issued
            self.calibration.update(job, actual - log_p50, actual <= log_p90 if calibrated else None)
        self.history.add(job, actual)
        self.version += 1


class QuantRegForecaster:
    """The quantile regression alone: its own p50 and p90 (uncalibrated); the long median until its first fit.

    It models log run time minus the key's long median (`regression_row`), from the features the
    job had at submit.
    """

    name = "quantreg"

    def __init__(self, config: QuantRegConfig | None = None, history: HistoryConfig | None = None) -> None:
        self.history = KeyedHistory(history or HistoryConfig())
        self.regression = QuantileRegression(config or QuantRegConfig())
        self._features: dict[str, tuple[float, ...]] = {}

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        features = job_vector(job, self.history)
        remember(self._features, job.job_id, features)
        base = features[1]
        fitted = self.regression.predict(regression_row(features))
        low, high = fitted if fitted is not None else (0.0, PRIOR_P90_OFFSET)
        p50_log = min(MAX_LOG_S, base + low)
        p90_log = min(MAX_LOG_S, max(p50_log, base + high))
        return RuntimeForecast(math.exp(p50_log), math.exp(p90_log), self.name, self.regression.version)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        actual = log_runtime(runtime_s)
        features = self._features.pop(job.job_id, None) or job_vector(job, self.history)
        self.regression.add(regression_row(features), actual - features[1])
        self.history.add(job, actual)
