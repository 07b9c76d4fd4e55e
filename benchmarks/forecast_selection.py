"""Rolling-origin accuracy of the default forecaster per day, and how it moves with each of its constants.

    .venv/bin/python benchmarks/forecast_selection.py [--trace philly-slice]

Every day of the trace after the first is a test day, forecast from the days before it (the replay is
online). Per variant: the ratio of `kumiki`'s median |log error| to the better baseline of each day, their
mean and max, and the range of daily p90 coverage. One constant changes per row (one-factor sweep); two rows
keep the record of finished jobs only (as before issue 14's fourteenth step).
Targets (issue 14): ratio <= 1 every day, mean <= 0.8, coverage 0.85-0.95 every day.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from _support import trace_jobs

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.forecast.evaluate import replay, rolling_origin, verdicts
from kumiki.forecast.models import DEFAULT_SELECTION, SelectionConfig, WeightedSelection
from kumiki.sched.forecasting import RuntimeForecaster

WITHOUT_CENSORED = tuple(name for name in DEFAULT_SELECTION if name != "history-censored")
VARIANTS: dict[str, SelectionConfig] = {
    "default (eta 5, decay 0.99, clip 3, min 10 runs)": SelectionConfig(),
    "finished-only record, no history-censored (before)": SelectionConfig(
        score_running=False, experts=WITHOUT_CENSORED
    ),
    "finished-only record": SelectionConfig(score_running=False),
    "eta 2": SelectionConfig(eta=2.0),
    "eta 10": SelectionConfig(eta=10.0),
    "decay 0.98": SelectionConfig(decay=0.98),
    "decay 0.995": SelectionConfig(decay=0.995),
    "clip 1": SelectionConfig(clip=1.0),
    "clip 100 (none)": SelectionConfig(clip=100.0),
    "min 5 runs": SelectionConfig(min_runs=5.0),
    "min 20 runs": SelectionConfig(min_runs=20.0),
}


def main() -> int:
    jobs = trace_jobs(__doc__.splitlines()[0])
    print("| variant | " + " | ".join(f"day {d}" for d in range(1, 7)) + " | mean | max | coverage min-max |")
    print("|---|" + "---:|" * 9)
    for label, config in VARIANTS.items():
        factories: dict[str, Callable[[], RuntimeForecaster]] = {
            "kumiki": functools.partial(WeightedSelection, config),
            "global-median": GlobalMedianSoFar,
            "last-two": LastTwoSameKey,
        }
        days = [v for v in verdicts(rolling_origin(replay(jobs, factories))) if v.label != "day 0"]
        ratios = [v.ratio for v in days]
        coverage = [v.p90_coverage for v in days]
        print(
            f"| {label} | "
            + " | ".join(f"{r:.2f}" for r in ratios)
            + f" | {sum(ratios) / len(ratios):.3f} | {max(ratios):.2f} | {min(coverage):.2f}-{max(coverage):.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
