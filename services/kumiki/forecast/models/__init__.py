"""Run-time forecasters learned online from job history (pure: no I/O, deterministic).

- `history`: the key hierarchy, rolling windows of log run time per key, and the shared constants (the prior,
  the clamps).
- `regression`: the statsmodels quantile regression over the history medians.
- `calibration`: the conformal p90 per key and the log-normal spread a forecast reports.
- `experts`: the individual models (per-key rolling medians, the burst + median-of-experts ensemble, the
  quantile regression as a forecaster).
- `censored`: a per-key median that counts the runs still going (Kaplan-Meier), one of the weighed models.
- `cohort`: the record the selection weighs the models by: each key level's last started jobs, the running
  ones counted by the error they already prove.
- `selection`: the default forecaster, which weighs the experts and both baselines online per key by
  their own recent error.
- `trust`: how far each key's forecasts have earned a scheduler's trust (their error against the
  uninformed prior's, or how often they order jobs right), carried on every forecast.
"""

from kumiki.forecast.models.calibration import CalibrationConfig, ConformalP90, SpreadConfig
from kumiki.forecast.models.censored import CensoredHistory, RunClock, kaplan_meier_median
from kumiki.forecast.models.cohort import StartCohorts
from kumiki.forecast.models.experts import (
    DEFAULT_EXPERTS,
    EXPERT_FEATURES,
    EXPERTS,
    BurstSiblings,
    HistoryMedianForecaster,
    Issued,
    KumikiConfig,
    KumikiForecaster,
    QuantRegForecaster,
)
from kumiki.forecast.models.history import (
    GLOBAL_KEY,
    MAX_OPEN_FORECASTS,
    MIN_RUNTIME_S,
    P90_LEVEL,
    PRIOR_LOG_S,
    PRIOR_P90_OFFSET,
    HistoryConfig,
    Key,
    KeyedHistory,
    RollingWindow,
    job_keys,
    log_runtime,
    median,
    remember,
)
from kumiki.forecast.models.regression import (
    FEATURE_NAMES,
    QuantileRegression,
    QuantRegConfig,
    job_vector,
    regression_row,
)
from kumiki.forecast.models.selection import (
    DEFAULT_SELECTION,
    SelectionConfig,
    WeightedSelection,
    build_default_forecaster,
    expert_factories,
    model_factories,
    weighted_median,
)
from kumiki.forecast.models.trust import (
    TRUST_MEASURES,
    ConcordanceTrust,
    ForecastTrust,
    TrustConfig,
    TrustMeasure,
    build_trust,
)

__all__ = [
    "DEFAULT_EXPERTS",
    "DEFAULT_SELECTION",
    "EXPERTS",
    "EXPERT_FEATURES",
    "FEATURE_NAMES",
    "GLOBAL_KEY",
    "MAX_OPEN_FORECASTS",
    "MIN_RUNTIME_S",
    "P90_LEVEL",
    "PRIOR_LOG_S",
    "PRIOR_P90_OFFSET",
    "TRUST_MEASURES",
    "BurstSiblings",
    "CalibrationConfig",
    "CensoredHistory",
    "ConcordanceTrust",
    "ConformalP90",
    "ForecastTrust",
    "HistoryConfig",
    "HistoryMedianForecaster",
    "Issued",
    "Key",
    "KeyedHistory",
    "KumikiConfig",
    "KumikiForecaster",
    "QuantRegConfig",
    "QuantRegForecaster",
    "QuantileRegression",
    "RollingWindow",
    "RunClock",
    "SelectionConfig",
    "SpreadConfig",
    "StartCohorts",
    "TrustConfig",
    "TrustMeasure",
    "WeightedSelection",
    "build_default_forecaster",
    "build_trust",
    "expert_factories",
    "job_keys",
    "job_vector",
    "kaplan_meier_median",
    "log_runtime",
    "median",
    "model_factories",
    "regression_row",
    "remember",
    "weighted_median",
]
