"""Kumiki's default forecaster: online weighting of several models by their own recent error, per key.

Which model predicts best changes from key to key and from week to week (on the Philly slice the
cluster-wide median wins one day, "last two of the same key" another, the long per-key median a third;
docs/forecast.md). No fixed choice survives that, so the forecaster runs them all and weighs them as
it goes: per key level (the most specific one with enough scored runs: (queue, user, GPUs, name),
(queue, GPUs), queue, cluster), each model's mean |log error| on the key level's last ~100 started jobs
(`StartCohorts`), against what the model said at the job's submit; weights exp(-eta x (error - best
error)); the forecast is the weighted median of the models' log p50s (the loss scored is |log error|,
whose minimiser is a median). A finished job counts its error; a job still running counts the error it
already proves (what it has run so far against each forecast below it), so the models that say "short"
are not rewarded while the long runs have not finished yet. `SelectionConfig(score_running=False)` keeps
the earlier record: a decayed mean over finished jobs only.

The p90 and the spread (`log_sigma`) are calibrated online on the combined forecast's own residuals
(`ConformalP90`), so they widen where the combination is wrong; `trust` (`ForecastTrust`) says whether
its belief has described the key's runs better than the uninformed prior.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kumiki.forecast.models.calibration import CalibrationConfig, CensoredResiduals, ConformalP90, SpreadConfig
from kumiki.forecast.models.censored import CensoredHistory
from kumiki.forecast.models.cohort import StartCohorts
from kumiki.forecast.models.experts import HistoryMedianForecaster, KumikiForecaster, QuantRegForecaster
from kumiki.forecast.models.history import GLOBAL_KEY, Key, job_keys, log_runtime, remember
from kumiki.forecast.models.trust import TrustConfig, TrustMeasure, build_trust
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, RuntimeForecaster, tell_started, tell_stopped

ExpertFactory = Callable[[], RuntimeForecaster]


# The models the default forecaster weighs: all of `expert_factories()`. `history-censored` (the Kaplan-Meier
# median that counts the runs still going) joined when the record started counting running jobs too
# (`SelectionConfig.score_running`): scored on finished jobs only, it could never show what it is for, since
# the jobs it is right about are the ones that have not finished (docs/design/0003-forecast-trust.md,
# fourteenth step).
DEFAULT_SELECTION = (
    "kumiki-ensemble",
    "history-median",
    "history-100",
    "history-censored",
    "quantreg",
    "global-median",
    "last-two",
)


def expert_factories() -> dict[str, ExpertFactory]:
    """The models that can be weighed, by name: the burst + median-of-experts ensemble, per-key histories (one
    of them counting the runs still going), the regression, and both baselines (so that the weighting can
    always fall back to the better baseline)."""
    from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey  # baselines import the experts

    return {
        "kumiki-ensemble": KumikiForecaster,
        "history-median": HistoryMedianForecaster,
        "history-100": lambda: HistoryMedianForecaster(window=100, name="history-100"),
        "history-censored": CensoredHistory,
        "quantreg": QuantRegForecaster,
        "global-median": GlobalMedianSoFar,
        "last-two": LastTwoSameKey,
    }


@dataclass(frozen=True, slots=True)
class SelectionConfig:
    decay: float = 0.99  # per finished run of the key: the error record spans ~100 runs
    eta: float = 5.0  # weight exp(-eta x excess mean |log error|): 0.14 worse -> half the weight
    clip: float = 3.0  # one job's |log error| counts at most this much (a 20x miss), so one outlier cannot decide
    min_runs: float = 10.0  # decayed runs before a key level's own record is used (else its parent's)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    spread: SpreadConfig = field(default_factory=SpreadConfig)
    trust: TrustConfig = field(default_factory=TrustConfig)
    experts: tuple[str, ...] = DEFAULT_SELECTION  # a subset of expert_factories() (empty: all of them)
    # score the experts on each key level's last started jobs, counting the running ones by the error they
    # already prove (`StartCohorts`, over ~1 / (1 - decay) jobs); False: a decayed record of finished jobs only
    # (on the 18 stand-in weeks it is worth +2.8 points of recovered share, -2.5 to +8.5: design 0003, 14th step)
    score_running: bool = True
    # the forecast's `error_sigma` read off each key level's last started jobs, the running ones censored at what
    # they have run so far (`CensoredResiduals`), instead of off the finished jobs' residuals only. Measured, not
    # adopted: on 18 stand-in weeks the recovered share fell by 8.4 points (95% interval -15.7 to -2.7, 12 of 18
    # weeks worse; docs/design/0003-forecast-trust.md, twentieth step)
    censored_sigma: bool = False


@dataclass(slots=True)
class _Record:
    """Decayed sums of |log error| per expert on one key level, and the decayed run count."""

    errors: list[float]
    runs: float = 0.0


@dataclass(frozen=True, slots=True)
class _Issued:
    keys: tuple[Key, ...]
    expert_log_p50: tuple[float, ...]
    log_p50: float
    log_p90: float
    calibrated: bool


@dataclass(slots=True)
class WeightedSelection:
    """The `kumiki` forecaster (see the module docstring); `model` names the expert with the most weight."""

    config: SelectionConfig = field(default_factory=SelectionConfig)
    factories: Mapping[str, ExpertFactory] | None = None
    name: str = "kumiki"
    experts: dict[str, RuntimeForecaster] = field(init=False)
    version: int = field(init=False, default=0)
    calibration: ConformalP90 = field(init=False)
    trust: TrustMeasure = field(init=False)
    _records: dict[Key, _Record] = field(init=False, default_factory=dict)
    _issued: dict[str, _Issued] = field(init=False, default_factory=dict)
    cohorts: StartCohorts | None = field(init=False, default=None)  # the record, when it counts running jobs
    residuals: CensoredResiduals | None = field(init=False, default=None)  # error_sigma's, when censored
    _now_s: float = field(init=False, default=-math.inf)  # the latest time the forecaster has heard of

    def __post_init__(self) -> None:
        available = dict(self.factories if self.factories is not None else expert_factories())
        chosen = self.config.experts or tuple(available)
        unknown = set(chosen) - set(available)
        if unknown or not chosen:
            raise ValueError(f"experts must be a non-empty subset of {tuple(available)}, got {chosen}")
        if not 0.0 < self.config.decay <= 1.0 or self.config.eta < 0 or self.config.clip <= 0:
            raise ValueError("decay must be in (0, 1], eta >= 0 and clip > 0")
        self.experts = {name: available[name]() for name in chosen}
        self.calibration = ConformalP90(self.config.calibration)
        if self.config.censored_sigma:
            calibration = self.config.calibration
            self.residuals = CensoredResiduals(calibration.window, calibration.min_residuals)
        self.trust = build_trust(self.config.trust)
        if self.config.score_running:  # the decayed record's span: ~1 / (1 - decay) runs
            window = max(1, round(1.0 / (1.0 - self.config.decay))) if self.config.decay < 1.0 else 1_000_000
            self.cohorts = StartCohorts(len(self.experts), window, self.config.clip)

    def weights(self, job: JobFeatures) -> dict[str, float]:
        """Each expert's weight for this job (equal before any key level has a record)."""
        names = list(self.experts)
        for key in job_keys(job):
            if self.cohorts is not None:
                errors, counted = self.cohorts.score(key, self._now_s)
                runs = float(counted)
            else:
                record = self._records.get(key)
                if record is None:
                    continue
                errors, runs = record.errors, record.runs
            needed = 1e-9 if key == GLOBAL_KEY else self.config.min_runs
            if runs >= needed:
                means = [total / runs for total in errors]
                best = min(means)
                raw = [math.exp(-self.config.eta * (mean - best)) for mean in means]
                total = sum(raw)
                return {name: value / total for name, value in zip(names, raw, strict=True)}
        return {name: 1.0 / len(names) for name in names}

    def _record(self, job: JobFeatures, log_p50s: tuple[float, ...], actual: float) -> None:
        errors = [min(abs(value - actual), self.config.clip) for value in log_p50s]
        decay = self.config.decay
        for key in job_keys(job):
            record = self._records.get(key)
            if record is None:
                record = self._records[key] = _Record([0.0] * len(errors))
            record.errors = [total * decay + error for total, error in zip(record.errors, errors, strict=True)]
            record.runs = record.runs * decay + 1.0

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        self._now_s = max(self._now_s, job.submit_s)
        self.calibration.advance(job.submit_s)
        values = tuple(math.log(max(expert.predict(job).p50_s, 1e-9)) for expert in self.experts.values())
        weights = self.weights(job)
        log_p50 = weighted_median(values, tuple(weights.values()))
        log_p90 = log_p50 + self.calibration.offset(job)
        if job.time_limit_s:  # the job is stopped at the run time it asked for: no forecast goes past it
            log_limit = log_runtime(job.time_limit_s)
            log_p50, log_p90 = min(log_p50, log_limit), min(log_p90, log_limit)
        spread = self.calibration.spread(job, self.config.spread)
        calibrated = self.calibration.is_calibrated(job)
        remember(self._issued, job.job_id, _Issued(job_keys(job), values, log_p50, log_p90, calibrated))
        leader = max(weights, key=lambda name: weights[name])
        return RuntimeForecast(
            math.exp(log_p50),
            math.exp(log_p90),
            f"{self.name}/{leader}",
            self.version,
            log_sigma=spread,
            trust=self.trust.trust(job),
            error_sigma=(
                self.residuals.sigma(job, self._now_s)
                if self.residuals is not None
                else self.calibration.calibrated_sigma(job)
            ),
        )

    def started(self, job_id: str, start_s: float) -> None:
        """The job began running: past its p90 from now, the calibration counts it a miss before it ends; the
        record (`StartCohorts`) and the experts that listen (`history-censored`) count it as a run at least
        this long."""
        self._now_s = max(self._now_s, start_s)
        issued = self._issued.get(job_id)
        if issued is not None:
            if issued.calibrated:
                self.calibration.started(job_id, issued.log_p90, start_s)
            if self.cohorts is not None:
                self.cohorts.started(job_id, issued.keys, issued.expert_log_p50, start_s)
            if self.residuals is not None:
                self.residuals.started(job_id, issued.keys, issued.log_p50, start_s)
        for expert in self.experts.values():
            tell_started(expert, job_id, start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        """The job was stopped short of its end (preempted): its clock stops here and in the experts that listen."""
        self._now_s = max(self._now_s, stop_s)
        if self.cohorts is not None:
            self.cohorts.stopped(job_id, stop_s)
        if self.residuals is not None:
            self.residuals.stopped(job_id, stop_s)
        for expert in self.experts.values():
            tell_stopped(expert, job_id, stop_s)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self._now_s = max(self._now_s, finished_s)
        self.calibration.advance(finished_s)
        actual = log_runtime(runtime_s)
        issued = self._issued.pop(job.job_id, None)
        if issued is not None:
            if self.cohorts is not None:
                self.cohorts.finished(job.job_id, issued.keys, issued.expert_log_p50, actual)
            else:
                self._record(job, issued.expert_log_p50, actual)
            covered = actual <= issued.log_p90 if issued.calibrated else None
            self.calibration.update(job, actual - issued.log_p50, covered)
            if self.residuals is not None:
                self.residuals.finished(job.job_id, issued.keys, issued.log_p50, actual)
            self.trust.update(job, actual, issued.log_p50)
        else:  # learned from history it never forecast (a warm start): calibrate on what it would say now
            # (each expert's own forecast is consumed by its observe just below)
            values = tuple(math.log(max(expert.predict(job).p50_s, 1e-9)) for expert in self.experts.values())
            log_p50 = weighted_median(values, tuple(self.weights(job).values()))
            self.calibration.update(job, actual - log_p50, None)
            if self.residuals is not None:
                self.residuals.finished(job.job_id, job_keys(job), log_p50, actual)
            self.trust.update(job, actual, log_p50)
        for expert in self.experts.values():
            expert.observe(job, runtime_s, finished_s)
        self.version += 1


def weighted_median(values: tuple[float, ...], weights: tuple[float, ...]) -> float:
    """The smallest value whose cumulative weight (values sorted) reaches half the total."""
    order = sorted(range(len(values)), key=lambda index: values[index])
    half = 0.5 * sum(weights)
    cumulative = 0.0
    for index in order:
        cumulative += weights[index]
        if cumulative >= half - 1e-12:
            return values[index]
    return values[order[-1]]


def build_default_forecaster() -> RuntimeForecaster:
    """The forecaster the simulator's Kumiki policy and the forecast service use: the online weighting of the
    models, forecasting a running job again from the progress it reports (`ProgressForecaster`)."""
    from kumiki.forecast.models.progress import ProgressForecaster  # progress imports experts, as this does

    return ProgressForecaster(WeightedSelection())


def model_factories() -> dict[str, Callable[[], RuntimeForecaster]]:
    """Kumiki's models by report name; each call builds a fresh, untrained one."""
    return {
        "kumiki": build_default_forecaster,
        "kumiki-ensemble": KumikiForecaster,
        "history-median": HistoryMedianForecaster,
        "quantreg": QuantRegForecaster,
    }
