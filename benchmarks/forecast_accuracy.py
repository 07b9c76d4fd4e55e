"""Run-time forecast accuracy on a trace, per window, against the better of the two baselines.

    .venv/bin/python benchmarks/forecast_accuracy.py [--trace philly-slice]

Windows: the issue's (after two days of history), the whole trace, and each day on its own (every
earlier job trains), because which baseline is better changes from window to window. Prints, per
window, each model's median |log error|, its ratio to the better baseline and its p90 coverage.
"""

from __future__ import annotations

import sys

from _support import trace_jobs

from kumiki.forecast.evaluate import default_factories, replay

DAY_S = 86_400.0
BASELINES = ("global-median", "last-two")


def main() -> int:
    jobs = trace_jobs(__doc__.splitlines()[0])
    last_submit = max(job.submit_s or 0.0 for job in jobs)
    windows: list[tuple[str, float | None, float | None]] = [
        ("after 2 days", 2 * DAY_S, None),
        ("full", None, None),
    ]
    day = 1
    while day * DAY_S <= last_submit:
        windows.append((f"day {day}", day * DAY_S, (day + 1) * DAY_S))
        day += 1
    models = list(default_factories())
    print(f"{'window':14s} {'jobs':>6s} " + " ".join(f"{name:>22s}" for name in models) + "  kumiki/better")
    met = 0
    for label, start, end in windows:
        scores = replay(jobs, default_factories(), start_s=start, end_s=end).scores
        better = min(scores[name].median_abs_log_error for name in BASELINES)
        cells = [
            f"{scores[n].median_abs_log_error:5.3f} x{scores[n].median_abs_log_error / better:4.2f} "
            f"c{100 * scores[n].p90_coverage:3.0f}%"
            for n in models
        ]
        ratio = scores["kumiki"].median_abs_log_error / better
        met += ratio <= 0.8 and 0.85 <= scores["kumiki"].p90_coverage <= 0.95
        print(f"{label:14s} {scores['kumiki'].jobs:6d} " + " ".join(f"{c:>22s}" for c in cells) + f"  {ratio:.3f}")
    print("cells: median |log error|, ratio to the better baseline of the window, p90 coverage")
    print(f"target (<= 0.8x better baseline, coverage 85-95%) met in {met} of {len(windows)} windows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
