"""Kumiki's default forecaster: online weighting of several models by their own recent error, per key.

Which model predicts best changes from key to key and from week to week (on the Philly slice the
cluster-wide median wins one day, "last two of the same key" another, the long per-key median a third;
docs/forecast.md). No fixed choice survives that, so the forecaster runs them all and weighs them as
it goes: per key level (the most specific one with enough finished runs: (queue, user, GPUs, name),
(queue, GPUs), queue, cluster), the decayed mean |log error| of each model on that key's finished
jobs; weights exp(-eta x (error - best error)); the forecast is the weighted median of the models'
log p50s (the loss scored is |log error|, whose minimiser is a median). Errors are counted only when
a job has finished, against what each model said at its submit, so nothing is learned early.

The p90 and the spread (`log_sigma`) are calibrated online on the combined forecast's own residuals
(`ConformalP90`), so they widen where the combination is wrong; `trust` (`ForecastTrust`) says whether
its belief has described the key's runs better than the uninformed prior.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kumiki.forecast.models.censored import CensoredHistory
from kumiki.forecast.models.experts import (
    GLOBAL_KEY,
    CalibrationConfig,
    ConformalP90,
    HistoryMedianForecaster,
    Key,
    KumikiForecaster,
    QuantRegForecaster,
    SpreadConfig,
    job_keys,
    log_runtime,
    remember,
)
from kumiki.forecast.models.trust import TrustConfig, TrustMeasure, build_trust
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, RuntimeForecaster, tell_started, tell_stopped

ExpertFactory = Callable[[], RuntimeForecaster]


# The models the default forecaster weighs: every one of `expert_factories()` except `history-censored`, which is
# there to be chosen (`SelectionConfig.experts`) and was measured against this set (docs/forecast.md): its
# Kaplan-Meier median moved the slice's simulations by no more than their seed-to-seed noise, either way.
DEFAULT_SELECTION = (
    "kumiki-ensemble",
    "history-median",
    "history-100",
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


@dataclass(slots=True)
class _Record:
    """Decayed sums of |log error| per expert on one key level, and the decayed run count."""

    errors: list[float]
    runs: float = 0.0


@dataclass(frozen=True, slots=True)
class _Issued:
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
        self.trust = build_trust(self.config.trust)

    def weights(self, job: JobFeatures) -> dict[str, float]:
        """Each expert's weight for this job (equal before any key level has a record)."""
        names = list(self.experts)
        for key in job_keys(job):
            record = self._records.get(key)
            needed = 1e-9 if key == GLOBAL_KEY else self.config.min_runs
            if record is not None and record.runs >= needed:
                means = [total / record.runs for total in record.errors]
                best = min(means)
                raw = [math.exp(-self.config.eta * (mean - best)) for mean in means]
                total = sum(raw)
                return {name: value / total for name, value in zip(names, raw, strict=True)}
        return {name: 1.0 / len(names) for name in names}

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        self.calibration.advance(job.submit_s)
        values = tuple(math.log(max(expert.predict(job).p50_s, 1e-9)) for expert in self.experts.values())
        weights = self.weights(job)
        log_p50 = weighted_median(values, tuple(weights.values()))
        log_p90 = log_p50 + self.calibration.offset(job)
        spread = self.calibration.spread(job, self.config.spread)
        calibrated = self.calibration.is_calibrated(job)
        remember(self._issued, job.job_id, _Issued(values, log_p50, log_p90, calibrated))
        leader = max(weights, key=lambda name: weights[name])
        return RuntimeForecast(
            math.exp(log_p50),
            math.exp(log_p90),
            f"{self.name}/{leader}",
            self.version,
            log_sigma=spread,
            trust=self.trust.trust(job),
            error_sigma=self.calibration.calibrated_sigma(job),
        )

    def started(self, job_id: str, start_s: float) -> None:
        """The job began running: past its p90 from now, the calibration counts it a miss before it ends; the
        experts that listen (`history-censored`) count it as a run at least this long."""
        issued = self._issued.get(job_id)
        if issued is not None and issued.calibrated:
            self.calibration.started(job_id, issued.log_p90, start_s)
        for expert in self.experts.values():
            tell_started(expert, job_id, start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        """The job was stopped short of its end (preempted): the experts that listen stop its clock."""
        for expert in self.experts.values():
            tell_stopped(expert, job_id, stop_s)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.calibration.advance(finished_s)
        actual = log_runtime(runtime_s)
        issued = self._issued.pop(job.job_id, None)
        if issued is not None:
            errors = [min(abs(value - actual), self.config.clip) for value in issued.expert_log_p50]
            decay = self.config.decay
            for key in job_keys(job):
                record = self._records.get(key)
                if record is None:
                    record = self._records[key] = _Record([0.0] * len(errors))
                record.errors = [total * decay + error for total, error in zip(record.errors, errors, strict=True)]
                record.runs = record.runs * decay + 1.0
            covered = actual <= issued.log_p90 if issued.calibrated else None
            self.calibration.update(job, actual - issued.log_p50, covered)
            self.trust.update(job, actual, issued.log_p50)
        else:  # learned from history it never forecast (a warm start): calibrate on what it would say now
            # (each expert's own forecast is consumed by its observe just below)
            values = tuple(math.log(max(expert.predict(job).p50_s, 1e-9)) for expert in self.experts.values())
            log_p50 = weighted_median(values, tuple(self.weights(job).values()))
            self.calibration.update(job, actual - log_p50, None)
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
    """The forecaster the simulator's Kumiki policy and the forecast service use."""
    return WeightedSelection()


def model_factories() -> dict[str, Callable[[], RuntimeForecaster]]:
    """Kumiki's models by report name; each call builds a fresh, untrained one."""
    return {
        "kumiki": build_default_forecaster,
        "kumiki-ensemble": KumikiForecaster,
        "history-median": HistoryMedianForecaster,
        "quantreg": QuantRegForecaster,
    }
