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

import bisect
import functools
import heapq
import math
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TypeVar

import numpy as np
from statsmodels.regression.quantile_regression import QuantReg

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast

# Run times below a second carry no information beyond "very short"; clamping keeps logs finite.
MIN_RUNTIME_S = 1.0
P90_LEVEL = 0.9
# Before any job has finished: half an hour, and a p90 e^2 (~7x) above it.
PRIOR_LOG_S = math.log(1800.0)
PRIOR_P90_OFFSET = 2.0
# No forecast is longer than a year: a regression fitted on few runs can extrapolate to exp(1000) (an
# OverflowError that would fail the forecast service's handler and the simulator); past this it is no forecast.
MAX_LOG_S = math.log(365 * 86400.0)

Key = tuple[str, ...]
GLOBAL_KEY: Key = ("all",)
# Forecasts kept until their job finishes; a job that never reports its end (cancelled before it
# ran, lost) must not grow memory forever, so the oldest are forgotten beyond this many.
MAX_OPEN_FORECASTS = 200_000
Remembered = TypeVar("Remembered")


def remember(open_forecasts: dict[str, Remembered], job_id: str, value: Remembered) -> None:
    """Keep what was forecast for a job until it finishes, forgetting the oldest beyond the bound."""
    open_forecasts.pop(job_id, None)
    open_forecasts[job_id] = value
    while len(open_forecasts) > MAX_OPEN_FORECASTS:
        del open_forecasts[next(iter(open_forecasts))]


def log_runtime(runtime_s: float) -> float:
    return math.log(max(runtime_s, MIN_RUNTIME_S))


def job_keys(job: JobFeatures) -> tuple[Key, ...]:
    """History keys from most specific to least: (queue, user, gpus, image, command, time limit) →
    (queue, user, gpus, name) → (queue, gpus) → queue → all.

    The first level is the job's own script: the same user running the same command in the same image and
    asking for the same time is, more than anything else, the same job again (job names are often generated
    afresh for every submission, so the name is not part of it). Levels whose own fields are all
    empty (the Philly trace has no user, name, image, command or limit) are dropped rather than kept as
    duplicates of the level below, so traces without them are keyed exactly as before.
    """
    return _keys(job.queue, job.user, job.gpus, job.name, job.image, job.command, job.time_limit_s)


@functools.lru_cache(maxsize=1 << 16)
def _keys(
    queue: str, user: str, gpus: float, name: str, image: str, command: str, time_limit_s: float | None
) -> tuple[Key, ...]:
    count = f"{gpus:g}"
    keys: list[Key] = []
    if image or command or time_limit_s:
        keys.append(("s", queue, user, count, image, command, f"{time_limit_s or 0:g}"))
    if user or name:
        keys.append(("k", queue, user, count, name))
    keys.append(("qg", queue, count))
    keys.append(("q", queue))
    keys.append(GLOBAL_KEY)
    return tuple(keys)


class RollingWindow:
    """The last `capacity` values in arrival order and in sorted order: quantiles in O(1)."""

    __slots__ = ("_order", "_sorted", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: float) -> None:
        if len(self._order) == self.capacity:
            oldest = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def quantile(self, level: float) -> float:
        """Empirical quantile with linear interpolation (numpy's default)."""
        if not self._sorted:
            raise ValueError("quantile of an empty window")
        position = level * (len(self._sorted) - 1)
        low = math.floor(position)
        high = min(low + 1, len(self._sorted) - 1)
        return self._sorted[low] + (self._sorted[high] - self._sorted[low]) * (position - low)

    def median(self) -> float:
        return self.quantile(0.5)

    def last(self, count: int) -> list[float]:
        return list(self._order)[-count:]


@dataclass(frozen=True, slots=True)
class HistoryConfig:
    long_window: int = 1000
    short_window: int = 100
    recent_window: int = 20
    min_count: int = 3  # a key needs this many completions before its own median is trusted


class KeyedHistory:
    """Rolling windows of log run time for every key level of every job seen finishing."""

    def __init__(self, config: HistoryConfig) -> None:
        self.config = config
        self._windows: dict[tuple[Key, int], RollingWindow] = {}
        self.counts: dict[Key, int] = {}

    def add(self, job: JobFeatures, log_runtime_s: float) -> None:
        sizes = (self.config.long_window, self.config.short_window, self.config.recent_window)
        for key in job_keys(job):
            self.counts[key] = self.counts.get(key, 0) + 1
            for size in sizes:
                window = self._windows.get((key, size))
                if window is None:
                    window = self._windows[(key, size)] = RollingWindow(size)
                window.add(log_runtime_s)

    def window(self, key: Key, size: int) -> RollingWindow | None:
        return self._windows.get((key, size))

    def median(self, job: JobFeatures, size: int, *, skip_levels: int = 0) -> float:
        """Median of the most specific key with enough history: key → queue → global → prior."""
        for key in job_keys(job)[skip_levels:]:
            window = self._windows.get((key, size))
            needed = 1 if key == GLOBAL_KEY else self.config.min_count
            if window is not None and len(window) >= needed:
                return window.median()
        return PRIOR_LOG_S


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


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    window: int = 300  # residuals per key
    min_residuals: int = 30
    step: float = 0.005  # adaptive correction per completion, on log seconds
    max_correction: float = 0.5  # anti-windup: feedback arrives a run time late, so it can overshoot
    target: float = P90_LEVEL


@dataclass(frozen=True, slots=True)
class SpreadConfig:
    """How the log-normal sigma a forecast reports (`RuntimeForecast.log_sigma`) is read off residuals.

    sigma = (q_high - q_low of a key's residuals) / (z_high - z_low). The default, the upper half
    (median to 90%), measures how far above its usual error a key's runs go, without the key's bias
    (which the median residual removes) and without the coverage correction that widens the p90.
    Measured on the Philly slice against IQR, 10-90% and shrinkage: docs/simulator.md.
    """

    low: float = 0.5
    high: float = 0.9
    min_residuals: int = 5  # a key level needs this many residuals for its own spread to count
    shrink: float = 0.0  # pseudo-count of the parent key level's spread mixed into a key's (in variance)


def _normal_quantile(level: float) -> float:
    return float(NormalDist().inv_cdf(level))


class ConformalP90:
    """Online calibration of the p90 as an offset above the p50, on log seconds.

    The offset is the empirical 90% quantile of recent residuals (log actual - log p50) of the most
    specific key with enough of them, so steady keys get tight p90s and erratic ones wide. Completions
    arrive late and skewed to short jobs, so the plain quantile under-covers; a global correction is
    steered by the realised coverage of the p90s actually issued (adaptive conformal inference,
    Gibbs & Candès 2021), which removes that bias without knowing its size. Only p90s issued from
    a calibrated key feed it (cold-start guesses would wind it up), and it is clamped, because its
    feedback comes a whole run time late and a large step overshoots.
    """

    def __init__(self, config: CalibrationConfig) -> None:
        self.config = config
        self._residuals: dict[Key, RollingWindow] = {}
        self.correction = 0.0
        # Censored feedback: a started job still running past its calibrated p90 is a miss already known, so
        # the correction hears of it then, not a whole run time later when it ends (which is when a sweep of
        # long runs in a short key would otherwise be noticed: after every job of the sweep has been forecast).
        self._due: list[tuple[float, str]] = []  # (start + p90 in wall seconds, job): when a running job misses
        self._running: dict[str, bool] = {}  # started jobs with a calibrated p90 -> already counted as a miss

    def started(self, job_id: str, log_p90: float, start_s: float) -> None:
        """A job given a calibrated p90 began running (its first start counts: wall time past it only grows)."""
        if job_id in self._running:
            return
        remember(self._running, job_id, False)
        heapq.heappush(self._due, (start_s + math.exp(min(log_p90, MAX_LOG_S)), job_id))
        if len(self._due) > 2 * MAX_OPEN_FORECASTS:  # entries of jobs forgotten by the bound
            self._due = [entry for entry in self._due if entry[1] in self._running]
            heapq.heapify(self._due)

    def advance(self, now_s: float) -> None:
        """Count as misses the started jobs that are still running past their p90 at `now_s`."""
        while self._due and self._due[0][0] <= now_s:
            _, job_id = heapq.heappop(self._due)
            if self._running.get(job_id) is False:
                self._running[job_id] = True
                self._nudge(self._outcome(missed=True))

    def offset(self, job: JobFeatures) -> float:
        for key in job_keys(job):
            window = self._residuals.get(key)
            if window is not None and len(window) >= self.config.min_residuals:
                return max(0.0, window.quantile(self.config.target) + self.correction)
        return max(0.0, PRIOR_P90_OFFSET + self.correction)

    def spread(self, job: JobFeatures, config: SpreadConfig) -> float | None:
        """Log-normal sigma of the job's residuals: each key level's own, shrunk towards its parent level's.

        Read from an inter-quantile range of residuals, not from the p90 offset: a key whose runs are mostly
        alike but now and then 1,000x longer gets a tight sigma (the consumer models rare long runs apart),
        while its p90 stays wide enough to cover them. None before the first residual.
        """
        width = _normal_quantile(config.high) - _normal_quantile(config.low)
        sigma: float | None = None
        for key in reversed(job_keys(job)):
            window = self._residuals.get(key)
            needed = 2 if key == GLOBAL_KEY else config.min_residuals
            if window is None or len(window) < needed:
                continue
            own = (window.quantile(config.high) - window.quantile(config.low)) / width
            if sigma is None:
                sigma = own
            else:
                count = len(window)
                sigma = math.sqrt((count * own**2 + config.shrink * sigma**2) / (count + config.shrink))
        return sigma

    def calibrated_sigma(self, job: JobFeatures) -> float | None:
        """Sigma of a zero-centred normal that describes the key's residuals, bias included:
        sqrt(((q90 - q10) / 2.563)^2 + median^2) of the most specific key with enough residuals.
        This is the honest spread of "actual around the p50 issued"; None before any residual."""
        width = _normal_quantile(0.9) - _normal_quantile(0.1)
        for key in job_keys(job):
            window = self._residuals.get(key)
            needed = 2 if key == GLOBAL_KEY else self.config.min_residuals
            if window is not None and len(window) >= needed:
                spread = (window.quantile(0.9) - window.quantile(0.1)) / width
                return math.sqrt(spread**2 + window.median() ** 2)
        return None

    def is_calibrated(self, job: JobFeatures) -> bool:
        """Whether some key of the job has enough residuals for its p90 to be a conformal one."""
        for key in job_keys(job):
            window = self._residuals.get(key)
            if window is not None and len(window) >= self.config.min_residuals:
                return True
        return False

    def update(self, job: JobFeatures, residual: float, covered: bool | None) -> None:
        """Learn one residual; `covered`: whether the calibrated p90 issued for that job held, else None."""
        for key in job_keys(job):
            window = self._residuals.get(key)
            if window is None:
                window = self._residuals[key] = RollingWindow(self.config.window)
            window.add(residual)
        counted = self._running.pop(job.job_id, False)
        if covered is None or (counted and not covered):
            return  # nothing to learn, or a miss already counted while the job ran
        if counted:  # counted as a miss while it ran, yet covered (it waited or was preempted in between):
            self._nudge(self._outcome(missed=False) - self._outcome(missed=True))  # the one outcome, a cover
        else:
            self._nudge(self._outcome(missed=not covered))

    def _outcome(self, *, missed: bool) -> float:
        """The correction's step for one issued p90 (ACI: up by step x (miss - (1 - target)))."""
        return self.config.step * ((1.0 if missed else 0.0) - (1.0 - self.config.target))

    def _nudge(self, step: float) -> None:
        limit = self.config.max_correction
        self.correction = min(limit, max(-limit, self.correction + step))


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


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0
