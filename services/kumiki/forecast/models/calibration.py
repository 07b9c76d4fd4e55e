"""The calibration of a forecast's spread: a conformal p90 per key (online, with an adaptive correction to its
coverage) and the log-normal sigma a forecast reports (`RuntimeForecast.log_sigma`), read off each key's
residuals."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from statistics import NormalDist

from kumiki.forecast.models.censored import StartedLanes, kaplan_meier_quantiles
from kumiki.forecast.models.history import (
    GLOBAL_KEY,
    MAX_LOG_S,
    MAX_OPEN_FORECASTS,
    P90_LEVEL,
    PRIOR_P90_OFFSET,
    Key,
    RollingWindow,
    job_keys,
    remember,
)
from kumiki.sched.forecasting import JobFeatures


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


class CensoredResiduals:
    """A key's error as its forecasts are making it now: the residuals (log run time - log p50 issued) of each key
    level's last `window` started jobs, the running ones censored at what they have run so far.

    The residuals of finished jobs alone (`ConformalP90.calibrated_sigma`) are a short-biased sample while a
    sweep of long runs goes on in a key whose runs are usually short: its short runs finish, its long ones have
    not, and the key looks well forecast until the first long one ends. Here each running job counts too, as
    known to exceed its residual so far, so the Kaplan-Meier quantiles see the sweep while it runs (the same
    correction the model selection makes with `StartCohorts`, fourteenth step, applied to the forecast's
    spread, seventeenth step). A job is counted by its run time, not wall time: preemptions stop its clock.
    """

    def __init__(self, window: int, min_residuals: int) -> None:
        if window < 2 or min_residuals < 2:
            raise ValueError("window and min_residuals must be >= 2")
        self.lanes = StartedLanes(window)
        self.min_residuals = min_residuals

    def started(self, job_id: str, keys: tuple[Key, ...], log_p50: float, start_s: float) -> None:
        self.lanes.started(job_id, start_s, keys, offset=log_p50)

    def stopped(self, job_id: str, stop_s: float) -> None:
        self.lanes.stopped(job_id, stop_s)

    def finished(self, job_id: str, keys: tuple[Key, ...], log_p50: float, log_runtime_s: float) -> None:
        self.lanes.finished(job_id, keys, log_runtime_s, offset=log_p50)

    def sigma(self, job: JobFeatures, now_s: float) -> float | None:
        """sqrt(((q90 - q10) / 2.563)^2 + q50^2) of the Kaplan-Meier residual quantiles of the most specific key
        level with enough started jobs, as `calibrated_sigma` reads finished ones. A quantile the estimate has
        not reached yet (too many runs still going past every end) is at least the largest residual so far,
        which stands in for it. A level whose runs have neither ended nor outrun their p50s says nothing: the
        next level answers. None before any key level can."""
        width = _normal_quantile(0.9) - _normal_quantile(0.1)
        for key in job_keys(job):
            needed = 2 if key == GLOBAL_KEY else self.min_residuals
            if self.lanes.size(key) < needed:
                continue
            samples = self.lanes.samples(key, now_s)
            bound = max(value for value, _ in samples)
            if bound <= 0.0 and not any(exact for _, exact in samples):
                continue
            low, middle, high = (
                bound if quantile is None else quantile for quantile in kaplan_meier_quantiles(samples, (0.1, 0.5, 0.9))
            )
            return math.sqrt(((high - low) / width) ** 2 + middle**2)
        return None
