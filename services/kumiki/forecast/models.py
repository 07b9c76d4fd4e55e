"""Run-time forecasters learned online from job history (pure: no I/O, deterministic).

Run times are heavy-tailed (seconds to weeks), so every model works on log run time and its
error is measured as |log error|. A forecaster sees a job at submit (`predict`) and learns from it
when it finishes (`observe`); it never sees a duration before the job has finished.

The default forecaster (`build_default_forecaster`) keeps cheap per-key statistics that update in
O(1) per completion, refits a statsmodels quantile regression every `refit_every` completions on a
bounded window, and calibrates its p90 online (conformal) so that ~90% of jobs finish under it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, RuntimeForecaster

# Run times below a second carry no information beyond "very short"; clamping keeps logs finite.
MIN_RUNTIME_S = 1.0
P90_TARGET = 0.9


def log_runtime(runtime_s: float) -> float:
    return math.log(max(runtime_s, MIN_RUNTIME_S))


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def quantile(values: Sequence[float], level: float) -> float:
    """Empirical quantile (linear interpolation), same as numpy's default."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    position = level * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def job_keys(job: JobFeatures) -> tuple[tuple[str, ...], ...]:
    """History keys from most specific to least: (queue, user, gpus, name) → (queue, gpus) → queue → all.

    Empty user/name fields (the Philly trace has neither) collapse into the coarser key, so a trace
    without them does not pay for a level that carries no information.
    """
    gpus = f"{job.gpus:g}"
    keys: list[tuple[str, ...]] = []
    if job.user or job.name:
        keys.append(("k", job.queue, job.user, gpus, job.name))
    keys.append(("qg", job.queue, gpus))
    keys.append(("q", job.queue))
    keys.append(("all",))
    return tuple(keys)


class RecentHistory:
    """The last `capacity` log run times per key, in completion order."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._by_key: dict[tuple[str, ...], deque[float]] = {}

    def add(self, keys: Iterable[tuple[str, ...]], value: float) -> None:
        for key in keys:
            history = self._by_key.get(key)
            if history is None:
                history = self._by_key[key] = deque(maxlen=self.capacity)
            history.append(value)

    def get(self, key: tuple[str, ...]) -> deque[float]:
        return self._by_key.get(key, deque())


class ConformalP90:
    """Online calibration of the p90 as an offset on log run time above the p50.

    The offset is the empirical (1 - alpha_t) quantile of recent residuals (log actual - log p50).
    Completions arrive late and skewed to short jobs, so a fixed alpha under-covers; alpha_t is
    steered by the realised coverage of the p90s actually issued (adaptive conformal inference,
    Gibbs & Candès 2021), which corrects that bias without knowing its size.
    """

    def __init__(
        self,
        *,
        target: float = P90_TARGET,
        window: int = 2000,
        refresh_every: int = 50,
        step: float = 0.005,
        initial_offset: float = 1.5,
    ) -> None:
        self.target = target
        self.step = step
        self.refresh_every = refresh_every
        self._residuals: deque[float] = deque(maxlen=window)
        self._alpha = 1.0 - target
        self._offset = initial_offset
        self._since_refresh = 0

    @property
    def offset(self) -> float:
        return self._offset

    def update(self, residual: float, covered: bool | None) -> None:
        """Record one residual; `covered` is whether the p90 issued for that job held (None: none issued)."""
        self._residuals.append(residual)
        if covered is not None:
            miss = 0.0 if covered else 1.0
            # Keep alpha inside (0, 1): the quantile of a bounded window cannot go beyond its extremes.
            self._alpha = min(0.5, max(0.001, self._alpha + self.step * ((1.0 - self.target) - miss)))
        self._since_refresh += 1
        if self._since_refresh >= self.refresh_every or len(self._residuals) <= self.refresh_every:
            self._since_refresh = 0
            self._offset = max(0.0, quantile(list(self._residuals), 1.0 - self._alpha))


@dataclass(frozen=True, slots=True)
class HistoryEstimate:
    log_p50: float
    level: int  # index into job_keys(): 0 is the most specific key
    count: int


class HierarchicalMedian:
    """Median of the recent log run times of the most specific key with enough history.

    Falls back key → queue → global for cold starts; with no history at all it returns the prior.
    """

    def __init__(self, *, recent: int = 20, min_count: int = 3, prior_log_s: float = math.log(1800)) -> None:
        self.recent = recent
        self.min_count = min_count
        self.prior_log_s = prior_log_s
        self.history = RecentHistory(recent)

    def estimate(self, job: JobFeatures) -> HistoryEstimate:
        keys = job_keys(job)
        for level, key in enumerate(keys):
            values = self.history.get(key)
            needed = 1 if key == ("all",) else self.min_count
            if len(values) >= needed:
                return HistoryEstimate(median(list(values)), level, len(values))
        return HistoryEstimate(self.prior_log_s, len(keys), 0)

    def observe(self, job: JobFeatures, log_runtime_s: float) -> None:
        self.history.add(job_keys(job), log_runtime_s)


class KumikiForecaster:
    """The default forecaster: hierarchical recent-history median with conformal p90.

    `model_version` counts model updates (completions learned from), so two forecasts with the
    same version came from the same state.
    """

    name = "kumiki-history"

    def __init__(self, *, recent: int = 20, min_count: int = 3) -> None:
        self.median_model = HierarchicalMedian(recent=recent, min_count=min_count)
        self.calibration = ConformalP90()
        self.version = 0
        self._issued: dict[str, tuple[float, float]] = {}  # job_id -> (log p50, log p90) issued at submit

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        estimate = self.median_model.estimate(job)
        log_p90 = estimate.log_p50 + self.calibration.offset
        self._issued[job.job_id] = (estimate.log_p50, log_p90)
        return RuntimeForecast(
            p50_s=math.exp(estimate.log_p50),
            p90_s=math.exp(log_p90),
            model=self.name,
            model_version=self.version,
        )

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        actual = log_runtime(runtime_s)
        issued = self._issued.pop(job.job_id, None)
        if issued is None:  # learned from history it never forecast (e.g. a warm start)
            self.calibration.update(actual - self.median_model.estimate(job).log_p50, None)
        else:
            self.calibration.update(actual - issued[0], actual <= issued[1])
        self.median_model.observe(job, actual)
        self.version += 1


def build_default_forecaster() -> RuntimeForecaster:
    """The forecaster the simulator's Kumiki policy and the forecast service use."""
    return KumikiForecaster()
