"""What each part of the Kumiki forecaster is worth: variants replayed on the same trace.

    .venv/bin/python benchmarks/forecast_ablation.py [--trace philly-slice]

Prints each variant's median |log error| and p90 coverage after two days of history and on the whole
trace, with the ratio of its error to the default forecaster's (run in the same process).
"""

from __future__ import annotations

import sys

from _support import trace_jobs

from kumiki.forecast.evaluate import replay
from kumiki.forecast.models import DEFAULT_EXPERTS, CalibrationConfig, KumikiConfig, KumikiForecaster

VARIANTS = {
    "default (burst + median of short, long, global)": KumikiConfig(),
    "no burst expert": KumikiConfig(burst_min_jobs=0),
    "no burst, history-long only": KumikiConfig(burst_min_jobs=0, experts=("history-long",)),
    "no burst, short+long+queue-long": KumikiConfig(
        burst_min_jobs=0, experts=("history-short", "history-long", "queue-long")
    ),
    "default + quantreg expert": KumikiConfig(experts=(*DEFAULT_EXPERTS, "quantreg")),
    "no coverage correction (step 0)": KumikiConfig(calibration=CalibrationConfig(step=0.0)),
}


def main() -> int:
    jobs = trace_jobs(__doc__.splitlines()[0])
    print("| variant | after 2 days | x default | p90 cov | full trace | x default | p90 cov |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    reference: tuple[float, float] | None = None
    for name, config in VARIANTS.items():

        def factory(config: KumikiConfig = config) -> KumikiForecaster:
            return KumikiForecaster(config)

        window = replay(jobs, {"k": factory}, start_s=172_800.0).scores["k"]
        full = replay(jobs, {"k": factory}).scores["k"]
        if reference is None:
            reference = (window.median_abs_log_error, full.median_abs_log_error)
        print(
            f"| {name} | {window.median_abs_log_error:.3f} | {window.median_abs_log_error / reference[0]:.2f} | "
            f"{100 * window.p90_coverage:.1f}% | {full.median_abs_log_error:.3f} | "
            f"{full.median_abs_log_error / reference[1]:.2f} | {100 * full.p90_coverage:.1f}% |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
